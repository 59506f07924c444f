//! The claims' statements: the row lock form's lock, count and lock by id, the lease form's
//! claim and marks, and the start of a claim at an id in a table claimed in id order.

use super::render::Lead;
use super::{
    Arg, ColumnType, Dialect, OutColumn, Output, Renderer, Sql, Statement, StatementKind, named,
};

/// The column a row lock count reads each row's mark from.
const MARK: &str = "rs_mark";

/// Where a claim's statement starts: at the table's start, or at [`Arg::Floor`] in a table
/// claimed in id order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Start {
    Beginning,
    Floor,
}

impl Start {
    /// `Floor` where `floor` is set.
    pub(super) fn floor_if(floor: bool) -> Self {
        if floor {
            Start::Floor
        } else {
            Start::Beginning
        }
    }
}

/// What a lease claim writes into the lease column: the database's time plus
/// [`Arg::LeaseFor`], or the expiry its locking read took from the database ([`Arg::Fence`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Expiry {
    FromNow,
    Fence,
}

impl Renderer<'_> {
    /// Whether the claim order is the id alone, ascending: a claim may start at an id.
    pub(super) fn ordered_by_id(&self) -> bool {
        match self.desc.order {
            [] => self.desc.due.is_none(),
            [only] => only.column == self.desc.id.name && !only.descending,
            _ => false,
        }
    }

    // Whether advisory claims may start past the rows taken before them: on PostgreSQL
    // (whose claims pass over the entries of settled rows until vacuum removes them), in id
    // order, without a due column (a row below the start is claimable again only when it
    // was in work, in this process or in another), on the database's locks.
    pub(super) fn advisory_floor(&self) -> bool {
        self.dialect == Dialect::Postgres
            && self.desc.due.is_none()
            && self.ordered_by_id()
            && !self.desc.custom_lock()
    }

    /// `id >= floor`, after the claimable conditions, opened by `lead`.
    pub(super) fn floor(&self, s: &mut Sql, lead: Lead) {
        s.push(lead.sql())
            .push(&self.id())
            .push(" >= ")
            .arg(Arg::Floor);
    }

    pub(super) fn lock_row(&self, rows: Output) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push("SELECT * FROM ").push(&self.table());
        let _ = self.claimable(&mut s, Lead::Where);
        self.order(&mut s);
        s.push(" LIMIT 1 FOR UPDATE SKIP LOCKED");
        s.finish(StatementKind::LockRow, rows)
    }

    /// The first `Arg::Limit` claimable rows' ids from `start` on, `FOR UPDATE SKIP LOCKED`,
    /// as a subquery.
    pub(super) fn first_row_id(&self, s: &mut Sql, start: Start) {
        s.push("SELECT ")
            .push(&self.id())
            .push(" FROM ")
            .push(&self.table());
        let lead = self.claimable(s, Lead::Where);
        if start == Start::Floor {
            self.floor(s, lead);
        }
        self.order(s);
        s.push(" LIMIT ")
            .arg(Arg::Limit)
            .push(" FOR UPDATE SKIP LOCKED");
    }

    /// PostgreSQL: `WITH rs_claim AS (SELECT id .. FOR UPDATE SKIP LOCKED) `, the ids a claim
    /// takes, locked once: a sub-select in `WHERE id IN (..)` may run again while the update
    /// rechecks a row another transaction changed, and then wait for rows it did not lock.
    pub(super) fn locked_ids(&self, s: &mut Sql, start: Start) {
        s.push("WITH rs_claim AS (");
        self.first_row_id(s, start);
        s.push(") ");
    }

    /// ` FROM rs_claim WHERE <table>.id = rs_claim.id`, after the `SET` of an update.
    pub(super) fn join_locked_ids(&self, s: &mut Sql) {
        s.push(" FROM rs_claim WHERE ")
            .push(&self.table())
            .push(".")
            .push(&self.id())
            .push(" = rs_claim.")
            .push(&self.id());
    }

    // The mark of a row a count took, in SQL: on PostgreSQL the two keys of a session's
    // advisory lock (the table's name and the row's id, each hashed), which live apart from
    // the single keys of the advisory form; on MySQL and MariaDB the name of a `GET_LOCK`
    // (the SHA-256 of the database, the table and the id).
    fn mark_of(&self, id: &str) -> String {
        let table = self.dialect.text_literal(self.desc.table);
        if self.dialect == Dialect::Postgres {
            format!("hashtext({table}), hashtext({id}::text)")
        } else {
            format!(
                "SHA2(CONCAT({}, COALESCE(DATABASE(), ''), {}, {table}, {}, {id}), 256)",
                self.dialect.text_literal("ruststream mark "),
                self.dialect.text_literal("."),
                self.dialect.text_literal(" "),
            )
        }
    }

    // The count of the first claimable rows' attempts, committed on its own.
    //
    // PostgreSQL: the first `Arg::Limit` rows are locked once, in a CTE, and the first
    // `Arg::Take` of them whose mark the count's session takes (a session advisory lock on
    // the row, see [`RowLockClaim::Count`](super::RowLockClaim::Count)) are counted: a row
    // another process counted and has not locked yet is passed over. The reply has a row for
    // each row looked at: its id, its count (`NULL` where it was not counted) and its mark's
    // second key, which [`Renderer::unmark_rows`] releases.
    pub(super) fn count_row(&self, attempt_column: &'static str, start: Start) -> Statement {
        let attempt = self.q(attempt_column);
        let mut s = Sql::new(self.dialect);
        let columns = [
            (self.desc.id.name, ColumnType::Id),
            (attempt_column, ColumnType::Int),
            (MARK, ColumnType::Int),
        ];
        if self.dialect == Dialect::Postgres {
            let id = self.id();
            let table = self.table();
            s.push("WITH rs_claim AS (");
            self.first_row_id(&mut s, start);
            s.push("), rs_marked AS (SELECT ")
                .push(&id)
                .push(" FROM rs_claim WHERE pg_try_advisory_lock(")
                .push(&self.mark_of(&id))
                .push(") LIMIT ")
                .arg(Arg::Take)
                .push("), rs_counted AS (UPDATE ")
                .push(&table)
                .push(" SET ")
                .push(&attempt)
                .push(" = COALESCE(")
                .push(&table)
                .push(".")
                .push(&attempt)
                .push(", 0) + 1 FROM rs_marked WHERE ")
                .push(&table)
                .push(".")
                .push(&id)
                .push(" = rs_marked.")
                .push(&id)
                .push(" RETURNING ")
                .push(&table)
                .push(".")
                .push(&id)
                .push(", ")
                .push(&table)
                .push(".")
                .push(&attempt)
                .push(") SELECT rs_claim.")
                .push(&id)
                .push(", rs_counted.")
                .push(&attempt)
                .push(", hashtext(rs_claim.")
                .push(&id)
                .push("::text) AS ")
                .push(MARK)
                .push(" FROM rs_claim LEFT JOIN rs_counted ON rs_counted.")
                .push(&id)
                .push(" = rs_claim.")
                .push(&id);
            return s.finish(StatementKind::CountRow, named(&columns));
        }
        s.push("UPDATE ")
            .push(&self.table())
            .push(" SET ")
            .push(&attempt)
            .push(" = COALESCE(")
            .push(&attempt)
            .push(", 0) + 1 WHERE ")
            .push(&self.id())
            .push(" IN (");
        self.first_row_id(&mut s, start);
        s.push(") RETURNING ")
            .push(&self.id())
            .push(", ")
            .push(&attempt)
            .push(", 0 AS ")
            .push(MARK);
        s.finish(StatementKind::CountRow, named(&columns))
    }

    /// MySQL and MariaDB: locks the first claimable rows to count them, and reads each one's
    /// id, attempt and mark's name.
    pub(super) fn select_row_id(&self, attempt: &'static str) -> Statement {
        let mut s = Sql::new(self.dialect);
        let id = self.id();
        s.push("SELECT ")
            .push(&id)
            .push(", COALESCE(")
            .push(&self.q(attempt))
            .push(", 0) AS ")
            .push(&self.q(attempt))
            .push(", ")
            .push(&self.mark_of(&id))
            .push(" AS ")
            .push(MARK)
            .push(" FROM ")
            .push(&self.table());
        // A row another count marked is left out before the LIMIT; in the count's
        // transaction at read committed, InnoDB lets go of its lock as soon as the condition
        // has left it out, so this count does not hold it from that count's own lock.
        let lead = self.claimable(&mut s, Lead::Where);
        s.push(lead.sql())
            .push("IS_FREE_LOCK(")
            .push(&self.mark_of(&id))
            .push(") = 1");
        self.order(&mut s);
        s.push(" LIMIT ")
            .arg(Arg::Limit)
            .push(" FOR UPDATE SKIP LOCKED");
        s.finish(
            StatementKind::SelectRowId,
            named(&[
                (self.desc.id.name, ColumnType::Id),
                (attempt, ColumnType::Int),
                (MARK, ColumnType::Text),
            ]),
        )
    }

    /// MySQL and MariaDB: takes the marks of `n` rows the count locked (`Arg::MarkAt(0..n)`),
    /// each without waiting and each exactly once: a row of `rs_at` (the mark's place) and
    /// `rs_marked` (`1` where the session took it) for each.
    pub(super) fn mark_rows(&self, n: usize) -> Statement {
        let mut s = Sql::new(self.dialect);
        for i in 0..n {
            if i > 0 {
                s.push(" UNION ALL ");
            }
            s.push("SELECT ")
                .push(&i.to_string())
                .push(" AS rs_at, GET_LOCK(")
                .arg(Arg::MarkAt(i))
                .push(", 0) AS rs_marked");
        }
        s.finish(
            StatementKind::MarkRows(n),
            named(&[("rs_at", ColumnType::Int), ("rs_marked", ColumnType::Bool)]),
        )
    }

    /// Releases the marks of `n` counted rows (`Arg::MarkAt(0..n)`) once their claims have
    /// locked them.
    pub(super) fn unmark_rows(&self, n: usize) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push("SELECT ");
        for i in 0..n {
            if i > 0 {
                s.push(", ");
            }
            if self.dialect == Dialect::Postgres {
                s.push("pg_advisory_unlock(hashtext(")
                    .push(&self.dialect.text_literal(self.desc.table))
                    .push("), CAST(")
                    .arg(Arg::MarkAt(i))
                    .push(" AS INTEGER))");
            } else {
                s.push("RELEASE_LOCK(").arg(Arg::MarkAt(i)).push(")");
            }
        }
        s.finish(StatementKind::UnmarkRows(n), Output::Nothing)
    }

    /// Locks the counted row while it is claimable and its attempt is still the one counted,
    /// and reads it.
    pub(super) fn lock_row_by_id(&self, rows: Output, attempt: &str) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push("SELECT * FROM ");
        self.counted_row_locked(&mut s, attempt);
        s.finish(StatementKind::LockRowById, rows)
    }

    // `<table> WHERE id = ? AND attempt = ? <claimable> FOR UPDATE SKIP LOCKED`: the counted
    // row, while its attempt is the one counted. The count's mark keeps every other count from
    // counting the row, but a count that looks at it holds it for the length of its statement
    // (PostgreSQL) or transaction (MySQL): the lock passes it over then, and the claim tries
    // again shortly.
    fn counted_row_locked(&self, s: &mut Sql, attempt: &str) {
        s.push(&self.table())
            .push(" WHERE ")
            .push(&self.id())
            .push(" = ")
            .arg(Arg::Id)
            .push(" AND ")
            .push(&self.q(attempt))
            .push(" = ")
            .arg(Arg::Attempt);
        let _ = self.claimable(s, Lead::And);
        s.push(" FOR UPDATE SKIP LOCKED");
    }

    // [`Renderer::lock_row_by_id`] that also releases the count's one mark
    // ([`Arg::MarkAt`]`(0)`) once it has locked the row: the lock of a count's only row, whose
    // mark then needs no statement of its own. The release runs only where the lock took the
    // row (PostgreSQL: the outer select of a CTE that locks; MySQL: the select list of the
    // locking read).
    pub(super) fn lock_row_by_id_unmarking(&self, rows: Output, attempt: &str) -> Statement {
        let mut s = Sql::new(self.dialect);
        if self.dialect == Dialect::Postgres {
            s.push("WITH rs_locked AS (SELECT * FROM ");
            self.counted_row_locked(&mut s, attempt);
            s.push(") SELECT rs_locked.*, pg_advisory_unlock(hashtext(")
                .push(&self.dialect.text_literal(self.desc.table))
                .push("), CAST(")
                .arg(Arg::MarkAt(0))
                .push(" AS INTEGER)) AS rs_unmarked FROM rs_locked");
        } else {
            s.push("SELECT ")
                .push(&self.table())
                .push(".*, RELEASE_LOCK(")
                .arg(Arg::MarkAt(0))
                .push(") AS rs_unmarked FROM ");
            self.counted_row_locked(&mut s, attempt);
        }
        s.finish(StatementKind::LockRowByIdUnmarking, rows)
    }

    /// Counts the attempts of `n` rows by their ids (the row lock claim on MySQL and MariaDB).
    pub(super) fn count_attempts(&self, attempt: &str, n: usize) -> Statement {
        let attempt = self.q(attempt);
        let mut s = Sql::new(self.dialect);
        s.push("UPDATE ")
            .push(&self.table())
            .push(" SET ")
            .push(&attempt)
            .push(" = COALESCE(")
            .push(&attempt)
            .push(", 0) + 1 WHERE ")
            .push(&self.id())
            .push(" IN (");
        for i in 0..n {
            if i > 0 {
                s.push(", ");
            }
            s.arg(Arg::IdAt(i));
        }
        s.push(")");
        s.finish(StatementKind::CountAttempt, Output::Affected)
    }

    /// Counts the attempt of the row whose id is bound, while it is claimable (the advisory
    /// take on MySQL and MariaDB).
    pub(super) fn count_attempt(&self, attempt: &str) -> Statement {
        let mut s = Sql::new(self.dialect);
        self.count_attempt_of_id(&mut s, attempt);
        s.finish(StatementKind::TakeCount, Output::Affected)
    }

    /// ` SET <lease> = <expiry>` (MySQL and MariaDB mark their rows with the expiry their
    /// claim read from the database), and the attempt counted.
    pub(super) fn lease_set(&self, s: &mut Sql, lease: &str, expiry: Expiry) {
        let lease = self.q(lease);
        s.push(" SET ").push(&lease).push(" = ");
        match expiry {
            Expiry::Fence => s.time(Arg::Fence),
            Expiry::FromNow => s.db_now_plus(Arg::LeaseFor),
        };
        if let Some(attempt) = self.desc.attempt {
            let attempt = self.q(attempt.name);
            s.push(", ")
                .push(&attempt)
                .push(" = COALESCE(")
                .push(&attempt)
                .push(", 0) + 1");
        }
    }

    pub(super) fn claim_lease(&self, rows: Output, lease: &str) -> Statement {
        self.claim_lease_from(rows, lease, Start::Beginning)
    }

    pub(super) fn claim_lease_from(&self, rows: Output, lease: &str, start: Start) -> Statement {
        let mut s = Sql::new(self.dialect);
        let rows = with_until(rows);
        let column = match self.dialect {
            Dialect::Postgres => format!("{}.{}", self.table(), self.q(lease)),
            _ => self.q(lease),
        };
        let until = format!(
            ", {} AS {UNTIL}",
            super::statement::micros(self.dialect, &column)
        );
        if self.dialect == Dialect::Postgres {
            self.locked_ids(&mut s, start);
            s.push("UPDATE ").push(&self.table());
            self.lease_set(&mut s, lease, Expiry::FromNow);
            self.join_locked_ids(&mut s);
            s.push(" RETURNING ")
                .push(&self.table())
                .push(".*")
                .push(&until);
            return s.finish(StatementKind::ClaimLease, rows);
        }
        s.push("UPDATE ").push(&self.table());
        self.lease_set(&mut s, lease, Expiry::FromNow);
        s.push(" WHERE ")
            .push(&self.id())
            .push(" IN (SELECT ")
            .push(&self.id());
        s.push(" FROM ").push(&self.table());
        let lead = self.claimable(&mut s, Lead::Where);
        if start == Start::Floor {
            self.floor(&mut s, lead);
        }
        self.order(&mut s);
        s.push(" LIMIT ").arg(Arg::Limit);
        if self.dialect == Dialect::Postgres {
            s.push(" FOR UPDATE SKIP LOCKED");
        }
        s.push(") RETURNING *").push(&until);
        s.finish(StatementKind::ClaimLease, rows)
    }

    /// MySQL and MariaDB: the claim's locking read, which also reads the expiry its leases
    /// get by the database's clock; the mark writes it.
    pub(super) fn select_lease(&self, rows: Output) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push("SELECT ").push(&self.table()).push(".*, ");
        let mut until = Sql::new(self.dialect);
        until.db_now_plus(Arg::LeaseFor);
        s.push(&super::statement::micros(self.dialect, &until.text));
        s.args.extend(until.args);
        s.push(" AS ")
            .push(UNTIL)
            .push(" FROM ")
            .push(&self.table());
        let _ = self.claimable(&mut s, Lead::Where);
        self.order(&mut s);
        s.push(" LIMIT ")
            .arg(Arg::Limit)
            .push(" FOR UPDATE SKIP LOCKED");
        s.finish(StatementKind::SelectLease, with_until(rows))
    }

    pub(super) fn mark_lease(&self, n: usize, lease: &str) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push("UPDATE ").push(&self.table());
        self.lease_set(&mut s, lease, Expiry::Fence);
        s.push(" WHERE ").push(&self.id()).push(" IN (");
        for i in 0..n {
            if i > 0 {
                s.push(", ");
            }
            s.arg(Arg::IdAt(i));
        }
        s.push(")");
        s.finish(StatementKind::MarkLease(n), Output::Affected)
    }
}

/// The column a lease claim reads its rows' expiry from, in microseconds since the Unix epoch
/// by the database's clock: the fence of every later statement on the row.
pub const UNTIL: &str = "rs_until";

/// A claim's rows with the lease's expiry read last.
fn with_until(rows: Output) -> Output {
    match rows {
        Output::Rows { columns, raw } => {
            let mut columns = columns.to_vec();
            columns.push(OutColumn::new(UNTIL, ColumnType::Int));
            Output::Rows {
                columns: columns.into(),
                raw,
            }
        }
        other => other,
    }
}

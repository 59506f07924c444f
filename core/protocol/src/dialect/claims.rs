//! The claims' statements: the row lock form's lock, count and lock by id, the lease form's
//! claim and marks, and the start of a claim at an id in a table claimed in id order.

use super::{Arg, ColumnType, Dialect, Output, Renderer, Sql, Statement, StatementKind, named};

impl Renderer<'_> {
    /// Whether the claim order is the id alone, ascending: a claim may start at an id.
    pub(super) fn ordered_by_id(&self) -> bool {
        match self.desc.order {
            [] => self.desc.due.is_none(),
            [only] => only.column == self.desc.id.name && !only.descending,
            _ => false,
        }
    }

    /// Whether advisory claims may start past the rows taken before them: on PostgreSQL
    /// (whose claims pass over the entries of settled rows until vacuum removes them), in id
    /// order, without a due column (a row below the start is claimable again only when it
    /// was in work, in this process or in another), on the database's locks.
    pub(super) fn advisory_floor(&self) -> bool {
        self.dialect == Dialect::Postgres
            && self.desc.due.is_none()
            && self.ordered_by_id()
            && !self.desc.custom_lock()
    }

    /// `id >= floor`, after the claimable conditions (`wrote`: they wrote a `WHERE`).
    pub(super) fn floor(&self, s: &mut Sql, wrote: bool) {
        s.push(if wrote { " AND " } else { " WHERE " })
            .push(&self.id())
            .push(" >= ")
            .arg(Arg::Floor);
    }

    pub(super) fn lock_row(&self, rows: Output) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push("SELECT * FROM ").push(&self.table());
        let _ = self.claimable(&mut s, true);
        self.order(&mut s);
        s.push(" LIMIT 1 FOR UPDATE SKIP LOCKED");
        s.finish(StatementKind::LockRow, rows)
    }

    /// The first `Arg::Limit` claimable rows' ids, `FOR UPDATE SKIP LOCKED`, as a subquery;
    /// `floor`: from [`Arg::Floor`] on.
    pub(super) fn first_row_id(&self, s: &mut Sql, floor: bool) {
        s.push("SELECT ")
            .push(&self.id())
            .push(" FROM ")
            .push(&self.table());
        let wrote = self.claimable(s, true);
        if floor {
            self.floor(s, wrote);
        }
        self.order(s);
        s.push(" LIMIT ")
            .arg(Arg::Limit)
            .push(" FOR UPDATE SKIP LOCKED");
    }

    /// PostgreSQL: `WITH rs_claim AS (SELECT id .. FOR UPDATE SKIP LOCKED) `, the ids a claim
    /// takes, locked once: a sub-select in `WHERE id IN (..)` may run again while the update
    /// rechecks a row another transaction changed, and then wait for rows it did not lock.
    pub(super) fn locked_ids(&self, s: &mut Sql, floor: bool) {
        s.push("WITH rs_claim AS (");
        self.first_row_id(s, floor);
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

    pub(super) fn count_row(&self, attempt_column: &'static str, floor: bool) -> Statement {
        let attempt = self.q(attempt_column);
        let mut s = Sql::new(self.dialect);
        if self.dialect == Dialect::Postgres {
            self.locked_ids(&mut s, floor);
            s.push("UPDATE ")
                .push(&self.table())
                .push(" SET ")
                .push(&attempt)
                .push(" = ")
                .push(&self.table())
                .push(".")
                .push(&attempt)
                .push(" + 1");
            self.join_locked_ids(&mut s);
            s.push(" RETURNING ")
                .push(&self.table())
                .push(".")
                .push(&self.id())
                .push(", ")
                .push(&self.table())
                .push(".")
                .push(&attempt);
            return s.finish(
                StatementKind::CountRow,
                named(&[
                    (self.desc.id.name, ColumnType::Id),
                    (attempt_column, ColumnType::Int),
                ]),
            );
        }
        s.push("UPDATE ")
            .push(&self.table())
            .push(" SET ")
            .push(&attempt)
            .push(" = ")
            .push(&attempt)
            .push(" + 1 WHERE ")
            .push(&self.id())
            .push(" IN (");
        self.first_row_id(&mut s, floor);
        s.push(") RETURNING ")
            .push(&self.id())
            .push(", ")
            .push(&attempt);
        s.finish(
            StatementKind::CountRow,
            named(&[
                (self.desc.id.name, ColumnType::Id),
                (attempt_column, ColumnType::Int),
            ]),
        )
    }

    pub(super) fn select_row_id(&self, attempt: &'static str) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push("SELECT ")
            .push(&self.id())
            .push(", ")
            .push(&self.q(attempt))
            .push(" FROM ")
            .push(&self.table());
        let _ = self.claimable(&mut s, true);
        self.order(&mut s);
        s.push(" LIMIT ")
            .arg(Arg::Limit)
            .push(" FOR UPDATE SKIP LOCKED");
        s.finish(
            StatementKind::SelectRowId,
            named(&[
                (self.desc.id.name, ColumnType::Id),
                (attempt, ColumnType::Int),
            ]),
        )
    }

    pub(super) fn lock_row_by_id(&self, rows: Output, attempt: &str) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push("SELECT * FROM ")
            .push(&self.table())
            .push(" WHERE ")
            .push(&self.id())
            .push(" = ")
            .arg(Arg::Id)
            .push(" AND ")
            .push(&self.q(attempt))
            .push(" = ")
            .arg(Arg::Attempt);
        let _ = self.claimable(&mut s, false);
        s.push(" FOR UPDATE SKIP LOCKED");
        s.finish(StatementKind::LockRowById, rows)
    }

    /// Counts the attempts of `n` rows by their ids (the row lock claim on MySQL and MariaDB).
    pub(super) fn count_attempts(&self, attempt: &str, n: usize) -> Statement {
        let attempt = self.q(attempt);
        let mut s = Sql::new(self.dialect);
        s.push("UPDATE ")
            .push(&self.table())
            .push(" SET ")
            .push(&attempt)
            .push(" = ")
            .push(&attempt)
            .push(" + 1 WHERE ")
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
        let attempt = self.q(attempt);
        let mut s = Sql::new(self.dialect);
        s.push("UPDATE ")
            .push(&self.table())
            .push(" SET ")
            .push(&attempt)
            .push(" = ")
            .push(&attempt)
            .push(" + 1 WHERE ")
            .push(&self.id())
            .push(" = ")
            .arg(Arg::Id);
        let _ = self.claimable(&mut s, false);
        s.finish(StatementKind::TakeCount, Output::Affected)
    }

    pub(super) fn lease_set(&self, s: &mut Sql, lease: &str) {
        let lease = self.q(lease);
        s.push(" SET ").push(&lease).push(" = ");
        s.time(Arg::Until);
        if let Some(attempt) = self.desc.attempt {
            let attempt = self.q(attempt.name);
            s.push(", ")
                .push(&attempt)
                .push(" = ")
                .push(&attempt)
                .push(" + 1");
        }
    }

    pub(super) fn claim_lease(&self, rows: Output, lease: &str) -> Statement {
        self.claim_lease_from(rows, lease, false)
    }

    pub(super) fn claim_lease_from(&self, rows: Output, lease: &str, floor: bool) -> Statement {
        let mut s = Sql::new(self.dialect);
        if self.dialect == Dialect::Postgres {
            self.locked_ids(&mut s, floor);
            s.push("UPDATE ").push(&self.table());
            self.lease_set(&mut s, lease);
            self.join_locked_ids(&mut s);
            s.push(" RETURNING ").push(&self.table()).push(".*");
            return s.finish(StatementKind::ClaimLease, rows);
        }
        s.push("UPDATE ").push(&self.table());
        self.lease_set(&mut s, lease);
        s.push(" WHERE ")
            .push(&self.id())
            .push(" IN (SELECT ")
            .push(&self.id());
        s.push(" FROM ").push(&self.table());
        let wrote = self.claimable(&mut s, true);
        if floor {
            self.floor(&mut s, wrote);
        }
        self.order(&mut s);
        s.push(" LIMIT ").arg(Arg::Limit);
        if self.dialect == Dialect::Postgres {
            s.push(" FOR UPDATE SKIP LOCKED");
        }
        s.push(") RETURNING *");
        s.finish(StatementKind::ClaimLease, rows)
    }

    pub(super) fn select_lease(&self, rows: Output) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push("SELECT * FROM ").push(&self.table());
        let _ = self.claimable(&mut s, true);
        self.order(&mut s);
        s.push(" LIMIT ")
            .arg(Arg::Limit)
            .push(" FOR UPDATE SKIP LOCKED");
        s.finish(StatementKind::SelectLease, rows)
    }

    pub(super) fn mark_lease(&self, n: usize, lease: &str) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push("UPDATE ").push(&self.table());
        self.lease_set(&mut s, lease);
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

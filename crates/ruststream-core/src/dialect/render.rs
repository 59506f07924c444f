//! The renderer of one table's statements in a dialect: the statements of each form, and the
//! claim conditions and order, list of columns, leases, advisory keys and candidates, takes,
//! settlements and publishes they are built of.

use std::sync::Arc;

use crate::spec::{KeyPart, OrderBy, TableDesc};

use super::claims::Start;
use super::session::LockCall;
use super::statement::Binding;
use super::{
    AdvisoryStatements, AdvisoryTake, Arg, ColumnType, Dialect, KeyLocks, LeaseClaim,
    LeaseStatements, OutColumn, Output, RowLockClaim, RowLockStatements, Sql, Statement,
    StatementKind, Statements, named,
};

/// What opens the next condition of a `WHERE` clause: `WHERE` before the first, `AND` after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lead {
    Where,
    And,
}

impl Lead {
    pub(super) fn sql(self) -> &'static str {
        match self {
            Lead::Where => " WHERE ",
            Lead::And => " AND ",
        }
    }
}

/// How a key's text renders a key column that is `NULL`: as `NULL` (no key), or as empty
/// text (to compare keys with).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyNulls {
    Kept,
    Empty,
}

/// Whether a publish notifies the table's listeners in the same statement (PostgreSQL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Notifies {
    Notify,
    Quiet,
}

pub(super) struct Renderer<'a> {
    pub(super) dialect: Dialect,
    pub(super) desc: &'a TableDesc,
    /// How many ids the claimable conditions leave out ([`Arg::ExcludedId`]).
    pub(super) exclude_ids: usize,
}

impl<'a> Renderer<'a> {
    pub(super) fn new(dialect: Dialect, desc: &'a TableDesc) -> Self {
        Self {
            dialect,
            desc,
            exclude_ids: 0,
        }
    }
}

impl Renderer<'_> {
    /// A column's name, quoted as one identifier.
    pub(super) fn q(&self, name: &str) -> String {
        self.dialect.quote_one(name)
    }

    /// The table's name, quoted part by part.
    pub(super) fn table(&self) -> String {
        self.dialect.quote(self.desc.table)
    }

    pub(super) fn id(&self) -> String {
        self.q(self.desc.id.name)
    }

    pub(super) fn row_lock_statements(&self, rows: Output, batch: usize) -> RowLockStatements {
        let claim = match (self.desc.attempt, self.dialect) {
            (None, _) => RowLockClaim::Lock {
                lock_row: self.lock_row(rows),
            },
            (Some(attempt), Dialect::Postgres | Dialect::Sqlite) => RowLockClaim::Count {
                count_row: self.count_row(attempt.name, Start::Beginning),
                lock_row_by_id: self.lock_row_by_id(rows.clone(), attempt.name),
                lock_row_by_id_unmarking: self.lock_row_by_id_unmarking(rows, attempt.name),
                unmark_rows: (1..=batch.max(1)).map(|n| self.unmark_rows(n)).collect(),
            },
            (Some(attempt), Dialect::MySql | Dialect::MariaDb) => RowLockClaim::SelectCount {
                read_committed: self.fixed(
                    StatementKind::ReadCommitted,
                    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
                ),
                select_row_id: self.select_row_id(attempt.name),
                mark_rows: (1..=2 * batch.max(1)).map(|n| self.mark_rows(n)).collect(),
                count_attempts: (1..=batch.max(1))
                    .map(|n| self.count_attempts(attempt.name, n))
                    .collect(),
                lock_row_by_id: self.lock_row_by_id(rows.clone(), attempt.name),
                lock_row_by_id_unmarking: self.lock_row_by_id_unmarking(rows, attempt.name),
                unmark_rows: (1..=2 * batch.max(1))
                    .map(|n| self.unmark_rows(n))
                    .collect(),
            },
        };
        RowLockStatements {
            isolation: (self.dialect == Dialect::Postgres).then(|| {
                let mut s = Sql::new(self.dialect);
                s.push("SELECT current_setting('transaction_isolation') AS isolation");
                s.finish(
                    StatementKind::Isolation,
                    named(&[("isolation", ColumnType::Text)]),
                )
            }),
            claim,
            settle: self.settle(None),
            fail: self.fail(None),
            retry: self.retry_later(None),
            ping: self.fixed(StatementKind::Ping, "SELECT 1"),
            count_row_from: match (self.desc.attempt, self.dialect) {
                (Some(attempt), Dialect::Postgres) if self.ordered_by_id() => {
                    Some(self.count_row(attempt.name, Start::Floor))
                }
                _ => None,
            },
            savepoint: self.fixed(StatementKind::Savepoint, "SAVEPOINT rs_handler"),
            rollback_to_savepoint: self.fixed(
                StatementKind::RollbackToSavepoint,
                "ROLLBACK TO SAVEPOINT rs_handler",
            ),
            session_probe: (self.dialect == Dialect::Postgres && self.desc.attempt.is_some())
                .then(|| (self.lock_fn(LockCall::Lock), self.lock_fn(LockCall::Unlock))),
        }
    }

    pub(super) fn lease_statements(
        &self,
        rows: Output,
        batch: usize,
        lease: &str,
    ) -> LeaseStatements {
        let claim = if self.dialect.update_returning() {
            LeaseClaim::Returning {
                claim: self.claim_lease(rows.clone(), lease),
            }
        } else {
            LeaseClaim::Locking {
                select: self.select_lease(rows.clone()),
                mark: (1..=batch.max(1))
                    .map(|n| self.mark_lease(n, lease))
                    .collect(),
            }
        };
        LeaseStatements {
            claim,
            extend: self.extend_lease(lease),
            release: self.release_lease(lease),
            settle: self.settle(Some(lease)),
            fail: self.fail(Some(lease)),
            retry: self
                .retry_later(Some(lease))
                .expect("a lease table writes its retry into the lease"),
            settles_together: Statements::settles_leases_together(self.dialect, self.desc),
            claim_from: (self.dialect.update_returning() && self.ordered_by_id())
                .then(|| self.claim_lease_from(rows.clone(), lease, Start::Floor)),
        }
    }

    pub(super) fn advisory_statements(&self, rows: Output) -> AdvisoryStatements {
        let keys = match (self.desc.custom_lock(), self.dialect) {
            (true, _) => KeyLocks::Custom,
            (false, Dialect::Sqlite) => KeyLocks::Registry,
            (false, _) => KeyLocks::Database {
                try_lock: self.lock_fn(LockCall::Lock),
                unlock: self.lock_fn(LockCall::Unlock),
            },
        };
        let take = match self.desc.attempt.filter(|_| self.dialect.mysql_like()) {
            Some(attempt) => AdvisoryTake::CountThenRead {
                take_count: self.count_attempt(attempt.name),
                read_row: self.read_row(rows),
            },
            None => AdvisoryTake::Returning {
                take: self.take(rows),
            },
        };
        AdvisoryStatements {
            candidates: self.candidates(0, Start::Beginning),
            candidates_from: self
                .advisory_floor()
                .then(|| self.candidates(0, Start::Floor)),
            keys,
            take,
            settle: self.settle(None),
            fail: self.fail(None),
            retry: self.retry_later(None),
            ping: (self.dialect != Dialect::Sqlite)
                .then(|| self.fixed(StatementKind::Ping, "SELECT 1")),
        }
    }

    pub(super) fn fixed(&self, kind: StatementKind, text: &str) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push(text);
        s.finish(kind, Output::Nothing)
    }

    /// The columns the core reads from a taken row: the id, then the attempt.
    pub(super) fn row_columns(&self) -> Arc<[OutColumn]> {
        let mut columns = vec![OutColumn::new(self.desc.id.name, ColumnType::Id)];
        if let Some(attempt) = self.desc.attempt {
            columns.push(OutColumn::new(attempt.name, ColumnType::Int));
        }
        columns.into()
    }

    /// The conditions under which a row is claimable now, by the database's clock, each
    /// opened as `lead` says; answers what opens the condition after them.
    pub(super) fn claimable(&self, s: &mut Sql, lead: Lead) -> Lead {
        let first = lead;
        let mut wrote = false;
        let mut lead = lead.sql();
        for mark in [self.desc.processed_at, self.desc.failed_at]
            .into_iter()
            .flatten()
        {
            s.push(lead).push(&self.q(mark.name)).push(" IS NULL");
            lead = " AND ";
            wrote = true;
        }
        if let Some(due) = self.desc.due {
            s.push(lead).push(&self.q(due.name)).push(" <= ");
            s.db_now();
            lead = " AND ";
            wrote = true;
        }
        if let Some(lease) = self.desc.locked_until() {
            let lease = self.q(lease.name);
            s.push(lead)
                .push("(")
                .push(&lease)
                .push(" IS NULL OR ")
                .push(&lease)
                .push(" <= ");
            s.db_now().push(")");
            lead = " AND ";
            wrote = true;
        }
        if self.exclude_ids > 0 {
            s.push(lead).push(&self.id()).push(" NOT IN (");
            for i in 0..self.exclude_ids {
                if i > 0 {
                    s.push(", ");
                }
                s.arg(Arg::ExcludedId(i));
            }
            s.push(")");
            wrote = true;
        }
        if wrote { Lead::And } else { first }
    }

    pub(super) fn order(&self, s: &mut Sql) {
        let mut order: Vec<OrderBy> = self.desc.order.to_vec();
        if order.is_empty()
            && let Some(due) = self.desc.due
        {
            order.push(OrderBy::asc(due.name));
        }
        if !order.iter().any(|o| o.column == self.desc.id.name) {
            order.push(OrderBy::asc(self.desc.id.name));
        }
        s.push(" ORDER BY ");
        for (i, o) in order.iter().enumerate() {
            if i > 0 {
                s.push(", ");
            }
            s.push(&self.q(o.column));
            s.push(if o.descending { " DESC" } else { " ASC" });
        }
    }

    pub(super) fn list_columns(&self) -> Statement {
        let mut s = Sql::new(self.dialect);
        let schema = self.desc.table.rsplit_once('.').map(|(schema, _)| schema);
        match self.dialect {
            Dialect::Postgres => {
                s.push("SELECT CAST(column_name AS TEXT) AS column_name, CAST(data_type AS TEXT) AS data_type FROM information_schema.columns WHERE table_schema = ");
                if schema.is_some() {
                    s.arg(Arg::Schema);
                } else {
                    s.push("current_schema()");
                }
                s.push(" AND table_name = ").arg(Arg::TableName);
            }
            Dialect::MySql | Dialect::MariaDb => {
                s.push("SELECT column_name AS column_name, column_type AS data_type FROM information_schema.columns WHERE table_schema = ");
                if schema.is_some() {
                    s.arg(Arg::Schema);
                } else {
                    s.push("DATABASE()");
                }
                s.push(" AND table_name = ").arg(Arg::TableName);
            }
            Dialect::Sqlite => {
                s.push("SELECT name AS column_name, type AS data_type FROM pragma_table_info(")
                    .arg(Arg::TableName);
                if schema.is_some() {
                    s.push(", ").arg(Arg::Schema);
                }
                s.push(")");
            }
        }
        s.finish(
            StatementKind::ListColumns,
            named(&[
                ("column_name", ColumnType::Text),
                ("data_type", ColumnType::Text),
            ]),
        )
    }

    pub(super) fn fence(&self, s: &mut Sql, lease: &str) {
        let lease = self.q(lease);
        s.push(" AND ").push(&lease).push(" = ");
        s.time(Arg::Fence);
    }

    fn extend_lease(&self, lease_column: &str) -> Statement {
        let lease = self.q(lease_column);
        let mut s = Sql::new(self.dialect);
        s.push("UPDATE ")
            .push(&self.table())
            .push(" SET ")
            .push(&lease)
            .push(" = ");
        s.time_plus(&lease, Arg::Extend);
        s.push(" WHERE ").push(&self.id()).push(" = ").arg(Arg::Id);
        self.fence(&mut s, lease_column);
        s.finish(StatementKind::ExtendLease, Output::Affected)
    }

    fn release_lease(&self, lease_column: &str) -> Statement {
        let lease = self.q(lease_column);
        let mut s = Sql::new(self.dialect);
        s.push("UPDATE ")
            .push(&self.table())
            .push(" SET ")
            .push(&lease)
            .push(" = NULL WHERE ")
            .push(&self.id())
            .push(" = ")
            .arg(Arg::Id);
        self.fence(&mut s, lease_column);
        s.finish(StatementKind::ReleaseLease, Output::Affected)
    }

    /// The key as text, rendered by the database, its `NULL` columns as `nulls` says.
    fn key_expr(&self, nulls: KeyNulls) -> String {
        let parts = self.desc.advisory().unwrap_or(&[]);
        let texts: Vec<String> = parts
            .iter()
            .map(|part| match part {
                KeyPart::Literal(text) => self.dialect.text_literal(text),
                KeyPart::Column(column) => {
                    let cast = match self.dialect {
                        Dialect::MySql | Dialect::MariaDb => "CHAR",
                        Dialect::Postgres | Dialect::Sqlite => "TEXT",
                    };
                    let text = format!("CAST({} AS {cast})", self.q(column));
                    if nulls == KeyNulls::Empty {
                        format!("COALESCE({text}, '')")
                    } else {
                        text
                    }
                }
            })
            .collect();
        match (self.dialect, texts.len()) {
            (_, 1) => texts.into_iter().next().expect("one part"),
            (Dialect::MySql | Dialect::MariaDb, _) => format!("CONCAT({})", texts.join(", ")),
            (Dialect::Postgres | Dialect::Sqlite, _) => format!("({})", texts.join(" || ")),
        }
    }

    /// The first claimable rows' ids and keys, passing over the rows of `excluded` keys, from
    /// the table's start or from [`Arg::Floor`] on.
    pub(super) fn candidates(&self, excluded: usize, start: Start) -> Statement {
        let mut s = Sql::new(self.dialect);
        // A key column's `NULL` reads as no key, which the claim fails naming the column.
        s.push("SELECT ")
            .push(&self.id())
            .push(" AS rs_id, ")
            .push(&self.key_expr(KeyNulls::Kept))
            .push(" AS rs_key FROM ")
            .push(&self.table());
        let mut lead = self.claimable(&mut s, Lead::Where);
        if start == Start::Floor {
            self.floor(&mut s, lead);
            lead = Lead::And;
        }
        if excluded > 0 {
            s.push(lead.sql())
                .push(&self.key_expr(KeyNulls::Empty))
                .push(" NOT IN (");
            for i in 0..excluded {
                if i > 0 {
                    s.push(", ");
                }
                s.arg(Arg::ExcludedKey(i));
            }
            s.push(")");
        }
        self.order(&mut s);
        s.push(" LIMIT ").arg(Arg::Limit);
        s.finish(
            StatementKind::Candidates,
            named(&[("rs_id", ColumnType::Id), ("rs_key", ColumnType::Text)]),
        )
    }

    fn lock_fn(&self, call: LockCall) -> Statement {
        super::session::key_lock(self.dialect, call)
    }

    fn take(&self, rows: Output) -> Statement {
        let mut s = Sql::new(self.dialect);
        match self.desc.attempt {
            Some(attempt) => {
                self.count_attempt_of_id(&mut s, attempt.name);
                s.push(" RETURNING *");
            }
            None => {
                self.row_by_id(&mut s);
                let _ = self.claimable(&mut s, Lead::And);
            }
        }
        s.finish(StatementKind::Take, rows)
    }

    /// `UPDATE <table> SET <attempt> = COALESCE(<attempt>, 0) + 1 WHERE <id> = ?` and the
    /// claimable conditions: the attempt of the row whose id is bound, counted while it is
    /// claimable.
    pub(super) fn count_attempt_of_id(&self, s: &mut Sql, attempt: &str) {
        let attempt = self.q(attempt);
        s.push("UPDATE ")
            .push(&self.table())
            .push(" SET ")
            .push(&attempt)
            .push(" = COALESCE(")
            .push(&attempt)
            .push(", 0) + 1 WHERE ")
            .push(&self.id())
            .push(" = ")
            .arg(Arg::Id);
        let _ = self.claimable(s, Lead::And);
    }

    /// `SELECT * FROM <table> WHERE <id> = ?`.
    fn row_by_id(&self, s: &mut Sql) {
        s.push("SELECT * FROM ")
            .push(&self.table())
            .push(" WHERE ")
            .push(&self.id())
            .push(" = ")
            .arg(Arg::Id);
    }

    pub(super) fn read_row(&self, rows: Output) -> Statement {
        let mut s = Sql::new(self.dialect);
        self.row_by_id(&mut s);
        s.finish(StatementKind::ReadRow, rows)
    }

    /// Settles a row as done; `fence` is the lease column of the lease form, whose
    /// settlement holds only while this process's lease holds the row.
    fn settle(&self, fence: Option<&str>) -> Statement {
        let fenced = fence.is_some();
        let mut s = Sql::new(self.dialect);
        let kind = if self.settle_start(&mut s) {
            StatementKind::MarkProcessed { fenced }
        } else {
            StatementKind::Delete { fenced }
        };
        s.push(" WHERE ").push(&self.id()).push(" = ").arg(Arg::Id);
        if let Some(lease) = fence {
            self.fence(&mut s, lease);
        }
        s.finish(kind, Output::Affected)
    }

    /// The start of a settlement: `UPDATE <table> SET <processed_at> = <the database's time>` (and the lease
    /// cleared) where the table marks rows processed, answering `true`; `DELETE FROM <table>`
    /// otherwise.
    fn settle_start(&self, s: &mut Sql) -> bool {
        let Some(processed) = self.desc.processed_at else {
            s.push("DELETE FROM ").push(&self.table());
            return false;
        };
        s.push("UPDATE ")
            .push(&self.table())
            .push(" SET ")
            .push(&self.q(processed.name))
            .push(" = ");
        s.db_now();
        if let Some(lease) = self.desc.locked_until() {
            s.push(", ").push(&self.q(lease.name)).push(" = NULL");
        }
        true
    }

    pub(super) fn settle_leases(&self, rows: usize, lease_column: &str) -> Statement {
        let mut s = Sql::new(self.dialect);
        self.settle_start(&mut s);
        let lease = self.q(lease_column);
        s.push(" WHERE ");
        for i in 0..rows {
            if i > 0 {
                s.push(" OR ");
            }
            s.push("(").push(&self.id()).push(" = ").arg(Arg::IdAt(i));
            s.push(" AND ").push(&lease).push(" = ");
            s.time(Arg::FenceAt(i));
            s.push(")");
        }
        s.push(" RETURNING ").push(&self.id());
        s.finish(
            StatementKind::SettleLeases(rows),
            named(&[(self.desc.id.name, ColumnType::Id)]),
        )
    }

    /// The columns publishing writes, with their arguments. On PostgreSQL the insert sits in
    /// a `WITH` whose query notifies once per row written: the reply is a row count all the
    /// same, and the notification leaves with the commit.
    pub(super) fn publish(&self) -> Statement {
        let notifies = match self.dialect {
            Dialect::Postgres => Notifies::Notify,
            Dialect::MySql | Dialect::MariaDb | Dialect::Sqlite => Notifies::Quiet,
        };
        self.publish_n(1, notifies)
    }

    /// The columns publishing writes, with their arguments.
    pub(super) fn publish_columns(&self) -> Vec<(&'static str, Arg)> {
        let mut columns: Vec<(&'static str, Arg)> = Vec::new();
        if !self.desc.id.generated {
            columns.push((self.desc.id.name, Arg::Id));
        }
        if let Some(payload) = self.desc.payload.filter(|c| !c.generated) {
            columns.push((payload.name, Arg::Payload));
        }
        // A key column that the description names in a role (the id, most often: a key on
        // the row's id) is written by that role, or not at all when the database fills it.
        let described = [
            Some(self.desc.id),
            self.desc.payload,
            self.desc.attempt,
            self.desc.locked_until(),
            self.desc.processed_at,
            self.desc.due,
            self.desc.failed_at,
            self.desc.error,
            self.desc.errors,
        ];
        for column in self
            .desc
            .key_columns()
            .into_iter()
            .chain(self.desc.unique.iter().copied())
        {
            let in_role = described.iter().flatten().any(|c| c.name == column);
            if !in_role && !columns.iter().any(|(c, _)| *c == column) {
                columns.push((column, Arg::Column(column)));
            }
        }
        if let Some(due) = self.desc.due.filter(|c| !c.generated) {
            columns.push((due.name, Arg::Due));
        }
        columns
    }

    /// The insert of `rows` rows (one where the rows have no column to write).
    pub(super) fn publish_n(&self, rows: usize, notifies: Notifies) -> Statement {
        let columns = self.publish_columns();
        let mut s = Sql::new(self.dialect);
        if notifies == Notifies::Notify {
            s.push("WITH rs_published AS (");
        }
        let deduplicates = !self.desc.unique.is_empty();
        s.push(if deduplicates && self.dialect.mysql_like() {
            "INSERT IGNORE INTO "
        } else {
            "INSERT INTO "
        })
        .push(&self.table());
        if columns.is_empty() {
            s.push(if self.dialect.mysql_like() {
                " () VALUES ()"
            } else {
                " DEFAULT VALUES"
            });
        } else {
            s.push(" (");
            for (i, (column, _)) in columns.iter().enumerate() {
                if i > 0 {
                    s.push(", ");
                }
                s.push(&self.q(column));
            }
            s.push(") VALUES ");
            for row in 0..rows {
                s.push(if row > 0 { ", (" } else { "(" });
                for (i, (_, arg)) in columns.iter().enumerate() {
                    if i > 0 {
                        s.push(", ");
                    }
                    if *arg == Arg::Due {
                        // A row published without a due time is due at the database's time.
                        s.push("COALESCE(");
                        s.time_placeholder(Arg::Due, Binding::Own);
                        s.push(", ").db_now().push(")");
                    } else {
                        s.fresh_arg(*arg);
                    }
                }
                s.push(")");
            }
        }
        if deduplicates && !self.dialect.mysql_like() {
            // Only a uniqueness conflict is passed over: a row that breaks another
            // constraint still fails the publish.
            s.push(" ON CONFLICT DO NOTHING");
        }
        if notifies == Notifies::Notify {
            s.push(" RETURNING 1) SELECT ")
                .push(&self.dialect.notify_call(self.desc.table))
                .push(" FROM rs_published");
        }
        s.finish(StatementKind::Publish, Output::Affected)
    }
}

//! Every SQL text of the queue, per dialect, rendered once per subscription.
//!
//! [`Statements::render`] turns a [`TableDesc`] into the statements its form needs. Each
//! [`Statement`] carries its text, its [`StatementKind`] (what it does, for tests and models),
//! the logical arguments of its placeholders in order ([`Arg`]), and what its reply holds
//! ([`Output`]). An adapter binds `statement.args` as the core fills them and reads the reply as
//! `statement.output` says; it writes no SQL of its own.
//!
//! One clock decides every time the queue writes into a row or compares with one: the
//! database's (PostgreSQL `statement_timestamp()`, MySQL and MariaDB `UTC_TIMESTAMP(6)`,
//! SQLite `'now'`). The core binds durations (a lease, a retry's delay, a retention's age),
//! never a time of its process, so a process whose clock is off neither takes a row another
//! holds nor leases one for longer. A lease claim reads the expiry it wrote back
//! ([`UNTIL`]): the fence of the row's later statements. The times a user gives (a due
//! time, a schedule's ticks) are bound as microseconds since the Unix epoch, converted per
//! dialect: PostgreSQL `timestamptz`, MySQL and MariaDB `DATETIME(6)` (UTC), SQLite `INTEGER`
//! microseconds.
//!
//! On MySQL and MariaDB (InnoDB) a locking read locks each row as it reads it, before any sort.
//! A claim whose order no index serves sorts every claimable row and so locks them all, and a
//! concurrent claim finds nothing to take until the first commits. Such a table indexes the
//! claim order's columns, then the id: `(due_at, id)` for the default order with a due column.
//! PostgreSQL locks rows after the sort and the limit, and needs no index for it.
//!
//! On PostgreSQL a publish also notifies [`NOTIFY_CHANNEL`], in the same statement, with the
//! table's name as the payload: a session that ran [`Dialect::listen_statement`] hears of the
//! row once its transaction commits, and the runtime wakes the table's subscriptions at once
//! instead of at their next poll. The other dialects have no such channel: there only the
//! publishing process wakes its own subscriptions.

use std::sync::Arc;

use crate::spec::{Form, Hold, TableDesc};

mod claims;
mod failed;
mod literal;
mod maintenance;
mod render;
mod schema;
mod session;
mod statement;
mod stats;

pub use claims::UNTIL;
pub use failed::{FailedRows, error_like};
pub use maintenance::{
    MaintenanceKind, PERIODIC_TABLE, PeriodicStatements, RetentionStatements, periodic_table_ddl,
};
pub(crate) use schema::claim_order;
pub use schema::{Ddl, serves_claims};
pub(crate) use session::{session_ping, session_probe};
pub use statement::{Arg, ColumnType, OutColumn, Output, Statement, StatementKind};

use claims::Start;
use render::{Notifies, Renderer};
use statement::Sql;

/// The PostgreSQL channel every publish notifies, with the table's name as the payload. A
/// program that inserts rows itself wakes subscriptions with `NOTIFY ruststream, 'jobs'`
/// ([`Dialect::notify_statement`]); listeners run [`Dialect::listen_statement`].
pub const NOTIFY_CHANNEL: &str = "ruststream";

/// Whether a notification's payload names `table`: the same name, or the same name with or
/// without its schema (`app.jobs` and `jobs`). A payload that names a table of the same name
/// in another schema matches too: it costs one claim that finds nothing.
pub fn notification_names(payload: &str, table: &str) -> bool {
    fn unqualified(name: &str) -> &str {
        name.rsplit_once('.').map_or(name, |(_, name)| name)
    }
    payload == table || unqualified(payload) == unqualified(table)
}

/// A SQL dialect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// PostgreSQL 9.5 and later.
    Postgres,
    /// MySQL 8.0.1 and later.
    MySql,
    /// MariaDB 10.6 and later.
    MariaDb,
    /// SQLite 3.35 and later.
    Sqlite,
}

impl Dialect {
    /// The database's name in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Dialect::Postgres => "PostgreSQL",
            Dialect::MySql => "MySQL",
            Dialect::MariaDb => "MariaDB",
            Dialect::Sqlite => "SQLite",
        }
    }

    /// Whether the dialect has `FOR UPDATE SKIP LOCKED`.
    pub const fn has_row_locks(self) -> bool {
        !matches!(self, Dialect::Sqlite)
    }

    /// Whether an `UPDATE` can return the rows it changed.
    pub const fn update_returning(self) -> bool {
        matches!(self, Dialect::Postgres | Dialect::Sqlite)
    }

    const fn mysql_like(self) -> bool {
        matches!(self, Dialect::MySql | Dialect::MariaDb)
    }

    /// The statement a session runs to hear of published rows: `LISTEN ruststream` on
    /// PostgreSQL ([`NOTIFY_CHANNEL`]); `None` elsewhere, where no publish notifies.
    pub const fn listen_statement(self) -> Option<&'static str> {
        match self {
            Dialect::Postgres => Some("LISTEN ruststream"),
            Dialect::MySql | Dialect::MariaDb | Dialect::Sqlite => None,
        }
    }

    /// The statement that tells listening subscriptions of `table` that it has new rows, for
    /// a row written without a ruststream publisher: `SELECT pg_notify('ruststream', 'jobs')`
    /// on PostgreSQL, which notifies when its transaction commits; `None` elsewhere.
    pub fn notify_statement(self, table: &str) -> Option<String> {
        match self {
            Dialect::Postgres => Some(format!("SELECT {}", self.notify_call(table))),
            Dialect::MySql | Dialect::MariaDb | Dialect::Sqlite => None,
        }
    }

    /// `pg_notify` of [`NOTIFY_CHANNEL`] with `table` as the payload.
    fn notify_call(self, table: &str) -> String {
        format!(
            "pg_notify({}, {})",
            self.text_literal(NOTIFY_CHANNEL),
            self.text_literal(table)
        )
    }

    /// `name` quoted as an identifier; a dotted name (`schema.table`) is quoted part by part.
    pub fn quote(self, name: &str) -> String {
        name.split('.')
            .map(|part| self.quote_one(part))
            .collect::<Vec<_>>()
            .join(".")
    }

    /// `name` quoted as one identifier, dots and all: a column's name.
    fn quote_one(self, name: &str) -> String {
        let (open, close) = if self.mysql_like() {
            ('`', "``")
        } else {
            ('"', "\"\"")
        };
        let mut out = String::with_capacity(name.len() + 2);
        out.push(open);
        out.push_str(&name.replace(open, close));
        out.push(open);
        out
    }

    fn text_literal(self, text: &str) -> String {
        let escaped = text.replace('\'', "''");
        if self.mysql_like() {
            format!("'{}'", escaped.replace('\\', "\\\\"))
        } else {
            format!("'{escaped}'")
        }
    }
}

/// The statements of one subscription's table, in its dialect and form: those every form
/// runs, and the form's own in [`Statements::form`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statements {
    /// The dialect.
    pub dialect: Dialect,
    /// Opens a transaction.
    pub begin: Statement,
    /// Commits.
    pub commit: Statement,
    /// Rolls back.
    pub rollback: Statement,
    /// Lists the table's columns.
    pub list_columns: Statement,
    /// Lists the table's indexes, each with its columns in order, for the check of the claim
    /// index ([`serves_claims`]).
    pub list_indexes: Statement,
    /// MySQL and MariaDB: the current database, whose name the advisory lock names carry.
    pub current_database: Option<Statement>,
    /// Inserts a row, and on PostgreSQL notifies [`NOTIFY_CHANNEL`].
    pub publish: Statement,
    /// Reads a row by id, with the driver's row: for tools and tests (the advisory take of
    /// MySQL and MariaDB reads with its own, [`AdvisoryTake::CountThenRead`]).
    pub read_row: Statement,
    /// The statements of the table's form.
    pub form: FormStatements,
}

/// The statements of one form, shared with the claims and deliveries of its subscription: a
/// machine of one form reads only its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FormStatements {
    /// The row lock form.
    RowLock(Arc<RowLockStatements>),
    /// The lease form.
    Lease(Arc<LeaseStatements>),
    /// The advisory lock form.
    Advisory(Arc<AdvisoryStatements>),
}

/// The row lock form's statements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowLockStatements {
    /// PostgreSQL: the session's isolation level, which the check reads.
    pub isolation: Option<Statement>,
    /// How a claim counts the attempt and locks the row.
    pub claim: RowLockClaim,
    /// Settles a row as done, in the claim's transaction: deletes it, or marks it.
    pub settle: Statement,
    /// Marks a row failed, in the claim's transaction, where the table keeps failed rows.
    pub fail: Option<Statement>,
    /// Writes a retried row's due time and error, in the claim's transaction, where the table
    /// has either column.
    pub retry: Option<Statement>,
    /// `SELECT 1` on the session of a row claimed ahead that waited, before it is handed.
    pub ping: Statement,
    /// PostgreSQL with an attempt column, where the claim order is the id alone: the count
    /// looking only at ids from [`Arg::Floor`] on (see [`LeaseStatements::claim_from`]).
    pub count_row_from: Option<Statement>,
    /// `SAVEPOINT rs_handler`: before the claim's transaction is lent to the handler, so that
    /// a settlement other than an acknowledgement undoes what the handler wrote.
    pub savepoint: Statement,
    /// `ROLLBACK TO SAVEPOINT rs_handler`: undoes the handler's writes before a retry or a
    /// failure is written and committed.
    pub rollback_to_savepoint: Statement,
    /// PostgreSQL with an attempt column: a session lock's try and release of a probe key
    /// (`Arg::Key`), with which the check tells that each connection is a server session of
    /// its own, as the counts' marks need.
    pub session_probe: Option<(Statement, Statement)>,
}

/// How a row lock claim takes its row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowLockClaim {
    /// A table without an attempt column: `BEGIN`, then lock and read the first claimable row.
    Lock {
        /// Locks and reads the first claimable row, `FOR UPDATE SKIP LOCKED`.
        lock_row: Statement,
    },
    /// PostgreSQL with an attempt column: count the first claimable rows' attempts in one
    /// statement that commits on its own, then `BEGIN` and lock each counted row on a
    /// connection of its own.
    // Between the count's commit and the lock no transaction holds the row, so the count
    // marks each row it counts with a session advisory lock of the count's session, and
    // passes over a row another session marked: a count of another process in that window
    // counts the row no second time. The count's session releases its marks once every
    // counted row's lock has answered; a session that ends releases them with it.
    Count {
        /// Looks at the first `Arg::Limit` claimable rows and counts the attempts of the first
        /// `Arg::Take` of them whose marks it takes: a row of each row it looked at, with its
        /// id, its count (`NULL` where it did not count it) and its mark.
        count_row: Statement,
        /// Locks the counted row while its attempt is still the one counted, and reads it.
        lock_row_by_id: Statement,
        /// The same lock, which also releases the count's one mark: a count of one row.
        lock_row_by_id_unmarking: Statement,
        /// Releases `n` marks (`Arg::MarkAt(0..n)`), at index `n - 1`, for `n` up to the
        /// claim's batch.
        unmark_rows: Vec<Statement>,
    },
    /// MySQL and MariaDB with an attempt column: `BEGIN`, lock the first claimable rows' ids,
    /// mark them, count their attempts, `COMMIT`; then lock each counted row on a connection
    /// of its own. The marks (`GET_LOCK`) keep other processes' counts off, as in [`RowLockClaim::Count`].
    SelectCount {
        /// `SET TRANSACTION ISOLATION LEVEL READ COMMITTED`, before the count's transaction:
        /// a row its select leaves out (marked by another count) is let go at once.
        read_committed: Statement,
        /// Locks the first `Arg::Limit` claimable rows no other count has marked, `FOR UPDATE
        /// SKIP LOCKED`: a row of each one's id, its attempt before the count, and its mark's
        /// name.
        select_row_id: Statement,
        /// Takes `n` marks (`Arg::MarkAt(0..n)`), at index `n - 1`, for `n` up to twice the
        /// claim's batch (a count looks past rows marked elsewhere).
        mark_rows: Vec<Statement>,
        /// Adds one to the attempts of `n` rows (`Arg::IdAt(0..n)`), at index `n - 1`, for
        /// `n` up to the claim's batch.
        count_attempts: Vec<Statement>,
        /// Locks the counted row while its attempt is still the one counted, and reads it.
        lock_row_by_id: Statement,
        /// The same lock, which also releases the count's one mark: a count of one row.
        lock_row_by_id_unmarking: Statement,
        /// Releases `n` marks (`Arg::MarkAt(0..n)`), at index `n - 1`, for `n` up to twice
        /// the claim's batch.
        unmark_rows: Vec<Statement>,
    },
}

/// The lease form's statements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseStatements {
    /// How a claim writes its leases.
    pub claim: LeaseClaim,
    /// Moves a held lease's expiry.
    pub extend: Statement,
    /// Gives a held row back to the queue at once.
    pub release: Statement,
    /// Settles a row as done while this process's lease holds it: deletes it, or marks it.
    pub settle: Statement,
    /// Marks a row failed while this process's lease holds it, where the table keeps failed
    /// rows.
    pub fail: Option<Statement>,
    /// Returns a row to the queue [`Arg::RetryIn`] from now while this process's lease holds it:
    /// writes the due column and clears the lease, or without a due column writes the lease's
    /// expiry; and the error, where the table has the column.
    pub retry: Statement,
    /// Whether several settlements run as one statement ([`Statements::settle_leases`]): the
    /// database returns the rows such a statement settled.
    pub settles_together: bool,
    /// The claim of `UPDATE .. RETURNING` from [`Arg::Floor`] on, where the claim order is the
    /// id alone: it starts past the rows earlier claims took, instead of walking the index
    /// entries of settled rows that vacuum has not yet removed.
    pub claim_from: Option<Statement>,
}

/// How a lease claim writes its leases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseClaim {
    /// PostgreSQL and SQLite: one `UPDATE .. RETURNING` writes the leases, counts the
    /// attempts and reads the rows.
    Returning {
        /// The claim.
        claim: Statement,
    },
    /// MySQL and MariaDB: `BEGIN`, lock and read the first claimable rows, write their
    /// leases, `COMMIT`.
    Locking {
        /// Locks and reads the first claimable rows, `FOR UPDATE SKIP LOCKED`.
        select: Statement,
        /// Writes the lease into `n` locked rows and counts their attempts, at index `n - 1`,
        /// for every `n` up to the most rows one claim takes.
        mark: Vec<Statement>,
    },
}

impl LeaseClaim {
    /// The statement that writes the leases of `n` locked rows (MySQL and MariaDB).
    pub fn mark(&self, n: usize) -> Option<&Statement> {
        match self {
            LeaseClaim::Locking { mark, .. } => n.checked_sub(1).and_then(|i| mark.get(i)),
            LeaseClaim::Returning { .. } => None,
        }
    }
}

/// The advisory lock form's statements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdvisoryStatements {
    /// The first claimable rows' ids and keys.
    pub candidates: Statement,
    /// The candidates from [`Arg::Floor`] on, where claims may start past the rows taken
    /// before them ([`Statements::candidates_from`]).
    pub candidates_from: Option<Statement>,
    /// Who holds the keys.
    pub keys: KeyLocks,
    /// How a locked candidate's row is taken.
    pub take: AdvisoryTake,
    /// Settles a row as done: deletes it, or marks it.
    pub settle: Statement,
    /// Marks a row failed, where the table keeps failed rows.
    pub fail: Option<Statement>,
    /// Writes a retried row's due time and error, where the table has either column.
    pub retry: Option<Statement>,
    /// On a server: `SELECT 1` on the session of a row claimed ahead that waited, before it
    /// is handed.
    pub ping: Option<Statement>,
}

/// Who holds the keys of the advisory lock form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyLocks {
    /// PostgreSQL, MySQL and MariaDB: the database's locks, held by the session that took
    /// them.
    Database {
        /// Takes a key's lock without waiting: a row of `locked`.
        try_lock: Statement,
        /// Releases a key's lock: a row of `unlocked`.
        unlock: Statement,
    },
    /// SQLite: the process keeps the keys in work.
    Registry,
    /// The service's own `Lock` and `Unlock` ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)).
    Custom,
}

/// How the advisory lock form takes a locked candidate's row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdvisoryTake {
    /// One statement takes the row while it is claimable, counting its attempt where the
    /// table has the column, and reads it.
    Returning {
        /// The take.
        take: Statement,
    },
    /// MySQL and MariaDB with an attempt column: count the attempt while the row is
    /// claimable, then read the row.
    CountThenRead {
        /// Counts the attempt while the row is claimable: rows affected.
        take_count: Statement,
        /// Reads the row by id.
        read_row: Statement,
    },
}

impl Statements {
    /// Renders every statement `desc` needs in `dialect`; `batch` is the most rows one claim
    /// takes (the subscription's workers and rows claimed ahead).
    // A row lock table in SQLite, which has no row locks, renders the form's statements all
    // the same; a subscription to it is refused before it renders anything.
    pub fn render(dialect: Dialect, desc: &TableDesc, batch: usize) -> Statements {
        let r = Renderer::new(dialect, desc);
        let rows = Output::Rows {
            columns: r.row_columns(),
            raw: true,
        };
        let mysql_like = dialect.mysql_like();
        let read_row = r.read_row(rows.clone());
        let form = match desc.hold {
            Hold::Advisory { .. } => {
                FormStatements::Advisory(Arc::new(r.advisory_statements(rows)))
            }
            Hold::Lease { locked_until } => {
                FormStatements::Lease(Arc::new(r.lease_statements(rows, batch, locked_until.name)))
            }
            Hold::RowLock => FormStatements::RowLock(Arc::new(r.row_lock_statements(rows, batch))),
        };
        Statements {
            dialect,
            begin: r.fixed(
                StatementKind::Begin,
                match dialect {
                    Dialect::Postgres => "BEGIN",
                    Dialect::MySql | Dialect::MariaDb => "START TRANSACTION",
                    Dialect::Sqlite => "BEGIN IMMEDIATE",
                },
            ),
            commit: r.fixed(StatementKind::Commit, "COMMIT"),
            rollback: rollback(dialect),
            list_columns: r.list_columns(),
            list_indexes: r.list_indexes(),
            current_database: mysql_like.then(|| {
                let mut s = Sql::new(dialect);
                s.push("SELECT DATABASE() AS db");
                s.finish(
                    StatementKind::CurrentDatabase,
                    named(&[("db", ColumnType::Text)]),
                )
            }),
            publish: r.publish(),
            read_row,
            form,
        }
    }

    /// The form these statements are of.
    pub fn form(&self) -> Form {
        match self.form {
            FormStatements::RowLock(_) => Form::RowLock,
            FormStatements::Lease(_) => Form::Lease,
            FormStatements::Advisory(_) => Form::Advisory,
        }
    }

    /// The insert of `rows` rows of `desc` in one statement (a batch publish); on PostgreSQL
    /// it notifies like [`Statements::publish`]. `None` where every column is filled by the
    /// database: `DEFAULT VALUES` writes one row per statement.
    pub fn publish_rows(dialect: Dialect, desc: &TableDesc, rows: usize) -> Option<Statement> {
        let r = Renderer::new(dialect, desc);
        let notifies = match dialect {
            Dialect::Postgres => Notifies::Notify,
            Dialect::MySql | Dialect::MariaDb | Dialect::Sqlite => Notifies::Quiet,
        };
        (rows > 0 && !r.publish_columns().is_empty()).then(|| r.publish_n(rows, notifies))
    }

    /// The insert of `rows` rows of `desc` without the notification (on PostgreSQL a
    /// publisher that notified a moment ago leaves the next to a [`Statements::notify`]).
    /// `None` as for [`Statements::publish_rows`].
    pub fn publish_quiet(dialect: Dialect, desc: &TableDesc, rows: usize) -> Option<Statement> {
        let r = Renderer::new(dialect, desc);
        (rows == 1 || (rows > 1 && !r.publish_columns().is_empty()))
            .then(|| r.publish_n(rows, Notifies::Quiet))
    }

    /// PostgreSQL: tells the subscriptions listening in other processes that `desc`'s table
    /// has new rows ([`Dialect::notify_statement`]); `None` elsewhere.
    pub fn notify(dialect: Dialect, desc: &TableDesc) -> Option<Statement> {
        dialect.notify_statement(desc.table).map(|sql| Statement {
            kind: StatementKind::Notify,
            sql: sql.into(),
            args: Arc::from([]),
            output: Output::Nothing,
        })
    }

    /// The lease form: the settlement of `rows` rows as done in one statement, each fenced by
    /// its lease, returning the ids it settled ([`Arg::IdAt`], [`Arg::FenceAt`] per row).
    /// `None` where the database cannot return them (MySQL; MariaDB's `processed_at` mark).
    pub fn settle_leases(dialect: Dialect, desc: &TableDesc, rows: usize) -> Option<Statement> {
        let lease = desc
            .locked_until()
            .filter(|_| rows > 0 && Self::settles_leases_together(dialect, desc))?;
        Some(Renderer::new(dialect, desc).settle_leases(rows, lease.name))
    }

    /// The advisory lock form: the candidates of a claim that passes over the rows of
    /// `excluded` keys (binds [`Arg::ExcludedKey`] `0..excluded`, each a key's text): keys in
    /// work in this process, or found held elsewhere. `None` for another form.
    pub fn candidates_excluding(
        dialect: Dialect,
        desc: &TableDesc,
        excluded: usize,
    ) -> Option<Statement> {
        desc.advisory()
            .is_some()
            .then(|| Renderer::new(dialect, desc).candidates(excluded, Start::Beginning))
    }

    /// The candidates that pass over `keys` keys and `ids` rows ([`Arg::ExcludedId`] `0..ids`:
    /// rows that failed in this process and wait their delay), from [`Arg::Floor`] on where
    /// `from` is set and the table allows it. `None` for another form.
    pub fn candidates_passing(
        dialect: Dialect,
        desc: &TableDesc,
        keys: usize,
        ids: usize,
        from: bool,
    ) -> Option<Statement> {
        let mut r = Renderer::new(dialect, desc);
        r.exclude_ids = ids;
        let applies = desc.advisory().is_some() && (!from || r.advisory_floor());
        applies.then(|| r.candidates(keys, Start::floor_if(from)))
    }

    /// The row lock form: the claim's first statement (the lock, or the count with an attempt
    /// column, from [`Arg::Floor`] where `floor` is set) passing over `ids` rows
    /// ([`Arg::ExcludedId`]) that wait out a retry in this process. `None` for another form.
    pub fn row_lock_claim_passing(
        dialect: Dialect,
        desc: &TableDesc,
        ids: usize,
        floor: bool,
    ) -> Option<Statement> {
        if desc.advisory().is_some() || desc.locked_until().is_some() {
            return None;
        }
        let mut r = Renderer::new(dialect, desc);
        r.exclude_ids = ids;
        Some(match (desc.attempt, dialect) {
            (None, _) => r.lock_row(Output::Rows {
                columns: r.row_columns(),
                raw: true,
            }),
            (Some(attempt), Dialect::Postgres | Dialect::Sqlite) => {
                r.count_row(attempt.name, Start::floor_if(floor))
            }
            (Some(attempt), Dialect::MySql | Dialect::MariaDb) => r.select_row_id(attempt.name),
        })
    }

    /// The candidates that pass over `excluded` keys and start at [`Arg::Floor`], where the
    /// advisory lock form's claims may start past the rows taken before them: a table on
    /// PostgreSQL claimed in id order, without a due column, on the database's locks.
    pub fn candidates_from(
        dialect: Dialect,
        desc: &TableDesc,
        excluded: usize,
    ) -> Option<Statement> {
        let r = Renderer::new(dialect, desc);
        r.advisory_floor()
            .then(|| r.candidates(excluded, Start::Floor))
    }

    /// Returns the failed rows `which` selects to the queue: clears `failed_at` and the error,
    /// counts attempts from zero, makes them due now and clears a lease. `None` for a table
    /// that keeps no failed rows. Arguments: [`Arg::IdAt`] or [`Arg::ErrorLike`].
    pub fn redrive(dialect: Dialect, desc: &TableDesc, which: FailedRows) -> Option<Statement> {
        desc.failed_at
            .map(|failed| Renderer::new(dialect, desc).redrive(failed.name, which))
    }

    /// Deletes the failed rows `which` selects. `None` for a table that keeps no failed
    /// rows. Arguments: [`Arg::IdAt`] or [`Arg::ErrorLike`] as `which` says.
    pub fn delete_failed(
        dialect: Dialect,
        desc: &TableDesc,
        which: FailedRows,
    ) -> Option<Statement> {
        desc.failed_at
            .map(|failed| Renderer::new(dialect, desc).delete_failed(failed.name, which))
    }

    /// Retention of `desc`'s rows marked processed or failed: its lock (on the servers) and
    /// its deletes of up to `batch` rows each.
    pub fn retention(dialect: Dialect, desc: &TableDesc, batch: usize) -> RetentionStatements {
        maintenance::retention(dialect, desc, batch)
    }

    /// The statements of periodic jobs in `dialect`.
    pub fn periodic(dialect: Dialect) -> PeriodicStatements {
        maintenance::periodic(dialect)
    }

    /// Whether [`Statements::settle_leases`] renders for `desc` in `dialect`: a lease table on
    /// a database that returns the rows its settlement statement wrote.
    pub fn settles_leases_together(dialect: Dialect, desc: &TableDesc) -> bool {
        let returns = match dialect {
            Dialect::Postgres | Dialect::Sqlite => true,
            Dialect::MariaDb => desc.processed_at.is_none(),
            Dialect::MySql => false,
        };
        returns && desc.locked_until().is_some()
    }

    /// The rendered statement of `kind`, where the form runs one: for tools and tests that
    /// look a statement up by what it does.
    pub fn of_kind(&self, kind: StatementKind) -> Option<&Statement> {
        self.all().into_iter().find(|s| s.kind == kind)
    }

    /// The form's settlement of a row as done: a delete or the `processed_at` mark, fenced by
    /// the lease in the lease form.
    pub fn settle(&self) -> &Statement {
        match &self.form {
            FormStatements::RowLock(f) => &f.settle,
            FormStatements::Lease(f) => &f.settle,
            FormStatements::Advisory(f) => &f.settle,
        }
    }

    /// Every statement rendered, for listing and tests.
    pub fn all(&self) -> Vec<&Statement> {
        let mut out = vec![
            &self.begin,
            &self.commit,
            &self.rollback,
            &self.list_columns,
            &self.list_indexes,
        ];
        out.extend(&self.current_database);
        out.extend(match &self.form {
            FormStatements::RowLock(f) => f.all(),
            FormStatements::Lease(f) => f.all(),
            FormStatements::Advisory(f) => f.all(),
        });
        out.push(&self.publish);
        out
    }
}

impl RowLockStatements {
    /// The form's statements, for [`Statements::all`].
    fn all(&self) -> Vec<&Statement> {
        let mut out: Vec<&Statement> = self.isolation.iter().collect();
        match &self.claim {
            RowLockClaim::Lock { lock_row } => out.push(lock_row),
            RowLockClaim::Count {
                count_row,
                lock_row_by_id,
                lock_row_by_id_unmarking,
                unmark_rows,
            } => {
                out.extend([count_row, lock_row_by_id, lock_row_by_id_unmarking]);
                out.extend(unmark_rows);
            }
            RowLockClaim::SelectCount {
                read_committed,
                select_row_id,
                mark_rows,
                count_attempts,
                lock_row_by_id,
                lock_row_by_id_unmarking,
                unmark_rows,
            } => {
                out.extend([read_committed, select_row_id]);
                out.extend(mark_rows);
                out.extend(count_attempts);
                out.extend([lock_row_by_id, lock_row_by_id_unmarking]);
                out.extend(unmark_rows);
            }
        }
        out.push(&self.settle);
        out.extend(self.fail.iter().chain(&self.retry));
        out.push(&self.ping);
        out.extend(&self.count_row_from);
        out.extend([&self.savepoint, &self.rollback_to_savepoint]);
        if let Some((lock, unlock)) = &self.session_probe {
            out.extend([lock, unlock]);
        }
        out
    }
}

impl LeaseStatements {
    /// The form's statements, for [`Statements::all`].
    fn all(&self) -> Vec<&Statement> {
        let mut out = Vec::new();
        match &self.claim {
            LeaseClaim::Returning { claim } => out.push(claim),
            LeaseClaim::Locking { select, mark } => {
                out.push(select);
                out.extend(mark);
            }
        }
        out.extend(&self.claim_from);
        out.extend([&self.extend, &self.release, &self.settle]);
        out.extend(&self.fail);
        out.push(&self.retry);
        out
    }
}

impl AdvisoryStatements {
    /// The form's statements, for [`Statements::all`].
    fn all(&self) -> Vec<&Statement> {
        let mut out = vec![&self.candidates];
        out.extend(&self.candidates_from);
        if let KeyLocks::Database { try_lock, unlock } = &self.keys {
            out.extend([try_lock, unlock]);
        }
        match &self.take {
            AdvisoryTake::Returning { take } => out.push(take),
            AdvisoryTake::CountThenRead {
                take_count,
                read_row,
            } => out.extend([take_count, read_row]),
        }
        out.push(&self.settle);
        out.extend(self.fail.iter().chain(&self.retry));
        out.extend(&self.ping);
        out
    }
}

/// `ROLLBACK` in `dialect`: what the broker runs on a connection it gives back to the pool
/// while a transaction may be open on it.
pub fn rollback(dialect: Dialect) -> Statement {
    let mut s = Sql::new(dialect);
    s.push("ROLLBACK");
    s.finish(StatementKind::Rollback, Output::Nothing)
}

fn named(columns: &[(&'static str, ColumnType)]) -> Output {
    Output::Rows {
        columns: columns
            .iter()
            .map(|&(name, ty)| OutColumn::new(name, ty))
            .collect(),
        raw: false,
    }
}

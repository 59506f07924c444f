//! Every SQL text of the queue, per dialect, rendered once per subscription.
//!
//! [`Statements::render`] turns a [`TableDesc`] into the statements its form needs. Each
//! [`Statement`] carries its text, its [`StatementKind`] (what it does, for tests and models),
//! the logical arguments of its placeholders in order ([`Arg`]), and what its reply holds
//! ([`Output`]). An adapter binds `statement.args` as the core fills them and reads the reply as
//! `statement.output` says; it writes no SQL of its own.
//!
//! Times enter statements as bind parameters, microseconds since the Unix epoch, converted per
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

use crate::spec::{Form, KeyPart, OrderBy, TableDesc};

mod claims;
mod failed;
mod literal;
mod maintenance;
mod schema;
mod stats;

pub use failed::{FailedRows, error_like};
pub use maintenance::{
    MaintenanceKind, PERIODIC_TABLE, PeriodicStatements, RetentionStatements, periodic_table_ddl,
};
pub(crate) use schema::claim_order;
pub use schema::{Ddl, serves_claims};

/// The PostgreSQL channel every publish notifies, with the table's name (as its description
/// names it) as the payload; listening sessions run [`Dialect::listen_statement`].
///
/// A row another program inserts wakes no subscription unless that program notifies too:
/// `NOTIFY ruststream, 'jobs'`, or [`Dialect::notify_statement`].
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

/// A logical argument of a statement; [`Statement::args`] lists one per placeholder, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arg {
    /// The row's id.
    Id,
    /// The attempt count this claim wrote into the row.
    Attempt,
    /// The `n`th id of a batch.
    IdAt(usize),
    /// The current time.
    Now,
    /// A new lease expiry.
    Until,
    /// The lease expiry this process wrote, which proves it still holds the row.
    Fence,
    /// The `n`th fence of a batch: the lease expiry of the `n`th id.
    FenceAt(usize),
    /// How many rows to select.
    Limit,
    /// How many of the rows selected a statement takes: a row lock count looks at
    /// [`Arg::Limit`] rows to count this many that no other count has marked.
    Take,
    /// An advisory lock's key: its PostgreSQL hash or its MySQL name.
    Key,
    /// The table's name, unquoted and without schema.
    TableName,
    /// The table's schema, where the name has one.
    Schema,
    /// The encoded payload.
    Payload,
    /// When a published row becomes due.
    Due,
    /// The value of a column that publishing writes.
    Column(&'static str),
    /// The `n`th key an advisory claim passes over: in work in this process, or found held
    /// elsewhere.
    ExcludedKey(usize),
    /// When a retried row is due again (a time).
    RetryAt,
    /// The text of the error a settlement records, or `NULL` to keep the one the row has.
    Error,
    /// A `LIKE` pattern the error text of the failed rows must match, escaped with `!`
    /// ([`error_like`]).
    ErrorLike,
    /// The lowest id a claim past the rows already settled looks at (`id >= floor`).
    Floor,
    /// The `n`th mark of a row lock count: the key or name its count read for a row.
    MarkAt(usize),
    /// Retention: the time before which a row's mark makes it old enough to delete.
    Cutoff,
    /// Periodic jobs: a tick of a schedule (a time).
    Tick,
    /// Periodic jobs: a schedule's name.
    Schedule,
}

/// What a statement does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatementKind {
    /// Opens a transaction.
    Begin,
    /// Commits the transaction.
    Commit,
    /// Rolls the transaction back.
    Rollback,
    /// Marks a savepoint in the transaction: the row lock form, before its transaction is lent
    /// to the handler.
    Savepoint,
    /// Rolls the transaction back to its savepoint, undoing the handler's writes.
    RollbackToSavepoint,
    /// Lists the table's columns: rows of `column_name` and `data_type` (the type as the
    /// database names it: PostgreSQL's `information_schema` `data_type`, MySQL's
    /// `column_type` with its precision, SQLite's declared type).
    ListColumns,
    /// MySQL and MariaDB: the current database's name: a row of `db`.
    CurrentDatabase,
    /// PostgreSQL: the session's isolation level: a row of `isolation`.
    Isolation,
    /// Row lock form: locks the first claimable row, `FOR UPDATE SKIP LOCKED`, and reads it.
    LockRow,
    /// Adds one to the attempt column of a row: rows affected.
    CountAttempt,
    /// Row lock form with an attempt column, PostgreSQL: counts the attempt of the first
    /// claimable row no transaction holds, and commits: a row of its id.
    CountRow,
    /// Row lock form with an attempt column, MySQL and MariaDB: locks the first claimable row,
    /// `FOR UPDATE SKIP LOCKED`, to count its attempt: a row of its id.
    SelectRowId,
    /// Row lock form with an attempt column: locks this row while it is still claimable and
    /// its attempt is still the one this claim counted, `FOR UPDATE SKIP LOCKED`, and reads
    /// it. The count's mark keeps other counts from counting the row; one that holds it while
    /// it looks at it makes the lock pass it over, and the claim tries again shortly.
    LockRowById,
    /// Row lock form with an attempt column: [`StatementKind::LockRowById`] that also releases
    /// the count's one mark where it took the row.
    LockRowByIdUnmarking,
    /// Row lock form with an attempt column, MySQL and MariaDB: the next transaction, the
    /// count's, runs at read committed.
    ReadCommitted,
    /// Row lock form with an attempt column, MySQL and MariaDB: takes the marks of this many
    /// rows the count locked, without waiting: rows of `rs_at` and `rs_marked`.
    MarkRows(usize),
    /// Row lock form with an attempt column: releases the marks of this many counted rows.
    UnmarkRows(usize),
    /// Lease form, in one statement: writes a lease into the first claimable rows and counts
    /// their attempts, and reads them.
    ClaimLease,
    /// Lease form, MySQL and MariaDB: locks the first claimable rows, `FOR UPDATE SKIP
    /// LOCKED`, and reads them.
    SelectLease,
    /// Lease form, MySQL and MariaDB: writes the lease into this many locked rows and counts
    /// their attempts.
    MarkLease(usize),
    /// Lease form: moves a held lease's expiry: rows affected.
    ExtendLease,
    /// Lease form: gives a held row back to the queue at once: rows affected.
    ReleaseLease,
    /// Advisory lock form: the first claimable rows' ids and keys: rows of `rs_id`, `rs_key`.
    Candidates,
    /// Advisory lock form: takes a key's lock without waiting: a row of `locked`.
    TryLock,
    /// Advisory lock form: releases a key's lock: a row of `unlocked`.
    Unlock,
    /// Advisory lock form: takes the row while it is still claimable (counting the attempt
    /// where the table has the column) and reads it.
    Take,
    /// Advisory lock form, MySQL and MariaDB: counts the attempt while the row is still
    /// claimable: rows affected.
    TakeCount,
    /// Reads the row by id.
    ReadRow,
    /// Settles a row by deleting it; `fenced` in the lease form.
    Delete {
        /// Only while this process's lease holds the row.
        fenced: bool,
    },
    /// Settles a row by marking its `processed_at`; `fenced` in the lease form.
    MarkProcessed {
        /// Only while this process's lease holds the row.
        fenced: bool,
    },
    /// Marks a row failed (its `failed_at`, its error), so that no claim takes it again;
    /// `fenced` in the lease form: rows affected.
    Fail {
        /// Only while this process's lease holds the row.
        fenced: bool,
    },
    /// Returns a row to the queue for a later attempt: writes when it is due again (the due
    /// column, or in the lease form without one the lease's expiry) and its error; `fenced`
    /// in the lease form: rows affected.
    RetryLater {
        /// Only while this process's lease holds the row.
        fenced: bool,
    },
    /// Returns failed rows to the queue, due now, their attempts counted from zero: rows
    /// affected.
    Redrive(FailedRows),
    /// Deletes failed rows: rows affected.
    DeleteFailed(FailedRows),
    /// Lease form: settles this many rows as done in one statement (deletes them, or marks
    /// their `processed_at`), each only while this process's lease holds it: rows of the ids
    /// settled.
    SettleLeases(usize),
    /// PostgreSQL: notifies [`NOTIFY_CHANNEL`] with the table's name, after inserts that did
    /// not notify.
    Notify,
    /// Inserts a row; on PostgreSQL, in the same statement, notifies [`NOTIFY_CHANNEL`] with
    /// the table's name. Its reply counts the rows written.
    Publish,
    /// The maintenance a broker runs by itself: retention and periodic jobs.
    Maintenance(MaintenanceKind),
    /// The row lock and advisory lock forms on a server: tells whether the session of a row
    /// claimed ahead still answers (and so still holds the row's transaction or key) before
    /// the row is handed.
    Ping,
    /// Reads a table's counts ([`Statements::stats`]).
    Stats,
    /// Reads failed rows ([`Statements::list_failed`]).
    ListFailed,
    /// Lists a table's indexes and their columns.
    ListIndexes,
    /// Creates what a table's schema lacks ([`Ddl`]).
    CreateSchema,
}

impl StatementKind {
    /// Whether the session has a transaction open after a statement of this kind ran:
    /// `Some(true)` after a `BEGIN` that succeeded, `Some(false)` after a `COMMIT` that
    /// succeeded or any `ROLLBACK`, `None` where the statement leaves it as it was or in doubt
    /// (a `COMMIT` that failed may leave it open on MySQL). An adapter keeps this to roll back
    /// a connection it gives back with a transaction open.
    pub fn transaction_after(self, succeeded: bool) -> Option<bool> {
        match self {
            StatementKind::Begin if succeeded => Some(true),
            StatementKind::Commit if succeeded => Some(false),
            StatementKind::Rollback => Some(false),
            _ => None,
        }
    }
}

/// What the reply to a statement holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Nothing.
    Nothing,
    /// The number of rows affected.
    Affected,
    /// Rows: for each, the values of these columns by name, each read as its declared
    /// [`ColumnType`], and the driver's row itself when `raw` is set (the runtime decodes the
    /// message from it).
    Rows {
        /// The columns the core reads, in the order of [`crate::Row::values`].
        columns: Arc<[OutColumn]>,
        /// Whether the adapter keeps the driver's row.
        raw: bool,
    },
}

/// A column of a statement's rows that the core reads: its name and the type it reads it as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OutColumn {
    /// The column's name (or alias) in the statement's rows; an adapter finds it exactly, or
    /// else ignoring ASCII case.
    pub name: &'static str,
    /// What the core reads it as.
    pub ty: ColumnType,
}

impl OutColumn {
    /// A column of this name and type.
    pub const fn new(name: &'static str, ty: ColumnType) -> Self {
        Self { name, ty }
    }
}

/// The type the core reads a column of a statement's rows as. An adapter reads the driver's
/// cell into the [`Value`](crate::Value) its own type gives (an integer for an integer column,
/// text for text, bytes for binary) and passes it through [`ColumnType::read`]; a driver that
/// reports no types (PostgreSQL's simple protocol, whose cells are all text) passes the text
/// through [`ColumnType::read_text`]. No adapter decides a type from a statement's kind or a
/// column's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ColumnType {
    /// A boolean: a lock's answer. Reads `true` and `false`, the integers `1` and `0` (MySQL's
    /// `GET_LOCK`), and the text `t`, `f`, `true`, `false`, `1`, `0`.
    Bool,
    /// An integer: an attempt count. Reads integers, booleans as `0` and `1`, and text that is
    /// an integer.
    Int,
    /// Text: a column's name, an advisory lock's key, a setting. Reads text, bytes as UTF-8
    /// (bytes that are not are read lossily: MySQL 8 sends some text as binary strings), and
    /// integers and booleans as their decimal or `true`/`false` text.
    Text,
    /// The table's id, of whatever type the table declares it: read as the column's own type
    /// gives it, and bound back unchanged. Without types (text cells), an integer written
    /// plainly (`42`, not `042`) reads as an integer, anything else as text.
    Id,
    /// Bytes: a payload. Reads bytes, and text as its UTF-8 bytes (PostgreSQL's text form of
    /// `bytea`, `\\x` and hex digits, as the bytes it encodes).
    Bytes,
}

impl ColumnType {
    /// The type's name in messages.
    pub const fn name(self) -> &'static str {
        match self {
            ColumnType::Bool => "a boolean",
            ColumnType::Int => "an integer",
            ColumnType::Text => "text",
            ColumnType::Id => "an id",
            ColumnType::Bytes => "bytes",
        }
    }

    /// `value`, read from a cell of a driver that knows the column's type, as this type; a
    /// `NULL` stays `NULL`.
    pub fn read(self, value: crate::Value) -> Result<crate::Value, String> {
        use crate::Value;
        match (self, value) {
            (_, Value::Null) => Ok(Value::Null),
            (ColumnType::Id, value) => Ok(value),
            (ColumnType::Bool, Value::Bool(b)) => Ok(Value::Bool(b)),
            (ColumnType::Bool, Value::Int(i @ (0 | 1))) => Ok(Value::Bool(i == 1)),
            (ColumnType::Bool, Value::Text(t)) => self.read_text(&t),
            (ColumnType::Int, Value::Int(i)) => Ok(Value::Int(i)),
            (ColumnType::Int, Value::Bool(b)) => Ok(Value::Int(i64::from(b))),
            (ColumnType::Int, Value::Text(t)) => self.read_text(&t),
            (ColumnType::Text, Value::Text(t)) => Ok(Value::Text(t)),
            (ColumnType::Text, Value::Bytes(b)) => Ok(Value::Text(match String::from_utf8(b) {
                Ok(text) => text,
                Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
            })),
            (ColumnType::Text, Value::Int(i)) => Ok(Value::Text(i.to_string())),
            (ColumnType::Text, Value::Bool(b)) => Ok(Value::Text(b.to_string())),
            (ColumnType::Bytes, Value::Bytes(b)) => Ok(Value::Bytes(b)),
            (ColumnType::Bytes, Value::Text(t)) => Ok(Value::Bytes(t.into_bytes())),
            (ty, value) => Err(format!("{value} does not read as {}", ty.name())),
        }
    }

    /// The text of a cell whose type the driver does not report, read as this type.
    pub fn read_text(self, text: &str) -> Result<crate::Value, String> {
        use crate::Value;
        match self {
            ColumnType::Bool => match text {
                "t" | "true" | "1" => Ok(Value::Bool(true)),
                "f" | "false" | "0" => Ok(Value::Bool(false)),
                other => Err(format!("`{other}` does not read as a boolean")),
            },
            ColumnType::Int => text
                .trim()
                .parse::<i64>()
                .map(Value::Int)
                .map_err(|_| format!("`{text}` does not read as an integer")),
            ColumnType::Text => Ok(Value::Text(text.to_owned())),
            ColumnType::Bytes => Ok(Value::Bytes(
                hex_bytea(text).unwrap_or_else(|| text.as_bytes().to_vec()),
            )),
            ColumnType::Id => Ok(match text.parse::<i64>() {
                Ok(i) if i.to_string() == text => Value::Int(i),
                _ => Value::Text(text.to_owned()),
            }),
        }
    }
}

/// PostgreSQL's hex text form of `bytea` (`\x` and two hex digits a byte) as its bytes.
fn hex_bytea(text: &str) -> Option<Vec<u8>> {
    let hex = text.strip_prefix("\\x")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// One statement of a subscription, rendered once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    /// What it does.
    pub kind: StatementKind,
    /// Its text.
    pub sql: Arc<str>,
    /// The logical argument of each placeholder, in order.
    pub args: Arc<[Arg]>,
    /// What its reply holds.
    pub output: Output,
}

impl Statement {
    /// The binds of this statement: `value(arg)` for each of its placeholders, in order.
    pub fn binds(&self, mut value: impl FnMut(Arg) -> crate::Value) -> Vec<crate::Value> {
        self.args.iter().map(|&arg| value(arg)).collect()
    }

    /// A PostgreSQL statement's text with its binds written in as SQL literals, for the simple
    /// query protocol (a proxy that takes no prepared statements): each `$n` outside string
    /// literals, quoted identifiers, dollar quotes and comments becomes the literal of
    /// `binds[n - 1]`, safe under either setting of `standard_conforming_strings`.
    ///
    /// Fails, naming the statement, where a placeholder has no bind, and where a text holds a
    /// NUL character, which PostgreSQL's text cannot store.
    pub fn inline_binds(&self, binds: &[crate::Value]) -> Result<String, crate::DbError> {
        literal::render(&self.sql, binds)
    }
}

struct Sql {
    dialect: Dialect,
    text: String,
    args: Vec<Arg>,
}

impl Sql {
    fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            text: String::new(),
            args: Vec::new(),
        }
    }

    fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    fn arg(&mut self, arg: Arg) -> &mut Self {
        self.placeholder(arg, false)
    }

    /// A placeholder of its own for `arg`, even where `arg` has one already: the rows of a
    /// batch insert each bind their own values.
    fn fresh_arg(&mut self, arg: Arg) -> &mut Self {
        self.placeholder(arg, true)
    }

    fn placeholder(&mut self, arg: Arg, fresh: bool) -> &mut Self {
        match self.dialect {
            Dialect::MySql | Dialect::MariaDb => {
                self.args.push(arg);
                self.text.push('?');
            }
            Dialect::Postgres | Dialect::Sqlite => {
                let n = match self.args.iter().position(|a| *a == arg).filter(|_| !fresh) {
                    Some(i) => i + 1,
                    None => {
                        self.args.push(arg);
                        self.args.len()
                    }
                };
                let mark = if self.dialect == Dialect::Postgres {
                    '$'
                } else {
                    '?'
                };
                self.text.push(mark);
                self.text.push_str(&n.to_string());
            }
        }
        self
    }

    /// A time argument converted to the dialect's column type.
    fn time(&mut self, arg: Arg) -> &mut Self {
        self.time_placeholder(arg, false)
    }

    fn time_placeholder(&mut self, arg: Arg, fresh: bool) -> &mut Self {
        match self.dialect {
            Dialect::Postgres => self
                .push("(TIMESTAMPTZ 'epoch' + CAST(")
                .placeholder(arg, fresh)
                .push(" AS BIGINT) * INTERVAL '1 microsecond')"),
            Dialect::MySql | Dialect::MariaDb => self
                .push("TIMESTAMPADD(MICROSECOND, ")
                .placeholder(arg, fresh)
                .push(", TIMESTAMP'1970-01-01 00:00:00')"),
            Dialect::Sqlite => self.placeholder(arg, fresh),
        }
    }

    fn finish(self, kind: StatementKind, output: Output) -> Statement {
        Statement {
            kind,
            sql: self.text.into(),
            args: self.args.into(),
            output,
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
    ///
    /// Between the count's commit and the lock no transaction holds the row, so the count
    /// marks each row it counts with a session advisory lock of the count's session, and
    /// passes over a row another session marked: a count of another process in that window
    /// counts the row no second time. The count's session releases its marks once every
    /// counted row's lock has answered; a session that ends releases them with it.
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
    /// take their marks, count the attempts of the rows marked, `COMMIT`; then `BEGIN` and
    /// lock each counted row on a connection of its own. The marks (`GET_LOCK`) keep other
    /// processes' counts off the rows between the commit and the locks, as in
    /// [`RowLockClaim::Count`].
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
    /// Returns a row to the queue at [`Arg::RetryAt`] while this process's lease holds it:
    /// writes the due column and clears the lease, or without a due column writes the lease's
    /// expiry; and the error, where the table has the column.
    pub retry: Statement,
    /// Whether several settlements run as one statement ([`Statements::settle_leases`]): the
    /// database returns the rows such a statement settled.
    pub settles_together: bool,
    /// The claim of `UPDATE .. RETURNING`, looking only at ids from [`Arg::Floor`] on, where
    /// the claim order is the id alone: it starts past the rows the subscription's earlier
    /// claims took, instead of walking the index entries of every row settled before them
    /// (entries that stay until vacuum removes them, and while a transaction elsewhere holds
    /// vacuum back, stay for all its length).
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
    ///
    /// A row lock table in SQLite, which has no row locks, renders the form's statements all
    /// the same; a subscription to it is refused before it renders anything.
    pub fn render(dialect: Dialect, desc: &TableDesc, batch: usize) -> Statements {
        let r = Renderer { dialect, desc };
        let rows = Output::Rows {
            columns: r.row_columns(),
            raw: true,
        };
        let mysql_like = dialect.mysql_like();
        let read_row = r.read_row(rows.clone());
        // As `TableDesc::form` decides: an advisory key, else a lease column, else row locks.
        let form = match (desc.advisory, desc.locked_until) {
            (Some(_), _) => FormStatements::Advisory(Arc::new(r.advisory_statements(rows))),
            (None, Some(lease)) => {
                FormStatements::Lease(Arc::new(r.lease_statements(rows, batch, lease.name)))
            }
            (None, None) => FormStatements::RowLock(Arc::new(r.row_lock_statements(rows, batch))),
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

    /// The insert of `rows` rows of `desc` in one statement (a batch publish), with each row's
    /// arguments in turn; on PostgreSQL it notifies like [`Statements::publish`]. `None` for a
    /// table whose rows have no column to write (every column filled by the database), which
    /// takes one row per statement: `DEFAULT VALUES` writes one row.
    pub fn publish_rows(dialect: Dialect, desc: &TableDesc, rows: usize) -> Option<Statement> {
        let r = Renderer { dialect, desc };
        (rows > 0 && !r.publish_columns().is_empty())
            .then(|| r.publish_n(rows, dialect == Dialect::Postgres))
    }

    /// The insert of `rows` rows of `desc` (one row: [`Statements::publish`]) without the
    /// notification: the same as the notifying insert except on PostgreSQL, where a
    /// publisher that notified a moment ago leaves the next notification to a
    /// [`Statements::notify`] after its inserts. `None` as for [`Statements::publish_rows`].
    pub fn publish_quiet(dialect: Dialect, desc: &TableDesc, rows: usize) -> Option<Statement> {
        let r = Renderer { dialect, desc };
        (rows == 1 || (rows > 1 && !r.publish_columns().is_empty()))
            .then(|| r.publish_n(rows, false))
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

    /// The lease form: the settlement of `rows` rows as done in one statement, each fenced
    /// by its own lease, returning the ids it settled, so that a lease lost among them is
    /// told apart. Arguments: [`Arg::IdAt`] and [`Arg::FenceAt`] for each row, [`Arg::Now`].
    /// `None` where the database cannot return the rows such a statement wrote (MySQL; on
    /// MariaDB, the `processed_at` mark, an `UPDATE`) or for a form without leases.
    pub fn settle_leases(dialect: Dialect, desc: &TableDesc, rows: usize) -> Option<Statement> {
        let lease = desc
            .locked_until
            .filter(|_| rows > 0 && Self::settles_leases_together(dialect, desc))?;
        Some(Renderer { dialect, desc }.settle_leases(rows, lease.name))
    }

    /// The advisory lock form: the candidates of a claim that passes over the rows of
    /// `excluded` keys (binds [`Arg::ExcludedKey`] `0..excluded`, each a key's text): keys in
    /// work in this process, or found held elsewhere. `None` for another form.
    pub fn candidates_excluding(
        dialect: Dialect,
        desc: &TableDesc,
        excluded: usize,
    ) -> Option<Statement> {
        desc.advisory
            .is_some()
            .then(|| Renderer { dialect, desc }.candidates(excluded, false))
    }

    /// The candidates that pass over `excluded` keys and start at [`Arg::Floor`], where the
    /// advisory lock form's claims may start past the rows taken before them: a table on
    /// PostgreSQL claimed in id order, without a due column, on the database's locks.
    pub fn candidates_from(
        dialect: Dialect,
        desc: &TableDesc,
        excluded: usize,
    ) -> Option<Statement> {
        let r = Renderer { dialect, desc };
        r.advisory_floor().then(|| r.candidates(excluded, true))
    }

    /// Returns the failed rows `which` selects to the queue: clears their `failed_at` and
    /// error, counts their attempts from zero, makes them due now and clears a lease. `None`
    /// for a table that keeps no failed rows. Arguments: [`Arg::Now`], and [`Arg::IdAt`] or
    /// [`Arg::ErrorLike`] as `which` says.
    pub fn redrive(dialect: Dialect, desc: &TableDesc, which: FailedRows) -> Option<Statement> {
        desc.failed_at
            .map(|failed| Renderer { dialect, desc }.redrive(failed.name, which))
    }

    /// Deletes the failed rows `which` selects. `None` for a table that keeps no failed
    /// rows. Arguments: [`Arg::IdAt`] or [`Arg::ErrorLike`] as `which` says.
    pub fn delete_failed(
        dialect: Dialect,
        desc: &TableDesc,
        which: FailedRows,
    ) -> Option<Statement> {
        desc.failed_at
            .map(|failed| Renderer { dialect, desc }.delete_failed(failed.name, which))
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
        returns && desc.locked_until.is_some()
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
        match &self.form {
            FormStatements::RowLock(f) => {
                out.extend(&f.isolation);
                match &f.claim {
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
                out.push(&f.settle);
                out.extend(f.fail.iter().chain(&f.retry));
                out.push(&f.ping);
                out.extend(&f.count_row_from);
                out.extend([&f.savepoint, &f.rollback_to_savepoint]);
                if let Some((lock, unlock)) = &f.session_probe {
                    out.extend([lock, unlock]);
                }
            }
            FormStatements::Lease(f) => {
                match &f.claim {
                    LeaseClaim::Returning { claim } => out.push(claim),
                    LeaseClaim::Locking { select, mark } => {
                        out.push(select);
                        out.extend(mark);
                    }
                }
                out.extend(&f.claim_from);
                out.extend([&f.extend, &f.release, &f.settle]);
                out.extend(&f.fail);
                out.push(&f.retry);
            }
            FormStatements::Advisory(f) => {
                out.push(&f.candidates);
                out.extend(&f.candidates_from);
                if let KeyLocks::Database { try_lock, unlock } = &f.keys {
                    out.extend([try_lock, unlock]);
                }
                match &f.take {
                    AdvisoryTake::Returning { take } => out.push(take),
                    AdvisoryTake::CountThenRead {
                        take_count,
                        read_row,
                    } => out.extend([take_count, read_row]),
                }
                out.push(&f.settle);
                out.extend(f.fail.iter().chain(&f.retry));
                out.extend(&f.ping);
            }
        }
        out.push(&self.publish);
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

struct Renderer<'a> {
    dialect: Dialect,
    desc: &'a TableDesc,
}

impl Renderer<'_> {
    /// A column's name, quoted as one identifier.
    fn q(&self, name: &str) -> String {
        self.dialect.quote_one(name)
    }

    /// The table's name, quoted part by part.
    fn table(&self) -> String {
        self.dialect.quote(self.desc.table)
    }

    fn id(&self) -> String {
        self.q(self.desc.id.name)
    }

    fn row_lock_statements(&self, rows: Output, batch: usize) -> RowLockStatements {
        let claim = match (self.desc.attempt, self.dialect) {
            (None, _) => RowLockClaim::Lock {
                lock_row: self.lock_row(rows),
            },
            (Some(attempt), Dialect::Postgres | Dialect::Sqlite) => RowLockClaim::Count {
                count_row: self.count_row(attempt.name, false),
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
                    Some(self.count_row(attempt.name, true))
                }
                _ => None,
            },
            savepoint: self.fixed(StatementKind::Savepoint, "SAVEPOINT rs_handler"),
            rollback_to_savepoint: self.fixed(
                StatementKind::RollbackToSavepoint,
                "ROLLBACK TO SAVEPOINT rs_handler",
            ),
            session_probe: (self.dialect == Dialect::Postgres && self.desc.attempt.is_some())
                .then(|| (self.lock_fn(true), self.lock_fn(false))),
        }
    }

    fn lease_statements(&self, rows: Output, batch: usize, lease: &str) -> LeaseStatements {
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
                .then(|| self.claim_lease_from(rows.clone(), lease, true)),
        }
    }

    fn advisory_statements(&self, rows: Output) -> AdvisoryStatements {
        let keys = match (self.desc.custom_lock(), self.dialect) {
            (true, _) => KeyLocks::Custom,
            (false, Dialect::Sqlite) => KeyLocks::Registry,
            (false, _) => KeyLocks::Database {
                try_lock: self.lock_fn(true),
                unlock: self.lock_fn(false),
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
            candidates: self.candidates(0, false),
            candidates_from: self.advisory_floor().then(|| self.candidates(0, true)),
            keys,
            take,
            settle: self.settle(None),
            fail: self.fail(None),
            retry: self.retry_later(None),
            ping: (self.dialect != Dialect::Sqlite)
                .then(|| self.fixed(StatementKind::Ping, "SELECT 1")),
        }
    }

    fn fixed(&self, kind: StatementKind, text: &str) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push(text);
        s.finish(kind, Output::Nothing)
    }

    /// The columns the core reads from a taken row: the id, then the attempt.
    fn row_columns(&self) -> Arc<[OutColumn]> {
        let mut columns = vec![OutColumn::new(self.desc.id.name, ColumnType::Id)];
        if let Some(attempt) = self.desc.attempt {
            columns.push(OutColumn::new(attempt.name, ColumnType::Int));
        }
        columns.into()
    }

    /// `WHERE` and the conditions under which a row is claimable at `Now`, or nothing;
    /// answers whether it wrote a condition.
    fn claimable(&self, s: &mut Sql, first: bool) -> bool {
        let mut wrote = false;
        let mut lead = if first { " WHERE " } else { " AND " };
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
            s.time(Arg::Now);
            lead = " AND ";
            wrote = true;
        }
        if let Some(lease) = self.desc.locked_until {
            let lease = self.q(lease.name);
            s.push(lead)
                .push("(")
                .push(&lease)
                .push(" IS NULL OR ")
                .push(&lease)
                .push(" <= ");
            s.time(Arg::Now).push(")");
            wrote = true;
        }
        wrote
    }

    fn order(&self, s: &mut Sql) {
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

    fn list_columns(&self) -> Statement {
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

    fn fence(&self, s: &mut Sql, lease: &str) {
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
        s.time(Arg::Until);
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

    /// The key as text, rendered by the database; `NULL` where a key column is `NULL` unless
    /// `coalesce`, which renders such a column as empty text (to compare keys with).
    fn key_expr(&self, coalesce: bool) -> String {
        let parts = self.desc.advisory.unwrap_or(&[]);
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
                    if coalesce {
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

    /// The first claimable rows' ids and keys, passing over the rows of `excluded` keys;
    /// `from`: from [`Arg::Floor`] on.
    fn candidates(&self, excluded: usize, from: bool) -> Statement {
        let mut s = Sql::new(self.dialect);
        // A key column's `NULL` reads as no key, which the claim fails naming the column.
        s.push("SELECT ")
            .push(&self.id())
            .push(" AS rs_id, ")
            .push(&self.key_expr(false))
            .push(" AS rs_key FROM ")
            .push(&self.table());
        let mut conditions = self.claimable(&mut s, true);
        if from {
            self.floor(&mut s, conditions);
            conditions = true;
        }
        if excluded > 0 {
            s.push(if conditions { " AND " } else { " WHERE " })
                .push(&self.key_expr(true))
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

    fn lock_fn(&self, lock: bool) -> Statement {
        let mut s = Sql::new(self.dialect);
        let (kind, column) = if lock {
            (StatementKind::TryLock, "locked")
        } else {
            (StatementKind::Unlock, "unlocked")
        };
        match (self.dialect, lock) {
            (Dialect::Postgres, true) => s.push("SELECT pg_try_advisory_lock(").arg(Arg::Key),
            (Dialect::Postgres, false) => s.push("SELECT pg_advisory_unlock(").arg(Arg::Key),
            (_, true) => s.push("SELECT GET_LOCK(").arg(Arg::Key).push(", 0"),
            (_, false) => s.push("SELECT RELEASE_LOCK(").arg(Arg::Key),
        };
        s.push(") AS ").push(column);
        s.finish(kind, named(&[(column, ColumnType::Bool)]))
    }

    fn take(&self, rows: Output) -> Statement {
        let mut s = Sql::new(self.dialect);
        match self.desc.attempt {
            Some(attempt) => {
                let attempt = self.q(attempt.name);
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
                let _ = self.claimable(&mut s, false);
                s.push(" RETURNING *");
            }
            None => {
                s.push("SELECT * FROM ")
                    .push(&self.table())
                    .push(" WHERE ")
                    .push(&self.id())
                    .push(" = ")
                    .arg(Arg::Id);
                let _ = self.claimable(&mut s, false);
            }
        }
        s.finish(StatementKind::Take, rows)
    }

    fn read_row(&self, rows: Output) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push("SELECT * FROM ")
            .push(&self.table())
            .push(" WHERE ")
            .push(&self.id())
            .push(" = ")
            .arg(Arg::Id);
        s.finish(StatementKind::ReadRow, rows)
    }

    /// Settles a row as done; `fence` is the lease column of the lease form, whose
    /// settlement holds only while this process's lease holds the row.
    fn settle(&self, fence: Option<&str>) -> Statement {
        let fenced = fence.is_some();
        let mut s = Sql::new(self.dialect);
        let kind = match self.desc.processed_at {
            Some(processed) => {
                s.push("UPDATE ")
                    .push(&self.table())
                    .push(" SET ")
                    .push(&self.q(processed.name))
                    .push(" = ");
                s.time(Arg::Now);
                if let Some(lease) = self.desc.locked_until {
                    s.push(", ").push(&self.q(lease.name)).push(" = NULL");
                }
                StatementKind::MarkProcessed { fenced }
            }
            None => {
                s.push("DELETE FROM ").push(&self.table());
                StatementKind::Delete { fenced }
            }
        };
        s.push(" WHERE ").push(&self.id()).push(" = ").arg(Arg::Id);
        if let Some(lease) = fence {
            self.fence(&mut s, lease);
        }
        s.finish(kind, Output::Affected)
    }

    fn settle_leases(&self, rows: usize, lease_column: &str) -> Statement {
        let mut s = Sql::new(self.dialect);
        match self.desc.processed_at {
            Some(processed) => {
                s.push("UPDATE ")
                    .push(&self.table())
                    .push(" SET ")
                    .push(&self.q(processed.name))
                    .push(" = ");
                s.time(Arg::Now);
                if let Some(lease) = self.desc.locked_until {
                    s.push(", ").push(&self.q(lease.name)).push(" = NULL");
                }
            }
            None => {
                s.push("DELETE FROM ").push(&self.table());
            }
        }
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
    fn publish(&self) -> Statement {
        self.publish_n(1, self.dialect == Dialect::Postgres)
    }

    /// The columns publishing writes, with their arguments.
    fn publish_columns(&self) -> Vec<(&'static str, Arg)> {
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
            self.desc.locked_until,
            self.desc.processed_at,
            self.desc.due,
            self.desc.failed_at,
            self.desc.error,
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
    fn publish_n(&self, rows: usize, notifies: bool) -> Statement {
        let columns = self.publish_columns();
        let mut s = Sql::new(self.dialect);
        if notifies {
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
                        s.time_placeholder(Arg::Due, true);
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
        if notifies {
            s.push(" RETURNING 1) SELECT ")
                .push(&self.dialect.notify_call(self.desc.table))
                .push(" FROM rs_published");
        }
        s.finish(StatementKind::Publish, Output::Affected)
    }
}

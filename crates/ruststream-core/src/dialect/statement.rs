//! The rendered statement and what describes it: its placeholders' logical arguments ([`Arg`]),
//! what it does ([`StatementKind`]), what its reply holds ([`Output`], [`OutColumn`],
//! [`ColumnType`]), and the builder that writes its text and arguments in a dialect.

use std::sync::Arc;

use super::{Dialect, FailedRows, MaintenanceKind, literal};

/// A logical argument of a statement; [`Statement::args`] lists one per placeholder, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arg {
    /// The row's id.
    Id,
    /// The attempt count this claim wrote into the row.
    Attempt,
    /// The `n`th id of a batch.
    IdAt(usize),
    /// How long a lease runs, in microseconds: a claim writes the database's time plus this.
    LeaseFor,
    /// How far an extension moves a held lease's expiry, in microseconds.
    Extend,
    /// The lease expiry the row holds for this process (read back from its claim), which
    /// proves it still holds the row.
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
    /// The `n`th id of a row a claim passes over: one that failed in this process and waits
    /// its retry's delay, on a table with nowhere to write it.
    ExcludedId(usize),
    /// How long a retried row waits before it is due again, in microseconds from the
    /// database's time.
    RetryIn,
    /// The text of the error a settlement records, or `NULL` to keep the one the row has.
    Error,
    /// A `LIKE` pattern the error text of the failed rows must match, escaped with `!`
    /// ([`error_like`](super::error_like)).
    ErrorLike,
    /// The lowest id a claim past the rows already settled looks at (`id >= floor`).
    Floor,
    /// The `n`th mark of a row lock count: the key or name its count read for a row.
    MarkAt(usize),
    /// Retention: how old a row's mark must be for the row to be deleted, in microseconds
    /// before the database's time.
    Age,
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
    /// its attempt is still the one this claim counted, `FOR UPDATE SKIP LOCKED`, and reads it.
    // The count's mark keeps other counts from counting the row; one that holds it while it
    // looks at it makes the lock pass it over, and the claim tries again shortly.
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
    /// PostgreSQL: notifies [`NOTIFY_CHANNEL`](super::NOTIFY_CHANNEL) with the table's name,
    /// after inserts that did not notify.
    Notify,
    /// Inserts a row; on PostgreSQL, in the same statement, notifies
    /// [`NOTIFY_CHANNEL`](super::NOTIFY_CHANNEL) with the table's name. Its reply counts the
    /// rows written.
    Publish,
    /// The maintenance a broker runs by itself: retention and periodic jobs.
    Maintenance(MaintenanceKind),
    /// The row lock and advisory lock forms on a server: tells whether the session of a row
    /// claimed ahead still answers (and so still holds the row's transaction or key) before
    /// the row is handed.
    Ping,
    /// Reads a table's counts ([`Statements::stats`](super::Statements::stats)).
    Stats,
    /// Reads failed rows ([`Statements::list_failed`](super::Statements::list_failed)).
    ListFailed,
    /// Lists a table's indexes and their columns.
    ListIndexes,
    /// Creates what a table's schema lacks ([`Ddl`](super::Ddl)).
    CreateSchema,
}

impl StatementKind {
    /// Whether the session has a transaction open after a statement of this kind ran (`None`:
    /// as it was, or in doubt), so an adapter can roll back a connection it gives back with a
    /// transaction open.
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

/// The type the core reads a column of a statement's rows as: an adapter passes the value its
/// driver's type gives through [`ColumnType::read`], or a driver that reports no types its
/// text through [`ColumnType::read_text`]; never a type from a statement's kind or a name.
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
    /// query protocol. Fails, naming the statement, where a placeholder has no bind, and where
    /// a text holds a NUL character, which PostgreSQL's text cannot store.
    pub fn inline_binds(&self, binds: &[crate::Value]) -> Result<String, crate::DbError> {
        // Each `$n` outside string literals, quoted identifiers, dollar quotes and comments
        // becomes the literal of `binds[n - 1]`, safe under either setting of
        // `standard_conforming_strings`.
        literal::render(&self.sql, binds)
    }
}

/// Whether an argument's placeholder is shared with its earlier uses in the statement, or
/// its own (the rows of a batch insert each bind their own values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Binding {
    Shared,
    Own,
}

pub(super) struct Sql {
    pub(super) dialect: Dialect,
    pub(super) text: String,
    pub(super) args: Vec<Arg>,
}

impl Sql {
    pub(super) fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            text: String::new(),
            args: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    pub(super) fn arg(&mut self, arg: Arg) -> &mut Self {
        self.placeholder(arg, Binding::Shared)
    }

    /// A placeholder of its own for `arg`, even where `arg` has one already: the rows of a
    /// batch insert each bind their own values.
    pub(super) fn fresh_arg(&mut self, arg: Arg) -> &mut Self {
        self.placeholder(arg, Binding::Own)
    }

    pub(super) fn placeholder(&mut self, arg: Arg, binding: Binding) -> &mut Self {
        match self.dialect {
            Dialect::MySql | Dialect::MariaDb => {
                self.args.push(arg);
                self.text.push('?');
            }
            Dialect::Postgres | Dialect::Sqlite => {
                let shared = binding == Binding::Shared;
                let n = match self.args.iter().position(|a| *a == arg).filter(|_| shared) {
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
    pub(super) fn time(&mut self, arg: Arg) -> &mut Self {
        self.time_placeholder(arg, Binding::Shared)
    }

    /// The database's clock, read once per statement: every time the queue writes into a row
    /// or compares with one is measured by it, so no process's clock decides whether a row
    /// is held or due. SQLite reads the clock of the machine it runs on, to the millisecond.
    pub(super) fn db_now(&mut self) -> &mut Self {
        let now = db_now(self.dialect);
        self.push(now)
    }

    /// The database's clock plus `arg` microseconds.
    pub(super) fn db_now_plus(&mut self, arg: Arg) -> &mut Self {
        self.time_plus(db_now(self.dialect), arg)
    }

    /// The database's clock minus `arg` microseconds.
    pub(super) fn db_now_minus(&mut self, arg: Arg) -> &mut Self {
        match self.dialect {
            Dialect::Postgres => self
                .push("(statement_timestamp() - CAST(")
                .arg(arg)
                .push(" AS BIGINT) * INTERVAL '1 microsecond')"),
            Dialect::MySql | Dialect::MariaDb => self
                .push("TIMESTAMPADD(MICROSECOND, 0 - ")
                .arg(arg)
                .push(", UTC_TIMESTAMP(6))"),
            Dialect::Sqlite => self
                .push("(")
                .push(db_now(Dialect::Sqlite))
                .push(" - ")
                .arg(arg)
                .push(")"),
        }
    }

    /// The time expression `base` plus `arg` microseconds.
    pub(super) fn time_plus(&mut self, base: &str, arg: Arg) -> &mut Self {
        match self.dialect {
            Dialect::Postgres => self
                .push("(")
                .push(base)
                .push(" + CAST(")
                .arg(arg)
                .push(" AS BIGINT) * INTERVAL '1 microsecond')"),
            Dialect::MySql | Dialect::MariaDb => self
                .push("TIMESTAMPADD(MICROSECOND, ")
                .arg(arg)
                .push(", ")
                .push(base)
                .push(")"),
            Dialect::Sqlite => self.push("(").push(base).push(" + ").arg(arg).push(")"),
        }
    }

    pub(super) fn time_placeholder(&mut self, arg: Arg, binding: Binding) -> &mut Self {
        match self.dialect {
            Dialect::Postgres => self
                .push("(TIMESTAMPTZ 'epoch' + CAST(")
                .placeholder(arg, binding)
                .push(" AS BIGINT) * INTERVAL '1 microsecond')"),
            Dialect::MySql | Dialect::MariaDb => self
                .push("TIMESTAMPADD(MICROSECOND, ")
                .placeholder(arg, binding)
                .push(", TIMESTAMP'1970-01-01 00:00:00')"),
            Dialect::Sqlite => self.placeholder(arg, binding),
        }
    }

    pub(super) fn finish(self, kind: StatementKind, output: Output) -> Statement {
        Statement {
            kind,
            sql: self.text.into(),
            args: self.args.into(),
            output,
        }
    }
}

/// The database's clock in `dialect`, as a time of the queue's columns: PostgreSQL's
/// `statement_timestamp()`, MySQL's and MariaDB's `UTC_TIMESTAMP(6)` (the columns hold UTC),
/// SQLite's `'now'` in microseconds since the Unix epoch (rounded to the millisecond it has).
pub(super) const fn db_now(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => "statement_timestamp()",
        Dialect::MySql | Dialect::MariaDb => "UTC_TIMESTAMP(6)",
        Dialect::Sqlite => {
            "(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)"
        }
    }
}

/// A time expression of `dialect` as microseconds since the Unix epoch, exactly: a fence
/// read this way compares equal with the column once bound back.
pub(super) fn micros(dialect: Dialect, expr: &str) -> String {
    match dialect {
        // `EXTRACT` answers a numeric from PostgreSQL 14 on, exact; before, a double, whose
        // rounding stays under half a microsecond for times before 2041.
        Dialect::Postgres => format!("CAST(EXTRACT(EPOCH FROM {expr}) * 1000000 AS BIGINT)"),
        Dialect::MySql | Dialect::MariaDb => {
            format!("TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', {expr})")
        }
        Dialect::Sqlite => expr.to_owned(),
    }
}

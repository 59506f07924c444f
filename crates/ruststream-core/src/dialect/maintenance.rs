//! The statements of the maintenance a broker runs by itself: retention (rows marked processed
//! or failed deleted after an age, in small batches, by one process at a time) and periodic
//! jobs (one row per tick of a schedule, across every process, through a state table).
//!
//! # The state table of periodic jobs
//!
//! Each schedule has one row in [`PERIODIC_TABLE`]: its name and the last tick published. A
//! tick is published in one transaction that moves `last_tick` forward only if it is still
//! behind the tick (a compare-and-set) and, only where it moved, inserts the job's row: of
//! several processes on one schedule one publishes each tick, and a tick published before a
//! restart is not published again, whatever became of its row. Its DDL per dialect
//! ([`periodic_table_ddl`]):
//!
//! | dialect | DDL |
//! |---|---|
//! | PostgreSQL | `CREATE TABLE IF NOT EXISTS ruststream_periodic (name TEXT PRIMARY KEY, last_tick TIMESTAMPTZ NOT NULL)` |
//! | MySQL, MariaDB | `CREATE TABLE IF NOT EXISTS ruststream_periodic (name VARCHAR(191) PRIMARY KEY, last_tick DATETIME(6) NOT NULL)` |
//! | SQLite | `CREATE TABLE IF NOT EXISTS ruststream_periodic (name TEXT PRIMARY KEY, last_tick INTEGER NOT NULL)` |
//!
//! MySQL's and MariaDB's `last_tick` holds UTC, SQLite's microseconds since the Unix epoch, as
//! every time the queue writes.

use super::session::LockCall;
use super::statement::{db_now, micros};
use super::{Arg, ColumnType, Dialect, Output, Renderer, Sql, Statement, StatementKind, named};
use crate::spec::TableDesc;

/// The table that holds the last tick of each periodic job's schedule, in the connection's
/// schema (PostgreSQL's `search_path`) or database.
pub const PERIODIC_TABLE: &str = "ruststream_periodic";

/// What a statement of the maintenance does ([`StatementKind::Maintenance`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MaintenanceKind {
    /// Retention: takes the table's retention lock without waiting: a row of `locked`.
    TryLock,
    /// Retention: releases the table's retention lock: a row of `unlocked`.
    Unlock,
    /// Retention: deletes up to a batch of rows marked processed more than [`Arg::Age`] ago:
    /// rows affected.
    DeleteProcessed,
    /// Retention: deletes up to a batch of rows marked failed more than [`Arg::Age`] ago: rows
    /// affected.
    DeleteFailed,
    /// Periodic jobs: creates [`PERIODIC_TABLE`] where it is missing.
    CreateStateTable,
    /// Periodic jobs: writes a schedule's row ([`Arg::Schedule`], last tick [`Arg::Tick`])
    /// where it is missing: rows affected.
    InsertState,
    /// Periodic jobs: a schedule's last tick and the database's time, in microseconds since
    /// the Unix epoch: a row of `last_tick` and `read_at`.
    ReadState,
    /// Periodic jobs: moves a schedule's last tick to [`Arg::Tick`] where it is still behind
    /// it: rows affected, 1 where this transaction publishes the tick.
    Advance,
}

/// The retention statements of one table ([`Statements::retention`](super::Statements::retention)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetentionStatements {
    /// Takes the table's retention lock: PostgreSQL's `pg_try_advisory_lock(int, int)` of the
    /// schema and table, MySQL's and MariaDB's `GET_LOCK(.., 0)` of the database and table.
    /// `None` on SQLite, where one broker runs one table's retention at a time.
    pub try_lock: Option<Statement>,
    /// Releases the lock [`RetentionStatements::try_lock`] took.
    pub unlock: Option<Statement>,
    /// Deletes up to the batch of rows marked processed more than [`Arg::Age`] ago, where the
    /// table marks them.
    pub delete_processed: Option<Statement>,
    /// Deletes up to the batch of rows marked failed more than [`Arg::Age`] ago, where the table
    /// keeps failed rows.
    pub delete_failed: Option<Statement>,
}

/// The statements of periodic jobs, the same for every schedule of a dialect
/// ([`Statements::periodic`](super::Statements::periodic)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeriodicStatements {
    /// Creates [`PERIODIC_TABLE`] where it is missing.
    pub create_table: Statement,
    /// Writes a schedule's row where it is missing.
    pub insert_state: Statement,
    /// Reads a schedule's last tick.
    pub read_state: Statement,
    /// Opens a tick's transaction.
    pub begin: Statement,
    /// Moves a schedule's last tick forward where it is behind.
    pub advance: Statement,
    /// Commits a tick's transaction.
    pub commit: Statement,
}

/// The DDL of [`PERIODIC_TABLE`] in `dialect`, `IF NOT EXISTS`.
pub fn periodic_table_ddl(dialect: Dialect) -> String {
    let (name, time) = match dialect {
        Dialect::Postgres => ("TEXT", "TIMESTAMPTZ"),
        Dialect::MySql | Dialect::MariaDb => ("VARCHAR(191)", "DATETIME(6)"),
        Dialect::Sqlite => ("TEXT", "INTEGER"),
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {PERIODIC_TABLE} (name {name} PRIMARY KEY, last_tick {time} NOT NULL)"
    )
}

/// The retention lock's statement, its lock or its unlock, for `table` in `dialect`; `None`
/// on SQLite.
fn retention_lock(dialect: Dialect, table: &str, call: LockCall) -> Option<Statement> {
    let (kind, column) = match call {
        LockCall::Lock => (MaintenanceKind::TryLock, "locked"),
        LockCall::Unlock => (MaintenanceKind::Unlock, "unlocked"),
    };
    let table = dialect.text_literal(table);
    let call = match dialect {
        // The two-key form: its locks never meet the advisory form's 64-bit keys.
        Dialect::Postgres => format!(
            "{}(hashtext('ruststream.retention'), hashtext(current_schema() || '.' || {table}))",
            match call {
                LockCall::Lock => "pg_try_advisory_lock",
                LockCall::Unlock => "pg_advisory_unlock",
            }
        ),
        // A lock name is at most 64 characters: a prefix and a hash of database and table.
        Dialect::MySql | Dialect::MariaDb => {
            let name = format!(
                "CONCAT('ruststream.retention.', LEFT(SHA2(CONCAT(IFNULL(DATABASE(), ''), '.', {table}), 256), 40))"
            );
            match call {
                LockCall::Lock => format!("GET_LOCK({name}, 0)"),
                LockCall::Unlock => format!("RELEASE_LOCK({name})"),
            }
        }
        Dialect::Sqlite => return None,
    };
    let mut s = Sql::new(dialect);
    s.push("SELECT ").push(&call).push(" AS ").push(column);
    Some(s.finish(
        StatementKind::Maintenance(kind),
        named(&[(column, ColumnType::Bool)]),
    ))
}

impl Renderer<'_> {
    // Deletes up to `batch` rows whose `column` is more than [`Arg::Age`] old, each statement
    // its own short transaction. PostgreSQL and SQLite select the batch's ids in a subquery
    // and check the mark again in the delete, so that a row changed meanwhile (a redrive
    // clears `failed_at`) is kept; MySQL and MariaDB delete with `ORDER BY .. LIMIT`.
    fn delete_marked(&self, column: &str, batch: usize, kind: MaintenanceKind) -> Statement {
        let mut s = Sql::new(self.dialect);
        let table = self.table();
        let column = self.q(column);
        let id = self.id();
        s.push("DELETE FROM ").push(&table).push(" WHERE ");
        match self.dialect {
            Dialect::Postgres | Dialect::Sqlite => {
                s.push(&id)
                    .push(" IN (SELECT ")
                    .push(&id)
                    .push(" FROM ")
                    .push(&table)
                    .push(" WHERE ")
                    .push(&column)
                    .push(" < ");
                s.db_now_minus(Arg::Age);
                s.push(" LIMIT ")
                    .push(&batch.to_string())
                    .push(") AND ")
                    .push(&column)
                    .push(" < ");
                s.db_now_minus(Arg::Age);
            }
            Dialect::MySql | Dialect::MariaDb => {
                s.push(&column).push(" < ");
                s.db_now_minus(Arg::Age);
                s.push(" ORDER BY ")
                    .push(&id)
                    .push(" LIMIT ")
                    .push(&batch.to_string());
            }
        }
        s.finish(StatementKind::Maintenance(kind), Output::Affected)
    }
}

/// Renders the retention statements of `desc` in `dialect`, deleting up to `batch` rows per
/// statement.
pub(super) fn retention(dialect: Dialect, desc: &TableDesc, batch: usize) -> RetentionStatements {
    let r = Renderer::new(dialect, desc);
    let batch = batch.max(1);
    RetentionStatements {
        try_lock: retention_lock(dialect, desc.table, LockCall::Lock),
        unlock: retention_lock(dialect, desc.table, LockCall::Unlock),
        delete_processed: desc
            .processed_at
            .map(|c| r.delete_marked(c.name, batch, MaintenanceKind::DeleteProcessed)),
        delete_failed: desc
            .failed_at
            .map(|c| r.delete_marked(c.name, batch, MaintenanceKind::DeleteFailed)),
    }
}

/// Renders the statements of periodic jobs in `dialect`.
pub(super) fn periodic(dialect: Dialect) -> PeriodicStatements {
    let table = dialect.quote(PERIODIC_TABLE);
    let kind = StatementKind::Maintenance;

    let mut create = Sql::new(dialect);
    create.push(&periodic_table_ddl(dialect));

    let mut insert = Sql::new(dialect);
    insert.push(match dialect {
        Dialect::Postgres => "INSERT INTO ",
        Dialect::MySql | Dialect::MariaDb => "INSERT IGNORE INTO ",
        Dialect::Sqlite => "INSERT OR IGNORE INTO ",
    });
    insert
        .push(&table)
        .push(" (name, last_tick) VALUES (")
        .arg(Arg::Schedule)
        .push(", ");
    insert.time(Arg::Tick);
    insert.push(")");
    if dialect == Dialect::Postgres {
        insert.push(" ON CONFLICT (name) DO NOTHING");
    }

    // With the database's time, which decides which ticks are due.
    let mut read = Sql::new(dialect);
    read.push("SELECT ")
        .push(&micros(dialect, "last_tick"))
        .push(" AS last_tick, ")
        .push(&micros(dialect, db_now(dialect)))
        .push(" AS read_at FROM ")
        .push(&table)
        .push(" WHERE name = ")
        .arg(Arg::Schedule);

    let mut advance = Sql::new(dialect);
    advance
        .push("UPDATE ")
        .push(&table)
        .push(" SET last_tick = ");
    advance.time(Arg::Tick);
    advance.push(" WHERE name = ").arg(Arg::Schedule);
    advance.push(" AND last_tick < ");
    advance.time(Arg::Tick);

    let mut begin = Sql::new(dialect);
    begin.push(match dialect {
        Dialect::Postgres => "BEGIN",
        Dialect::MySql | Dialect::MariaDb => "START TRANSACTION",
        Dialect::Sqlite => "BEGIN IMMEDIATE",
    });
    let mut commit = Sql::new(dialect);
    commit.push("COMMIT");

    PeriodicStatements {
        create_table: create.finish(kind(MaintenanceKind::CreateStateTable), Output::Nothing),
        insert_state: insert.finish(kind(MaintenanceKind::InsertState), Output::Affected),
        read_state: read.finish(
            kind(MaintenanceKind::ReadState),
            named(&[("last_tick", ColumnType::Int), ("read_at", ColumnType::Int)]),
        ),
        begin: begin.finish(StatementKind::Begin, Output::Nothing),
        advance: advance.finish(kind(MaintenanceKind::Advance), Output::Affected),
        commit: commit.finish(StatementKind::Commit, Output::Nothing),
    }
}

//! SQLite on rusqlite as a blocking driver: how a connection opens (its busy timeout, its
//! statement cache, its `synchronous`, and WAL mode on the first), runs a statement of the
//! core, runs a table's own lock, and goes back to the pool. The runtime's [`Threads`] runs
//! each connection on a thread of its own; [`Source`] gives the broker's life its start and
//! close.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, InterruptHandle};
use ruststream::adapter::{
    AdapterError, BlockingDriver, ConnFuture, ConnectionPool, PoolSource, ThreadSettings, Threads,
};
use ruststream_core::server::{self, Server};
use ruststream_core::{
    ColumnType, DbError, Dialect, ErrorKind, Output, Reply, Statement, Value, read_rows,
};

use crate::lock::CustomLock;
use crate::row::{RusqliteRow, db_error, from_sql, to_sql};

/// How long the task that sent a statement looks for its answer before it waits to be woken,
/// unless the broker is told otherwise: most statements answer within it.
pub(crate) const LOOK_FOR_ANSWER: Duration = Duration::from_micros(300);

/// How the pool opens and lends connections.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) path: PathBuf,
    pub(crate) max_connections: usize,
    pub(crate) busy_timeout: Duration,
    pub(crate) acquire_timeout: Duration,
    pub(crate) statement_cache: usize,
    /// How long the task that sent a statement looks for its answer before it waits.
    pub(crate) look_for_answer: Duration,
    /// `PRAGMA synchronous` of each connection, where the service sets it.
    pub(crate) synchronous: Option<Synchronous>,
}

/// How a commit waits for the disk: SQLite's `PRAGMA synchronous`, set on each connection the
/// pool opens ([`RusqliteBroker::synchronous`](crate::RusqliteBroker::synchronous)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Synchronous {
    /// `OFF`: no wait for the disk at all. A crash of the operating system or a power loss
    /// may corrupt the database.
    Off,
    /// `NORMAL`: in WAL mode, a commit writes the log without waiting for the disk. A process
    /// crash loses nothing; a power loss or an operating system crash may undo the last
    /// commits: a settled row comes back (and runs again), and a published row may be gone.
    Normal,
    /// `FULL`, SQLite's default: each commit waits for the disk.
    Full,
    /// `EXTRA`: as `FULL`, and the directory is synced too.
    Extra,
}

impl Synchronous {
    /// The pragma that sets it.
    pub(crate) fn pragma(self) -> &'static str {
        match self {
            Synchronous::Off => "PRAGMA synchronous = OFF",
            Synchronous::Normal => "PRAGMA synchronous = NORMAL",
            Synchronous::Full => "PRAGMA synchronous = FULL",
            Synchronous::Extra => "PRAGMA synchronous = EXTRA",
        }
    }
}

/// SQLite's connections, as the runtime's [`Threads`] opens and runs them: each
/// [`rusqlite::Connection`] on a thread of its own. A handler reaches its delivery's through
/// [`RusqliteClaim`](crate::RusqliteClaim).
pub struct RusqliteDriver {
    config: Config,
}

impl std::fmt::Debug for RusqliteDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RusqliteDriver").finish_non_exhaustive()
    }
}

impl BlockingDriver for RusqliteDriver {
    const CLAIM: &'static str = "RusqliteClaim";
    type Connection = Connection;
    type Row = RusqliteRow;
    type Lock = CustomLock;
    type Interrupt = InterruptHandle;

    fn open(&self, first: bool) -> Result<(Connection, InterruptHandle), DbError> {
        let conn = open(&self.config, first)?;
        let interrupt = conn.get_interrupt_handle();
        Ok((conn, interrupt))
    }

    fn interrupt(&self, interrupt: &InterruptHandle) {
        interrupt.interrupt();
    }

    fn execute(
        &self,
        conn: &mut Connection,
        statement: &Statement,
        binds: &[Value],
    ) -> Reply<RusqliteRow> {
        execute(conn, statement, binds).unwrap_or_else(Reply::Failed)
    }

    fn lock(
        &self,
        conn: &mut Connection,
        lock: &CustomLock,
        key: &str,
        take: bool,
    ) -> Result<bool, DbError> {
        let answer = if take {
            (lock.lock())(conn, key)
        } else {
            (lock.unlock())(conn, key)
        };
        answer.map_err(|e| db_error(&e))
    }

    fn reset(&self, conn: &mut Connection) {
        reset(conn);
    }

    fn close(&self, conn: Connection) {
        if let Err((_, error)) = conn.close() {
            tracing::warn!("closing a SQLite connection failed: {error}");
        }
    }
}

/// The broker's pool: built at the start from the broker's settings, closed at the end.
pub(crate) struct Source {
    pub(crate) config: Config,
}

/// A private in-memory database: one per connection.
fn private_memory(path: &std::path::Path) -> bool {
    let text = path.to_string_lossy();
    text.is_empty() || text == ":memory:"
}

impl PoolSource for Source {
    type Pool = Threads<RusqliteDriver>;
    type Lender = Threads<RusqliteDriver>;

    fn name(&self) -> &'static str {
        "SQLite"
    }

    fn target(&self) -> String {
        format!("`{}`", self.config.path.display())
    }

    fn given(&self) -> Option<&Threads<RusqliteDriver>> {
        None
    }

    /// Refuses a private in-memory database, and a SQLite older than the queue serves.
    fn build(&self) -> ConnFuture<'_, Result<Threads<RusqliteDriver>, AdapterError>> {
        let path = self.config.path.display();
        let built = if private_memory(&self.config.path) {
            Err(AdapterError::new(format!(
                "SQLite database `{path}`: a private in-memory database is one per connection, and the broker's pool opens several; use a file"
            )))
        } else if let Err(error) = server::dialect_of(Server::Sqlite, rusqlite::version()) {
            Err(AdapterError::new(format!(
                "SQLite database `{path}`: {error}"
            )))
        } else {
            let settings = ThreadSettings {
                max_connections: self.config.max_connections,
                acquire_timeout: self.config.acquire_timeout,
                look_for_answer: self.config.look_for_answer,
                thread_name: "ruststream-sqlite-conn".into(),
            };
            Ok(Threads::new(
                RusqliteDriver {
                    config: self.config.clone(),
                },
                settings,
            ))
        };
        Box::pin(std::future::ready(built))
    }

    /// Opens the first connection (which sets WAL mode) and keeps it idle in the pool.
    fn open(
        &self,
        pool: &Threads<RusqliteDriver>,
    ) -> ConnFuture<'_, Result<(Threads<RusqliteDriver>, Dialect), AdapterError>> {
        let pool = pool.clone();
        Box::pin(async move {
            let conn = pool
                .acquire()
                .await
                .map_err(|e| AdapterError::new(e.message))?;
            pool.release(conn).await;
            Ok((pool, Dialect::Sqlite))
        })
    }

    fn close(
        &self,
        pool: Threads<RusqliteDriver>,
        _: Option<Threads<RusqliteDriver>>,
        _: usize,
    ) -> ConnFuture<'_, ()> {
        pool.close_all()
    }
}

/// Opens a connection: the busy timeout, the statement cache, and on the start, WAL mode.
fn open(config: &Config, start: bool) -> Result<Connection, DbError> {
    let path = config.path.display();
    let failed = |e: rusqlite::Error| {
        let mut error = db_error(&e);
        error.message = format!(
            "cannot open the SQLite database `{path}`: {}",
            error.message
        );
        if error.kind == ErrorKind::Other {
            error.kind = ErrorKind::ConnectionLost;
        }
        error
    };
    let conn = Connection::open(&config.path).map_err(failed)?;
    conn.busy_timeout(config.busy_timeout).map_err(failed)?;
    conn.set_prepared_statement_cache_capacity(config.statement_cache);
    if let Some(synchronous) = config.synchronous {
        conn.execute_batch(synchronous.pragma()).map_err(failed)?;
    }
    if start {
        set_wal(&conn, config.busy_timeout).map_err(failed)?;
    }
    Ok(conn)
}

/// Puts the file in WAL mode, which lets readers run beside the writer (an in-memory
/// database stays `memory`). The mode is the file's, so the first start sets it for all. A
/// change that meets another connection's lock answers "busy" at once, whatever the busy
/// timeout: it is tried again until the mode reads `wal` or `timeout` has passed.
fn set_wal(conn: &Connection, timeout: Duration) -> rusqlite::Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    let mode = |sql: &str| conn.query_row(sql, [], |row| row.get::<_, String>(0));
    loop {
        let read = mode("PRAGMA journal_mode").and_then(|current| match current.as_str() {
            "wal" | "memory" => Ok(current),
            _ => mode("PRAGMA journal_mode = WAL"),
        });
        match read {
            Ok(_) => return Ok(()),
            Err(error) if is_busy(&error) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(error) => return Err(error),
        }
    }
}

/// SQLITE_BUSY or SQLITE_LOCKED, with any extended code.
fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Ends a transaction that a released connection left open, as a pool does.
fn reset(conn: &Connection) {
    if !conn.is_autocommit()
        && let Err(error) = conn.execute_batch("ROLLBACK")
    {
        tracing::warn!("rolling back a released SQLite connection failed: {error}");
    }
}

/// Runs a statement with its binds and reads the reply as its output says.
pub(crate) fn execute(
    conn: &Connection,
    statement: &Statement,
    binds: &[Value],
) -> Result<Reply<RusqliteRow>, DbError> {
    let sql_error = |e: rusqlite::Error| db_error(&e);
    let mut stmt = conn.prepare_cached(&statement.sql).map_err(sql_error)?;
    if stmt.parameter_count() != binds.len() {
        return Err(DbError::new(
            ErrorKind::Other,
            format!(
                "the statement has {} placeholders but {} binds: {}",
                stmt.parameter_count(),
                binds.len(),
                statement.sql
            ),
        ));
    }
    for (i, value) in binds.iter().enumerate() {
        stmt.raw_bind_parameter(i + 1, to_sql(value))
            .map_err(sql_error)?;
    }
    match &statement.output {
        Output::Nothing => {
            stmt.raw_execute().map_err(sql_error)?;
            Ok(Reply::Done)
        }
        Output::Affected => {
            let n = stmt.raw_execute().map_err(sql_error)?;
            Ok(Reply::Affected(n as u64))
        }
        Output::Rows { columns, raw } => {
            let names: Arc<[String]> = stmt
                .column_names()
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>()
                .into();
            let mut out = Vec::new();
            let mut rows = stmt.raw_query();
            while let Some(row) = rows.next().map_err(sql_error)? {
                let values = (0..names.len())
                    .map(|i| row.get::<_, SqlValue>(i))
                    .collect::<rusqlite::Result<Vec<SqlValue>>>()
                    .map_err(sql_error)?;
                out.push(RusqliteRow::from_parts(names.clone(), values));
            }
            let names = |row: &RusqliteRow| row.columns().to_vec();
            let read =
                |row: &RusqliteRow, i: usize, ty: ColumnType| ty.read(from_sql(&row.values()[i]));
            read_rows(out, columns, *raw, &statement.sql, names, read).map(Reply::Rows)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(path: std::path::PathBuf, synchronous: Option<Synchronous>) -> Config {
        Config {
            path,
            max_connections: 1,
            busy_timeout: std::time::Duration::from_secs(1),
            acquire_timeout: std::time::Duration::from_secs(1),
            statement_cache: 4,
            look_for_answer: std::time::Duration::ZERO,
            synchronous,
        }
    }

    /// Starts that open one fresh file together each get it in WAL mode: a start whose mode
    /// change meets another connection's lock waits for it, up to the busy timeout, rather
    /// than failing with "database is locked".
    #[test]
    fn starts_that_open_one_fresh_file_together_all_set_wal() {
        for round in 0..10 {
            let dir = std::env::temp_dir().join(format!("rs-wal-{}-{round}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("a directory");
            let path = dir.join("wal.db");
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
            let opens: Vec<_> = (0..6)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        let conn = open(&config(path, None), true)?;
                        // Work at once, as a start's schema check and first claims do.
                        for _ in 0..20 {
                            conn.execute_batch(
                                "BEGIN IMMEDIATE; \
                                 CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY); \
                                 INSERT INTO t DEFAULT VALUES; COMMIT",
                            )
                            .map_err(|e| db_error(&e))?;
                        }
                        let mode: String = conn
                            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
                            .map_err(|e| db_error(&e))?;
                        Ok::<_, DbError>(mode)
                    })
                })
                .collect();
            for open in opens {
                let mode = open.join().expect("no panic").expect("every start opens");
                assert_eq!(mode, "wal", "round {round}");
            }
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// Each connection the pool opens takes the service's `synchronous`; unset, SQLite's
    /// default (`FULL`, 2) stays.
    #[test]
    fn connections_take_the_synchronous_mode_set() {
        let dir = std::env::temp_dir().join(format!("rs-sync-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let path = dir.join("sync.db");
        let read = |conn: &Connection| -> i64 {
            conn.query_row("PRAGMA synchronous", [], |r| r.get(0))
                .expect("the pragma")
        };
        let normal = open(&config(path.clone(), Some(Synchronous::Normal)), true).expect("open");
        assert_eq!(read(&normal), 1, "NORMAL");
        let later = open(&config(path.clone(), Some(Synchronous::Normal)), false).expect("open");
        assert_eq!(read(&later), 1, "every connection, not the first alone");
        let default = open(&config(path.clone(), None), false).expect("open");
        assert_eq!(read(&default), 2, "SQLite's default, FULL");
        let off = open(&config(path, Some(Synchronous::Off)), false).expect("open");
        assert_eq!(read(&off), 0, "OFF");
        let _ = std::fs::remove_dir_all(dir);
    }
}

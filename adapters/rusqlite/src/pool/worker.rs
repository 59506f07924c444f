//! A connection's worker thread: it opens its connection, then runs jobs from its queue
//! until it is told to close the connection; then it reports itself gone and its thread ends.
//! Between jobs it looks for the next one for a few tens of microseconds, yielding, before it
//! sleeps: a flow's next statement usually comes that soon, and waking a sleeping thread costs
//! as long.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use rusqlite::types::Value as SqlValue;
use ruststream_core::{Action, DbError, ErrorKind, Output, Reply, Row, Statement, Value};

use super::{Config, Job, Msg, Opening};
use crate::lock::CustomLock;
use crate::row::{RusqliteRow, column_index, db_error, from_sql, to_sql};

/// One connection's thread.
pub(super) struct Worker {
    pub(super) config: Arc<Config>,
    pub(super) slot: u64,
    pub(super) manager: mpsc::Sender<Msg>,
    pub(super) open: Arc<AtomicUsize>,
}

/// Reports the worker gone when its thread ends, however it ends.
struct GoneGuard {
    manager: mpsc::Sender<Msg>,
    slot: u64,
}

impl Drop for GoneGuard {
    fn drop(&mut self) {
        let _ = self.manager.send(Msg::Gone { slot: self.slot });
    }
}

/// An open connection, counted in the pool's open connections until it closes.
struct Live {
    conn: Option<Connection>,
    open: Arc<AtomicUsize>,
}

impl Live {
    fn conn(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("the connection is open until the worker ends")
    }

    fn close(&mut self) {
        if let Some(conn) = self.conn.take() {
            if let Err((_, error)) = conn.close() {
                tracing::warn!("closing a SQLite connection failed: {error}");
            }
            self.open.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.close();
    }
}

impl Worker {
    pub(super) fn run(self, opening: Opening, queue: mpsc::Receiver<Job>) {
        let guard = GoneGuard {
            manager: self.manager.clone(),
            slot: self.slot,
        };
        let start = matches!(opening, Opening::Start(_));
        let conn = match open(&self.config, start) {
            Ok(conn) => conn,
            Err(error) => {
                // Gone first, so the slot is free before the failure is known.
                drop(guard);
                match opening {
                    Opening::Acquire(reply) => {
                        let _ = reply.send(Reply::Failed(error));
                    }
                    Opening::Start(reply) => {
                        let _ = reply.send(Err(error.message));
                    }
                }
                return;
            }
        };
        self.open.fetch_add(1, Ordering::SeqCst);
        let interrupt = conn.get_interrupt_handle();
        let mut live = Live {
            conn: Some(conn),
            open: self.open.clone(),
        };
        // The manager learns of the connection before the core does, so a command after the
        // acquire's answer finds it.
        let _ = self.manager.send(Msg::Opened {
            slot: self.slot,
            interrupt,
        });
        match opening {
            Opening::Acquire(reply) => {
                let _ = reply.send(Reply::Done);
            }
            Opening::Start(reply) => {
                let _ = reply.send(Ok(()));
            }
        }
        while let Ok(job) = next_job(&queue) {
            match job {
                Job::Run {
                    action,
                    lock,
                    reply,
                } => {
                    let answer = run(live.conn(), action, lock);
                    let _ = reply.send(answer);
                }
                Job::Release { reply, exit } => {
                    reset(live.conn());
                    if exit {
                        live.close();
                        drop(guard);
                        let _ = reply.send(Reply::Done);
                        return;
                    }
                    let _ = reply.send(Reply::Done);
                }
                Job::Close { reply } => {
                    live.close();
                    drop(guard);
                    let _ = reply.send(Reply::Done);
                    return;
                }
                Job::Exit => break,
            }
        }
        live.close();
        drop(guard);
    }
}

/// How long a connection's thread looks for its next job before it sleeps until one comes.
/// A flow's next statement follows the answer of its last within tens of microseconds (the
/// broker handles the answer and sends the next); a thread that went to sleep meanwhile must
/// be woken, which on a loaded machine costs as long again.
const LOOK_BEFORE_SLEEP: Duration = Duration::from_micros(60);

/// The next job of a connection's thread: one already queued, or one that comes within
/// [`LOOK_BEFORE_SLEEP`] (the thread yields between looks), or else the next one, asleep.
fn next_job(queue: &mpsc::Receiver<Job>) -> Result<Job, mpsc::RecvError> {
    let since = Instant::now();
    loop {
        match queue.try_recv() {
            Ok(job) => return Ok(job),
            Err(mpsc::TryRecvError::Disconnected) => return Err(mpsc::RecvError),
            Err(mpsc::TryRecvError::Empty) if since.elapsed() < LOOK_BEFORE_SLEEP => {
                std::thread::yield_now();
            }
            Err(mpsc::TryRecvError::Empty) => return queue.recv(),
        }
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
        // WAL lets readers run beside the writer; an in-memory database answers `memory`.
        // The mode is the file's, so the first connection sets it for all.
        let _mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(failed)?;
    }
    Ok(conn)
}

/// Ends a transaction that a released connection left open, as a pool does.
fn reset(conn: &Connection) {
    if !conn.is_autocommit()
        && let Err(error) = conn.execute_batch("ROLLBACK")
    {
        tracing::warn!("rolling back a released SQLite connection failed: {error}");
    }
}

/// Runs a statement or a custom lock on `conn`.
fn run(conn: &Connection, action: Action, lock: Option<CustomLock>) -> Reply<RusqliteRow> {
    match action {
        Action::Execute { statement, binds } => match execute(conn, &statement, &binds) {
            Ok(reply) => reply,
            Err(error) => Reply::Failed(error),
        },
        Action::Lock { key, .. } => custom(conn, lock, &key, true),
        Action::Unlock { key, .. } => custom(conn, lock, &key, false),
        Action::Acquire | Action::Release | Action::Close => Reply::Failed(DbError::new(
            ErrorKind::Other,
            "the pool handles acquire, release and close itself",
        )),
    }
}

fn custom(
    conn: &Connection,
    lock: Option<CustomLock>,
    key: &str,
    take: bool,
) -> Reply<RusqliteRow> {
    let Some(lock) = lock else {
        return Reply::Failed(DbError::new(
            ErrorKind::Other,
            "the table has no custom lock (its description names no `own::Lock` and `own::Unlock`)",
        ));
    };
    let which = if take { "lock" } else { "unlock" };
    let answer = catch_unwind(AssertUnwindSafe(|| {
        if take {
            lock.lock(conn, key)
        } else {
            lock.unlock(conn, key)
        }
    }));
    match answer {
        Ok(Ok(b)) => Reply::Bool(b),
        Ok(Err(error)) => {
            let mut error = db_error(&error);
            error.message = format!(
                "the custom {which} of key `{key}` failed: {}",
                error.message
            );
            Reply::Failed(error)
        }
        Err(_) => Reply::Failed(DbError::new(
            ErrorKind::Other,
            format!("the custom {which} of key `{key}` panicked"),
        )),
    }
}

/// Runs a statement with its binds and reads the reply as its output says.
fn execute(
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
            let wanted = columns
                .iter()
                .map(|c| {
                    column_index(&names, c.name).ok_or_else(|| {
                        DbError::new(
                            ErrorKind::UndefinedColumn,
                            format!(
                                "the statement's rows have no column `{}`: {}",
                                c.name, statement.sql
                            ),
                        )
                    })
                })
                .collect::<Result<Vec<usize>, DbError>>()?;
            let mut out = Vec::new();
            let mut rows = stmt.raw_query();
            while let Some(row) = rows.next().map_err(sql_error)? {
                let values = (0..names.len())
                    .map(|i| row.get::<_, SqlValue>(i))
                    .collect::<rusqlite::Result<Vec<SqlValue>>>()
                    .map_err(sql_error)?;
                let read = wanted
                    .iter()
                    .zip(columns.iter())
                    .map(|(&i, c)| {
                        c.ty.read(from_sql(&values[i])).map_err(|e| {
                            DbError::new(
                                ErrorKind::Other,
                                format!(
                                    "column `{}` does not read as {}: {e}: {}",
                                    c.name,
                                    c.ty.name(),
                                    statement.sql
                                ),
                            )
                        })
                    })
                    .collect::<Result<Vec<Value>, DbError>>()?;
                out.push(Row {
                    values: read,
                    raw: raw.then(|| RusqliteRow::from_parts(names.clone(), values)),
                });
            }
            Ok(Reply::Rows(out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Synchronous;

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

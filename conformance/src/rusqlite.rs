//! The harness of the rusqlite adapter (feature `rusqlite`): SQLite, a new file per scenario,
//! and the suite's custom lock on rusqlite's connection.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ruststream::BrokerHandle;
use ruststream_core::Dialect;
use ruststream_rusqlite::RusqliteBroker;
use ruststream_rusqlite::rusqlite::{self, Connection, params};

use crate::harness::{Capabilities, Harness, HarnessFuture, HarnessResult, NoRowLocks, Support};
use crate::schema;

/// SQLite on rusqlite: each scenario gets a new database file under
/// `std::env::temp_dir()/ruststream-conformance`, removed once the scenario passed. The
/// harness's own SQL runs on a connection it opens for each call, on tokio's blocking threads.
#[derive(Clone, Debug)]
pub struct RusqliteHarness {
    dir: PathBuf,
}

impl Default for RusqliteHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl RusqliteHarness {
    /// The harness, with its files under the system's temporary directory.
    pub fn new() -> Self {
        Self::in_dir(std::env::temp_dir().join("ruststream-conformance"))
    }

    /// The harness, with its files in `dir`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }
}

/// The database file and its WAL companions.
fn files(db: &str) -> impl Iterator<Item = PathBuf> + '_ {
    ["", "-wal", "-shm", "-journal"]
        .into_iter()
        .map(move |suffix| PathBuf::from(format!("{db}{suffix}")))
}

fn open(db: &str) -> rusqlite::Result<Connection> {
    let conn = Connection::open(Path::new(db))?;
    conn.busy_timeout(Duration::from_secs(10))?;
    Ok(conn)
}

/// Runs `f` on a new connection to `db`, on a blocking thread.
fn blocking<T, F>(db: &str, f: F) -> HarnessFuture<'static, T>
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
{
    let db = db.to_owned();
    Box::pin(async move {
        tokio::task::spawn_blocking(move || -> HarnessResult<T> {
            let conn = open(&db)?;
            Ok(f(&conn)?)
        })
        .await?
    })
}

impl Harness for RusqliteHarness {
    type Adapter = RusqliteBroker;
    type RowLock = NoRowLocks;

    fn name(&self) -> &'static str {
        "rusqlite"
    }

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            hold_key: Support::No(
                "SQLite has no locks a session holds: the process keeps the keys in work",
            ),
            kill_connection: Support::No("SQLite has no server to kill a connection from"),
            kill_process: Support::Yes,
        }
    }

    fn prepare<'a>(&'a self, table: &'a str) -> HarnessFuture<'a, String> {
        let path = self.dir.join(format!("{table}-{}.db", std::process::id()));
        let dir = self.dir.clone();
        Box::pin(async move {
            std::fs::create_dir_all(&dir)?;
            let db = path.to_string_lossy().into_owned();
            for file in files(&db) {
                match std::fs::remove_file(&file) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(format!("cannot remove {}: {e}", file.display()).into()),
                }
            }
            Ok(db)
        })
    }

    fn broker(&self, db: &str) -> BrokerHandle<RusqliteBroker> {
        RusqliteBroker::open(db).handle()
    }

    fn execute<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, ()> {
        let sql = sql.to_owned();
        blocking(db, move |conn| conn.execute_batch(&sql))
    }

    fn query_i64s<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, Vec<i64>> {
        let sql = sql.to_owned();
        blocking(db, move |conn| {
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map([], |row| row.get::<_, i64>(0))?;
            rows.collect()
        })
    }

    fn cleanup<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, ()> {
        for file in files(db) {
            let _ = std::fs::remove_file(file);
        }
        Box::pin(async { Ok(()) })
    }
}

/// The connection's session: a random number kept in a temporary table, which lives as long as
/// the connection.
fn session(conn: &Connection) -> rusqlite::Result<i64> {
    conn.execute_batch("CREATE TEMP TABLE IF NOT EXISTS cf_session AS SELECT abs(random()) AS id")?;
    conn.query_row("SELECT id FROM temp.cf_session", [], |row| row.get(0))
}

/// The suite's custom lock (lock.md's `held_keys`, beside `table`): takes `key` unless it is
/// held, recording the session that took it, and logs the take.
pub(crate) fn lock(conn: &Connection, table: &str, key: &str) -> rusqlite::Result<bool> {
    let session = session(conn)?;
    let key_column = schema::key_column(Dialect::Sqlite);
    let taken = conn.execute(
        &format!(
            "INSERT OR IGNORE INTO {} ({key_column}, session) VALUES (?1, ?2)",
            schema::held_keys(table)
        ),
        params![key, session],
    )?;
    if taken == 1 {
        conn.execute(
            &format!(
                "INSERT INTO {} ({key_column}, session) VALUES (?1, ?2)",
                schema::lock_log(table)
            ),
            params![key, session],
        )?;
    }
    Ok(taken == 1)
}

/// The suite's custom unlock: releases `key`, and answers whether it was held.
pub(crate) fn unlock(conn: &Connection, table: &str, key: &str) -> rusqlite::Result<bool> {
    let released = conn.execute(
        &format!(
            "DELETE FROM {} WHERE {} = ?1",
            schema::held_keys(table),
            schema::key_column(Dialect::Sqlite)
        ),
        [key],
    )?;
    Ok(released == 1)
}

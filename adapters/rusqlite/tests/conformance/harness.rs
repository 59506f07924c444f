//! The harness of the rusqlite adapter: SQLite, a new file per scenario.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::session::RusqliteSession;
use ruststream::BrokerHandle;
use ruststream::FromContext;
use ruststream_conformance::session::Session;
use ruststream_conformance::{
    Capabilities, ClaimFuture, Harness, HarnessFuture, HarnessResult, NoRowLocks, SqliteFiles,
    Support,
};
use ruststream_core::Dialect;
use ruststream_rusqlite::rusqlite::{self, Connection};
use ruststream_rusqlite::{RusqliteBroker, RusqliteClaim, RusqliteOutbox};

/// SQLite on rusqlite: each scenario gets a new database file under
/// `std::env::temp_dir()/ruststream-conformance`, removed once the scenario passed. The
/// harness's own SQL runs on a connection it opens for each call, on tokio's blocking threads.
#[derive(Clone, Debug)]
pub struct RusqliteHarness {
    files: SqliteFiles,
}

impl Default for RusqliteHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl RusqliteHarness {
    /// The harness, with its files under the system's temporary directory.
    pub fn new() -> Self {
        Self {
            files: SqliteFiles::in_temp_dir("ruststream-conformance"),
        }
    }
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
            claim_in_lease: Support::No("rusqlite lends a claim in the advisory lock form only"),
        }
    }

    fn prepare<'a>(&'a self, table: &'a str) -> HarnessFuture<'a, String> {
        Box::pin(async move { self.files.fresh(table) })
    }

    fn broker(&self, db: &str) -> BrokerHandle<RusqliteBroker> {
        RusqliteBroker::open(db).handle()
    }

    fn publish_in_transaction<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
        sql: &'a str,
        messages: Vec<ruststream::Message>,
        end: ruststream_conformance::TxEnd,
    ) -> HarnessFuture<'a, ruststream::Published> {
        let (db, sql) = (db.to_owned(), sql.to_owned());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || -> HarnessResult<ruststream::Published> {
                let mut conn = open(&db)?;
                let tx = conn.transaction()?;
                tx.execute_batch(&sql)?;
                let published = RusqliteOutbox::<T>::new().publish_all(&tx, messages)?;
                match end {
                    ruststream_conformance::TxEnd::Commit => tx.commit()?,
                    ruststream_conformance::TxEnd::Rollback => tx.rollback()?,
                    ruststream_conformance::TxEnd::Crash => {
                        ruststream_conformance::abort_in_transaction()
                    }
                }
                Ok(published)
            })
            .await?
        })
    }

    fn publish_without_broker<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
        messages: Vec<ruststream::Message>,
    ) -> HarnessFuture<'a, ruststream::Published> {
        let db = db.to_owned();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || -> HarnessResult<ruststream::Published> {
                let conn = open(&db)?;
                Ok(RusqliteOutbox::<T>::new().publish_all(&conn, messages)?)
            })
            .await?
        })
    }

    fn outbox_stats<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
    ) -> HarnessFuture<'a, ruststream::Stats> {
        let db = db.to_owned();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || -> HarnessResult<ruststream::Stats> {
                Ok(RusqliteOutbox::<T>::new().stats(&open(&db)?)?)
            })
            .await?
        })
    }

    fn execute<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, ()> {
        let sql = sql.to_owned();
        blocking(db, move |conn| conn.execute_batch(&sql))
    }

    fn session<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, Box<dyn Session>> {
        let db = db.to_owned();
        Box::pin(async move {
            let conn = tokio::task::spawn_blocking(move || open(&db)).await??;
            Ok(Box::new(RusqliteSession(Arc::new(Mutex::new(conn)))) as Box<dyn Session>)
        })
    }

    fn query_i64s<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, Vec<i64>> {
        let sql = sql.to_owned();
        blocking(db, move |conn| {
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map([], |row| row.get::<_, i64>(0))?;
            rows.collect()
        })
    }

    fn write_in_claim<'a>(
        ctx: &'a mut ruststream::Context<'_, ruststream::InboxContext>,
        sql: String,
    ) -> ClaimFuture<'a> {
        Box::pin(async move {
            let claim = RusqliteClaim::from_context(ctx).await?;
            claim
                .call(move |conn: &mut Connection| conn.execute_batch(&sql))
                .await
                .ok_or_else(|| {
                    ruststream::HandlerOutcome::retry().with_error("the connection's thread ended")
                })?
                .map_err(|e| ruststream::HandlerOutcome::retry().with_error(e))
        })
    }

    fn cleanup<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, ()> {
        SqliteFiles::remove(db);
        Box::pin(async { Ok(()) })
    }
}

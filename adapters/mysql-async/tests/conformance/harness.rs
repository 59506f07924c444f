//! The harness of the mysql-async adapter: MariaDB (or MySQL) at `RUSTSTREAM_MYSQL_URL`
//! (default `mysql://root@127.0.0.1:3306/test`), a database of its own per scenario and
//! process.
//!
//! A lock name starts with the database's name (`keys::mysql_lock_name`): the database per
//! scenario keeps the suite's advisory keys apart from every other suite's on the server.

use crate::session::MySqlSession;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use ruststream::BrokerHandle;
use ruststream::FromContext;
use ruststream_conformance::session::Session;
use ruststream_conformance::urls::{self, database_of, with_database};
use ruststream_conformance::{
    Capabilities, ClaimFuture, Harness, HarnessFuture, HarnessResult, HeldKey, RowLocks, Support,
};
use ruststream_core::Dialect;
use ruststream_core::keys::mysql_lock_name;
use ruststream_mysql_async::{MySqlAsyncBroker, MySqlAsyncClaim, MySqlAsyncOutbox};

/// MariaDB on mysql_async: each scenario gets the database `<table>_m<pid>`, dropped once the
/// scenario passed. The harness's own SQL runs on a session it opens for each call.
#[derive(Clone, Debug)]
pub struct MySqlAsyncHarness {
    url: String,
}

impl Default for MySqlAsyncHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl MySqlAsyncHarness {
    /// The harness on `RUSTSTREAM_MYSQL_URL`.
    pub fn new() -> Self {
        Self { url: urls::mysql() }
    }
}

/// A session on `url`, or an error that names it.
async fn connect(url: &str) -> HarnessResult<Conn> {
    Conn::from_url(url).await.map_err(|e| {
        format!(
            "cannot reach MariaDB at {url} (set {}): {e}",
            urls::MYSQL_URL_VAR
        )
        .into()
    })
}

/// The lock name of `key` in the database `db` names.
fn lock_name(db: &str, key: &str) -> HarnessResult<String> {
    let database = database_of(db).ok_or_else(|| format!("{db} names no database"))?;
    Ok(mysql_lock_name(database, key))
}

/// A lock held on a session of the harness's own.
struct Held {
    conn: Conn,
    name: String,
}

impl HeldKey for Held {
    fn release(self: Box<Self>) -> HarnessFuture<'static, ()> {
        Box::pin(async move {
            let Held { mut conn, name } = *self;
            let released: Option<Option<i64>> = conn
                .exec_first("SELECT RELEASE_LOCK(?)", (name.as_str(),))
                .await?;
            conn.disconnect().await?;
            if released.flatten() != Some(1) {
                return Err(format!("the harness's session did not hold {name}").into());
            }
            Ok(())
        })
    }
}

impl Harness for MySqlAsyncHarness {
    type Adapter = MySqlAsyncBroker;
    type RowLock = RowLocks;

    fn name(&self) -> &'static str {
        "mysql-async"
    }

    fn dialect(&self) -> Dialect {
        Dialect::MariaDb
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            hold_key: Support::Yes,
            kill_connection: Support::Yes,
            kill_process: Support::Yes,
            claim_in_lease: Support::Yes,
        }
    }

    fn prepare<'a>(&'a self, table: &'a str) -> HarnessFuture<'a, String> {
        Box::pin(async move {
            let database = format!("{table}_m{}", std::process::id());
            let mut conn = connect(&self.url).await?;
            conn.query_drop("SET SESSION lock_wait_timeout = 10")
                .await?;
            conn.query_drop(format!("DROP DATABASE IF EXISTS {database}"))
                .await?;
            conn.query_drop(format!("CREATE DATABASE {database}"))
                .await?;
            conn.disconnect().await?;
            Ok(with_database(&self.url, &database))
        })
    }

    fn broker(&self, db: &str) -> BrokerHandle<MySqlAsyncBroker> {
        MySqlAsyncBroker::from_url(db).handle()
    }

    fn publish_in_transaction<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
        sql: &'a str,
        messages: Vec<ruststream::Message>,
        end: ruststream_conformance::TxEnd,
    ) -> HarnessFuture<'a, ruststream::Published> {
        Box::pin(async move {
            let mut conn = connect(db).await?;
            let mut tx = conn
                .start_transaction(mysql_async::TxOpts::default())
                .await?;
            tx.query_drop(sql).await?;
            let published = MySqlAsyncOutbox::<T>::new()
                .publish_all(&mut tx, messages)
                .await?;
            match end {
                ruststream_conformance::TxEnd::Commit => tx.commit().await?,
                ruststream_conformance::TxEnd::Rollback => tx.rollback().await?,
                ruststream_conformance::TxEnd::Crash => {
                    ruststream_conformance::abort_in_transaction()
                }
            }
            conn.disconnect().await?;
            Ok(published)
        })
    }

    fn publish_without_broker<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
        messages: Vec<ruststream::Message>,
    ) -> HarnessFuture<'a, ruststream::Published> {
        Box::pin(async move {
            let pool = mysql_async::Pool::new(mysql_async::Opts::from_url(db)?);
            let published = MySqlAsyncOutbox::<T>::new()
                .publish_on(&pool, messages)
                .await;
            pool.disconnect().await?;
            Ok(published?)
        })
    }

    fn outbox_stats<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
    ) -> HarnessFuture<'a, ruststream::Stats> {
        Box::pin(async move {
            let pool = mysql_async::Pool::new(mysql_async::Opts::from_url(db)?);
            let stats = MySqlAsyncOutbox::<T>::new().stats(&pool).await;
            pool.disconnect().await?;
            Ok(stats?)
        })
    }

    fn session<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, Box<dyn Session>> {
        Box::pin(async move { Ok(Box::new(MySqlSession(connect(db).await?)) as Box<dyn Session>) })
    }

    fn execute<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = connect(db).await?;
            conn.query_drop(sql).await?;
            conn.disconnect().await?;
            Ok(())
        })
    }

    fn query_i64s<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, Vec<i64>> {
        Box::pin(async move {
            let mut conn = connect(db).await?;
            let values: Vec<Option<i64>> = conn.query(sql).await?;
            conn.disconnect().await?;
            values
                .into_iter()
                .map(|v| v.ok_or_else(|| format!("`{sql}` answered NULL").into()))
                .collect()
        })
    }

    fn hold_key<'a>(&'a self, db: &'a str, key: &'a str) -> HarnessFuture<'a, Box<dyn HeldKey>> {
        Box::pin(async move {
            let name = lock_name(db, key)?;
            let mut conn = connect(db).await?;
            let taken: Option<Option<i64>> = conn
                .exec_first("SELECT GET_LOCK(?, 0)", (name.as_str(),))
                .await?;
            if taken.flatten() != Some(1) {
                return Err(format!("GET_LOCK('{name}', 0) answered {taken:?}").into());
            }
            Ok(Box::new(Held { conn, name }) as Box<dyn HeldKey>)
        })
    }

    fn kill_key_holder<'a>(&'a self, db: &'a str, key: &'a str) -> HarnessFuture<'a, bool> {
        Box::pin(async move {
            let name = lock_name(db, key)?;
            let mut conn = connect(db).await?;
            let holder: Option<Option<i64>> = conn
                .exec_first("SELECT IS_USED_LOCK(?)", (name.as_str(),))
                .await?;
            let holder = holder.flatten();
            if let Some(holder) = holder {
                conn.query_drop(format!("KILL CONNECTION {holder}")).await?;
            }
            conn.disconnect().await?;
            Ok(holder.is_some())
        })
    }

    fn write_in_claim<'a>(
        ctx: &'a mut ruststream::Context<'_, ruststream::InboxContext>,
        sql: String,
    ) -> ClaimFuture<'a> {
        Box::pin(async move {
            let mut claim = MySqlAsyncClaim::from_context(ctx).await?;
            claim
                .query_drop(sql)
                .await
                .map_err(|e| ruststream::HandlerOutcome::retry().with_error(e))
        })
    }

    fn cleanup<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, ()> {
        Box::pin(async move {
            if let Some(database) = database_of(db) {
                let mut conn = connect(&self.url).await?;
                conn.query_drop("SET SESSION lock_wait_timeout = 10")
                    .await?;
                conn.query_drop(format!("DROP DATABASE IF EXISTS {database}"))
                    .await?;
                conn.disconnect().await?;
            }
            Ok(())
        })
    }
}

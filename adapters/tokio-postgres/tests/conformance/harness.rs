//! The harness of the tokio-postgres adapter: PostgreSQL at `RUSTSTREAM_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), a schema of its own per scenario and process.

use crate::session::PgSession;
use ruststream::BrokerHandle;
use ruststream::FromContext;
use ruststream_conformance::session::Session;
use ruststream_conformance::urls::{self, search_path_of, with_search_path};
use ruststream_conformance::{
    Capabilities, ClaimFuture, Harness, HarnessFuture, HarnessResult, HeldKey, RowLocks, Support,
    TxEnd,
};
use ruststream_core::Dialect;
use ruststream_core::keys::postgres_key_hash;
use ruststream_tokio_postgres::deadpool_postgres::{Manager, Pool, PoolConfig};
use ruststream_tokio_postgres::tokio_postgres::{self, Client, NoTls, SimpleQueryMessage};
use ruststream_tokio_postgres::{TokioPostgresBroker, TokioPostgresClaim, TokioPostgresOutbox};

/// PostgreSQL on tokio-postgres. Each scenario gets the schema `<table>_x<pid>` (`_s<pid>` under
/// the simple query protocol), on the search path of every session the locator's URL opens (the
/// broker's and the harness's own), so the suite's unqualified table names land there; the
/// schema is dropped once the scenario passed.
#[derive(Clone, Debug)]
pub struct TokioPostgresHarness {
    url: String,
    simple: bool,
}

impl Default for TokioPostgresHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl TokioPostgresHarness {
    /// The harness on `RUSTSTREAM_PG_URL`, under the extended query protocol.
    pub fn new() -> Self {
        Self {
            url: urls::postgres(),
            simple: false,
        }
    }

    /// The same harness, its brokers under the simple query protocol. Advisory keys are the
    /// database's, not the schema's: run it in a test binary of its own, not beside the
    /// extended protocol's suite in the same process.
    #[allow(dead_code, reason = "only the target conformance_simple uses it")]
    pub fn simple_query(mut self, simple: bool) -> Self {
        self.simple = simple;
        self
    }
}

/// A session on `url`, or an error that names it.
async fn connect(url: &str) -> HarnessResult<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(|e| {
        format!(
            "cannot reach PostgreSQL at {url} (set {}): {e}",
            urls::PG_URL_VAR
        )
    })?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The key held on a connection of the harness's own.
struct Held {
    client: Client,
    key: i64,
}

impl HeldKey for Held {
    fn release(self: Box<Self>) -> HarnessFuture<'static, ()> {
        Box::pin(async move {
            self.client
                .query_one("SELECT pg_advisory_unlock($1)", &[&self.key])
                .await?;
            Ok(())
        })
    }
}

impl Harness for TokioPostgresHarness {
    type Adapter = TokioPostgresBroker;
    type RowLock = RowLocks;

    fn name(&self) -> &'static str {
        if self.simple {
            "tokio-postgres (simple query protocol)"
        } else {
            "tokio-postgres"
        }
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
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
            let protocol = if self.simple { "s" } else { "x" };
            let schema = format!("{table}_{protocol}{}", std::process::id());
            let client = connect(&self.url).await?;
            client
                .batch_execute(&format!(
                    "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
                ))
                .await?;
            Ok(with_search_path(&self.url, &schema))
        })
    }

    fn broker(&self, db: &str) -> BrokerHandle<TokioPostgresBroker> {
        TokioPostgresBroker::from_url(db, PoolConfig::new(16))
            .simple_query(self.simple)
            .handle()
    }

    fn publish_in_transaction<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
        sql: &'a str,
        messages: Vec<ruststream::Message>,
        end: TxEnd,
    ) -> HarnessFuture<'a, ruststream::Published> {
        Box::pin(async move {
            let mut client = connect(db).await?;
            let tx = client.transaction().await?;
            tx.batch_execute(sql).await?;
            let published = TokioPostgresOutbox::<T>::new()
                .publish_all(&tx, messages)
                .await?;
            match end {
                TxEnd::Commit => tx.commit().await?,
                TxEnd::Rollback => tx.rollback().await?,
                TxEnd::Crash => ruststream_conformance::abort_in_transaction(),
            }
            Ok(published)
        })
    }

    fn publish_without_broker<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
        messages: Vec<ruststream::Message>,
    ) -> HarnessFuture<'a, ruststream::Published> {
        Box::pin(async move {
            let config: tokio_postgres::Config = db.parse()?;
            let manager = Manager::new(config, NoTls);
            let pool = Pool::builder(manager).max_size(2).build()?;
            let published = TokioPostgresOutbox::<T>::new()
                .publish_on(&pool, messages)
                .await;
            pool.close();
            Ok(published?)
        })
    }

    fn outbox_stats<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
    ) -> HarnessFuture<'a, ruststream::Stats> {
        Box::pin(async move {
            let config: tokio_postgres::Config = db.parse()?;
            let pool = Pool::builder(Manager::new(config, NoTls))
                .max_size(2)
                .build()?;
            let stats = TokioPostgresOutbox::<T>::new().stats(&pool).await;
            pool.close();
            Ok(stats?)
        })
    }

    fn execute<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, ()> {
        Box::pin(async move {
            connect(db).await?.batch_execute(sql).await?;
            Ok(())
        })
    }

    fn session<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, Box<dyn Session>> {
        Box::pin(async move { Ok(Box::new(PgSession(connect(db).await?)) as Box<dyn Session>) })
    }

    fn query_i64s<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, Vec<i64>> {
        Box::pin(async move {
            let messages = connect(db).await?.simple_query(sql).await?;
            messages
                .into_iter()
                .filter_map(|m| match m {
                    SimpleQueryMessage::Row(row) => Some(row),
                    _ => None,
                })
                .map(|row| -> HarnessResult<i64> {
                    let text = row.get(0).ok_or_else(|| format!("`{sql}` answered NULL"))?;
                    Ok(text
                        .parse::<i64>()
                        .map_err(|e| format!("`{sql}` answered {text}: {e}"))?)
                })
                .collect()
        })
    }

    fn hold_key<'a>(&'a self, db: &'a str, key: &'a str) -> HarnessFuture<'a, Box<dyn HeldKey>> {
        Box::pin(async move {
            let client = connect(db).await?;
            let key = postgres_key_hash(key);
            client
                .query_one("SELECT pg_advisory_lock($1)", &[&key])
                .await?;
            Ok(Box::new(Held { client, key }) as Box<dyn HeldKey>)
        })
    }

    fn kill_key_holder<'a>(&'a self, db: &'a str, key: &'a str) -> HarnessFuture<'a, bool> {
        Box::pin(async move {
            // A 64-bit advisory key is `classid` (its high half) and `objid` (its low half),
            // `objsubid` 1, in the current database (another database's lock of the same key,
            // such as the sqlx suite's, is not this one).
            let hash = postgres_key_hash(key) as u64;
            let (high, low) = (hash >> 32, hash & 0xffff_ffff);
            let killed = self
                .query_i64s(
                    db,
                    &format!(
                        "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_locks \
                         WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
                         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                         AND classid = {high}::bigint::oid AND objid = {low}::bigint::oid) k"
                    ),
                )
                .await?;
            Ok(killed.first().copied().unwrap_or(0) > 0)
        })
    }

    fn write_in_claim<'a>(
        ctx: &'a mut ruststream::Context<'_, ruststream::InboxContext>,
        sql: String,
    ) -> ClaimFuture<'a> {
        Box::pin(async move {
            let claim = TokioPostgresClaim::from_context(ctx).await?;
            claim
                .batch_execute(&sql)
                .await
                .map_err(|e| ruststream::HandlerOutcome::retry().with_error(e))
        })
    }

    fn cleanup<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, ()> {
        Box::pin(async move {
            if let Some(schema) = search_path_of(db) {
                connect(&self.url)
                    .await?
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                    .await?;
            }
            Ok(())
        })
    }
}

//! What the dashboard's tests share: a PostgreSQL schema of the test's own, a table of jobs
//! with failed rows kept, a broker started on it, and rows published and marked failed by
//! hand.
//!
//! An unreachable database fails the test with a message naming its URL: nothing is skipped.

#![allow(dead_code)]

use std::time::{Duration, Instant, SystemTime};

use ruststream::{Inbox, InboxTable, Message, RunningBroker};
use ruststream_sqlx::{SqlxBroker, sqlx};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, Postgres};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// The table of the tests' jobs: due times, leases, failed rows with their error.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(
    table = "web_jobs",
    locked_until = "locked_until",
    due = "due_at",
    failed_at = "failed_at",
    error = "error",
    errors = "errors"
)]
pub struct WebJob {
    #[field(id, generated)]
    pub id: i64,
    #[field(attempt)]
    pub attempt: i32,
    #[field(payload)]
    pub payload: Vec<u8>,
}

pub const TABLE: &str = "web_jobs";

pub fn pg_url() -> String {
    std::env::var("RUSTSTREAM_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A PostgreSQL schema of the test's own, holding `web_jobs`.
pub struct Pg {
    pub schema: String,
    pub url: String,
    pub options: PgConnectOptions,
    pub admin: sqlx::PgPool,
}

impl Pg {
    pub async fn new(test: &str) -> Pg {
        let url = pg_url();
        let base: PgConnectOptions = url
            .parse()
            .unwrap_or_else(|e| panic!("RUSTSTREAM_PG_URL `{url}` does not parse: {e}"));
        let schema = format!("rs_web_{test}_{}", std::process::id());
        let mut root = PgConnection::connect_with(&base).await.unwrap_or_else(|e| {
            panic!("PostgreSQL at {url} is unreachable (set RUSTSTREAM_PG_URL): {e}")
        });
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
        )))
        .execute(&mut root)
        .await
        .unwrap_or_else(|e| panic!("create schema {schema} at {url}: {e}"));
        root.close().await.ok();
        let options = base
            .options([("search_path", schema.as_str())])
            .application_name(&schema);
        let admin = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options.clone())
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {url} is unreachable: {e}"));
        let pg = Pg {
            schema,
            url,
            options,
            admin,
        };
        let ddl = WebJob::TABLE
            .ddl(ruststream::core::Dialect::Postgres)
            .to_string();
        pg.exec(&ddl).await;
        pg
    }

    pub fn broker(&self) -> SqlxBroker<Postgres> {
        SqlxBroker::from_connect_options(
            self.options.clone(),
            PgPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(10)),
        )
    }

    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    pub async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Whether row `id` is marked failed.
    pub async fn is_failed(&self, id: i64) -> bool {
        self.scalar(&format!(
            "SELECT COUNT(*) FROM {TABLE} WHERE id = {id} AND failed_at IS NOT NULL"
        ))
        .await
            == 1
    }

    /// Whether row `id` exists.
    pub async fn exists(&self, id: i64) -> bool {
        self.scalar(&format!("SELECT COUNT(*) FROM {TABLE} WHERE id = {id}"))
            .await
            == 1
    }

    pub async fn drop(self) {
        self.admin.close().await;
        let mut root = PgConnection::connect(&self.url).await.expect("reconnect");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            self.schema
        )))
        .execute(&mut root)
        .await
        .expect("drop the schema");
        root.close().await.ok();
    }
}

/// Row 8's history of errors: two attempts, the second its last error.
pub const ERRORS_8: &str = r#"[{"attempt": 1, "at": 1765000000000000, "error": "boom earlier"}, {"attempt": 2, "at": 1765000001000000, "error": "boom 8"}]"#;

/// Starts a broker with no subscription on the test's schema and fills `web_jobs`: rows 1 to
/// 5 due now, rows 6 to 8 due in an hour, of which 6 and 8 failed with the errors `boom 6`
/// and `boom 8` (row 8 with a history of two errors). The counts: 5 due, 1 scheduled, none in work, 2 failed.
pub async fn started(pg: &Pg) -> RunningBroker<SqlxBroker<Postgres>> {
    let running = pg
        .broker()
        .start(Vec::new())
        .await
        .unwrap_or_else(|e| panic!("the broker starts: {e}"));
    let publisher = running.publisher::<WebJob>();
    publisher
        .publish_all((0..5).map(|n| Message::bytes(format!(r#"{{"n":{n}}}"#).into_bytes())))
        .await
        .expect("publishes");
    let later = SystemTime::now() + Duration::from_secs(3600);
    publisher
        .publish_all(
            (5..8).map(|n| Message::bytes(format!(r#"{{"n":{n}}}"#).into_bytes()).due_at(later)),
        )
        .await
        .expect("publishes for later");
    pg.exec(&format!(
        "UPDATE {TABLE} SET failed_at = now(), error = 'boom ' || id WHERE id IN (6, 8)"
    ))
    .await;
    pg.exec(&format!(
        "UPDATE {TABLE} SET errors = '{ERRORS_8}' WHERE id = 8"
    ))
    .await;
    running
}

/// Waits until `check` holds, for up to ten seconds.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

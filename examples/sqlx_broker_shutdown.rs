//! The broker's shutdown ([shutdown](https://github.com/ruststream/ruststream/blob/main/docs/src/shutdown.md)): `run` returns once the handlers have drained and the
//! broker has shut down and closed the pool it built.
//!
//! ```sh
//! cargo run --example sqlx_broker_shutdown
//! ```
//!
//! The service runs on `exports.db` until SIGINT or SIGTERM, and exports the accounts of
//! `exports`, rows such as `INSERT INTO exports (account_id, payload) VALUES (7, '{"account":7}')`,
//! one at a time per account. On SIGTERM the exports in work finish before `run` returns.
//!
//! The table holds only what the example shows: it names no `failed_at` column, so a job
//! that fails returns to the queue. A table of yours names `failed_at` and `error` too, so a
//! job that keeps failing is kept aside ([Failures](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#failed-rows-are-kept)).

use ruststream::core::Dialect;
use ruststream_sqlx::prelude::*;
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{AssertSqlSafe, Connection};

/// The service on the database `url` names.
pub fn service(url: &str) -> RustStream {
    let schema_url = url.to_owned();
    // Nothing connects here: the broker builds its pool when the service starts, and closes it
    // when the service stops, after the handlers have drained.
    let broker = SqlxBroker::from_url(url, SqlitePoolOptions::new());
    RustStream::new(AppInfo::new("exports", "0.1.0"))
        // The table, created before the subscription checks it.
        .on_startup(async move |()| {
            let mut conn = SqliteConnection::connect(&schema_url).await?;
            sqlx::raw_sql(AssertSqlSafe(schema()))
                .execute(&mut conn)
                .await?;
            conn.close().await
        })
        .with_broker(broker.route::<Export>("exports"), |b| {
            b.include(export);
        })
}

#[ruststream::app]
fn app() -> impl App {
    service("sqlite:exports.db?mode=rwc")
}

/// One row of `exports`, held by the key of its account while it is in work.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(table = "exports", advisory_lock = "exports-{account_id}")]
struct Export {
    #[field(id, generated)]
    id: i64,
    account_id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The message of a row: the account to export.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The account.
    pub account: i64,
}

/// An export takes a while; at shutdown, the exports in work finish before `run` returns.
#[subscriber(InboxQueue::<Export>::new("exports"))]
async fn export(report: &Report) -> HandlerOutcome {
    tracing::info!(report.account, "exporting");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    tracing::info!(report.account, "exported");
    HandlerOutcome::ack()
}

/// The table, as its description writes it; `account_id`, the key's column, holds integers.
fn schema() -> String {
    Export::TABLE
        .ddl(Dialect::Sqlite)
        .column_type("account_id", "INTEGER NOT NULL")
        .to_string()
}

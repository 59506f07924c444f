//! The broker's shutdown ([shutdown](https://github.com/ruststream/ruststream/blob/main/docs/src/shutdown.md)) by hand: `run` returns once the handlers have drained
//! and the broker has shut down and closed the pool it built.
//!
//! ```sh
//! cargo run --example manual_sqlx_broker_shutdown
//! ```
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
            let export = subscriber("exports", Exporter)
                .map_source(|_| InboxQueue::<Export>::new("exports"));
            b.include(export.build());
        })
}

#[ruststream::app]
fn app() -> impl App {
    service("sqlite:exports.db?mode=rwc")
}

/// One row of `exports`, held by the key of its account while it is in work.
#[derive(sqlx::FromRow)]
struct Export {
    id: i64,
    payload: Vec<u8>,
}

impl InboxTable for Export {
    type Id = i64;
    type Table = InboxSpec<(Advisory, Payload)>;
    const TABLE: Self::Table = InboxSpec::new("exports", Column::new("id").generated())
        .advisory(&[KeyPart::Literal("exports-"), KeyPart::Column("account_id")])
        .payload(Column::new("payload"));

    fn id(&self) -> &i64 {
        &self.id
    }
}

impl PayloadRow for Export {
    type Column = Vec<u8>;

    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

/// The message of a row: the account to export.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The account.
    pub account: i64,
}

/// An export takes a while; at shutdown, the exports in work finish before `run` returns.
struct Exporter;

impl Handle<Report> for Exporter {
    async fn handle(
        &self,
        report: &Report,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        tracing::info!(report.account, "exporting");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        tracing::info!(report.account, "exported");
        Ok(())
    }
}

/// The table, as its description writes it; `account_id`, the key's column, holds integers.
fn schema() -> String {
    Export::TABLE
        .ddl(Dialect::Sqlite)
        .column_type("account_id", "INTEGER NOT NULL")
        .to_string()
}

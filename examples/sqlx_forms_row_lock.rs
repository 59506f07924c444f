//! The row lock form (forms.md): four workers issue invoices on PostgreSQL; each holds its
//! row's lock and a connection of the pool until its acknowledgement commits.
//!
//! ```sh
//! PGHOST=127.0.0.1 PGUSER=postgres PGDATABASE=test cargo run --example sqlx_forms_row_lock
//! ```
//!
//! The service runs until SIGINT or SIGTERM and issues the invoices of `invoice_jobs`, rows
//! such as `INSERT INTO invoice_jobs (payload) VALUES (convert_to('{"number": 1}', 'UTF8'))`.

use ruststream_sqlx::prelude::*;
use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;

/// One row of `invoice_jobs`. No `locked_until` and no `advisory_lock`: the row lock form.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(table = "invoice_jobs")]
struct IssueInvoice {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The claim's transaction holds the row while the handler runs; the acknowledgement deletes
/// the row and commits. A crash rolls the transaction back, and the row returns at once.
#[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
async fn issue(invoice: &Invoice) -> HandlerOutcome {
    tracing::info!(invoice.number, "issuing an invoice");
    HandlerOutcome::ack()
}

/// The service on the database `options` reach.
pub fn service(options: PgConnectOptions) -> RustStream {
    let schema = options.clone();
    // Nothing connects here: the broker builds its pool when the service starts.
    let broker = SqlxBroker::from_connect_options(options, PgPoolOptions::new());
    RustStream::new(AppInfo::new("billing", "0.1.0"))
        // The table, created before the subscription checks it.
        .on_startup(async move |()| {
            let mut conn = PgConnection::connect_with(&schema).await?;
            sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
            conn.close().await
        })
        .with_broker(broker.route::<IssueInvoice>("invoices"), |b| {
            // Each of the four workers holds a connection while its invoice is in work.
            b.include(issue.workers(nonzero!(4)));
        })
}

/// The message of a row: the invoice to issue.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Invoice {
    /// The invoice's number.
    pub number: u64,
}

/// The table.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS invoice_jobs (
    id BIGSERIAL PRIMARY KEY,
    payload BYTEA NOT NULL
)";

/// The service on the database the `PG*` environment variables name (`PGHOST`, `PGPORT`,
/// `PGUSER`, `PGPASSWORD`, `PGDATABASE`), until SIGINT or SIGTERM.
#[ruststream::app]
fn app() -> impl App {
    service(PgConnectOptions::new())
}

//! The row lock form ([the row lock form](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#the-row-lock-form)): four workers issue invoices on PostgreSQL; each holds its
//! row's lock and a connection of the pool until its acknowledgement commits.
//!
//! ```sh
//! PGHOST=127.0.0.1 PGUSER=postgres PGDATABASE=test cargo run --example sqlx_forms_row_lock
//! ```
//!
//! The service runs until SIGINT or SIGTERM and issues the invoices of `invoice_jobs`, rows
//! such as `INSERT INTO invoice_jobs (payload) VALUES (convert_to('{"number": 1}', 'UTF8'))`.
//!
//! The table holds only what the example shows: it names no `failed_at` column, so a job
//! that fails returns to the queue. A table of yours names `failed_at` and `error` too, so a
//! job that keeps failing is kept aside ([Failures](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#failed-rows-are-kept)).

use ruststream_sqlx::prelude::*;
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
    // Nothing connects here: the broker builds its pool when the service starts.
    let broker = SqlxBroker::from_connect_options(options, PgPoolOptions::new());
    RustStream::new(AppInfo::new("billing", "0.1.0")).with_broker(
        broker.route::<IssueInvoice>("invoices"),
        |b| {
            // Each of the four workers holds a connection while its invoice is in work. The
            // start creates the table, as its description writes it, where it is missing.
            b.include(issue.workers(nonzero!(4)).ensure_schema());
        },
    )
}

/// The message of a row: the invoice to issue.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Invoice {
    /// The invoice's number.
    pub number: u64,
}

/// The service on the database the `PG*` environment variables name (`PGHOST`, `PGPORT`,
/// `PGUSER`, `PGPASSWORD`, `PGDATABASE`), until SIGINT or SIGTERM.
#[ruststream::app]
fn app() -> impl App {
    service(PgConnectOptions::new())
}

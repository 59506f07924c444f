//! The row lock form ([the row lock form](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#the-row-lock-form)) by hand: four workers issue invoices on PostgreSQL; each holds
//! its row's lock and a connection of the pool until its acknowledgement commits.
//!
//! ```sh
//! PGHOST=127.0.0.1 PGUSER=postgres PGDATABASE=test cargo run --example manual_sqlx_forms_row_lock
//! ```
//!
//! The table holds only what the example shows: it names no `failed_at` column, so a job
//! that fails returns to the queue. A table of yours names `failed_at` and `error` too, so a
//! job that keeps failing is kept aside ([Failures](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#failed-rows-are-kept)).

use ruststream_sqlx::prelude::*;
use sqlx::postgres::PgPoolOptions;

/// One row of `invoice_jobs`. No `.lease(..)` and no `.advisory(..)`: the row lock form.
#[derive(sqlx::FromRow)]
struct IssueInvoice {
    id: i64,
    payload: Vec<u8>,
}

impl InboxTable for IssueInvoice {
    type Id = i64;
    type Table = InboxSpec<(Payload,)>;
    const TABLE: Self::Table = InboxSpec::new("invoice_jobs", Column::new("id").generated())
        .payload(Column::new("payload"));

    fn id(&self) -> &i64 {
        &self.id
    }
}

impl PayloadRow for IssueInvoice {
    type Column = Vec<u8>;

    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

/// The claim's transaction holds the row while the handler runs; the acknowledgement deletes
/// the row and commits. A crash rolls the transaction back, and the row returns at once.
struct Issue;

impl Handle<Invoice> for Issue {
    fn handle(
        &self,
        invoice: &Invoice,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        tracing::info!(invoice.number, "issuing an invoice");
        ready(Ok(()))
    }
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
            let issue = subscriber("invoices", Issue)
                .map_source(|_| InboxQueue::<IssueInvoice>::new("invoices"))
                .workers(nonzero!(4))
                .ensure_schema();
            b.include(issue.build());
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

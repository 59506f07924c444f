use ruststream_sqlx::prelude::*;
use sqlx::postgres::PgPoolOptions;

/// No `locked_until` and no `advisory_lock`: the row lock form.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(table = "invoice_jobs")]
struct IssueInvoice {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

#[derive(serde::Deserialize)]
struct Invoice {
    number: i64,
}

#[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
async fn issue(invoice: &Invoice) -> HandlerOutcome {
    let _ = invoice.number;
    HandlerOutcome::ack()
}

fn main() {
    let broker = SqlxBroker::from_url("postgres://localhost/billing", PgPoolOptions::new());
    let _ = RustStream::new(AppInfo::new("billing", "0.1.0")).with_broker(broker, |b| {
        b.include(issue);
    });
}

use ruststream_sqlx::prelude::*;
use sqlx::postgres::PgPoolOptions;

#[derive(serde::Serialize, serde::Deserialize)]
struct Report {
    account: i64,
    month: String,
}

#[derive(serde::Deserialize)]
struct Invoice {
    number: i64,
}

/// The payload holds a `Report`.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(table = "reports", advisory_lock = "reports-{account}", message = Report)]
struct ReportJob {
    #[field(id, generated)]
    id: i64,
    account: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// Decodes an `Invoice` from a table of reports.
#[subscriber(InboxQueue::<ReportJob>::new("reports"))]
async fn bill(invoice: &Invoice) -> HandlerOutcome {
    let _ = invoice.number;
    HandlerOutcome::ack()
}

fn main() {
    let broker = SqlxBroker::from_url("postgres://localhost/test", PgPoolOptions::new());
    let _ = RustStream::new(AppInfo::new("billing", "0.1.0")).with_broker(broker, |b| {
        b.include(bill);
    });
}

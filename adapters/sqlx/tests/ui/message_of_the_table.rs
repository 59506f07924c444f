use ruststream_sqlx::prelude::*;
use sqlx::postgres::PgPoolOptions;

#[derive(serde::Serialize, serde::Deserialize)]
struct Report {
    account: i64,
    month: String,
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

/// Decodes the table's `Report`.
#[subscriber(InboxQueue::<ReportJob>::new("reports"))]
async fn file(report: &Report) -> HandlerOutcome {
    let _ = (report.account, &report.month);
    HandlerOutcome::ack()
}

fn main() {
    let broker = SqlxBroker::from_url("postgres://localhost/test", PgPoolOptions::new());
    let _ = RustStream::new(AppInfo::new("reports", "0.1.0")).with_broker(broker, |b| {
        b.include(file);
    });
}

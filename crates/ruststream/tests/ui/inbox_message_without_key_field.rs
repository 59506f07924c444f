// A table's message lacks a field its advisory key reads.
use ruststream::Inbox;

#[derive(serde::Serialize)]
struct Report {
    month: String,
}

#[derive(Inbox)]
#[inbox(table = "reports", advisory_lock = "reports-{account}", message = Report)]
struct ReportJob {
    #[field(id, generated)]
    id: i64,
    account: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

fn main() {}

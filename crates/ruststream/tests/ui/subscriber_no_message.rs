// A subscriber that takes no message.
use ruststream::{HandlerOutcome, Inbox, InboxQueue, subscriber};

#[derive(Inbox)]
#[inbox(table = "invoice_jobs")]
struct IssueInvoice {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

#[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
async fn issue() -> HandlerOutcome {
    HandlerOutcome::ack()
}

fn main() {}

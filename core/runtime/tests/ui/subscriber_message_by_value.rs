// A subscriber that takes its message by value, and one that takes it mutably.
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
async fn issue(invoice: String) -> HandlerOutcome {
    let _ = invoice;
    HandlerOutcome::ack()
}

#[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
async fn amend(invoice: &mut String) -> HandlerOutcome {
    let _ = invoice;
    HandlerOutcome::ack()
}

fn main() {}

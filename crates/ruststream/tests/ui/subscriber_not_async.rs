// A subscriber that is not `async`.
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
fn issue(invoice: &String) -> HandlerOutcome {
    let _ = invoice;
    HandlerOutcome::ack()
}

fn main() {}

// More subscriber mistakes: no source, a source whose type cannot be read, no return type, a
// body that does not answer a `HandlerOutcome`.
use ruststream::{HandlerOutcome, Inbox, InboxQueue, subscriber};

#[derive(Inbox)]
#[inbox(table = "invoice_jobs")]
struct IssueInvoice {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

fn invoices() -> InboxQueue<IssueInvoice> {
    InboxQueue::new("invoices")
}

#[subscriber]
async fn no_source(invoice: &String) -> HandlerOutcome {
    let _ = invoice;
    HandlerOutcome::ack()
}

#[subscriber(invoices())]
async fn unreadable(invoice: &String) -> HandlerOutcome {
    let _ = invoice;
    HandlerOutcome::ack()
}

#[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
async fn no_outcome(invoice: &String) {
    let _ = invoice;
}

#[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
async fn wrong_outcome(invoice: &String) -> bool {
    invoice.is_empty()
}

fn main() {}

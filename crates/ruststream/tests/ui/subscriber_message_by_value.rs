// A subscriber that takes its message mutably, and one that takes by value a message that
// is not `Clone`.
use ruststream::{HandlerOutcome, Inbox, InboxQueue, subscriber};

#[derive(Inbox)]
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
async fn amend(invoice: &mut String) -> HandlerOutcome {
    let _ = invoice;
    HandlerOutcome::ack()
}

#[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
async fn issue(invoice: Invoice) -> Result<(), std::io::Error> {
    let _ = invoice.number;
    Ok(())
}

fn main() {}

// The attempt of a table whose description has no attempt column: through `Ctx` or `Job`.
use ruststream::{Ctx, HandlerOutcome, Inbox, InboxQueue, Job, keys, subscriber};

#[derive(Inbox)]
#[inbox(table = "invoice_jobs")]
struct IssueInvoice {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

#[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
async fn by_ctx(invoice: &String, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
    let _ = (invoice, attempt);
    HandlerOutcome::ack()
}

#[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
async fn by_job(invoice: &String, job: Job<IssueInvoice>) -> HandlerOutcome {
    let _ = (invoice, job.attempt());
    HandlerOutcome::ack()
}

fn main() {}

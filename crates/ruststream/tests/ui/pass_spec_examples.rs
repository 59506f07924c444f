// The examples of the macros compile, with an adapter that stands in for a database driver:
// the rows of the row lock form, the advisory form and a custom lock (the guide's forms.md and
// keys.md), their subscribers, the brokers that include them, and `#[ruststream::app]` (the
// guide's shutdown.md), whose `main` runs the app.
use std::future::Future;

use ruststream::adapter::{Adapter, AdapterError, TakesRows};
use ruststream::core::{Command, Dialect, Reply};
use ruststream::exec::BoxFuture;
use ruststream::{
    App, AppInfo, BrokerHandle, Ctx, HandlerOutcome, Inbox, InboxQueue, RunError, RustStream,
    keys, nonzero, subscriber,
};

/// Stands in for `SqlxBroker`: takes every row type, never started.
struct Broker;

impl Adapter for Broker {
    type Row = ();
    type Lock = ();

    fn start(&self) -> BoxFuture<Result<Dialect, AdapterError>> {
        Box::pin(async { Err(AdapterError::new("never started")) })
    }

    fn execute(&self, _: Command, _: Option<()>) -> BoxFuture<Reply<()>> {
        Box::pin(std::future::pending())
    }

    fn close(&self) -> BoxFuture<()> {
        Box::pin(async {})
    }
}

impl<T> TakesRows<T> for Broker {
    fn decode((): ()) -> Result<T, String> {
        Err("never started".into())
    }

    fn custom_lock() -> Option<()> {
        None
    }
}

#[derive(serde::Deserialize)]
struct Invoice {
    number: u32,
}

#[derive(serde::Deserialize)]
struct Video;

#[derive(serde::Deserialize)]
struct Transfer {
    cents: i64,
}

async fn encode(_: &Video, attempt: i64) -> bool {
    attempt < 3
}

// The row lock form.

/// One row of `invoice_jobs`. No `locked_until` and no `advisory_lock`: the row lock form.
#[derive(Inbox)]
#[inbox(table = "invoice_jobs")]
struct IssueInvoice {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The claim's transaction holds the row while the handler runs; the acknowledgement deletes
/// the row and commits. A crash rolls the transaction back, and the row returns at once.
#[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
async fn issue(invoice: &Invoice) -> HandlerOutcome {
    let _ = invoice.number;
    HandlerOutcome::ack()
}

// The advisory form: one row of a key in work at a time.

/// One row of `video_jobs`, held by a lock on its channel's key while it is in work.
#[derive(Inbox)]
#[inbox(table = "video_jobs", advisory_lock = "video_jobs-{channel}")]
struct Transcode {
    #[field(id, generated)]
    id: i64,
    channel: String,
    #[field(attempt, generated)]
    attempt: i16,
    #[field(payload)]
    payload: Vec<u8>,
}

/// A video takes minutes to encode. The delivery's connection keeps the channel's key while the
/// handler runs, with no transaction open; a retry runs no statement and releases the key.
#[subscriber(InboxQueue::<Transcode>::new("videos"))]
async fn transcode(video: &Video, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
    if encode(video, attempt).await {
        return HandlerOutcome::ack();
    }
    HandlerOutcome::retry()
}

// A custom lock: the service's own `Lock` and `Unlock`.

/// One row of `payouts`, held by the key of its account.
#[derive(Inbox)]
#[inbox(
    table = "payouts",
    advisory_lock = "accounts-{account_id}",
    custom(lock, unlock)
)]
struct Payout {
    #[field(id, generated)]
    id: i64,
    account_id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

#[subscriber(InboxQueue::<Payout>::new("payouts"))]
async fn pay(transfer: &Transfer) -> HandlerOutcome {
    let _ = transfer.cents;
    HandlerOutcome::ack()
}

/// The service, as the spec's examples include their subscribers.
fn service() -> RustStream {
    RustStream::new(AppInfo::new("billing", "0.1.0"))
        .with_broker(BrokerHandle::new(Broker), |b| {
            // Each of the four workers holds a connection while its invoice is in work.
            b.include(issue.workers(nonzero!(4)));
        })
        .with_broker(BrokerHandle::new(Broker), |b| {
            b.include(transcode);
        })
        .with_broker(BrokerHandle::new(Broker), |b| {
            b.include(pay);
        })
}

/// Builds the service and stops at once, so `main` has something to run that ends.
struct Built(RustStream);

impl App for Built {
    fn run(self) -> impl Future<Output = Result<(), RunError>> + Send {
        drop(self.0);
        async { Ok(()) }
    }
}

// Shutdown on SIGINT or SIGTERM.
#[ruststream::app]
fn app() -> impl App {
    Built(service())
}

//! [`Job`]: what a handler knows of the job it runs, read from the delivery, with the
//! attempt checked at compile time against the table's description.

use std::marker::PhantomData;

use ruststream_core::Value;
use ruststream_core::spec::{CountsAttempts, Described};

use crate::outcome::{Context, DeliveryInfo, FromContext, HandlerOutcome, InboxContext};
use crate::table::InboxTable;

/// The job a handler runs: its row's id, the attempt, the advisory key, the table and the
/// subscription. `T` is the table's row type: [`Job::attempt`] compiles only where its
/// description has an attempt column.
///
/// ```
/// use ruststream::{HandlerOutcome, Inbox, InboxQueue, Job, subscriber};
///
/// #[derive(Inbox)]
/// #[inbox(table = "email_jobs")]
/// struct SendEmail {
///     #[field(id, generated)]
///     id: i64,
///     #[field(payload)]
///     payload: Vec<u8>,
///     #[field(attempt)]
///     attempt: i64,
/// }
///
/// #[subscriber(InboxQueue::<SendEmail>::new("emails"))]
/// async fn send(to: &String, job: Job<SendEmail>) -> HandlerOutcome {
///     tracing::info!(id = ?job.id(), attempt = job.attempt(), table = job.table(), "sending to {to}");
///     HandlerOutcome::ack()
/// }
/// ```
pub struct Job<T> {
    info: DeliveryInfo,
    row: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Job<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("info", &self.info).finish()
    }
}

impl<T> Job<T> {
    /// The row's id.
    pub fn id(&self) -> &Value {
        &self.info.id
    }

    /// The advisory key the job holds, in that form.
    pub fn key(&self) -> Option<&str> {
        self.info.key.as_deref()
    }

    /// The table.
    pub fn table(&self) -> &'static str {
        self.info.table
    }

    /// The subscription.
    pub fn subscription(&self) -> &'static str {
        self.info.subscription
    }
}

impl<T: InboxTable> Job<T> {
    /// The attempt this run counts: 1 on the first. Compiles only where the table's
    /// description has an attempt column.
    pub fn attempt(&self) -> i64
    where
        <T::Table as Described>::Features: CountsAttempts,
    {
        // The runtime counts an attempt on every take of a table with the column.
        self.info.attempt.unwrap_or(1)
    }
}

impl<T: 'static> FromContext<InboxContext> for Job<T> {
    fn from_context(
        ctx: &mut Context<'_, InboxContext>,
    ) -> impl Future<Output = Result<Self, HandlerOutcome>> + Send {
        std::future::ready(Ok(Self {
            info: ctx.kind().info().clone(),
            row: PhantomData,
        }))
    }
}

//! Testing a service's handlers: run one on a message, with the attempt, key and state a
//! delivery would give it, and get its outcome, with no database ([`Delivery`]); and, in a
//! service running on a real database, wait for the outcomes of the messages its handler
//! settles, with no sleep loop ([`Recorded`]).
//!
//! ```
//! use ruststream::testing::Delivery;
//! use ruststream::{HandlerOutcome, Inbox, InboxQueue, subscriber};
//!
//! #[derive(Inbox)]
//! #[inbox(table = "email_jobs")]
//! struct SendEmail {
//!     #[field(id, generated)]
//!     id: i64,
//!     #[field(payload)]
//!     payload: Vec<u8>,
//! }
//!
//! #[derive(Clone, serde::Deserialize)]
//! struct Email {
//!     to: String,
//! }
//!
//! #[subscriber(InboxQueue::<SendEmail>::new("emails"))]
//! async fn send(email: Email) -> Result<(), ruststream::BoxError> {
//!     if email.to.is_empty() {
//!         return Err("no recipient".into());
//!     }
//!     Ok(())
//! }
//!
//! # futures::executor::block_on(async {
//! let email = Email { to: "ada@example.com".into() };
//! assert_eq!(Delivery::new().run(&send, &email).await, HandlerOutcome::ack());
//! let nobody = Email { to: String::new() };
//! let outcome = Delivery::new().attempt(3).run(&send, &nobody).await;
//! assert_eq!(outcome.error(), Some("no recipient"));
//! # });
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::oneshot;
use ruststream_core::Value;

use crate::exec::Executor;
use crate::outcome::{Context, ContextKind, DeliveryInfo, Handle, HandlerOutcome};
use crate::state::States;

/// A delivery as a test makes it up: the row's id, attempt and key, the table and
/// subscription, and the state the handler reaches by type.
#[derive(Clone, Debug)]
pub struct Delivery {
    info: DeliveryInfo,
    states: States,
}

impl Default for Delivery {
    fn default() -> Self {
        Self::new()
    }
}

impl Delivery {
    /// Row 1 of table `test`, at attempt 1, with no key and no state.
    pub fn new() -> Self {
        Self {
            info: DeliveryInfo {
                table: "test",
                subscription: "test",
                id: Value::Int(1),
                attempt: Some(1),
                key: None,
            },
            states: States::new(),
        }
    }

    /// The row's id.
    pub fn id(mut self, id: impl Into<Value>) -> Self {
        self.info.id = id.into();
        self
    }

    /// The attempt this delivery counts.
    pub fn attempt(mut self, attempt: i64) -> Self {
        self.info.attempt = Some(attempt);
        self
    }

    /// The advisory key the delivery holds.
    pub fn key(mut self, key: &str) -> Self {
        self.info.key = Some(Arc::from(key));
        self
    }

    /// The table and subscription names.
    pub fn table(mut self, table: &'static str, subscription: &'static str) -> Self {
        self.info.table = table;
        self.info.subscription = subscription;
        self
    }

    /// A value the handler reaches by its type ([`State`](crate::State)).
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.states.insert(value);
        self
    }

    /// Runs `handler` on `message` as the runtime would for this delivery: its outcome.
    pub async fn run<M, C, H>(&self, handler: &H, message: &M) -> HandlerOutcome
    where
        C: ContextKind,
        H: Handle<M, (), (), C>,
    {
        let mut kind = C::from_delivery(&self.info);
        let span = tracing::Span::none();
        let mut ctx = Context::new(&mut kind, &span).with_states(&self.states);
        match handler.handle(message, &(), &mut ctx).await {
            Ok(()) => HandlerOutcome::ack(),
            Err(outcome) => outcome,
        }
    }
}

/// The outcomes a handler gave, by job, for a test of a service on a real database: wrap the
/// handler with [`Recorded::wrap`], run the service, and await [`Recorded::outcomes`]. A waiter
/// wakes when the handler answers, before its row is settled ([Testing](https://github.com/ruststream/ruststream/blob/main/docs/src/testing.md#a-service-until-its-jobs-settle)).
pub struct Recorded<H> {
    handler: H,
    log: Arc<Log>,
}

impl<H: Clone> Clone for Recorded<H> {
    fn clone(&self) -> Self {
        Self {
            handler: self.handler.clone(),
            log: self.log.clone(),
        }
    }
}

#[derive(Default)]
struct Log {
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// Each message's outcomes, by its row's id, in order.
    outcomes: BTreeMap<Value, Vec<HandlerOutcome>>,
    /// Waiters for a number of final outcomes (acknowledged or rejected).
    waiters: Vec<(usize, oneshot::Sender<()>)>,
}

impl Seen {
    fn finished(&self) -> usize {
        self.outcomes
            .values()
            .filter(|outcomes| {
                outcomes
                    .last()
                    .is_some_and(|o| o.outcome() != ruststream_core::Outcome::Retry)
            })
            .count()
    }
}

impl<H> Recorded<H> {
    /// `handler`, recording each outcome it gives.
    pub fn wrap(handler: H) -> Self {
        Self {
            handler,
            log: Arc::new(Log::default()),
        }
    }

    /// Each message's outcomes so far, by its row's id, in order.
    pub fn all(&self) -> BTreeMap<Value, Vec<HandlerOutcome>> {
        self.log.seen.lock().expect("not poisoned").outcomes.clone()
    }

    /// Runs `service` until `n` jobs have a final outcome (acknowledged or rejected), for at
    /// most `within`, then shuts it down, so every settlement has committed: each job's
    /// outcomes. Publish from the [`on_started`](crate::RustStream::on_started) hook or a task.
    pub async fn settle(
        &self,
        service: crate::RustStream,
        n: usize,
        within: Duration,
    ) -> Result<BTreeMap<Value, Vec<HandlerOutcome>>, Unsettled> {
        let exec = crate::exec::current();
        let log = self.log.clone();
        let reached = Arc::new(Mutex::new(false));
        let into = reached.clone();
        let waiter = Recorded { handler: (), log };
        service
            .run_until(async move {
                let done = waiter.outcomes(n, within, &exec).await.is_some();
                *into.lock().expect("not poisoned") = done;
            })
            .await
            .map_err(Unsettled::Run)?;
        let outcomes = self.all();
        if *reached.lock().expect("not poisoned") {
            Ok(outcomes)
        } else {
            let finished = self.log.seen.lock().expect("not poisoned").finished();
            Err(Unsettled::Timeout {
                wanted: n,
                finished,
                within,
                outcomes,
            })
        }
    }

    /// Waits until `n` messages have a final outcome (acknowledged or rejected, not retried),
    /// for at most `within`; each message's outcomes, or `None` on the timeout.
    pub async fn outcomes(
        &self,
        n: usize,
        within: Duration,
        exec: &Arc<dyn Executor>,
    ) -> Option<BTreeMap<Value, Vec<HandlerOutcome>>> {
        let waited = {
            let mut seen = self.log.seen.lock().expect("not poisoned");
            if seen.finished() >= n {
                None
            } else {
                let (tx, rx) = oneshot::channel();
                seen.waiters.push((n, tx));
                Some(rx)
            }
        };
        if let Some(rx) = waited {
            let timeout = exec.sleep(within);
            futures::pin_mut!(timeout);
            match futures::future::select(rx, timeout).await {
                futures::future::Either::Left((Ok(()), _)) => {}
                _ => return None,
            }
        }
        Some(self.all())
    }
}

/// Why [`Recorded::settle`] returned without its outcomes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Unsettled {
    /// The service did not start, or a startup hook failed.
    #[error(transparent)]
    Run(crate::RunError),
    /// Fewer messages than wanted had a final outcome in time; `outcomes` holds what there was.
    #[error("{finished} of {wanted} messages had a final outcome within {within:?}")]
    Timeout {
        /// The messages waited for.
        wanted: usize,
        /// Those with a final outcome.
        finished: usize,
        /// How long the wait was.
        within: Duration,
        /// Each message's outcomes so far.
        outcomes: BTreeMap<Value, Vec<HandlerOutcome>>,
    },
}

impl<M, O, X, C, H> Handle<M, O, X, C> for Recorded<H>
where
    H: Handle<M, O, X, C>,
    M: Sync,
    O: Sync,
    X: Sync,
    C: ContextKind + RowOf,
{
    async fn handle(
        &self,
        message: &M,
        outs: &O,
        ctx: &mut Context<'_, C>,
    ) -> Result<(), HandlerOutcome> {
        let id = ctx.kind().row();
        let result = self.handler.handle(message, outs, ctx).await;
        let outcome = match &result {
            Ok(()) => HandlerOutcome::ack(),
            Err(outcome) => outcome.clone(),
        };
        let mut seen = self.log.seen.lock().expect("not poisoned");
        // Without the row's id (a handler that reads no context), each answer is its own.
        let id = id.unwrap_or_else(|| Value::Int(-(seen.outcomes.len() as i64) - 1));
        seen.outcomes.entry(id).or_default().push(outcome);
        let finished = seen.finished();
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut seen.waiters)
            .into_iter()
            .partition(|(n, _)| finished >= *n);
        seen.waiters = waiting;
        drop(seen);
        for (_, waiter) in ready {
            let _ = waiter.send(());
        }
        result
    }
}

/// The row a delivery's context names, where it names one: [`Recorded`] keys its outcomes by
/// it (a `#[subscriber]` function's context always does).
pub trait RowOf {
    /// The row's id.
    fn row(&self) -> Option<Value>;
}

impl RowOf for () {
    fn row(&self) -> Option<Value> {
        None
    }
}

impl RowOf for crate::outcome::InboxContext {
    fn row(&self) -> Option<Value> {
        Some(self.info().id.clone())
    }
}

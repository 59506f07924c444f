//! What a handler answers, and what it can read of its delivery.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ruststream_core::{Outcome, Value};

use crate::state::States;

/// How a handler settles its message: the outcome, and for a retry how long the row waits,
/// with the error to record.
///
/// ```
/// use std::time::Duration;
/// use ruststream::HandlerOutcome;
///
/// let later = HandlerOutcome::retry_in(Duration::from_secs(30)).with_error("the mail server is down");
/// assert_eq!(later.delay(), Some(Duration::from_secs(30)));
/// assert_eq!(later.error(), Some("the mail server is down"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub struct HandlerOutcome {
    pub(crate) outcome: Outcome,
    delay: Option<Duration>,
    error: Option<Arc<str>>,
}

impl HandlerOutcome {
    const fn of(outcome: Outcome) -> Self {
        Self {
            outcome,
            delay: None,
            error: None,
        }
    }

    /// Done: the row is deleted, or marked processed.
    pub const fn ack() -> Self {
        Self::of(Outcome::Ack)
    }

    /// Not now: the job returns to the queue, its attempt counted, due again after the retry
    /// policy's delay for this attempt ([Retries](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#retries-and-backoff)).
    pub const fn retry() -> Self {
        Self::of(Outcome::Retry)
    }

    /// A retry that waits `delay` instead of the retry policy's ([Retries](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#retries-and-backoff)).
    pub const fn retry_in(delay: Duration) -> Self {
        Self {
            outcome: Outcome::Retry,
            delay: Some(delay),
            error: None,
        }
    }

    /// Never: the job is marked failed and no claim takes it again until it is redriven; a
    /// table without a `failed_at` column keeps it in the queue as a retry ([Failures](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#handler-outcomes)).
    pub const fn reject() -> Self {
        Self::of(Outcome::Reject)
    }

    /// The same outcome, with the error to write into the row's error column (a retry's last
    /// error, a failure's cause) and to report with a failure.
    pub fn with_error(mut self, error: impl std::fmt::Display) -> Self {
        self.error = Some(Arc::from(error.to_string()));
        self
    }

    /// The outcome the core settles by.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// The delay a retry asked for, where it named one.
    pub fn delay(&self) -> Option<Duration> {
        self.delay
    }

    /// The error recorded with the outcome.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    pub(crate) fn error_arc(&self) -> Option<Arc<str>> {
        self.error.clone()
    }

    /// `Ok(())` for an acknowledgement, the outcome as an error otherwise: the handler
    /// trait's form.
    pub fn into_result(self) -> Result<(), HandlerOutcome> {
        match self.outcome {
            Outcome::Ack => Ok(()),
            _ => Err(self),
        }
    }
}

/// What the runtime knows of a delivery.
#[derive(Clone, Debug)]
pub struct DeliveryInfo {
    /// The table.
    pub table: &'static str,
    /// The subscription's name.
    pub subscription: &'static str,
    /// The row's id.
    pub id: Value,
    /// The attempt this take counted, where the table has the column.
    pub attempt: Option<i64>,
    /// The advisory lock key, in that form.
    pub key: Option<Arc<str>>,
}

/// A context kind a handler asks for: built from the delivery.
pub trait ContextKind: Send + 'static {
    /// The context of this delivery.
    fn from_delivery(info: &DeliveryInfo) -> Self;
}

impl ContextKind for () {
    fn from_delivery(_: &DeliveryInfo) -> Self {}
}

/// The context of a message taken from an inbox table: its row's id, attempt and key.
#[derive(Clone, Debug)]
pub struct InboxContext {
    info: DeliveryInfo,
}

impl InboxContext {
    /// The delivery.
    pub fn info(&self) -> &DeliveryInfo {
        &self.info
    }
}

impl ContextKind for InboxContext {
    fn from_delivery(info: &DeliveryInfo) -> Self {
        Self { info: info.clone() }
    }
}

/// Lends a transaction on the delivery's connection to a handler, once.
pub(crate) type Lender =
    Box<dyn FnOnce() -> crate::exec::BoxFuture<Option<Box<dyn std::any::Any + Send>>> + Send>;

/// What a handler receives beside its message.
pub struct Context<'a, C = ()> {
    kind: &'a mut C,
    span: &'a tracing::Span,
    states: Option<&'a States>,
    lender: Option<Lender>,
}

impl<C: std::fmt::Debug> std::fmt::Debug for Context<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("kind", &self.kind)
            .field("states", &self.states)
            .field("lends_a_transaction", &self.lender.is_some())
            .finish()
    }
}

impl<'a, C> Context<'a, C> {
    /// A context over `kind`, in `span`: what the runtime hands a handler, and what a test
    /// builds to call a handler directly.
    pub fn new(kind: &'a mut C, span: &'a tracing::Span) -> Self {
        Self {
            kind,
            span,
            states: None,
            lender: None,
        }
    }

    /// The same context, lending the delivery's open transaction.
    pub(crate) fn with_lender(mut self, lender: Option<Lender>) -> Self {
        self.lender = lender;
        self
    }

    /// The transaction a handler's writes commit in with the job's acknowledgement (the row
    /// lock form's, or one begun where an advisory key is held), for an adapter's extractor
    /// (`SqlxClaim`, ..). `None` in the lease form, or once taken.
    pub fn claim_transaction(
        &mut self,
    ) -> Option<crate::exec::BoxFuture<Option<Box<dyn std::any::Any + Send>>>> {
        self.lender.take().map(|lend| lend())
    }

    /// The same context, with the values its handler reaches by type ([`State`](crate::State)).
    pub fn with_states(mut self, states: &'a States) -> Self {
        self.states = Some(states);
        self
    }

    /// The value of type `T` the service or the subscription was given.
    pub fn state<T: Clone + 'static>(&self) -> Option<T> {
        self.states.and_then(States::get)
    }

    /// The context's kind, such as [`InboxContext`].
    pub fn kind(&self) -> &C {
        self.kind
    }

    /// The delivery's tracing span.
    pub fn span(&self) -> &tracing::Span {
        self.span
    }
}

/// A value a context provides under the key `K`.
pub trait Provides<K: CtxKey> {
    /// The value, or the outcome to settle by when there is none.
    fn provide(&self) -> Result<K::Value, HandlerOutcome>;
}

/// A key of a value a context provides.
pub trait CtxKey: 'static {
    /// The value's type.
    type Value;
}

/// Keys of what an [`InboxContext`] provides.
pub mod keys {
    /// The attempt this take counted: 1 on the first delivery.
    #[derive(Clone, Copy, Debug)]
    pub struct Attempt;

    impl super::CtxKey for Attempt {
        type Value = i64;
    }
}

impl Provides<keys::Attempt> for InboxContext {
    fn provide(&self) -> Result<i64, HandlerOutcome> {
        self.info.attempt.ok_or_else(|| {
            tracing::error!(
                table = self.info.table,
                "the handler asks for the attempt, but table `{}` describes no attempt column",
                self.info.table
            );
            HandlerOutcome::reject().with_error(format!(
                "the handler asks for the attempt, but table `{}` describes no attempt column",
                self.info.table
            ))
        })
    }
}

/// What a handler's argument after the message is: an extractor, built from the job's
/// context: [`Ctx<K>`](Ctx), [`State<T>`](crate::State), and each adapter's claim of the
/// job's transaction (`SqlxClaim<DB>`, `TokioPostgresClaim`, `MySqlAsyncClaim`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an extractor a subscriber takes after its message",
    label = "a subscriber's arguments after the message are extractors: `Ctx<key>` (such as `Ctx(attempt): Ctx<keys::Attempt>`), `State<T>`, or an adapter's claim (`SqlxClaim<DB>`, ..)"
)]
pub trait FromContext<C>: Sized {
    /// Extracts the value, or answers the outcome to settle by when there is none.
    fn from_context(
        ctx: &mut Context<'_, C>,
    ) -> impl Future<Output = Result<Self, HandlerOutcome>> + Send;
}

impl<K, C> FromContext<C> for Ctx<K>
where
    K: CtxKey,
    K::Value: Send,
    C: Provides<K>,
{
    fn from_context(
        ctx: &mut Context<'_, C>,
    ) -> impl Future<Output = Result<Self, HandlerOutcome>> + Send {
        std::future::ready(ctx.kind().provide().map(Ctx))
    }
}

/// An extractor: the value a context provides under `K`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ctx<K: CtxKey>(pub K::Value);

impl<K: CtxKey> Ctx<K> {
    /// Extracts the value from the context.
    pub fn from_context<C: Provides<K>>(
        ctx: &mut Context<'_, C>,
    ) -> impl Future<Output = Result<Self, HandlerOutcome>> {
        std::future::ready(ctx.kind().provide().map(Ctx))
    }
}

/// A handler of messages `M`. `O` is what it is given beside the message (`()`), `S` is
/// reserved for shared state (`()`), `C` is the context kind it reads ([`InboxContext`] or
/// `()`). `Ok(())` acknowledges; an error settles by its outcome.
pub trait Handle<M, O = (), S = (), C = ()>: Send + Sync + 'static {
    /// Handles one message.
    fn handle(
        &self,
        message: &M,
        outs: &O,
        ctx: &mut Context<'_, C>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> + Send;
}

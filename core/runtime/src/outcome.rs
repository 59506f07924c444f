//! What a handler answers, and what it can read of its delivery.

use std::future::Future;
use std::sync::Arc;

use ruststream_core::{Outcome, Value};

/// How a handler settles its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub struct HandlerOutcome(pub(crate) Outcome);

impl HandlerOutcome {
    /// Done: the row is deleted, or marked processed.
    pub const fn ack() -> Self {
        Self(Outcome::Ack)
    }

    /// Not now: the row returns to the queue, its attempt counted.
    pub const fn retry() -> Self {
        Self(Outcome::Retry)
    }

    /// Never: the row is settled as failed and not retried (deleted, or marked processed).
    pub const fn reject() -> Self {
        Self(Outcome::Reject)
    }

    /// The outcome the core settles by.
    pub const fn outcome(self) -> Outcome {
        self.0
    }

    /// `Ok(())` for an acknowledgement, the outcome as an error otherwise: the handler
    /// trait's form.
    pub fn into_result(self) -> Result<(), HandlerOutcome> {
        match self.0 {
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

/// What a handler receives beside its message.
#[derive(Debug)]
pub struct Context<'a, C = ()> {
    kind: &'a mut C,
    span: &'a tracing::Span,
}

impl<'a, C> Context<'a, C> {
    /// A context over `kind`, in `span`: what the runtime hands a handler, and what a test
    /// builds to call a handler directly.
    pub fn new(kind: &'a mut C, span: &'a tracing::Span) -> Self {
        Self { kind, span }
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
            HandlerOutcome::reject()
        })
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

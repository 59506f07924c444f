//! ruststream: a database table as a message queue.
//!
//! A service publishes rows; subscriptions claim due rows, hand each decoded message to a
//! handler, and settle the row by the handler's outcome. The decisions live in the sans-IO
//! core, [`ruststream_core`]; a driver adapter runs its statements; this crate schedules:
//! it drives the core through the adapter, starts handlers, settles rows, and orders the
//! shutdown. It reaches an executor only through [`exec::Executor`], with implementations
//! for tokio (feature `tokio`, default), smol (feature `smol`), async-std (feature `async-std`,
//! discontinued upstream in favour of smol) and plain threads ([`exec::Threads`]).
//!
//! Every adapter's broker shares this crate's public types: a [`Route`] of one queue, a
//! [`RunningBroker`] started by hand with its [`ClosedCounts`], a [`Publisher`], the [`Error`]
//! of a publish or a start, and the methods [`broker_methods!`] writes (`route`, `handle`,
//! `start`, `start_on`); each adapter names them after itself (`SqlxRoute`,
//! `ClosedSqlxBroker`, `SqlxBrokerError`, ...). An adapter on an async pool holds the core's
//! connections in [`adapter::Connections`].
//!
//! The three forms, the custom lock and the shutdown are described in the crate's
//! documentation pages and in `ruststream_core`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod adapter;
mod app;
pub mod codec;
pub mod de;
mod driver;
mod error;
pub mod exec;
mod handle;
mod job;
mod listen;
pub mod maintenance;
pub mod metrics;
mod outbox;
mod outcome;
mod retry;
mod returns;
mod route;
mod start;
mod state;
mod subscriber;
mod table;
pub mod testing;

#[cfg(feature = "tokio")]
pub use app::run_app;
pub use app::{
    App, AppInfo, BoxError, RunError, RustStream, ServiceHook, run_blocking, termination,
};
pub use driver::now;
pub use error::{Error, PublishError, StartError};
pub use handle::{
    BrokerHandle, BrokerScope, FailedRows, IntoBroker, IntoRow, Message, Publisher, RunningBroker,
};
pub use job::Job;
pub use maintenance::{Periodic, Schedule, ScheduleError};
pub use outbox::Outbox;
pub use outcome::{
    Context, ContextKind, Ctx, CtxKey, DeliveryInfo, FromContext, Handle, HandlerOutcome,
    InboxContext, Provides, keys,
};
pub use retry::{Failure, FailureHook, RetryPolicy};
pub use returns::{IntoOutcome, Permanent, permanent};
pub use route::Route;
pub use ruststream_core as core;
pub use ruststream_core::spec::{
    Advisory, Attempt, Carries, Column, Due, ErrorText, Failed, InboxSpec, KeyPart, Lease, OrderBy,
    Payload, Processed, own,
};
pub use ruststream_core::{
    AttemptError, ClosedCounts, Count, Ddl, ERRORS_KEPT, FailedRow, FailedRowsOf, MissingIndex,
    Published, Stats, Value,
};
pub use state::{State, States};
// The macros: `#[derive(Inbox)]`, `#[subscriber(..)]` (beside the function `subscriber`, which
// shares its name in another namespace) and `#[ruststream::app]`.
pub use ruststream_macros::{Inbox, app, subscriber};
pub use subscriber::{
    InboxQueue, IntoSubscription, IntoWorkers, Subscriber, SubscriberBuilder, Subscription,
    subscriber,
};
pub use table::{AttemptRow, DecodesAs, InboxTable, MessageTable, PayloadRow};

/// A `NonZeroUsize` from a constant, checked at compile time: `nonzero!(4)`.
#[macro_export]
macro_rules! nonzero {
    ($n:expr) => {
        const {
            match ::std::num::NonZeroUsize::new($n) {
                Some(n) => n,
                None => panic!("nonzero!(0): the value must not be zero"),
            }
        }
    };
}

/// What the macros' expansions call; not for use by hand.
#[doc(hidden)]
pub mod __private {
    /// A message a `#[subscriber]` takes by value: a clone of the decoded one.
    #[diagnostic::on_unimplemented(
        message = "a subscriber that takes its message by value gets a clone of the decoded message: derive `Clone` for `{Self}`, or take it by reference (`&{Self}`)"
    )]
    pub trait Owned: Clone {}

    impl<T: Clone> Owned for T {}

    /// The message, by value.
    pub fn owned<M: Owned>(message: &M) -> M {
        message.clone()
    }

    /// A subscriber's source, and the row type it takes.
    pub trait SourceRow {
        /// The row type.
        type Row: crate::InboxTable;
    }

    impl<T: crate::InboxTable> SourceRow for crate::InboxQueue<T> {
        type Row = T;
    }

    /// Compiles only where the source's table has an attempt column: a subscriber that asks
    /// for the attempt calls it.
    pub fn counts_attempts<S: SourceRow>()
    where
        <<S::Row as crate::InboxTable>::Table as ruststream_core::spec::Described>::Features:
            ruststream_core::spec::CountsAttempts,
    {
    }
}

/// The names a service uses, the same under every adapter's prelude
/// (`ruststream_sqlx::prelude::*` and the others add their broker's own).
pub mod prelude {
    pub use crate::{
        Advisory, App, AppInfo, Attempt, AttemptRow, BoxError, BrokerHandle, Column, Context, Ctx,
        Due, ErrorText, Failed, Failure, Handle, HandlerOutcome, Inbox, InboxContext, InboxQueue,
        InboxSpec, InboxTable, IntoBroker, IntoSubscription, KeyPart, Lease, Message, OrderBy,
        Outbox, Payload, PayloadRow, Permanent, Processed, PublishError, Publisher, RetryPolicy,
        RustStream, State, Stats, keys, nonzero, own, permanent, subscriber,
    };
    pub use std::future::ready;
}

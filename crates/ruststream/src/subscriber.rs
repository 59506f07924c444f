//! Subscriptions: a handler bound to a source, with its workers and timings.

use std::marker::PhantomData;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use ruststream_core::spec::Described;
use ruststream_core::{Delivered, SubscribeOptions, TableDesc};
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::adapter::{Adapter, TakesRows};
use crate::codec::{Codec, Json};
use crate::exec::BoxFuture;
use crate::maintenance::{Maintenance, Periodic};
use crate::outcome::{Context, ContextKind, DeliveryInfo, Handle, HandlerOutcome, Lender};
use crate::retry::{Failure, Failures, RetryPolicy};
use crate::state::States;
use crate::table::{DecodesAs, InboxTable, PayloadRow};

/// Marks types a value is generic over without holding them.
type Types<T> = PhantomData<fn() -> T>;

/// The source of an inbox table's rows: `InboxQueue::<IssueInvoice>::new("invoices")`.
pub struct InboxQueue<T> {
    name: &'static str,
    row: PhantomData<fn() -> T>,
}

impl<T> InboxQueue<T> {
    /// The queue of `T`'s table, under this name.
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            row: PhantomData,
        }
    }

    /// The queue's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<T> std::fmt::Debug for InboxQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("InboxQueue").field(&self.name).finish()
    }
}

/// A subscription under construction: `subscriber(name, handler).map_source(..).workers(..)`.
pub struct SubscriberBuilder<H, S, M, O, X, C> {
    name: &'static str,
    handler: H,
    source: S,
    options: SubscribeOptions,
    failures: Failures,
    decode: fn(&[u8]) -> Result<M, String>,
    states: States,
    maintenance: Maintenance,
    types: Types<(O, X, C)>,
}

/// Starts a subscription named `name` that hands messages to `handler`.
pub fn subscriber<H, M, O, X, C>(
    name: &'static str,
    handler: H,
) -> SubscriberBuilder<H, (), M, O, X, C>
where
    H: Handle<M, O, X, C>,
    M: DeserializeOwned,
{
    SubscriberBuilder {
        name,
        handler,
        source: (),
        options: SubscribeOptions::default(),
        failures: Failures::default(),
        decode: Json::decode::<M>,
        states: States::new(),
        maintenance: Maintenance::default(),
        types: PhantomData,
    }
}

impl<H, S, M, O, X, C> SubscriberBuilder<H, S, M, O, X, C> {
    /// Replaces the source, such as with an [`InboxQueue`].
    pub fn map_source<S2>(self, f: impl FnOnce(S) -> S2) -> SubscriberBuilder<H, S2, M, O, X, C> {
        SubscriberBuilder {
            name: self.name,
            handler: self.handler,
            source: f(self.source),
            options: self.options,
            failures: self.failures,
            decode: self.decode,
            states: self.states,
            maintenance: self.maintenance,
            types: PhantomData,
        }
    }

    /// How many jobs may be in work at once (default 1). In the lease form a worker may take
    /// its next job while the last one's settlement runs ([How claims run](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#how-claims-run)).
    pub fn workers(mut self, workers: impl IntoWorkers) -> Self {
        // Zero is kept, for the start to refuse with the subscription's name.
        self.options.workers = workers.into_workers().map_or(0, NonZeroUsize::get);
        self
    }

    /// How long to wait between claims that find nothing (default 1 s).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.options.poll_interval = interval;
        self
    }

    /// The lease form: how long a lease lasts (default 30 s), and how often a lease in work is
    /// extended (default a third of it).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.options.lease = lease;
        self.options.extend_every = lease / 3;
        self
    }

    /// How many jobs to claim ahead, beyond the workers (default 0), so a free worker gets its
    /// next job without a round trip. In the row lock and advisory forms each holds a
    /// connection ([Rows claimed ahead](https://github.com/ruststream/ruststream/blob/main/docs/src/performance.md#rows-claimed-ahead-and-connections-kept)).
    pub fn prefetch(mut self, rows: usize) -> Self {
        self.options.prefetch = rows;
        self
    }

    /// The most attempts a job gets (at least 1): a take past it marks the job failed without
    /// running the handler, so a job that crashes its process fails after this many crashes.
    /// Needs the attempt and `failed_at` columns ([Failures](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#retries-and-backoff)).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.options.max_attempts = Some(attempts.max(1));
        self
    }

    /// The start creates what the table's schema lacks: the table with every column of its
    /// description, and its claim index (a key's column is text). Off unless set
    /// ([The schema](https://github.com/ruststream/ruststream/blob/main/docs/src/operating.md#the-schema)).
    pub fn ensure_schema(mut self) -> Self {
        self.options.ensure_schema = true;
        self
    }

    /// What the start does when no index of the table serves its claim order: log a warning
    /// naming the index to create ([`MissingIndex::Warn`](ruststream_core::MissingIndex::Warn),
    /// unless set), refuse to start, or not look.
    pub fn missing_claim_index(mut self, what: ruststream_core::MissingIndex) -> Self {
        self.options.missing_claim_index = what;
        self
    }

    /// How long a retry waits, when the handler's outcome names no delay
    /// ([`HandlerOutcome::retry_in`]): [`RetryPolicy::default`] unless set.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.failures.policy = policy;
        self
    }

    /// The longest a handler may run. A delivery that runs longer is ended as a retry with
    /// the error "the handler ran past its timeout": the handler's future is dropped, its
    /// lease is no longer extended, its row lock's transaction ends and its key is released.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.failures.timeout = Some(timeout);
        self
    }

    /// Calls `hook` with every failed job once the failure is written, for alerting, instead
    /// of the default report (a `tracing` error, or standard error without a subscriber).
    pub fn on_failure(mut self, hook: impl Fn(&Failure) + Send + Sync + 'static) -> Self {
        self.failures.hook = Some(Arc::new(hook));
        self
    }

    /// Gives this subscription's handler `value` (a pool, a client, a configuration), which it
    /// reads by type with [`State`](crate::State); it wins over a value of the same type the
    /// service gives ([`RustStream::with_state`](crate::RustStream::with_state)).
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.states.insert(value);
        self
    }

    /// Decodes payloads with `K` instead of JSON.
    pub fn codec<K: Codec>(mut self) -> Self
    where
        M: DeserializeOwned,
    {
        self.decode = K::decode::<M>;
        self
    }

    /// Deletes the table's rows marked processed (`processed_at`) once the mark is older than
    /// `age`, in batches, by one process at a time (see [`crate::maintenance`]). Needs the
    /// table's `processed_at` column: the broker does not start without it, and says so.
    pub fn retain_processed(mut self, age: Duration) -> Self {
        self.maintenance.retention.processed = Some(age);
        self
    }

    /// Deletes the table's rows marked failed (`failed_at`) once the mark is older than `age`,
    /// in batches, by one process at a time (see [`crate::maintenance`]). Needs the table's
    /// `failed_at` column: the broker does not start without it, and says so.
    pub fn retain_failed(mut self, age: Duration) -> Self {
        self.maintenance.retention.failed = Some(age);
        self
    }

    /// How often the retention runs (default one minute; the first run is at the start), and
    /// the most rows one of its statements deletes (default
    /// [`RETENTION_BATCH`](crate::maintenance::RETENTION_BATCH), at least 1).
    pub fn retention_every(mut self, every: Duration, batch: usize) -> Self {
        self.maintenance.retention.every = every;
        self.maintenance.retention.batch = batch.max(1);
        self
    }

    /// Publishes one row per tick of `job`'s schedule into the subscription's table, across
    /// every process that runs a job of the same name (see [`crate::maintenance`]). A
    /// subscription takes any number of jobs.
    pub fn periodic(mut self, job: Periodic) -> Self {
        self.maintenance.periodic.push(job);
        self
    }

    /// The subscription's settings.
    pub fn options(&self) -> &SubscribeOptions {
        &self.options
    }

    /// The finished subscription.
    pub fn build(self) -> Subscriber<H, S, M, O, X, C> {
        Subscriber(self)
    }
}

/// A finished subscription, to include in a broker.
pub struct Subscriber<H, S, M, O, X, C>(SubscriberBuilder<H, S, M, O, X, C>);

/// A subscription as the broker runs it.
pub struct Subscription<A: Adapter> {
    pub(crate) name: &'static str,
    pub(crate) desc: TableDesc,
    pub(crate) options: SubscribeOptions,
    pub(crate) lock: Option<A::Lock>,
    pub(crate) failures: Failures,
    pub(crate) states: States,
    pub(crate) dispatch: Arc<dyn Dispatch<A>>,
    pub(crate) maintenance: Maintenance,
}

impl<A: Adapter> Subscription<A> {
    /// The subscription's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Its table.
    pub fn table(&self) -> &TableDesc {
        &self.desc
    }

    /// Gives the handler the service's values of the types it was given none of.
    pub(crate) fn fill_states(&mut self, service: &States) {
        self.states.fill_from(service);
    }
}

/// Something a broker of `A` can run as a subscription.
pub trait IntoSubscription<A: Adapter> {
    /// The subscription.
    fn into_subscription(self) -> Subscription<A>;
}

/// A subscription made already (`into_subscription()`), as `include` and `start` take it.
impl<A: Adapter> IntoSubscription<A> for Subscription<A> {
    fn into_subscription(self) -> Subscription<A> {
        self
    }
}

impl<A, T, H, M, X, C> IntoSubscription<A> for SubscriberBuilder<H, InboxQueue<T>, M, (), X, C>
where
    A: TakesRows<T>,
    T: InboxTable + PayloadRow,
    T: DecodesAs<M>,
    H: Handle<M, (), X, C>,
    M: Send + Sync + 'static,
    X: 'static,
    C: ContextKind,
{
    fn into_subscription(self) -> Subscription<A> {
        let desc = *T::TABLE.table_desc();
        Subscription {
            name: self.name,
            desc,
            options: SubscribeOptions {
                row_fields: T::ROW_FIELDS,
                ..self.options
            },
            lock: A::custom_lock(),
            failures: self.failures,
            states: self.states,
            maintenance: self.maintenance,
            dispatch: Arc::new(InboxDispatch::<T, H, M, X, C> {
                name: self.name,
                table: desc.table,
                handler: Arc::new(self.handler),
                decode: self.decode,
                types: PhantomData,
            }),
        }
    }
}

impl<A, T, H, M, X, C> IntoSubscription<A> for Subscriber<H, InboxQueue<T>, M, (), X, C>
where
    SubscriberBuilder<H, InboxQueue<T>, M, (), X, C>: IntoSubscription<A>,
    A: Adapter,
{
    fn into_subscription(self) -> Subscription<A> {
        self.0.into_subscription()
    }
}

/// Runs one delivery in its tracing span: decodes the row and its message, calls the handler.
pub(crate) trait Dispatch<A: Adapter>: Send + Sync {
    fn run(
        &self,
        delivered: Delivered<A::Row>,
        states: States,
        lender: Option<Lender>,
        span: tracing::Span,
    ) -> BoxFuture<HandlerOutcome>;
}

struct InboxDispatch<T, H, M, X, C> {
    name: &'static str,
    table: &'static str,
    handler: Arc<H>,
    decode: fn(&[u8]) -> Result<M, String>,
    types: Types<(T, X, C)>,
}

impl<A, T, H, M, X, C> Dispatch<A> for InboxDispatch<T, H, M, X, C>
where
    A: TakesRows<T>,
    T: InboxTable + PayloadRow,
    H: Handle<M, (), X, C>,
    M: Send + Sync + 'static,
    X: 'static,
    C: ContextKind,
{
    fn run(
        &self,
        delivered: Delivered<A::Row>,
        states: States,
        lender: Option<Lender>,
        span: tracing::Span,
    ) -> BoxFuture<HandlerOutcome> {
        let info = DeliveryInfo {
            table: self.table,
            subscription: self.name,
            id: delivered.id,
            attempt: delivered.attempt,
            key: delivered.key,
        };
        let handler = self.handler.clone();
        let decode = self.decode;
        let row = delivered.row;
        Box::pin(async move {
            let table = info.table;
            let id = &info.id;
            let Some(row) = row else {
                return HandlerOutcome::reject()
                    .with_error(format!("table `{table}`: row {id} came without its data"));
            };
            let row: T = match A::decode(row) {
                Ok(row) => row,
                Err(error) => {
                    return HandlerOutcome::reject().with_error(format!(
                        "table `{table}`: row {id} does not decode into its row type: {error}"
                    ));
                }
            };
            let message = match decode(row.payload()) {
                Ok(message) => message,
                Err(error) => {
                    return HandlerOutcome::reject().with_error(format!(
                        "table `{table}`: the payload of row {id} does not decode: {error}"
                    ));
                }
            };
            let mut kind = C::from_delivery(&info);
            let outcome = {
                let mut ctx = Context::new(&mut kind, &span)
                    .with_states(&states)
                    .with_lender(lender);
                handler
                    .handle(&message, &(), &mut ctx)
                    .instrument(span.clone())
                    .await
            };
            match outcome {
                Ok(()) => HandlerOutcome::ack(),
                Err(outcome) => outcome,
            }
        })
    }
}

/// A number of workers: a plain integer (`8`) or a `NonZeroUsize` (`nonzero!(8)`). Zero, or a
/// negative number, is refused when the service starts, naming the subscription.
pub trait IntoWorkers {
    /// The number, where it is at least one.
    fn into_workers(self) -> Option<NonZeroUsize>;
}

impl IntoWorkers for NonZeroUsize {
    fn into_workers(self) -> Option<NonZeroUsize> {
        Some(self)
    }
}

macro_rules! workers_of {
    ($($t:ty),*) => {$(
        impl IntoWorkers for $t {
            fn into_workers(self) -> Option<NonZeroUsize> {
                usize::try_from(self).ok().and_then(NonZeroUsize::new)
            }
        }
    )*};
}

workers_of!(i32, u32, i64, u64, usize);

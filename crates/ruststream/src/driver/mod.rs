//! The broker's driver: one task that owns the core's machine, runs its commands through the
//! adapter, starts handlers, feeds replies, outcomes and time back, and re-arms one timer.
//!
//! Each command's future runs on a task of its own and answers the driver through a channel:
//! on a runtime of several threads the commands' sends, reads and decoding run side by side on
//! all of them, and the driver's task only decides. (Polled on the driver's task instead, every
//! statement's I/O ran on one thread at a time, and left CPU idle.) The order of the commands
//! on one connection is fixed when the core issues them, not by when their tasks run.
//! Handlers run on tasks of their own.
//!
//! A table's subscriptions wake (claim now rather than at their next poll) when this broker
//! publishes into the table, and when the adapter's listening session hears that another
//! process did ([`Adapter::listen`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::channel::{mpsc, oneshot};
use futures::stream::{BoxStream, FuturesUnordered};
use futures::{FutureExt, StreamExt};
use ruststream_core::{
    Action, Broker, BrokerError, CheckError, ClosedCounts, CommandId, DbError, DeliveryId,
    ErrorKind, Event, FailedRowsOf, Outcome, Publish, PublishId, Published, PublisherId, Reply,
    Settlement, SubId, TableDesc, Time, notification_names,
};
use std::panic::AssertUnwindSafe;

use crate::adapter::Adapter;
use crate::error::PublishError;
use crate::exec::{BoxFuture, Executor};
use crate::listen::Notice;
use crate::metrics::DriverMetrics;
use crate::outcome::HandlerOutcome;
use crate::retry::Failure;
use crate::subscriber::Subscription;

mod launch;

pub(crate) use launch::start;

/// The clock the core's timers read: monotonic, so a wall clock set back or forward moves no
/// timer, counted from the wall clock's reading when the process first asked. No time a
/// statement writes or compares comes from it: those are the database's.
pub fn now() -> Time {
    static START: OnceLock<(Instant, i64)> = OnceLock::new();
    let (start, wall) = START.get_or_init(|| {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or(0);
        (Instant::now(), i64::try_from(micros).unwrap_or(i64::MAX))
    });
    let elapsed = i64::try_from(start.elapsed().as_micros()).unwrap_or(i64::MAX);
    Time(wall.saturating_add(elapsed))
}

pub(crate) enum Input {
    Settle(DeliveryId, Box<Settled>),
    Drop(DeliveryId),
    Publish(Box<(TableDesc, Vec<Publish>)>, PublishReply),
    Change(Box<Change>, ChangeReply),
    /// A read of a table's state: its counts, or failed rows.
    Read(Box<(TableDesc, ruststream_core::ReadTable)>, ReadReply),
    Stop,
    Drained(oneshot::Sender<()>),
    /// A handler asks for its row lock claim's transaction.
    Lend(DeliveryId, LendReply),
    Shutdown,
}

/// Where the answer to a lend goes: the adapter's lend of the connection, or nothing.
pub(crate) type LendReply =
    oneshot::Sender<Option<BoxFuture<Option<Box<dyn std::any::Any + Send>>>>>;

pub(crate) type Sender = mpsc::UnboundedSender<Input>;

/// A handler's outcome, with what the settlement's delay is computed from.
pub(crate) struct Settled {
    sub: SubId,
    attempt: Option<i64>,
    outcome: HandlerOutcome,
}

/// A change of failed rows: the table, which rows, a redrive (`true`) or a deletion.
pub(crate) struct Change {
    pub(crate) desc: TableDesc,
    pub(crate) which: FailedRowsOf,
    pub(crate) redrive: bool,
}

/// Where the answer of a change of failed rows goes: how many rows it changed.
pub(crate) type ChangeReply = oneshot::Sender<Result<u64, PublishError>>;

/// Where the answer of a read of a table's state goes.
pub(crate) type ReadReply = oneshot::Sender<Result<ruststream_core::TableRead, PublishError>>;

/// Where a publish's answer goes.
pub(crate) type PublishReply = oneshot::Sender<Result<Published, PublishError>>;

/// Sends a drop for a delivery whose task ended without settling it.
struct Guard {
    tx: Sender,
    delivery: DeliveryId,
    armed: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.tx.unbounded_send(Input::Drop(self.delivery));
        }
    }
}

/// The state a broker's handle shares with its driver.
pub(crate) enum HandleState {
    Idle,
    Running(Sender),
    Closed,
}

pub(crate) struct Driver<A: Adapter> {
    core: Broker<A::Row>,
    adapter: Arc<A>,
    exec: Arc<dyn Executor>,
    tx: Sender,
    rx: mpsc::UnboundedReceiver<Input>,
    subs: Vec<Subscription<A>>,
    publishers: HashMap<&'static str, PublisherId>,
    waiters: BTreeMap<PublishId, (&'static str, PublishReply)>,
    changes: BTreeMap<PublishId, ChangeReply>,
    reads: BTreeMap<PublishId, ReadReply>,
    /// Handlers waiting for their claim's transaction.
    lends: BTreeMap<DeliveryId, LendReply>,
    drained: Vec<oneshot::Sender<()>>,
    ready: Option<oneshot::Sender<Result<(), CheckError>>>,
    not_ready: usize,
    state: Arc<Mutex<HandleState>>,
    /// What the adapter's listening sessions hear, where it listens.
    notices: Option<BoxStream<'static, Notice>>,
    /// The commands in flight, each answering its id and reply.
    running: FuturesUnordered<BoxFuture<(CommandId, Reply<A::Row>)>>,
    metrics: DriverMetrics,
}

impl<A: Adapter> Driver<A> {
    async fn run(mut self) -> ClosedCounts {
        loop {
            let counts = self.flush();
            self.metrics.gauges(&self.core);
            if let Some(counts) = counts {
                *self
                    .state
                    .lock()
                    .expect("the handle's state is never poisoned") = HandleState::Closed;
                // The listening session ends before the close, which waits for its end.
                self.notices = None;
                self.adapter.close().await;
                for (_, (_, waiter)) in std::mem::take(&mut self.waiters) {
                    let _ = waiter.send(Err(PublishError::Closed));
                }
                for (_, waiter) in std::mem::take(&mut self.changes) {
                    let _ = waiter.send(Err(PublishError::Closed));
                }
                for (_, waiter) in std::mem::take(&mut self.reads) {
                    let _ = waiter.send(Err(PublishError::Closed));
                }
                return counts;
            }
            if self.core.in_work_total() == 0 {
                for waiter in self.drained.drain(..) {
                    let _ = waiter.send(());
                }
            }
            let wait: BoxFuture<()> = match self.core.poll_timeout() {
                Some(at) => {
                    let now = now();
                    if at <= now {
                        self.core.handle_timeout(now);
                        continue;
                    }
                    // Wake a little late rather than early, so one wake-up does the work.
                    self.exec.sleep(at.since(now) + Duration::from_micros(50))
                }
                None => Box::pin(futures::future::pending()),
            };
            futures::select! {
                reply = next_reply(&mut self.running).fuse() => {
                    let (id, reply) = reply;
                    self.metrics.answered(id, &reply);
                    self.core.handle_reply(id, reply, now());
                    // Take the other replies already in before the next flush.
                    while let Some(Some((id, reply))) = self.running.next().now_or_never() {
                        self.metrics.answered(id, &reply);
                        self.core.handle_reply(id, reply, now());
                    }
                }
                input = self.rx.next() => {
                    if let Some(input) = input {
                        self.input(input);
                        // Take what else is waiting before the next flush.
                        while let Ok(input) = self.rx.try_recv() {
                            self.input(input);
                        }
                    }
                }
                notice = next_notice(&mut self.notices).fuse() => match notice {
                    Some(notice) => self.notice(notice),
                    None => self.notices = None,
                },
                () = wait.fuse() => self.core.handle_timeout(now()),
            }
        }
    }

    /// Wakes the subscriptions of the tables the notices name, of every table after a
    /// session opened; takes the notices already waiting first (up to [`NOTICE_BATCH`]), so a
    /// burst wakes each once.
    fn notice(&mut self, first: Notice) {
        let mut every = false;
        let mut tables: Vec<String> = Vec::new();
        let mut take = |notice: Notice| match notice {
            Notice::Listening => every = true,
            Notice::Published(table) => {
                if !tables.contains(&table) {
                    tables.push(table);
                }
            }
        };
        take(first);
        for _ in 1..NOTICE_BATCH {
            let Some(notices) = &mut self.notices else {
                break;
            };
            match notices.next().now_or_never() {
                Some(Some(notice)) => take(notice),
                Some(None) => self.notices = None,
                None => break,
            }
        }
        let now = now();
        for (i, sub) in self.subs.iter().enumerate() {
            if every
                || tables
                    .iter()
                    .any(|table| notification_names(table, sub.desc.table))
            {
                tracing::trace!(subscription = sub.name, "woken by a notification");
                self.core.wake(SubId(i), now);
            }
        }
    }

    fn input(&mut self, input: Input) {
        let now = now();
        match input {
            Input::Settle(delivery, settled) => {
                self.metrics.settling(delivery);
                let settlement = self.settlement(&settled);
                self.core.settle_with(delivery, settlement, now);
            }
            Input::Read(read, reply) => self.read(*read, reply, now),
            Input::Change(change, reply) => {
                let Change {
                    desc,
                    which,
                    redrive,
                } = *change;
                let publisher = match self.publisher_of(desc) {
                    Ok(p) => p,
                    Err(error) => {
                        let _ = reply.send(Err(PublishError::Invalid(error)));
                        return;
                    }
                };
                let started = if redrive {
                    self.core.redrive(publisher, which, now)
                } else {
                    self.core.delete_failed(publisher, which, now)
                };
                match started {
                    Ok(id) => {
                        self.changes.insert(id, reply);
                    }
                    Err(BrokerError::Closed) => {
                        let _ = reply.send(Err(PublishError::Closed));
                    }
                    Err(error) => {
                        let _ = reply.send(Err(PublishError::Invalid(error)));
                    }
                }
            }
            Input::Drop(delivery) => self.core.drop_delivery(delivery, now),
            Input::Publish(publish, reply) => {
                let (desc, rows) = *publish;
                let count = rows.len();
                let publisher = match self.publisher_of(desc) {
                    Ok(p) => p,
                    Err(error) => {
                        let _ = reply.send(Err(PublishError::Invalid(error)));
                        return;
                    }
                };
                match self.core.publish_all(publisher, rows, now) {
                    Ok(id) => {
                        self.metrics.publishing(id, desc.table, count);
                        self.waiters.insert(id, (desc.table, reply));
                    }
                    Err(BrokerError::Closed) => {
                        let _ = reply.send(Err(PublishError::Closed));
                    }
                    Err(error) => {
                        let _ = reply.send(Err(PublishError::Invalid(error)));
                    }
                }
            }
            Input::Stop => {
                for i in 0..self.subs.len() {
                    self.core.stop(SubId(i), now);
                }
            }
            Input::Drained(waiter) => self.drained.push(waiter),
            Input::Lend(delivery, reply) => {
                self.lends.insert(delivery, reply);
                self.core.lend_transaction(delivery, now);
            }
            Input::Shutdown => self.core.shutdown(now),
        }
    }

    /// Starts a read of a table's state for `reply`, or answers why it cannot start.
    fn read(&mut self, read: (TableDesc, ruststream_core::ReadTable), reply: ReadReply, now: Time) {
        let (desc, read) = read;
        let started = self
            .publisher_of(desc)
            .and_then(|publisher| self.core.read_table(publisher, read, now));
        match started {
            Ok(id) => {
                self.reads.insert(id, reply);
            }
            Err(BrokerError::Closed) => {
                let _ = reply.send(Err(PublishError::Closed));
            }
            Err(error) => {
                let _ = reply.send(Err(PublishError::Invalid(error)));
            }
        }
    }

    /// The core's publisher of `desc`'s table, made once.
    fn publisher_of(&mut self, desc: TableDesc) -> Result<PublisherId, BrokerError> {
        if let Some(p) = self.publishers.get(desc.table) {
            return Ok(*p);
        }
        let p = self.core.publisher(desc)?;
        self.publishers.insert(desc.table, p);
        Ok(p)
    }

    /// The settlement of a handler's outcome: a retry (or a rejection on a table without
    /// `failed_at`) waits the delay it names, or the policy's for its attempt, in the table's
    /// due column or lease where it has one, else in this process.
    fn settlement(&self, settled: &Settled) -> Settlement {
        let outcome = &settled.outcome;
        let mut settlement = Settlement::new(outcome.outcome());
        settlement.error = outcome.error_arc();
        let sub = &self.subs[settled.sub.0];
        // A rejection on a table without `failed_at` returns the row: its delay paces the
        // subscription's next claim even where the table has no column to write it into.
        let paced = outcome.outcome() == Outcome::Reject && sub.desc.failed_at.is_none();
        if outcome.outcome() == Outcome::Retry || paced {
            let attempt = settled.attempt.unwrap_or(1);
            let delay = outcome
                .delay()
                .unwrap_or_else(|| sub.failures.policy.delay(attempt));
            settlement.delay = Some(delay);
        }
        settlement
    }

    /// Runs what the core asks for; answers the shutdown's counts once it is complete.
    fn flush(&mut self) -> Option<ClosedCounts> {
        let mut closed = None;
        loop {
            let mut progressed = false;
            while let Some(command) = self.core.poll_command() {
                progressed = true;
                let lock = match &command.action {
                    Action::Lock { sub, .. } | Action::Unlock { sub, .. } => {
                        self.subs.get(sub.0).and_then(|s| s.lock.clone())
                    }
                    _ => None,
                };
                self.metrics.sent(&command, &self.core);
                let id = command.id;
                let run = AssertUnwindSafe(self.adapter.execute(command, lock)).catch_unwind();
                let (answer, answered) = oneshot::channel();
                self.exec.spawn(Box::pin(async move {
                    let _ = answer.send(run.await);
                }));
                self.running.push(Box::pin(async move {
                    // A command whose future panics, or whose task was dropped unfinished,
                    // answers as a failure: the machine waits for every reply.
                    let reply = match answered.await {
                        Ok(Ok(reply)) => reply,
                        Ok(Err(_)) => Reply::Failed(DbError::new(
                            ErrorKind::Other,
                            format!("the command {id} panicked"),
                        )),
                        Err(_) => Reply::Failed(DbError::new(
                            ErrorKind::Other,
                            format!("the command {id} ended unanswered: its task was dropped"),
                        )),
                    };
                    (id, reply)
                }));
            }
            while let Some(event) = self.core.poll_event() {
                progressed = true;
                if let Some(counts) = self.event(event) {
                    closed = Some(counts);
                }
            }
            if !progressed {
                return closed;
            }
        }
    }

    /// Hands a delivered row to its subscription's handler on a task of its own: a handler
    /// that panics is caught and retried, its panic recorded; one that runs past its timeout
    /// is dropped and retried.
    fn hand(&mut self, delivered: ruststream_core::Delivered<A::Row>) {
        let delivery = delivered.delivery;
        let (sub, attempt) = (delivered.sub, delivered.attempt);
        let s = &self.subs[sub.0];
        let (table, id) = (s.desc.table, delivered.id.clone());
        let dispatch = s.dispatch.clone();
        let states = s.states.clone();
        let timeout = s.failures.timeout;
        let mut guard = Guard {
            tx: self.tx.clone(),
            delivery,
            armed: true,
        };
        // A handler that panics is caught and retried, its panic recorded; one that
        // runs past its timeout is dropped and retried.
        // Lent only when the handler asks: the core marks a savepoint or begins a transaction,
        // then the adapter lends the connection.
        let tx = self.tx.clone();
        let lender: crate::outcome::Lender = Box::new(move || {
            let (reply, answer) = oneshot::channel();
            let asked = tx.unbounded_send(Input::Lend(delivery, reply)).is_ok();
            Box::pin(async move {
                if !asked {
                    return None;
                }
                match answer.await {
                    Ok(Some(lending)) => lending.await,
                    _ => None,
                }
            })
        });
        let span = crate::metrics::delivery_span(s.name, table, &delivered);
        self.metrics.handed(&delivered, &span);
        let work =
            AssertUnwindSafe(dispatch.run(delivered, states, Some(lender), span)).catch_unwind();
        let limit: BoxFuture<()> = match timeout {
            Some(t) => self.exec.sleep(t),
            None => Box::pin(futures::future::pending()),
        };
        self.exec.spawn(Box::pin(async move {
            let outcome = futures::select! {
                done = work.fuse() => match done {
                    Ok(outcome) => outcome,
                    Err(panic) => {
                        let error = format!("the handler panicked: {}", panic_text(&*panic));
                        crate::retry::visible_error(&format!(
                            "table `{table}`: row {id}: {error}; retried"
                        ));
                        HandlerOutcome::retry().with_error(error)
                    }
                },
                () = limit.fuse() => {
                    let error = format!(
                        "the handler ran past its timeout of {:?}",
                        timeout.unwrap_or_default()
                    );
                    crate::retry::visible_error(&format!(
                        "table `{table}`: row {id}: {error}; retried"
                    ));
                    HandlerOutcome::retry().with_error(error)
                }
            };
            guard.armed = false;
            let settled = Settled {
                sub,
                attempt,
                outcome,
            };
            let _ = guard
                .tx
                .unbounded_send(Input::Settle(guard.delivery, Box::new(settled)));
        }));
    }

    /// The answer of a read, a change of failed rows or a publish, to whoever waits for it;
    /// a change or a publish that wrote rows wakes the subscriptions that may take them.
    fn answer(&mut self, event: Event<A::Row>) {
        match event {
            Event::Read { publish, result } => {
                if let Some(waiter) = self.reads.remove(&publish) {
                    let _ = waiter.send(result.map_err(PublishError::Db));
                }
            }
            Event::Changed { publish, result } => {
                if let Some(waiter) = self.changes.remove(&publish) {
                    if result.is_ok() {
                        // Redriven rows are due now: the table's subscriptions look at once.
                        let now = now();
                        for i in 0..self.subs.len() {
                            self.core.wake(SubId(i), now);
                        }
                    }
                    let _ = waiter.send(result.map_err(PublishError::Db));
                }
            }
            Event::Published { publish, result } => {
                self.metrics.published(publish, &result);
                if let Some((table, waiter)) = self.waiters.remove(&publish) {
                    if result.is_ok() {
                        // The publisher wakes its own subscribers of the table.
                        let now = now();
                        for (i, sub) in self.subs.iter().enumerate() {
                            if sub.desc.table == table {
                                self.core.wake(SubId(i), now);
                            }
                        }
                    }
                    let _ = waiter.send(result.map_err(PublishError::Db));
                }
            }
            _ => {}
        }
    }

    /// A subscription's check failed: for good (the start fails), or on an error that may pass
    /// (it runs again). Either is reported where the operator sees it.
    fn start_event(&mut self, event: Event<A::Row>) {
        match event {
            Event::CheckFailed { sub, error } => {
                let name = self.subs[sub.0].name;
                crate::retry::visible_error(&format!("subscription `{name}`: {error}"));
                if let Some(ready) = self.ready.take() {
                    let _ = ready.send(Err(error));
                }
            }
            Event::StartRetry {
                sub,
                error,
                failures,
                again_in,
            } => {
                let s = &self.subs[sub.0];
                crate::retry::visible_error(&format!(
                    "subscription `{}` on table `{}` cannot start: {error}; trying again in {again_in:?} ({failures} in a row)",
                    s.name, s.desc.table
                ));
            }
            _ => {}
        }
    }

    fn event(&mut self, event: Event<A::Row>) -> Option<ClosedCounts> {
        match event {
            Event::Ready { sub } => {
                tracing::debug!(subscription = self.subs[sub.0].name, "subscription ready");
                self.not_ready = self.not_ready.saturating_sub(1);
                if self.not_ready == 0
                    && let Some(ready) = self.ready.take()
                {
                    let _ = ready.send(Ok(()));
                }
            }
            Event::CheckFailed { .. } | Event::StartRetry { .. } => self.start_event(event),
            Event::Delivered(delivered) => self.hand(delivered),
            Event::Failed {
                sub,
                id,
                attempt,
                error,
                kept,
                ..
            } => {
                self.metrics.failed(sub);
                let s = &self.subs[sub.0];
                let failure = Failure {
                    table: s.desc.table,
                    subscription: s.name,
                    id,
                    attempt,
                    error,
                    kept,
                };
                s.failures.report(&failure);
            }
            Event::Read { .. } | Event::Changed { .. } | Event::Published { .. } => {
                self.answer(event);
            }
            Event::Warning { sub, message } => {
                tracing::warn!(subscription = self.subs[sub.0].name, "{message}");
            }
            Event::Settled { delivery, outcome } => {
                self.metrics.settled(delivery, outcome);
                tracing::trace!(%delivery, ?outcome, "settled");
            }
            Event::SettleFailed { delivery, error } => {
                self.metrics.returned(delivery);
                match error {
                    // A settlement's statement failed: the row returns to the queue unsettled.
                    ruststream_core::SettleError::Db(_) => {
                        crate::retry::visible_error(&format!("{delivery}: {error}"));
                    }
                    _ => tracing::warn!(%delivery, "{error}"),
                }
            }
            Event::LeaseLost { delivery } => {
                tracing::warn!(%delivery, "the lease ran out while the message was in work");
            }
            Event::Returned { delivery } => {
                self.metrics.returned(delivery);
                tracing::debug!(%delivery, "returned to the queue unsettled");
            }
            Event::Error { sub, error } => {
                tracing::warn!(subscription = self.subs[sub.0].name, "{error}");
            }
            Event::Lent { delivery, conn } => {
                if let Some(reply) = self.lends.remove(&delivery) {
                    let _ = reply.send(conn.and_then(|conn| self.adapter.lend(conn)));
                }
            }
            Event::Closed(counts) => return Some(counts),
            Event::Maintained(maintained) => crate::maintenance::report(&maintained),
        }
        None
    }
}

/// The message of a panic's payload.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// The most notices one wake-up takes.
const NOTICE_BATCH: usize = 1024;

/// The next reply of the commands in flight; never, while none is.
async fn next_reply<R>(
    running: &mut FuturesUnordered<BoxFuture<(CommandId, Reply<R>)>>,
) -> (CommandId, Reply<R>) {
    match running.next().await {
        Some(reply) => reply,
        None => futures::future::pending().await,
    }
}

/// The next notice of the listening sessions; never, where there are none.
async fn next_notice(notices: &mut Option<BoxStream<'static, Notice>>) -> Option<Notice> {
    match notices {
        Some(notices) => notices.next().await,
        None => futures::future::pending().await,
    }
}

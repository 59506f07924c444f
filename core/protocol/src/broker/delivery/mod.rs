//! Deliveries: a row in work from its claim to its end, how it is held (the claim's
//! transaction, a lease, a key's lock), and how it ends: a settlement, a drop, the shutdown.
//!
//! The lease form's settlements, extensions and releases are in [`lease`]; the row lock and
//! advisory lock forms', on the connection that holds the row or the key, in [`held`].

mod held;
mod lease;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::dialect::{AdvisoryStatements, FormStatements, LeaseStatements, RowLockStatements};
use crate::types::{
    Action, ConnId, Delivered, DeliveryId, Event, Outcome, Reply, SettleError, SubId,
};
use crate::value::{DbError, ErrorKind, Time, Value};

use super::options::DROP_GRACE;
use super::rows::Taken;
use super::{Broker, State, Step};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DeliveryState {
    /// The handler has it (or it waits, claimed ahead).
    InWork,
    /// A statement of its settlement, extension or release runs.
    Busy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ending {
    Settle(Outcome),
    Drop,
    Shutdown,
}

/// How a delivery's row is held, by its form.
#[derive(Debug)]
pub(super) enum Held {
    /// By the claim's transaction, on the delivery's connection.
    RowLock(Arc<RowLockStatements>),
    /// By a lease written into the row.
    Lease(LeaseHold),
    /// By the lock of its key, on the delivery's connection.
    Advisory {
        st: Arc<AdvisoryStatements>,
        key: Arc<str>,
    },
}

/// A lease a delivery holds.
#[derive(Debug)]
pub(super) struct LeaseHold {
    st: Arc<LeaseStatements>,
    /// The expiry this process wrote last.
    fence: Option<Time>,
    /// When the lease is extended next.
    extend_at: Option<Time>,
    /// The lease ran out while in work: another delivery may have the row.
    lost: bool,
    /// Other deliveries of the subscription whose settlements ride on this one's statement.
    batch: Vec<DeliveryId>,
    /// How many of its statements a deadlock rolled back and ran again.
    reruns: u8,
}

#[derive(Debug)]
pub(super) struct Delivery {
    pub(super) sub: SubId,
    id: Value,
    /// Row lock and advisory lock forms: the connection that holds the row or the key; the
    /// lease form: the connection of the statement that runs.
    conn: Option<ConnId>,
    pub(super) state: DeliveryState,
    pub(super) ending: Option<Ending>,
    /// A dropped delivery's connection is closed by then.
    deadline: Option<Time>,
    /// A settlement asked for while an extension ran.
    pub(super) queued: Option<Ending>,
    /// Whether its key or row is still held.
    holds: bool,
    /// Whether the settlement's statement took effect.
    settled: bool,
    /// Whether the runtime was handed it (a claim cut short by the shutdown hands nothing).
    pub(super) delivered: bool,
    /// Handed to the runtime, which has not settled or dropped it yet.
    pub(super) handling: bool,
    /// When its claim took it.
    pub(super) claimed_at: Time,
    /// The attempt its take counted, where the table counts them.
    attempt: Option<i64>,
    /// A retry: how long the row waits before it is due again.
    delay: Option<std::time::Duration>,
    /// The error its settlement records.
    error: Option<Arc<str>>,
    /// Its settlement is a failure, reported once it takes effect: `Some(kept)`, whether
    /// the row is marked failed.
    failure: Option<bool>,
    /// Its take counted past the attempt budget: it fails without a handler.
    exhausted: bool,
    /// The row lock form: its transaction was lent to the handler, past a savepoint that a
    /// settlement other than an acknowledgement rolls back to.
    savepoint: bool,
    /// A failure returned to the queue of a table with nowhere to write its delay: the
    /// delay paces the subscription's next claim instead.
    paced: bool,
    held: Held,
}

impl Delivery {
    fn key(&self) -> Option<&Arc<str>> {
        match &self.held {
            Held::Advisory { key, .. } => Some(key),
            Held::RowLock(_) | Held::Lease(_) => None,
        }
    }

    fn lease(&self) -> Option<&LeaseHold> {
        match &self.held {
            Held::Lease(l) => Some(l),
            Held::RowLock(_) | Held::Advisory { .. } => None,
        }
    }

    fn lease_mut(&mut self) -> Option<&mut LeaseHold> {
        match &mut self.held {
            Held::Lease(l) => Some(l),
            Held::RowLock(_) | Held::Advisory { .. } => None,
        }
    }

    /// The lease form: whether its lease ran out, was lost, or is gone by `now`.
    pub(super) fn lease_gone(&self, now: Time) -> bool {
        self.lease()
            .is_some_and(|l| l.lost || l.fence.is_none_or(|until| until <= now))
    }

    /// The lease form: when its lease is next extended.
    pub(super) fn extend_at(&self) -> Option<Time> {
        self.lease().and_then(|l| l.extend_at)
    }

    /// The time by which its connection is closed, dropped.
    pub(super) fn deadline(&self) -> Option<Time> {
        self.deadline
    }

    /// The row lock and advisory lock forms: the connection that holds it, for a ping.
    pub(super) fn holding_conn(&self) -> Option<ConnId> {
        self.conn
    }
}

/// The deliveries, with those changed since the broker last armed their timers.
#[derive(Debug, Default)]
pub(super) struct Deliveries {
    map: BTreeMap<DeliveryId, Delivery>,
    dirty: BTreeSet<DeliveryId>,
}

impl Deliveries {
    pub(super) fn get(&self, id: DeliveryId) -> Option<&Delivery> {
        self.map.get(&id)
    }

    pub(super) fn get_mut(&mut self, id: DeliveryId) -> Option<&mut Delivery> {
        self.dirty.insert(id);
        self.map.get_mut(&id)
    }

    fn insert(&mut self, id: DeliveryId, delivery: Delivery) {
        self.dirty.insert(id);
        self.map.insert(id, delivery);
    }

    fn remove(&mut self, id: DeliveryId) -> Option<Delivery> {
        self.dirty.insert(id);
        self.map.remove(&id)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The rows of `sub`'s advisory deliveries and their keys.
    pub(super) fn held_keys(&self, sub: SubId) -> impl Iterator<Item = (&Value, &Arc<str>)> {
        self.map
            .values()
            .filter(move |d| d.sub == sub)
            .filter_map(|d| Some((&d.id, d.key()?)))
    }

    /// The deliveries for which `keep` holds, in id order.
    pub(super) fn ids_where(&self, keep: impl Fn(&Delivery) -> bool) -> Vec<DeliveryId> {
        self.map
            .iter()
            .filter(|(_, d)| keep(d))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The deliveries changed (or removed) since the last call.
    pub(super) fn take_dirty(&mut self) -> BTreeSet<DeliveryId> {
        std::mem::take(&mut self.dirty)
    }

    /// Every delivery's timers are armed again.
    pub(super) fn mark_all_dirty(&mut self) {
        self.dirty.extend(self.map.keys().copied());
    }
}

/// Where a delivery is.
#[derive(Clone, Copy, Debug)]
pub(super) enum DeliveryStage {
    Acquire,
    Extend {
        until: Time,
    },
    Settle,
    /// The lease form: the settlement of this delivery and of its batch in one statement.
    SettleBatch,
    ReleaseLease,
    Commit,
    Rollback,
    Unlock,
    /// A row claimed ahead: its session answers, so it is handed.
    Ping,
    /// The row lock form: the savepoint before the transaction is lent to the handler.
    Savepoint,
    /// The row lock form: back to that savepoint, before a retry or a failure is written.
    Unwind,
    Release,
    Close,
}

/// `error`, cut to at most `max` bytes on a character boundary, ending in `…` where cut.
fn cut_error(error: Arc<str>, max: usize) -> Arc<str> {
    if error.len() <= max {
        return error;
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    Arc::from(format!("{}…", &error[..end]))
}

impl<R> Broker<R> {
    /// A row a claim took, held as its form holds it: by the claim's connection `conn` (row
    /// lock; advisory lock, with its `key`), or by the lease that runs out at `fence`.
    pub(super) fn deliver(
        &mut self,
        sub: SubId,
        taken: Taken<R>,
        conn: Option<ConnId>,
        key: Option<Arc<str>>,
        fence: Option<Time>,
    ) {
        let id = DeliveryId(self.next_delivery);
        self.next_delivery += 1;
        let now = self.now;
        let running = self.state == State::Running;
        self.subs[sub.0].in_work += 1;
        let held = self.held_for(sub, key.clone(), fence);
        self.deliveries.insert(
            id,
            Delivery {
                sub,
                id: taken.id.clone(),
                conn,
                state: DeliveryState::InWork,
                ending: None,
                deadline: None,
                queued: None,
                holds: true,
                settled: false,
                delivered: running,
                handling: false,
                claimed_at: now,
                attempt: taken.attempt,
                delay: None,
                error: None,
                failure: None,
                exhausted: false,
                savepoint: false,
                paced: false,
                held,
            },
        );
        if !running {
            self.end(id, Ending::Shutdown);
            return;
        }
        if self.past_budget(sub, id, taken.attempt) {
            return;
        }
        let transaction = match self.deliveries.get(id) {
            Some(d) if matches!(d.held, Held::RowLock(_) | Held::Advisory { .. }) => {
                d.conn.map(|c| self.conns.physical(c))
            }
            _ => None,
        };
        let delivered = Delivered {
            sub,
            delivery: id,
            id: taken.id,
            attempt: taken.attempt,
            key,
            row: taken.raw,
            transaction,
        };
        let s = &mut self.subs[sub.0];
        if s.handling < s.options.workers {
            s.handed += 1;
            s.handling += 1;
            if let Some(d) = self.deliveries.get_mut(id) {
                d.handling = true;
            }
            self.events.push_back(Event::Delivered(delivered));
            return;
        }
        // Claimed ahead: held (by its lease, its transaction or its key's lock) until a
        // worker frees, or given back at once when the subscription has stopped meanwhile.
        let stopped = s.stopped;
        if let Some(d) = self.deliveries.get_mut(id) {
            d.delivered = false;
        }
        if stopped {
            self.end(id, Ending::Drop);
        } else {
            self.ahead.push(sub, delivered);
        }
    }

    /// Whether the take that counted `attempt` is past the subscription's attempt budget: then
    /// the row fails without running the handler, so that a row whose handler crashes its
    /// process ends failed once crashes spent the budget.
    fn past_budget(&mut self, sub: SubId, id: DeliveryId, attempt: Option<i64>) -> bool {
        let budget = self.subs[sub.0].options.max_attempts;
        let (Some(max), Some(attempt)) = (budget, attempt) else {
            return false;
        };
        if attempt <= i64::from(max) {
            return false;
        }
        if let Some(d) = self.deliveries.get_mut(id) {
            d.delivered = false;
            d.exhausted = true;
            d.failure = Some(true);
            d.error = Some(Arc::from(format!(
                "attempt {attempt} is past max_attempts ({max}): failed without running the handler"
            )));
        }
        self.end(id, Ending::Settle(Outcome::Reject));
        true
    }

    /// How a row of `sub` is held: by its key, or by the lease that runs out at `fence`
    /// (extended once `extend_every` has passed since it was written).
    fn held_for(&self, sub: SubId, key: Option<Arc<str>>, fence: Option<Time>) -> Held {
        let s = &self.subs[sub.0];
        match &s.statements.form {
            FormStatements::RowLock(st) => Held::RowLock(st.clone()),
            FormStatements::Advisory(st) => Held::Advisory {
                st: st.clone(),
                key: key.unwrap_or_else(|| Arc::from("")),
            },
            FormStatements::Lease(st) => {
                let early = s.options.lease.saturating_sub(s.options.extend_every);
                let early = i64::try_from(early.as_micros()).unwrap_or(i64::MAX);
                Held::Lease(LeaseHold {
                    st: st.clone(),
                    fence,
                    extend_at: fence
                        .map(|until| Time(until.micros().saturating_sub(early)).max(self.now)),
                    lost: false,
                    batch: Vec::new(),
                    reruns: 0,
                })
            }
        }
    }

    fn delivery_step(
        &mut self,
        delivery: DeliveryId,
        conn: ConnId,
        action: Action,
        stage: DeliveryStage,
    ) {
        self.send(conn, action, Step::Delivery { delivery, stage });
    }

    pub(super) fn delivery_execute(
        &mut self,
        delivery: DeliveryId,
        conn: ConnId,
        statement: &crate::Statement,
        binds: Vec<Value>,
        stage: DeliveryStage,
    ) {
        let action = Action::Execute {
            statement: statement.clone(),
            binds,
        };
        self.delivery_step(delivery, conn, action, stage);
    }

    /// The handler's settlement, as the table can keep it: a rejection on a table that keeps
    /// no failed rows returns the row as a retry; a failure is reported once it takes effect.
    pub(in crate::broker) fn note_settlement(
        &mut self,
        delivery: DeliveryId,
        settlement: crate::types::Settlement,
    ) -> Outcome {
        let Some(d) = self.deliveries.get(delivery) else {
            return settlement.outcome;
        };
        let desc = self.subs[d.sub.0].desc;
        let keeps_failed = desc.failed_at.is_some();
        let writes_delay = desc.due.is_some() || desc.locked_until.is_some();
        let outcome = match settlement.outcome {
            Outcome::Reject if !keeps_failed => Outcome::Retry,
            other => other,
        };
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return outcome;
        };
        if d.ending.is_none() && d.queued.is_none() {
            d.delay = settlement
                .delay
                .filter(|_| outcome == Outcome::Retry)
                .map(|delay| delay.min(super::options::MAX_RETRY_DELAY));
            d.error = settlement
                .error
                .map(|e| cut_error(e, super::options::MAX_ERROR_LEN));
            d.failure = (settlement.outcome == Outcome::Reject).then_some(keeps_failed);
            d.paced = settlement.outcome == Outcome::Reject && !keeps_failed && !writes_delay;
        }
        outcome
    }

    /// The binds of a settlement's statement: the row's id, its lease's `fence`, the time,
    /// the retry's due time and the error.
    pub(super) fn settle_binds(
        &self,
        delivery: DeliveryId,
        statement: &crate::Statement,
        fence: Time,
    ) -> Vec<Value> {
        let now = self.now;
        let Some(d) = self.deliveries.get(delivery) else {
            return Vec::new();
        };
        statement.binds(|arg| match arg {
            crate::Arg::Id => d.id.clone(),
            crate::Arg::Fence => Value::Int(fence.micros()),
            crate::Arg::RetryAt => Value::Int(now.plus(d.delay.unwrap_or_default()).micros()),
            crate::Arg::Error => d
                .error
                .as_deref()
                .map_or(Value::Null, |e| Value::Text(e.to_owned())),
            _ => Value::Int(now.micros()),
        })
    }

    /// Whether a retry writes a statement: it waits, or records an error.
    pub(super) fn retry_writes(&self, delivery: DeliveryId) -> bool {
        self.deliveries
            .get(delivery)
            .is_some_and(|d| d.delay.is_some_and(|t| !t.is_zero()) || d.error.is_some())
    }

    /// A settlement took effect: [`Event::Settled`] where the runtime was handed the row, then
    /// [`Event::Failed`] where the settlement is a failure.
    pub(super) fn settled_event(&mut self, delivery: DeliveryId, outcome: Outcome) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        d.settled = true;
        if d.delivered {
            self.events.push_back(Event::Settled { delivery, outcome });
        }
        if let Some(kept) = d.failure.take() {
            self.events.push_back(Event::Failed {
                sub: d.sub,
                delivery,
                id: d.id.clone(),
                attempt: d.attempt,
                error: d.error.clone(),
                kept,
            });
        }
    }

    /// A delivery ends: settled, dropped, or by the shutdown.
    pub(super) fn end(&mut self, delivery: DeliveryId, ending: Ending) {
        let now = self.now;
        let running = self.state == State::Running;
        let Some(d) = self.deliveries.get_mut(delivery) else {
            if matches!(ending, Ending::Settle(_)) {
                let error = if running {
                    SettleError::NotInWork
                } else {
                    SettleError::Closed
                };
                self.events
                    .push_back(Event::SettleFailed { delivery, error });
            }
            return;
        };
        if d.state == DeliveryState::Busy {
            if d.ending.is_none() && d.queued.is_none() {
                d.queued = Some(ending);
            } else if matches!(ending, Ending::Settle(_)) {
                let error = if !running || d.ending == Some(Ending::Shutdown) {
                    SettleError::Closed
                } else {
                    SettleError::NotInWork
                };
                self.events
                    .push_back(Event::SettleFailed { delivery, error });
            }
            return;
        }
        if matches!(ending, Ending::Settle(_)) && d.lease().is_some() {
            let failed = if !running {
                // The lease runs out unless settled before the shutdown; no new connection
                // now.
                Some((SettleError::Closed, Ending::Shutdown))
            } else if d.lease().is_some_and(|l| l.lost) {
                Some((SettleError::LeaseLost, ending))
            } else {
                None
            };
            if let Some((error, ending)) = failed {
                self.events
                    .push_back(Event::SettleFailed { delivery, error });
                d.ending = Some(ending);
                self.finish_delivery(delivery);
                return;
            }
        }
        d.ending = Some(ending);
        d.state = DeliveryState::Busy;
        if let Some(l) = d.lease_mut() {
            l.extend_at = None;
        }
        if ending == Ending::Drop && d.conn.is_some() {
            d.deadline = Some(now.plus(DROP_GRACE));
        }
        match &d.held {
            Held::RowLock(_) => self.row_lock_end(delivery, ending),
            Held::Lease(_) => self.lease_end(delivery, ending),
            Held::Advisory { .. } => self.advisory_end(delivery, ending),
        }
    }

    pub(super) fn on_delivery(
        &mut self,
        delivery: DeliveryId,
        stage: DeliveryStage,
        reply: Reply<R>,
    ) {
        let Some(d) = self.deliveries.get(delivery) else {
            return;
        };
        if let Reply::Failed(error) = reply {
            self.on_delivery_failed(delivery, stage, error);
            return;
        }
        let lease = d.lease().is_some();
        match stage {
            DeliveryStage::Acquire => self.lease_acquired(delivery),
            DeliveryStage::Extend { until } => self.extended(delivery, until, &reply),
            DeliveryStage::Settle if lease => self.lease_settled(delivery, &reply),
            DeliveryStage::Settle => self.held_settled(delivery),
            DeliveryStage::SettleBatch => self.batch_settled(delivery, reply),
            DeliveryStage::ReleaseLease => self.lease_released(delivery, &reply),
            DeliveryStage::Commit | DeliveryStage::Rollback => self.row_lock_ended(delivery, stage),
            DeliveryStage::Unlock => self.after_unlock(delivery, super::rows::answer(reply)),
            DeliveryStage::Ping => self.pinged(delivery),
            DeliveryStage::Savepoint => self.savepoint_set(delivery),
            DeliveryStage::Unwind => self.unwound(delivery),
            DeliveryStage::Release | DeliveryStage::Close => self.step_done(delivery),
        }
    }

    /// The connection of a delivery's step went back or closed: an extension ended (back to
    /// work, or to the settlement asked for meanwhile), or the delivery ended.
    fn step_done(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        d.conn = None;
        if d.ending.is_none() {
            d.state = DeliveryState::InWork;
            if let Some(queued) = d.queued.take() {
                self.end(delivery, queued);
            }
        } else {
            self.finish_delivery(delivery);
        }
    }

    /// The delivery's step gives its connection back.
    fn delivery_release(&mut self, delivery: DeliveryId) {
        let Some(conn) = self
            .deliveries
            .get_mut(delivery)
            .and_then(|d| d.conn.take())
        else {
            return;
        };
        self.delivery_step(delivery, conn, Action::Release, DeliveryStage::Release);
    }

    fn on_delivery_failed(&mut self, delivery: DeliveryId, stage: DeliveryStage, error: DbError) {
        if matches!(stage, DeliveryStage::Savepoint) {
            self.events.push_back(Event::Lent {
                delivery,
                conn: None,
            });
        }
        if matches!(stage, DeliveryStage::Ping) {
            // Its session no longer answers: the row is never handed, and ends as its
            // connection closes.
            self.ahead.forget_ping(delivery);
            if let Some(d) = self.deliveries.get_mut(delivery) {
                d.ending = Some(d.queued.take().unwrap_or(Ending::Drop));
            }
        }
        if matches!(stage, DeliveryStage::Release | DeliveryStage::Close) {
            self.step_done(delivery);
            return;
        }
        if error.kind == ErrorKind::Serialization && self.rerun_lease_step(delivery, stage) {
            return;
        }
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        let sub = d.sub;
        let settling = matches!(d.ending, Some(Ending::Settle(_)))
            && matches!(
                stage,
                DeliveryStage::Acquire
                    | DeliveryStage::Settle
                    | DeliveryStage::SettleBatch
                    | DeliveryStage::ReleaseLease
                    | DeliveryStage::Commit
            );
        if settling {
            let batch = d
                .lease_mut()
                .map(|l| std::mem::take(&mut l.batch))
                .unwrap_or_default();
            self.events.push_back(Event::SettleFailed {
                delivery,
                error: SettleError::Db(error.clone()),
            });
            for each in batch {
                self.events.push_back(Event::SettleFailed {
                    delivery: each,
                    error: SettleError::Db(error.clone()),
                });
                if let Some(d) = self.deliveries.get_mut(each) {
                    d.holds = false;
                }
                self.finish_delivery(each);
            }
            self.settle_done(sub, delivery);
        } else {
            self.events.push_back(Event::Error { sub, error });
        }
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        if let Some(key) = d.key().cloned()
            && d.holds
        {
            // The connection closes, and the key's lock with it.
            self.keys.remove(&key);
            if d.ending == Some(Ending::Shutdown) {
                self.counts.connections_closed += 1;
            }
        }
        d.holds = false;
        match (stage, d.conn.take()) {
            (DeliveryStage::Acquire, Some(conn)) => {
                self.conns.forget(conn);
                self.after_failed_step(delivery);
            }
            (_, Some(conn)) => {
                self.delivery_step(delivery, conn, Action::Close, DeliveryStage::Close);
            }
            (_, None) => self.after_failed_step(delivery),
        }
    }

    fn after_failed_step(&mut self, delivery: DeliveryId) {
        let now = self.now;
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        if d.ending.is_some() {
            self.finish_delivery(delivery);
            return;
        }
        d.state = DeliveryState::InWork;
        if let Some(l) = d.lease_mut() {
            l.extend_at = Some(now.plus(std::time::Duration::from_secs(1)));
        }
        if let Some(queued) = d.queued.take() {
            self.end(delivery, queued);
        }
    }

    /// A dropped delivery's deadline passed: close its connection, whatever still runs on it.
    pub(super) fn force_close(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        d.deadline = None;
        let conn = d.conn.take();
        let key = d.key().cloned().filter(|_| d.holds);
        d.holds = false;
        for step in self.pending.values_mut() {
            if matches!(step, Step::Delivery { delivery: d, .. } if *d == delivery) {
                *step = Step::Orphan;
            }
        }
        if let Some(key) = key {
            self.keys.remove(&key);
        }
        if let Some(conn) = conn {
            self.send(conn, Action::Close, Step::Orphan);
        }
        self.finish_delivery(delivery);
    }

    pub(super) fn finish_delivery(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.remove(delivery) else {
            return;
        };
        debug_assert!(d.conn.is_none(), "a delivery ended holding a connection");
        debug_assert!(
            d.lease().is_none_or(|l| l.batch.is_empty()),
            "a settlement ended with its batch unsettled"
        );
        self.settle_done(d.sub, delivery);
        let s = &mut self.subs[d.sub.0];
        s.in_work -= 1;
        if d.delivered {
            s.handed -= 1;
        }
        if d.handling {
            s.handling -= 1;
        }
        // A delivery that gives its row back, or releases its key, lets the next claim run at
        // once: the row, or the next row of the key, waits for no poll.
        let retried = d.ending == Some(Ending::Settle(Outcome::Retry));
        let waits = d.delay.filter(|t| !t.is_zero() && retried && d.settled);
        if let Some(delay) = waits.filter(|_| d.paced && !s.stopped) {
            // A failure that returned at once: the next claim, which would take it again,
            // waits its delay or the poll, whichever comes first, unless a claim comes sooner.
            let next = self.now.plus(delay.min(s.options.poll_interval));
            s.next_claim_at = Some(match s.next_claim_at {
                Some(t) if t > self.now => t.min(next),
                _ => next,
            });
        } else if let Some(delay) = waits.filter(|_| d.key().is_none() && !s.stopped) {
            // The row is due again after its delay: claim then, if no claim comes sooner.
            let due = self.now.plus(delay);
            s.next_claim_at = Some(s.next_claim_at.map_or(due, |t| t.min(due)));
        } else if (d.key().is_some() || !d.settled || retried || d.exhausted) && !s.stopped {
            s.next_claim_at = Some(self.now);
        }
        let returned = !d.settled && matches!(d.ending, Some(Ending::Drop | Ending::Shutdown));
        // A lease kept past the shutdown returns when it runs out, not now.
        let kept_lease = d.lease().is_some() && d.ending == Some(Ending::Shutdown);
        if returned && d.delivered && !kept_lease {
            self.events.push_back(Event::Returned { delivery });
        }
        if d.delivered || d.handling {
            self.hand_ahead(d.sub);
        }
    }
}

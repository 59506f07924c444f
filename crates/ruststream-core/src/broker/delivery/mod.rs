//! Deliveries: a row in work from its claim to its end, how it is held (the claim's
//! transaction, a lease, a key's lock), and how it ends: a settlement, a drop, the shutdown.
//!
//! How a delivery ends is in [`settle`], its statements and their answers in [`steps`]; the
//! lease form's settlements, extensions and releases are in [`lease`]; the row lock and
//! advisory lock forms', on the connection that holds the row or the key, in [`held`].

mod held;
mod lease;
mod phase;
mod settle;
mod steps;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::dialect::{AdvisoryStatements, FormStatements, LeaseStatements, RowLockStatements};
use crate::types::{ConnId, Delivered, DeliveryId, Event, Outcome, Settlement, SubId};
use crate::value::{Time, Value};

use super::rows::Taken;
use super::{Broker, State};
use phase::{Failure, Handler, Phase, Terms};

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

/// A lease a claim wrote: the expiry in the row, by the database's clock, and when the
/// statement that wrote it left, by this process's clock.
#[derive(Clone, Copy, Debug)]
pub(in crate::broker) struct Leased {
    /// The expiry the row holds: it fences every later statement on the row.
    pub(in crate::broker) fence: Time,
    /// When the statement that wrote it left: the lease runs a lease's length from about
    /// then, and no sooner.
    pub(in crate::broker) since: Time,
}

/// A lease a delivery holds.
#[derive(Debug)]
pub(super) struct LeaseHold {
    st: Arc<LeaseStatements>,
    /// The expiry the row holds for this process, by the database's clock.
    fence: Option<Time>,
    /// When, by this process's clock, the lease runs out at the soonest.
    expires: Time,
    /// When, by this process's clock, the statement that wrote the fence left: an extension
    /// moves the expiry by the time passed since.
    since: Time,
    /// When the lease is extended next.
    extend_at: Option<Time>,
    /// The lease ran out while in work: another delivery may have the row.
    lost: bool,
    /// Other deliveries of the subscription whose settlements ride on this one's statement.
    batch: Vec<DeliveryId>,
    /// How many of its statements a deadlock rolled back and ran again.
    reruns: u8,
    /// The connection whose transaction is lent to the handler, while it is in work.
    lent: Option<ConnId>,
    /// The handler asked for a transaction while an extension ran: it is begun after.
    lend_wanted: bool,
}

#[derive(Debug)]
pub(super) struct Delivery {
    pub(super) sub: SubId,
    id: Value,
    /// Row lock and advisory lock forms: the connection that holds the row or the key; the
    /// lease form: the connection of the statement that runs.
    conn: Option<ConnId>,
    phase: Phase,
    handler: Handler,
    /// A dropped delivery's connection is closed by then.
    deadline: Option<Time>,
    /// Whether its key or row is still held.
    holds: bool,
    /// A transaction is lent to the handler: in the row lock form the claim's, past a
    /// savepoint that a settlement other than an acknowledgement rolls back to.
    lent: bool,
    /// When its claim took it.
    pub(super) claimed_at: Time,
    /// The attempt its take counted, where the table counts them.
    attempt: Option<i64>,
    terms: Terms,
    held: Held,
}

impl Delivery {
    /// The delivery of a row a claim just took, at `now`, not handed yet.
    fn taken<R>(sub: SubId, taken: &Taken<R>, conn: Option<ConnId>, now: Time, held: Held) -> Self {
        Delivery {
            sub,
            id: taken.id.clone(),
            conn,
            phase: Phase::InWork,
            handler: Handler::Unhanded,
            deadline: None,
            holds: true,
            lent: false,
            claimed_at: now,
            attempt: taken.attempt,
            terms: Terms::default(),
            held,
        }
    }

    fn key(&self) -> Option<&Arc<str>> {
        match &self.held {
            Held::Advisory { key, .. } => Some(key),
            Held::RowLock(_) | Held::Lease(_) => None,
        }
    }

    pub(super) fn lease(&self) -> Option<&LeaseHold> {
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

    /// The lease form: whether its lease ran out, was lost, or is gone by `now` (this
    /// process's clock).
    pub(super) fn lease_gone(&self, now: Time) -> bool {
        self.lease()
            .is_some_and(|l| l.lost || l.fence.is_none() || l.expires <= now)
    }

    /// The lease form: when its lease is next extended.
    pub(super) fn extend_at(&self) -> Option<Time> {
        self.lease().and_then(|l| l.extend_at)
    }

    /// The lease form: the connection of the transaction lent to the handler, taken from the
    /// lease.
    fn take_lent(&mut self) -> Option<ConnId> {
        self.lease_mut().and_then(|l| l.lent.take())
    }

    /// The lease form: whether a transaction is lent to the handler.
    fn lends(&self) -> bool {
        self.lease().is_some_and(|l| l.lent.is_some())
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

    /// The rows of `sub` whose deliveries hold them (their row locks' transactions open).
    pub(super) fn holding_ids(&self, sub: SubId) -> Vec<Value> {
        self.map
            .values()
            .filter(|d| d.sub == sub && d.holds)
            .map(|d| d.id.clone())
            .collect()
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
    /// The lease form: the connection of a transaction lent to the handler.
    LendAcquire,
    /// The lease form: the extension that moves the expiry to `fence`, sent at `since`.
    Extend(Leased),
    Settle,
    /// The lease form: the settlement of this delivery and of its batch in one statement.
    SettleBatch,
    ReleaseLease,
    Commit,
    Rollback,
    Unlock,
    /// A row claimed ahead: its session answers, so it is handed.
    Ping,
    /// The savepoint (row lock) or the begin (advisory lock, lease) before a transaction is
    /// lent to the handler.
    Savepoint,
    /// Back to that savepoint, or the lent transaction rolled back, before a retry or a
    /// failure is written.
    Unwind,
    Release,
    Close,
}

impl<R> Broker<R> {
    /// A row a claim took, held as its form holds it: by the claim's connection `conn` (row
    /// lock; advisory lock, with its `key`), or by the lease the claim wrote.
    pub(super) fn deliver(
        &mut self,
        sub: SubId,
        taken: Taken<R>,
        conn: Option<ConnId>,
        key: Option<Arc<str>>,
        lease: Option<Leased>,
    ) {
        let id = DeliveryId(self.next_delivery);
        self.next_delivery += 1;
        let now = self.now;
        let running = self.state == State::Running;
        self.subs[sub.0].rows_claimed += 1;
        let held = self.held_for(sub, key.clone(), lease);
        let delivery = Delivery::taken(sub, &taken, conn, now, held);
        self.deliveries.insert(id, delivery);
        if !running {
            self.end(id, Ending::Shutdown);
            return;
        }
        if self.past_budget(sub, id, taken.attempt) || self.keyless(sub, id, key.as_deref()) {
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
        self.hand(delivered);
    }

    /// Hands a row to a free worker, or else keeps it claimed ahead: held (by its lease, its
    /// transaction or its key's lock) until a worker frees, or given back at once when the
    /// subscription has stopped meanwhile.
    fn hand(&mut self, delivered: Delivered<R>) {
        let (sub, id) = (delivered.sub, delivered.delivery);
        let s = &mut self.subs[sub.0];
        if s.at_handlers < s.options.workers {
            s.rows_handed += 1;
            s.at_handlers += 1;
            if let Some(d) = self.deliveries.get_mut(id) {
                d.hand();
            }
            self.events.push_back(Event::Delivered(delivered));
            return;
        }
        if s.stopped {
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
            d.terms.exhausted = true;
            d.terms.failure = Some(Failure::Kept);
            // Only crashes and lost leases take a row past its budget: a handler's retry at
            // the last attempt fails it at once. The row says why it failed now.
            d.terms.error = Some(Arc::from(format!(
                "attempt {attempt} is past max_attempts ({max}): failed without running the handler"
            )));
        }
        self.end(id, Ending::Settle(Outcome::Reject));
        true
    }

    /// Whether an advisory row's key rendered empty (a key column `NULL`, or empty text where
    /// the key is nothing but columns): then the row fails without running the handler, with
    /// an error naming the table, the row and the key's columns, since no key orders it.
    fn keyless(&mut self, sub: SubId, id: DeliveryId, key: Option<&str>) -> bool {
        if key != Some("") {
            return false;
        }
        let s = &self.subs[sub.0];
        let (table, columns) = (s.desc.table, s.desc.key_columns());
        let poll = s.options.poll_interval;
        let Some(row) = self.deliveries.get(id).map(|d| d.id.clone()) else {
            return true;
        };
        let columns: Vec<String> = columns.iter().map(|c| format!("`{c}`")).collect();
        let error = match self.unread_keys.remove(&row) {
            Some(why) => format!(
                "table `{table}`: row {row}: its advisory key (of {}) does not read as text ({why}), so no key holds it in order: failed without running the handler",
                columns.join(", ")
            ),
            None => format!(
                "table `{table}`: row {row}: its advisory key renders empty (a key column of {} is NULL or empty), so no key holds it in order: failed without running the handler",
                columns.join(", ")
            ),
        };
        // As a rejection: marked failed where the table keeps failed rows, else returned,
        // due again after a poll interval where the table can wait, paced where it cannot.
        let settlement = Settlement {
            outcome: Outcome::Reject,
            delay: Some(poll),
            error: Some(Arc::from(error)),
        };
        let outcome = self.note_settlement(id, settlement);
        self.end(id, Ending::Settle(outcome));
        true
    }

    /// How a row of `sub` is held: by its key, or by the lease its claim wrote (extended
    /// once `extend_every` has passed since its statement left).
    fn held_for(&self, sub: SubId, key: Option<Arc<str>>, lease: Option<Leased>) -> Held {
        let s = &self.subs[sub.0];
        match &s.statements.form {
            FormStatements::RowLock(st) => Held::RowLock(st.clone()),
            FormStatements::Advisory(st) => Held::Advisory {
                st: st.clone(),
                key: key.unwrap_or_else(|| Arc::from("")),
            },
            FormStatements::Lease(st) => {
                let since = lease.map_or(self.now, |l| l.since);
                Held::Lease(LeaseHold {
                    st: st.clone(),
                    fence: lease.map(|l| l.fence),
                    expires: since.plus(s.options.lease),
                    since,
                    extend_at: lease.map(|l| l.since.plus(s.options.extend_every).max(self.now)),
                    lost: false,
                    batch: Vec::new(),
                    reruns: 0,
                    lent: None,
                    lend_wanted: false,
                })
            }
        }
    }
}

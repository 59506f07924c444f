//! Rows claimed ahead ([`SubscribeOptions::prefetch`](super::SubscribeOptions::prefetch)):
//! held as rows in work are, and handed to the runtime as a worker frees, in claim order. A
//! row whose lease ran out or was lost meanwhile is never handed; one whose session held it
//! for long ([`PING_AHEAD_AFTER`]) is handed once its session answered a ping.

use std::collections::{BTreeMap, VecDeque};

use crate::dialect::FormStatements;
use crate::types::{Delivered, DeliveryId, Event, SubId};

use super::delivery::{DeliveryStage, Ending};
use super::options::PING_AHEAD_AFTER;
use super::{Broker, State};

#[derive(Debug)]
pub(super) struct Ahead<R> {
    /// By subscription: rows claimed ahead, waiting for a free worker, in claim order.
    waiting: Vec<VecDeque<Delivered<R>>>,
    /// Rows claimed ahead whose session is asked whether it still answers before they are
    /// handed, each with a worker's slot kept for it.
    pinging: BTreeMap<DeliveryId, Delivered<R>>,
}

impl<R> Ahead<R> {
    pub(super) fn new() -> Self {
        Self {
            waiting: Vec::new(),
            pinging: BTreeMap::new(),
        }
    }

    /// A subscription was added.
    pub(super) fn add_sub(&mut self) {
        self.waiting.push(VecDeque::new());
    }

    pub(super) fn push(&mut self, sub: SubId, delivered: Delivered<R>) {
        self.waiting[sub.0].push_back(delivered);
    }

    pub(super) fn len(&self, sub: SubId) -> usize {
        self.waiting.get(sub.0).map_or(0, VecDeque::len)
    }

    /// The shutdown: the rows waiting are ended by it, not handed.
    pub(super) fn clear(&mut self) {
        for waiting in &mut self.waiting {
            waiting.clear();
        }
    }

    /// A ping failed: the row is never handed.
    pub(super) fn forget_ping(&mut self, delivery: DeliveryId) {
        self.pinging.remove(&delivery);
    }
}

impl<R> Broker<R> {
    /// Hands rows claimed ahead to the runtime while workers are free; a row whose lease was
    /// lost meanwhile is passed over and ends.
    pub(super) fn hand_ahead(&mut self, sub: SubId) {
        while self.state == State::Running {
            let s = &self.subs[sub.0];
            if s.at_handlers >= s.options.workers || s.stopped {
                return;
            }
            let ping = match &s.statements.form {
                FormStatements::RowLock(f) => Some(f.ping.clone()),
                FormStatements::Advisory(f) => f.ping.clone(),
                FormStatements::Lease(_) => None,
            };
            let Some(next) = self.ahead.waiting[sub.0].pop_front() else {
                return;
            };
            let now = self.now;
            let Some(d) = self.deliveries.get_mut(next.delivery) else {
                continue;
            };
            // A lease that ran out while the row waited may be another process's now. A row
            // lock or a key's lock holds while its session does: one that waited long is
            // handed once its session has answered a ping.
            if d.ending().is_some() || d.lease_gone(now) {
                if d.in_work() {
                    d.begin_ending(Ending::Drop);
                    self.finish_delivery(next.delivery);
                } else {
                    // An extension runs: the row is given back once it has answered.
                    d.queue_ending(Ending::Drop);
                }
                continue;
            }
            let waited = now.since(d.claimed_at) >= PING_AHEAD_AFTER;
            let conn = d.holding_conn();
            self.subs[sub.0].at_handlers += 1;
            if let (true, Some(ping), Some(conn)) = (waited, ping, conn) {
                // The worker's slot is kept for the row while its session is asked.
                d.start_ping();
                d.begin_step();
                let delivery = next.delivery;
                self.ahead.pinging.insert(delivery, next);
                self.delivery_execute(delivery, conn, &ping, Vec::new(), DeliveryStage::Ping);
                continue;
            }
            d.hand();
            self.subs[sub.0].rows_handed += 1;
            self.events.push_back(Event::Delivered(next));
        }
    }

    /// A row claimed ahead whose session answered its ping: handed, or given back when the
    /// subscription stopped or the broker began its shutdown meanwhile.
    pub(super) fn pinged(&mut self, delivery: DeliveryId) {
        let Some(next) = self.ahead.pinging.remove(&delivery) else {
            return;
        };
        let running = self.state == State::Running;
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        let sub = d.sub;
        let queued = d.back_to_work();
        if queued.is_some() || self.subs[sub.0].stopped || !running {
            d.unhand();
            self.subs[sub.0].at_handlers -= 1;
            self.end(delivery, queued.unwrap_or(Ending::Drop));
            return;
        }
        d.hand();
        self.subs[sub.0].rows_handed += 1;
        self.events.push_back(Event::Delivered(next));
    }

    /// The runtime settled or dropped a delivery: its worker is free for a row claimed ahead.
    pub(super) fn handler_done(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        // A lease holds the row while its statement runs: the worker is free for the next.
        // Not behind the gate (SQLite), where statements go out one at a time: a claim beside
        // the settlement would only wait for it, on a second connection.
        let frees = d.lease().is_some() && !self.gate.is_on();
        if !d.leave_handler(frees) {
            return;
        }
        let sub = d.sub;
        let s = &mut self.subs[sub.0];
        s.at_handlers -= 1;
        if let Some(lease) = s.lease_mut() {
            lease.settling_freed += usize::from(d.is_freed());
        }
        self.hand_ahead(sub);
    }

    /// Gives back the rows a subscription claimed ahead, at once: their leases released, their
    /// transactions rolled back, their keys' locks released.
    pub(super) fn give_back_ahead(&mut self, sub: SubId) {
        let waiting: Vec<DeliveryId> = self.ahead.waiting[sub.0]
            .drain(..)
            .map(|d| d.delivery)
            .collect();
        for delivery in waiting {
            let ends = self.deliveries.get(delivery).is_some_and(|d| d.in_work());
            if ends {
                self.end(delivery, Ending::Drop);
            }
        }
    }
}

//! The lease form's deliveries: each statement on a connection of its own, fenced by the
//! expiry this process wrote last. A lease in work is extended; a settlement deletes or marks
//! the row, and, where the database returns the rows a statement settled, the settlements
//! asked for while one runs wait for it and then run together in one statement; a failure
//! marks the row failed; a retry gives the row back at once, or writes when it is due again
//! (the due column, or the lease's expiry) and its error; a drop gives the row back at once.

use crate::dialect::{Arg, Statement, Statements};
use crate::types::{Action, ConnId, DeliveryId, Event, Outcome, Reply, SettleError, SubId};
use crate::value::{Time, Value};

use super::super::Broker;
use super::super::options::{DEADLOCK_RERUNS, SETTLE_BATCH};
use super::super::rows::{affected_any, first_column};
use super::super::sub::FormState;
use super::{DeliveryStage, Ending, Leased};

impl<R> Broker<R> {
    /// A lease delivery ends: a settlement or a release of the lease, each on a connection of
    /// its own; a delivery the shutdown ends keeps its lease.
    pub(super) fn lease_end(&mut self, delivery: DeliveryId, ending: Ending) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        if let Some(conn) = d.take_lent() {
            // The transaction lent to the handler: an acknowledgement's settlement runs in it
            // and commits with the handler's writes; any other ending rolls it back first.
            d.conn = Some(conn);
            if ending == Ending::Settle(Outcome::Ack) {
                return self.settle_alone(delivery, conn);
            }
            d.lent = false;
            let rollback = self.subs[d.sub.0].statements.rollback.clone();
            return self.delivery_execute(
                delivery,
                conn,
                &rollback,
                Vec::new(),
                DeliveryStage::Unwind,
            );
        }
        let sub = d.sub;
        if ending == Ending::Shutdown && d.is_handed() {
            // The delivery keeps its lease, which runs out unless it settles first.
            self.finish_delivery(delivery);
            return;
        }
        let together = d.lease().is_some_and(|l| l.st.settles_together);
        if ending == Ending::Settle(Outcome::Ack)
            && together
            && let Some(lease) = self.subs[sub.0].lease_mut()
        {
            let settles = &mut lease.settles;
            if settles.settling.is_some() {
                // Rides on the next settlement statement.
                settles.waiting.push_back(delivery);
                return;
            }
            settles.settling = Some(delivery);
        }
        self.lease_acquire(delivery);
    }

    /// The lease form: extend a lease in work.
    pub(in crate::broker) fn extend(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        d.begin_step();
        if let Some(l) = d.lease_mut() {
            l.extend_at = None;
        }
        self.lease_acquire(delivery);
    }

    /// The connection of the delivery's next statement.
    fn lease_acquire(&mut self, delivery: DeliveryId) {
        let conn = self.new_conn();
        if let Some(d) = self.deliveries.get_mut(delivery) {
            d.conn = Some(conn);
        }
        self.delivery_step(delivery, conn, Action::Acquire, DeliveryStage::Acquire);
    }

    /// The statement's connection came: the extension, the settlement (alone or with those
    /// waiting behind it), or the release of the lease.
    pub(super) fn lease_acquired(&mut self, delivery: DeliveryId) {
        let now = self.now;
        let Some(d) = self.deliveries.get(delivery) else {
            return;
        };
        let (Some(conn), Some(l)) = (d.conn, d.lease()) else {
            return;
        };
        let sub = d.sub;
        let id = d.id.clone();
        let fence = l.fence.unwrap_or_default();
        let st = l.st.clone();
        let batched = self.subs[sub.0]
            .lease()
            .is_some_and(|l| l.settles.settling == Some(delivery) && !l.settles.waiting.is_empty());
        match d.ending() {
            None => {
                // The row's expiry moves by the time passed since the statement that wrote
                // it left: a lease's length past the database's time, read by no clock here.
                let by = now.micros().saturating_sub(l.since.micros()).max(0);
                let binds = st.extend.binds(|arg| match arg {
                    Arg::Id => id.clone(),
                    Arg::Fence => Value::Int(fence.micros()),
                    _ => Value::Int(by),
                });
                let moved = Leased {
                    fence: Time(fence.micros().saturating_add(by)),
                    since: now,
                };
                let stage = DeliveryStage::Extend(moved);
                self.delivery_execute(delivery, conn, &st.extend, binds, stage);
            }
            Some(Ending::Settle(Outcome::Ack)) if batched => {
                self.settle_batch(delivery, conn);
            }
            Some(Ending::Settle(Outcome::Ack)) => {
                let binds = self.settle_binds(delivery, &st.settle, fence);
                self.delivery_execute(delivery, conn, &st.settle, binds, DeliveryStage::Settle);
            }
            Some(Ending::Settle(Outcome::Reject)) if st.fail.is_some() => {
                let fail = st.fail.clone().expect("checked");
                let binds = self.settle_binds(delivery, &fail, fence);
                self.delivery_execute(delivery, conn, &fail, binds, DeliveryStage::Settle);
            }
            Some(Ending::Settle(Outcome::Retry)) if self.retry_writes(delivery) => {
                let binds = self.settle_binds(delivery, &st.retry, fence);
                let stage = DeliveryStage::ReleaseLease;
                self.delivery_execute(delivery, conn, &st.retry, binds, stage);
            }
            Some(_) => {
                let binds = st.release.binds(|arg| match arg {
                    Arg::Id => id.clone(),
                    _ => Value::Int(fence.micros()),
                });
                let stage = DeliveryStage::ReleaseLease;
                self.delivery_execute(delivery, conn, &st.release, binds, stage);
            }
        }
    }

    /// The extension answered: the lease holds, moved as `moved` says, or it was lost.
    pub(super) fn extended(&mut self, delivery: DeliveryId, moved: Leased, reply: &Reply<R>) {
        let now = self.now;
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        let options = &self.subs[d.sub.0].options;
        let (lease, extend_every) = (options.lease, options.extend_every);
        let held = affected_any(reply);
        if let Some(l) = d.lease_mut() {
            if held {
                l.fence = Some(moved.fence);
                l.since = moved.since;
                l.expires = moved.since.plus(lease);
                l.extend_at = Some(now.plus(extend_every));
            } else {
                l.lost = true;
            }
        }
        if !held {
            d.holds = false;
            if d.is_handed() {
                self.events.push_back(Event::LeaseLost { delivery });
            }
        }
        self.delivery_release(delivery);
    }

    /// The settlement of one lease answered. In a transaction lent to the handler it commits
    /// with the handler's writes, or, its lease lost, rolls them back.
    pub(super) fn lease_settled(&mut self, delivery: DeliveryId, reply: &Reply<R>) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        if d.lent
            && let Some(conn) = d.conn
        {
            d.lent = false;
            let statements = &self.subs[d.sub.0].statements;
            let (end, stage) = if affected_any(reply) {
                (statements.commit.clone(), DeliveryStage::Commit)
            } else {
                self.events.push_back(Event::SettleFailed {
                    delivery,
                    error: SettleError::LeaseLost,
                });
                (statements.rollback.clone(), DeliveryStage::Rollback)
            };
            return self.delivery_execute(delivery, conn, &end, Vec::new(), stage);
        }
        let sub = d.sub;
        d.holds = false;
        let outcome = match d.ending() {
            Some(Ending::Settle(o)) => o,
            _ => Outcome::Ack,
        };
        if affected_any(reply) {
            self.settled_event(delivery, outcome);
        } else {
            self.events.push_back(Event::SettleFailed {
                delivery,
                error: SettleError::LeaseLost,
            });
        }
        self.delivery_release(delivery);
        self.settle_done(sub, delivery);
    }

    /// The settlement of a batch answered with the ids it settled: each of the batch is
    /// settled, or its lease was lost.
    pub(super) fn batch_settled(&mut self, delivery: DeliveryId, reply: Reply<R>) {
        let settled = first_column(reply);
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        let sub = d.sub;
        let batch = d
            .lease_mut()
            .map(|l| std::mem::take(&mut l.batch))
            .unwrap_or_default();
        for each in std::iter::once(delivery).chain(batch.iter().copied()) {
            let Some(d) = self.deliveries.get_mut(each) else {
                continue;
            };
            d.holds = false;
            let outcome = match d.ending() {
                Some(Ending::Settle(o)) => o,
                _ => Outcome::Ack,
            };
            if settled.contains(&d.id) {
                self.settled_event(each, outcome);
            } else {
                self.events.push_back(Event::SettleFailed {
                    delivery: each,
                    error: SettleError::LeaseLost,
                });
            }
        }
        for each in batch {
            self.finish_delivery(each);
        }
        self.delivery_release(delivery);
        self.settle_done(sub, delivery);
    }

    /// The release of the lease (a retry, a drop) answered.
    pub(super) fn lease_released(&mut self, delivery: DeliveryId, reply: &Reply<R>) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        d.holds = false;
        if let Some(Ending::Settle(outcome)) = d.ending() {
            if affected_any(reply) {
                self.settled_event(delivery, outcome);
            } else {
                self.events.push_back(Event::SettleFailed {
                    delivery,
                    error: SettleError::LeaseLost,
                });
            }
        }
        self.delivery_release(delivery);
    }

    // A lease statement that a deadlock or a serialization failure rolled back (a settlement
    // batch beside a claim's row locks, say) runs again at once on its connection, up to
    // [`DEADLOCK_RERUNS`] times in the delivery's life: each statement of the form commits on
    // its own and is fenced by the lease, so running it again does what it would have. A
    // batch runs again with the settlements it carried. `false`: not such a statement, or no
    // rerun left.
    pub(super) fn rerun_lease_step(&mut self, delivery: DeliveryId, stage: DeliveryStage) -> bool {
        if !matches!(
            stage,
            DeliveryStage::Extend { .. }
                | DeliveryStage::Settle
                | DeliveryStage::SettleBatch
                | DeliveryStage::ReleaseLease
        ) {
            return false;
        }
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return false;
        };
        let (sub, has_conn) = (d.sub, d.conn.is_some());
        let Some(l) = d
            .lease_mut()
            .filter(|l| has_conn && l.reruns < DEADLOCK_RERUNS)
        else {
            return false;
        };
        l.reruns += 1;
        let batch = std::mem::take(&mut l.batch);
        self.wait_again(sub, batch);
        self.lease_acquired(delivery);
        true
    }

    /// Settles `delivery` and the settlements waiting behind it, up to [`SETTLE_BATCH`], in
    /// one statement on `conn`.
    fn settle_batch(&mut self, delivery: DeliveryId, conn: ConnId) {
        let Some(sub) = self.deliveries.get(delivery).map(|d| d.sub) else {
            return;
        };
        let batch: Vec<DeliveryId> = match self.subs[sub.0].lease_mut() {
            Some(lease) => {
                let waiting = &mut lease.settles.waiting;
                let more = waiting.len().min(SETTLE_BATCH - 1);
                waiting.drain(..more).collect()
            }
            None => Vec::new(),
        };
        let Some(statement) = self.batch_statement(sub, batch.len() + 1) else {
            // No statement settles them together: each settles on its own.
            self.wait_again(sub, batch);
            return self.settle_alone(delivery, conn);
        };
        let mut ids = Vec::with_capacity(batch.len() + 1);
        let mut fences = Vec::with_capacity(batch.len() + 1);
        for each in std::iter::once(delivery).chain(batch.iter().copied()) {
            if let Some(d) = self.deliveries.get(each) {
                ids.push(d.id.clone());
                fences.push(d.lease().and_then(|l| l.fence).unwrap_or_default());
            }
        }
        let binds = statement.binds(|arg| match arg {
            Arg::IdAt(i) => ids[i].clone(),
            Arg::FenceAt(i) => Value::Int(fences[i].micros()),
            _ => Value::Null,
        });
        if let Some(l) = self
            .deliveries
            .get_mut(delivery)
            .and_then(|d| d.lease_mut())
        {
            l.batch = batch;
        }
        self.delivery_execute(
            delivery,
            conn,
            &statement,
            binds,
            DeliveryStage::SettleBatch,
        );
    }

    /// The settlement of one lease, on `conn`.
    fn settle_alone(&mut self, delivery: DeliveryId, conn: ConnId) {
        let Some(d) = self.deliveries.get(delivery) else {
            return;
        };
        let Some(l) = d.lease() else {
            return;
        };
        let (fence, st) = (l.fence.unwrap_or_default(), l.st.clone());
        let binds = self.settle_binds(delivery, &st.settle, fence);
        self.delivery_execute(delivery, conn, &st.settle, binds, DeliveryStage::Settle);
    }

    /// The settlement of `rows` leases of `sub` in one statement, rendered once per size.
    fn batch_statement(&mut self, sub: SubId, rows: usize) -> Option<Statement> {
        let dialect = self.dialect;
        let s = &mut self.subs[sub.0];
        let FormState::Lease(lease) = &mut s.form else {
            return None;
        };
        if let Some(statement) = lease.settles.batches.get(&rows) {
            return Some(statement.clone());
        }
        let statement = Statements::settle_leases(dialect, &s.desc, rows)?;
        lease.settles.batches.insert(rows, statement.clone());
        Some(statement)
    }

    /// Settlements taken off `sub`'s queue that did not run go back to its front, in order.
    fn wait_again(&mut self, sub: SubId, batch: Vec<DeliveryId>) {
        if let Some(lease) = self.subs[sub.0].lease_mut() {
            for each in batch.into_iter().rev() {
                lease.settles.waiting.push_front(each);
            }
        }
    }

    /// A settlement statement of `sub` that `delivery` ran has answered or will not run: the
    /// settlements waiting behind it start, together.
    pub(in crate::broker) fn settle_done(&mut self, sub: SubId, delivery: DeliveryId) {
        let Some(lease) = self.subs[sub.0].lease_mut() else {
            return;
        };
        let settles = &mut lease.settles;
        if settles.settling != Some(delivery) {
            return;
        }
        settles.settling = None;
        let Some(next) = settles.waiting.pop_front() else {
            return;
        };
        settles.settling = Some(next);
        self.lease_acquire(next);
    }
}

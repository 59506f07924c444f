//! A delivery's statements: sent on its connection, answered, failed, and the delivery's
//! removal once its last step is done.

use crate::types::{Action, ConnId, DeliveryId, Event, Outcome, Reply, SettleError};
use crate::value::{DbError, ErrorKind, Value};

use super::super::Broker;
use super::super::Step;
use super::super::rows::answer;
use super::held::Unlocked;
use super::{DeliveryStage, Ending};

impl<R> Broker<R> {
    pub(super) fn delivery_step(
        &mut self,
        delivery: DeliveryId,
        conn: ConnId,
        action: Action,
        stage: DeliveryStage,
    ) {
        self.send(conn, action, Step::Delivery { delivery, stage });
    }

    pub(in crate::broker) fn delivery_execute(
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

    pub(in crate::broker) fn on_delivery(
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
            DeliveryStage::LendAcquire => self.lend_acquired(delivery),
            DeliveryStage::Extend(lease) => self.extended(delivery, lease, &reply),
            DeliveryStage::Settle if lease => self.lease_settled(delivery, &reply),
            DeliveryStage::Settle => self.held_settled(delivery),
            DeliveryStage::SettleBatch => self.batch_settled(delivery, reply),
            DeliveryStage::ReleaseLease => self.lease_released(delivery, &reply),
            DeliveryStage::Commit | DeliveryStage::Rollback => self.row_lock_ended(delivery, stage),
            DeliveryStage::Unlock => {
                let unlocked = if answer(reply) {
                    Unlocked::Released
                } else {
                    Unlocked::MaybeHeld
                };
                self.after_unlock(delivery, unlocked);
            }
            DeliveryStage::Ping => self.pinged(delivery),
            DeliveryStage::Savepoint => self.savepoint_set(delivery),
            DeliveryStage::Unwind => self.unwound(delivery),
            DeliveryStage::Release | DeliveryStage::Close => self.step_done(delivery),
        }
    }

    /// The connection of a delivery's step went back or closed: an extension ended (back to
    /// work, or to the settlement asked for meanwhile), or the delivery ended.
    pub(super) fn step_done(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        d.conn = None;
        if d.ending().is_none() {
            let queued = d.back_to_work();
            self.back_in_work(delivery, queued);
        } else {
            self.finish_delivery(delivery);
        }
    }

    /// A delivery's step ended with the delivery still in work: the settlement asked for
    /// meanwhile runs, or else the transaction its handler asked for meanwhile is begun.
    fn back_in_work(&mut self, delivery: DeliveryId, queued: Option<Ending>) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        let wanted = d
            .lease_mut()
            .is_some_and(|l| std::mem::take(&mut l.lend_wanted));
        match queued {
            Some(queued) => {
                if wanted {
                    self.lent_none(delivery);
                }
                self.end(delivery, queued);
            }
            None if wanted => self.begin_lend(delivery),
            None => {}
        }
    }

    /// The delivery's step gives its connection back.
    pub(super) fn delivery_release(&mut self, delivery: DeliveryId) {
        let Some(conn) = self
            .deliveries
            .get_mut(delivery)
            .and_then(|d| d.conn.take())
        else {
            return;
        };
        self.delivery_step(delivery, conn, Action::Release, DeliveryStage::Release);
    }

    pub(super) fn on_delivery_failed(
        &mut self,
        delivery: DeliveryId,
        stage: DeliveryStage,
        error: DbError,
    ) {
        if matches!(stage, DeliveryStage::Savepoint | DeliveryStage::LendAcquire) {
            self.lent_none(delivery);
        }
        if matches!(stage, DeliveryStage::Ping) {
            // Its session no longer answers: the row is never handed, and ends as its
            // connection closes.
            self.ahead.forget_ping(delivery);
            if let Some(d) = self.deliveries.get_mut(delivery) {
                d.ping_failed();
            }
        }
        if matches!(stage, DeliveryStage::Release | DeliveryStage::Close) {
            self.step_done(delivery);
            return;
        }
        if error.kind == ErrorKind::Serialization && self.rerun_lease_step(delivery, stage) {
            return;
        }
        self.report_failed_step(delivery, stage, error);
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        if let Some(key) = d.key().cloned()
            && d.holds
        {
            // The connection closes, and the key's lock with it.
            self.keys.remove(&key);
            if d.ending() == Some(Ending::Shutdown) {
                self.counts.connections_closed += 1;
            }
        }
        d.holds = false;
        match (stage, d.conn.take()) {
            (DeliveryStage::Acquire | DeliveryStage::LendAcquire, Some(conn)) => {
                self.conns.forget(conn);
                self.after_failed_step(delivery);
            }
            (_, Some(conn)) => {
                self.delivery_step(delivery, conn, Action::Close, DeliveryStage::Close);
            }
            (_, None) => self.after_failed_step(delivery),
        }
    }

    /// A delivery's step failed: a settlement's statement fails the settlement (and those
    /// settled with it in one statement, which end here); any other step is an error of the
    /// subscription.
    fn report_failed_step(&mut self, delivery: DeliveryId, stage: DeliveryStage, error: DbError) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        let sub = d.sub;
        let settling = matches!(d.ending(), Some(Ending::Settle(_)))
            && matches!(
                stage,
                DeliveryStage::Acquire
                    | DeliveryStage::Settle
                    | DeliveryStage::SettleBatch
                    | DeliveryStage::ReleaseLease
                    | DeliveryStage::Commit
            );
        if !settling {
            self.events.push_back(Event::Error { sub, error });
            return;
        }
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
    }

    pub(super) fn after_failed_step(&mut self, delivery: DeliveryId) {
        let now = self.now;
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        if d.ending().is_some() {
            self.finish_delivery(delivery);
            return;
        }
        let queued = d.back_to_work();
        if let Some(l) = d.lease_mut() {
            l.extend_at = Some(now.plus(std::time::Duration::from_secs(1)));
        }
        self.back_in_work(delivery, queued);
    }

    /// A dropped delivery's deadline passed: close its connection, whatever still runs on it.
    pub(in crate::broker) fn force_close(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        d.deadline = None;
        let lent = d.take_lent();
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
        for conn in conn.into_iter().chain(lent) {
            self.send(conn, Action::Close, Step::Orphan);
        }
        self.finish_delivery(delivery);
    }

    pub(in crate::broker) fn finish_delivery(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.remove(delivery) else {
            return;
        };
        debug_assert!(
            d.conn.is_none() && !d.lends(),
            "a delivery ended holding a connection"
        );
        debug_assert!(
            d.lease().is_none_or(|l| l.batch.is_empty()),
            "a settlement ended with its batch unsettled"
        );
        self.settle_done(d.sub, delivery);
        let s = &mut self.subs[d.sub.0];
        s.rows_claimed -= 1;
        if let Some(lease) = s.lease_mut() {
            lease.settling_freed -= usize::from(d.is_freed());
        }
        if d.is_handed() {
            s.rows_handed -= 1;
        }
        if d.at_handler() {
            s.at_handlers -= 1;
        }
        // A delivery that gives its row back, or releases its key, lets the next claim run at
        // once: the row, or the next row of the key, waits for no poll.
        let (ending, settled) = (d.ending(), d.is_settled());
        let retried = ending == Some(Ending::Settle(Outcome::Retry));
        let waits = d.terms.delay.filter(|t| !t.is_zero() && retried && settled);
        // A table with nowhere to write the delay: the row waits it here, and the claims
        // pass over it meanwhile.
        let nowhere = s.desc.due.is_none() && s.desc.locked_until().is_none();
        let held = waits
            .filter(|_| nowhere && !s.stopped)
            .is_some_and(|delay| {
                let until = self.now.plus(delay);
                s.waiting.hold(d.id.clone(), until)
            });
        if held {
            s.next_claim_at = Some(self.now);
        } else if let Some(delay) = waits.filter(|_| d.terms.paced && !s.stopped) {
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
        } else if (d.key().is_some() || !settled || retried || d.terms.exhausted) && !s.stopped {
            s.next_claim_at = Some(self.now);
        }
        // A row retried into its table's due or lease column: the claims that start before
        // it is due do not find it, and the last of them claims again when it is.
        if let Some(delay) = waits.filter(|_| !nowhere && !s.stopped) {
            s.note_retry_due(self.now.plus(delay));
        }
        let returned = !settled && matches!(ending, Some(Ending::Drop | Ending::Shutdown));
        // A lease kept past the shutdown returns when it runs out, not now.
        let kept_lease = d.lease().is_some() && ending == Some(Ending::Shutdown);
        if returned && d.is_handed() && !kept_lease {
            self.events.push_back(Event::Returned { delivery });
        }
        if d.is_handed() || d.at_handler() {
            self.hand_ahead(d.sub);
        }
    }
}

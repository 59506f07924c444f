//! The row lock and advisory lock forms' deliveries, whose connection holds the row (the
//! claim's transaction) or the key (its lock) from the claim to the end.
//!
//! Row lock: the settlement's statement commits the claim's transaction; a retry commits the
//! counted attempt alone, or with the row's new due time and error; a drop or the shutdown
//! rolls it back. Advisory lock: the settlement commits on its own, then the key is released;
//! a retry runs no statement unless it writes a due time or an error, and the release returns
//! the row. A failure marks the row failed, in either form. A connection whose key may still
//! be held closes, which ends the lock.

use crate::dialect::{Dialect, KeyLocks, Statement};
use crate::types::{Action, DeliveryId, Event, Outcome, SettleError};
use crate::value::Time;
use crate::value::{DbError, ErrorKind};

use super::super::Broker;
use super::{DeliveryStage, Ending, Held};

/// What the release of an advisory delivery's key answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unlocked {
    Released,
    /// The release failed or answered no: the key may still be held.
    MaybeHeld,
}

impl<R> Broker<R> {
    /// The statement that settles a delivery of the row lock or advisory lock form as it
    /// ends, where one runs on its connection: the delete or mark of an acknowledgement, the
    /// failed mark of a rejection, the due time and error of a retry that writes them.
    fn held_statement(&self, delivery: DeliveryId, ending: Ending) -> Option<Statement> {
        let d = self.deliveries.get(delivery)?;
        let (settle, fail, retry) = match &d.held {
            Held::RowLock(st) => (&st.settle, &st.fail, &st.retry),
            Held::Advisory { st, .. } => (&st.settle, &st.fail, &st.retry),
            Held::Lease(_) => return None,
        };
        match ending {
            Ending::Settle(Outcome::Ack) => Some(settle.clone()),
            Ending::Settle(Outcome::Reject) => fail.clone(),
            Ending::Settle(Outcome::Retry) if self.retry_writes(delivery) => retry.clone(),
            Ending::Settle(Outcome::Retry) | Ending::Drop | Ending::Shutdown => None,
        }
    }

    // The handler asks for a transaction on its delivery's connection: in the row lock form
    // the claim's, past a savepoint; in the advisory lock form a new one, begun on the
    // connection that holds the key. Then [`Event::Lent`]; anything else answers no
    // connection.
    pub(in crate::broker) fn begin_lend(&mut self, delivery: DeliveryId) {
        let sqlite = self.dialect == Dialect::Sqlite;
        if let Some(d) = self.deliveries.get_mut(delivery)
            && d.lease().is_some()
        {
            let (ends, busy, lent) = (d.ending().is_some(), !d.in_work(), d.lent);
            let Some(l) = d.lease_mut() else {
                return;
            };
            if ends || lent || l.lent.is_some() || l.lost || sqlite {
                return self.lent_none(delivery);
            }
            if busy {
                // An extension runs on its own connection: the transaction is begun after it.
                l.lend_wanted = true;
                return;
            }
            return self.lease_lend(delivery);
        }
        let lendable = self.deliveries.get(delivery).and_then(|d| {
            if !d.in_work() || d.lent {
                return None;
            }
            match (&d.held, d.conn) {
                (Held::RowLock(st), Some(conn)) => Some((st.savepoint.clone(), conn)),
                (Held::Advisory { .. }, Some(conn)) => {
                    Some((self.subs[d.sub.0].statements.begin.clone(), conn))
                }
                _ => None,
            }
        });
        let Some((savepoint, conn)) = lendable else {
            return self.lent_none(delivery);
        };
        if let Some(d) = self.deliveries.get_mut(delivery) {
            d.begin_step();
        }
        self.delivery_execute(
            delivery,
            conn,
            &savepoint,
            Vec::new(),
            DeliveryStage::Savepoint,
        );
    }

    /// No transaction is lent to the handler.
    pub(super) fn lent_none(&mut self, delivery: DeliveryId) {
        self.events.push_back(Event::Lent {
            delivery,
            conn: None,
        });
    }

    /// The lease form: a connection of its own for the transaction lent to the handler.
    pub(super) fn lease_lend(&mut self, delivery: DeliveryId) {
        let conn = self.new_conn();
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        d.conn = Some(conn);
        d.begin_step();
        self.delivery_step(delivery, conn, Action::Acquire, DeliveryStage::LendAcquire);
    }

    /// The lease form: the lent transaction's connection came; it begins.
    pub(super) fn lend_acquired(&mut self, delivery: DeliveryId) {
        let Some((conn, sub)) = self
            .deliveries
            .get(delivery)
            .and_then(|d| Some((d.conn?, d.sub)))
        else {
            return;
        };
        let begin = self.subs[sub.0].statements.begin.clone();
        self.delivery_execute(delivery, conn, &begin, Vec::new(), DeliveryStage::Savepoint);
    }

    /// The savepoint is set (or the transaction begun): the connection is the handler's until
    /// it settles. In the lease form the connection moves to the lease, so that extensions
    /// run on connections of their own meanwhile.
    pub(super) fn savepoint_set(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        d.lent = true;
        let queued = d.back_to_work();
        let held_conn = d.conn;
        if let Held::Lease(l) = &mut d.held {
            l.lent = held_conn;
            d.conn = None;
            let conn = held_conn
                .filter(|_| queued.is_none())
                .map(|c| self.conns.physical(c));
            self.events.push_back(Event::Lent { delivery, conn });
            if let Some(ending) = queued {
                self.end(delivery, ending);
            }
            return;
        }
        // A handler that settled or was dropped meanwhile takes nothing.
        let conn = d
            .conn
            .filter(|_| queued.is_none())
            .map(|c| self.conns.physical(c));
        self.events.push_back(Event::Lent { delivery, conn });
        if let Some(ending) = queued {
            self.end(delivery, ending);
        }
    }

    /// The handler's writes are undone: the settlement goes on as it would have.
    pub(super) fn unwound(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get(delivery) else {
            return;
        };
        let Some(ending) = d.ending() else {
            return;
        };
        match d.held {
            Held::RowLock(_) => self.row_lock_end(delivery, ending),
            Held::Advisory { .. } => self.advisory_end(delivery, ending),
            // A delivery the shutdown ends keeps its lease; any other ending's statement runs
            // on the connection the lent transaction rolled back on.
            Held::Lease(_) if ending == Ending::Shutdown && d.is_handed() => {
                self.delivery_release(delivery)
            }
            Held::Lease(_) => self.lease_acquired(delivery),
        }
    }

    /// A row lock delivery ends, in its claim's transaction.
    pub(super) fn row_lock_end(&mut self, delivery: DeliveryId, ending: Ending) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        let Held::RowLock(st) = &d.held else {
            return self.finish_delivery(delivery);
        };
        let Some(conn) = d.conn else {
            // Its transaction ended already (a savepoint that failed closed its connection):
            // the row went back with it, and the settlement has nothing to commit.
            if matches!(ending, Ending::Settle(_)) {
                self.events.push_back(Event::SettleFailed {
                    delivery,
                    error: SettleError::Db(DbError::new(
                        ErrorKind::ConnectionLost,
                        "the claim's transaction ended before the settlement: the row went back to the queue",
                    )),
                });
            }
            return self.finish_delivery(delivery);
        };
        if d.lent && matches!(ending, Ending::Settle(Outcome::Retry | Outcome::Reject)) {
            // What the handler wrote in the lent transaction goes with a retry or a failure.
            d.lent = false;
            let unwind = st.rollback_to_savepoint.clone();
            return self.delivery_execute(
                delivery,
                conn,
                &unwind,
                Vec::new(),
                DeliveryStage::Unwind,
            );
        }
        let Some(d) = self.deliveries.get(delivery) else {
            return;
        };
        let statements = &self.subs[d.sub.0].statements;
        let (statement, binds, stage) = match (ending, self.held_statement(delivery, ending)) {
            (Ending::Settle(_), Some(settle)) => {
                let binds = self.settle_binds(delivery, &settle, Time(0));
                (settle, binds, DeliveryStage::Settle)
            }
            (Ending::Settle(_), None) => {
                (statements.commit.clone(), Vec::new(), DeliveryStage::Commit)
            }
            (Ending::Drop | Ending::Shutdown, _) => (
                statements.rollback.clone(),
                Vec::new(),
                DeliveryStage::Rollback,
            ),
        };
        self.delivery_execute(delivery, conn, &statement, binds, stage);
    }

    /// An advisory delivery ends: a settlement's statement, then the release of its key. With
    /// a transaction lent to the handler, an acknowledgement's statement runs in it and
    /// commits with the handler's writes; any other ending rolls it back first.
    pub(super) fn advisory_end(&mut self, delivery: DeliveryId, ending: Ending) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        let (Held::Advisory { .. }, Some(conn)) = (&d.held, d.conn) else {
            // Its connection closed already (a transaction that failed to begin for the
            // handler closed it, its key with it): the row went back.
            if matches!(ending, Ending::Settle(_)) {
                self.events.push_back(Event::SettleFailed {
                    delivery,
                    error: SettleError::Db(DbError::new(
                        ErrorKind::ConnectionLost,
                        "the delivery's connection closed before the settlement: the row went back to the queue",
                    )),
                });
            }
            return self.finish_delivery(delivery);
        };
        if d.lent && ending != Ending::Settle(Outcome::Ack) {
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
        let Some(settle) = self.held_statement(delivery, ending) else {
            return self.delivery_unlock(delivery);
        };
        let binds = self.settle_binds(delivery, &settle, Time(0));
        self.delivery_execute(delivery, conn, &settle, binds, DeliveryStage::Settle);
    }

    /// The settlement's statement ran: a row lock delivery commits it; an advisory delivery is
    /// settled, and its key is released.
    pub(super) fn held_settled(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        match &d.held {
            Held::RowLock(_) => {
                let Some(conn) = d.conn else {
                    return;
                };
                let commit = self.subs[d.sub.0].statements.commit.clone();
                self.delivery_execute(delivery, conn, &commit, Vec::new(), DeliveryStage::Commit);
            }
            Held::Advisory { .. } if d.lent => {
                // The handler's writes and the settlement commit together.
                let Some(conn) = d.conn else {
                    return;
                };
                let commit = self.subs[d.sub.0].statements.commit.clone();
                self.delivery_execute(delivery, conn, &commit, Vec::new(), DeliveryStage::Commit);
            }
            Held::Advisory { .. } => self.advisory_settled(delivery),
            Held::Lease(_) => {}
        }
    }

    /// An advisory delivery's settlement took effect: it is settled, and its key is released.
    fn advisory_settled(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        d.lent = false;
        let outcome = match d.ending() {
            Some(Ending::Settle(o)) => o,
            _ => Outcome::Ack,
        };
        self.settled_event(delivery, outcome);
        self.delivery_unlock(delivery);
    }

    /// A row lock delivery's transaction ended: committed (settled) or rolled back. An advisory
    /// delivery's lent transaction committed with its settlement.
    pub(super) fn row_lock_ended(&mut self, delivery: DeliveryId, stage: DeliveryStage) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        if matches!(d.held, Held::Advisory { .. }) {
            return self.advisory_settled(delivery);
        }
        d.holds = false;
        if matches!(stage, DeliveryStage::Commit) {
            d.mark_settled();
            if let Some(Ending::Settle(outcome)) = d.ending() {
                self.settled_event(delivery, outcome);
            }
        }
        self.delivery_release(delivery);
    }

    /// Releases an advisory delivery's key.
    fn delivery_unlock(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get(delivery) else {
            return;
        };
        let (Held::Advisory { st, key }, Some(conn)) = (&d.held, d.conn) else {
            return;
        };
        let (sub, key) = (d.sub, key.clone());
        match &st.keys {
            KeyLocks::Registry => {
                self.keys.remove(&key);
                self.after_unlock(delivery, Unlocked::Released);
            }
            KeyLocks::Custom => {
                let action = Action::Unlock { sub, key };
                self.delivery_step(delivery, conn, action, DeliveryStage::Unlock);
            }
            KeyLocks::Database { unlock, .. } => {
                let unlock = unlock.clone();
                let arg = self.key_arg(sub, &key);
                let binds = unlock.binds(|_| arg.clone());
                self.delivery_execute(delivery, conn, &unlock, binds, DeliveryStage::Unlock);
            }
        }
    }

    /// The key is released, or may still be held: the connection goes back to the pool, or
    /// is closed.
    pub(super) fn after_unlock(&mut self, delivery: DeliveryId, unlocked: Unlocked) {
        let released = unlocked == Unlocked::Released;
        let now = self.now;
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        if let Some(key) = d.key() {
            self.keys.remove(key);
        }
        let s = &mut self.subs[d.sub.0];
        if released && s.first_rows_only() && !s.stopped {
            // A claim that reads the first due rows alone may find them free now: the next
            // one need not wait for the poll.
            s.next_claim_at = Some(now);
        }
        d.holds = false;
        if d.ending() == Some(Ending::Settle(Outcome::Retry)) && !d.is_settled() {
            // A retry that wrote nothing: the release returns the row.
            self.settled_event(delivery, Outcome::Retry);
        }
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        let Some(conn) = d.conn.take() else {
            return self.finish_delivery(delivery);
        };
        if d.ending() == Some(Ending::Shutdown) {
            if released {
                self.counts.locks_released += 1;
            } else {
                self.counts.connections_closed += 1;
            }
        }
        // A delivery the runtime dropped closes its connection; a row claimed ahead and given
        // back before it was handed gives its connection back to the pool.
        let close = !released || (d.ending() == Some(Ending::Drop) && d.is_handed());
        let (action, stage) = if close {
            (Action::Close, DeliveryStage::Close)
        } else {
            (Action::Release, DeliveryStage::Release)
        };
        self.delivery_step(delivery, conn, action, stage);
    }
}

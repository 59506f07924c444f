//! How a delivery ends: the handler's settlement as the table keeps it, its binds, the
//! events it takes effect with, and the dispatch to the form that ends it.

use std::sync::Arc;

use crate::types::{Action, DeliveryId, Event, Outcome, SettleError, Settlement};
use crate::value::{Time, Value};

use super::super::claim::micros_of;
use super::super::options::{DROP_GRACE, MAX_ERROR_LEN, MAX_RETRY_DELAY};
use super::super::{Broker, State, Step};
use super::{Ending, Failure, Held};

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
    /// The handler's settlement, as the table can keep it: a rejection on a table that keeps
    /// no failed rows returns the row as a retry; a failure is reported once it takes effect.
    pub(in crate::broker) fn note_settlement(
        &mut self,
        delivery: DeliveryId,
        settlement: Settlement,
    ) -> Outcome {
        let Some(d) = self.deliveries.get(delivery) else {
            return settlement.outcome;
        };
        let desc = self.subs[d.sub.0].desc;
        let keeps_failed = desc.failed_at.is_some();
        let writes_delay = desc.due.is_some() || desc.locked_until().is_some();
        // The last attempt the budget allows fails at once, with the handler's own error:
        // its row would only wait its backoff to fail at its next take.
        let last = self.subs[d.sub.0]
            .options
            .max_attempts
            .zip(d.attempt)
            .is_some_and(|(max, attempt)| attempt >= i64::from(max));
        let outcome = match settlement.outcome {
            Outcome::Reject if !keeps_failed => Outcome::Retry,
            Outcome::Retry if last && keeps_failed => Outcome::Reject,
            other => other,
        };
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return outcome;
        };
        if d.unsettled() {
            let terms = &mut d.terms;
            terms.delay = settlement
                .delay
                .filter(|_| outcome == Outcome::Retry)
                .map(|delay| delay.min(MAX_RETRY_DELAY));
            terms.error = settlement.error.map(|e| cut_error(e, MAX_ERROR_LEN));
            let failed = outcome == Outcome::Reject || settlement.outcome == Outcome::Reject;
            terms.failure = failed.then_some(if keeps_failed {
                Failure::Kept
            } else {
                Failure::Returned
            });
            terms.paced = settlement.outcome == Outcome::Reject && !keeps_failed && !writes_delay;
            // A table with nowhere to write the delay: the row waits it in this process from
            // now on, before its settlement lets the row go, so no claim issued from here on
            // takes it back (finish_delivery holds it again from the settlement's end).
            let held = terms.delay.filter(|t| !t.is_zero() && !writes_delay);
            let (sub, id) = (d.sub, d.id.clone());
            if let Some(delay) = held {
                let until = self.now.plus(delay);
                let s = &mut self.subs[sub.0];
                if !s.stopped {
                    s.waiting.hold(id, until);
                }
            }
        }
        outcome
    }

    /// The binds of a settlement's statement: the row's id, its lease's `fence`, the retry's
    /// delay and the error.
    pub(in crate::broker) fn settle_binds(
        &self,
        delivery: DeliveryId,
        statement: &crate::Statement,
        fence: Time,
    ) -> Vec<Value> {
        let Some(d) = self.deliveries.get(delivery) else {
            return Vec::new();
        };
        statement.binds(|arg| match arg {
            crate::Arg::Id => d.id.clone(),
            crate::Arg::Fence => Value::Int(fence.micros()),
            crate::Arg::RetryIn => Value::Int(micros_of(d.terms.delay.unwrap_or_default())),
            crate::Arg::Error => d
                .terms
                .error
                .as_deref()
                .map_or(Value::Null, |e| Value::Text(e.to_owned())),
            _ => Value::Null,
        })
    }

    /// Whether a retry writes a statement: it waits, or records an error.
    pub(in crate::broker) fn retry_writes(&self, delivery: DeliveryId) -> bool {
        self.deliveries
            .get(delivery)
            .is_some_and(|d| d.terms.delay.is_some_and(|t| !t.is_zero()) || d.terms.error.is_some())
    }

    /// A settlement took effect: [`Event::Settled`] where the runtime was handed the row, then
    /// [`Event::Failed`] where the settlement is a failure.
    pub(in crate::broker) fn settled_event(&mut self, delivery: DeliveryId, outcome: Outcome) {
        let Some(d) = self.deliveries.get_mut(delivery) else {
            return;
        };
        d.mark_settled();
        if d.is_handed() {
            self.events.push_back(Event::Settled { delivery, outcome });
        }
        if let Some(failure) = d.terms.failure.take() {
            self.events.push_back(Event::Failed {
                sub: d.sub,
                delivery,
                id: d.id.clone(),
                attempt: d.attempt,
                error: d.terms.error.clone(),
                kept: failure == Failure::Kept,
            });
        }
    }

    /// A delivery ends: settled, dropped, or by the shutdown.
    pub(in crate::broker) fn end(&mut self, delivery: DeliveryId, ending: Ending) {
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
        if !d.in_work() {
            if !d.queue_ending(ending) && matches!(ending, Ending::Settle(_)) {
                let error = if !running || d.ending() == Some(Ending::Shutdown) {
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
                d.begin_ending(ending);
                if let Some(conn) = d.take_lent() {
                    // The handler's transaction ends with its connection.
                    self.send(conn, Action::Close, Step::Orphan);
                }
                self.finish_delivery(delivery);
                return;
            }
        }
        d.begin_ending(ending);
        if let Some(l) = d.lease_mut() {
            l.extend_at = None;
        }
        if ending == Ending::Drop && (d.conn.is_some() || d.lends()) {
            d.deadline = Some(now.plus(DROP_GRACE));
        }
        match &d.held {
            Held::RowLock(_) => self.row_lock_end(delivery, ending),
            Held::Lease(_) => self.lease_end(delivery, ending),
            Held::Advisory { .. } => self.advisory_end(delivery, ending),
        }
    }
}

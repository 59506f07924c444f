//! The lease form's claim: write an expiry into the first claimable rows, counting their
//! attempts, and deliver them under it. PostgreSQL and SQLite do it in one `UPDATE ..
//! RETURNING`; MySQL and MariaDB lock and read the rows, then write the leases, in one
//! transaction. The expiry is the database's time plus the lease, read back from the claim:
//! it fences the row's later statements; this process's clock only estimates when it runs
//! out, from when the claim's statement left.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::dialect::{Arg, LeaseClaim, LeaseStatements, UNTIL};
use crate::types::{ConnId, Event, Reply, SubId};
use crate::value::{DbError, ErrorKind, Time, Value};

use super::super::Broker;
use super::super::delivery::Leased;
use super::super::rows::{Taken, rows_of};
use super::ClaimId;
use super::{Claim, ClaimForm, ClaimStage, Fixed};

/// Where a lease claim is.
#[derive(Clone, Copy, Debug)]
pub(in crate::broker) enum Stage {
    /// The claim in one statement.
    ClaimLease,
    Begin,
    SelectLease,
    MarkLease,
    Commit,
}

#[derive(Debug)]
pub(in crate::broker) struct Claiming<R> {
    st: Arc<LeaseStatements>,
    /// When the statement that writes the leases left: the lease runs out no sooner than
    /// a lease's length after it, by this process's clock.
    sent_at: Option<Time>,
    /// MySQL and MariaDB: the rows locked and read, whose leases are being written.
    pub(super) taken: Vec<Taken<R>>,
}

impl<R> Claiming<R> {
    pub(super) fn new(st: &Arc<LeaseStatements>) -> Self {
        Self {
            st: st.clone(),
            sent_at: None,
            taken: Vec::new(),
        }
    }
}

impl<R> Broker<R> {
    fn lease(
        claims: &mut BTreeMap<ClaimId, Claim<R>>,
        claim: ClaimId,
    ) -> Option<(SubId, usize, &mut Claiming<R>)> {
        let c = claims.get_mut(&claim)?;
        match &mut c.form {
            ClaimForm::Lease(l) => Some((c.sub, c.limit, l)),
            ClaimForm::RowLock(_) | ClaimForm::Advisory(_) => None,
        }
    }

    /// Widens the claim to the slots that freed since it started, just before its statement
    /// runs: under load more handlers end while a claim acquires its connection, and one claim
    /// then takes their rows too. Answers the claim's limit.
    fn top_up(&mut self, claim: ClaimId) -> usize {
        let Some(sub) = self.claims.get(&claim).map(|c| c.sub) else {
            return 0;
        };
        let extra = self.subs[sub.0].free();
        self.subs[sub.0].claim_slots += extra;
        match self.claims.get_mut(&claim) {
            Some(c) => {
                c.limit += extra;
                c.limit
            }
            None => 0,
        }
    }

    pub(super) fn lease_claim_acquired(&mut self, claim: ClaimId, conn: ConnId) {
        let now = self.now;
        self.top_up(claim);
        let Some((sub, limit, l)) = Self::lease(&mut self.claims, claim) else {
            return;
        };
        let LeaseClaim::Returning { claim: statement } = &l.st.claim else {
            self.claim_fixed(claim, conn, Fixed::Begin, ClaimStage::Lease(Stage::Begin));
            return;
        };
        let mut statement = statement.clone();
        let from = l.st.claim_from.clone();
        l.sent_at = Some(now);
        let lease_for = micros_of(self.subs[sub.0].options.lease);
        let floor = from.and_then(|from| {
            let id = self.subs[sub.0].floor.start(now)?;
            statement = from;
            Some(id)
        });
        if let Some(c) = self.claims.get_mut(&claim) {
            c.from_floor = floor.is_some();
        }
        let binds = statement.binds(|arg| match arg {
            Arg::LeaseFor => Value::Int(lease_for),
            Arg::Limit => Value::Int(limit as i64),
            _ => Value::Int(floor.unwrap_or(i64::MIN)),
        });
        let stage = ClaimStage::Lease(Stage::ClaimLease);
        self.claim_execute(claim, conn, statement, binds, stage);
    }

    pub(super) fn on_lease_claim(
        &mut self,
        claim: ClaimId,
        conn: ConnId,
        stage: Stage,
        reply: Reply<R>,
    ) {
        let now = self.now;
        let Some((sub, limit, l)) = Self::lease(&mut self.claims, claim) else {
            return;
        };
        let st = l.st.clone();
        match (stage, &st.claim) {
            (Stage::ClaimLease, _) => {
                let in_id_order = st.claim_from.is_some();
                self.lease_claimed(claim, sub, limit, in_id_order, reply);
            }
            (Stage::Begin, LeaseClaim::Locking { select, .. }) => {
                // The workers that freed while the transaction began take rows too.
                let limit = self.top_up(claim);
                let lease_for = micros_of(self.subs[sub.0].options.lease);
                let binds = select.binds(|arg| match arg {
                    Arg::Limit => Value::Int(limit as i64),
                    _ => Value::Int(lease_for),
                });
                if let Some((_, _, l)) = Self::lease(&mut self.claims, claim) {
                    l.sent_at = Some(now);
                }
                let stage = ClaimStage::Lease(Stage::SelectLease);
                self.claim_execute(claim, conn, select.clone(), binds, stage);
            }
            (Stage::SelectLease, claiming) => {
                let mut rows = rows_of(reply);
                // More rows than the limit asked for are not this claim's to take.
                rows.truncate(limit);
                let Some(mark) = claiming.mark(rows.len()).cloned() else {
                    // No row (or, past the rendered sizes, none this claim may write).
                    self.claim_fixed(claim, conn, Fixed::Commit, ClaimStage::Lease(Stage::Commit));
                    return;
                };
                // The rows are read before their attempts are counted, with the expiry their
                // leases get: the database's time when the read ran, plus the lease.
                let attempts = self.subs[sub.0].desc.attempt.is_some();
                let taken: Vec<Taken<R>> = rows
                    .into_iter()
                    .map(|row| Taken::read(row, attempts, 1))
                    .collect();
                let until = taken.first().and_then(|t| t.until).unwrap_or_default();
                let binds = mark.binds(|arg| match arg {
                    Arg::IdAt(i) => taken[i].id.clone(),
                    _ => Value::Int(until),
                });
                let Some((_, _, l)) = Self::lease(&mut self.claims, claim) else {
                    return;
                };
                l.taken = taken;
                self.claim_execute(
                    claim,
                    conn,
                    mark,
                    binds,
                    ClaimStage::Lease(Stage::MarkLease),
                );
            }
            (Stage::MarkLease, _) => {
                self.claim_fixed(claim, conn, Fixed::Commit, ClaimStage::Lease(Stage::Commit));
            }
            (Stage::Commit, _) => {
                let taken = std::mem::take(&mut l.taken);
                self.deliver_leased(claim, taken);
                self.claim_release(claim);
            }
            (Stage::Begin, LeaseClaim::Returning { .. }) => {}
        }
    }

    /// The claim's statement that leased its rows and returned them answered: where the
    /// table is claimed in id order the floor learns what it found, and the rows go out.
    fn lease_claimed(
        &mut self,
        claim: ClaimId,
        sub: SubId,
        limit: usize,
        in_id_order: bool,
        reply: Reply<R>,
    ) {
        let attempts = self.subs[sub.0].desc.attempt.is_some();
        let taken: Vec<Taken<R>> = rows_of(reply)
            .into_iter()
            .map(|row| Taken::read(row, attempts, 0))
            .collect();
        if in_id_order {
            let now = self.now;
            let from_floor = self.claims.get(&claim).is_some_and(|c| c.from_floor);
            let ids = taken.iter().map(|t| &t.id);
            self.subs[sub.0].floor.found(ids, limit, from_floor, now);
        }
        self.deliver_leased(claim, taken);
        self.claim_release(claim);
    }

    /// Delivers the rows a lease claim took, under the lease it wrote. A reply that comes
    /// after the lease ran out delivers nothing: another claim may hold the rows by now, and
    /// the attempt is spent.
    fn deliver_leased(&mut self, claim: ClaimId, rows: Vec<Taken<R>>) {
        let now = self.now;
        let Some(c) = self.claims.get_mut(&claim) else {
            return;
        };
        c.found = rows.len();
        let sub = c.sub;
        let sent_at = match &c.form {
            ClaimForm::Lease(l) => l.sent_at,
            ClaimForm::RowLock(_) | ClaimForm::Advisory(_) => None,
        };
        let Some(since) = sent_at else {
            debug_assert!(rows.is_empty(), "rows taken without a lease");
            return;
        };
        if now >= since.plus(self.subs[sub.0].options.lease) {
            let table = self.subs[sub.0].desc.table;
            self.events.push_back(Event::Error {
                sub,
                error: DbError::new(
                    ErrorKind::Timeout,
                    format!(
                        "table `{table}`: the claim of {} rows answered after their lease ran out; they return to the queue",
                        rows.len()
                    ),
                ),
            });
            return;
        }
        for taken in rows {
            // A row without the expiry its claim wrote cannot be fenced: it waits out its
            // lease.
            let Some(fence) = taken.until.map(Time) else {
                let table = self.subs[sub.0].desc.table;
                let error = DbError::new(
                    ErrorKind::Other,
                    format!("table `{table}`: a lease claim answered a row without `{UNTIL}`"),
                );
                self.events.push_back(Event::Error { sub, error });
                continue;
            };
            self.deliver(sub, taken, None, None, Some(Leased { fence, since }));
        }
    }
}

/// A duration in whole microseconds, as a statement binds it.
pub(in crate::broker) fn micros_of(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

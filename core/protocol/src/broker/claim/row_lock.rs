//! The row lock form's claim: lock the first claimable row `FOR UPDATE SKIP LOCKED` in a
//! transaction that stays open while the handler runs.
//!
//! With an attempt column the attempt is counted and committed first, so a crash spends it,
//! and then the counted row is locked in a new transaction while its attempt is still the one
//! counted. The claims of a subscription count one at a time ([`CountQueue`]): a second count
//! between another claim's count and its lock would count the same row twice.
//!
//! [`CountQueue`]: crate::broker::sub::CountQueue

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::dialect::{Arg, RowLockClaim, RowLockStatements};
use crate::types::{ConnId, Reply, SubId};
use crate::value::Value;

use super::super::rows::{Counted, Taken, rows_of};
use super::super::{Broker, State};
use super::{Claim, ClaimForm, ClaimStage, Fixed};

/// Where a row lock claim is.
#[derive(Clone, Copy, Debug)]
pub(in crate::broker) enum Stage {
    /// `BEGIN` before the lock of the first row (no attempt column).
    Begin,
    LockRow,
    /// PostgreSQL: the count of the first row's attempt, in one statement.
    CountRow,
    /// MySQL and MariaDB: `BEGIN` before the lock of the row to count.
    BeginCount,
    SelectRowId,
    CountAttempt,
    CountCommit,
    /// `BEGIN` before the lock of the counted row.
    BeginLock,
    LockRowById,
    Rollback,
}

#[derive(Debug)]
pub(in crate::broker) struct Claiming {
    st: Arc<RowLockStatements>,
    /// The row whose attempt was counted, and the count, to lock next.
    pub(super) counted: Option<Counted>,
}

impl Claiming {
    pub(super) fn new(st: &Arc<RowLockStatements>) -> Self {
        Self {
            st: st.clone(),
            counted: None,
        }
    }
}

impl<R> Broker<R> {
    fn row_lock(
        claims: &mut BTreeMap<u64, Claim<R>>,
        claim: u64,
    ) -> Option<(SubId, &mut Claiming)> {
        let c = claims.get_mut(&claim)?;
        match &mut c.form {
            ClaimForm::RowLock(r) => Some((c.sub, r)),
            ClaimForm::Lease(_) | ClaimForm::Advisory(_) => None,
        }
    }

    fn row_lock_execute(
        &mut self,
        claim: u64,
        conn: ConnId,
        statement: &crate::Statement,
        stage: Stage,
    ) {
        let now = self.now;
        let binds = statement.binds(|arg| match arg {
            Arg::Limit => Value::Int(1),
            _ => Value::Int(now.micros()),
        });
        self.claim_execute(
            claim,
            conn,
            statement.clone(),
            binds,
            ClaimStage::RowLock(stage),
        );
    }

    fn row_lock_fixed(&mut self, claim: u64, conn: ConnId, which: Fixed, stage: Stage) {
        self.claim_fixed(claim, conn, which, ClaimStage::RowLock(stage));
    }

    pub(super) fn row_lock_acquired(&mut self, claim: u64, conn: ConnId) {
        let Some((sub, _)) = Self::row_lock(&mut self.claims, claim) else {
            return;
        };
        if self.subs[sub.0].counts_attempts() {
            let s = &mut self.subs[sub.0];
            s.counts.waiting.push_back(claim);
            if s.counts.counting.is_none() {
                self.next_count(sub);
            }
        } else {
            self.row_lock_fixed(claim, conn, Fixed::Begin, Stage::Begin);
        }
    }

    pub(super) fn on_row_lock_claim(
        &mut self,
        claim: u64,
        conn: ConnId,
        stage: Stage,
        reply: Reply<R>,
    ) {
        let Some((_, r)) = Self::row_lock(&mut self.claims, claim) else {
            return;
        };
        let st = r.st.clone();
        match stage {
            Stage::Begin => {
                if let RowLockClaim::Lock { lock_row } = &st.claim {
                    self.row_lock_execute(claim, conn, lock_row, Stage::LockRow);
                }
            }
            Stage::LockRow | Stage::LockRowById => self.row_locked(claim, conn, stage, reply),
            Stage::CountRow | Stage::SelectRowId => self.row_counted(claim, conn, stage, reply),
            Stage::CountAttempt => {
                self.row_lock_fixed(claim, conn, Fixed::Commit, Stage::CountCommit)
            }
            Stage::CountCommit => self.lock_counted(claim, conn),
            Stage::BeginCount => {
                if let RowLockClaim::SelectCount { select_row_id, .. } = &st.claim {
                    self.row_lock_execute(claim, conn, select_row_id, Stage::SelectRowId);
                }
            }
            Stage::BeginLock => {
                let lock = match &st.claim {
                    RowLockClaim::Count { lock_row_by_id, .. }
                    | RowLockClaim::SelectCount { lock_row_by_id, .. } => lock_row_by_id,
                    RowLockClaim::Lock { .. } => return,
                };
                let Some(Counted { id, attempt }) = r_counted(self, claim) else {
                    return;
                };
                let now = self.now;
                let binds = lock.binds(|arg| match arg {
                    Arg::Id => id.clone(),
                    Arg::Attempt => Value::Int(attempt),
                    _ => Value::Int(now.micros()),
                });
                let stage = ClaimStage::RowLock(Stage::LockRowById);
                self.claim_execute(claim, conn, lock.clone(), binds, stage);
            }
            Stage::Rollback => self.claim_release(claim),
        }
    }

    /// The lock of the first row, or of the counted one, answered.
    fn row_locked(&mut self, claim: u64, conn: ConnId, stage: Stage, reply: Reply<R>) {
        self.end_count(claim);
        let Some((sub, _)) = Self::row_lock(&mut self.claims, claim) else {
            return;
        };
        let attempts = self.subs[sub.0].desc.attempt.is_some();
        match rows_of(reply).pop() {
            Some(row) => {
                let Some(c) = self.claims.get_mut(&claim) else {
                    return;
                };
                let conn = c.conn.take();
                c.found = c.found.max(1);
                self.deliver(sub, Taken::read(row, attempts, 0), conn, None, None);
                self.finish_claim(claim);
            }
            None => {
                if matches!(stage, Stage::LockRowById)
                    && let Some(c) = self.claims.get_mut(&claim)
                {
                    // Another claim took the counted row first: claim again at once.
                    c.found = c.limit;
                }
                self.row_lock_fixed(claim, conn, Fixed::Rollback, Stage::Rollback);
            }
        }
    }

    /// The count of the first row's attempt (PostgreSQL), or the lock of the row to count
    /// (MySQL, MariaDB), answered.
    fn row_counted(&mut self, claim: u64, conn: ConnId, stage: Stage, reply: Reply<R>) {
        let select = matches!(stage, Stage::SelectRowId);
        // MySQL reads the attempt before it counts it.
        let Some(counted) = rows_of(reply)
            .pop()
            .map(|row| Counted::read(row, i64::from(select)))
        else {
            self.end_count(claim);
            if select {
                self.row_lock_fixed(claim, conn, Fixed::Rollback, Stage::Rollback);
            } else {
                self.claim_release(claim);
            }
            return;
        };
        let Some((_, r)) = Self::row_lock(&mut self.claims, claim) else {
            return;
        };
        let id = counted.id.clone();
        r.counted = Some(counted);
        let st = r.st.clone();
        match (&st.claim, select) {
            (RowLockClaim::SelectCount { count_attempt, .. }, true) => {
                let binds = count_attempt.binds(|_| id.clone());
                let stage = ClaimStage::RowLock(Stage::CountAttempt);
                self.claim_execute(claim, conn, count_attempt.clone(), binds, stage);
            }
            _ => self.lock_counted(claim, conn),
        }
    }

    /// The counted row is locked for the handler in a new transaction, unless the broker is
    /// shutting down (the attempt is spent and the row is free).
    fn lock_counted(&mut self, claim: u64, conn: ConnId) {
        if self.state != State::Running {
            self.end_count(claim);
            self.claim_release(claim);
            return;
        }
        self.row_lock_fixed(claim, conn, Fixed::Begin, Stage::BeginLock);
    }

    /// `claim`'s count and lock are done, or it ended: the next claim waiting for the count
    /// starts it.
    pub(super) fn end_count(&mut self, claim: u64) {
        let Some(sub) = self.claims.get(&claim).map(|c| c.sub) else {
            return;
        };
        let counts = &mut self.subs[sub.0].counts;
        counts.waiting.retain(|c| *c != claim);
        if counts.counting == Some(claim) {
            counts.counting = None;
            self.next_count(sub);
        }
    }

    /// Starts the count of the first claim waiting for it. From the shutdown on, a waiting
    /// claim counts nothing and lets its connection go.
    fn next_count(&mut self, sub: SubId) {
        while self.subs[sub.0].counts.counting.is_none() {
            let Some(claim) = self.subs[sub.0].counts.waiting.pop_front() else {
                return;
            };
            let Some(conn) = self.claims.get(&claim).and_then(|c| c.conn) else {
                continue;
            };
            if self.state != State::Running {
                self.claim_release(claim);
                continue;
            }
            let Some((_, r)) = Self::row_lock(&mut self.claims, claim) else {
                continue;
            };
            let st = r.st.clone();
            self.subs[sub.0].counts.counting = Some(claim);
            match &st.claim {
                RowLockClaim::Count { count_row, .. } => {
                    self.row_lock_execute(claim, conn, count_row, Stage::CountRow);
                }
                RowLockClaim::SelectCount { .. } | RowLockClaim::Lock { .. } => {
                    self.row_lock_fixed(claim, conn, Fixed::Begin, Stage::BeginCount);
                }
            }
        }
    }
}

/// The counted row of a row lock claim.
fn r_counted<R>(broker: &mut Broker<R>, claim: u64) -> Option<Counted> {
    Broker::row_lock(&mut broker.claims, claim).and_then(|(_, r)| r.counted.clone())
}

//! The row lock form's claim: lock the first claimable row `FOR UPDATE SKIP LOCKED` in a
//! transaction that stays open while the handler runs.
//!
//! With an attempt column the attempt is counted and committed first, so a crash spends it,
//! and then the counted row is locked in a new transaction while its attempt is still the one
//! counted. The claims of a subscription waiting for a count are counted together, one row
//! each, in one statement on the first one's connection; each then locks its row on its own
//! connection, side by side ([`CountQueue`]). The next count waits for those locks: a count
//! between another claim's count and its lock would count the same row twice.
//!
//! [`CountQueue`]: crate::broker::sub::CountQueue

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::dialect::{Arg, FormStatements, RowLockClaim, RowLockStatements};
use crate::types::{ConnId, Reply, SubId};
use crate::value::Value;

use super::super::rows::{Counted, Taken, rows_of};
use super::super::sub::Count;
use super::super::{Broker, State};
use super::{Claim, ClaimForm, ClaimStage, Fixed};

/// Where a row lock claim is.
#[derive(Clone, Copy, Debug)]
pub(in crate::broker) enum Stage {
    /// `BEGIN` before the lock of the first row (no attempt column).
    Begin,
    LockRow,
    /// PostgreSQL: the count of the first rows' attempts, in one statement.
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
    /// The leader of a count on MySQL and MariaDB: the rows it locked to count, until their
    /// count commits and they go to the count's claims.
    batch: Vec<Counted>,
}

impl Claiming {
    pub(super) fn new(st: &Arc<RowLockStatements>) -> Self {
        Self {
            st: st.clone(),
            counted: None,
            batch: Vec::new(),
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
        limit: usize,
    ) {
        let now = self.now;
        let binds = statement.binds(|arg| match arg {
            Arg::Limit => Value::Int(limit as i64),
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
                    self.row_lock_execute(claim, conn, lock_row, Stage::LockRow, 1);
                }
            }
            Stage::LockRow | Stage::LockRowById => self.row_locked(claim, conn, stage, reply),
            Stage::CountRow | Stage::SelectRowId => self.row_counted(claim, conn, stage, reply),
            Stage::CountAttempt => {
                self.row_lock_fixed(claim, conn, Fixed::Commit, Stage::CountCommit)
            }
            Stage::CountCommit => self.hand_counted(claim),
            Stage::BeginCount => {
                if let RowLockClaim::SelectCount { select_row_id, .. } = &st.claim {
                    let n = self.count_size(claim);
                    self.row_lock_execute(claim, conn, select_row_id, Stage::SelectRowId, n);
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

    /// The count of the first rows' attempts (PostgreSQL), or the lock of the rows to count
    /// (MySQL, MariaDB), answered on the count's leader.
    fn row_counted(&mut self, claim: u64, conn: ConnId, stage: Stage, reply: Reply<R>) {
        let select = matches!(stage, Stage::SelectRowId);
        // MySQL reads the attempt before it counts it.
        let counted: Vec<Counted> = rows_of(reply)
            .into_iter()
            .map(|row| Counted::read(row, i64::from(select)))
            .collect();
        let Some((sub, r)) = Self::row_lock(&mut self.claims, claim) else {
            return;
        };
        let st = r.st.clone();
        if !select && st.count_row_from.is_some() {
            let asked = self.count_size(claim);
            self.subs[sub.0]
                .floor
                .found(counted.iter().map(|c| &c.id), asked);
        }
        let Some((_, r)) = Self::row_lock(&mut self.claims, claim) else {
            return;
        };
        r.batch = counted;
        match (&st.claim, select) {
            (RowLockClaim::SelectCount { count_attempts, .. }, true) if !r.batch.is_empty() => {
                // A reply of more rows than the count asked for (or the same row twice) counts
                // the rows it may, once each.
                let mut seen = Vec::new();
                r.batch.retain(|c| {
                    let new = !seen.contains(&c.id);
                    seen.push(c.id.clone());
                    new
                });
                r.batch.truncate(count_attempts.len().max(1));
                let Some(count) = count_attempts.get(r.batch.len() - 1) else {
                    return self.row_lock_fixed(claim, conn, Fixed::Rollback, Stage::Rollback);
                };
                let ids: Vec<Value> = r.batch.iter().map(|c| c.id.clone()).collect();
                let binds = count.binds(|arg| match arg {
                    Arg::IdAt(i) => ids.get(i).cloned().unwrap_or(Value::Null),
                    _ => Value::Null,
                });
                let stage = ClaimStage::RowLock(Stage::CountAttempt);
                self.claim_execute(claim, conn, count.clone(), binds, stage);
            }
            (_, true) => self.row_lock_fixed(claim, conn, Fixed::Commit, Stage::CountCommit),
            (_, false) => self.hand_counted(claim),
        }
    }

    /// How many claims the count `leader` runs counts for.
    fn count_size(&self, leader: u64) -> usize {
        let Some(sub) = self.claims.get(&leader).map(|c| c.sub) else {
            return 1;
        };
        self.subs[sub.0]
            .counts
            .counting
            .as_ref()
            .map_or(1, |count| count.members.len().max(1))
    }

    /// The leader's count committed: each counted row goes to one of the count's claims,
    /// which locks it on its own connection; a claim left without a row ends.
    fn hand_counted(&mut self, leader: u64) {
        let Some((sub, r)) = Self::row_lock(&mut self.claims, leader) else {
            return;
        };
        let mut rows = std::mem::take(&mut r.batch).into_iter();
        let Some(count) = self.subs[sub.0].counts.counting.as_mut() else {
            return;
        };
        if count.leader != leader {
            return;
        }
        count.handed = true;
        let members = count.members.clone();
        for member in members {
            match rows.next() {
                Some(counted) => {
                    let conn = match self.claims.get_mut(&member) {
                        Some(c) => {
                            if let ClaimForm::RowLock(r) = &mut c.form {
                                r.counted = Some(counted);
                            }
                            c.conn
                        }
                        None => None,
                    };
                    match conn {
                        Some(conn) => self.lock_counted(member, conn),
                        None => self.end_count(member),
                    }
                }
                None => {
                    // Fewer rows than claims: this one takes nothing.
                    self.end_count(member);
                    self.claim_release(member);
                }
            }
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

    /// `claim`'s count and lock are done, or it ended. The count's last claim starts the next
    /// count; a count whose leader ended before its rows were handed out counts nothing, and
    /// its other claims wait for the next.
    pub(super) fn end_count(&mut self, claim: u64) {
        let Some(sub) = self.claims.get(&claim).map(|c| c.sub) else {
            return;
        };
        let counts = &mut self.subs[sub.0].counts;
        counts.waiting.retain(|c| *c != claim);
        let Some(count) = counts.counting.as_mut() else {
            return;
        };
        if !count.members.contains(&claim) {
            return;
        }
        count.members.retain(|c| *c != claim);
        if count.leader == claim && !count.handed {
            for member in count.members.drain(..).rev() {
                counts.waiting.push_front(member);
            }
        }
        if count.members.is_empty() {
            counts.counting = None;
            self.next_count(sub);
        }
    }

    /// Starts a count for the claims waiting for one, on the first one's connection. From the
    /// shutdown on, a waiting claim counts nothing and lets its connection go.
    fn next_count(&mut self, sub: SubId) {
        if self.subs[sub.0].counts.counting.is_some() {
            return;
        }
        // MySQL and MariaDB count at most as many rows as they have statements for.
        let most = match &self.subs[sub.0].statements.form {
            FormStatements::RowLock(f) => match &f.claim {
                RowLockClaim::SelectCount { count_attempts, .. } => count_attempts.len().max(1),
                RowLockClaim::Count { .. } | RowLockClaim::Lock { .. } => usize::MAX,
            },
            FormStatements::Lease(_) | FormStatements::Advisory(_) => 1,
        };
        let mut members = Vec::new();
        while members.len() < most {
            let Some(claim) = self.subs[sub.0].counts.waiting.pop_front() else {
                break;
            };
            if self.claims.get(&claim).and_then(|c| c.conn).is_none() {
                continue;
            }
            if self.state != State::Running {
                self.claim_release(claim);
                continue;
            }
            members.push(claim);
        }
        let Some(&leader) = members.first() else {
            return;
        };
        let Some(conn) = self.claims.get(&leader).and_then(|c| c.conn) else {
            return;
        };
        let Some((_, r)) = Self::row_lock(&mut self.claims, leader) else {
            return;
        };
        let st = r.st.clone();
        let n = members.len();
        self.subs[sub.0].counts.counting = Some(Count {
            leader,
            members,
            handed: false,
        });
        match &st.claim {
            RowLockClaim::Count { count_row, .. } => {
                let now = self.now;
                let from = st.count_row_from.as_ref().and_then(|from| {
                    let floor = self.subs[sub.0].floor.start(now)?;
                    Some((from, floor))
                });
                let (statement, floor) = match from {
                    Some((from, floor)) => (from, floor),
                    None => (count_row, i64::MIN),
                };
                let binds = statement.binds(|arg| match arg {
                    Arg::Limit => Value::Int(n as i64),
                    Arg::Floor => Value::Int(floor),
                    _ => Value::Int(now.micros()),
                });
                let stage = ClaimStage::RowLock(Stage::CountRow);
                self.claim_execute(leader, conn, statement.clone(), binds, stage);
            }
            RowLockClaim::SelectCount { .. } | RowLockClaim::Lock { .. } => {
                self.row_lock_fixed(leader, conn, Fixed::Begin, Stage::BeginCount);
            }
        }
    }
}

/// The counted row of a row lock claim.
fn r_counted<R>(broker: &mut Broker<R>, claim: u64) -> Option<Counted> {
    Broker::row_lock(&mut broker.claims, claim).and_then(|(_, r)| r.counted.clone())
}

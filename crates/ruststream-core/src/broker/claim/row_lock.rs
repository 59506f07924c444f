//! The row lock form's claim: lock the first claimable row `FOR UPDATE SKIP LOCKED` in a
//! transaction that stays open while the handler runs.
//!
//! With an attempt column the attempt is counted and committed first, so a crash spends it,
//! and then the counted row is locked in a new transaction while its attempt is still the one
//! counted. The claims of a subscription waiting for a count are counted together, one row
//! each, in one statement on the first one's connection (the count's leader); each then locks
//! its row on its own connection, side by side ([`CountQueue`]).
//!
//! Between a count's commit and a row's lock no transaction holds the row, so a count of
//! another process could count it again. The count therefore marks each row it counts on the
//! leader's session (a session advisory lock, or `GET_LOCK`) and passes over rows marked
//! elsewhere; the leader keeps its own row's delivery back until every member's lock has
//! answered, releases the marks, and only then hands its row on. A leader that ends holding
//! marks closes its connection, which ends them (a leader that fails before its count's locks
//! have answered so ends them early). A count that looks at a marked row holds it for the
//! length of its statement (MySQL's counts leave marked rows out and let them go at once): a
//! lock that finds its counted row held so tries again, ten times over about a second at most,
//! before it gives the row up (its attempt spent). The next count of the subscription starts
//! once the rows of the counts before it have answered their locks (it would otherwise hold
//! them for a moment itself), while the leaders may still be releasing their marks.
//!
//! [`CountQueue`]: crate::broker::sub::CountQueue

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::dialect::{Arg, RowLockClaim, RowLockStatements};
use crate::types::{ConnId, Reply, Row, SubId};
use crate::value::{Time, Value};

use super::super::rows::{Counted, Taken, rows_of};
use super::super::waiting::{Passing, excluded_id};
use super::super::{Broker, State};
use super::ClaimId;
use super::{Claim, ClaimForm, ClaimStage, Fixed};

mod count;

/// How often a counted row's lock tries again after it found the row held (by a count that
/// looks at it), and the first pause: each pause doubles, so the tries span 1,023 ms.
const RELOCKS: u32 = 10;
const RELOCK_FIRST: Duration = Duration::from_millis(1);

/// Where a row lock claim is.
#[derive(Clone, Copy, Debug)]
pub(in crate::broker) enum Stage {
    /// `BEGIN` before the lock of the first row (no attempt column).
    Begin,
    LockRow,
    /// PostgreSQL: the count of the first rows' attempts, in one statement.
    CountRow,
    /// MySQL and MariaDB: the count's transaction at read committed.
    ReadCommitted,
    /// MySQL and MariaDB: `BEGIN` before the lock of the row to count.
    BeginCount,
    SelectRowId,
    /// MySQL and MariaDB: the marks of the rows to count.
    MarkRows,
    CountAttempt,
    CountCommit,
    /// `BEGIN` before the lock of the counted row.
    BeginLock,
    LockRowById,
    /// The leader releases its count's marks.
    Unmark,
    Rollback,
}

#[derive(Debug)]
pub(in crate::broker) struct Claiming<R> {
    st: Arc<RowLockStatements>,
    /// The row whose attempt was counted, and the count, to lock next.
    pub(super) counted: Option<Counted>,
    /// The leader of a count: the rows it counts, until their count commits and they go to
    /// the count's claims.
    batch: Vec<Counted>,
    /// The leader of a count: the marks its session holds, until every counted row's lock
    /// has answered.
    marks: Vec<crate::value::Value>,
    /// The leader's own lock answered while its count's marks were held: the row it locked
    /// (or none), handed on once the marks are released.
    parked: Option<Option<Row<R>>>,
    /// The claim waited for a second count, after a count that passed over rows marked
    /// elsewhere gave it none.
    requeued: bool,
    /// The tries again of the counted row's lock so far.
    relocks: u32,
    /// The leader of a count of its own row alone: its lock also releases the row's mark.
    unmark_in_lock: bool,
    /// When the counted row's lock tries again.
    pub(super) relock_at: Option<Time>,
}

impl<R> Claiming<R> {
    pub(super) fn new(st: &Arc<RowLockStatements>) -> Self {
        Self {
            st: st.clone(),
            counted: None,
            batch: Vec::new(),
            marks: Vec::new(),
            parked: None,
            requeued: false,
            relocks: 0,
            relock_at: None,
            unmark_in_lock: false,
        }
    }

    /// Whether the claim's session holds marks of a count: its connection must not go back
    /// to the pool before they are released.
    pub(super) fn holds_marks(&self) -> bool {
        !self.marks.is_empty()
    }

    /// Forgets the count's marks, whose session is about to end; answers whether it held any.
    pub(super) fn forget_marks(&mut self) -> bool {
        self.parked = None;
        !std::mem::take(&mut self.marks).is_empty()
    }
}

impl<R> Broker<R> {
    fn row_lock(
        claims: &mut BTreeMap<ClaimId, Claim<R>>,
        claim: ClaimId,
    ) -> Option<(SubId, &mut Claiming<R>)> {
        let c = claims.get_mut(&claim)?;
        match &mut c.form {
            ClaimForm::RowLock(r) => Some((c.sub, r)),
            ClaimForm::Lease(_) | ClaimForm::Advisory(_) => None,
        }
    }

    /// Runs the claim's first statement (the lock of the first row, or MySQL's count), passing
    /// over the rows that wait their delay in this process.
    fn row_lock_execute(
        &mut self,
        claim: ClaimId,
        conn: ConnId,
        statement: &crate::Statement,
        stage: Stage,
        limit: usize,
    ) {
        let Some(sub) = self.claims.get(&claim).map(|c| c.sub) else {
            return;
        };
        let passing = Passing::RowLock { floor: false };
        let (statement, ids) = self.passing(sub, passing, statement.clone());
        let binds = statement.binds(|arg| {
            excluded_id(arg, &ids).unwrap_or(match arg {
                Arg::Limit => Value::Int(limit as i64),
                _ => Value::Null,
            })
        });
        self.claim_execute(claim, conn, statement, binds, ClaimStage::RowLock(stage));
    }

    fn row_lock_fixed(&mut self, claim: ClaimId, conn: ConnId, which: Fixed, stage: Stage) {
        self.claim_fixed(claim, conn, which, ClaimStage::RowLock(stage));
    }

    pub(super) fn row_lock_acquired(&mut self, claim: ClaimId, conn: ConnId) {
        let Some((sub, _)) = Self::row_lock(&mut self.claims, claim) else {
            return;
        };
        if self.subs[sub.0].counts_attempts() {
            if let Some(counts) = self.subs[sub.0].counts_mut() {
                counts.waiting.push_back(claim);
                if counts.counting.is_none() {
                    self.next_count(sub);
                }
            }
        } else {
            self.row_lock_fixed(claim, conn, Fixed::Begin, Stage::Begin);
        }
    }

    pub(super) fn on_row_lock_claim(
        &mut self,
        claim: ClaimId,
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
            Stage::MarkRows => self.rows_marked(claim, conn, reply),
            Stage::Unmark => {
                let Some((_, r)) = Self::row_lock(&mut self.claims, claim) else {
                    return;
                };
                r.marks.clear();
                let row = r.parked.take().flatten();
                self.row_lock_take(claim, conn, Stage::LockRowById, row);
            }
            Stage::CountAttempt => {
                self.row_lock_fixed(claim, conn, Fixed::Commit, Stage::CountCommit)
            }
            Stage::CountCommit => self.hand_counted(claim),
            Stage::ReadCommitted => {
                self.row_lock_fixed(claim, conn, Fixed::Begin, Stage::BeginCount)
            }
            Stage::BeginCount => {
                if let RowLockClaim::SelectCount { select_row_id, .. } = &st.claim {
                    let (look, _) = self.count_sizes(claim);
                    self.row_lock_execute(claim, conn, select_row_id, Stage::SelectRowId, look);
                }
            }
            Stage::BeginLock => self.lock_by_id(claim, conn),
            Stage::Rollback => self.claim_release(claim),
        }
    }

    /// Locks the counted row, in the claim's transaction.
    fn lock_by_id(&mut self, claim: ClaimId, conn: ConnId) {
        let Some((_, r)) = Self::row_lock(&mut self.claims, claim) else {
            return;
        };
        let st = r.st.clone();
        let unmarking = r.unmark_in_lock;
        let lock = match &st.claim {
            RowLockClaim::Count {
                lock_row_by_id,
                lock_row_by_id_unmarking,
                ..
            }
            | RowLockClaim::SelectCount {
                lock_row_by_id,
                lock_row_by_id_unmarking,
                ..
            } => {
                if unmarking {
                    lock_row_by_id_unmarking
                } else {
                    lock_row_by_id
                }
            }
            RowLockClaim::Lock { .. } => return,
        };
        let Some(Counted { id, attempt, .. }) = r.counted.clone() else {
            return;
        };
        let mark = r.marks.first().cloned().unwrap_or(Value::Null);
        let now = self.now;
        let binds = lock.binds(|arg| match arg {
            Arg::Id => id.clone(),
            Arg::Attempt => Value::Int(attempt),
            Arg::MarkAt(_) => mark.clone(),
            _ => Value::Int(now.micros()),
        });
        let stage = ClaimStage::RowLock(Stage::LockRowById);
        self.claim_execute(claim, conn, lock.clone(), binds, stage);
    }

    /// The rows this subscription's claims have counted and not yet handed to a delivery or
    /// given up: a count rendered now must pass over them even if it runs after their
    /// deliveries have settled (a retried row then waits its delay here).
    pub(in crate::broker) fn counted_ids(&self, sub: SubId) -> Vec<Value> {
        self.claims
            .values()
            .filter(|c| c.sub == sub)
            .filter_map(|c| match &c.form {
                ClaimForm::RowLock(r) => r.counted.as_ref().map(|k| k.id.clone()),
                _ => None,
            })
            .collect()
    }

    /// The claims whose counted row's lock tries again now.
    pub(in crate::broker) fn relock_due(&mut self) {
        let now = self.now;
        let due: Vec<(ClaimId, ConnId)> = self
            .claims
            .iter()
            .filter_map(|(&id, c)| match &c.form {
                ClaimForm::RowLock(r) if r.relock_at.is_some_and(|t| t <= now) => {
                    Some((id, c.conn?))
                }
                _ => None,
            })
            .collect();
        for (claim, conn) in due {
            if let Some((_, r)) = Self::row_lock(&mut self.claims, claim) {
                r.relock_at = None;
            }
            if self.state == State::Running {
                self.lock_by_id(claim, conn);
            } else {
                self.row_locked_finally(claim, conn, None);
            }
        }
    }

    /// From the shutdown on, a counted row's lock tries no more: the claim gives the row up.
    pub(in crate::broker) fn relock_give_up(&mut self) {
        let waiting: Vec<(ClaimId, ConnId)> = self
            .claims
            .iter()
            .filter_map(|(&id, c)| match &c.form {
                ClaimForm::RowLock(r) if r.relock_at.is_some() => Some((id, c.conn?)),
                _ => None,
            })
            .collect();
        for (claim, conn) in waiting {
            if let Some((_, r)) = Self::row_lock(&mut self.claims, claim) {
                r.relock_at = None;
            }
            self.row_locked_finally(claim, conn, None);
        }
    }

    /// The lock of the first row, or of the counted one, answered. A counted row found held
    /// is tried again shortly, a few times. A leader whose session holds its count's marks
    /// keeps the answer until the marks are released.
    fn row_locked(&mut self, claim: ClaimId, conn: ConnId, stage: Stage, reply: Reply<R>) {
        let row = rows_of(reply).pop();
        if row.is_none()
            && matches!(stage, Stage::LockRowById)
            && self.state == State::Running
            && let Some((_, r)) = Self::row_lock(&mut self.claims, claim)
            && r.relocks < RELOCKS
        {
            // Held for a moment by a count that looks at it (or gone: then the tries find
            // nothing either).
            let pause = RELOCK_FIRST * 2u32.pow(r.relocks);
            r.relocks += 1;
            r.relock_at = Some(self.now.plus(pause));
            return;
        }
        if matches!(stage, Stage::LockRowById) {
            if row.is_some()
                && let Some((_, r)) = Self::row_lock(&mut self.claims, claim)
                && r.unmark_in_lock
            {
                // The lock released the count's one mark as it took the row.
                r.marks.clear();
            }
            return self.row_locked_finally(claim, conn, row);
        }
        self.row_lock_take(claim, conn, stage, row);
    }

    /// The counted row's lock answered for good.
    fn row_locked_finally(&mut self, claim: ClaimId, conn: ConnId, row: Option<Row<R>>) {
        let Some((sub, r)) = Self::row_lock(&mut self.claims, claim) else {
            return;
        };
        if r.holds_marks() {
            r.parked = Some(row);
            self.unmark_when_locked(sub, claim);
            self.next_count(sub);
            return;
        }
        self.row_lock_take(claim, conn, Stage::LockRowById, row);
    }

    /// The claim's lock answered and no mark is held: the row goes to a delivery, or, with no
    /// row, the transaction rolls back.
    fn row_lock_take(&mut self, claim: ClaimId, conn: ConnId, stage: Stage, row: Option<Row<R>>) {
        self.end_count(claim);
        let Some((sub, _)) = Self::row_lock(&mut self.claims, claim) else {
            return;
        };
        let attempts = self.subs[sub.0].desc.attempt.is_some();
        match row {
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
}

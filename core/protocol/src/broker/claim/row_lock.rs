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

use crate::dialect::{Arg, FormStatements, RowLockClaim, RowLockStatements};
use crate::types::{Action, ConnId, Reply, Row, SubId};
use crate::value::{Time, Value};

use super::super::rows::{Counted, Taken, rows_of};
use super::super::sub::Count;
use super::super::{Broker, State};
use super::{Claim, ClaimForm, ClaimStage, Fixed};

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
        claims: &mut BTreeMap<u64, Claim<R>>,
        claim: u64,
    ) -> Option<(SubId, &mut Claiming<R>)> {
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
    fn lock_by_id(&mut self, claim: u64, conn: ConnId) {
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

    /// The claims whose counted row's lock tries again now.
    pub(in crate::broker) fn relock_due(&mut self) {
        let now = self.now;
        let due: Vec<(u64, ConnId)> = self
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
        let waiting: Vec<(u64, ConnId)> = self
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
    fn row_locked(&mut self, claim: u64, conn: ConnId, stage: Stage, reply: Reply<R>) {
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
    fn row_locked_finally(&mut self, claim: u64, conn: ConnId, row: Option<Row<R>>) {
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
    fn row_lock_take(&mut self, claim: u64, conn: ConnId, stage: Stage, row: Option<Row<R>>) {
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

    /// Once every other claim of `leader`'s count has locked its row (or ended) and the
    /// leader's own lock has answered, the leader releases the count's marks.
    fn unmark_when_locked(&mut self, sub: SubId, leader: u64) {
        let counts = &self.subs[sub.0].counts;
        let Some(count) = counts.locking.iter().find(|c| c.leader == leader) else {
            return;
        };
        if count.members.iter().any(|m| *m != leader) {
            return;
        }
        let Some(c) = self.claims.get_mut(&leader) else {
            return;
        };
        let Some(conn) = c.conn else {
            return;
        };
        let ClaimForm::RowLock(r) = &c.form else {
            return;
        };
        if r.parked.is_none() || r.marks.is_empty() {
            return;
        }
        let unmark = match &r.st.claim {
            RowLockClaim::Count { unmark_rows, .. }
            | RowLockClaim::SelectCount { unmark_rows, .. } => {
                unmark_rows.get(r.marks.len() - 1).cloned()
            }
            RowLockClaim::Lock { .. } => None,
        };
        let Some(unmark) = unmark else {
            // More marks than the statements hold: the session ends, and its marks with it.
            if let ClaimForm::RowLock(r) = &mut c.form {
                r.parked = None;
            }
            c.failed = true;
            c.conn = None;
            self.end_count(leader);
            self.claim_step(leader, conn, Action::Close, ClaimStage::Close);
            return;
        };
        let marks = r.marks.clone();
        let binds = unmark.binds(|arg| match arg {
            Arg::MarkAt(i) => marks.get(i).cloned().unwrap_or(Value::Null),
            _ => Value::Null,
        });
        let stage = ClaimStage::RowLock(Stage::Unmark);
        self.claim_execute(leader, conn, unmark, binds, stage);
    }

    /// The count of the first rows' attempts (PostgreSQL), or the lock of the rows to count
    /// (MySQL, MariaDB), answered on the count's leader.
    fn row_counted(&mut self, claim: u64, conn: ConnId, stage: Stage, reply: Reply<R>) {
        let select = matches!(stage, Stage::SelectRowId);
        let (look, take) = self.count_sizes(claim);
        // A reply of more rows than the count asked for (or the same row twice) counts the
        // rows it may, once each.
        let mut seen = Vec::new();
        let mut rows: Vec<_> = rows_of(reply)
            .into_iter()
            .filter(|row| {
                let id = row.values.first().cloned().unwrap_or(Value::Null);
                let new = !seen.contains(&id);
                seen.push(id);
                new
            })
            .collect();
        rows.truncate(look);
        let Some((sub, r)) = Self::row_lock(&mut self.claims, claim) else {
            return;
        };
        let st = r.st.clone();
        if !select {
            // PostgreSQL: a row of each row looked at; those the count counted carry their
            // count, and their marks are the leader's. A row whose mark another process's
            // count holds was passed over.
            let looked = rows.len();
            let counted: Vec<Counted> = rows
                .into_iter()
                .filter_map(|row| Counted::read_counted(row, 0))
                .take(take)
                .collect();
            r.marks = counted.iter().map(|c| c.mark.clone()).collect();
            if st.count_row_from.is_some() {
                let now = self.now;
                let s = &mut self.subs[sub.0];
                let from_floor = s.counts.counting.as_ref().is_some_and(|c| c.from_floor);
                s.floor
                    .found(counted.iter().map(|c| &c.id), take, from_floor, now);
            }
            let passed = if counted.len() < take {
                looked - counted.len()
            } else {
                0
            };
            self.subs[sub.0].counts.passed = passed;
            if let Some((_, r)) = Self::row_lock(&mut self.claims, claim) {
                r.batch = counted;
            }
            return self.hand_counted(claim);
        }
        // MySQL reads the attempt before it counts it.
        r.batch = rows
            .into_iter()
            .filter_map(|row| Counted::read_counted(row, 1))
            .collect();
        let RowLockClaim::SelectCount { mark_rows, .. } = &st.claim else {
            return;
        };
        let Some(mark) = r.batch.len().checked_sub(1).and_then(|n| mark_rows.get(n)) else {
            // Nothing to count: the count's claims all end at once.
            self.subs[sub.0].counts.passed = 0;
            return self.row_lock_fixed(claim, conn, Fixed::Commit, Stage::CountCommit);
        };
        let marks: Vec<Value> = r.batch.iter().map(|c| c.mark.clone()).collect();
        let binds = mark.binds(|arg| match arg {
            Arg::MarkAt(i) => marks.get(i).cloned().unwrap_or(Value::Null),
            _ => Value::Null,
        });
        let stage = ClaimStage::RowLock(Stage::MarkRows);
        self.claim_execute(claim, conn, mark.clone(), binds, stage);
    }

    /// MySQL and MariaDB: the marks of the rows the leader locked to count answered. The
    /// first rows it marked, one for each claim of the count, are counted; a row marked
    /// elsewhere (counted by another process and not locked there yet) is passed over, and a
    /// row marked here past those is not counted, its mark released with the others.
    fn rows_marked(&mut self, claim: u64, conn: ConnId, reply: Reply<R>) {
        let (_, take) = self.count_sizes(claim);
        let marked: Vec<usize> = rows_of(reply)
            .into_iter()
            .filter_map(|row| {
                let mut values = row.values.into_iter();
                let at = values.next().and_then(|v| v.as_int())?;
                let taken = values.next().and_then(|v| v.as_bool()).unwrap_or(false);
                taken.then(|| usize::try_from(at).ok()).flatten()
            })
            .collect();
        let Some((sub, r)) = Self::row_lock(&mut self.claims, claim) else {
            return;
        };
        let batch = std::mem::take(&mut r.batch);
        let looked = batch.len();
        let mut kept = Vec::new();
        for (at, counted) in batch.into_iter().enumerate() {
            if marked.contains(&at) {
                kept.push(counted);
            }
        }
        r.marks = kept.iter().map(|c| c.mark.clone()).collect();
        kept.truncate(take);
        let passed = if kept.len() < take {
            looked - kept.len()
        } else {
            0
        };
        r.batch = kept;
        let st = r.st.clone();
        self.subs[sub.0].counts.passed = passed;
        let Some((_, r)) = Self::row_lock(&mut self.claims, claim) else {
            return;
        };
        let RowLockClaim::SelectCount { count_attempts, .. } = &st.claim else {
            return;
        };
        let Some(count) = r
            .batch
            .len()
            .checked_sub(1)
            .and_then(|n| count_attempts.get(n))
        else {
            // Every row is another process's to lock: nothing to count.
            return self.row_lock_fixed(claim, conn, Fixed::Commit, Stage::CountCommit);
        };
        let ids: Vec<Value> = r.batch.iter().map(|c| c.id.clone()).collect();
        let binds = count.binds(|arg| match arg {
            Arg::IdAt(i) => ids.get(i).cloned().unwrap_or(Value::Null),
            _ => Value::Null,
        });
        let stage = ClaimStage::RowLock(Stage::CountAttempt);
        self.claim_execute(claim, conn, count.clone(), binds, stage);
    }

    /// How many rows the count `leader` runs looks at, and how many it counts, as the count
    /// started with them.
    fn count_sizes(&self, leader: u64) -> (usize, usize) {
        let Some(sub) = self.claims.get(&leader).map(|c| c.sub) else {
            return (1, 1);
        };
        self.subs[sub.0]
            .counts
            .counting
            .as_ref()
            .map_or((1, 1), |count| (count.look, count.take))
    }

    /// How many rows a count of `take` claims looks at: one for each claim, and as many more as
    /// the last count passed over (marked by another process; up to as many again), within
    /// what the statements take. The rows of this process's counts before it are locked by
    /// then, and `SKIP LOCKED` passes them over before the limit.
    fn count_look(&self, sub: SubId, take: usize) -> usize {
        let s = &self.subs[sub.0];
        let counts = &s.counts;
        let most = match &s.statements.form {
            FormStatements::RowLock(f) => match &f.claim {
                RowLockClaim::SelectCount { mark_rows, .. } => mark_rows.len(),
                RowLockClaim::Count { unmark_rows, .. } => 2 * unmark_rows.len(),
                RowLockClaim::Lock { .. } => 1,
            },
            FormStatements::Lease(_) | FormStatements::Advisory(_) => 1,
        };
        let look = take + counts.passed.min(take);
        look.min(most.max(take))
    }

    /// The leader's count committed: each counted row goes to one of the count's claims,
    /// which locks it on its own connection. The leader takes
    /// the last row: its delivery waits for the others' locks (it releases the marks first),
    /// so the rows still go to their handlers in claim order. A claim left without a row ends;
    /// where the count passed over rows another count had marked, it waits for the next
    /// count instead, once.
    fn hand_counted(&mut self, leader: u64) {
        let Some((sub, r)) = Self::row_lock(&mut self.claims, leader) else {
            return;
        };
        let mut rows = std::mem::take(&mut r.batch);
        let marks = r.marks.len();
        let counts = &mut self.subs[sub.0].counts;
        let passed = counts.passed > 0;
        if counts.counting.as_ref().is_none_or(|c| c.leader != leader) {
            return;
        }
        let Some(mut count) = counts.counting.take() else {
            return;
        };
        count.marks = marks;
        let last = rows.pop();
        let alone = rows.is_empty();
        let mut rows = rows.into_iter();
        let mut members: Vec<(u64, Option<Counted>)> = count
            .members
            .iter()
            .filter(|m| **m != leader)
            .map(|&m| (m, rows.next()))
            .collect();
        members.insert(0, (leader, last));
        if alone
            && marks == 1
            && let Some((_, r)) = Self::row_lock(&mut self.claims, leader)
        {
            // The count's only row is the leader's: its lock releases the mark too.
            r.unmark_in_lock = true;
        }
        let counts = &mut self.subs[sub.0].counts;
        counts.locking.push(count);
        for (member, counted) in members {
            match counted {
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
                None if passed && self.requeue(member) => {}
                None => {
                    // Fewer rows than claims: this one takes nothing.
                    self.end_count(member);
                    self.claim_release(member);
                }
            }
        }
        self.next_count(sub);
    }

    /// A claim the count gave no row while it passed over rows marked elsewhere waits for the
    /// next count, which looks past them, once; answers whether it does.
    fn requeue(&mut self, member: u64) -> bool {
        let Some((sub, r)) = Self::row_lock(&mut self.claims, member) else {
            return false;
        };
        if r.requeued || self.state != State::Running {
            return false;
        }
        r.requeued = true;
        self.leave_count(sub, member);
        self.subs[sub.0].counts.waiting.push_front(member);
        true
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

    /// `claim`'s count and lock are done, or it ended. A count whose leader ended before its
    /// rows were handed out counts nothing, its other claims wait for the next, and the next
    /// starts.
    pub(super) fn end_count(&mut self, claim: u64) {
        let Some(sub) = self.claims.get(&claim).map(|c| c.sub) else {
            return;
        };
        let counts = &mut self.subs[sub.0].counts;
        counts.waiting.retain(|c| *c != claim);
        if let Some(count) = counts.counting.as_mut()
            && count.members.contains(&claim)
        {
            count.members.retain(|c| *c != claim);
            if count.leader == claim {
                for member in count.members.drain(..).rev() {
                    counts.waiting.push_front(member);
                }
            }
            if count.members.is_empty() {
                counts.counting = None;
                self.next_count(sub);
            }
            return;
        }
        self.leave_count(sub, claim);
    }

    /// `claim` leaves the count that handed it a row (or none): the count ends with its last
    /// claim, and its leader releases the marks once the others have left.
    fn leave_count(&mut self, sub: SubId, claim: u64) {
        let counts = &mut self.subs[sub.0].counts;
        let Some(at) = counts
            .locking
            .iter()
            .position(|c| c.members.contains(&claim))
        else {
            return;
        };
        let count = &mut counts.locking[at];
        count.members.retain(|c| *c != claim);
        let leader = count.leader;
        if count.members.is_empty() {
            counts.locking.remove(at);
        } else {
            self.unmark_when_locked(sub, leader);
        }
        self.next_count(sub);
    }

    /// Whether a count of the subscription has rows whose locks have not answered yet. The
    /// next count waits for them: its statement would hold those rows for a moment (a count
    /// looks at the first claimable rows, and a counted row is one of them until its lock), and
    /// their locks would find them held.
    fn locks_pending(&self, sub: SubId) -> bool {
        self.subs[sub.0].counts.locking.iter().any(|count| {
            count.members.iter().any(|&member| {
                member != count.leader
                    || self.claims.get(&member).is_some_and(|c| match &c.form {
                        ClaimForm::RowLock(r) => r.parked.is_none(),
                        ClaimForm::Lease(_) | ClaimForm::Advisory(_) => false,
                    })
            })
        })
    }

    /// Starts a count for the claims waiting for one, on the first one's connection, once the
    /// rows of the counts before it are locked. From the shutdown on, a waiting claim counts
    /// nothing and lets its connection go.
    fn next_count(&mut self, sub: SubId) {
        if self.subs[sub.0].counts.counting.is_some() || self.locks_pending(sub) {
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
        let take = members.len();
        let look = self.count_look(sub, take);
        self.subs[sub.0].counts.counting = Some(Count {
            leader,
            members,
            take,
            look,
            marks: 0,
            from_floor: false,
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
                if let Some(count) = self.subs[sub.0].counts.counting.as_mut() {
                    count.from_floor = floor != i64::MIN;
                }
                let binds = statement.binds(|arg| match arg {
                    Arg::Limit => Value::Int(look as i64),
                    Arg::Take => Value::Int(take as i64),
                    Arg::Floor => Value::Int(floor),
                    _ => Value::Int(now.micros()),
                });
                let stage = ClaimStage::RowLock(Stage::CountRow);
                self.claim_execute(leader, conn, statement.clone(), binds, stage);
            }
            RowLockClaim::SelectCount { read_committed, .. } => {
                let stage = ClaimStage::RowLock(Stage::ReadCommitted);
                self.claim_execute(leader, conn, read_committed.clone(), Vec::new(), stage);
            }
            RowLockClaim::Lock { .. } => {}
        }
    }
}

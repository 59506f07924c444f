//! The row lock form's counts: the claims of a subscription waiting for a count counted
//! together in one statement on their leader's connection, the rows handed to each member,
//! and the marks released once every member's lock has answered.

use crate::dialect::{Arg, FormStatements, RowLockClaim};
use crate::types::{Action, ConnId, Reply, SubId};
use crate::value::Value;

use super::super::super::rows::{Counted, rows_of};
use super::super::super::sub::Count;
use super::super::super::waiting::{Passing, excluded_id};
use super::super::super::{Broker, State};
use super::super::ClaimId;
use super::super::{ClaimForm, ClaimStage, Fixed};
use super::Stage;

impl<R> Broker<R> {
    /// Once every other claim of `leader`'s count has locked its row (or ended) and the
    /// leader's own lock has answered, the leader releases the count's marks.
    pub(super) fn unmark_when_locked(&mut self, sub: SubId, leader: ClaimId) {
        let Some(counts) = self.subs[sub.0].counts() else {
            return;
        };
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
    pub(super) fn row_counted(
        &mut self,
        claim: ClaimId,
        conn: ConnId,
        stage: Stage,
        reply: Reply<R>,
    ) {
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
                let counting = s.counts().and_then(|c| c.counting.as_ref());
                let from_floor = counting.is_some_and(|c| c.from_floor);
                s.floor
                    .found(counted.iter().map(|c| &c.id), take, from_floor, now);
            }
            let passed = if counted.len() < take {
                looked - counted.len()
            } else {
                0
            };
            self.set_passed(sub, passed);
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
            self.set_passed(sub, 0);
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

    // MySQL and MariaDB: the marks of the rows the leader locked to count answered. The
    // first rows it marked, one for each claim of the count, are counted; a row marked
    // elsewhere (counted by another process and not locked there yet) is passed over, and a
    // row marked here past those is not counted, its mark released with the others.
    pub(super) fn rows_marked(&mut self, claim: ClaimId, conn: ConnId, reply: Reply<R>) {
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
        self.set_passed(sub, passed);
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
    pub(super) fn count_sizes(&self, leader: ClaimId) -> (usize, usize) {
        let Some(sub) = self.claims.get(&leader).map(|c| c.sub) else {
            return (1, 1);
        };
        self.subs[sub.0]
            .counts()
            .and_then(|counts| counts.counting.as_ref())
            .map_or((1, 1), |count| (count.look, count.take))
    }

    /// How many rows the last count of `sub` passed over, marked elsewhere.
    fn set_passed(&mut self, sub: SubId, passed: usize) {
        if let Some(counts) = self.subs[sub.0].counts_mut() {
            counts.passed = passed;
        }
    }

    // How many rows a count of `take` claims looks at: one for each claim, and as many more as
    // the last count passed over (marked by another process; up to as many again), within
    // what the statements take. The rows of this process's counts before it are locked by
    // then, and `SKIP LOCKED` passes them over before the limit.
    pub(super) fn count_look(&self, sub: SubId, take: usize) -> usize {
        let s = &self.subs[sub.0];
        let passed = s.counts().map_or(0, |counts| counts.passed);
        let most = match &s.statements.form {
            FormStatements::RowLock(f) => match &f.claim {
                RowLockClaim::SelectCount { mark_rows, .. } => mark_rows.len(),
                RowLockClaim::Count { unmark_rows, .. } => 2 * unmark_rows.len(),
                RowLockClaim::Lock { .. } => 1,
            },
            FormStatements::Lease(_) | FormStatements::Advisory(_) => 1,
        };
        let look = take + passed.min(take);
        look.min(most.max(take))
    }

    // The leader's count committed: each counted row goes to one of the count's claims,
    // which locks it on its own connection. The leader takes
    // the last row: its delivery waits for the others' locks (it releases the marks first),
    // so the rows still go to their handlers in claim order. A claim left without a row ends;
    // where the count passed over rows another count had marked, it waits for the next
    // count instead, once.
    pub(super) fn hand_counted(&mut self, leader: ClaimId) {
        let Some((sub, r)) = Self::row_lock(&mut self.claims, leader) else {
            return;
        };
        let mut rows = std::mem::take(&mut r.batch);
        let marks = r.marks.len();
        let Some(counts) = self.subs[sub.0].counts_mut() else {
            return;
        };
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
        let mut members: Vec<(ClaimId, Option<Counted>)> = count
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
        if let Some(counts) = self.subs[sub.0].counts_mut() {
            counts.locking.push(count);
        }
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
    pub(super) fn requeue(&mut self, member: ClaimId) -> bool {
        let Some((sub, r)) = Self::row_lock(&mut self.claims, member) else {
            return false;
        };
        if r.requeued || self.state != State::Running {
            return false;
        }
        r.requeued = true;
        self.leave_count(sub, member);
        if let Some(counts) = self.subs[sub.0].counts_mut() {
            counts.waiting.push_front(member);
        }
        true
    }

    /// The counted row is locked for the handler in a new transaction, unless the broker is
    /// shutting down (the attempt is spent and the row is free).
    pub(super) fn lock_counted(&mut self, claim: ClaimId, conn: ConnId) {
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
    pub(in crate::broker::claim) fn end_count(&mut self, claim: ClaimId) {
        let Some(sub) = self.claims.get(&claim).map(|c| c.sub) else {
            return;
        };
        let Some(counts) = self.subs[sub.0].counts_mut() else {
            return;
        };
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
    pub(super) fn leave_count(&mut self, sub: SubId, claim: ClaimId) {
        let Some(counts) = self.subs[sub.0].counts_mut() else {
            return;
        };
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

    // Whether a count of the subscription has rows whose locks have not answered yet. The
    // next count waits for them: its statement would hold those rows for a moment (a count
    // looks at the first claimable rows, and a counted row is one of them until its lock), and
    // their locks would find them held.
    pub(super) fn locks_pending(&self, sub: SubId) -> bool {
        let Some(counts) = self.subs[sub.0].counts() else {
            return false;
        };
        counts.locking.iter().any(|count| {
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
    pub(super) fn next_count(&mut self, sub: SubId) {
        let counting = self.subs[sub.0]
            .counts()
            .is_none_or(|c| c.counting.is_some());
        if counting || self.locks_pending(sub) {
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
        let members = self.count_members(sub, most);
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
        if let Some(counts) = self.subs[sub.0].counts_mut() {
            counts.counting = Some(Count {
                leader,
                members,
                take,
                look,
                marks: 0,
                from_floor: false,
            });
        }
        match &st.claim {
            RowLockClaim::Count { count_row, .. } => {
                let from = st.count_row_from.as_ref();
                self.send_count_row(sub, leader, conn, count_row, from, (look, take));
            }
            RowLockClaim::SelectCount { read_committed, .. } => {
                let stage = ClaimStage::RowLock(Stage::ReadCommitted);
                self.claim_execute(leader, conn, read_committed.clone(), Vec::new(), stage);
            }
            RowLockClaim::Lock { .. } => {}
        }
    }

    /// The claims waiting for a count that the next one counts for, at most `most`: those
    /// that still hold a connection; from the shutdown on, each lets its connection go.
    fn count_members(&mut self, sub: SubId, most: usize) -> Vec<ClaimId> {
        let mut members = Vec::new();
        while members.len() < most {
            let next = self.subs[sub.0]
                .counts_mut()
                .and_then(|c| c.waiting.pop_front());
            let Some(claim) = next else {
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
        members
    }

    /// Sends the count of `(look, take)` rows on the leader's connection: from the floor
    /// where the subscription's claims start past the rows taken before them, passing over
    /// the rows that wait their delay in this process.
    fn send_count_row(
        &mut self,
        sub: SubId,
        leader: ClaimId,
        conn: ConnId,
        count_row: &crate::Statement,
        from: Option<&crate::Statement>,
        (look, take): (usize, usize),
    ) {
        let now = self.now;
        let from = from.and_then(|from| Some((from, self.subs[sub.0].floor.start(now)?)));
        let (statement, floor) = match from {
            Some((from, floor)) => (from.clone(), floor),
            None => (count_row.clone(), i64::MIN),
        };
        if let Some(count) = self.subs[sub.0]
            .counts_mut()
            .and_then(|c| c.counting.as_mut())
        {
            count.from_floor = floor != i64::MIN;
        }
        let passing = Passing::RowLock {
            floor: floor != i64::MIN,
        };
        let (statement, ids) = self.passing(sub, passing, statement);
        let binds = statement.binds(|arg| {
            excluded_id(arg, &ids).unwrap_or(match arg {
                Arg::Limit => Value::Int(look as i64),
                Arg::Take => Value::Int(take as i64),
                _ => Value::Int(floor),
            })
        });
        let stage = ClaimStage::RowLock(Stage::CountRow);
        self.claim_execute(leader, conn, statement, binds, stage);
    }
}

//! Claims: one machine per form, each with its own stages and state, and what they share:
//! a connection acquired first and released or closed last, how many rows the claim may take,
//! how a failure ends it, and when the subscription's next claim runs.

mod advisory;
mod lease;
mod row_lock;

use crate::dialect::{FormStatements, Statement};
use crate::types::{Action, ConnId, Event, Reply, SubId};
use crate::value::{DbError, ErrorKind, Value};

use super::{Broker, Step};

pub(super) use advisory::Stage as AdvisoryStage;
pub(super) use lease::micros_of;

/// A claim's id, which only this module assigns: one per claim, in the order they start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct ClaimId(u64);

impl ClaimId {
    /// The id of a broker's first claim.
    pub(super) const FIRST: ClaimId = ClaimId(0);
}

/// A claim in flight. `R` rows wait in the lease form's state until the claim can deliver
/// them.
#[derive(Debug)]
pub(super) struct Claim<R> {
    sub: SubId,
    conn: Option<ConnId>,
    /// The most rows it may take.
    limit: usize,
    /// The rows it took (or, where a counted row went to another claim, its limit: the next
    /// claim runs at once).
    found: usize,
    failed: bool,
    /// It started past the rows earlier claims took ([`Floor`](super::sub::Floor)).
    from_floor: bool,
    /// When it started.
    started: crate::value::Time,
    /// The next claim runs as soon as this one ends: a row it read went before it could take
    /// it, and the rows behind it are unread.
    again: bool,
    form: ClaimForm<R>,
}

/// The state of a claim's own form.
#[derive(Debug)]
enum ClaimForm<R> {
    RowLock(row_lock::Claiming<R>),
    Lease(lease::Claiming<R>),
    Advisory(advisory::Claiming),
}

/// The statements every form shares.
#[derive(Clone, Copy, Debug)]
enum Fixed {
    Begin,
    Commit,
    Rollback,
}

/// Where a claim is.
#[derive(Clone, Copy, Debug)]
pub(super) enum ClaimStage {
    Acquire,
    Release,
    Close,
    RowLock(row_lock::Stage),
    Lease(lease::Stage),
    Advisory(advisory::Stage),
}

impl<R> Broker<R> {
    /// Starts a claim of `sub`, when a slot is free; answers whether it started.
    pub(super) fn start_claim(&mut self, sub: SubId) -> bool {
        let s = &mut self.subs[sub.0];
        let free = s.free();
        if free == 0 {
            return false;
        }
        let (limit, form) = match &s.statements.form {
            FormStatements::RowLock(st) => (1, ClaimForm::RowLock(row_lock::Claiming::new(st))),
            FormStatements::Lease(st) => (free, ClaimForm::Lease(lease::Claiming::new(st))),
            FormStatements::Advisory(st) => {
                let limit = if s.first_rows_only() { 1 } else { free };
                (limit, ClaimForm::Advisory(advisory::Claiming::new(st)))
            }
        };
        s.claim_slots += limit;
        s.claims_running += 1;
        if let Some(lease) = s.lease_mut() {
            lease.gather_until = None;
        }
        // After a claim that found all it asked for, the next may start as soon as a slot
        // frees, beside this one; otherwise this claim's end decides when the next runs.
        s.next_claim_at = (s.side_by_side() && s.last_full).then_some(self.now);
        let claim = self.next_claim;
        self.next_claim = ClaimId(claim.0 + 1);
        let conn = self.new_conn();
        self.claims.insert(
            claim,
            Claim {
                sub,
                conn: Some(conn),
                limit,
                found: 0,
                failed: false,
                from_floor: false,
                started: self.now,
                again: false,
                form,
            },
        );
        self.claim_step(claim, conn, Action::Acquire, ClaimStage::Acquire);
        true
    }

    fn claim_step(&mut self, claim: ClaimId, conn: ConnId, action: Action, stage: ClaimStage) {
        self.send(conn, action, Step::Claim { claim, stage });
    }

    fn claim_execute(
        &mut self,
        claim: ClaimId,
        conn: ConnId,
        statement: Statement,
        binds: Vec<Value>,
        stage: ClaimStage,
    ) {
        self.claim_step(claim, conn, Action::Execute { statement, binds }, stage);
    }

    /// Runs one of the statements every form shares on the claim's connection.
    fn claim_fixed(&mut self, claim: ClaimId, conn: ConnId, which: Fixed, stage: ClaimStage) {
        let Some(sub) = self.claims.get(&claim).map(|c| c.sub) else {
            return;
        };
        let statements = &self.subs[sub.0].statements;
        let statement = match which {
            Fixed::Begin => statements.begin.clone(),
            Fixed::Commit => statements.commit.clone(),
            Fixed::Rollback => statements.rollback.clone(),
        };
        self.claim_execute(claim, conn, statement, Vec::new(), stage);
    }

    pub(super) fn on_claim(&mut self, claim: ClaimId, stage: ClaimStage, reply: Reply<R>) {
        let Some(c) = self.claims.get_mut(&claim) else {
            return;
        };
        if let Reply::Failed(error) = reply {
            self.on_claim_failed(claim, stage, error);
            return;
        }
        if matches!(stage, ClaimStage::Release | ClaimStage::Close) {
            c.conn = None;
            let more = match &c.form {
                ClaimForm::Advisory(a) => a.has_more(),
                ClaimForm::RowLock(_) | ClaimForm::Lease(_) => false,
            };
            if c.failed || !more {
                self.finish_claim(claim);
            } else {
                self.next_candidate(claim);
            }
            return;
        }
        let Some(conn) = c.conn else {
            return;
        };
        match stage {
            ClaimStage::Acquire => match &c.form {
                ClaimForm::RowLock(_) => self.row_lock_acquired(claim, conn),
                ClaimForm::Lease(_) => self.lease_claim_acquired(claim, conn),
                ClaimForm::Advisory(_) => self.advisory_acquired(claim, conn),
            },
            ClaimStage::RowLock(stage) => self.on_row_lock_claim(claim, conn, stage, reply),
            ClaimStage::Lease(stage) => self.on_lease_claim(claim, conn, stage, reply),
            ClaimStage::Advisory(stage) => self.on_advisory_claim(claim, conn, stage, reply),
            ClaimStage::Release | ClaimStage::Close => {}
        }
    }

    fn on_claim_failed(&mut self, claim: ClaimId, stage: ClaimStage, error: DbError) {
        self.end_count(claim);
        let Some(c) = self.claims.get_mut(&claim) else {
            return;
        };
        let sub = c.sub;
        c.failed = true;
        let conn = c.conn.take();
        let (current, database_locks) = match &mut c.form {
            ClaimForm::RowLock(r) => {
                // The connection closes below, and the marks end with its session.
                r.counted = None;
                r.forget_marks();
                (None, false)
            }
            ClaimForm::Lease(l) => {
                l.taken.clear();
                (None, false)
            }
            ClaimForm::Advisory(a) => (
                a.abandon(),
                matches!(a.st.keys, crate::dialect::KeyLocks::Database { .. }),
            ),
        };
        // A key on the database's locks counts as in work from its lock on; a custom lock's
        // and the registry's from the lock's answer.
        if let Some(candidate) = current
            && (database_locks || !matches!(stage, ClaimStage::Advisory(AdvisoryStage::Lock)))
        {
            // A key locked on this connection ends with it; the registry forgets it.
            self.keys.remove(&candidate.key);
        }
        let s = &self.subs[sub.0];
        let error = if error.kind == ErrorKind::Serialization
            && matches!(s.statements.form, FormStatements::RowLock(_))
        {
            DbError::new(
                ErrorKind::Serialization,
                format!(
                    "table `{}`: {}; the row lock form needs `default_transaction_isolation` = 'read committed'",
                    s.desc.table, error.message
                ),
            )
        } else {
            error
        };
        match (stage, conn) {
            (ClaimStage::Release | ClaimStage::Close, _) => {
                self.finish_claim(claim);
                return;
            }
            (ClaimStage::Acquire, Some(conn)) => self.conns.forget(conn),
            (_, Some(conn)) => self.claim_step(claim, conn, Action::Close, ClaimStage::Close),
            (_, None) => {}
        }
        self.events.push_back(Event::Error { sub, error });
        if !self
            .pending
            .values()
            .any(|s| matches!(s, Step::Claim { claim: c, .. } if *c == claim))
        {
            self.finish_claim(claim);
        }
    }

    /// The claim's connection goes back to the pool, or, without one, the claim ends. A
    /// connection whose session holds a row lock count's marks closes instead, and the marks
    /// end with the session.
    fn claim_release(&mut self, claim: ClaimId) {
        let Some(c) = self.claims.get_mut(&claim) else {
            return;
        };
        let marked = match &mut c.form {
            ClaimForm::RowLock(r) => r.forget_marks(),
            ClaimForm::Lease(_) | ClaimForm::Advisory(_) => false,
        };
        match c.conn.take() {
            Some(conn) if marked => self.claim_step(claim, conn, Action::Close, ClaimStage::Close),
            Some(conn) => self.claim_step(claim, conn, Action::Release, ClaimStage::Release),
            None => self.finish_claim(claim),
        }
    }

    /// When each row lock claim's lock of its counted row tries again (`None`: it does not).
    pub(super) fn relock_times(&self) -> Vec<(ClaimId, Option<crate::value::Time>)> {
        self.claims
            .iter()
            .filter_map(|(&id, c)| match &c.form {
                ClaimForm::RowLock(r) => Some((id, r.relock_at)),
                ClaimForm::Lease(_) | ClaimForm::Advisory(_) => None,
            })
            .collect()
    }

    fn finish_claim(&mut self, claim: ClaimId) {
        self.timers.set(super::timers::Timer::Relock(claim), None);
        self.end_count(claim);
        let Some(c) = self.claims.remove(&claim) else {
            return;
        };
        debug_assert!(c.conn.is_none(), "a claim ended holding a connection");
        let now = self.now;
        let s = &mut self.subs[c.sub.0];
        s.claim_slots -= c.limit;
        s.claims_running -= 1;
        if let Some(lease) = s.lease_mut() {
            lease.claim_took = now.since(c.started);
        }
        s.last_full = !c.failed && c.found >= c.limit;
        let poll = now.plus(s.options.poll_interval);
        let next = match (s.last_full || c.again, c.failed) {
            (_, true) => poll,
            (true, false) => now,
            // After a claim from the floor that found less than it asked for, the claim
            // from the start that finds the rows below the floor, where that is sooner.
            (false, false) => s.floor.look_behind_at(now).map_or(poll, |t| t.min(poll)),
        };
        // A row that waits its delay here is looked for again when the delay ends.
        let next = s.waiting.next_end().map_or(next, |t| t.max(now).min(next));
        // So is a row retried into its table, due after this claim started.
        let next = s
            .retry_due_after(c.started)
            .map_or(next, |t| t.max(now).min(next));
        // A wake that came while the claim ran keeps its earlier time.
        if !s.stopped {
            s.next_claim_at = Some(s.next_claim_at.map_or(next, |t| t.min(next)));
        }
    }
}

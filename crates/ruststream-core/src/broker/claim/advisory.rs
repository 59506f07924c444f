//! The advisory lock form's claim: read the first due rows with their keys, lock each key on a
//! connection of its own without waiting, passing over a key held elsewhere, and take the row
//! while it is still claimable (the take counts the attempt and commits). The connection that
//! holds the delivery keeps the lock.
//!
//! On the database's locks, a key found held is passed over with every later candidate of it,
//! so no row overtakes an earlier row of its key. A claim that reads the first due rows alone
//! (SQLite's registry, a custom lock) takes nothing while they are held.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::dialect::{AdvisoryStatements, AdvisoryTake, Arg, Dialect, KeyLocks, Statements};
use crate::keys::{mysql_lock_name, postgres_key_hash};
use crate::types::{Action, ConnId, Reply, SubId};
use crate::value::Value;

use super::super::rows::{Candidate, Taken, affected_any, answer, rows_of};
use super::super::sub::FormState;
use super::super::waiting::{Passing, excluded_id};
use super::super::{Broker, State};
use super::ClaimId;
use super::{Claim, ClaimForm, ClaimStage};

/// Where an advisory claim is.
#[derive(Clone, Copy, Debug)]
pub(in crate::broker) enum Stage {
    Candidates,
    Lock,
    Take,
    TakeCount,
    ReadRow,
    Unlock,
}

#[derive(Debug)]
pub(in crate::broker) struct Claiming {
    pub(super) st: Arc<AdvisoryStatements>,
    candidates: VecDeque<Candidate>,
    /// The candidate whose key is being locked, or whose row is being taken.
    current: Option<Candidate>,
    /// The candidates have been read.
    loaded: bool,
    /// Keys this claim found held (in work here or elsewhere). Their later candidates are
    /// passed over too, so no row overtakes an earlier row of its key.
    passed: BTreeSet<Arc<str>>,
    /// How many rows the last look asked for, and whether it found as many: rows may wait
    /// past them.
    window: usize,
    full: bool,
    /// The looks after the first.
    looks: usize,
    /// The look in flight starts at the floor or sets it: it passed over the keys of this
    /// subscription's rows in work alone, the lowest of which is this id.
    floor_look: Option<Option<i64>>,
    // Where the claim's first look started (`None`: at the table's start). Its later looks
    // start there too, or at the floor after a first look from the start: a look from the
    // start passes every index entry the rows taken before it left, which vacuum may not
    // have removed.
    from: Option<i64>,
}

/// The most looks past held keys one claim takes after its first: each passes over the keys
/// the looks before it found held.
const MORE_LOOKS: usize = 8;

/// The most keys one look passes over in its statement; a claim whose passed keys are more
/// looks at more rows instead.
const EXCLUDE_MAX: usize = 256;

impl Claiming {
    pub(super) fn new(st: &Arc<AdvisoryStatements>) -> Self {
        Self {
            st: st.clone(),
            candidates: VecDeque::new(),
            current: None,
            loaded: false,
            passed: BTreeSet::new(),
            window: 0,
            full: false,
            looks: 0,
            floor_look: None,
            from: None,
        }
    }

    /// Whether candidates are left to try.
    pub(super) fn has_more(&self) -> bool {
        !self.candidates.is_empty() || self.current.is_some()
    }

    /// The claim ends: no candidate is tried; the one in hand, if any.
    pub(super) fn abandon(&mut self) -> Option<Candidate> {
        self.candidates.clear();
        self.current.take()
    }
}

impl<R> Broker<R> {
    fn advisory(
        claims: &mut BTreeMap<ClaimId, Claim<R>>,
        claim: ClaimId,
    ) -> Option<(SubId, &mut Claiming)> {
        let c = claims.get_mut(&claim)?;
        match &mut c.form {
            ClaimForm::Advisory(a) => Some((c.sub, a)),
            ClaimForm::RowLock(_) | ClaimForm::Lease(_) => None,
        }
    }

    pub(super) fn advisory_acquired(&mut self, claim: ClaimId, conn: ConnId) {
        let now = self.now;
        let Some((sub, a)) = Self::advisory(&mut self.claims, claim) else {
            return;
        };
        if a.loaded {
            self.lock_current(claim);
            return;
        }
        let database = matches!(a.st.keys, KeyLocks::Database { .. });
        let plain = a.st.candidates.clone();
        let first_look = a.looks == 0;
        let first_from = a.from;
        let floor = a.st.candidates_from.is_some() && first_look;
        // On the database's locks, a look passes over the keys in work in this process and
        // those this claim found held elsewhere: the rows it reads are of keys it may take.
        let mut excluded: Vec<Arc<str>> = if database {
            self.keys.union(&a.passed).cloned().collect()
        } else {
            Vec::new()
        };
        let s = &self.subs[sub.0];
        // Enough to pass over the rows in work (claimed ahead too) and the rows the
        // subscription's other claims are taking, and still find this claim's: `claim_slots`
        // counts this claim's slots and theirs.
        let mut limit = if s.first_rows_only() {
            1
        } else {
            let own = self.claims.get(&claim).map_or(0, |c| c.limit);
            s.rows_claimed + s.claim_slots + own
        };
        if excluded.len() > EXCLUDE_MAX {
            limit += excluded.len() - EXCLUDE_MAX;
            excluded.truncate(EXCLUDE_MAX);
        }
        // The first look may start past the rows taken before it, and sets where the next
        // starts, when it passes over the keys of this subscription's rows in work alone.
        // The claim's later looks start where its first did; after a first look from the
        // table's start, which read what lies below the floor, at the floor.
        let held = floor.then(|| self.held_floor(sub, &excluded)).flatten();
        let from = match first_look {
            true => held.and_then(|_| self.subs[sub.0].floor.start(now)),
            false => first_from.or(self.subs[sub.0].floor.id),
        };
        let keys = match excluded.len() {
            0 => 0,
            n => n.next_power_of_two(),
        };
        let statement = match (keys, from.is_some()) {
            (0, false) => plain,
            (keys, from) => self.candidates_for(sub, keys, from).unwrap_or(plain),
        };
        // The look passes over the rows that wait their delay in this process too.
        let passing = Passing::Candidates {
            keys,
            from: from.is_some(),
        };
        let (statement, ids) = self.passing(sub, passing, statement);
        let binds = statement.binds(|arg| {
            excluded_id(arg, &ids).unwrap_or(match arg {
                Arg::Limit => Value::Int(limit as i64),
                Arg::Floor => Value::Int(from.unwrap_or(i64::MIN)),
                // Padded with the last key: the statement is rendered for a power of two.
                Arg::ExcludedKey(i) => excluded
                    .get(i)
                    .or(excluded.last())
                    .map_or(Value::Null, |k| Value::Text(k.to_string())),
                _ => Value::Null,
            })
        });
        if let Some((_, a)) = Self::advisory(&mut self.claims, claim) {
            a.window = limit;
            a.floor_look = held;
            if first_look {
                a.from = from;
            }
        }
        let stage = ClaimStage::Advisory(Stage::Candidates);
        self.claim_execute(claim, conn, statement, binds, stage);
    }

    /// The candidates that pass over `n` keys, `from` the floor on or from the start,
    /// rendered once per size and start.
    fn candidates_for(&mut self, sub: SubId, n: usize, from: bool) -> Option<crate::Statement> {
        let dialect = self.dialect;
        let s = &mut self.subs[sub.0];
        let FormState::Advisory(advisory) = &mut s.form else {
            return None;
        };
        if let Some(statement) = advisory.excluding.get(&(n, from)) {
            return Some(statement.clone());
        }
        let statement = match from {
            true => Statements::candidates_from(dialect, &s.desc, n)?,
            false => Statements::candidates_excluding(dialect, &s.desc, n)?,
        };
        advisory.excluding.insert((n, from), statement.clone());
        Some(statement)
    }

    // Where a look that passes over `excluded` may leave the floor: `Some` of the lowest id
    // of this subscription's rows in work (none: `Some(None)`) when each excluded key is
    // held for one of them; `None` when a key is held for another table's row, whose rows
    // of this table the look cannot see, or an id is not an integer.
    fn held_floor<'a>(&'a self, sub: SubId, excluded: &[Arc<str>]) -> Option<Option<i64>> {
        let mut keys: BTreeSet<&'a Arc<str>> = BTreeSet::new();
        let mut lowest: Option<i64> = None;
        let mut note = |id: &Value, key: &'a Arc<str>| -> bool {
            let Some(id) = id.as_int() else {
                return false;
            };
            lowest = Some(lowest.map_or(id, |l| l.min(id)));
            keys.insert(key);
            true
        };
        for (id, key) in self.deliveries.held_keys(sub) {
            if !note(id, key) {
                return None;
            }
        }
        for c in self.claims.values().filter(|c| c.sub == sub) {
            if let ClaimForm::Advisory(a) = &c.form
                && let Some(current) = &a.current
                && self.keys.contains(&current.key)
                && !note(&current.id, &current.key)
            {
                return None;
            }
        }
        excluded
            .iter()
            .all(|key| keys.contains(key))
            .then_some(lowest)
    }

    pub(super) fn on_advisory_claim(
        &mut self,
        claim: ClaimId,
        conn: ConnId,
        stage: Stage,
        reply: Reply<R>,
    ) {
        let Some((sub, a)) = Self::advisory(&mut self.claims, claim) else {
            return;
        };
        match stage {
            Stage::Candidates => {
                let rows = rows_of(reply);
                if let Some(held) = a.floor_look.take() {
                    let ids: Vec<Value> = rows.iter().map(Candidate::id_of).collect();
                    let from_floor = a.from.is_some();
                    let now = self.now;
                    self.subs[sub.0]
                        .floor
                        .found_above(&ids, a.window, held, from_floor, now);
                }
                let Some((_, a)) = Self::advisory(&mut self.claims, claim) else {
                    return;
                };
                a.full = rows.len() >= a.window;
                let mut unread = Vec::new();
                a.candidates.extend(rows.into_iter().map(|row| {
                    if let Some(why) = &row.unread {
                        unread.push((Candidate::id_of(&row), Arc::<str>::from(why.as_str())));
                    }
                    Candidate::read(row)
                }));
                self.unread_keys.extend(unread);
                let Some((_, a)) = Self::advisory(&mut self.claims, claim) else {
                    return;
                };
                a.loaded = true;
                self.next_candidate(claim);
            }
            Stage::Lock => self.key_locked(claim, answer(reply)),
            Stage::Take | Stage::ReadRow => match rows_of(reply).pop() {
                Some(row) => self.taken(claim, row),
                None => self.row_gone(claim),
            },
            Stage::TakeCount => {
                let AdvisoryTake::CountThenRead { read_row, .. } = &a.st.take else {
                    return;
                };
                let read_row = read_row.clone();
                match a.current.as_ref().map(|c| c.id.clone()) {
                    Some(id) if affected_any(&reply) => {
                        let binds = read_row.binds(|_| id.clone());
                        let stage = ClaimStage::Advisory(Stage::ReadRow);
                        self.claim_execute(claim, conn, read_row, binds, stage);
                    }
                    _ => self.row_gone(claim),
                }
            }
            Stage::Unlock => {
                let key = a.current.take().map(|c| c.key);
                if let Some(key) = key {
                    self.keys.remove(&key);
                }
                if answer(reply) {
                    self.next_candidate(claim);
                } else if let Some(c) = self.claims.get_mut(&claim) {
                    // The session may still hold the key: closing it ends the lock.
                    c.conn = None;
                    self.claim_step(claim, conn, Action::Close, ClaimStage::Close);
                }
            }
        }
    }

    /// The current candidate's row was gone when its key's lock came (settled, failed or
    /// taken since the look): the key is released, and the key's next row, which no look of
    /// this claim read, waits for the next claim, which runs as soon as this one ends.
    fn row_gone(&mut self, claim: ClaimId) {
        if let Some(c) = self.claims.get_mut(&claim) {
            c.again = true;
        }
        self.unlock_current(claim);
    }

    /// The lock of the current candidate's key answered.
    fn key_locked(&mut self, claim: ClaimId, locked: bool) {
        let running = self.state == State::Running;
        let Some((_, a)) = Self::advisory(&mut self.claims, claim) else {
            return;
        };
        let keys = &a.st.keys;
        if locked {
            if running {
                self.take_current(claim);
            } else {
                // The shutdown began while the lock ran: release the key and take nothing,
                // so no attempt is spent on a row no handler will see.
                self.unlock_current(claim);
            }
        } else if matches!(keys, KeyLocks::Custom) {
            // The first due row's key is held: the claim takes nothing more.
            a.abandon();
            self.next_candidate(claim);
        } else {
            if let Some(candidate) = a.current.take() {
                self.keys.remove(&candidate.key);
                a.passed.insert(candidate.key);
            }
            self.next_candidate(claim);
        }
    }

    /// The current candidate's row is taken: it goes to a delivery with the claim's
    /// connection, which holds its key.
    fn taken(&mut self, claim: ClaimId, row: crate::Row<R>) {
        let Some(c) = self.claims.get_mut(&claim) else {
            return;
        };
        let sub = c.sub;
        let ClaimForm::Advisory(a) = &mut c.form else {
            return;
        };
        let Some(candidate) = a.current.take() else {
            return;
        };
        // The key's later candidates wait for the next look: the row taken may return to
        // the queue (a retry releases its key) before this claim comes to them.
        a.passed.insert(candidate.key.clone());
        c.found += 1;
        let conn = c.conn.take();
        let attempts = self.subs[sub.0].desc.attempt.is_some();
        // The take's row already counts this attempt.
        let taken = Taken::read(row, attempts, 0);
        self.deliver(sub, taken, conn, Some(candidate.key), None);
        self.next_candidate(claim);
    }

    /// The claim's next candidate, or its end.
    pub(super) fn next_candidate(&mut self, claim: ClaimId) {
        loop {
            let running = self.state == State::Running;
            let Some(c) = self.claims.get_mut(&claim) else {
                return;
            };
            let done = c.found >= c.limit;
            let ClaimForm::Advisory(a) = &mut c.form else {
                return;
            };
            if !running || done {
                a.candidates.clear();
            }
            let Some(candidate) = a.candidates.pop_front() else {
                // The look found rows of held keys only, and more may wait past them: look
                // again at once, passing over those keys too.
                let again = running
                    && !done
                    && a.full
                    && a.looks < MORE_LOOKS
                    && matches!(a.st.keys, KeyLocks::Database { .. });
                if !again {
                    self.claim_release(claim);
                    return;
                }
                a.loaded = false;
                a.full = false;
                a.looks += 1;
                match c.conn {
                    Some(conn) => self.advisory_acquired(claim, conn),
                    None => {
                        let conn = self.new_conn();
                        if let Some(c) = self.claims.get_mut(&claim) {
                            c.conn = Some(conn);
                        }
                        self.claim_step(claim, conn, Action::Acquire, ClaimStage::Acquire);
                    }
                }
                return;
            };
            // A row read before its retry began to wait here (another claim took it meanwhile):
            // it waits out its delay.
            if self.subs[c.sub.0].waiting.holds(&candidate.id, self.now) {
                continue;
            }
            match &a.st.keys {
                KeyLocks::Database { .. }
                    if self.keys.contains(&candidate.key) || a.passed.contains(&candidate.key) =>
                {
                    a.passed.insert(candidate.key);
                    continue;
                }
                KeyLocks::Registry if self.keys.contains(&candidate.key) => {
                    // The first due rows are in work: the claim takes nothing while they are.
                    a.candidates.clear();
                    continue;
                }
                _ => {}
            }
            a.current = Some(candidate);
            self.try_current(claim);
            return;
        }
    }

    /// Locks the current candidate's key, on the claim's connection or a new one.
    fn try_current(&mut self, claim: ClaimId) {
        let Some(c) = self.claims.get(&claim) else {
            return;
        };
        match c.conn {
            Some(_) => self.lock_current(claim),
            None => {
                let conn = self.new_conn();
                if let Some(c) = self.claims.get_mut(&claim) {
                    c.conn = Some(conn);
                }
                self.claim_step(claim, conn, Action::Acquire, ClaimStage::Acquire);
            }
        }
    }

    fn lock_current(&mut self, claim: ClaimId) {
        let running = self.state == State::Running;
        let Some(conn) = self.claims.get(&claim).and_then(|c| c.conn) else {
            return;
        };
        let Some((sub, a)) = Self::advisory(&mut self.claims, claim) else {
            return;
        };
        let Some((id, key)) = a.current.as_ref().map(|c| (c.id.clone(), c.key.clone())) else {
            return;
        };
        if !running {
            // The shutdown began while the claim's connection was acquired: take nothing.
            a.abandon();
            self.next_candidate(claim);
            return;
        }
        if self.subs[sub.0].waiting.holds(&id, self.now) {
            // The row was taken, and retried, here while this claim acquired its connection.
            a.current = None;
            self.next_candidate(claim);
            return;
        }
        match &a.st.keys {
            KeyLocks::Registry => {
                self.keys.insert(key);
                self.take_current(claim);
            }
            KeyLocks::Custom => {
                let stage = ClaimStage::Advisory(Stage::Lock);
                self.claim_step(claim, conn, Action::Lock { sub, key }, stage);
            }
            KeyLocks::Database { try_lock, .. } => {
                let statement = try_lock.clone();
                let arg = self.key_arg(sub, &key);
                // The key counts as in work here from its lock on: another claim of this
                // process passes over it instead of trying a lock this one may hold.
                self.keys.insert(key);
                let binds = statement.binds(|_| arg.clone());
                let stage = ClaimStage::Advisory(Stage::Lock);
                self.claim_execute(claim, conn, statement, binds, stage);
            }
        }
    }

    /// The bind that names a key's lock in the database.
    pub(in crate::broker) fn key_arg(&self, sub: SubId, key: &str) -> Value {
        match self.dialect {
            Dialect::Postgres => Value::Int(postgres_key_hash(key)),
            _ => Value::Text(mysql_lock_name(
                self.subs[sub.0].check.database.as_deref().unwrap_or(""),
                key,
            )),
        }
    }

    fn take_current(&mut self, claim: ClaimId) {
        let now = self.now;
        let Some(conn) = self.claims.get(&claim).and_then(|c| c.conn) else {
            return;
        };
        let Some((_, a)) = Self::advisory(&mut self.claims, claim) else {
            return;
        };
        let Some(id) = a.current.as_ref().map(|c| c.id.clone()) else {
            return;
        };
        let (statement, stage) = match &a.st.take {
            AdvisoryTake::Returning { take } => (take.clone(), Stage::Take),
            AdvisoryTake::CountThenRead { take_count, .. } => {
                (take_count.clone(), Stage::TakeCount)
            }
        };
        let binds = statement.binds(|arg| match arg {
            Arg::Id => id.clone(),
            _ => Value::Int(now.micros()),
        });
        self.claim_execute(claim, conn, statement, binds, ClaimStage::Advisory(stage));
    }

    /// The current candidate's row is no longer claimable: release its key.
    fn unlock_current(&mut self, claim: ClaimId) {
        let Some(conn) = self.claims.get(&claim).and_then(|c| c.conn) else {
            return;
        };
        let Some((sub, a)) = Self::advisory(&mut self.claims, claim) else {
            return;
        };
        let Some(key) = a.current.as_ref().map(|c| c.key.clone()) else {
            return;
        };
        match &a.st.keys {
            KeyLocks::Registry => {
                a.current = None;
                self.keys.remove(&key);
                self.next_candidate(claim);
            }
            KeyLocks::Custom => {
                let stage = ClaimStage::Advisory(Stage::Unlock);
                self.claim_step(claim, conn, Action::Unlock { sub, key }, stage);
            }
            KeyLocks::Database { unlock, .. } => {
                let statement = unlock.clone();
                let arg = self.key_arg(sub, &key);
                let binds = statement.binds(|_| arg.clone());
                let stage = ClaimStage::Advisory(Stage::Unlock);
                self.claim_execute(claim, conn, statement, binds, stage);
            }
        }
    }
}

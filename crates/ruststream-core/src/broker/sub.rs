//! A subscription: its table, statements and settings, its check's state, and the counts its
//! claims are decided by.

mod form;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::dialect::{FormStatements, KeyLocks, RowLockClaim, Statement, Statements};
use crate::spec::TableDesc;
use crate::types::ConnId;
use crate::value::{Time, Value};

pub(super) use form::{Count, CountQueue, FormState, LeaseState};

use super::options::SubscribeOptions;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SubState {
    Checking,
    Ready,
    Failed,
}

/// How many retried rows' due times a subscription keeps for its next claims.
const RETRIES_DUE_MAX: usize = 64;

/// The check of a subscription's table.
#[derive(Debug, Default)]
pub(super) struct CheckState {
    /// The connection the check runs on, while it runs.
    pub(super) conn: Option<ConnId>,
    /// When a check that failed on a passing error runs again.
    pub(super) again_at: Option<Time>,
    /// How many times in a row the check failed on a passing error.
    pub(super) failures: u32,
    /// MySQL and MariaDB: the database's name, for lock names.
    pub(super) database: Option<String>,
    /// The session check ([`super::session`]), while it runs.
    pub(super) session: Option<super::session::SessionCheck>,
    /// `ensure_schema`: the schema's statements ran once, so a table still missing fails.
    pub(super) schema_ran: bool,
}

#[derive(Debug)]
pub(super) struct Sub {
    pub(super) desc: TableDesc,
    pub(super) statements: Statements,
    pub(super) options: SubscribeOptions,
    pub(super) state: SubState,
    pub(super) check: CheckState,
    /// Rows claimed and not yet ended: in work, claimed ahead, or settling.
    pub(super) rows_claimed: usize,
    /// The deliveries handed to the runtime and not yet ended.
    pub(super) rows_handed: usize,
    /// The deliveries handed to the runtime that it has not settled or dropped yet: at most
    /// `workers`. A row claimed ahead goes to the runtime when this falls below `workers`.
    pub(super) at_handlers: usize,
    /// Rows claimed ahead, beyond `workers` ([`SubscribeOptions::prefetch`]).
    pub(super) prefetch: usize,
    /// Slots that claims in flight hold.
    pub(super) claim_slots: usize,
    /// Claims started and not yet finished.
    pub(super) claims_running: usize,
    /// Claims no more: the runtime stopped it.
    pub(super) stopped: bool,
    pub(super) next_claim_at: Option<Time>,
    /// When rows this process retried become due, until a claim starts after that time: a
    /// claim that starts sooner finds them not yet due, and its end claims again then rather
    /// than at the poll.
    pub(super) retries_due: std::collections::BTreeSet<Time>,
    /// The last claim found all it asked for.
    pub(super) last_full: bool,
    /// The rows that failed here and wait their delay in memory.
    pub(super) waiting: super::waiting::Waiting,
    /// The claim statements that pass over the waiting rows, by kind and how many.
    pub(super) passing: BTreeMap<(super::waiting::Passing, usize), Statement>,
    /// Where the next claim may start, in a table claimed in id order.
    pub(super) floor: Floor,
    /// What its form alone keeps.
    pub(super) form: FormState,
}

// Where a claim of a table claimed in id order starts: at the lowest id of the last claim
// (or lower, where a row in work here keeps it), past the index entries of the rows settled
// before it. A row below it that is claimable again (retried, or whose lease ran out, or
// committed late under a lower id) is found by the next claim from the start, which runs at
// least every [`FROM_START_EVERY`], and soon after a claim from the floor that found less
// than it asked for: at once while a look from the start is cheap; while it is dear (the
// entries of settled rows that vacuum may not remove yet, behind a transaction held open),
// the claims keep the floor and look from the start at most a twentieth of the time.
#[derive(Debug, Default)]
pub(super) struct Floor {
    /// Where the next claim starts (`None`: at the table's start).
    pub(super) id: Option<i64>,
    /// When the last claim from the start was sent.
    from_start_at: Option<Time>,
    /// How long the last look from the start took, from its statement to its answer.
    from_start_took: Duration,
    /// A claim from the floor found less than it asked for since the last claim from the
    /// start was sent: a row below the floor may be claimable again.
    behind: bool,
}

/// How long claims may start past the rows earlier claims took before one starts at the
/// table's beginning again.
pub(super) const FROM_START_EVERY: Duration = Duration::from_secs(1);

/// A look from the start that takes longer is dear: the claims keep the floor after a short
/// look, and look from the start [`DEAR_SPACING`] times its length apart.
pub(super) const DEAR_FROM_START: Duration = Duration::from_millis(5);

/// While looks from the start are dear, one starts at least this many times the last one's
/// length after it.
pub(super) const DEAR_SPACING: u32 = 20;

/// The longest a lease claim waits for the handlers that run ([`Sub::gathers`]).
pub(super) const GATHER_AT_MOST: Duration = Duration::from_millis(2);

impl Floor {
    /// The id a claim sent at `now` starts from, or `None` for a claim from the start, which
    /// this records.
    pub(super) fn start(&mut self, now: Time) -> Option<i64> {
        match (self.id, self.from_start_at) {
            (Some(id), Some(at)) if now < self.start_again_at(at) => Some(id),
            _ => {
                self.from_start_at = Some(now);
                self.behind = false;
                None
            }
        }
    }

    /// When the next claim starts from the start, the last one having been sent at `at`.
    fn start_again_at(&self, at: Time) -> Time {
        let every = at.plus(FROM_START_EVERY);
        if self.behind {
            at.plus(self.spacing()).min(every)
        } else {
            every
        }
    }

    /// How far apart looks from the start run after a claim from the floor that came up
    /// short: not at all while they are cheap.
    fn spacing(&self) -> Duration {
        if self.from_start_took > DEAR_FROM_START {
            self.from_start_took.saturating_mul(DEAR_SPACING)
        } else {
            Duration::ZERO
        }
    }

    /// When the subscription's next claim runs after one that found less than it asked for,
    /// where that is sooner than its poll: the claim from the start that finds the rows
    /// below the floor.
    pub(super) fn look_behind_at(&self, now: Time) -> Option<Time> {
        match (self.behind, self.from_start_at) {
            (true, Some(at)) => Some(self.start_again_at(at).max(now)),
            (true, None) => Some(now),
            (false, _) => None,
        }
    }

    /// A claim that asked for `asked` rows took the rows of `ids`; it started at the floor
    /// (`from_floor`) or at the table's start, and its answer came at `now`.
    pub(super) fn found<'a>(
        &mut self,
        ids: impl IntoIterator<Item = &'a Value>,
        asked: usize,
        from_floor: bool,
        now: Time,
    ) {
        self.found_above(ids, asked, None, from_floor, now);
    }

    /// A claim that asked for `asked` rows found the rows of `ids`, while the rows it passed
    /// over were at or above `held` (the advisory form's rows in work here, whose keys its
    /// look passed over): the floor is at neither.
    pub(super) fn found_above<'a>(
        &mut self,
        ids: impl IntoIterator<Item = &'a Value>,
        asked: usize,
        held: Option<i64>,
        from_floor: bool,
        now: Time,
    ) {
        if !from_floor && let Some(at) = self.from_start_at {
            self.from_start_took = now.since(at);
        }
        let mut n = 0;
        let mut lowest: Option<i64> = None;
        for id in ids {
            n += 1;
            match id.as_int() {
                Some(i) => lowest = Some(lowest.map_or(i, |l| l.min(i))),
                // Not an integer id: claims start from the beginning.
                None => {
                    self.id = None;
                    return;
                }
            }
        }
        let at = match (lowest, held) {
            (Some(l), Some(h)) => Some(l.min(h)),
            (lowest, held) => lowest.or(held),
        };
        if n >= asked.max(1) {
            self.id = at;
            return;
        }
        // The look read every due row past its start: the floor may rise to what it found,
        // or stay. The rows below it wait for a look from the start.
        if from_floor {
            self.behind = true;
        }
        self.id = if self.spacing().is_zero() {
            None
        } else {
            at.or(self.id)
        };
    }
}

impl Sub {
    pub(super) fn new(desc: TableDesc, statements: Statements, options: SubscribeOptions) -> Self {
        let form = FormState::new(desc.hold);
        let mut sub = Self {
            desc,
            statements,
            options,
            state: SubState::Checking,
            check: CheckState::default(),
            rows_claimed: 0,
            rows_handed: 0,
            at_handlers: 0,
            prefetch: 0,
            claim_slots: 0,
            claims_running: 0,
            stopped: false,
            next_claim_at: None,
            retries_due: std::collections::BTreeSet::new(),
            last_full: false,
            waiting: super::waiting::Waiting::default(),
            passing: BTreeMap::new(),
            floor: Floor::default(),
            form,
        };
        // A claim that reads the first due rows alone takes one row at a time: none ahead.
        sub.prefetch = if sub.first_rows_only() {
            0
        } else {
            options.prefetch
        };
        sub
    }

    /// The row lock form's counts.
    pub(super) fn counts(&self) -> Option<&CountQueue> {
        match &self.form {
            FormState::RowLock(r) => Some(&r.counts),
            FormState::Lease(_) | FormState::Advisory(_) => None,
        }
    }

    /// The row lock form's counts, to change.
    pub(super) fn counts_mut(&mut self) -> Option<&mut CountQueue> {
        match &mut self.form {
            FormState::RowLock(r) => Some(&mut r.counts),
            FormState::Lease(_) | FormState::Advisory(_) => None,
        }
    }

    /// The lease form's state.
    pub(super) fn lease(&self) -> Option<&LeaseState> {
        match &self.form {
            FormState::Lease(l) => Some(l),
            FormState::RowLock(_) | FormState::Advisory(_) => None,
        }
    }

    /// The lease form's state, to change.
    pub(super) fn lease_mut(&mut self) -> Option<&mut LeaseState> {
        match &mut self.form {
            FormState::Lease(l) => Some(l),
            FormState::RowLock(_) | FormState::Advisory(_) => None,
        }
    }

    /// The lease form: until when the claim due waits for the handlers ([`Sub::gathers`]).
    pub(super) fn gather_until(&self) -> Option<Time> {
        self.lease().and_then(|l| l.gather_until)
    }

    /// The lease form on the servers: the rows settling whose workers are free
    /// ([`LeaseState::settling_freed`]); none in another form.
    pub(super) fn settling_freed(&self) -> usize {
        self.lease().map_or(0, |l| l.settling_freed)
    }

    /// The advisory lock form: who holds the keys.
    pub(super) fn keys(&self) -> Option<&KeyLocks> {
        match &self.statements.form {
            FormStatements::Advisory(f) => Some(&f.keys),
            FormStatements::RowLock(_) | FormStatements::Lease(_) => None,
        }
    }

    /// SQLite's registry of keys in work.
    pub(super) fn registry(&self) -> bool {
        matches!(self.keys(), Some(KeyLocks::Registry))
    }

    /// Whether a claim reads the first due rows alone (SQLite's registry, a custom lock): it
    /// takes nothing while they are in work, and the release of a key starts the next claim
    /// at once.
    pub(super) fn first_rows_only(&self) -> bool {
        matches!(self.keys(), Some(KeyLocks::Registry | KeyLocks::Custom))
    }

    // Whether a claim may start while another of the subscription runs.
    //
    // Row lock claims and advisory claims on the database's locks run side by side: `SKIP
    // LOCKED` and the key's lock keep two claims from taking one row. Row lock claims that
    // count an attempt are counted together, one statement at a time, and the counts' marks
    // keep two counts from counting one row ([`CountQueue`]). A lease claim runs alone: it
    // takes, just before its statement, a row for every worker that freed while the last
    // one ran, where claims side by side would each take a few rows at a statement's cost.
    // A claim that reads the first due rows only (SQLite's registry, a custom lock) runs
    // alone, so the first row is read once.
    pub(super) fn side_by_side(&self) -> bool {
        match (&self.statements.form, self.keys()) {
            (FormStatements::Lease(_), _) => false,
            (_, None) => true,
            (_, Some(keys)) => matches!(keys, KeyLocks::Database { .. }),
        }
    }

    /// The row lock form with an attempt column.
    pub(super) fn counts_attempts(&self) -> bool {
        match &self.statements.form {
            FormStatements::RowLock(f) => !matches!(f.claim, RowLockClaim::Lock { .. }),
            FormStatements::Lease(_) | FormStatements::Advisory(_) => false,
        }
    }

    /// The row lock form.
    pub(super) fn row_locks(&self) -> bool {
        matches!(self.statements.form, FormStatements::RowLock(_))
    }

    /// How many more rows claims may take now.
    pub(super) fn free(&self) -> usize {
        if self.registry() && self.rows_claimed + self.claim_slots > 0 {
            // SQLite's registry: one delivery in work at a time. A claim meanwhile would read
            // the row in work, or take a second.
            return 0;
        }
        let held = self.rows_claimed - self.settling_freed().min(self.options.workers);
        (self.options.workers + self.prefetch).saturating_sub(held + self.claim_slots)
    }

    /// A row this process retried into its table is due at `due`. Kept for the claims that
    /// start before then; at most [`RETRIES_DUE_MAX`], the latest forgotten first.
    pub(super) fn note_retry_due(&mut self, due: Time) {
        self.retries_due.insert(due);
        while self.retries_due.len() > RETRIES_DUE_MAX {
            self.retries_due.pop_last();
        }
    }

    /// The first time a retried row becomes due after a claim that started at `started`; the
    /// times that claim already looked past are forgotten.
    pub(super) fn retry_due_after(&mut self, started: Time) -> Option<Time> {
        self.retries_due = self
            .retries_due
            .split_off(&started.plus(Duration::from_micros(1)));
        self.retries_due.first().copied()
    }

    // The lease form on a server: whether the claim due at `now` waits for the handlers
    // that run. Claims run one at a time, and each takes a row for every slot free when its
    // statement goes; one started as soon as a handler ends takes that handler's row and the
    // few that ended during the last claim, and the next claim waits for it, so short
    // handlers get their rows a few at a claim's round trip. It waits until every slot is
    // free, or for at most half the last claim's time ([`GATHER_AT_MOST`] at most), once: a
    // free worker idles for less than the claim it may save.
    pub(super) fn gathers(&mut self, now: Time, gated: bool) -> bool {
        let slots = self.options.workers + self.prefetch;
        let waits = !gated && self.at_handlers > 0 && self.free() < slots;
        let Some(lease) = self.lease_mut() else {
            return false;
        };
        if !waits {
            lease.gather_until = None;
            return false;
        }
        let wait = (lease.claim_took / 2).min(GATHER_AT_MOST);
        let until = *lease.gather_until.get_or_insert(now.plus(wait));
        now < until
    }

    /// Whether a claim may start now, its time aside.
    pub(super) fn may_claim(&self) -> bool {
        self.state == SubState::Ready
            && !self.stopped
            && self.free() > 0
            && (self.side_by_side() || self.claims_running == 0)
    }
}

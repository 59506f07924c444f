//! Rows that failed in this process on a table with nowhere to write their retry's delay (no
//! due and no lease column): each waits its delay here, and the subscription's claims pass
//! over it until then, so a failing row is never taken again sooner than its policy says and
//! the rows behind it (of its key, in the advisory form) go on meanwhile.

use std::collections::{BTreeMap, BTreeSet};

use crate::dialect::{Arg, Statement, Statements};
use crate::stats::Stats;
use crate::value::{Time, Value};

use super::Broker;
use super::sub::Sub;
use crate::types::SubId;

/// The most rows a subscription keeps waiting; a failure past them returns its row at once,
/// and the subscription's next claim waits for the shorter of its delay and the poll.
pub const WAITING_MAX: usize = 256;

/// The rows of a subscription that wait their delay in memory, with when each may be taken
/// again (this process's clock).
#[derive(Debug, Default)]
pub(super) struct Waiting {
    rows: BTreeMap<Value, Time>,
}

impl Waiting {
    /// Keeps `id` out of the claims until `until`; `false` where [`WAITING_MAX`] rows wait
    /// already.
    pub(super) fn hold(&mut self, id: Value, until: Time) -> bool {
        if self.rows.len() >= WAITING_MAX && !self.rows.contains_key(&id) {
            return false;
        }
        self.rows.insert(id, until);
        true
    }

    /// Whether `id` waits past `now`.
    pub(super) fn holds(&self, id: &Value, now: Time) -> bool {
        self.rows.get(id).is_some_and(|until| *until > now)
    }

    /// Forgets the rows whose delay has passed by `now`.
    pub(super) fn expire(&mut self, now: Time) {
        self.rows.retain(|_, until| *until > now);
    }

    /// How many rows wait.
    pub(super) fn len(&self) -> usize {
        self.rows.len()
    }

    /// When the first of the rows' delays ends.
    pub(super) fn next_end(&self) -> Option<Time> {
        self.rows.values().min().copied()
    }

    /// The rows that wait, and `more`, each once.
    fn ids_with(&self, more: Vec<Value>) -> Vec<Value> {
        let mut ids: BTreeSet<Value> = self.rows.keys().cloned().collect();
        ids.extend(more);
        ids.into_iter().collect()
    }
}

/// `ids` padded with the last to `n` (a statement is rendered for a power of two).
fn pad(mut ids: Vec<Value>, n: usize) -> Vec<Value> {
    while let Some(last) = ids.last().cloned().filter(|_| ids.len() < n) {
        ids.push(last);
    }
    ids
}

/// Which of a subscription's claim statements passes over the waiting rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Passing {
    /// The row lock form's first statement; `floor`: its count from the floor on.
    RowLock { floor: bool },
    /// The advisory lock form's candidates, passing over `keys` keys too.
    Candidates { keys: usize, from: bool },
}

impl<R> Broker<R> {
    /// The claim statement `kind` of `sub` as it runs now: `plain` while no row waits, else
    /// its version that passes over the waiting rows, with the ids to bind
    /// ([`Arg::ExcludedId`]).
    pub(super) fn passing(
        &mut self,
        sub: SubId,
        kind: Passing,
        plain: Statement,
    ) -> (Statement, Vec<Value>) {
        let now = self.now;
        let dialect = self.dialect;
        // The row lock form: the rows in work here too, and those counted and not yet in work
        // (a leader's row waits for its count's marks), on a table where a row's retry may
        // wait here. A claim's scan skips a row locked when it reaches it, and may reach one
        // after the retry's commit let it go but before this process held it back.
        let nowhere = {
            let desc = &self.subs[sub.0].desc;
            desc.due.is_none() && desc.locked_until().is_none()
        };
        let in_work = match kind {
            Passing::RowLock { .. } if nowhere => {
                let mut ids = self.deliveries.holding_ids(sub);
                ids.extend(self.counted_ids(sub));
                ids
            }
            _ => Vec::new(),
        };
        let s: &mut Sub = &mut self.subs[sub.0];
        s.waiting.expire(now);
        let ids = s.waiting.ids_with(in_work);
        if ids.is_empty() {
            return (plain, Vec::new());
        }
        let n = ids.len().next_power_of_two();
        let statement = match s.passing.get(&(kind, n)) {
            Some(statement) => statement.clone(),
            None => {
                let rendered = match kind {
                    Passing::RowLock { floor } => {
                        Statements::row_lock_claim_passing(dialect, &s.desc, n, floor)
                    }
                    Passing::Candidates { keys, from } => {
                        Statements::candidates_passing(dialect, &s.desc, keys, n, from)
                    }
                };
                let Some(rendered) = rendered else {
                    return (plain, Vec::new());
                };
                s.passing.insert((kind, n), rendered.clone());
                rendered
            }
        };
        (statement, pad(ids, n))
    }

    /// `stats` with the rows of its table that wait in this process, where the table has no
    /// due and no lease column to hold their delays ([`Stats::waiting`]).
    pub(super) fn with_waiting(&mut self, mut stats: Stats) -> Stats {
        let now = self.now;
        let mut rows = BTreeSet::new();
        let mut holds = false;
        for s in self.subs.iter_mut().filter(|s| s.desc.table == stats.table) {
            if s.desc.due.is_some() || s.desc.locked_until().is_some() {
                return stats;
            }
            holds = true;
            s.waiting.expire(now);
            rows.extend(s.waiting.rows.keys().cloned());
        }
        stats.waiting = holds.then_some(rows.len() as u64);
        stats
    }
}

/// The bind of [`Arg::ExcludedId`] `i` among `ids`.
pub(super) fn excluded_id(arg: Arg, ids: &[Value]) -> Option<Value> {
    match arg {
        Arg::ExcludedId(i) => Some(ids.get(i).cloned().unwrap_or(Value::Null)),
        _ => None,
    }
}

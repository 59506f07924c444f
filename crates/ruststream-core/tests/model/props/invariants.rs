//! The invariants the property tests check after every step: each event against the database,
//! no row lost or failed without cause, and liveness where the database holds the keys.

use std::collections::BTreeMap;

use ruststream_core::{ClosedCounts, ConnId, Delivered, DeliveryId, Dialect, Event, Form, Value};

use super::Table;
use super::world::{Handler, World};
use crate::db::{SessId, key_text, lock_arg};

impl World {
    fn holder_of(&self, slot: usize, row: i64, key: Option<&str>) -> Option<SessId> {
        let process = self.ids[slot];
        let mine = |sess: &SessId| {
            self.db.sessions[sess].process == process && self.db.sessions[sess].alive
        };
        match (self.form(), self.config.table) {
            (Form::RowLock, _) => self.db.row_locks.get(&row).copied().filter(mine),
            (Form::Advisory, Table::Custom) => self
                .db
                .custom
                .get(key.expect("a key"))
                .copied()
                .filter(mine),
            (Form::Advisory, _) if self.config.dialect != Dialect::Sqlite => {
                let arg = lock_arg(self.config.dialect, key.expect("a key"));
                self.db.advisory.get(&arg).map(|(s, _)| *s).filter(mine)
            }
            _ => None,
        }
    }

    /// Whether a handler's row or key is still held for it.
    fn still_held(&self, slot: usize, handler: &Handler) -> bool {
        let p = &self.processes[slot];
        if p.shutdown {
            return false;
        }
        match self.form() {
            // Until its lease runs out by the database's clock, extensions included.
            Form::Lease => handler
                .lease
                .is_some_and(|until| self.lease_until(handler.row, until) > self.now.micros()),
            Form::Advisory
                if self.config.dialect == Dialect::Sqlite && self.config.table != Table::Custom =>
            {
                true
            }
            _ => handler.holder.is_some_and(|h| {
                self.holder_of(slot, handler.row, handler.key.as_deref()) == Some(h)
            }),
        }
    }

    /// The expiry of the lease written as `until` on `row`, after the extensions that moved
    /// it.
    fn lease_until(&self, row: i64, mut until: i64) -> i64 {
        while let Some(&next) = self.db.moved.get(&(row, until)) {
            until = next;
        }
        until
    }

    pub(super) fn on_event(&mut self, slot: usize, event: Event<i64>) {
        self.log
            .push(format!("  p{} event {event:?}", self.ids[slot]));
        match event {
            Event::Lent { delivery, conn } => self.on_lent(slot, delivery, conn),
            Event::Delivered(d) => self.on_delivered(slot, d),
            Event::SettleFailed { delivery, .. } => {
                // The retry did not take effect: the row may return at once.
                let process = self.ids[slot];
                self.retried_here
                    .retain(|_, (p, d, _)| !(*p == process && *d == delivery));
            }
            Event::Settled { .. } | Event::Returned { .. } => {}
            Event::Failed { id, kept, .. } => {
                let row = id.as_int().expect("an integer id");
                if kept {
                    let failed = self.db.rows.get(&row).and_then(|r| r.failed_at);
                    assert!(failed.is_some(), "row {row} reported failed but not marked");
                } else {
                    assert!(self.desc.failed_at.is_none());
                }
            }
            Event::Changed { .. }
            | Event::Maintained(_)
            | Event::Warning { .. }
            | Event::Read { .. } => {}
            Event::LeaseLost { .. } | Event::Error { .. } | Event::StartRetry { .. } => {}
            // The runtime wakes the publisher's own subscriptions once the row is written.
            Event::Published { result, .. } => {
                let now = self.local(slot);
                let p = &mut self.processes[slot];
                if result.is_ok() && !p.shutdown {
                    p.broker.wake(p.sub, now);
                }
            }
            Event::Ready { .. } => {}
            Event::CheckFailed { error, .. } => panic!("the check failed: {error}"),
            Event::Closed(counts) => self.on_closed(slot, counts),
        }
    }

    /// A lent connection is the session that holds its row; the handler writes its effect in it.
    fn on_lent(&mut self, slot: usize, delivery: DeliveryId, conn: Option<ConnId>) {
        let p = &self.processes[slot];
        if let Some(conn) = conn {
            let handler = p
                .handlers
                .get(&delivery)
                .unwrap_or_else(|| panic!("{delivery} lent but not in work"));
            let session = p.adapter.conns.get(&conn).copied();
            let Some(session) = session else {
                panic!("{delivery}: the lent connection {conn} is not held")
            };
            match self.form() {
                Form::RowLock => assert_eq!(
                    Some(session),
                    handler.holder,
                    "{delivery}: the lent connection {conn} is the session that holds its row"
                ),
                Form::Lease => assert_ne!(
                    self.config.dialect,
                    Dialect::Sqlite,
                    "SQLite's lease form lends nothing"
                ),
                Form::Advisory => {}
            }
            // The handler writes its effect in the lent transaction.
            let row = handler.row;
            self.db.write_effect(session, row);
        }
    }

    /// A delivery: of a row in the table, at its attempt, held, in work nowhere else.
    fn on_delivered(&mut self, slot: usize, d: Delivered<i64>) {
        let row = d.row.expect("the row");
        assert_eq!(d.id, Value::Int(row));
        let key = d.key.as_deref().map(str::to_owned);
        if !self.db.rows.contains_key(&row) {
            panic!("row {row} delivered but not in the table");
        }
        self.check_key_order(slot, row, key.as_deref());
        self.check_attempt(row, &d);
        let holder = self.check_held(slot, row, key.as_deref());
        self.check_not_twice(row, &key);
        let lease = (self.form() == Form::Lease)
            .then(|| self.db.rows[&row].locked_until)
            .flatten();
        let handler = Handler {
            row,
            key,
            holder,
            lease,
        };
        self.processes[slot].handlers.insert(d.delivery, handler);
        self.check_in_work(slot);
    }

    /// In the advisory form no row overtakes an earlier queued row of its key; a row retried
    /// where its delay has nowhere to be written waits it in its process.
    fn check_key_order(&self, slot: usize, row: i64, key: Option<&str>) {
        let db_row = &self.db.rows[&row];
        if self.desc.advisory().is_some() {
            assert_eq!(key, Some(key_text(db_row.channel).as_str()));
            // No row overtakes an earlier row of its key that is still queued, but one
            // that waits its retry's delay in a process (a table with nowhere to
            // write it).
            let now = self.now.micros();
            let earlier = self.db.rows.range(..row).find(|(id, r)| {
                r.channel == db_row.channel
                    && r.processed_at.is_none()
                    && r.failed_at.is_none()
                    && self.waits_until.get(id).is_none_or(|until| *until <= now)
            });
            assert!(
                earlier.is_none(),
                "row {row} of key {} delivered while the earlier row {:?} of its key is queued",
                key_text(db_row.channel),
                earlier.map(|(id, _)| id)
            );
        }
        // A row retried here on a table with nowhere to write the delay waits it here.
        if let Some((process, _, until)) = self.retried_here.get(&row) {
            assert!(
                *process != self.ids[slot] || self.now.micros() >= *until,
                "row {row} taken again by the process that retried it, {} µs before its delay ended",
                until - self.now.micros()
            );
        }
    }

    /// The attempt handed out is the row's, and grows with every take; a failed row, a row past
    /// its budget or not yet due is never handed.
    fn check_attempt(&mut self, row: i64, d: &Delivered<i64>) {
        let db_row = &self.db.rows[&row];
        let attempt = d.attempt.expect("the table counts attempts");
        assert_eq!(
            attempt, db_row.attempt,
            "row {row}: the attempt delivered is the row's"
        );
        // A failed row is never handed; nor a row past its budget, or not yet due.
        assert!(
            db_row.failed_at.is_none(),
            "row {row} delivered though it failed"
        );
        if let Some(max) = self.config.max_attempts {
            assert!(
                attempt <= i64::from(max),
                "row {row}: attempt {attempt} handed past max_attempts {max}"
            );
        }
        if self.desc.due.is_some() {
            assert!(
                db_row.due <= self.now.micros(),
                "row {row} delivered before it is due"
            );
        }
        if let Some(last) = self.attempts.get(&row) {
            assert!(attempt > *last, "row {row}: attempt {attempt} after {last}");
        }
        self.attempts.insert(row, attempt);
    }

    /// Delivered only while held: its lease, its row lock or its key. Answers the holder.
    fn check_held(&self, slot: usize, row: i64, key: Option<&str>) -> Option<SessId> {
        let db_row = &self.db.rows[&row];
        let holder = self.holder_of(slot, row, key);
        match self.form() {
            Form::Lease => {
                let until = db_row.locked_until.expect("a leased row has an expiry");
                assert!(
                    until > self.now.micros(),
                    "row {row} delivered with a lease that ran out"
                );
            }
            Form::Advisory
                if self.config.dialect == Dialect::Sqlite && self.config.table != Table::Custom => {
            }
            _ => assert!(
                holder.is_some(),
                "row {row} delivered without its {} held by the process",
                if self.form() == Form::RowLock {
                    "row lock"
                } else {
                    "key"
                }
            ),
        }
        holder
    }

    /// No other live delivery of the row, or of the key, anywhere.
    fn check_not_twice(&self, row: i64, key: &Option<String>) {
        for (other_slot, p) in self.processes.iter().enumerate() {
            for h in p.handlers.values() {
                if !self.still_held(other_slot, h) {
                    continue;
                }
                assert_ne!(h.row, row, "row {row} is in work twice");
                if self.form() == Form::Advisory {
                    assert_ne!(&h.key, key, "key {key:?} is in work twice");
                }
            }
        }
    }

    fn check_in_work(&self, slot: usize) {
        // At most `workers` in work, rows claimed ahead or not.
        let p = &self.processes[slot];
        assert!(
            p.handlers.len() <= self.config.workers,
            "{} handlers in work, beyond {} workers",
            p.handlers.len(),
            self.config.workers
        );
        // Handed and not yet ended: the workers' rows, the rows claimed ahead whose
        // handlers ended first, and in the lease form up to `workers` more rows
        // whose settlements run.
        let settling = if self.form() == Form::Lease {
            self.config.workers
        } else {
            0
        };
        let handed = p.broker.in_work(p.sub);
        let bound = self.config.workers + self.config.prefetch + settling;
        assert!(
            handed <= bound,
            "{handed} rows handed and not ended, beyond {} workers, {} ahead and {settling} settling",
            self.config.workers,
            self.config.prefetch
        );
    }

    /// The shutdown leaves nothing held, and counts no more locks than the process could hold.
    fn on_closed(&mut self, slot: usize, counts: ClosedCounts) {
        let form = self.form();
        let p = &mut self.processes[slot];
        assert!(!p.closed, "closed twice");
        p.closed = true;
        assert_eq!(p.broker.held_connections(), 0);
        let held = self.db.held_by(self.ids[slot]);
        assert!(
            held.is_empty(),
            "after shutdown the process holds: {held:?}"
        );
        if form == Form::Advisory {
            // The deliveries in work, and the rows claims cut short had taken.
            let bound = p.held_at_shutdown + self.config.workers + self.config.prefetch;
            assert!(
                counts.locks_released + counts.connections_closed <= bound,
                "{counts:?} counts more than the {bound} keys the process could hold"
            );
        } else {
            assert_eq!(counts.locks_released + counts.connections_closed, 0);
        }
    }

    /// No row left the table but by an acknowledgement, and only a rejected row, or one past
    /// its attempt budget, is marked failed.
    pub(super) fn check_no_loss(&self) {
        // A handler's effect commits with its row's acknowledgement, once: never with a
        // retry, a failure, a lost lease or a crash.
        for (row, times) in &self.db.effects {
            assert_eq!(
                *times, 1,
                "row {row}: the effect its handler wrote in the lent transaction committed {times} times"
            );
            let settled = self.db.deleted.contains(row)
                || self
                    .db
                    .rows
                    .get(row)
                    .is_some_and(|r| r.processed_at.is_some());
            assert!(
                settled,
                "row {row}: its handler's effect committed, but the row is not settled"
            );
        }
        for id in &self.db.deleted {
            assert!(
                self.acked.contains(id),
                "row {id} was deleted, but no handler acknowledged it"
            );
        }
        if let Some(max) = self.config.max_attempts {
            // A take past the budget marks the row failed; only an interruption lets another
            // take count past it. A count of another process never counts a row again between
            // a count and its lock: the count's marks keep it off.
            let spent = self.interruptions;
            let bound = i64::from(max) + 1 + i64::try_from(spent).unwrap_or(i64::MAX);
            for (id, row) in &self.db.rows {
                assert!(
                    row.attempt <= bound,
                    "row {id}: attempt {} past max_attempts {max} + 1 + {} interruptions",
                    row.attempt,
                    self.interruptions,
                );
            }
        }
        for (id, row) in &self.db.rows {
            if row.failed_at.is_some() {
                let past = self
                    .config
                    .max_attempts
                    .is_some_and(|max| row.attempt > i64::from(max));
                assert!(
                    self.rejected.contains(id) || past,
                    "row {id} failed at attempt {}, neither rejected nor past its budget",
                    row.attempt
                );
            }
        }
    }

    /// Liveness, where the database holds the keys: with nothing left to run at this time, no
    /// process has a free worker while a due row's key is free (held by no session), unless
    /// the process has not looked at the key (in a look that did not pass over it) nor tried
    /// its lock since another session released that key, or since another process inserted
    /// the row: nothing told it, and it looks again at its poll.
    pub(super) fn check_liveness(&self) {
        if self.desc.advisory().is_none()
            || self.config.dialect == Dialect::Sqlite
            || self.config.table == Table::Custom
        {
            return;
        }
        let mut firsts: BTreeMap<String, i64> = BTreeMap::new();
        for (&id, row) in &self.db.rows {
            if row.processed_at.is_none() && row.failed_at.is_none() {
                firsts.entry(key_text(row.channel)).or_insert(id);
            }
        }
        for (slot, p) in self.processes.iter().enumerate() {
            if p.shutdown || p.closed || p.handlers.len() >= self.config.workers {
                continue;
            }
            let process = self.ids[slot];
            for (key, &row) in &firsts {
                let arg = lock_arg(self.config.dialect, key);
                // The last look that did not pass over the key, or the last try of its lock: a
                // look passes over a key that a lock of this process tried or is trying, a
                // try that may have run just before the key's release.
                let looked = self.looked[slot]
                    .iter()
                    .rev()
                    .find(|(_, passed)| !passed.contains(key))
                    .map_or(0, |(at, _)| *at)
                    .max(self.tried[slot].get(&arg).copied().unwrap_or(0));
                if self.db.advisory.contains_key(&arg) {
                    continue;
                }
                let released_since = self
                    .released
                    .get(&arg)
                    .is_some_and(|&(at, by)| at > looked && by != process);
                let inserted_since = self
                    .inserted
                    .get(&row)
                    .is_some_and(|&(at, by)| at > looked && by != Some(process));
                assert!(
                    released_since || inserted_since,
                    "process p{process} has {} of {} workers busy and no claim in flight, while row {row} of the free key {key} waits for the poll",
                    p.handlers.len(),
                    self.config.workers
                );
            }
        }
    }
}

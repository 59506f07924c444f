//! The property tests' world: processes, each a `Broker` with its adapter, on one in-memory
//! database, with the handlers each holds and what the invariants need to remember.

use std::collections::BTreeMap;

use ruststream_core::{
    Action, Broker, Command, CommandId, DeliveryId, Dialect, Form, Outcome, PublisherId, Reply,
    SubId, TableDesc, Time, Value,
};

use super::{Config, Step, short};
use crate::db::{Db, SessId, key_text, lock_arg};
use crate::sim::{Adapter, LEASE_TIME, T0, options, start_broker};

#[derive(Debug)]
pub(super) struct Handler {
    pub(super) row: i64,
    pub(super) key: Option<String>,
    /// The session that held the row or the key when the message was delivered.
    pub(super) holder: Option<SessId>,
    /// The lease form: the expiry the row held when the message was delivered, by the
    /// database's clock.
    pub(super) lease: Option<i64>,
}

pub(super) struct Process {
    pub(super) broker: Broker<i64>,
    pub(super) sub: SubId,
    pub(super) publisher: PublisherId,
    /// Commands polled and not yet run.
    pub(super) waiting: Vec<Command>,
    /// Replies computed and not yet handed to the broker.
    pub(super) replies: Vec<(CommandId, Reply<i64>)>,
    /// Commands that run SQL, polled and not yet answered.
    pub(super) sql_outstanding: std::collections::BTreeSet<CommandId>,
    /// Its connections, as its adapter holds them.
    pub(super) adapter: Adapter,
    pub(super) handlers: BTreeMap<DeliveryId, Handler>,
    /// Advisory deliveries in work when the shutdown began.
    pub(super) held_at_shutdown: usize,
    pub(super) shutdown: bool,
    pub(super) closed: bool,
}

pub(super) struct World {
    pub(super) config: Config,
    pub(super) desc: TableDesc,
    pub(super) db: Db,
    pub(super) now: Time,
    pub(super) processes: Vec<Process>,
    /// The process number of each slot, which changes when it restarts.
    pub(super) ids: Vec<usize>,
    pub(super) next_id: usize,
    /// The last attempt delivered per row.
    pub(super) attempts: BTreeMap<i64, i64>,
    pub(super) settled: BTreeMap<i64, u32>,
    /// Rows a handler acknowledged: the only rows that may leave the table.
    pub(super) acked: std::collections::BTreeSet<i64>,
    /// Rows a handler rejected: with the attempt budget, the only rows that may fail.
    pub(super) rejected: std::collections::BTreeSet<i64>,
    /// Steps that may cut a take or a settlement short: failed statements, crashes,
    /// shutdowns, drops, and in the lease form time passing (a lease that lapses).
    pub(super) interruptions: u64,
    pub(super) log: Vec<String>,
    /// Counts every command run and every change outside the brokers: the order of looks,
    /// releases and inserts.
    pub(super) tick: u64,
    /// By slot: when the process ran its advisory claims' candidates, each with the keys the
    /// look passed over, and by lock argument when it last tried a key's lock.
    pub(super) looked: Vec<Vec<(u64, Vec<String>)>>,
    pub(super) tried: Vec<BTreeMap<Value, u64>>,
    /// By lock argument: when a session last released the key, and the process it belonged to.
    pub(super) released: BTreeMap<Value, (u64, usize)>,
    /// By row: when it was inserted, and by which process (`None`: another program).
    pub(super) inserted: BTreeMap<i64, (u64, Option<usize>)>,
    /// The other system's session that holds keys.
    pub(super) foreign: Option<SessId>,
    /// By row: until when (the database's clock) a retry's delay may keep it in a process,
    /// on a table with nowhere to write it.
    pub(super) waits_until: BTreeMap<i64, i64>,
    /// By row: the process that retried it on such a table, the delivery, and until when
    /// (the database's clock) that process may not take it again.
    pub(super) retried_here: BTreeMap<i64, (usize, DeliveryId, i64)>,
}

/// The process number of the other system whose session holds keys.
pub(super) const FOREIGN: usize = 1_000;

/// A process with the subscription of `desc` and a publisher, started at `now`.
pub(super) fn start(desc: TableDesc, config: Config, now: Time) -> Process {
    let options = options(config.workers, config.prefetch, config.max_attempts);
    let (broker, sub, publisher) =
        start_broker((config.dialect, desc), options, (config.linger, false), now);
    Process {
        broker,
        sub,
        publisher,
        waiting: Vec::new(),
        replies: Vec::new(),
        sql_outstanding: Default::default(),
        adapter: Adapter::default(),
        handlers: BTreeMap::new(),
        held_at_shutdown: 0,
        shutdown: false,
        closed: false,
    }
}

impl World {
    pub(super) fn new(config: Config) -> Self {
        let desc = config.table.desc();
        let now = T0;
        let mut world = World {
            config,
            desc,
            db: Db::default(),
            now,
            processes: Vec::new(),
            ids: Vec::new(),
            next_id: 0,
            attempts: BTreeMap::new(),
            settled: BTreeMap::new(),
            acked: Default::default(),
            rejected: Default::default(),
            interruptions: 0,
            log: Vec::new(),
            tick: 0,
            looked: Vec::new(),
            tried: Vec::new(),
            released: BTreeMap::new(),
            inserted: BTreeMap::new(),
            foreign: None,
            waits_until: BTreeMap::new(),
            retried_here: BTreeMap::new(),
        };
        for _ in 0..config.processes {
            world.processes.push(start(desc, config, now));
            world.ids.push(world.next_id);
            world.looked.push(Vec::new());
            world.tried.push(BTreeMap::new());
            world.next_id += 1;
        }
        for slot in 0..world.processes.len() {
            world.pump(slot);
        }
        for channel in 0..6 {
            world.db.insert(channel % 3, now.micros());
        }
        world
    }

    pub(super) fn form(&self) -> Form {
        self.desc.form()
    }

    /// Drains a process's broker: commands wait to run, events are handled.
    pub(super) fn pump(&mut self, slot: usize) {
        loop {
            let p = &mut self.processes[slot];
            let mut progressed = false;
            while let Some(command) = p.broker.poll_command() {
                if matches!(
                    command.action,
                    Action::Execute { .. } | Action::Lock { .. } | Action::Unlock { .. }
                ) {
                    p.sql_outstanding.insert(command.id);
                }
                p.waiting.push(command);
                progressed = true;
            }
            // SQLite gets one statement at a time: none waits on another for the write lock.
            if self.config.dialect == Dialect::Sqlite {
                let p = &self.processes[slot];
                assert!(
                    p.sql_outstanding.len() <= 1,
                    "SQLite: {} statements handed out at once",
                    p.sql_outstanding.len()
                );
            }
            while let Some(event) = self.processes[slot].broker.poll_event() {
                self.on_event(slot, event);
                progressed = true;
            }
            if !progressed {
                break;
            }
        }
    }

    pub(super) fn run_command(&mut self, slot: usize, index: usize, fail: Option<bool>) {
        let p = &mut self.processes[slot];
        if p.waiting.is_empty() {
            return;
        }
        let command = p.waiting.remove(index % p.waiting.len());
        let process = self.ids[slot];
        self.tick += 1;
        self.note_look(slot, &command);
        let locks = self.db.advisory.clone();
        let rows = self.db.next_id;
        self.log.push(format!(
            "  p{process} runs {:?} on {}{}",
            short(&command.action),
            command.conn,
            match fail {
                Some(true) => " (connection lost)",
                Some(false) => " (fails)",
                None => "",
            }
        ));
        // Closed while this command waited: the adapter cuts it short, and nothing changed.
        let closed = self.processes[slot].adapter.closed.contains(&command.conn);
        let table = (self.config.dialect, &self.desc);
        let reply = self.processes[slot].adapter.run(
            &mut self.db,
            process,
            table,
            self.now,
            &command,
            fail,
        );
        if !closed {
            self.note_changes(locks, rows, Some(process));
        }
        self.processes[slot].replies.push((command.id, reply));
    }

    /// Notes when the process looked at candidates (with the keys the look passed over) and
    /// when it tried a key's lock: what the liveness invariant reads.
    pub(super) fn note_look(&mut self, slot: usize, command: &Command) {
        if let Action::Execute { statement, binds } = &command.action
            && statement.kind == ruststream_core::StatementKind::Candidates
        {
            let passed = statement
                .args
                .iter()
                .zip(binds)
                .filter(|(a, _)| matches!(a, ruststream_core::dialect::Arg::ExcludedKey(_)))
                .filter_map(|(_, v)| match v {
                    Value::Text(k) => Some(k.clone()),
                    _ => None,
                })
                .collect();
            self.looked[slot].push((self.tick, passed));
        }
        if let Action::Execute { statement, binds } = &command.action
            && statement.kind == ruststream_core::StatementKind::TryLock
            && let Some(arg) = binds.first()
        {
            self.tried[slot].insert(arg.clone(), self.tick);
        }
    }

    /// The time by the clock of the process in `slot`.
    pub(super) fn local(&self, slot: usize) -> Time {
        Time(self.now.0 + self.config.skew[slot % self.config.skew.len()])
    }

    pub(super) fn deliver_reply(&mut self, slot: usize, index: usize) {
        let now = self.local(slot);
        let p = &mut self.processes[slot];
        if p.replies.is_empty() {
            return;
        }
        let (id, reply) = p.replies.remove(index % p.replies.len());
        p.sql_outstanding.remove(&id);
        p.broker.handle_reply(id, reply, now);
        self.pump(slot);
    }

    /// Applies a step, then checks that nothing was lost.
    pub(super) fn apply(&mut self, step: &Step) {
        self.apply_step(step);
        self.check_no_loss();
    }

    /// reads: the keys released since `locks`, the rows inserted since `rows`.
    pub(super) fn note_changes(
        &mut self,
        locks: BTreeMap<Value, (SessId, u32)>,
        rows: i64,
        by: Option<usize>,
    ) {
        for (arg, (holder, _)) in locks {
            if !self.db.advisory.contains_key(&arg) {
                let process = self.db.sessions[&holder].process;
                self.released.insert(arg, (self.tick, process));
            }
        }
        for id in rows + 1..=self.db.next_id {
            self.inserted.insert(id, (self.tick, by));
        }
    }

    /// Another system's session takes the key of `channel`, or releases what it holds.
    pub(super) fn foreign(&mut self, channel: i64, hold: bool) {
        if self.desc.advisory().is_none() || self.config.dialect == Dialect::Sqlite {
            return;
        }
        let sess = match self.foreign {
            Some(sess) => sess,
            None => {
                let sess = self.db.acquire(FOREIGN);
                self.foreign = Some(sess);
                sess
            }
        };
        let arg = lock_arg(self.config.dialect, &key_text(channel));
        let locks = self.db.advisory.clone();
        self.tick += 1;
        if hold {
            self.db.advisory.entry(arg).or_insert((sess, 1));
        } else if self
            .db
            .advisory
            .get(&arg)
            .is_some_and(|(holder, _)| *holder == sess)
        {
            self.db.advisory.remove(&arg);
        }
        self.note_changes(locks, self.db.next_id, None);
    }

    /// Every process runs its commands and takes its replies, and handles the timeouts due by
    /// now, until none has anything left to do at this time.
    pub(super) fn quiesce(&mut self) {
        for _ in 0..10_000 {
            let mut progressed = false;
            for slot in 0..self.processes.len() {
                if !self.processes[slot].waiting.is_empty() {
                    self.run_command(slot, 0, None);
                    progressed = true;
                }
                if !self.processes[slot].replies.is_empty() {
                    self.deliver_reply(slot, 0);
                    progressed = true;
                }
                let now = self.local(slot);
                let p = &mut self.processes[slot];
                if !p.closed && p.broker.poll_timeout().is_some_and(|t| t <= now) {
                    p.broker.handle_timeout(now);
                    self.pump(slot);
                    progressed = true;
                }
            }
            if !progressed {
                return;
            }
        }
        panic!("the processes never came to rest at {:?}", self.now);
    }

    /// Every process shuts down; commands run and replies arrive until all are closed.
    pub(super) fn finish(&mut self) {
        self.interruptions += self.processes.len() as u64;
        // The other system's session ends: its keys are free for the drain.
        if let Some(sess) = self.foreign.take() {
            self.db.kill(sess);
        }
        for slot in 0..self.processes.len() {
            let now = self.local(slot);
            let p = &mut self.processes[slot];
            // Handlers still running when the service stops are abandoned.
            if !p.shutdown {
                p.shutdown = true;
                p.held_at_shutdown = p.handlers.len();
                p.broker.shutdown(now);
                self.pump(slot);
            }
        }
        for _ in 0..10_000 {
            let mut progressed = false;
            for slot in 0..self.processes.len() {
                if !self.processes[slot].waiting.is_empty() {
                    self.run_command(slot, 0, None);
                    progressed = true;
                }
                if !self.processes[slot].replies.is_empty() {
                    self.deliver_reply(slot, 0);
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
        for (slot, p) in self.processes.iter().enumerate() {
            assert!(
                p.closed,
                "process slot {slot} did not close: {} waiting, {} replies",
                p.waiting.len(),
                p.replies.len()
            );
        }
    }

    /// A new process with no failures drains every row left: nothing was lost.
    pub(super) fn drain(&mut self) {
        self.now = self.now.plus(LEASE_TIME * 2);
        let slot = self.processes.len();
        let now = self.local(slot);
        self.processes.push(start(self.desc, self.config, now));
        self.ids.push(self.next_id);
        self.looked.push(Vec::new());
        self.tried.push(BTreeMap::new());
        self.next_id += 1;
        self.pump(slot);
        for _ in 0..200_000 {
            self.check_no_loss();
            let p = &mut self.processes[slot];
            if let Some(&id) = p.handlers.keys().next() {
                let now = Time(self.now.0 + self.config.skew[slot % 4]);
                let h = p.handlers.remove(&id).expect("a handler");
                *self.settled.entry(h.row).or_default() += 1;
                self.acked.insert(h.row);
                p.broker.settle(id, Outcome::Ack, now);
                self.pump(slot);
                continue;
            }
            if !self.processes[slot].waiting.is_empty() {
                self.run_command(slot, 0, None);
                continue;
            }
            if !self.processes[slot].replies.is_empty() {
                self.deliver_reply(slot, 0);
                continue;
            }
            let left = self
                .db
                .rows
                .values()
                .filter(|r| r.processed_at.is_none() && r.failed_at.is_none())
                .count();
            if left == 0 {
                self.check_no_loss();
                return;
            }
            let skew = self.local(slot).0 - self.now.0;
            let p = &mut self.processes[slot];
            let next = p
                .broker
                .poll_timeout()
                .expect("a subscription with rows left polls");
            self.now = self.now.max(Time(next.0 - skew));
            p.broker.handle_timeout(Time(self.now.0 + skew));
            self.pump(slot);
        }
        panic!("rows never drained: {:?}", self.db.rows);
    }
}

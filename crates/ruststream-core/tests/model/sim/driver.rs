//! The scenarios' driver: a [`Sim`] runs every polled command of its processes in order and
//! hands its reply back until all is quiet, and records every command and event it saw.
//! A hook can hold a command back, or answer it in the database's place.

use std::collections::VecDeque;
use std::time::Duration;

use ruststream_core::{
    Action, Arg, Broker, BrokerError, Command, ConnId, DeliveryId, Dialect, Event, Outcome,
    Publish, PublishId, PublisherId, Reply, Statement, StatementKind, SubId, SubscribeOptions,
    TableDesc, Time, Value,
};

use super::{Adapter, T0, message, options, start_broker};
use crate::db::Db;

/// What a command did, as a test names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    Release,
    Close,
    Exec(StatementKind),
    Lock(String),
    Unlock(String),
}

pub(crate) use Op::{Acquire, Close, Exec, Release};

pub(crate) fn op_of(action: &Action) -> (Op, Option<Statement>, Vec<Value>) {
    match action {
        Action::Acquire => (Acquire, None, Vec::new()),
        Action::Release => (Release, None, Vec::new()),
        Action::Close => (Close, None, Vec::new()),
        Action::Execute { statement, binds } => {
            (Exec(statement.kind), Some(statement.clone()), binds.clone())
        }
        Action::Lock { key, .. } => (Op::Lock(key.to_string()), None, Vec::new()),
        Action::Unlock { key, .. } => (Op::Unlock(key.to_string()), None, Vec::new()),
    }
}

/// Whether `command` locks a counted row: with or without the release of its count's mark.
pub(crate) fn locks_by_id(command: &Command) -> bool {
    matches!(
        kind_of(command),
        Some(StatementKind::LockRowById | StatementKind::LockRowByIdUnmarking)
    )
}

pub(crate) fn kind_of(command: &Command) -> Option<StatementKind> {
    match &command.action {
        Action::Execute { statement, .. } => Some(statement.kind),
        _ => None,
    }
}

/// A command that ran (or that the hook answered), with its reply.
#[derive(Clone, Debug)]
pub(crate) struct Ran {
    pub(crate) proc: usize,
    pub(crate) conn: ConnId,
    pub(crate) op: Op,
    pub(crate) statement: Option<Statement>,
    pub(crate) binds: Vec<Value>,
    pub(crate) reply: Reply<i64>,
    pub(crate) at: Time,
}

impl Ran {
    /// The value bound for `arg`.
    pub(crate) fn bind(&self, arg: Arg) -> Value {
        let statement = self.statement.as_ref().expect("a statement");
        let i = statement
            .args
            .iter()
            .position(|a| *a == arg)
            .unwrap_or_else(|| panic!("{:?} binds no {arg:?}", statement.kind));
        self.binds[i].clone()
    }

    /// The driver rows of its reply.
    pub(crate) fn raw_rows(&self) -> Vec<i64> {
        match &self.reply {
            Reply::Rows(rows) => rows.iter().filter_map(|r| r.raw).collect(),
            _ => Vec::new(),
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) enum Entry {
    Ran(Ran),
    Event {
        proc: usize,
        event: Event<i64>,
        /// The connections the broker held when the event was polled.
        held: usize,
        at: Time,
    },
}

/// What the hook does with a command.
pub(crate) enum Intercept {
    /// Run it on the database.
    Run,
    /// Keep it: it never answers until the test runs it.
    Hold,
    /// Answer it in the database's place.
    Answer(Reply<i64>),
}

pub(crate) type Hook = Box<dyn FnMut(usize, &Command) -> Intercept>;

pub(crate) struct Proc {
    pub(crate) broker: Broker<i64>,
    /// The database's process number of its sessions.
    pub(crate) process: usize,
    pub(crate) sub: SubId,
    pub(crate) publisher: PublisherId,
    pub(crate) queue: VecDeque<Command>,
    pub(crate) held: Vec<Command>,
    pub(crate) adapter: Adapter,
    pub(crate) alive: bool,
    /// Its timers do not fire (a stalled process).
    pub(crate) paused: bool,
    /// How far its clock runs ahead of the database's (behind where negative), in
    /// microseconds.
    pub(crate) skew: i64,
}

pub(crate) struct Sim {
    pub(crate) dialect: Dialect,
    pub(crate) desc: TableDesc,
    pub(crate) workers: usize,
    pub(crate) db: Db,
    pub(crate) now: Time,
    pub(crate) procs: Vec<Proc>,
    pub(crate) journal: Vec<Entry>,
    pub(crate) hook: Option<Hook>,
    /// The brokers' connection linger: none, so that each flow's commands show on a
    /// connection of its own, unless a scenario sets it.
    pub(crate) linger: Duration,
    /// Rows claimed ahead: none unless a scenario sets it.
    pub(crate) prefetch: usize,
    /// The attempt budget of the subscriptions it spawns.
    pub(crate) max_attempts: Option<u32>,
    /// The row type's fields that the check compares with the table's time columns.
    pub(crate) row_fields: &'static [ruststream_core::RowField],
    /// The start creates what the schema lacks.
    pub(crate) ensure_schema: bool,
    /// What the start does about a missing claim index.
    pub(crate) missing_index: ruststream_core::MissingIndex,
    /// The adapter's prepared statements live in the server session
    /// (`Broker::set_prepared_statements`).
    pub(crate) prepared_statements: bool,
}

impl Sim {
    pub(crate) fn new(dialect: Dialect, desc: TableDesc, workers: usize) -> Self {
        Sim {
            dialect,
            desc,
            workers,
            db: Db::default(),
            now: T0,
            procs: Vec::new(),
            journal: Vec::new(),
            hook: None,
            linger: Duration::ZERO,
            prefetch: 0,
            max_attempts: None,
            row_fields: &[],
            ensure_schema: false,
            missing_index: ruststream_core::MissingIndex::Warn,
            prepared_statements: false,
        }
    }

    /// A database with rows of these channels, and one process whose subscription passed its
    /// check and ran its first claims.
    pub(crate) fn start(
        dialect: Dialect,
        desc: TableDesc,
        workers: usize,
        channels: &[i64],
    ) -> Self {
        let mut sim = Sim::new(dialect, desc, workers);
        for &channel in channels {
            sim.insert(channel);
        }
        let p = sim.spawn();
        sim.run();
        let sub = sim.procs[p].sub;
        assert!(
            sim.events(p, 0).contains(&Event::Ready { sub }),
            "{dialect:?}: the subscription is ready: {:?}",
            sim.events(p, 0)
        );
        sim
    }

    pub(crate) fn options(&self) -> SubscribeOptions {
        SubscribeOptions {
            row_fields: self.row_fields,
            ensure_schema: self.ensure_schema,
            missing_claim_index: self.missing_index,
            ..options(self.workers, self.prefetch, self.max_attempts)
        }
    }

    pub(crate) fn insert(&mut self, channel: i64) -> i64 {
        self.db.insert(channel, self.now.micros())
    }

    /// A new process with the subscription and a publisher; its check's commands wait.
    pub(crate) fn spawn(&mut self) -> usize {
        self.spawn_skewed(Duration::ZERO, true)
    }

    /// [`Sim::spawn`] of a process whose clock runs `skew` ahead of the database's (`ahead`)
    /// or behind it.
    pub(crate) fn spawn_skewed(&mut self, skew: Duration, ahead: bool) -> usize {
        let skew = i64::try_from(skew.as_micros()).expect("fits") * if ahead { 1 } else { -1 };
        let (broker, sub, publisher) = start_broker(
            (self.dialect, self.desc),
            self.options(),
            (self.linger, self.prepared_statements),
            Time(self.now.0 + skew),
        );
        self.procs.push(Proc {
            broker,
            process: self.procs.len() + 1,
            sub,
            publisher,
            queue: VecDeque::new(),
            held: Vec::new(),
            adapter: Adapter::default(),
            alive: true,
            paused: false,
            skew,
        });
        let p = self.procs.len() - 1;
        self.poll(p);
        p
    }

    pub(crate) fn hook(&mut self, hook: impl FnMut(usize, &Command) -> Intercept + 'static) {
        self.hook = Some(Box::new(hook));
    }

    /// Drains a broker's commands into its queue and its events into the journal.
    pub(crate) fn poll(&mut self, p: usize) {
        let now = self.now;
        let proc = &mut self.procs[p];
        while let Some(command) = proc.broker.poll_command() {
            proc.queue.push_back(command);
        }
        while let Some(event) = proc.broker.poll_event() {
            let held = proc.broker.held_connections();
            self.journal.push(Entry::Event {
                proc: p,
                event,
                held,
                at: now,
            });
        }
    }

    /// Runs every command of every live process, in order, until all is quiet.
    pub(crate) fn run(&mut self) {
        for _ in 0..100_000 {
            let mut progressed = false;
            for p in 0..self.procs.len() {
                if self.procs[p].alive && self.step(p) {
                    progressed = true;
                }
            }
            if !progressed {
                return;
            }
        }
        panic!("the simulation never went quiet");
    }

    /// Runs the next command of a process, through the hook.
    pub(crate) fn step(&mut self, p: usize) -> bool {
        let Some(command) = self.procs[p].queue.pop_front() else {
            return false;
        };
        let decision = match self.hook.as_mut() {
            Some(hook) => hook(p, &command),
            None => Intercept::Run,
        };
        match decision {
            Intercept::Run => self.run_command(p, command),
            Intercept::Hold => self.procs[p].held.push(command),
            Intercept::Answer(reply) => self.answer(p, command, reply),
        }
        true
    }

    /// Runs a process's commands until the next one matches, and leaves that one unrun.
    pub(crate) fn run_until(&mut self, p: usize, matches: impl Fn(&Command) -> bool) -> Command {
        loop {
            let front = self.procs[p]
                .queue
                .front()
                .cloned()
                .expect("the awaited command never came");
            if matches(&front) {
                return front;
            }
            self.step(p);
        }
    }

    /// The commands the hook held, taken back to run or answer by hand.
    pub(crate) fn take_held(&mut self, p: usize) -> Vec<Command> {
        std::mem::take(&mut self.procs[p].held)
    }

    pub(crate) fn run_command(&mut self, p: usize, command: Command) {
        let reply = self.exec(p, &command);
        self.answer(p, command, reply);
    }

    pub(crate) fn answer(&mut self, p: usize, command: Command, reply: Reply<i64>) {
        let (op, statement, binds) = op_of(&command.action);
        self.journal.push(Entry::Ran(Ran {
            proc: p,
            conn: command.conn,
            op,
            statement,
            binds,
            reply: reply.clone(),
            at: self.now,
        }));
        let now = self.local(p);
        self.procs[p].broker.handle_reply(command.id, reply, now);
        self.poll(p);
    }

    /// The time by `p`'s clock.
    pub(crate) fn local(&self, p: usize) -> Time {
        Time(self.now.0 + self.procs[p].skew)
    }

    /// Runs a command on the database, as an adapter would.
    pub(crate) fn exec(&mut self, p: usize, command: &Command) -> Reply<i64> {
        let table = (self.dialect, &self.desc);
        let proc = &mut self.procs[p];
        let process = proc.process;
        proc.adapter
            .run(&mut self.db, process, table, self.now, command, None)
    }

    /// Moves the clock to `target`, firing every timer due on the way, each at its time.
    pub(crate) fn advance_to(&mut self, target: Time) {
        for _ in 0..100_000 {
            // Each process's timers are by its own clock: the database's time they fall at.
            let next = self
                .procs
                .iter()
                .filter(|p| p.alive && !p.paused)
                .filter_map(|p| p.broker.poll_timeout().map(|t| Time(t.0 - p.skew)))
                .min();
            match next {
                Some(t) if t <= target => {
                    self.now = self.now.max(t);
                    for p in 0..self.procs.len() {
                        let now = self.local(p);
                        let proc = &self.procs[p];
                        let due = proc.alive
                            && !proc.paused
                            && proc.broker.poll_timeout().is_some_and(|t| t <= now);
                        if due {
                            self.procs[p].broker.handle_timeout(now);
                            self.poll(p);
                        }
                    }
                    self.run();
                }
                _ => {
                    self.now = self.now.max(target);
                    return;
                }
            }
        }
        panic!("the timers never went quiet");
    }

    pub(crate) fn advance(&mut self, d: Duration) {
        self.advance_to(self.now.plus(d));
    }

    /// Fires a process's timers now, whatever `poll_timeout` says, and runs.
    pub(crate) fn fire(&mut self, p: usize) {
        let now = self.local(p);
        self.procs[p].broker.handle_timeout(now);
        self.poll(p);
        self.run();
    }

    pub(crate) fn timeout(&self, p: usize) -> Option<Time> {
        self.procs[p].broker.poll_timeout()
    }

    // ----- inputs: each polls, none runs -----

    pub(crate) fn settle(&mut self, p: usize, delivery: DeliveryId, outcome: Outcome) {
        let now = self.local(p);
        self.procs[p].broker.settle(delivery, outcome, now);
        self.poll(p);
    }

    pub(crate) fn drop_delivery(&mut self, p: usize, delivery: DeliveryId) {
        let now = self.local(p);
        self.procs[p].broker.drop_delivery(delivery, now);
        self.poll(p);
    }

    pub(crate) fn shutdown(&mut self, p: usize) {
        let now = self.local(p);
        self.procs[p].broker.shutdown(now);
        self.poll(p);
    }

    pub(crate) fn wake(&mut self, p: usize) {
        let (sub, now) = (self.procs[p].sub, self.local(p));
        self.procs[p].broker.wake(sub, now);
        self.poll(p);
    }

    /// A row to publish of `channel`: the key's column where the description's key reads it.
    pub(crate) fn message(&self, channel: i64) -> Publish {
        message(&self.desc, channel)
    }

    pub(crate) fn publish(&mut self, p: usize, channel: i64) -> Result<PublishId, BrokerError> {
        let publisher = self.procs[p].publisher;
        let row = self.message(channel);
        let now = self.local(p);
        let result = self.procs[p].broker.publish(publisher, row, now);
        self.poll(p);
        result
    }

    /// The process dies: the database ends its sessions, and it runs nothing more.
    pub(crate) fn crash(&mut self, p: usize) {
        self.db.kill_process(self.procs[p].process);
        self.procs[p].alive = false;
    }
}

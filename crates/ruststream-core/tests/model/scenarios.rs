//! Deterministic scenarios of the broker: one named test per rule of the forms, the keys,
//! custom locks and shutdown (the guide's forms.md, keys.md and shutdown.md) that the core
//! decides.
//!
//! A [`Sim`] drives one or more brokers (processes) against the in-memory [`Db`]: it runs every
//! polled command in order and hands its reply back until all is quiet, advances a clock to
//! `poll_timeout()`, and records every command it ran (connection, action, statement, binds,
//! reply) and every event it saw, so a test asserts exactly which statements ran, on which
//! connection, in which order. A hook can hold a command back (it never answers until the test
//! says so) or answer it in the database's place.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use ruststream_core::dialect::{FormStatements, KeyLocks, RowLockClaim};
use ruststream_core::spec::own;
use ruststream_core::{
    Action, Arg, Broker, BrokerError, CONNECTION_LINGER, CheckError, ClosedCounts, Column, Command,
    ConnId, DROP_GRACE, DbError, Delivered, DeliveryId, DescError, Dialect, ErrorKind, Event, Form,
    InboxSpec, KeyPart, NOTIFY_EVERY, Outcome, PING_AHEAD_AFTER, Publish, PublishId, Published,
    PublisherId, Reply, Row, SettleError, Statement, StatementKind, SubId, SubscribeOptions,
    TableDesc, Time, Value,
};
use sha2::{Digest, Sha256};

use crate::db::{Db, DbRow, NULL_CHANNEL, SessId, lock_arg};

mod clock;
mod failures;
mod gather;
mod lend;
mod schema;
mod session;

const T0: Time = Time(1_700_000_000_000_000);
const POLL: Duration = Duration::from_secs(1);
const LEASE_TIME: Duration = Duration::from_secs(30);
const EXTEND: Duration = Duration::from_secs(10);

/// Every dialect.
const ALL: [Dialect; 4] = [
    Dialect::Postgres,
    Dialect::MySql,
    Dialect::MariaDb,
    Dialect::Sqlite,
];
/// The dialects with row locks and with advisory locks a session holds.
const SERVERS: [Dialect; 3] = [Dialect::Postgres, Dialect::MySql, Dialect::MariaDb];

/// A process of another system, which holds locks the broker must pass over.
const OTHER_SYSTEM: usize = 99;

const KEY: &[KeyPart] = &[KeyPart::Literal("jobs-"), KeyPart::Column("channel")];
/// `test.` + this + one digit is 64 characters: MySQL's longest lock name.
const KEY_64: &[KeyPart] = &[
    KeyPart::Literal("video_transcoding_jobs_of_the_channel_whose_key_is_long_x-"),
    KeyPart::Column("channel"),
];
/// `test.` + this + one digit is 65 characters: one past MySQL's longest lock name.
const KEY_65: &[KeyPart] = &[
    KeyPart::Literal("video_transcoding_jobs_of_the_channel_whose_key_is_long_xy-"),
    KeyPart::Column("channel"),
];

fn row_lock() -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .due(Column::new("due_at"))
        .desc()
}

/// The row lock form without an attempt column: its claims count nothing, and take no mark.
fn row_lock_plain() -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .due(Column::new("due_at"))
        .desc()
}

fn row_lock_marked() -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .processed_at(Column::new("processed_at"))
        .desc()
}

fn lease() -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .due(Column::new("due_at"))
        .lease(Column::new("locked_until"))
        .desc()
}

fn lease_marked() -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"))
        .processed_at(Column::new("processed_at"))
        .desc()
}

fn advisory_keyed(key: &'static [KeyPart]) -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .advisory(key)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .desc()
}

fn advisory() -> TableDesc {
    advisory_keyed(KEY)
}

fn custom() -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .advisory(KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .own::<own::Lock>()
        .own::<own::Unlock>()
        .desc()
}

// ----- the driver -----

/// What a command did, as a test names it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Acquire,
    Release,
    Close,
    Exec(StatementKind),
    Lock(String),
    Unlock(String),
}

use Op::{Acquire, Close, Exec, Release};

fn op_of(action: &Action) -> (Op, Option<Statement>, Vec<Value>) {
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
fn locks_by_id(command: &Command) -> bool {
    matches!(
        kind_of(command),
        Some(StatementKind::LockRowById | StatementKind::LockRowByIdUnmarking)
    )
}

fn kind_of(command: &Command) -> Option<StatementKind> {
    match &command.action {
        Action::Execute { statement, .. } => Some(statement.kind),
        _ => None,
    }
}

/// A command that ran (or that the hook answered), with its reply.
#[derive(Clone, Debug)]
struct Ran {
    proc: usize,
    conn: ConnId,
    op: Op,
    statement: Option<Statement>,
    binds: Vec<Value>,
    reply: Reply<i64>,
    at: Time,
}

impl Ran {
    /// The value bound for `arg`.
    fn bind(&self, arg: Arg) -> Value {
        let statement = self.statement.as_ref().expect("a statement");
        let i = statement
            .args
            .iter()
            .position(|a| *a == arg)
            .unwrap_or_else(|| panic!("{:?} binds no {arg:?}", statement.kind));
        self.binds[i].clone()
    }

    /// The driver rows of its reply.
    fn raw_rows(&self) -> Vec<i64> {
        match &self.reply {
            Reply::Rows(rows) => rows.iter().filter_map(|r| r.raw).collect(),
            _ => Vec::new(),
        }
    }
}

#[derive(Clone, Debug)]
enum Entry {
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
enum Intercept {
    /// Run it on the database.
    Run,
    /// Keep it: it never answers until the test runs it.
    Hold,
    /// Answer it in the database's place.
    Answer(Reply<i64>),
}

type Hook = Box<dyn FnMut(usize, &Command) -> Intercept>;

struct Proc {
    broker: Broker<i64>,
    /// The database's process number of its sessions.
    process: usize,
    sub: SubId,
    publisher: PublisherId,
    queue: VecDeque<Command>,
    held: Vec<Command>,
    conns: BTreeMap<ConnId, SessId>,
    closed: BTreeSet<ConnId>,
    alive: bool,
    /// Its timers do not fire (a stalled process).
    paused: bool,
    /// How far its clock runs ahead of the database's (behind where negative), in
    /// microseconds.
    skew: i64,
}

struct Sim {
    dialect: Dialect,
    desc: TableDesc,
    workers: usize,
    db: Db,
    now: Time,
    procs: Vec<Proc>,
    journal: Vec<Entry>,
    hook: Option<Hook>,
    /// The brokers' connection linger: none, so that each flow's commands show on a
    /// connection of its own, unless a scenario sets it.
    linger: Duration,
    /// Rows claimed ahead: none unless a scenario sets it.
    prefetch: usize,
    /// The attempt budget of the subscriptions it spawns.
    max_attempts: Option<u32>,
    /// The row type's fields that the check compares with the table's time columns.
    row_fields: &'static [ruststream_core::RowField],
    /// The start creates what the schema lacks.
    ensure_schema: bool,
    /// What the start does about a missing claim index.
    missing_index: ruststream_core::MissingIndex,
    /// The adapter's prepared statements live in the server session
    /// (`Broker::set_prepared_statements`).
    prepared_statements: bool,
}

impl Sim {
    fn new(dialect: Dialect, desc: TableDesc, workers: usize) -> Self {
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
    fn start(dialect: Dialect, desc: TableDesc, workers: usize, channels: &[i64]) -> Self {
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

    fn options(&self) -> SubscribeOptions {
        SubscribeOptions {
            workers: self.workers,
            poll_interval: POLL,
            lease: LEASE_TIME,
            extend_every: EXTEND,
            prefetch: self.prefetch,
            max_attempts: self.max_attempts,
            row_fields: self.row_fields,
            ensure_schema: self.ensure_schema,
            missing_claim_index: self.missing_index,
        }
    }

    fn insert(&mut self, channel: i64) -> i64 {
        self.db.insert(channel, self.now.micros())
    }

    /// A new process with the subscription and a publisher; its check's commands wait.
    fn spawn(&mut self) -> usize {
        self.spawn_skewed(Duration::ZERO, true)
    }

    /// [`Sim::spawn`] of a process whose clock runs `skew` ahead of the database's (`ahead`)
    /// or behind it.
    fn spawn_skewed(&mut self, skew: Duration, ahead: bool) -> usize {
        let skew = i64::try_from(skew.as_micros()).expect("fits") * if ahead { 1 } else { -1 };
        let mut broker = Broker::new(self.dialect);
        broker.set_connection_linger(self.linger);
        broker.set_prepared_statements(self.prepared_statements);
        let sub = broker
            .subscribe(self.desc, self.options(), Time(self.now.0 + skew))
            .expect("subscribes");
        let publisher = broker.publisher(self.desc).expect("a publisher");
        self.procs.push(Proc {
            broker,
            process: self.procs.len() + 1,
            sub,
            publisher,
            queue: VecDeque::new(),
            held: Vec::new(),
            conns: BTreeMap::new(),
            closed: BTreeSet::new(),
            alive: true,
            paused: false,
            skew,
        });
        let p = self.procs.len() - 1;
        self.poll(p);
        p
    }

    fn hook(&mut self, hook: impl FnMut(usize, &Command) -> Intercept + 'static) {
        self.hook = Some(Box::new(hook));
    }

    /// Drains a broker's commands into its queue and its events into the journal.
    fn poll(&mut self, p: usize) {
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
    fn run(&mut self) {
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
    fn step(&mut self, p: usize) -> bool {
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
    fn run_until(&mut self, p: usize, matches: impl Fn(&Command) -> bool) -> Command {
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
    fn take_held(&mut self, p: usize) -> Vec<Command> {
        std::mem::take(&mut self.procs[p].held)
    }

    fn run_command(&mut self, p: usize, command: Command) {
        let reply = self.exec(p, &command);
        self.answer(p, command, reply);
    }

    fn answer(&mut self, p: usize, command: Command, reply: Reply<i64>) {
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
    fn local(&self, p: usize) -> Time {
        Time(self.now.0 + self.procs[p].skew)
    }

    /// Runs a command on the database, as an adapter would.
    fn exec(&mut self, p: usize, command: &Command) -> Reply<i64> {
        let (dialect, desc) = (self.dialect, self.desc);
        let proc = &mut self.procs[p];
        if proc.closed.contains(&command.conn) {
            assert!(
                !matches!(
                    command.action,
                    Action::Acquire | Action::Release | Action::Close
                ),
                "{:?} on {} after it was closed",
                command.action,
                command.conn
            );
            return Reply::Failed(DbError::new(
                ErrorKind::ConnectionLost,
                "the connection was closed",
            ));
        }
        let reply = match &command.action {
            Action::Acquire => {
                let sess = self.db.acquire(proc.process);
                proc.conns.insert(command.conn, sess);
                Reply::Done
            }
            Action::Release => {
                let sess = proc.conns.remove(&command.conn).expect("a held connection");
                if self.db.sessions[&sess].alive {
                    self.db.release(sess);
                }
                Reply::Done
            }
            Action::Close => {
                proc.closed.insert(command.conn);
                let sess = proc.conns.remove(&command.conn).expect("a held connection");
                self.db.kill(sess);
                Reply::Done
            }
            Action::Execute { statement, binds } => {
                let sess = *proc
                    .conns
                    .get(&command.conn)
                    .unwrap_or_else(|| panic!("{} was never acquired", command.conn));
                self.db.clock = self.now.micros();
                self.db.execute(dialect, &desc, sess, statement, binds)
            }
            Action::Lock { key, .. } => {
                let sess = proc.conns[&command.conn];
                self.db.custom_lock(sess, key)
            }
            Action::Unlock { key, .. } => {
                let sess = proc.conns[&command.conn];
                self.db.custom_unlock(sess, key)
            }
        };
        assert!(self.db.violations.is_empty(), "{:?}", self.db.violations);
        reply
    }

    /// Moves the clock to `target`, firing every timer due on the way, each at its time.
    fn advance_to(&mut self, target: Time) {
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

    fn advance(&mut self, d: Duration) {
        self.advance_to(self.now.plus(d));
    }

    /// Fires a process's timers now, whatever `poll_timeout` says, and runs.
    fn fire(&mut self, p: usize) {
        let now = self.local(p);
        self.procs[p].broker.handle_timeout(now);
        self.poll(p);
        self.run();
    }

    fn timeout(&self, p: usize) -> Option<Time> {
        self.procs[p].broker.poll_timeout()
    }

    // ----- inputs: each polls, none runs -----

    fn settle(&mut self, p: usize, delivery: DeliveryId, outcome: Outcome) {
        let now = self.local(p);
        self.procs[p].broker.settle(delivery, outcome, now);
        self.poll(p);
    }

    fn drop_delivery(&mut self, p: usize, delivery: DeliveryId) {
        let now = self.local(p);
        self.procs[p].broker.drop_delivery(delivery, now);
        self.poll(p);
    }

    fn shutdown(&mut self, p: usize) {
        let now = self.local(p);
        self.procs[p].broker.shutdown(now);
        self.poll(p);
    }

    fn wake(&mut self, p: usize) {
        let (sub, now) = (self.procs[p].sub, self.local(p));
        self.procs[p].broker.wake(sub, now);
        self.poll(p);
    }

    /// A row to publish of `channel`: the key's column where the description's key reads it.
    fn message(&self, channel: i64) -> Publish {
        let columns = if self.desc.key_columns().contains(&"channel") {
            vec![("channel", Value::Int(channel))]
        } else {
            Vec::new()
        };
        Publish {
            payload: b"{}".to_vec(),
            columns,
            ..Publish::default()
        }
    }

    fn publish(&mut self, p: usize, channel: i64) -> Result<PublishId, BrokerError> {
        let publisher = self.procs[p].publisher;
        let row = self.message(channel);
        let now = self.local(p);
        let result = self.procs[p].broker.publish(publisher, row, now);
        self.poll(p);
        result
    }

    /// The process dies: the database ends its sessions, and it runs nothing more.
    fn crash(&mut self, p: usize) {
        self.db.kill_process(self.procs[p].process);
        self.procs[p].alive = false;
    }

    // ----- what happened -----

    fn mark(&self) -> usize {
        self.journal.len()
    }

    fn runs(&self, p: usize, since: usize) -> Vec<&Ran> {
        self.journal[since..]
            .iter()
            .filter_map(|e| match e {
                Entry::Ran(r) if r.proc == p => Some(r),
                _ => None,
            })
            .collect()
    }

    fn ops(&self, p: usize, since: usize) -> Vec<Op> {
        self.runs(p, since)
            .into_iter()
            .map(|r| r.op.clone())
            .collect()
    }

    /// The ops on the connection of `p`'s first command since `since`: one flow's, where a
    /// claim runs beside it.
    fn first_flow_ops(&self, p: usize, since: usize) -> Vec<Op> {
        match self.runs(p, since).first() {
            Some(first) => self.ops_on(p, first.conn, since),
            None => Vec::new(),
        }
    }

    fn ops_on(&self, p: usize, conn: ConnId, since: usize) -> Vec<Op> {
        self.runs(p, since)
            .into_iter()
            .filter(|r| r.conn == conn)
            .map(|r| r.op.clone())
            .collect()
    }

    /// The runs of a statement kind.
    fn runs_of(&self, p: usize, since: usize, kind: StatementKind) -> Vec<&Ran> {
        self.runs(p, since)
            .into_iter()
            .filter(|r| r.op == Exec(kind))
            .collect()
    }

    fn events(&self, p: usize, since: usize) -> Vec<Event<i64>> {
        self.journal[since..]
            .iter()
            .filter_map(|e| match e {
                Entry::Event { proc, event, .. } if *proc == p => Some(event.clone()),
                _ => None,
            })
            .collect()
    }

    /// The index in the journal of the first event of `p` that matches.
    /// The index in the journal of `p`'s subscription's `Ready`: what ran after its check.
    fn ready_at(&self, p: usize) -> usize {
        let sub = self.procs[p].sub;
        self.event_index(p, |e| *e == Event::Ready { sub })
            .expect("the subscription is ready")
    }

    fn event_index(&self, p: usize, matches: impl Fn(&Event<i64>) -> bool) -> Option<usize> {
        self.journal.iter().position(
            |e| matches!(e, Entry::Event { proc, event, .. } if *proc == p && matches(event)),
        )
    }

    fn delivered(&self, p: usize, since: usize) -> Vec<Delivered<i64>> {
        self.events(p, since)
            .into_iter()
            .filter_map(|e| match e {
                Event::Delivered(d) => Some(d),
                _ => None,
            })
            .collect()
    }

    /// The ids the statements of `kind` that `p` ran since `since` started at.
    fn floors(&self, p: usize, since: usize, kind: StatementKind) -> Vec<Value> {
        self.runs_of(p, since, kind)
            .into_iter()
            .filter_map(|r| {
                let st = r.statement.as_ref()?;
                let i = st.args.iter().position(|a| *a == Arg::Floor)?;
                Some(r.binds[i].clone())
            })
            .collect()
    }

    /// Acknowledges every row `p` was handed but `row`, 100 ms apart, until `row` is handed
    /// again after `since` (at most 40 times): claims keep running past it. Answers when.
    fn ack_others_until(
        &mut self,
        row: i64,
        since: usize,
        done: &mut BTreeSet<i64>,
    ) -> Option<Time> {
        for _ in 0..40 {
            if self.delivered_rows(0, since).contains(&row) {
                return Some(self.now);
            }
            for other in self.delivered_rows(0, 0) {
                if other != row && done.insert(other) {
                    let d = self.delivery(0, other);
                    self.settle(0, d, Outcome::Ack);
                }
            }
            self.run();
            self.advance(Duration::from_millis(100));
        }
        None
    }

    fn delivered_rows(&self, p: usize, since: usize) -> Vec<i64> {
        self.delivered(p, since)
            .iter()
            .map(|d| d.row.expect("the driver row"))
            .collect()
    }

    /// The time of the first delivery of `row` by `p` since `since`.
    fn delivered_at(&self, p: usize, since: usize, row: i64) -> Option<Time> {
        self.journal[since..].iter().find_map(|e| match e {
            Entry::Event {
                proc,
                event: Event::Delivered(d),
                at,
                ..
            } if *proc == p && d.row == Some(row) => Some(*at),
            _ => None,
        })
    }

    /// The last delivery of `row` by `p`.
    fn delivery(&self, p: usize, row: i64) -> DeliveryId {
        self.delivered(p, 0)
            .iter()
            .rev()
            .find(|d| d.row == Some(row))
            .unwrap_or_else(|| panic!("row {row} was never delivered"))
            .delivery
    }

    /// The connection whose claim statement read `row` last: the delivery's connection.
    fn conn_of(&self, p: usize, row: i64) -> ConnId {
        self.runs(p, 0)
            .into_iter()
            .rev()
            .find(|r| {
                matches!(
                    r.op,
                    Exec(
                        StatementKind::LockRow
                            | StatementKind::LockRowById
                            | StatementKind::LockRowByIdUnmarking
                            | StatementKind::Take
                            | StatementKind::ReadRow
                    )
                ) && r.raw_rows().contains(&row)
            })
            .unwrap_or_else(|| panic!("no claim read row {row}"))
            .conn
    }

    fn sess_of(&self, p: usize, conn: ConnId) -> SessId {
        self.procs[p].conns[&conn]
    }

    /// Every `Closed` event of `p`, with the connections held then.
    fn closed(&self, p: usize) -> Vec<(ClosedCounts, usize)> {
        self.journal
            .iter()
            .filter_map(|e| match e {
                Entry::Event {
                    proc,
                    event: Event::Closed(counts),
                    held,
                    ..
                } if *proc == p => Some((*counts, *held)),
                _ => None,
            })
            .collect()
    }

    fn row(&self, id: i64) -> &DbRow {
        self.db
            .rows
            .get(&id)
            .unwrap_or_else(|| panic!("row {id} is not in the table"))
    }

    fn executed(&self, kind: StatementKind) -> usize {
        self.db.executed.get(&kind).copied().unwrap_or(0)
    }

    fn in_work(&self, p: usize) -> usize {
        self.procs[p].broker.in_work(self.procs[p].sub)
    }

    fn statements(&self, p: usize) -> &ruststream_core::Statements {
        self.procs[p]
            .broker
            .statements(self.procs[p].sub)
            .expect("the subscription's statements")
    }

    /// A session of another system that holds the advisory lock of `key`.
    fn hold_elsewhere(&mut self, key: &str) -> SessId {
        let sess = self.db.acquire(OTHER_SYSTEM);
        self.db
            .advisory
            .insert(lock_arg(self.dialect, key), (sess, 1));
        sess
    }
}

#[track_caller]
fn only<T: std::fmt::Debug>(mut items: Vec<T>) -> T {
    assert_eq!(items.len(), 1, "exactly one: {items:?}");
    items.pop().expect("one")
}

/// A microsecond before `t`.
fn just_before(t: Time) -> Time {
    Time(t.micros() - 1)
}

fn bool_reply(value: bool) -> Reply<i64> {
    Reply::Rows(vec![Row::values(vec![Value::Bool(value)])])
}

/// A settlement's, extension's or release's statement (not a claim's).
fn touches_a_held_row(op: &Op) -> bool {
    matches!(
        op,
        Exec(
            StatementKind::Delete { .. }
                | StatementKind::MarkProcessed { .. }
                | StatementKind::ReleaseLease
                | StatementKind::ExtendLease
                | StatementKind::Unlock
        ) | Op::Unlock(_)
    )
}

fn delete(fenced: bool) -> Op {
    Exec(StatementKind::Delete { fenced })
}

/// The advisory form's take, per dialect: one statement, or a count then a read.
fn take_ops(dialect: Dialect) -> Vec<Op> {
    match dialect {
        Dialect::MySql | Dialect::MariaDb => {
            vec![Exec(StatementKind::TakeCount), Exec(StatementKind::ReadRow)]
        }
        Dialect::Postgres | Dialect::Sqlite => vec![Exec(StatementKind::Take)],
    }
}

fn take_kind(dialect: Dialect) -> StatementKind {
    match dialect {
        Dialect::MySql | Dialect::MariaDb => StatementKind::TakeCount,
        Dialect::Postgres | Dialect::Sqlite => StatementKind::Take,
    }
}

fn lease_claim_kind(dialect: Dialect) -> StatementKind {
    match dialect {
        Dialect::MySql | Dialect::MariaDb => StatementKind::SelectLease,
        Dialect::Postgres | Dialect::Sqlite => StatementKind::ClaimLease,
    }
}

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

// ===== The row lock form =====

/// "A row lock claim locks each row with FOR UPDATE SKIP LOCKED in a transaction that stays
/// open while the handler runs."
#[test]
fn row_lock_claim_locks_the_row_inside_a_transaction_held_while_in_work() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 1, &[0]);
        let d = only(sim.delivered(0, 0));
        let row = d.row.expect("a row");
        assert_eq!(d.attempt, Some(1), "{dialect:?}");
        let conn = sim.conn_of(0, row);
        // The attempt is counted and committed first, so a crash spends it, under the row's
        // mark; then the row is locked for the handler in a transaction of its own, the lock
        // releasing the count's one mark.
        let expected: Vec<_> = if dialect == Dialect::Postgres {
            vec![
                Acquire,
                Exec(StatementKind::CountRow),
                Exec(StatementKind::Begin),
                Exec(StatementKind::LockRowByIdUnmarking),
            ]
        } else {
            vec![
                Acquire,
                Exec(StatementKind::ReadCommitted),
                Exec(StatementKind::Begin),
                Exec(StatementKind::SelectRowId),
                Exec(StatementKind::MarkRows(1)),
                Exec(StatementKind::CountAttempt),
                Exec(StatementKind::Commit),
                Exec(StatementKind::Begin),
                Exec(StatementKind::LockRowByIdUnmarking),
            ]
        };
        assert_eq!(sim.ops_on(0, conn, 0), expected, "{dialect:?}");
        let lock_row = match &sim.statements(0).form {
            FormStatements::RowLock(f) => match &f.claim {
                RowLockClaim::Count { lock_row_by_id, .. }
                | RowLockClaim::SelectCount { lock_row_by_id, .. } => lock_row_by_id.clone(),
                RowLockClaim::Lock { .. } => panic!("a table with attempts locks by id"),
            },
            other => panic!("the row lock form's statements, not {other:?}"),
        };
        assert!(
            lock_row.sql.ends_with("FOR UPDATE SKIP LOCKED"),
            "{dialect:?}: {}",
            lock_row.sql
        );
        // The handler runs: the transaction is open and holds the row.
        sim.advance(Duration::from_secs(5));
        let sess = sim.sess_of(0, conn);
        assert_eq!(sim.db.row_locks.get(&row), Some(&sess), "{dialect:?}");
        assert!(sim.db.sessions[&sess].in_tx, "{dialect:?}");
        assert_eq!(
            sim.ops_on(0, conn, 0).len(),
            expected.len(),
            "{dialect:?}: nothing more ran"
        );
    }
}

/// "Rows that another claim holds are passed over, so claims of several workers and
/// processes never wait for each other."
#[test]
fn row_lock_rows_another_claim_holds_are_passed_over() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 1, &[0, 0]);
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
        let second = sim.spawn();
        sim.run();
        // The database model records a statement that would wait as a violation, and the
        // driver fails on any.
        assert_eq!(sim.delivered_rows(second, 0), [2], "{dialect:?}");
        assert!(sim.db.violations.is_empty());
        assert_eq!(sim.db.row_locks.len(), 2, "{dialect:?}");
    }
}

/// "The settlement's statement, a delete or the processed_at mark, commits that transaction,
/// so a row and its outcome change together."
#[test]
fn row_lock_ack_runs_the_settle_statement_then_commit_on_the_same_connection() {
    for dialect in SERVERS {
        {
            let outcome = Outcome::Ack;
            let mut sim = Sim::start(dialect, row_lock(), 1, &[0]);
            let delivery = sim.delivery(0, 1);
            let conn = sim.conn_of(0, 1);
            let mark = sim.mark();
            sim.settle(0, delivery, outcome);
            // Before the commit, the delete is inside the claim's transaction, which still
            // holds the row.
            sim.run_until(0, |c| kind_of(c) == Some(StatementKind::Commit));
            let sess = sim.sess_of(0, conn);
            assert!(
                sim.db.sessions[&sess].in_tx,
                "{dialect:?}: not yet committed"
            );
            assert_eq!(sim.db.row_locks.get(&1), Some(&sess), "{dialect:?}");
            sim.run();
            assert_eq!(
                sim.ops_on(0, conn, mark),
                [delete(false), Exec(StatementKind::Commit), Release],
                "{dialect:?} {outcome:?}"
            );
            assert!(
                sim.events(0, mark)
                    .contains(&Event::Settled { delivery, outcome }),
                "{dialect:?} {outcome:?}"
            );
            assert!(
                !sim.db.rows.contains_key(&1),
                "{dialect:?}: the row is deleted"
            );
            assert!(sim.db.row_locks.is_empty());
        }
    }
}

/// "... a delete or the processed_at mark ...": with `processed_at`, the settlement marks the
/// row inside the transaction instead of deleting it, and the row is never claimed again.
#[test]
fn row_lock_ack_marks_processed_at_instead_of_deleting() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock_marked(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let mark = sim.mark();
        sim.advance(Duration::from_millis(1500));
        let at = sim.now;
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.ops_on(0, conn, mark),
            [
                Exec(StatementKind::MarkProcessed { fenced: false }),
                Exec(StatementKind::Commit),
                Release
            ],
            "{dialect:?}"
        );
        assert_eq!(sim.row(1).processed_at, Some(at.micros()), "{dialect:?}");
        let mark = sim.mark();
        sim.advance(Duration::from_secs(10));
        assert!(sim.delivered(0, mark).is_empty(), "{dialect:?}");
    }
}

/// "The price is a connection of the pool per message in work, held for the whole handler."
#[test]
fn row_lock_holds_one_connection_per_message_in_work() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 4, &[0, 1, 2, 3, 4, 5]);
        let rows = sim.delivered_rows(0, 0);
        assert_eq!(
            rows,
            [1, 2, 3, 4],
            "{dialect:?}: four workers take four rows"
        );
        assert_eq!(sim.procs[0].broker.held_connections(), 4, "{dialect:?}");
        let conns: BTreeSet<ConnId> = rows.iter().map(|r| sim.conn_of(0, *r)).collect();
        assert_eq!(conns.len(), 4, "{dialect:?}: a connection of its own each");
        let sessions: BTreeSet<SessId> = conns.iter().map(|c| sim.sess_of(0, *c)).collect();
        assert_eq!(sessions.len(), 4, "{dialect:?}");
        for row in &rows {
            let sess = sim.sess_of(0, sim.conn_of(0, *row));
            assert_eq!(sim.db.row_locks.get(row), Some(&sess), "{dialect:?}");
            assert!(sim.db.sessions[&sess].in_tx, "{dialect:?}");
        }
        // Held for the whole handler.
        sim.advance(Duration::from_secs(60));
        assert_eq!(sim.procs[0].broker.held_connections(), 4, "{dialect:?}");
        // A settlement gives its connection back, and the freed worker takes the next row.
        let delivery = sim.delivery(0, 1);
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(sim.delivered_rows(0, 0), [1, 2, 3, 4, 5], "{dialect:?}");
        assert_eq!(sim.procs[0].broker.held_connections(), 4, "{dialect:?}");
    }
}

/// `retry()` in the row lock form commits the transaction with its counted attempt, and the
/// row returns to the queue.
#[test]
fn row_lock_retry_commits_the_counted_attempt_and_the_row_returns() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Retry);
        sim.run();
        assert_eq!(
            sim.ops_on(0, conn, mark)[..2],
            [Exec(StatementKind::Commit), Release],
            "{dialect:?}: no statement but the commit"
        );
        assert!(sim.events(0, mark).contains(&Event::Settled {
            delivery,
            outcome: Outcome::Retry
        }));
        let again = only(sim.delivered(0, mark));
        assert_eq!(again.row, Some(1), "{dialect:?}: the row returns");
        assert_eq!(
            again.attempt,
            Some(2),
            "{dialect:?}: the attempt was committed"
        );
        assert_eq!(sim.row(1).attempt, 2);
    }
}

/// "The rows of a crashed process return at once, when the database rolls its transactions
/// back."
#[test]
fn row_lock_crash_returns_the_row_at_once() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 1, &[0]);
        assert_eq!(sim.delivered_rows(0, 0), [1]);
        let second = sim.spawn();
        sim.run();
        assert!(
            sim.delivered(second, 0).is_empty(),
            "{dialect:?}: held by the first process"
        );
        sim.crash(0);
        assert!(sim.db.row_locks.is_empty(), "{dialect:?}");
        // At once: the second process's next claim, with no lease to wait for.
        sim.advance(POLL);
        let d = only(sim.delivered(second, 0));
        assert_eq!(d.row, Some(1), "{dialect:?}");
        assert_eq!(sim.delivered_at(second, 0, 1), Some(T0.plus(POLL)));
    }
}

/// "SQLite has no row locks, so a subscription to a SQLite table that names no other form
/// does not compile": at run time the core refuses it.
#[test]
fn row_lock_subscription_on_sqlite_is_refused() {
    let mut broker: Broker<i64> = Broker::new(Dialect::Sqlite);
    let options = SubscribeOptions::default();
    assert_eq!(
        broker.subscribe(row_lock(), options, T0),
        Err(BrokerError::Desc(DescError::NoRowLocks {
            table: "jobs",
            dialect: "SQLite",
        }))
    );
    assert_eq!(broker.poll_command(), None, "nothing runs");
    // The other forms are taken on SQLite.
    assert!(broker.subscribe(lease(), options, T0).is_ok());
    assert!(broker.subscribe(advisory(), options, T0).is_ok());
}

/// "On Postgres read_committed is the practical isolation level for the form: a claim at a
/// stricter level fails with a serialization error": the check refuses a stricter level,
/// and names the setting to change.
#[test]
fn row_lock_postgres_serializable_isolation_fails_the_check() {
    let mut sim = Sim::new(Dialect::Postgres, row_lock(), 1);
    sim.db.isolation = Some("serializable".into());
    sim.insert(0);
    let p = sim.spawn();
    sim.run();
    let sub = sim.procs[p].sub;
    let error = sim
        .events(p, 0)
        .into_iter()
        .find_map(|e| match e {
            Event::CheckFailed { sub: s, error } if s == sub => Some(error),
            _ => None,
        })
        .expect("the check fails");
    assert_eq!(
        error,
        CheckError::Isolation {
            table: "jobs",
            level: "serializable".into()
        }
    );
    assert!(
        error.to_string().contains("default_transaction_isolation"),
        "{error}"
    );
    assert!(!sim.events(p, 0).contains(&Event::Ready { sub }));
    sim.advance(Duration::from_secs(10));
    assert_eq!(sim.executed(StatementKind::LockRow), 0, "no claim");
    assert_eq!(sim.procs[p].broker.held_connections(), 0);
}

/// A claim that fails with a serialization error says which setting to change.
#[test]
fn row_lock_serialization_failure_names_the_isolation_setting() {
    let mut sim = Sim::new(Dialect::Postgres, row_lock(), 1);
    sim.insert(0);
    sim.spawn();
    sim.hook(|_, c| match kind_of(c) {
        Some(StatementKind::CountRow) => Intercept::Answer(Reply::Failed(DbError::new(
            ErrorKind::Serialization,
            "could not serialize access",
        ))),
        _ => Intercept::Run,
    });
    sim.run();
    let message = sim
        .events(0, 0)
        .into_iter()
        .find_map(|e| match e {
            Event::Error { error, .. } if error.kind == ErrorKind::Serialization => {
                Some(error.message)
            }
            _ => None,
        })
        .expect("the claim's error");
    assert!(
        message.contains("default_transaction_isolation"),
        "{message}"
    );
    assert!(
        sim.ops(0, 0).contains(&Close),
        "the failed claim's connection closes"
    );
    assert_eq!(sim.procs[0].broker.held_connections(), 0);
}

// ===== The lease form =====

/// "an expiry written into the row": the claim writes `locked_until` and counts the attempt,
/// and holds no connection while the message is in work.
#[test]
fn lease_claim_writes_locked_until_and_counts_the_attempt() {
    for dialect in ALL {
        let sim = Sim::start(dialect, lease(), 1, &[0]);
        let d = only(sim.delivered(0, 0));
        assert_eq!(d.row, Some(1));
        assert_eq!(d.attempt, Some(1), "{dialect:?}");
        let row = sim.row(1);
        assert_eq!(row.attempt, 1, "{dialect:?}");
        assert_eq!(row.locked_until, Some(T0.plus(LEASE_TIME).micros()));
        let claim = match dialect {
            Dialect::MySql | Dialect::MariaDb => vec![
                Acquire,
                Exec(StatementKind::Begin),
                Exec(StatementKind::SelectLease),
                Exec(StatementKind::MarkLease(1)),
                Exec(StatementKind::Commit),
                Release,
            ],
            _ => vec![Acquire, Exec(StatementKind::ClaimLease), Release],
        };
        let check_len = sim.ops(0, 0).len() - claim.len();
        assert_eq!(sim.ops(0, 0)[check_len..], claim, "{dialect:?}");
        assert_eq!(sim.procs[0].broker.held_connections(), 0, "{dialect:?}");
        assert!(sim.db.sessions.values().all(|s| !s.in_tx));
    }
}

/// "statements to claim, extend and settle": a lease in work is extended every
/// `extend_every`, and no longer once settled.
#[test]
fn lease_is_extended_every_extend_every_while_in_work() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[0]);
        sim.advance_to(just_before(T0.plus(EXTEND)));
        assert_eq!(sim.executed(StatementKind::ExtendLease), 0, "{dialect:?}");
        sim.advance_to(T0.plus(EXTEND));
        let extend = only(sim.runs_of(0, 0, StatementKind::ExtendLease));
        assert_eq!(extend.at, T0.plus(EXTEND), "{dialect:?}");
        assert_eq!(extend.bind(Arg::Id), Value::Int(1));
        assert_eq!(
            extend.bind(Arg::Fence),
            Value::Int(T0.plus(LEASE_TIME).micros()),
            "{dialect:?}: fenced by the lease it wrote"
        );
        // Moved by the time since the claim: a lease past the database's time.
        let until = T0.plus(EXTEND).plus(LEASE_TIME).micros();
        let by = i64::try_from(EXTEND.as_micros()).expect("fits");
        assert_eq!(extend.bind(Arg::Extend), Value::Int(by));
        assert_eq!(sim.row(1).locked_until, Some(until), "{dialect:?}");
        sim.advance_to(T0.plus(EXTEND * 2));
        assert_eq!(sim.executed(StatementKind::ExtendLease), 2, "{dialect:?}");
        let delivery = sim.delivery(0, 1);
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        sim.advance(Duration::from_secs(120));
        assert_eq!(sim.executed(StatementKind::ExtendLease), 2, "{dialect:?}");
        assert!(!sim.db.rows.contains_key(&1));
    }
}

/// A lease that ran out and that another claim took: the extension finds it gone and says
/// `LeaseLost`; a settlement afterwards fails with `LeaseLost` and runs no statement.
#[test]
fn lease_taken_by_another_claim_yields_lease_lost_and_settle_fails_without_touching_the_row() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        // The first process stalls past its lease.
        sim.procs[0].paused = true;
        sim.advance_to(T0.plus(LEASE_TIME + POLL));
        let second = sim.spawn();
        sim.run();
        let taken = only(sim.delivered(second, 0));
        assert_eq!(taken.row, Some(1), "{dialect:?}");
        assert_eq!(taken.attempt, Some(2));
        let theirs = sim.row(1).clone();
        // The first process wakes up and extends.
        sim.procs[0].paused = false;
        let mark = sim.mark();
        sim.fire(0);
        assert_eq!(
            sim.ops(0, mark),
            [Acquire, Exec(StatementKind::ExtendLease), Release],
            "{dialect:?}"
        );
        assert!(
            sim.events(0, mark).contains(&Event::LeaseLost { delivery }),
            "{dialect:?}: {:?}",
            sim.events(0, mark)
        );
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.events(0, mark),
            [Event::SettleFailed {
                delivery,
                error: SettleError::LeaseLost
            }],
            "{dialect:?}"
        );
        assert!(
            !sim.ops(0, mark).iter().any(touches_a_held_row),
            "{dialect:?}: no statement runs: {:?}",
            sim.ops(0, mark)
        );
        assert_eq!(sim.row(1), &theirs, "{dialect:?}: the row is untouched");
    }
}

/// A settlement fenced by a lease another claim took after it ran out takes no effect.
#[test]
fn lease_settle_after_the_lease_was_taken_fails_with_lease_lost() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        sim.procs[0].paused = true;
        sim.advance_to(T0.plus(LEASE_TIME));
        let second = sim.spawn();
        sim.run();
        assert_eq!(sim.delivered_rows(second, 0), [1], "{dialect:?}");
        let theirs = sim.row(1).clone();
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.first_flow_ops(0, mark)[..3],
            [Acquire, delete(true), Release],
            "{dialect:?}"
        );
        assert!(!sim.ops(0, mark)[3..].iter().any(touches_a_held_row));
        assert!(sim.events(0, mark).contains(&Event::SettleFailed {
            delivery,
            error: SettleError::LeaseLost
        }));
        assert_eq!(sim.row(1), &theirs, "{dialect:?}");
    }
}

/// "After a crash ... the row returns when the lease runs out": not a moment before.
#[test]
fn lease_crash_returns_the_row_only_when_the_lease_runs_out() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[0]);
        sim.crash(0);
        sim.advance_to(T0.plus(LEASE_TIME - POLL));
        let second = sim.spawn();
        sim.run();
        let claim = lease_claim_kind(dialect);
        let claims = sim.runs_of(second, 0, claim);
        assert_eq!(
            claims.len(),
            1,
            "{dialect:?}: a claim 1 s before the lease runs out"
        );
        assert!(
            claims[0].raw_rows().is_empty(),
            "{dialect:?}: takes nothing"
        );
        assert!(sim.delivered(second, 0).is_empty());
        sim.advance_to(T0.plus(LEASE_TIME));
        let d = only(sim.delivered(second, 0));
        assert_eq!(d.row, Some(1), "{dialect:?}: a claim after takes it");
        assert_eq!(d.attempt, Some(2), "{dialect:?}");
        assert_eq!(sim.delivered_at(second, 0, 1), Some(T0.plus(LEASE_TIME)));
    }
}

/// "... a delete or the processed_at mark": in the lease form, a fenced mark.
#[test]
fn lease_ack_marks_processed_at_instead_of_deleting() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease_marked(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        sim.advance(Duration::from_secs(2));
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.first_flow_ops(0, mark)[..3],
            [
                Acquire,
                Exec(StatementKind::MarkProcessed { fenced: true }),
                Release
            ],
            "{dialect:?}"
        );
        assert!(sim.events(0, mark).contains(&Event::Settled {
            delivery,
            outcome: Outcome::Ack
        }));
        let row = sim.row(1);
        assert_eq!(
            row.processed_at,
            Some(T0.plus(Duration::from_secs(2)).micros())
        );
        assert_eq!(row.locked_until, None, "{dialect:?}");
        sim.advance(Duration::from_secs(120));
        assert_eq!(
            sim.delivered_rows(0, 0),
            [1],
            "{dialect:?}: never claimed again"
        );
    }
}

/// `retry()` in the lease form gives the row back at once, its attempt counted.
#[test]
fn lease_retry_releases_the_lease_and_the_row_returns() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Retry);
        sim.run();
        assert_eq!(
            sim.first_flow_ops(0, mark)[..3],
            [Acquire, Exec(StatementKind::ReleaseLease), Release],
            "{dialect:?}"
        );
        assert!(sim.events(0, mark).contains(&Event::Settled {
            delivery,
            outcome: Outcome::Retry
        }));
        let again = only(sim.delivered(0, mark));
        assert_eq!(again.row, Some(1), "{dialect:?}");
        assert_eq!(again.attempt, Some(2));
    }
}

// ===== The advisory form: one row of a key in work at a time =====

/// "A claim selects as many due rows as it may take, in claim order, each with its key."
#[test]
fn advisory_claim_selects_candidates_in_claim_order_with_their_keys() {
    for dialect in SERVERS {
        let sim = Sim::start(dialect, advisory(), 3, &[2, 0, 1, 3, 4]);
        let candidates = only(sim.runs_of(0, 0, StatementKind::Candidates));
        let listed: Vec<Vec<Value>> = match &candidates.reply {
            Reply::Rows(rows) => rows.iter().map(|r| r.values.clone()).collect(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            listed[..3],
            [
                vec![Value::Int(1), Value::Text("jobs-2".into())],
                vec![Value::Int(2), Value::Text("jobs-0".into())],
                vec![Value::Int(3), Value::Text("jobs-1".into())],
            ],
            "{dialect:?}"
        );
        let delivered = sim.delivered(0, 0);
        let got: Vec<(Option<i64>, Option<&str>)> = delivered
            .iter()
            .map(|d| (d.row, d.key.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (Some(1), Some("jobs-2")),
                (Some(2), Some("jobs-0")),
                (Some(3), Some("jobs-1"))
            ],
            "{dialect:?}: in claim order, as many as the workers may take"
        );
        let locked: Vec<Value> = sim
            .runs_of(0, sim.ready_at(0), StatementKind::TryLock)
            .iter()
            .map(|r| r.bind(Arg::Key))
            .collect();
        assert_eq!(
            locked,
            ["jobs-2", "jobs-0", "jobs-1"].map(|k| lock_arg(dialect, k)),
            "{dialect:?}"
        );
    }
}

/// "It locks each key on a connection of its own, without waiting."
#[test]
fn advisory_locks_each_key_on_a_connection_of_its_own_without_waiting() {
    for dialect in SERVERS {
        let sim = Sim::start(dialect, advisory(), 3, &[0, 1, 2]);
        let locks = sim.runs_of(0, sim.ready_at(0), StatementKind::TryLock);
        assert_eq!(locks.len(), 3, "{dialect:?}");
        let conns: BTreeSet<ConnId> = locks.iter().map(|r| r.conn).collect();
        assert_eq!(conns.len(), 3, "{dialect:?}: a connection of its own each");
        for row in [1, 2, 3] {
            assert!(conns.contains(&sim.conn_of(0, row)), "{dialect:?}");
        }
        let holders: BTreeSet<SessId> = sim.db.advisory.values().map(|(s, _)| *s).collect();
        assert_eq!(sim.db.advisory.len(), 3);
        assert_eq!(
            holders.len(),
            3,
            "{dialect:?}: three sessions hold the three keys"
        );
        assert_eq!(sim.procs[0].broker.held_connections(), 3);
        let sql = match &sim.statements(0).form {
            FormStatements::Advisory(f) => match &f.keys {
                KeyLocks::Database { try_lock, .. } => try_lock.sql.clone(),
                other => panic!("the database's locks, not {other:?}"),
            },
            other => panic!("the advisory form's statements, not {other:?}"),
        };
        match dialect {
            Dialect::Postgres => assert!(sql.contains("pg_try_advisory_lock("), "{sql}"),
            _ => assert!(sql.contains("GET_LOCK(?, 0)"), "{sql}"),
        }
    }
}

/// "... and passes over a key held elsewhere": the next candidate is taken.
#[test]
fn advisory_passes_over_a_key_held_elsewhere_and_takes_the_next_candidate() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, advisory(), 1);
        sim.insert(0);
        sim.insert(1);
        let other = sim.hold_elsewhere("jobs-0");
        sim.spawn();
        sim.run();
        let tries: Vec<(Value, Reply<i64>)> = sim
            .runs_of(0, sim.ready_at(0), StatementKind::TryLock)
            .iter()
            .map(|r| (r.bind(Arg::Key), r.reply.clone()))
            .collect();
        assert_eq!(
            tries,
            [
                (lock_arg(dialect, "jobs-0"), bool_reply(false)),
                (lock_arg(dialect, "jobs-1"), bool_reply(true)),
            ],
            "{dialect:?}"
        );
        let d = only(sim.delivered(0, 0));
        assert_eq!(d.row, Some(2), "{dialect:?}");
        assert_eq!(
            sim.row(1).attempt,
            0,
            "{dialect:?}: the passed-over row is untouched"
        );
        // Once the other system lets go, the row is taken.
        sim.db.kill(other);
        sim.settle(0, d.delivery, Outcome::Ack);
        sim.run();
        sim.advance(POLL);
        assert_eq!(sim.delivered_rows(0, 0), [2, 1], "{dialect:?}");
    }
}

/// Several processes on one table: a claim whose first look finds only keys held elsewhere
/// (here, by another process of the service) looks again at once, passing over those keys,
/// and takes the rows of free keys behind them; no claim waits for a poll while they wait.
#[test]
fn advisory_looks_past_keys_held_elsewhere_at_once() {
    for dialect in SERVERS {
        // Keys 0 and 1, then key 2 behind them.
        let mut sim = Sim::start(dialect, advisory(), 2, &[0, 1, 0, 1, 2]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{dialect:?}");
        let second = sim.spawn();
        sim.run();
        // Its first look reads the first rows (keys 0 and 1, held by the first process), and
        // the next passes over both keys, at the same time.
        let looks = sim.runs_of(second, 0, StatementKind::Candidates);
        assert!(looks.len() >= 2, "{dialect:?}: {} looks", looks.len());
        let second_look = looks[1].statement.as_ref().expect("a statement");
        let excluded: Vec<Value> = looks[1]
            .binds
            .iter()
            .zip(second_look.args.iter())
            .filter(|(_, a)| matches!(a, Arg::ExcludedKey(_)))
            .map(|(v, _)| v.clone())
            .collect();
        for key in ["jobs-0", "jobs-1"] {
            assert!(
                excluded.contains(&Value::Text(key.into())),
                "{dialect:?}: the second look passes over {key}: {excluded:?}"
            );
        }
        assert_eq!(
            sim.delivered_rows(second, 0),
            [5],
            "{dialect:?}: the row of the free key, with no poll"
        );
        assert_eq!(sim.delivered_at(second, 0, 5), Some(T0), "{dialect:?}");
    }
}

/// A settlement that releases a key lets the next claim run at once, even when the last claim
/// found nothing: the next row of the key waits for no poll.
#[test]
fn advisory_a_released_key_is_claimed_again_at_once() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, advisory(), 2, &[0, 0, 0]);
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
        // The claim found the key in work and nothing else: the next waits for the poll.
        let mark = sim.mark();
        let delivery = sim.delivery(0, 1);
        let settled_at = sim.now;
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(sim.delivered_rows(0, mark), [2], "{dialect:?}");
        assert_eq!(
            sim.delivered_at(0, mark, 2),
            Some(settled_at),
            "{dialect:?}"
        );
        // A retry and a drop release the key too.
        for end in [Some(Outcome::Retry), None] {
            let mark = sim.mark();
            let delivery = sim.delivery(0, 2);
            match end {
                Some(outcome) => sim.settle(0, delivery, outcome),
                None => sim.drop_delivery(0, delivery),
            }
            sim.run();
            assert_eq!(
                sim.delivered_rows(0, mark),
                [2],
                "{dialect:?}, {end:?}: the row given back is taken again at once"
            );
        }
    }
}

/// A row of a key held by another system waits for that key, however many looks pass over
/// it, and the rows behind it of free keys flow meanwhile.
#[test]
fn advisory_free_keys_flow_while_another_system_holds_one() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, advisory(), 1);
        for channel in [0, 1, 0, 1, 0, 1] {
            sim.insert(channel);
        }
        let other = sim.hold_elsewhere("jobs-0");
        sim.spawn();
        sim.run();
        for expected in [2, 4, 6] {
            assert_eq!(
                sim.delivered_rows(0, 0).last(),
                Some(&expected),
                "{dialect:?}"
            );
            let delivery = sim.delivery(0, expected);
            sim.settle(0, delivery, Outcome::Ack);
            sim.run();
        }
        assert_eq!(
            sim.delivered_rows(0, 0),
            [2, 4, 6],
            "{dialect:?}: no poll between them"
        );
        assert_eq!(sim.now, T0, "{dialect:?}: no time passed");
        // The other system lets go: its rows follow at the next look, in order.
        sim.db.kill(other);
        sim.advance(POLL);
        for expected in [1, 3, 5] {
            let delivery = sim.delivery(0, expected);
            sim.settle(0, delivery, Outcome::Ack);
            sim.run();
        }
        assert_eq!(sim.delivered_rows(0, 0), [2, 4, 6, 1, 3, 5], "{dialect:?}");
    }
}

/// "A key on another column keeps the rows that share it in work one at a time", across
/// processes too.
#[test]
fn advisory_rows_sharing_a_key_go_into_work_one_at_a_time() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, advisory(), 3, &[0, 0, 1]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 3], "{dialect:?}");
        let second = sim.spawn();
        sim.run();
        sim.advance(POLL * 3);
        assert!(
            sim.delivered(second, 0).is_empty(),
            "{dialect:?}: the other process passes over the key in work"
        );
        assert_eq!(sim.delivered_rows(0, 0), [1, 3], "{dialect:?}");
        let mark = sim.mark();
        let first = sim.delivery(0, 1);
        sim.settle(0, first, Outcome::Ack);
        sim.run();
        sim.advance(POLL);
        let mut next = sim.delivered_rows(0, mark);
        next.extend(sim.delivered_rows(second, mark));
        assert_eq!(next, [2], "{dialect:?}: the next row of the key, once");
    }
}

/// "A key on the row's id holds each row alone."
#[test]
fn advisory_key_on_the_id_holds_each_row_alone() {
    const ON_ID: &[KeyPart] = &[KeyPart::Literal("jobs-"), KeyPart::Column("id")];
    for dialect in SERVERS {
        let sim = Sim::start(dialect, advisory_keyed(ON_ID), 3, &[0, 0, 0]);
        let keys: Vec<Option<String>> = sim
            .delivered(0, 0)
            .iter()
            .map(|d| d.key.as_deref().map(str::to_owned))
            .collect();
        assert_eq!(
            keys,
            [
                Some("jobs-1".into()),
                Some("jobs-2".into()),
                Some("jobs-3".into())
            ],
            "{dialect:?}"
        );
    }
}

/// "Then it takes the row while the row is still claimable: the take counts the attempt and
/// reads the row, and it commits, so a crash spends an attempt."
#[test]
fn advisory_take_counts_the_attempt_and_commits_before_delivery() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
        let d = only(sim.delivered(0, 0));
        assert_eq!(d.attempt, Some(1), "{dialect:?}");
        let conn = sim.conn_of(0, 1);
        let ops = sim.ops_on(0, conn, 0);
        assert_eq!(
            ops[ops.len() - take_ops(dialect).len()..],
            take_ops(dialect)
        );
        assert_eq!(sim.row(1).attempt, 1, "{dialect:?}: counted");
        assert!(
            !sim.db.sessions.values().any(|s| s.in_tx),
            "{dialect:?}: committed"
        );
        sim.crash(0);
        assert_eq!(
            sim.row(1).attempt,
            1,
            "{dialect:?}: the crash spent the attempt"
        );
        let second = sim.spawn();
        sim.run();
        let again = only(sim.delivered(second, 0));
        assert_eq!(again.row, Some(1), "{dialect:?}: the row returns at once");
        assert_eq!(again.attempt, Some(2), "{dialect:?}");
    }
}

/// "Then it takes the row while the row is still claimable": a candidate settled meanwhile is
/// not taken; its key is unlocked and the next candidate taken.
#[test]
fn advisory_take_passes_over_a_row_no_longer_claimable() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, advisory(), 1);
        sim.insert(0);
        sim.insert(1);
        sim.spawn();
        let take = sim.run_until(0, |c| kind_of(c) == Some(take_kind(dialect)));
        // Another process settled row 1 between the candidates and the take.
        sim.db.rows.remove(&1);
        let mark = sim.mark();
        sim.run();
        let mut expected = vec![Exec(take_kind(dialect)), Exec(StatementKind::Unlock)];
        expected.push(Exec(StatementKind::TryLock));
        expected.extend(take_ops(dialect));
        assert_eq!(sim.ops_on(0, take.conn, mark), expected, "{dialect:?}");
        let unlock = only(sim.runs_of(0, mark, StatementKind::Unlock));
        assert_eq!(unlock.bind(Arg::Key), lock_arg(dialect, "jobs-0"));
        let d = only(sim.delivered(0, 0));
        assert_eq!((d.row, d.attempt), (Some(2), Some(1)), "{dialect:?}");
        assert_eq!(
            sim.db.advisory.keys().cloned().collect::<Vec<_>>(),
            [lock_arg(dialect, "jobs-1")],
            "{dialect:?}: only the taken row's key is held"
        );
    }
}

/// "The connection that holds the delivery keeps the lock, and no transaction stays open while
/// the handler runs."
#[test]
fn advisory_no_transaction_is_open_while_the_handler_runs() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 2, &[0, 1]);
        sim.advance(Duration::from_secs(30));
        let expected: &[i64] = if dialect == Dialect::Sqlite {
            &[1]
        } else {
            &[1, 2]
        };
        assert_eq!(sim.delivered_rows(0, 0), expected, "{dialect:?}");
        assert_eq!(sim.executed(StatementKind::Begin), 0, "{dialect:?}");
        assert!(sim.db.sessions.values().all(|s| !s.in_tx), "{dialect:?}");
        assert!(sim.db.row_locks.is_empty());
        if dialect != Dialect::Sqlite {
            for (row, key) in [(1, "jobs-0"), (2, "jobs-1")] {
                let sess = sim.sess_of(0, sim.conn_of(0, row));
                assert_eq!(
                    sim.db
                        .advisory
                        .get(&lock_arg(dialect, key))
                        .map(|(s, _)| *s),
                    Some(sess),
                    "{dialect:?}: the delivery's connection keeps the lock"
                );
            }
        }
    }
}

/// "A settlement runs its statement on that connection, where it commits on its own; then the
/// lock is released and the connection goes back to the pool."
#[test]
fn advisory_ack_runs_the_settle_statement_then_unlock_then_release() {
    for dialect in ALL {
        {
            let outcome = Outcome::Ack;
            let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
            let delivery = sim.delivery(0, 1);
            let conn = sim.conn_of(0, 1);
            let mark = sim.mark();
            sim.settle(0, delivery, outcome);
            sim.run();
            let expected = if dialect == Dialect::Sqlite {
                vec![delete(false), Release]
            } else {
                vec![delete(false), Exec(StatementKind::Unlock), Release]
            };
            assert_eq!(
                sim.ops_on(0, conn, mark),
                expected,
                "{dialect:?} {outcome:?}"
            );
            if dialect != Dialect::Sqlite {
                let unlock = only(sim.runs_of(0, mark, StatementKind::Unlock));
                assert_eq!(unlock.bind(Arg::Key), lock_arg(dialect, "jobs-0"));
                assert_eq!(unlock.reply, bool_reply(true));
            }
            assert!(
                sim.events(0, mark)
                    .contains(&Event::Settled { delivery, outcome })
            );
            assert!(!sim.db.rows.contains_key(&1), "{dialect:?}");
            assert!(sim.db.advisory.is_empty());
            assert_eq!(sim.procs[0].broker.held_connections(), 0);
        }
    }
}

/// "retry() runs no statement: the claim counted the attempt, and the release returns the
/// row."
#[test]
fn advisory_retry_runs_no_statement_and_the_row_returns() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Retry);
        sim.run();
        let expected = if dialect == Dialect::Sqlite {
            vec![Release]
        } else {
            vec![Exec(StatementKind::Unlock), Release]
        };
        assert_eq!(sim.ops_on(0, conn, mark), expected, "{dialect:?}");
        let sess = sim.procs[0].conns.get(&conn).copied();
        assert_eq!(sess, None, "{dialect:?}: the connection went back");
        // The row returns (at once where the database holds the keys, after a poll on
        // SQLite), its attempt counted by the claim alone.
        sim.advance(POLL);
        let again = only(sim.delivered(0, mark));
        assert_eq!(again.row, Some(1), "{dialect:?}: the row returns");
        assert_eq!(again.attempt, Some(2), "{dialect:?}");
        assert_eq!(sim.row(1).attempt, 2, "{dialect:?}");
    }
}

/// A retry takes effect (the release returns the row): the runtime hears so, as it does in the
/// row lock and lease forms.
#[test]
fn advisory_retry_is_reported_settled_like_the_other_forms() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Retry);
        sim.run();
        assert!(
            sim.events(0, mark).contains(&Event::Settled {
                delivery,
                outcome: Outcome::Retry
            }),
            "{dialect:?}: {:?}",
            sim.events(0, mark)
        );
    }
}

/// "A delivery dropped unsettled releases its lock and closes its connection ..., and its row
/// returns."
#[test]
fn advisory_dropped_delivery_unlocks_and_closes_its_connection() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let sess = sim.sess_of(0, conn);
        let mark = sim.mark();
        sim.drop_delivery(0, delivery);
        sim.run();
        let expected = if dialect == Dialect::Sqlite {
            vec![Close]
        } else {
            vec![Exec(StatementKind::Unlock), Close]
        };
        assert_eq!(sim.ops_on(0, conn, mark), expected, "{dialect:?}");
        assert!(sim.events(0, mark).contains(&Event::Returned { delivery }));
        assert!(
            !sim.db.sessions[&sess].alive,
            "{dialect:?}: the session ended"
        );
        assert!(sim.db.advisory.values().all(|(s, _)| *s != sess));
        sim.advance(POLL);
        let again = only(sim.delivered(0, mark));
        assert_eq!(
            (again.row, again.attempt),
            (Some(1), Some(2)),
            "{dialect:?}"
        );
    }
}

/// "... within five seconds": an unlock that never answers does not keep the lock; the
/// connection is closed at `DROP_GRACE`, not before.
#[test]
fn advisory_dropped_delivery_whose_unlock_never_answers_is_closed_within_five_seconds() {
    assert_eq!(DROP_GRACE, Duration::from_secs(5));
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let sess = sim.sess_of(0, conn);
        sim.advance(Duration::from_millis(300));
        let dropped_at = sim.now;
        sim.hook(|_, c| match kind_of(c) {
            Some(StatementKind::Unlock) => Intercept::Hold,
            _ => Intercept::Run,
        });
        let mark = sim.mark();
        sim.drop_delivery(0, delivery);
        sim.run();
        assert_eq!(sim.procs[0].held.len(), 1, "the unlock hangs");
        assert_eq!(
            sim.timeout(0),
            Some(dropped_at.plus(DROP_GRACE)),
            "{dialect:?}"
        );
        sim.advance_to(just_before(dropped_at.plus(DROP_GRACE)));
        assert!(
            sim.ops_on(0, conn, mark).is_empty(),
            "{dialect:?}: not before"
        );
        assert_eq!(sim.db.advisory.len(), 1);
        sim.advance_to(dropped_at.plus(DROP_GRACE));
        assert_eq!(sim.ops_on(0, conn, mark), [Close], "{dialect:?}");
        assert!(
            !sim.db.sessions[&sess].alive,
            "{dialect:?}: the session ended"
        );
        assert!(
            sim.db.advisory.values().all(|(s, _)| *s != sess),
            "{dialect:?}: and its lock with it"
        );
        assert!(sim.events(0, mark).contains(&Event::Returned { delivery }));
        // The hung unlock answers at last, cut short by the close.
        sim.hook = None;
        for command in sim.take_held(0) {
            sim.run_command(0, command);
        }
        sim.run();
        assert!(!sim.procs[0].conns.contains_key(&conn));
        // The row returns: the freed worker takes it again.
        sim.advance(POLL);
        assert_eq!(sim.procs[0].broker.held_connections(), sim.in_work(0));
        let again = only(sim.delivered(0, mark));
        assert_eq!(
            (again.row, again.attempt),
            (Some(1), Some(2)),
            "{dialect:?}"
        );
    }
}

/// "Each delivery in work holds a connection of its own until it settles, and a batch holds
/// one row per key."
#[test]
fn advisory_batch_holds_one_row_per_key() {
    for dialect in SERVERS {
        let sim = Sim::start(dialect, advisory(), 5, &[0, 0, 1, 1, 2, 0]);
        let delivered = sim.delivered(0, 0);
        let rows: Vec<Option<i64>> = delivered.iter().map(|d| d.row).collect();
        assert_eq!(rows, [Some(1), Some(3), Some(5)], "{dialect:?}");
        let keys: BTreeSet<Option<&str>> = delivered.iter().map(|d| d.key.as_deref()).collect();
        assert_eq!(keys.len(), 3);
        assert_eq!(sim.procs[0].broker.held_connections(), 3, "{dialect:?}");
        assert_eq!(sim.in_work(0), 3);
    }
}

/// "MySQL and MariaDB lock a name with GET_LOCK: the database's name, a dot and the key."
#[test]
fn advisory_mysql_lock_names_are_the_database_dot_the_key() {
    for dialect in [Dialect::MySql, Dialect::MariaDb] {
        let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
        let lock = only(sim.runs_of(0, sim.ready_at(0), StatementKind::TryLock));
        assert_eq!(lock.bind(Arg::Key), Value::Text("test.jobs-0".into()));
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        let unlock = only(sim.runs_of(0, mark, StatementKind::Unlock));
        assert_eq!(unlock.bind(Arg::Key), Value::Text("test.jobs-0".into()));
    }
}

/// "... or its SHA-256 past 64 characters."
#[test]
fn advisory_mysql_lock_names_past_64_characters_are_their_sha256() {
    for dialect in [Dialect::MySql, Dialect::MariaDb] {
        // 64 characters: the name itself.
        let sim = Sim::start(dialect, advisory_keyed(KEY_64), 1, &[7]);
        let key = only(sim.delivered(0, 0)).key.expect("a key").to_string();
        let name = format!("test.{key}");
        assert_eq!(name.chars().count(), 64);
        let lock = only(sim.runs_of(0, sim.ready_at(0), StatementKind::TryLock));
        assert_eq!(lock.bind(Arg::Key), Value::Text(name), "{dialect:?}");
        // 65 characters: its SHA-256, in lowercase hex.
        let mut sim = Sim::start(dialect, advisory_keyed(KEY_65), 1, &[7]);
        let key = only(sim.delivered(0, 0)).key.expect("a key").to_string();
        let name = format!("test.{key}");
        assert_eq!(name.chars().count(), 65);
        let hashed = sha256_hex(&name);
        assert_eq!(hashed.len(), 64);
        let lock = only(sim.runs_of(0, sim.ready_at(0), StatementKind::TryLock));
        assert_eq!(
            lock.bind(Arg::Key),
            Value::Text(hashed.clone()),
            "{dialect:?}"
        );
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        let unlock = only(sim.runs_of(0, mark, StatementKind::Unlock));
        assert_eq!(unlock.bind(Arg::Key), Value::Text(hashed), "{dialect:?}");
        assert!(sim.db.advisory.is_empty());
    }
}

/// "Postgres locks a 64-bit hash of the key, and a lock lives in the session that took it."
#[test]
fn advisory_postgres_locks_a_64_bit_hash_of_the_key_in_the_session() {
    let sim = Sim::start(Dialect::Postgres, advisory(), 1, &[0]);
    let digest = Sha256::digest(b"jobs-0");
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let hash = Value::Int(i64::from_be_bytes(first));
    let lock = only(sim.runs_of(0, sim.ready_at(0), StatementKind::TryLock));
    assert_eq!(lock.bind(Arg::Key), hash);
    let sess = sim.sess_of(0, sim.conn_of(0, 1));
    assert_eq!(sim.db.advisory.get(&hash).map(|(s, _)| *s), Some(sess));
}

/// "SQLite has no locks a session holds, so the process keeps the keys in work ... a
/// subscription has one delivery in work at a time."
#[test]
fn advisory_sqlite_keeps_keys_in_process_with_one_delivery_in_work() {
    let mut sim = Sim::start(Dialect::Sqlite, advisory(), 3, &[0, 1, 2]);
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    assert!(
        matches!(&sim.statements(0).form, FormStatements::Advisory(f) if f.keys == KeyLocks::Registry),
        "SQLite keeps the keys in the process: no lock statements"
    );
    sim.advance(POLL * 5);
    assert_eq!(
        sim.delivered_rows(0, 0),
        [1],
        "one delivery in work at a time"
    );
    assert_eq!(sim.in_work(0), 1);
    assert_eq!(sim.executed(StatementKind::TryLock), 0);
    assert_eq!(sim.executed(StatementKind::Unlock), 0);
    // Each claim reads the first due row alone.
    for claim in sim.runs_of(0, 0, StatementKind::Candidates) {
        assert_eq!(claim.bind(Arg::Limit), Value::Int(1));
    }
    // Still one connection per delivery in work.
    assert_eq!(sim.procs[0].broker.held_connections(), 1);
}

/// "... and with workers(n) each next row waits up to a poll interval." A claim while the first
/// due row is in work takes nothing, and the next waits for the poll; the settlement that
/// releases the key starts the next claim at once, so the next row waits no longer than it must.
#[test]
fn advisory_sqlite_next_row_waits_up_to_a_poll_interval() {
    let mut sim = Sim::start(Dialect::Sqlite, advisory(), 3, &[0, 1, 2]);
    let start = sim.mark();
    sim.advance(Duration::from_millis(2500));
    // While row 1 is in work, the subscription claims nothing: a claim would read row 1 alone
    // and take nothing.
    assert!(sim.runs_of(0, start, StatementKind::Candidates).is_empty());
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    let delivery = sim.delivery(0, 1);
    let mark = sim.mark();
    let settled_at = sim.now;
    sim.settle(0, delivery, Outcome::Ack);
    sim.run();
    assert_eq!(
        sim.delivered_rows(0, mark),
        [2],
        "the release of the key let the next claim take the next row"
    );
    assert_eq!(
        sim.delivered_at(0, mark, 2),
        Some(settled_at),
        "no wait for the poll"
    );
    assert_eq!(sim.in_work(0), 1, "still one delivery in work at a time");
    // Row 2 in work: row 3 waits for its settlement, however many polls pass.
    let mark = sim.mark();
    sim.advance(POLL * 3);
    assert!(sim.delivered_rows(0, mark).is_empty());
    let delivery = sim.delivery(0, 2);
    sim.settle(0, delivery, Outcome::Ack);
    sim.run();
    assert_eq!(sim.delivered_rows(0, mark), [3]);
}

// ===== Custom locks: custom(lock, unlock) =====

/// "custom(lock, unlock) hands the lock and the release of each key to the service's SQL."
#[test]
fn custom_lock_runs_the_services_lock_and_unlock_instead_of_statements() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, custom(), 1, &[0]);
        let conn = sim.conn_of(0, 1);
        let mut claim = vec![
            Acquire,
            Exec(StatementKind::Candidates),
            Op::Lock("jobs-0".into()),
        ];
        claim.extend(take_ops(dialect));
        assert_eq!(sim.ops_on(0, conn, 0), claim, "{dialect:?}");
        assert_eq!(sim.db.custom.get("jobs-0"), Some(&sim.sess_of(0, conn)));
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.ops_on(0, conn, mark),
            [delete(false), Op::Unlock("jobs-0".into()), Release],
            "{dialect:?}"
        );
        assert_eq!(sim.executed(StatementKind::TryLock), 0, "{dialect:?}");
        assert_eq!(sim.executed(StatementKind::Unlock), 0, "{dialect:?}");
        assert!(sim.db.custom.is_empty());
        assert!(sim.db.advisory.is_empty());
    }
}

/// "lock tries the key without waiting and answers whether it took it": false takes nothing.
#[test]
fn custom_lock_answering_false_takes_nothing() {
    for dialect in ALL {
        let mut sim = Sim::new(dialect, custom(), 2);
        sim.insert(0);
        sim.insert(1);
        let other = sim.db.acquire(OTHER_SYSTEM);
        sim.db.custom.insert("jobs-0".into(), other);
        sim.spawn();
        sim.run();
        sim.advance(POLL * 3);
        let locks: Vec<(Op, Reply<i64>)> = sim
            .runs(0, 0)
            .iter()
            .filter(|r| matches!(r.op, Op::Lock(_)))
            .map(|r| (r.op.clone(), r.reply.clone()))
            .collect();
        assert!(locks.len() >= 2, "{dialect:?}: every claim asks: {locks:?}");
        assert!(
            locks
                .iter()
                .all(|l| *l == (Op::Lock("jobs-0".into()), Reply::Bool(false))),
            "{dialect:?}: {locks:?}"
        );
        assert!(sim.delivered(0, 0).is_empty(), "{dialect:?}");
        assert_eq!(sim.executed(take_kind(dialect)), 0, "{dialect:?}: no take");
        assert_eq!(sim.row(1).attempt, 0);
        assert_eq!(
            sim.row(2).attempt,
            0,
            "{dialect:?}: the first due rows alone"
        );
        assert_eq!(sim.procs[0].broker.held_connections(), 0);
        // The service's lock lets go: the next claim takes the row.
        sim.db.custom.clear();
        sim.advance(POLL);
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
    }
}

/// "unlock answers whether the session held the key; an answer of false ... closes the
/// connection, which ends the session and its locks."
#[test]
fn custom_unlock_answering_false_closes_the_connection() {
    for dialect in ALL {
        for outcome in [Outcome::Ack, Outcome::Retry] {
            let mut sim = Sim::start(dialect, custom(), 1, &[0]);
            let delivery = sim.delivery(0, 1);
            let conn = sim.conn_of(0, 1);
            let sess = sim.sess_of(0, conn);
            // The service's state lost the key meanwhile.
            sim.db.custom.clear();
            let mark = sim.mark();
            sim.settle(0, delivery, outcome);
            sim.run();
            let mut expected = Vec::new();
            if outcome == Outcome::Ack {
                expected.push(delete(false));
            }
            expected.extend([Op::Unlock("jobs-0".into()), Close]);
            assert_eq!(
                sim.ops_on(0, conn, mark),
                expected,
                "{dialect:?} {outcome:?}"
            );
            assert!(
                !sim.db.sessions[&sess].alive,
                "{dialect:?}: the session ended"
            );
            assert!(sim.db.custom.values().all(|s| *s != sess));
            assert!(!sim.procs[0].conns.contains_key(&conn));
        }
    }
}

/// "... or an error, closes the connection."
#[test]
fn custom_unlock_error_closes_the_connection() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, custom(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let sess = sim.sess_of(0, conn);
        sim.hook(|_, c| match c.action {
            Action::Unlock { .. } => Intercept::Answer(Reply::Failed(DbError::new(
                ErrorKind::Other,
                "the service's unlock failed",
            ))),
            _ => Intercept::Run,
        });
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Retry);
        sim.run();
        assert_eq!(
            sim.ops_on(0, conn, mark),
            [Op::Unlock("jobs-0".into()), Close],
            "{dialect:?}"
        );
        assert!(!sim.db.sessions[&sess].alive);
        assert!(
            sim.db.custom.values().all(|s| *s != sess),
            "{dialect:?}: the session's locks ended"
        );
        assert!(
            sim.events(0, mark)
                .iter()
                .any(|e| matches!(e, Event::Error { .. })),
            "{dialect:?}"
        );
        // The row returns.
        sim.hook = None;
        sim.advance(POLL);
        let again = only(sim.delivered(0, mark));
        assert_eq!(
            (again.row, again.attempt),
            (Some(1), Some(2)),
            "{dialect:?}"
        );
    }
}

/// An unlock inside a claim (the row was no longer claimable) that answers false closes the
/// claim's connection too.
#[test]
fn custom_unlock_answering_false_in_a_claim_closes_its_connection() {
    for dialect in ALL {
        let mut sim = Sim::new(dialect, custom(), 1);
        sim.insert(0);
        sim.spawn();
        let take = sim.run_until(0, |c| kind_of(c) == Some(take_kind(dialect)));
        // Between the candidates and the take, the row went away and the key with it.
        sim.db.rows.remove(&1);
        sim.db.custom.clear();
        let mark = sim.mark();
        sim.run();
        assert_eq!(
            sim.ops_on(0, take.conn, mark),
            [Exec(take_kind(dialect)), Op::Unlock("jobs-0".into()), Close],
            "{dialect:?}"
        );
        assert_eq!(sim.procs[0].broker.held_connections(), 0);
        assert!(sim.delivered(0, 0).is_empty());
    }
}

/// "The dialect still selects the candidates and takes each row, so the claim keeps its order
/// and counts the attempt as before."
#[test]
fn custom_lock_keeps_the_claim_order_and_counts_the_attempt() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, custom(), 1, &[5, 3]);
        let d = only(sim.delivered(0, 0));
        assert_eq!(d.row, Some(1), "{dialect:?}: the first in claim order");
        assert_eq!(d.key.as_deref(), Some("jobs-5"));
        assert_eq!(d.attempt, Some(1), "{dialect:?}");
        assert_eq!(sim.row(1).attempt, 1);
        assert_eq!(sim.executed(StatementKind::Candidates), 1);
        assert_eq!(sim.executed(take_kind(dialect)), 1, "{dialect:?}");
        // The take committed: a crash spends the attempt.
        sim.crash(0);
        let second = sim.spawn();
        sim.run();
        let again = only(sim.delivered(second, 0));
        assert_eq!(
            (again.row, again.attempt),
            (Some(1), Some(2)),
            "{dialect:?}"
        );
    }
}

/// "The process keeps no registry of keys for such a table, on SQLite too: the service's lock
/// decides."
#[test]
fn custom_lock_keeps_no_registry_of_keys_on_sqlite_either() {
    let mut sim = Sim::start(Dialect::Sqlite, custom(), 2, &[0, 0]);
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    sim.advance(POLL * 3);
    // The key in work is asked of the service's lock again by every claim, not skipped.
    let asks = sim
        .runs(0, 0)
        .iter()
        .filter(|r| r.op == Op::Lock("jobs-0".into()))
        .count();
    assert!(asks >= 3, "{asks} locks asked");
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    // Where the service's lock says yes, the claim takes the row: nothing in the process
    // stands in the way. (Here the service releases the key behind the delivery's back.)
    let delivery = sim.delivery(0, 1);
    sim.settle(0, delivery, Outcome::Ack);
    sim.run();
    sim.advance(POLL);
    assert_eq!(sim.delivered_rows(0, 0), [1, 2]);
    // A SQLite table of the registry form never asks.
    let mut registry = Sim::start(Dialect::Sqlite, advisory(), 2, &[0, 0]);
    registry.advance(POLL * 3);
    assert!(
        !registry
            .runs(0, 0)
            .iter()
            .any(|r| matches!(r.op, Op::Lock(_)))
    );
}

/// "A claim reads the first due rows alone and takes nothing while their keys are held, so the
/// next row waits up to a poll interval."
#[test]
fn custom_lock_next_row_waits_up_to_a_poll_interval() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, custom(), 3, &[0, 1, 2]);
        sim.advance(Duration::from_millis(3500));
        assert_eq!(
            sim.delivered_rows(0, 0),
            [1],
            "{dialect:?}: rows 2 and 3 have free keys, but are not the first due"
        );
        for claim in sim.runs_of(0, 0, StatementKind::Candidates) {
            assert_eq!(claim.bind(Arg::Limit), Value::Int(1), "{dialect:?}");
        }
        // Each poll's claim meanwhile found the first due row's key held, and took nothing.
        assert!(
            sim.runs_of(0, 0, StatementKind::Candidates).len() >= 3,
            "{dialect:?}"
        );
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        let settled_at = sim.now;
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        // The unlock that answered true starts the next claim at once.
        assert_eq!(sim.delivered_rows(0, mark), [2], "{dialect:?}");
        assert_eq!(
            sim.delivered_at(0, mark, 2),
            Some(settled_at),
            "{dialect:?}"
        );
    }
}

// ===== Shutdown =====

/// "Then it shuts the broker down: the claim loops stop."
#[test]
fn shutdown_starts_no_claim() {
    for desc in [row_lock(), lease(), advisory()] {
        let mut sim = Sim::start(Dialect::Postgres, desc, 1, &[]);
        sim.shutdown(0);
        sim.run();
        let mark = sim.mark();
        sim.insert(0);
        sim.wake(0);
        sim.run();
        sim.advance(Duration::from_secs(60));
        assert!(sim.ops(0, mark).is_empty(), "{:?}", desc.form());
        assert_eq!(sim.timeout(0), None);
        assert!(sim.delivered(0, 0).is_empty());
        assert_eq!(only(sim.closed(0)).1, 0);
    }
}

/// "A claim the runtime cut short ... may still run on the server; shutdown waits until the
/// server has ended it and rolled its transaction back, so the stopped service holds no lock
/// on the table."
#[test]
fn shutdown_lets_a_row_lock_claim_in_flight_finish_and_rolls_it_back() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, row_lock(), 1);
        sim.insert(0);
        sim.spawn();
        let lock = sim.run_until(0, locks_by_id);
        sim.shutdown(0);
        assert!(
            sim.closed(0).is_empty(),
            "{dialect:?}: the claim is in flight"
        );
        let mark = sim.mark();
        sim.run();
        let ops = sim.ops_on(0, lock.conn, mark);
        assert_eq!(
            ops[ops.len() - 2..],
            [Exec(StatementKind::Rollback), Release],
            "{dialect:?}: {ops:?}"
        );
        assert!(sim.delivered(0, 0).is_empty(), "{dialect:?}: not delivered");
        assert!(
            !sim.events(0, 0)
                .iter()
                .any(|e| matches!(e, Event::Returned { .. }))
        );
        assert!(sim.db.row_locks.is_empty());
        assert!(sim.db.held_by(sim.procs[0].process).is_empty());
        assert_eq!(
            sim.row(1).attempt,
            1,
            "{dialect:?}: the attempt was counted and committed before the lock: it is spent"
        );
        assert_eq!(only(sim.closed(0)), (ClosedCounts::default(), 0));
    }
}

/// A claim in flight in the advisory lock form: what it took is unlocked, not delivered.
#[test]
fn shutdown_lets_an_advisory_claim_in_flight_finish_and_unlocks_what_it_took() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, advisory(), 1);
        sim.insert(0);
        sim.spawn();
        let take = sim.run_until(0, |c| kind_of(c) == Some(take_kind(dialect)));
        sim.shutdown(0);
        assert!(sim.closed(0).is_empty());
        let mark = sim.mark();
        sim.run();
        let ops = sim.ops_on(0, take.conn, mark);
        assert_eq!(
            ops[ops.len() - 2..],
            [Exec(StatementKind::Unlock), Release],
            "{dialect:?}: {ops:?}"
        );
        assert!(sim.delivered(0, 0).is_empty(), "{dialect:?}");
        assert!(sim.db.advisory.is_empty(), "{dialect:?}");
        let (counts, held) = only(sim.closed(0));
        assert_eq!(counts.locks_released, 1, "{dialect:?}");
        assert_eq!(held, 0);
    }
}

/// A claim in flight in the lease form: the lease it wrote is released, not delivered.
#[test]
fn shutdown_lets_a_lease_claim_in_flight_finish_and_releases_the_lease() {
    for dialect in ALL {
        let mut sim = Sim::new(dialect, lease(), 1);
        sim.insert(0);
        sim.spawn();
        sim.run_until(0, |c| kind_of(c) == Some(lease_claim_kind(dialect)));
        sim.shutdown(0);
        assert!(sim.closed(0).is_empty());
        let mark = sim.mark();
        sim.run();
        assert!(
            sim.ops(0, mark)
                .contains(&Exec(StatementKind::ReleaseLease)),
            "{dialect:?}: {:?}",
            sim.ops(0, mark)
        );
        assert!(sim.delivered(0, 0).is_empty(), "{dialect:?}");
        assert_eq!(
            sim.row(1).locked_until,
            None,
            "{dialect:?}: the row is free"
        );
        assert_eq!(only(sim.closed(0)), (ClosedCounts::default(), 0));
        let other = sim.spawn();
        sim.run();
        assert_eq!(sim.delivered_rows(other, 0), [1], "{dialect:?}: at once");
    }
}

/// "In the advisory lock form the broker releases the lock of every delivery in work": the
/// counts say how many.
#[test]
fn shutdown_unlocks_advisory_deliveries_in_work_and_counts_them() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 2, &[0, 1]);
        let rows = sim.delivered(0, 0);
        // SQLite has one delivery in work at a time.
        let in_work = if dialect == Dialect::Sqlite { 1 } else { 2 };
        assert_eq!(rows.len(), in_work, "{dialect:?}");
        let mark = sim.mark();
        sim.shutdown(0);
        sim.run();
        for d in &rows {
            let conn = sim.conn_of(0, d.row.expect("a row"));
            let expected = if dialect == Dialect::Sqlite {
                vec![Release]
            } else {
                vec![Exec(StatementKind::Unlock), Release]
            };
            assert_eq!(sim.ops_on(0, conn, mark), expected, "{dialect:?}");
            assert!(sim.events(0, mark).contains(&Event::Returned {
                delivery: d.delivery
            }));
        }
        assert!(sim.db.advisory.is_empty());
        assert!(sim.db.held_by(sim.procs[0].process).is_empty());
        let (counts, held) = only(sim.closed(0));
        assert_eq!(
            counts,
            ClosedCounts {
                locks_released: in_work,
                connections_closed: 0
            },
            "{dialect:?}"
        );
        assert_eq!(held, 0);
    }
}

/// "... whose locks_released and connections_closed count what the shutdown did to the
/// advisory locks": an unlock answering false, or failing, closes the connection.
#[test]
fn shutdown_counts_an_unlock_answering_false_as_a_closed_connection() {
    let answers = [
        bool_reply(false),
        Reply::Failed(DbError::new(ErrorKind::Other, "unlock failed")),
    ];
    for dialect in SERVERS {
        for answer in answers.clone() {
            let mut sim = Sim::start(dialect, advisory(), 2, &[0, 1]);
            let second = sim.conn_of(0, 2);
            let key = lock_arg(dialect, "jobs-1");
            sim.hook(move |_, c| match &c.action {
                Action::Execute { statement, binds }
                    if statement.kind == StatementKind::Unlock && binds[0] == key =>
                {
                    Intercept::Answer(answer.clone())
                }
                _ => Intercept::Run,
            });
            let mark = sim.mark();
            sim.shutdown(0);
            sim.run();
            assert_eq!(
                sim.ops_on(0, second, mark),
                [Exec(StatementKind::Unlock), Close],
                "{dialect:?}"
            );
            assert!(
                sim.db.advisory.is_empty(),
                "{dialect:?}: the close ended the lock"
            );
            let (counts, held) = only(sim.closed(0));
            assert_eq!(
                counts,
                ClosedCounts {
                    locks_released: 1,
                    connections_closed: 1
                },
                "{dialect:?}"
            );
            assert_eq!(held, 0);
        }
    }
    // The service's own unlock answering false counts the same.
    let mut sim = Sim::start(Dialect::Postgres, custom(), 1, &[0]);
    sim.db.custom.clear();
    sim.shutdown(0);
    sim.run();
    assert_eq!(
        only(sim.closed(0)).0,
        ClosedCounts {
            locks_released: 0,
            connections_closed: 1
        }
    );
}

/// "A delivery in work in the lease form keeps its lease, which runs out unless the delivery
/// settles first ... A settlement after the shutdown that needs a new connection, as in the
/// lease form, then fails."
#[test]
fn shutdown_leaves_lease_deliveries_with_their_lease_and_settling_after_fails_closed() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let before = sim.row(1).clone();
        let mark = sim.mark();
        sim.shutdown(0);
        sim.run();
        assert!(
            sim.ops(0, mark).is_empty(),
            "{dialect:?}: no statement runs"
        );
        assert_eq!(only(sim.closed(0)), (ClosedCounts::default(), 0));
        assert!(
            !sim.events(0, mark)
                .iter()
                .any(|e| matches!(e, Event::Returned { .. })),
            "{dialect:?}: the lease keeps the row"
        );
        // The extension stopped too.
        sim.advance(EXTEND * 2);
        assert!(sim.ops(0, mark).is_empty(), "{dialect:?}");
        assert_eq!(sim.row(1), &before, "{dialect:?}: the lease stays");
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.events(0, mark),
            [Event::SettleFailed {
                delivery,
                error: SettleError::Closed
            }],
            "{dialect:?}"
        );
        assert!(sim.ops(0, mark).is_empty());
        assert!(sim.db.rows.contains_key(&1));
        // The row returns when the lease runs out.
        sim.advance_to(T0.plus(LEASE_TIME));
        let other = sim.spawn();
        sim.run();
        assert_eq!(sim.delivered_rows(other, 0), [1], "{dialect:?}");
    }
}

/// Row lock deliveries in work are rolled back at shutdown, and their rows return.
#[test]
fn shutdown_rolls_back_row_lock_deliveries_in_work() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 2, &[0, 1]);
        let mark = sim.mark();
        sim.shutdown(0);
        sim.run();
        for row in [1, 2] {
            let conn = sim.conn_of(0, row);
            assert_eq!(
                sim.ops_on(0, conn, mark),
                [Exec(StatementKind::Rollback), Release],
                "{dialect:?}"
            );
            let delivery = sim.delivery(0, row);
            assert!(sim.events(0, mark).contains(&Event::Returned { delivery }));
        }
        assert!(sim.db.row_locks.is_empty());
        assert!(sim.db.held_by(sim.procs[0].process).is_empty());
        assert_eq!(only(sim.closed(0)), (ClosedCounts::default(), 0));
    }
}

/// "... and waits for the settlements in flight, so no lock of the broker is left": `Closed`
/// comes only after their replies.
#[test]
fn shutdown_waits_for_the_settlements_in_flight() {
    for (dialect, desc) in [
        (Dialect::Postgres, row_lock()),
        (Dialect::MySql, row_lock()),
        (Dialect::Postgres, advisory()),
        (Dialect::MariaDb, advisory()),
        (Dialect::Sqlite, advisory()),
        (Dialect::Postgres, lease()),
        (Dialect::MySql, lease()),
    ] {
        let form = desc.form();
        let mut sim = Sim::start(dialect, desc, 1, &[0]);
        let delivery = sim.delivery(0, 1);
        sim.settle(0, delivery, Outcome::Ack);
        // The settlement's first command is in flight, unanswered.
        assert!(!sim.procs[0].queue.is_empty());
        sim.shutdown(0);
        assert!(sim.closed(0).is_empty(), "{dialect:?} {form:?}: waits");
        sim.run();
        let settled = sim
            .event_index(0, |e| {
                *e == Event::Settled {
                    delivery,
                    outcome: Outcome::Ack,
                }
            })
            .unwrap_or_else(|| panic!("{dialect:?} {form:?}: the settlement took effect"));
        let closed = sim
            .event_index(0, |e| matches!(e, Event::Closed(_)))
            .expect("closed");
        assert!(settled < closed, "{dialect:?} {form:?}");
        assert!(!sim.db.rows.contains_key(&1), "{dialect:?} {form:?}");
        let (counts, held) = only(sim.closed(0));
        assert_eq!(counts, ClosedCounts::default(), "{dialect:?} {form:?}");
        assert_eq!(held, 0);
        assert!(sim.db.held_by(sim.procs[0].process).is_empty());
    }
}

/// "A handle taken before shutdown, such as a repository publisher, refuses every publish
/// afterwards with SqlxBrokerError::Closed, and never writes a row past the shutdown."
#[test]
fn publish_after_shutdown_is_refused_and_writes_nothing() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[]);
        let before_publish = sim.mark();
        let publish = sim.publish(0, 3).expect("publishes before the shutdown");
        sim.run();
        assert_eq!(
            sim.ops(0, before_publish)[..3],
            [Acquire, Exec(StatementKind::Publish), Release],
            "{dialect:?}"
        );
        assert!(sim.events(0, before_publish).contains(&Event::Published {
            publish,
            result: Ok(Published::default())
        }));
        sim.shutdown(0);
        sim.run();
        let rows = sim.db.rows.clone();
        let mark = sim.mark();
        assert_eq!(sim.publish(0, 4), Err(BrokerError::Closed), "{dialect:?}");
        sim.run();
        assert!(sim.ops(0, mark).is_empty(), "{dialect:?}");
        assert_eq!(sim.db.rows, rows, "{dialect:?}: nothing written");
        assert_eq!(sim.executed(StatementKind::Publish), 1);
    }
}

/// A publish taken before the shutdown is waited for: `Closed` follows its end.
#[test]
fn shutdown_waits_for_a_publish_in_flight() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 1, &[]);
        let publish = sim.publish(0, 3).expect("publishes before the shutdown");
        sim.shutdown(0);
        assert!(sim.closed(0).is_empty(), "{dialect:?}");
        sim.run();
        let published = sim
            .event_index(0, |e| {
                *e == Event::Published {
                    publish,
                    result: Ok(Published::default()),
                }
            })
            .expect("published");
        let closed = sim
            .event_index(0, |e| matches!(e, Event::Closed(_)))
            .expect("closed");
        assert!(published < closed, "{dialect:?}");
        assert_eq!(only(sim.closed(0)).1, 0);
        assert!(
            sim.delivered(0, 0).is_empty(),
            "{dialect:?}: no claim for it"
        );
    }
}

/// A shutdown while the subscription's check runs: the check is let finish, and no claim
/// starts after it; nothing announces claims that will never begin.
#[test]
fn shutdown_during_the_check_starts_no_claim_and_announces_none() {
    for dialect in ALL {
        let desc = if dialect == Dialect::Sqlite {
            lease()
        } else {
            row_lock()
        };
        let mut sim = Sim::new(dialect, desc, 1);
        sim.insert(0);
        sim.spawn();
        sim.shutdown(0);
        assert!(
            sim.closed(0).is_empty(),
            "{dialect:?}: the check is in flight"
        );
        sim.run();
        sim.advance(Duration::from_secs(10));
        assert!(sim.delivered(0, 0).is_empty(), "{dialect:?}");
        assert_eq!(only(sim.closed(0)).1, 0);
        let sub = sim.procs[0].sub;
        assert!(
            !sim.events(0, 0).contains(&Event::Ready { sub }),
            "{dialect:?}: {:?}",
            sim.events(0, 0)
        );
    }
}

/// "The shutdown is complete": `Event::Closed` comes once, with no connection held.
#[test]
fn shutdown_closes_exactly_once_with_no_connection_held() {
    for (dialect, desc) in [
        (Dialect::Postgres, row_lock()),
        (Dialect::MariaDb, row_lock()),
        (Dialect::Postgres, lease()),
        (Dialect::Sqlite, lease()),
        (Dialect::MySql, advisory()),
        (Dialect::Sqlite, advisory()),
        (Dialect::Postgres, custom()),
    ] {
        let mut sim = Sim::start(dialect, desc, 2, &[0, 1, 2]);
        assert!(sim.procs[0].broker.held_connections() > 0 || desc.form() == Form::Lease);
        sim.shutdown(0);
        sim.shutdown(0);
        sim.run();
        sim.shutdown(0);
        sim.advance(Duration::from_secs(120));
        sim.shutdown(0);
        sim.run();
        let closed = sim.closed(0);
        assert_eq!(closed.len(), 1, "{dialect:?} {:?}: {closed:?}", desc.form());
        assert_eq!(closed[0].1, 0, "{dialect:?}: no connection held at Closed");
        assert!(sim.procs[0].broker.is_closed());
        assert_eq!(sim.procs[0].broker.held_connections(), 0);
        assert!(sim.db.held_by(sim.procs[0].process).is_empty());
    }
}

/// A settlement of a delivery that the shutdown is releasing (its unlock or rollback still in
/// flight) fails as one after the shutdown does: `Closed`.
#[test]
fn settle_during_the_shutdown_release_fails_closed() {
    for (dialect, desc) in [
        (Dialect::Postgres, row_lock()),
        (Dialect::Postgres, advisory()),
    ] {
        let mut sim = Sim::start(dialect, desc, 1, &[0]);
        let delivery = sim.delivery(0, 1);
        sim.shutdown(0);
        // The rollback or unlock is in flight.
        assert!(!sim.procs[0].queue.is_empty());
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        let failed: Vec<Event<i64>> = sim
            .events(0, mark)
            .into_iter()
            .filter(|e| matches!(e, Event::SettleFailed { .. }))
            .collect();
        assert_eq!(
            failed,
            [Event::SettleFailed {
                delivery,
                error: SettleError::Closed
            }],
            "{dialect:?} {:?}",
            desc.form()
        );
    }
}

/// A settlement after the shutdown ended an advisory or row lock delivery fails `Closed`.
#[test]
fn settle_after_the_shutdown_fails_closed() {
    for (dialect, desc) in [
        (Dialect::Postgres, row_lock()),
        (Dialect::MySql, advisory()),
        (Dialect::Sqlite, advisory()),
    ] {
        let mut sim = Sim::start(dialect, desc, 1, &[0]);
        let delivery = sim.delivery(0, 1);
        sim.shutdown(0);
        sim.run();
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.events(0, mark),
            [Event::SettleFailed {
                delivery,
                error: SettleError::Closed
            }],
            "{dialect:?}"
        );
        assert!(sim.ops(0, mark).is_empty());
        assert!(
            sim.db.rows.contains_key(&1),
            "{dialect:?}: the row returned, unsettled"
        );
    }
}

// ===== the check =====

/// A described column the table lacks fails the check, naming the table and the column.
#[test]
fn check_missing_column_names_the_table_and_the_column() {
    let cases = [
        (Dialect::Postgres, row_lock(), "attempt", "the attempt"),
        (
            Dialect::MySql,
            lease(),
            "locked_until",
            "the lease's `locked_until`",
        ),
        (
            Dialect::Sqlite,
            advisory(),
            "channel",
            "a part of the advisory lock key",
        ),
        (
            Dialect::MariaDb,
            lease_marked(),
            "processed_at",
            "`processed_at`",
        ),
    ];
    for (dialect, desc, column, role) in cases {
        let mut sim = Sim::new(dialect, desc, 1);
        sim.db.missing_columns = vec![column];
        sim.insert(0);
        let p = sim.spawn();
        sim.run();
        let sub = sim.procs[p].sub;
        let error = CheckError::MissingColumn {
            table: "jobs",
            column,
            role,
        };
        assert_eq!(
            sim.events(p, 0),
            [Event::CheckFailed {
                sub,
                error: error.clone()
            }],
            "{dialect:?}"
        );
        let message = error.to_string();
        assert!(message.contains("`jobs`") && message.contains(&format!("`{column}`")));
        sim.advance(Duration::from_secs(10));
        assert!(sim.delivered(p, 0).is_empty(), "{dialect:?}: no claim");
        assert_eq!(
            sim.ops(p, 0).last(),
            Some(&Release),
            "{dialect:?}: the check's connection goes back"
        );
        assert_eq!(sim.procs[p].broker.held_connections(), 0);
    }
}

/// A table that does not exist fails the check with `MissingTable`, whether the listing finds
/// no column or the database says so.
#[test]
fn check_missing_table() {
    for dialect in ALL {
        let desc = if dialect == Dialect::Sqlite {
            lease()
        } else {
            row_lock()
        };
        // The listing finds no column.
        let mut sim = Sim::new(dialect, desc, 1);
        sim.db.missing_table = true;
        let p = sim.spawn();
        sim.run();
        let sub = sim.procs[p].sub;
        let failed = Event::CheckFailed {
            sub,
            error: CheckError::MissingTable { table: "jobs" },
        };
        assert_eq!(
            sim.events(p, 0),
            std::slice::from_ref(&failed),
            "{dialect:?}"
        );
        // The database answers that the table is undefined.
        let mut sim = Sim::new(dialect, desc, 1);
        sim.hook(|_, c| match kind_of(c) {
            Some(StatementKind::ListColumns) => Intercept::Answer(Reply::Failed(DbError::new(
                ErrorKind::UndefinedTable,
                "no such table",
            ))),
            _ => Intercept::Run,
        });
        let p = sim.spawn();
        sim.run();
        assert_eq!(sim.events(p, 0), [failed], "{dialect:?}");
        sim.advance(Duration::from_secs(10));
        assert_eq!(
            sim.ops(p, 0).len(),
            3,
            "{dialect:?}: and no retry: {:?}",
            sim.ops(p, 0)
        );
        assert_eq!(sim.procs[p].broker.held_connections(), 0);
    }
}

/// A passing failure (the pool gives no connection) is not a verdict: the check runs again
/// after a second, and not before, and each failure in a row doubles the wait.
#[test]
fn check_passing_failure_retries_after_a_wait_that_doubles() {
    for dialect in ALL {
        let desc = if dialect == Dialect::Sqlite {
            advisory()
        } else {
            row_lock()
        };
        let mut sim = Sim::new(dialect, desc, 1);
        sim.insert(0);
        let mut failed = 0;
        sim.hook(move |_, c| {
            if failed < 3 && c.action == Action::Acquire {
                failed += 1;
                Intercept::Answer(Reply::Failed(DbError::new(
                    ErrorKind::PoolClosed,
                    "no connection in time",
                )))
            } else {
                Intercept::Run
            }
        });
        let p = sim.spawn();
        sim.run();
        let sub = sim.procs[p].sub;
        let retries = |sim: &Sim| -> Vec<(u32, Duration)> {
            sim.events(p, 0)
                .into_iter()
                .filter_map(|e| match e {
                    Event::StartRetry {
                        sub: s,
                        error,
                        failures,
                        again_in,
                    } if s == sub && error.kind == ErrorKind::PoolClosed => {
                        Some((failures, again_in))
                    }
                    _ => None,
                })
                .collect()
        };
        assert_eq!(retries(&sim), [(1, Duration::from_secs(1))], "{dialect:?}");
        let first = Duration::from_secs(1);
        assert_eq!(sim.timeout(p), Some(T0.plus(first)), "{dialect:?}");
        sim.advance_to(just_before(T0.plus(first)));
        assert_eq!(sim.ops(p, 0), [Acquire], "{dialect:?}: not before");
        // Tries at 1 s and 3 s fail too; the one at 7 s starts.
        sim.advance_to(T0.plus(Duration::from_secs(7)));
        assert_eq!(
            retries(&sim),
            [
                (1, Duration::from_secs(1)),
                (2, Duration::from_secs(2)),
                (3, Duration::from_secs(4))
            ],
            "{dialect:?}"
        );
        assert!(
            sim.events(p, 0).contains(&Event::Ready { sub }),
            "{dialect:?}"
        );
        let ready = Duration::from_secs(7);
        assert_eq!(sim.delivered_rows(p, 0), [1], "{dialect:?}");
        assert_eq!(sim.delivered_at(p, 0, 1), Some(T0.plus(ready)));
    }
}

/// An error that waiting cannot cure (a refused password, a missing privilege, a prepared
/// statement another client's session holds) fails the start at once, naming the table and
/// the error, and the check does not run again.
#[test]
fn check_failure_that_cannot_pass_fails_the_start_at_once() {
    let cases = [
        (ErrorKind::Authentication, "password authentication failed"),
        (ErrorKind::Privilege, "permission denied for table jobs"),
        (
            ErrorKind::PreparedStatement,
            "prepared statement \"sqlx_s_1\" already exists",
        ),
        (ErrorKind::Config, "database \"nope\" does not exist"),
    ];
    for (kind, message) in cases {
        let mut sim = Sim::new(Dialect::Postgres, row_lock(), 1);
        sim.insert(0);
        sim.hook(move |_, c| match kind_of(c) {
            Some(StatementKind::ListColumns) => {
                Intercept::Answer(Reply::Failed(DbError::new(kind, message)))
            }
            _ => Intercept::Run,
        });
        let p = sim.spawn();
        sim.run();
        let failed: Vec<String> = sim
            .events(p, 0)
            .into_iter()
            .filter_map(|e| match e {
                Event::CheckFailed { error, .. } => Some(error.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(failed.len(), 1, "{kind:?}: {failed:?}");
        assert!(
            failed[0].contains("table `jobs`") && failed[0].contains(message),
            "{kind:?}: {}",
            failed[0]
        );
        if kind == ErrorKind::PreparedStatement {
            assert!(failed[0].contains("transaction pooling"), "{}", failed[0]);
        }
        sim.advance(Duration::from_secs(120));
        assert_eq!(
            sim.runs_of(p, 0, StatementKind::ListColumns).len(),
            1,
            "{kind:?}: no second try"
        );
        assert_eq!(sim.procs[p].broker.held_connections(), 0);
    }
}

/// A check that fails halfway on a passing error closes its connection and runs again.
#[test]
fn check_passing_failure_midway_closes_and_retries() {
    let mut sim = Sim::new(Dialect::MySql, advisory(), 1);
    sim.insert(0);
    let mut failed = false;
    sim.hook(move |_, c| {
        if !failed && kind_of(c) == Some(StatementKind::CurrentDatabase) {
            failed = true;
            Intercept::Answer(Reply::Failed(DbError::new(ErrorKind::Other, "hiccup")))
        } else {
            Intercept::Run
        }
    });
    let p = sim.spawn();
    sim.run();
    assert_eq!(
        sim.ops(p, 0),
        [
            Acquire,
            Exec(StatementKind::ListColumns),
            Exec(StatementKind::ListIndexes),
            Exec(StatementKind::CurrentDatabase),
            Close
        ]
    );
    assert_eq!(sim.procs[p].broker.held_connections(), 0);
    sim.advance(POLL);
    assert_eq!(sim.delivered_rows(p, 0), [1]);
    // The lock name still has the database's name, read by the second check.
    let lock = only(sim.runs_of(p, 0, StatementKind::TryLock));
    assert_eq!(lock.bind(Arg::Key), Value::Text("test.jobs-0".into()));
}

// ===== wake =====

/// `wake` makes a subscription claim now, before its poll interval.
#[test]
fn wake_claims_before_the_poll_interval() {
    for (dialect, desc) in [
        (Dialect::Postgres, row_lock()),
        (Dialect::MySql, row_lock()),
        (Dialect::Postgres, lease()),
        (Dialect::Sqlite, lease()),
        (Dialect::MariaDb, advisory()),
        (Dialect::Sqlite, advisory()),
        (Dialect::Postgres, custom()),
    ] {
        let mut sim = Sim::start(dialect, desc, 1, &[]);
        assert_eq!(sim.timeout(0), Some(T0.plus(POLL)), "{dialect:?}");
        sim.advance(Duration::from_millis(200));
        let mark = sim.mark();
        sim.insert(0);
        sim.advance(Duration::from_millis(300));
        assert!(
            sim.ops(0, mark).is_empty(),
            "{dialect:?}: no claim without a wake"
        );
        sim.wake(0);
        sim.run();
        assert_eq!(sim.delivered_rows(0, mark), [1], "{dialect:?}");
        assert_eq!(
            sim.delivered_at(0, mark, 1),
            Some(T0.plus(Duration::from_millis(500)))
        );
    }
}

/// A claim that found a key held passes over the later rows of that key in the same batch, so
/// a later row of the key never overtakes an earlier one when the key is released meanwhile.
#[test]
fn advisory_claim_keeps_claim_order_within_a_key() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, advisory(), 3);
        sim.insert(0);
        sim.insert(1);
        sim.insert(0);
        let other = sim.hold_elsewhere("jobs-0");
        let p = sim.spawn();
        let second = lock_arg(dialect, "jobs-1");
        sim.run_until(p, |c| {
            matches!(&c.action, Action::Execute { statement, binds }
                if statement.kind == StatementKind::TryLock && binds.first() == Some(&second))
        });
        // The other system lets go of jobs-0 after the claim found it held.
        sim.db.kill(other);
        sim.run();
        assert_eq!(
            sim.delivered_rows(p, 0),
            [2],
            "{dialect:?}: row 3 of jobs-0 overtook row 1, which the claim passed over"
        );
    }
}

/// The first statement of a claim of the form, per dialect: the one a test holds to keep the
/// claim in flight.
fn claim_kind(desc: &TableDesc, dialect: Dialect) -> StatementKind {
    match desc.form() {
        Form::Lease => lease_claim_kind(dialect),
        _ => StatementKind::Candidates,
    }
}

/// "Claims of several workers and processes never wait for each other": within one process,
/// an advisory claim on the database's locks starts while another claim of the subscription
/// is still in flight, as soon as a worker is free.
#[test]
fn advisory_claims_of_one_subscription_run_side_by_side() {
    let desc = advisory();
    for dialect in SERVERS {
        // Two workers, a backlog: the first claim takes two rows, both in work.
        let mut sim = Sim::start(dialect, desc, 2, &[0, 1, 2, 3, 4, 5]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{dialect:?}");
        hold_kind(&mut sim, claim_kind(&desc, dialect));
        // One settles: a claim starts for its slot, and hangs.
        let mark = sim.mark();
        let first = sim.delivery(0, 1);
        sim.settle(0, first, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.procs[0].held.len(),
            1,
            "{dialect:?}: one claim in flight"
        );
        // The other settles while that claim hangs: a second claim starts beside it.
        let second = sim.delivery(0, 2);
        sim.settle(0, second, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.procs[0].held.len(),
            2,
            "{dialect:?} {:?}: a second claim runs beside the first",
            desc.form()
        );
        // Both answer: each takes a row of its own, and no row twice.
        sim.hook = None;
        for command in sim.take_held(0) {
            sim.run_command(0, command);
        }
        sim.run();
        let rows = sim.delivered_rows(0, mark);
        assert_eq!(rows.len(), 2, "{dialect:?}: {rows:?}");
        assert_ne!(rows[0], rows[1], "{dialect:?}: one row, one delivery");
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
    }
}

/// A lease claim runs alone: a worker that frees while it runs waits for it, and the next
/// claim, at once after it, takes a row for every worker that freed meanwhile. No row is
/// delivered twice, and nothing waits for the poll.
#[test]
fn lease_claims_of_one_subscription_run_one_at_a_time() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, lease(), 2, &[0, 1, 2, 3, 4, 5]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{dialect:?}");
        let kind = lease_claim_kind(dialect);
        hold_kind(&mut sim, kind);
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        assert_eq!(sim.procs[0].held.len(), 1, "{dialect:?}: one claim");
        sim.settle(0, sim.delivery(0, 2), Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.procs[0].held.len(),
            1,
            "{dialect:?}: the second worker waits for the claim in flight"
        );
        let held_at = sim.now;
        sim.hook = None;
        for command in sim.take_held(0) {
            sim.run_command(0, command);
        }
        sim.run();
        assert_eq!(sim.delivered_rows(0, mark), [3, 4], "{dialect:?}");
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
        assert_eq!(sim.runs_of(0, mark, kind).len(), 2, "{dialect:?}");
        assert_eq!(
            sim.delivered_at(0, mark, 4),
            Some(held_at),
            "{dialect:?}: the next claim ran at once"
        );
    }
}

/// Holds every statement of `kind` unanswered.
fn hold_kind(sim: &mut Sim, kind: StatementKind) {
    sim.hook(move |_, c| {
        if kind_of(c) == Some(kind) {
            Intercept::Hold
        } else {
            Intercept::Run
        }
    });
}

/// Holds the lease form's settlements (a fenced delete, alone or in a batch) unanswered.
fn hold_lease_settlements(sim: &mut Sim) {
    sim.hook(|_, c| match &c.action {
        Action::Execute { statement, .. }
            if matches!(
                statement.kind,
                StatementKind::Delete { .. } | StatementKind::SettleLeases(_)
            ) =>
        {
            Intercept::Hold
        }
        _ => Intercept::Run,
    });
}

/// On SQLite, which runs one statement at a time, a lease worker waits for its settlement: a
/// claim beside it would only wait for it, on a second connection.
#[test]
fn a_lease_worker_on_sqlite_waits_for_its_settlement() {
    let mut sim = Sim::start(Dialect::Sqlite, lease(), 1, &[0, 1, 2]);
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    hold_lease_settlements(&mut sim);
    let mark = sim.mark();
    sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
    sim.run();
    assert_eq!(
        count(&sim.ops(0, mark), &Acquire),
        1,
        "the settlement's connection alone: {:?}",
        sim.ops(0, mark)
    );
    assert!(sim.delivered_rows(0, mark).is_empty());
    sim.hook = None;
    for command in sim.take_held(0) {
        sim.run_command(0, command);
    }
    sim.run();
    assert_eq!(sim.delivered_rows(0, mark), [2]);
}

/// In the lease form a worker whose settlement runs takes its next row: the lease holds the
/// settled row until the statement answers. At most `workers` rows settle so beyond the rows
/// in work. (SQLite runs one statement at a time: there the claim waits for the settlement.)
#[test]
fn a_lease_worker_takes_its_next_row_while_its_settlement_runs() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, lease(), 1, &[0, 1, 2, 3]);
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
        hold_lease_settlements(&mut sim);
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.delivered_rows(0, mark),
            [2],
            "{dialect:?}: the next row while row 1 settles"
        );
        assert!(sim.db.rows.contains_key(&1), "{dialect:?}: row 1 not yet");
        sim.settle(0, sim.delivery(0, 2), Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.delivered_rows(0, mark),
            [2],
            "{dialect:?}: two rows settle and one worker: no third"
        );
        sim.hook = None;
        for command in sim.take_held(0) {
            sim.run_command(0, command);
        }
        sim.run();
        assert!(
            !sim.db.rows.contains_key(&1) && !sim.db.rows.contains_key(&2),
            "{dialect:?}: both settled"
        );
        assert_eq!(sim.delivered_rows(0, mark), [2, 3], "{dialect:?}");
    }
}

/// A row lock claim that counts an attempt commits the count before it locks the row, under
/// the row's mark. The next claim acquires its connection beside it and counts once the first
/// has locked its row: a count meanwhile would hold the counted row for a moment, and the
/// first one's lock would find it held. No row is counted twice.
#[test]
fn row_lock_claims_that_count_attempts_count_after_the_last_counts_locks() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 2, &[0, 1, 2, 3]);
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
        sim.hook(move |_, c| {
            if locks_by_id(c) {
                Intercept::Hold
            } else {
                Intercept::Run
            }
        });
        let first = sim.delivery(0, 1);
        sim.settle(0, first, Outcome::Ack);
        sim.run();
        assert_eq!(sim.procs[0].held.len(), 1, "{dialect:?}: one claim locks");
        let marked: Vec<i64> = sim.db.marks.keys().copied().collect();
        assert_eq!(
            marked,
            [3],
            "{dialect:?}: its row stays marked until its lock"
        );
        let second = sim.delivery(0, 2);
        let mark = sim.mark();
        sim.settle(0, second, Outcome::Ack);
        sim.run();
        let ops = sim.ops(0, mark);
        assert!(
            ops.contains(&Acquire),
            "{dialect:?}: the second claim acquires beside the first: {ops:?}"
        );
        let counting = [StatementKind::CountRow, StatementKind::SelectRowId];
        assert!(
            counting.iter().all(|k| sim.runs_of(0, mark, *k).is_empty()),
            "{dialect:?}: but does not count while the first has not locked its row: {ops:?}"
        );
        sim.hook = None;
        for command in sim.take_held(0) {
            sim.run_command(0, command);
        }
        sim.run();
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
        let mut rows = sim.delivered_rows(0, mark);
        rows.sort_unstable();
        assert_eq!(
            rows,
            [3, 4],
            "{dialect:?}: each claim takes a row of its own"
        );
        for row in [3, 4] {
            assert_eq!(
                sim.row(row).attempt,
                1,
                "{dialect:?}: row {row} counted once"
            );
        }
        assert!(sim.db.marks.is_empty(), "{dialect:?}: {:?}", sim.db.marks);
    }
}

/// The claims waiting for a count when it starts are counted together: one statement counts a
/// row for each of them, and each locks its own row on its own connection. Rows are counted
/// once each and none goes to two claims.
#[test]
fn row_lock_claims_waiting_together_are_counted_in_one_statement() {
    for dialect in SERVERS {
        let counting = if dialect == Dialect::Postgres {
            StatementKind::CountRow
        } else {
            StatementKind::SelectRowId
        };
        let mut sim = Sim::start(dialect, row_lock(), 4, &[0; 12]);
        assert_eq!(sim.in_work(0), 4, "{dialect:?}");
        let counts = sim.runs_of(0, 0, counting).len();
        assert!(
            counts < 4,
            "{dialect:?}: four claims, {counts} counts: {:?}",
            sim.ops(0, 0)
        );
        for round in 0..2 {
            let mark = sim.mark();
            let in_work: Vec<i64> = sim
                .delivered_rows(0, 0)
                .into_iter()
                .skip(4 * round)
                .collect();
            for row in in_work {
                let d = sim.delivery(0, row);
                sim.settle(0, d, Outcome::Ack);
            }
            sim.run();
            assert_eq!(sim.in_work(0), 4, "{dialect:?}");
            let counts = sim.runs_of(0, mark, counting).len();
            assert!(
                counts < 4,
                "{dialect:?}: four claims side by side, {counts} counts: {:?}",
                sim.ops(0, mark)
            );
        }
        let rows = sim.delivered_rows(0, 0);
        let distinct: BTreeSet<i64> = rows.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            rows.len(),
            "{dialect:?}: one delivery a row: {rows:?}"
        );
        for row in rows.iter().skip(8) {
            assert_eq!(
                sim.row(*row).attempt,
                1,
                "{dialect:?}: row {row} counted once"
            );
        }
    }
}

/// In a table claimed in id order, a claim after one that found all it asked for starts at
/// that claim's lowest id (past the entries of the rows settled before it), and a row that
/// becomes claimable again below that id is found by a claim from the table's start within a
/// second.
#[test]
fn claims_in_id_order_start_past_the_rows_taken_before_them() {
    for dialect in [Dialect::Postgres, Dialect::Sqlite] {
        let mut sim = Sim::start(dialect, lease_marked(), 2, &[0; 12]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{dialect:?}");
        let floor_of = |sim: &Sim, since: usize| sim.floors(0, since, StatementKind::ClaimLease);
        assert!(
            floor_of(&sim, 0).is_empty(),
            "{dialect:?}: the first claim starts at the beginning"
        );
        let mark = sim.mark();
        for row in [1, 2] {
            let d = sim.delivery(0, row);
            sim.settle(0, d, Outcome::Ack);
        }
        sim.run();
        assert_eq!(sim.delivered_rows(0, mark), [3, 4], "{dialect:?}");
        assert_eq!(
            floor_of(&sim, mark).first(),
            Some(&Value::Int(1)),
            "{dialect:?}: the next claim starts at the last full claim's lowest id"
        );
        // Row 4 ends; row 3 comes back to the queue below where the claims now start.
        let d = sim.delivery(0, 4);
        sim.settle(0, d, Outcome::Ack);
        sim.run();
        let mark = sim.mark();
        let d = sim.delivery(0, 3);
        sim.settle(0, d, Outcome::Retry);
        sim.run();
        let returned = sim.now;
        let mut done: BTreeSet<i64> = [1, 2, 4].into();
        let again = sim.ack_others_until(3, mark, &mut done);
        let again = again.unwrap_or_else(|| {
            panic!(
                "{dialect:?}: row 3 never came back: {:?}",
                sim.delivered_rows(0, 0)
            )
        });
        assert!(
            again.micros() - returned.micros() <= 1_100_000,
            "{dialect:?}: row 3 came back {} µs after its retry",
            again.micros() - returned.micros()
        );
    }
}

/// After a claim from the floor that found less than it asked for, the next claim looks from
/// the table's start for rows claimable again below the floor: at once while such a look is
/// cheap; while it is dear (here 20 ms: the entries of settled rows that vacuum may not
/// remove yet) the claims keep the floor, and the look from the start follows twenty times
/// its length after the last one, in every form that claims in id order.
#[test]
fn a_dear_look_from_the_start_waits_while_claims_keep_the_floor() {
    for (desc, kind) in [
        (lease_marked(), StatementKind::ClaimLease),
        (row_lock_marked(), StatementKind::CountRow),
        (advisory(), StatementKind::Candidates),
    ] {
        for dear in [false, true] {
            let form = desc.form();
            let mut sim = Sim::start(Dialect::Postgres, desc, 2, &[0, 1, 2, 3, 4, 5]);
            assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{form:?}");
            for row in [1, 2] {
                let d = sim.delivery(0, row);
                sim.settle(0, d, Outcome::Ack);
            }
            sim.run();
            assert_eq!(sim.delivered_rows(0, 0), [1, 2, 3, 4], "{form:?}");
            // The next claim starts at the table's start and takes row 5; its look takes 20 ms
            // when dear.
            sim.advance(Duration::from_secs(2));
            hold_kind(&mut sim, kind);
            let d = sim.delivery(0, 3);
            sim.settle(0, d, Outcome::Ack);
            sim.run();
            let held = sim.take_held(0);
            assert_eq!(held.len(), 1, "{form:?}: the look from the start");
            sim.hook = None;
            let sent = sim.now;
            if dear {
                sim.now = sim.now.plus(Duration::from_millis(20));
            }
            for command in held {
                sim.run_command(0, command);
            }
            sim.run();
            assert_eq!(sim.delivered_rows(0, 0), [1, 2, 3, 4, 5], "{form:?}");
            // Rows 4 and 5 end: the claims from the floor find row 6, then nothing.
            let mark = sim.mark();
            for row in [4, 5] {
                let d = sim.delivery(0, row);
                sim.settle(0, d, Outcome::Ack);
                sim.run();
            }
            assert_eq!(sim.delivered_rows(0, mark), [6], "{form:?}");
            let starts = |sim: &Sim| -> Vec<Option<i64>> {
                sim.runs_of(0, mark, kind)
                    .iter()
                    .map(|r| {
                        let st = r.statement.as_ref()?;
                        let i = st.args.iter().position(|a| *a == Arg::Floor)?;
                        r.binds[i].as_int()
                    })
                    .collect()
            };
            let now = starts(&sim);
            if !dear {
                assert_eq!(
                    now.last(),
                    Some(&None),
                    "{form:?}: a cheap look from the start follows at once"
                );
                continue;
            }
            // (A lease claim waits for the handler of row 5, and finds row 6 and no more.)
            assert!(
                !now.is_empty() && now.iter().all(Option::is_some),
                "{form:?}: the claims that found row 6 and then nothing start at the floor, and no look from the start follows at once: {now:?}"
            );
            // Twenty times 20 ms after the last look from the start was sent.
            sim.advance_to(sent.plus(Duration::from_millis(390)));
            let before = starts(&sim);
            assert!(
                before.iter().all(Option::is_some),
                "{form:?}: none before 400 ms: {before:?}"
            );
            sim.advance_to(sent.plus(Duration::from_millis(410)));
            let later = starts(&sim);
            assert!(
                later.len() == before.len() + 1 && later.last() == Some(&None),
                "{form:?}: the look from the start 400 ms after the last: {later:?}"
            );
        }
    }
}

/// On PostgreSQL an advisory table claimed in id order starts its looks past the rows taken
/// before them, but never past a row still queued: a row in work here, whose key the look
/// passes over, keeps the floor at or below it, so when it returns to the queue the next look
/// finds it before any later row of its key.
#[test]
fn advisory_looks_in_id_order_start_past_taken_rows_but_not_past_one_in_work() {
    // Row 3 and row 12 share a key; the others have keys of their own.
    let channels = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 2];
    let mut sim = Sim::start(Dialect::Postgres, advisory(), 2, &channels);
    assert_eq!(sim.delivered_rows(0, 0), [1, 2]);
    let floors = |sim: &Sim, since: usize| -> Vec<i64> {
        sim.floors(0, since, StatementKind::Candidates)
            .iter()
            .filter_map(Value::as_int)
            .collect()
    };
    assert!(
        floors(&sim, 0).is_empty(),
        "the first look starts at the beginning"
    );
    let mut done: BTreeSet<i64> = BTreeSet::new();
    for row in [1, 2] {
        let d = sim.delivery(0, row);
        sim.settle(0, d, Outcome::Ack);
        done.insert(row);
    }
    sim.run();
    assert_eq!(sim.delivered_rows(0, 0), [1, 2, 3, 4]);
    // Row 4 ends; row 3 returns to the queue while looks start past rows 1 and 2.
    let d = sim.delivery(0, 4);
    sim.settle(0, d, Outcome::Ack);
    done.insert(4);
    sim.run();
    let mark = sim.mark();
    let d = sim.delivery(0, 3);
    sim.settle(0, d, Outcome::Retry);
    sim.run();
    let started = floors(&sim, 0);
    assert!(
        started.iter().any(|&f| f > 1),
        "looks start past the rows settled before them: {started:?}"
    );
    sim.ack_others_until(3, mark, &mut done);
    let again = sim.delivered_rows(0, mark);
    let at = again.iter().position(|&r| r == 3);
    assert!(at.is_some(), "row 3 came back: {again:?}");
    assert!(
        !again[..at.unwrap_or(0)].contains(&12),
        "row 12 overtook row 3 of its key: {again:?}"
    );
    assert!(
        floors(&sim, mark).iter().all(|&f| f <= 3),
        "no look starts past row 3 while it is queued: {:?}",
        floors(&sim, mark)
    );
}

/// Two workers on ten rows of keys of their own (PostgreSQL): rows 1 and 2 handed and
/// acknowledged, rows 3 and 4 in work, and the claims past them.
fn advisory_with_rows_3_and_4_in_work() -> Sim {
    let channels = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
    let mut sim = Sim::start(Dialect::Postgres, advisory(), 2, &channels);
    assert_eq!(sim.delivered_rows(0, 0), [1, 2]);
    for row in [1, 2] {
        let d = sim.delivery(0, row);
        sim.settle(0, d, Outcome::Ack);
    }
    sim.run();
    assert_eq!(sim.delivered_rows(0, 0), [1, 2, 3, 4]);
    sim
}

/// A claim whose look from the floor finds only keys held elsewhere looks again at once from
/// the same floor, not from the table's start: a look from the start passes every index entry
/// the rows taken before it left, which vacuum may not have removed.
#[test]
fn advisory_a_second_look_starts_where_the_first_did() {
    let mut sim = advisory_with_rows_3_and_4_in_work();
    // The next rows' keys are held by another system's session.
    sim.hold_elsewhere("jobs-4");
    sim.hold_elsewhere("jobs-5");
    let mark = sim.mark();
    for row in [3, 4] {
        let d = sim.delivery(0, row);
        sim.settle(0, d, Outcome::Ack);
    }
    sim.run();
    let looks = sim.runs_of(0, mark, StatementKind::Candidates).len();
    let floors: Vec<i64> = sim
        .floors(0, mark, StatementKind::Candidates)
        .iter()
        .filter_map(Value::as_int)
        .collect();
    assert!(
        looks >= 2,
        "a look found the held keys, then another: {looks} looks"
    );
    assert_eq!(
        floors.len(),
        looks,
        "every look starts past the rows taken before it: {floors:?} of {looks} looks"
    );
    assert!(floors.iter().all(|&f| f > 2), "{floors:?}");
    let taken = sim.delivered_rows(0, mark);
    assert!(
        taken.contains(&7) && !taken.contains(&5) && !taken.contains(&6),
        "the rows of free keys past the held ones: {taken:?}"
    );
}

/// A claim whose first look, from the table's start, finds only keys held elsewhere looks
/// again from the floor that look set, not from the start once more: what lies below the
/// floor the first look has read, and each look from the start passes every index entry the
/// rows taken before it left.
#[test]
fn advisory_a_second_look_after_one_from_the_start_starts_at_the_floor() {
    let mut sim = advisory_with_rows_3_and_4_in_work();
    for key in ["jobs-4", "jobs-5", "jobs-6", "jobs-7"] {
        sim.hold_elsewhere(key);
    }
    // Past the time by which a claim starts from the table's start again.
    sim.advance(Duration::from_secs(2));
    let mark = sim.mark();
    for row in [3, 4] {
        let d = sim.delivery(0, row);
        sim.settle(0, d, Outcome::Ack);
    }
    sim.run();
    // Each look with its claim's connection, and where it started (`None`: the start).
    let looks: Vec<(ConnId, Option<i64>)> = sim
        .runs_of(0, mark, StatementKind::Candidates)
        .iter()
        .map(|r| {
            let floor = r.statement.as_ref().and_then(|st| {
                let i = st.args.iter().position(|a| *a == Arg::Floor)?;
                r.binds[i].as_int()
            });
            (r.conn, floor)
        })
        .collect();
    let (conn, first) = looks[0];
    assert!(
        first.is_none(),
        "the first look is from the start: {looks:?}"
    );
    let again: Vec<Option<i64>> = looks[1..]
        .iter()
        .filter(|(c, _)| *c == conn)
        .map(|(_, f)| *f)
        .collect();
    assert!(
        !again.is_empty(),
        "it found the held keys' rows only, and its claim looked again: {looks:?}"
    );
    assert!(
        again.iter().all(|f| f.is_some_and(|f| f > 2)),
        "the looks after it start past the rows taken before: {looks:?}"
    );
    let taken = sim.delivered_rows(0, mark);
    assert!(
        taken.contains(&9) && taken.iter().all(|row| !(5..=8).contains(row)),
        "the rows of free keys past the held ones: {taken:?}"
    );
}

/// On SQLite the core hands the adapter one statement at a time: a settlement's statement
/// waits while a claim's runs, instead of waiting in SQLite's busy handler for the write lock,
/// and runs as soon as the claim's has answered.
#[test]
fn sqlite_gets_one_statement_at_a_time() {
    let mut sim = Sim::start(Dialect::Sqlite, lease(), 2, &[0, 1, 2, 3, 4, 5]);
    assert_eq!(sim.delivered_rows(0, 0), [1, 2]);
    let claim = lease_claim_kind(Dialect::Sqlite);
    sim.hook(move |_, c| {
        if kind_of(c) == Some(claim) {
            Intercept::Hold
        } else {
            Intercept::Run
        }
    });
    let first = sim.delivery(0, 1);
    sim.settle(0, first, Outcome::Ack);
    sim.run();
    assert_eq!(sim.procs[0].held.len(), 1, "a claim runs");
    let mark = sim.mark();
    let second = sim.delivery(0, 2);
    sim.settle(0, second, Outcome::Ack);
    sim.run();
    let statements: Vec<Op> = sim
        .ops(0, mark)
        .into_iter()
        .filter(|op| matches!(op, Exec(_)))
        .collect();
    assert!(
        statements.is_empty(),
        "no statement runs beside the claim's: {statements:?}"
    );
    assert!(
        sim.procs[0].queue.is_empty(),
        "the settlement's statement is held back"
    );
    assert_eq!(sim.row(2).attempt, 1, "row 2 is not settled yet");
    sim.hook = None;
    for command in sim.take_held(0) {
        sim.run_command(0, command);
    }
    sim.run();
    let ops = sim.ops(0, mark);
    let claim_at = ops
        .iter()
        .position(|op| *op == Exec(claim))
        .expect("the claim answered");
    let delete_at = ops
        .iter()
        .position(|op| matches!(op, Exec(StatementKind::Delete { .. })))
        .expect("then the settlement ran");
    assert!(claim_at < delete_at, "{ops:?}");
    assert!(!sim.db.rows.contains_key(&2), "row 2 settled");
}

impl Sim {
    /// Publishes `rows` rows of `channel` in one batch.
    fn publish_all(
        &mut self,
        p: usize,
        channel: i64,
        rows: usize,
    ) -> Result<PublishId, BrokerError> {
        let publisher = self.procs[p].publisher;
        let batch = (0..rows).map(|_| self.message(channel)).collect();
        let result = self.procs[p].broker.publish_all(publisher, batch, self.now);
        self.poll(p);
        result
    }

    /// The results of the publishes answered since `since`.
    fn published(&self, p: usize, since: usize) -> Vec<(PublishId, Result<(), DbError>)> {
        self.events(p, since)
            .into_iter()
            .filter_map(|e| match e {
                Event::Published { publish, result } => Some((publish, result.map(drop))),
                _ => None,
            })
            .collect()
    }
}

/// A batch of up to `PUBLISH_BATCH` rows is one insert, with no transaction around it.
#[test]
fn publish_all_writes_a_small_batch_in_one_insert() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[]);
        let mark = sim.mark();
        let id = sim.publish_all(0, 2, 3).expect("publishes");
        sim.run();
        let publishes = sim.runs_of(0, mark, StatementKind::Publish);
        assert_eq!(publishes.len(), 1, "{dialect:?}");
        assert_eq!(
            publishes[0].binds.len(),
            3 * sim.statements(0).publish.args.len()
        );
        assert_eq!(
            sim.ops(0, mark)[..3],
            [Acquire, Exec(StatementKind::Publish), Release],
            "{dialect:?}"
        );
        assert_eq!(sim.db.rows.len(), 3, "{dialect:?}");
        assert_eq!(sim.published(0, mark), [(id, Ok(()))], "{dialect:?}");
    }
    // Each row binds its own values.
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, advisory(), 1, &[]);
        let publisher = sim.procs[0].publisher;
        let batch = (0..3)
            .map(|channel| Publish {
                payload: b"{}".to_vec(),
                columns: vec![("channel", Value::Int(channel))],
                ..Publish::default()
            })
            .collect();
        sim.procs[0]
            .broker
            .publish_all(publisher, batch, sim.now)
            .expect("publishes");
        sim.poll(0);
        sim.run();
        let channels: Vec<i64> = sim.db.rows.values().map(|r| r.channel).collect();
        assert_eq!(channels, [0, 1, 2], "{dialect:?}");
    }
}

/// More rows than one insert takes run as several inserts in one transaction.
#[test]
fn publish_all_writes_a_large_batch_in_one_transaction() {
    use ruststream_core::PUBLISH_BATCH;
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[]);
        let mark = sim.mark();
        let rows = 2 * PUBLISH_BATCH + PUBLISH_BATCH / 2;
        let id = sim.publish_all(0, 1, rows).expect("publishes");
        sim.run();
        let ops = sim.ops(0, mark);
        let publishing: Vec<Op> = ops
            .iter()
            .take_while(|op| **op != Release)
            .cloned()
            .collect();
        assert_eq!(
            publishing,
            [
                Acquire,
                Exec(StatementKind::Begin),
                Exec(StatementKind::Publish),
                Exec(StatementKind::Publish),
                Exec(StatementKind::Publish),
                Exec(StatementKind::Commit),
            ],
            "{dialect:?}"
        );
        let per_row = sim.statements(0).publish.args.len();
        let sizes: Vec<usize> = sim
            .runs_of(0, mark, StatementKind::Publish)
            .iter()
            .map(|r| r.binds.len() / per_row)
            .collect();
        assert_eq!(sizes, [PUBLISH_BATCH, PUBLISH_BATCH, PUBLISH_BATCH / 2]);
        assert_eq!(sim.db.rows.len(), rows, "{dialect:?}");
        assert_eq!(sim.published(0, mark), [(id, Ok(()))], "{dialect:?}");
    }
}

/// A batch is written whole or not at all: an insert that fails closes the connection, which
/// rolls back the inserts before it, and the publish answers the error.
#[test]
fn publish_all_that_fails_midway_writes_nothing() {
    use ruststream_core::PUBLISH_BATCH;
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[]);
        let mut inserts = 0;
        sim.hook(move |_, c| {
            if kind_of(c) == Some(StatementKind::Publish) {
                inserts += 1;
                if inserts == 2 {
                    return Intercept::Answer(Reply::Failed(DbError::new(
                        ErrorKind::Other,
                        "duplicate key",
                    )));
                }
            }
            Intercept::Run
        });
        let mark = sim.mark();
        let id = sim.publish_all(0, 1, 2 * PUBLISH_BATCH).expect("publishes");
        sim.run();
        assert!(sim.db.rows.is_empty(), "{dialect:?}: nothing written");
        let published = sim.published(0, mark);
        assert_eq!(published.len(), 1, "{dialect:?}");
        assert_eq!(published[0].0, id);
        assert!(published[0].1.is_err(), "{dialect:?}: {published:?}");
        assert!(
            sim.ops(0, mark).contains(&Close),
            "{dialect:?}: the session ends"
        );
        assert_eq!(sim.procs[0].broker.held_connections(), 0);
    }
}

/// A row of a batch that lacks a column the table needs refuses the whole batch before
/// anything runs.
#[test]
fn publish_all_with_a_row_missing_a_column_is_refused() {
    let mut sim = Sim::start(Dialect::Postgres, advisory(), 1, &[]);
    let publisher = sim.procs[0].publisher;
    let good = Publish {
        payload: b"{}".to_vec(),
        columns: vec![("channel", Value::Int(1))],
        ..Publish::default()
    };
    let bad = Publish {
        payload: b"{}".to_vec(),
        ..Publish::default()
    };
    let mark = sim.mark();
    let refused = sim.procs[0]
        .broker
        .publish_all(publisher, vec![good, bad], sim.now);
    assert_eq!(
        refused,
        Err(BrokerError::MissingValue {
            table: "jobs",
            column: "channel"
        })
    );
    sim.poll(0);
    sim.run();
    assert!(sim.ops(0, mark).is_empty());
    assert!(sim.db.rows.is_empty());
}

// ===== kept connections: CONNECTION_LINGER =====

/// A process with the default linger on a table with these channels, started and run.
fn start_lingering(dialect: Dialect, desc: TableDesc, workers: usize, channels: &[i64]) -> Sim {
    let mut sim = Sim::new(dialect, desc, workers);
    sim.linger = CONNECTION_LINGER;
    for &channel in channels {
        sim.insert(channel);
    }
    sim.spawn();
    sim.run();
    sim
}

fn count(ops: &[Op], op: &Op) -> usize {
    ops.iter().filter(|o| *o == op).count()
}

/// A connection a flow gives back serves the next flow without the pool, and goes back to
/// the pool once it has been idle for the linger.
#[test]
fn a_kept_connection_serves_the_next_flow_and_goes_back_to_the_pool_after_the_linger() {
    for dialect in ALL {
        let mut sim = start_lingering(dialect, lease(), 1, &[0, 1]);
        // The check's connection runs the first claim: one acquire, nothing given back yet.
        let ops = sim.ops(0, 0);
        assert_eq!(count(&ops, &Acquire), 1, "{dialect:?}: {ops:?}");
        assert_eq!(count(&ops, &Release), 0, "{dialect:?}: {ops:?}");
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
        assert_eq!(sim.procs[0].broker.held_connections(), 1, "{dialect:?}");
        // The settlement runs on the kept connection. On the servers the claim beside it, for
        // the worker the settlement freed, asks the pool, and the settlement's connection,
        // given back while that acquire waits, goes to the pool, where the acquire finds it.
        // On SQLite the claim follows the settlement, on the kept connection.
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let ops = sim.ops(0, mark);
        let beside = usize::from(dialect != Dialect::Sqlite);
        assert_eq!(ops[0], delete(true), "{dialect:?}: {ops:?}");
        assert_eq!(count(&ops, &Acquire), beside, "{dialect:?}: {ops:?}");
        assert_eq!(count(&ops, &Release), beside, "{dialect:?}: {ops:?}");
        assert_eq!(sim.delivered_rows(0, mark), [2], "{dialect:?}");
        // Idle: kept for the linger, not a moment less, then given back.
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 2), Outcome::Ack);
        sim.run();
        let idle_from = sim.now;
        let kept = sim.procs[0].broker.held_connections();
        assert!(kept >= 1, "{dialect:?}: {:?}", sim.ops(0, mark));
        let released = count(&sim.ops(0, mark), &Release);
        assert_eq!(sim.timeout(0), Some(idle_from.plus(CONNECTION_LINGER)));
        sim.advance_to(just_before(idle_from.plus(CONNECTION_LINGER)));
        assert_eq!(count(&sim.ops(0, mark), &Release), released, "{dialect:?}");
        sim.advance_to(idle_from.plus(CONNECTION_LINGER));
        assert_eq!(
            count(&sim.ops(0, mark), &Release),
            released + kept,
            "{dialect:?}"
        );
        assert_eq!(sim.procs[0].broker.held_connections(), 0, "{dialect:?}");
        assert!(sim.db.held_by(1).is_empty(), "{dialect:?}");
    }
}

/// `Duration::ZERO` keeps nothing: each flow acquires and releases its own connection.
#[test]
fn a_zero_linger_gives_every_connection_back_at_once() {
    let mut sim = Sim::start(Dialect::Postgres, lease(), 1, &[0]);
    let mark = sim.mark();
    sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
    sim.run();
    assert_eq!(
        sim.first_flow_ops(0, mark),
        [Acquire, delete(true), Release],
        "{:?}",
        sim.ops(0, mark)
    );
    assert_eq!(sim.procs[0].broker.held_connections(), 0);
}

/// A connection whose statement failed is closed at once, not kept, and the next flow
/// acquires another.
#[test]
fn a_connection_whose_statement_failed_is_closed_not_kept() {
    for dialect in ALL {
        let mut sim = start_lingering(dialect, lease(), 1, &[0]);
        sim.hook(|_, command| match &command.action {
            Action::Execute { statement, .. }
                if statement.kind == StatementKind::Delete { fenced: true } =>
            {
                Intercept::Answer(Reply::Failed(DbError::new(
                    ErrorKind::Other,
                    "the disk is full",
                )))
            }
            _ => Intercept::Run,
        });
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let ops = sim.ops(0, mark);
        assert_eq!(
            sim.first_flow_ops(0, mark),
            [delete(true), Close],
            "{dialect:?}: {ops:?}"
        );
        // The claim beside it, and every flow after, runs its statements on another.
        let failed = sim.runs(0, mark)[0].conn;
        let after = sim.runs(0, mark);
        assert!(
            after
                .iter()
                .skip(1)
                .all(|r| r.conn != failed || r.op == Close),
            "{dialect:?}: {ops:?}"
        );
        assert!(ops.contains(&Acquire), "{dialect:?}: {ops:?}");
    }
}

/// A connection whose transaction is in doubt is not kept: a `COMMIT` that failed may leave the
/// row lock's transaction open on MySQL, so the connection closes.
#[test]
fn a_connection_whose_commit_failed_is_closed_not_kept() {
    for dialect in SERVERS {
        let mut sim = start_lingering(dialect, row_lock(), 1, &[0]);
        let conn = sim.conn_of(0, 1);
        sim.hook(|_, command| match &command.action {
            Action::Execute { statement, .. } if statement.kind == StatementKind::Commit => {
                Intercept::Answer(Reply::Failed(DbError::new(
                    ErrorKind::Other,
                    "the commit failed",
                )))
            }
            _ => Intercept::Run,
        });
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let ops = sim.ops_on(0, conn, mark);
        assert_eq!(ops.last(), Some(&Close), "{dialect:?}: {ops:?}");
    }
}

/// The row lock's connection, once its settlement committed, serves the next claim.
#[test]
fn a_committed_row_lock_connection_serves_the_next_claim() {
    for dialect in SERVERS {
        let mut sim = start_lingering(dialect, row_lock(), 1, &[0, 1]);
        let conn = sim.conn_of(0, 1);
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        assert_eq!(sim.delivered_rows(0, mark), [2], "{dialect:?}");
        assert_eq!(sim.conn_of(0, 2), conn, "{dialect:?}");
        let ops = sim.ops(0, mark);
        assert!(
            !ops.contains(&Acquire) && !ops.contains(&Release),
            "{dialect:?}: {ops:?}"
        );
        assert!(sim.db.sessions[&sim.sess_of(0, conn)].in_tx, "{dialect:?}");
    }
}

/// A connection that ran the service's own lock is not kept: what the lock left in the
/// session is the service's.
#[test]
fn a_connection_that_ran_a_custom_lock_is_not_kept() {
    for dialect in ALL {
        let mut sim = start_lingering(dialect, custom(), 1, &[0]);
        let conn = sim.conn_of(0, 1);
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.ops_on(0, conn, mark),
            [delete(false), Op::Unlock("jobs-0".into()), Release],
            "{dialect:?}"
        );
    }
}

/// While an acquire waits for the pool, a connection given back goes to the pool, where that
/// acquire finds it, rather than waiting out the linger.
#[test]
fn a_connection_given_back_while_an_acquire_waits_goes_to_the_pool() {
    // MySQL: each settlement runs a statement of its own (no batch: `DELETE` returns no ids).
    let mut sim = start_lingering(Dialect::MySql, lease(), 2, &[0, 1]);
    assert_eq!(sim.delivered_rows(0, 0), [1, 2]);
    let kept = sim.runs(0, 0)[0].conn;
    // The pool has no connection to give: acquires wait.
    sim.hook(|_, command| match command.action {
        Action::Acquire => Intercept::Hold,
        _ => Intercept::Run,
    });
    let mark = sim.mark();
    sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
    sim.settle(0, sim.delivery(0, 2), Outcome::Ack);
    sim.run();
    let waiting = sim.take_held(0);
    assert!(
        waiting
            .iter()
            .all(|c| c.conn != kept && c.action == Action::Acquire),
        "one settlement took the kept connection, the other waits: {waiting:?}"
    );
    assert!(!waiting.is_empty());
    assert_eq!(
        sim.ops_on(0, kept, mark),
        [delete(true), Release],
        "given back to the pool at once"
    );
    sim.hook(|_, _| Intercept::Run);
    for command in waiting {
        sim.run_command(0, command);
    }
    sim.run();
    assert!(sim.db.rows.is_empty());
}

/// The shutdown gives every kept connection back before the broker closes.
#[test]
fn the_shutdown_gives_kept_connections_back() {
    for dialect in ALL {
        let mut sim = start_lingering(dialect, lease(), 1, &[0]);
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        assert_eq!(sim.procs[0].broker.held_connections(), 1, "{dialect:?}");
        let mark = sim.mark();
        sim.shutdown(0);
        sim.run();
        assert_eq!(sim.ops(0, mark), [Release], "{dialect:?}");
        assert_eq!(sim.closed(0).len(), 1, "{dialect:?}");
        assert_eq!(sim.procs[0].broker.held_connections(), 0, "{dialect:?}");
        assert!(sim.db.held_by(1).is_empty(), "{dialect:?}");
    }
}

// ===== lease settlements together =====

/// Runs a process's commands, holding back the first lease settlement statement, and
/// answers with it.
fn hold_first_settlement(sim: &mut Sim) {
    let mut held = false;
    sim.hook(move |_, command| match &command.action {
        Action::Execute { statement, .. }
            if !held && matches!(statement.kind, StatementKind::Delete { fenced: true }) =>
        {
            held = true;
            Intercept::Hold
        }
        _ => Intercept::Run,
    });
}

/// Settlements asked for while another of the subscription's runs wait for it, then settle
/// together in one statement, each fenced by its own lease.
#[test]
fn lease_settlements_asked_for_while_one_runs_settle_together() {
    for dialect in [Dialect::Postgres, Dialect::MariaDb, Dialect::Sqlite] {
        let mut sim = Sim::start(dialect, lease(), 4, &[0, 1, 2, 3]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 2, 3, 4], "{dialect:?}");
        hold_first_settlement(&mut sim);
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let first = sim.take_held(0);
        assert_eq!(first.len(), 1, "{dialect:?}");
        for row in [2, 3, 4] {
            sim.settle(0, sim.delivery(0, row), Outcome::Ack);
        }
        sim.run();
        assert!(
            !sim.ops(0, mark).iter().any(|o| matches!(
                o,
                Exec(StatementKind::Delete { .. } | StatementKind::SettleLeases(_))
            )),
            "{dialect:?}: the three wait for the first: {:?}",
            sim.ops(0, mark)
        );
        assert_eq!(
            sim.in_work(0),
            4,
            "{dialect:?}: still in work until settled"
        );
        for command in first {
            sim.run_command(0, command);
        }
        sim.run();
        let batch = only(sim.runs_of(0, mark, StatementKind::SettleLeases(3)));
        let ids: Vec<Value> = (0..3).map(|i| batch.bind(Arg::IdAt(i))).collect();
        assert_eq!(
            ids,
            [Value::Int(2), Value::Int(3), Value::Int(4)],
            "{dialect:?}"
        );
        for (i, row) in [2, 3, 4].into_iter().enumerate() {
            assert_eq!(
                batch.bind(Arg::FenceAt(i)),
                Value::Int(T0.plus(LEASE_TIME).micros()),
                "{dialect:?}: row {row} fenced by its lease"
            );
        }
        assert_eq!(
            sim.runs_of(0, mark, StatementKind::Delete { fenced: true })
                .len(),
            1
        );
        let settled: Vec<DeliveryId> = sim
            .events(0, mark)
            .into_iter()
            .filter_map(|e| match e {
                Event::Settled {
                    delivery,
                    outcome: Outcome::Ack,
                } => Some(delivery),
                _ => None,
            })
            .collect();
        assert_eq!(settled.len(), 4, "{dialect:?}: {:?}", sim.events(0, mark));
        assert!(sim.db.rows.is_empty(), "{dialect:?}");
        assert_eq!(sim.in_work(0), 0, "{dialect:?}");
    }
}

/// In a batch, a row whose lease another claim took is not settled: that delivery alone
/// fails with `LeaseLost`, the others settle.
#[test]
fn a_lost_lease_in_a_settlement_batch_fails_alone() {
    for dialect in [Dialect::Postgres, Dialect::MariaDb, Dialect::Sqlite] {
        let mut sim = Sim::start(dialect, lease(), 3, &[0, 1, 2]);
        hold_first_settlement(&mut sim);
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let first = sim.take_held(0);
        let (two, three) = (sim.delivery(0, 2), sim.delivery(0, 3));
        sim.settle(0, two, Outcome::Ack);
        sim.settle(0, three, Outcome::Ack);
        // Another process's lease on row 3.
        let theirs = T0.plus(LEASE_TIME * 3).micros();
        sim.db.rows.get_mut(&3).expect("row 3").locked_until = Some(theirs);
        for command in first {
            sim.run_command(0, command);
        }
        sim.run();
        assert_eq!(
            sim.runs_of(0, mark, StatementKind::SettleLeases(2)).len(),
            1,
            "{dialect:?}"
        );
        let events = sim.events(0, mark);
        assert!(
            events.contains(&Event::Settled {
                delivery: two,
                outcome: Outcome::Ack
            }),
            "{dialect:?}: {events:?}"
        );
        assert!(
            events.contains(&Event::SettleFailed {
                delivery: three,
                error: SettleError::LeaseLost
            }),
            "{dialect:?}: {events:?}"
        );
        assert!(!sim.db.rows.contains_key(&2));
        assert_eq!(
            sim.row(3).locked_until,
            Some(theirs),
            "{dialect:?}: untouched"
        );
    }
}

/// A batch whose statement fails fails every settlement in it, closes its connection, and
/// the settlements that waited behind it still run.
#[test]
fn a_failed_settlement_batch_fails_each_of_its_settlements() {
    for dialect in [Dialect::Postgres, Dialect::Sqlite] {
        let mut sim = Sim::start(dialect, lease(), 3, &[0, 1, 2]);
        hold_first_settlement(&mut sim);
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let first = sim.take_held(0);
        let (two, three) = (sim.delivery(0, 2), sim.delivery(0, 3));
        sim.settle(0, two, Outcome::Ack);
        sim.settle(0, three, Outcome::Ack);
        sim.hook(|_, command| match &command.action {
            Action::Execute { statement, .. }
                if matches!(statement.kind, StatementKind::SettleLeases(_)) =>
            {
                Intercept::Answer(Reply::Failed(DbError::new(
                    ErrorKind::Other,
                    "the disk is full",
                )))
            }
            _ => Intercept::Run,
        });
        let mark = sim.mark();
        for command in first {
            sim.run_command(0, command);
        }
        sim.run();
        let events = sim.events(0, mark);
        for delivery in [two, three] {
            assert!(
                events.iter().any(|e| matches!(
                    e,
                    Event::SettleFailed { delivery: d, error: SettleError::Db(_) } if *d == delivery
                )),
                "{dialect:?}: {events:?}"
            );
        }
        assert!(sim.ops(0, mark).contains(&Close), "{dialect:?}");
        assert_eq!(sim.in_work(0), 0, "{dialect:?}");
        assert!(sim.db.rows.contains_key(&2) && sim.db.rows.contains_key(&3));
    }
}

/// A settlement batch that a deadlock rolled back (PostgreSQL's 40P01, MySQL's 1213: a
/// batch's row locks against a claim's) runs again at once on its connection, with the
/// settlements it carried: every row settles, none waits for its lease to run out.
#[test]
fn a_settlement_batch_a_deadlock_rolled_back_runs_again_at_once() {
    for dialect in [Dialect::Postgres, Dialect::Sqlite] {
        let mut sim = Sim::start(dialect, lease(), 3, &[0, 1, 2]);
        hold_first_settlement(&mut sim);
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let first = sim.take_held(0);
        let (two, three) = (sim.delivery(0, 2), sim.delivery(0, 3));
        sim.settle(0, two, Outcome::Ack);
        sim.settle(0, three, Outcome::Ack);
        let mut deadlocked = false;
        sim.hook(move |_, command| match &command.action {
            Action::Execute { statement, .. }
                if !deadlocked && matches!(statement.kind, StatementKind::SettleLeases(_)) =>
            {
                deadlocked = true;
                Intercept::Answer(Reply::Failed(DbError::new(
                    ErrorKind::Serialization,
                    "deadlock detected",
                )))
            }
            _ => Intercept::Run,
        });
        let mark = sim.mark();
        for command in first {
            sim.run_command(0, command);
        }
        sim.run();
        let runs = sim.runs_of(0, mark, StatementKind::SettleLeases(2));
        assert_eq!(runs.len(), 2, "{dialect:?}: the batch ran again");
        assert_eq!(runs[0].conn, runs[1].conn, "{dialect:?}: on its connection");
        let events = sim.events(0, mark);
        for delivery in [two, three] {
            assert!(
                events.contains(&Event::Settled {
                    delivery,
                    outcome: Outcome::Ack
                }),
                "{dialect:?}: {events:?}"
            );
        }
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, Event::SettleFailed { .. })),
            "{dialect:?}: {events:?}"
        );
        assert!(!sim.ops(0, mark).contains(&Close), "{dialect:?}");
        assert!(sim.db.rows.is_empty(), "{dialect:?}");
        assert_eq!(sim.in_work(0), 0, "{dialect:?}");
    }
}

/// A settlement that keeps deadlocking runs again three times, then fails as any failed
/// settlement does: its connection closes, and its row waits for its lease.
#[test]
fn a_settlement_that_keeps_deadlocking_fails_after_three_reruns() {
    let mut sim = Sim::start(Dialect::Postgres, lease(), 1, &[0]);
    sim.hook(|_, command| match &command.action {
        Action::Execute { statement, .. }
            if matches!(statement.kind, StatementKind::Delete { fenced: true }) =>
        {
            Intercept::Answer(Reply::Failed(DbError::new(
                ErrorKind::Serialization,
                "deadlock detected",
            )))
        }
        _ => Intercept::Run,
    });
    let mark = sim.mark();
    let one = sim.delivery(0, 1);
    sim.settle(0, one, Outcome::Ack);
    sim.run();
    assert_eq!(
        sim.runs_of(0, mark, StatementKind::Delete { fenced: true })
            .len(),
        4,
        "the statement and three reruns"
    );
    let events = sim.events(0, mark);
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::SettleFailed { delivery, error: SettleError::Db(_) } if *delivery == one
        )),
        "{events:?}"
    );
    assert!(sim.ops(0, mark).contains(&Close));
    assert!(sim.db.rows.contains_key(&1), "the row stays, leased");
}

/// MySQL's `DELETE` and MariaDB's `UPDATE` return no rows: there, each settlement runs its
/// own statement, side by side.
#[test]
fn settlements_run_one_statement_each_where_the_database_returns_no_rows() {
    for (dialect, desc) in [
        (Dialect::MySql, lease()),
        (Dialect::MariaDb, lease_marked()),
    ] {
        let mut sim = Sim::start(dialect, desc, 3, &[0, 1, 2]);
        let mark = sim.mark();
        for row in [1, 2, 3] {
            sim.settle(0, sim.delivery(0, row), Outcome::Ack);
        }
        sim.run();
        let kind = match &sim.statements(0).form {
            FormStatements::Lease(f) => f.settle.kind,
            FormStatements::RowLock(f) => f.settle.kind,
            FormStatements::Advisory(f) => f.settle.kind,
        };
        assert_eq!(sim.runs_of(0, mark, kind).len(), 3, "{dialect:?}");
        assert!(
            !sim.ops(0, mark)
                .iter()
                .any(|o| matches!(o, Exec(StatementKind::SettleLeases(_)))),
            "{dialect:?}"
        );
    }
}

// ===== PostgreSQL: notifications at most every NOTIFY_EVERY =====

fn notifies(run: &Ran) -> bool {
    run.statement
        .as_ref()
        .is_some_and(|s| s.sql.contains("pg_notify"))
}

/// A publish within `NOTIFY_EVERY` of the publisher's last notification inserts without
/// notifying; one notification follows once that time has passed, after the insert took
/// effect.
#[test]
fn publishes_close_together_notify_once_then_once_more_after_notify_every() {
    let mut sim = Sim::start(Dialect::Postgres, advisory(), 1, &[]);
    let mark = sim.mark();
    sim.publish(0, 1).expect("publishes");
    sim.run();
    let first = only(sim.runs_of(0, mark, StatementKind::Publish));
    assert!(notifies(first), "the first publish notifies");
    let first_at = first.at;
    let mark = sim.mark();
    sim.publish(0, 2).expect("publishes");
    sim.publish(0, 3).expect("publishes");
    sim.run();
    let quiet = sim.runs_of(0, mark, StatementKind::Publish);
    assert_eq!(quiet.len(), 2);
    assert!(
        quiet.iter().all(|r| !notifies(r)),
        "within NOTIFY_EVERY, no notification"
    );
    assert!(sim.runs_of(0, mark, StatementKind::Notify).is_empty());
    assert_eq!(sim.timeout(0), Some(first_at.plus(NOTIFY_EVERY)));
    sim.advance_to(just_before(first_at.plus(NOTIFY_EVERY)));
    assert!(sim.runs_of(0, mark, StatementKind::Notify).is_empty());
    sim.advance_to(first_at.plus(NOTIFY_EVERY));
    let notify = only(sim.runs_of(0, mark, StatementKind::Notify));
    assert_eq!(
        notify.statement.as_ref().expect("a statement").sql.as_ref(),
        "SELECT pg_notify('ruststream', 'jobs')"
    );
    assert_eq!(notify.at, first_at.plus(NOTIFY_EVERY));
    assert_eq!(sim.db.rows.len(), 3);
    // Nothing more is owed; a publish after NOTIFY_EVERY notifies again.
    sim.advance(NOTIFY_EVERY * 10);
    assert_eq!(sim.runs_of(0, mark, StatementKind::Notify).len(), 1);
    let mark = sim.mark();
    sim.publish(0, 4).expect("publishes");
    sim.run();
    assert!(notifies(only(sim.runs_of(0, mark, StatementKind::Publish))));
}

/// A batch publish within `NOTIFY_EVERY` inserts quietly too, and a failed quiet publish owes
/// no notification.
#[test]
fn a_quiet_publish_that_failed_owes_no_notification() {
    let mut sim = Sim::start(Dialect::Postgres, advisory(), 1, &[]);
    sim.publish(0, 1).expect("publishes");
    sim.run();
    sim.hook(|_, command| match &command.action {
        Action::Execute { statement, .. } if statement.kind == StatementKind::Publish => {
            Intercept::Answer(Reply::Failed(DbError::new(
                ErrorKind::Other,
                "the disk is full",
            )))
        }
        _ => Intercept::Run,
    });
    let mark = sim.mark();
    sim.publish_all(0, 2, 3).expect("publishes");
    sim.run();
    assert!(sim.published(0, mark)[0].1.is_err());
    sim.advance(NOTIFY_EVERY * 10);
    assert!(sim.runs_of(0, mark, StatementKind::Notify).is_empty());
}

/// The shutdown sends the notification still owed before the broker closes.
#[test]
fn the_shutdown_sends_the_notification_owed() {
    let mut sim = Sim::start(Dialect::Postgres, advisory(), 1, &[]);
    sim.publish(0, 1).expect("publishes");
    sim.run();
    sim.publish(0, 2).expect("publishes");
    sim.run();
    let mark = sim.mark();
    sim.shutdown(0);
    sim.run();
    assert_eq!(sim.runs_of(0, mark, StatementKind::Notify).len(), 1);
    assert_eq!(sim.closed(0).len(), 1);
}

/// Only PostgreSQL notifies: elsewhere every publish is the same insert and nothing follows.
#[test]
fn other_databases_never_notify() {
    for dialect in [Dialect::MySql, Dialect::MariaDb, Dialect::Sqlite] {
        let mut sim = Sim::start(dialect, advisory(), 1, &[]);
        let mark = sim.mark();
        for channel in 0..3 {
            sim.publish(0, channel).expect("publishes");
        }
        sim.run();
        sim.advance(NOTIFY_EVERY * 10);
        assert_eq!(sim.runs_of(0, mark, StatementKind::Publish).len(), 3);
        assert!(sim.runs_of(0, mark, StatementKind::Notify).is_empty());
    }
}

// ===== the lease form: rows claimed ahead (prefetch) =====

fn start_prefetching(dialect: Dialect, workers: usize, prefetch: usize, channels: &[i64]) -> Sim {
    let mut sim = Sim::new(dialect, lease(), workers);
    sim.prefetch = prefetch;
    for &channel in channels {
        sim.insert(channel);
    }
    sim.spawn();
    sim.run();
    sim
}

/// A subscription claims up to `workers + prefetch` rows, hands `workers` of them to the
/// runtime, and hands the next one when a worker frees, without a claim.
#[test]
fn rows_claimed_ahead_wait_under_their_lease_and_go_to_the_next_free_worker() {
    for dialect in ALL {
        let mut sim = start_prefetching(dialect, 2, 2, &[0, 1, 2, 3, 4, 5]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{dialect:?}: two workers");
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
        let sub = sim.procs[0].sub;
        assert_eq!(sim.procs[0].broker.claimed_ahead(sub), 2, "{dialect:?}");
        for row in [3, 4] {
            assert_eq!(
                sim.row(row).locked_until,
                Some(T0.plus(LEASE_TIME).micros()),
                "{dialect:?}: row {row} is leased"
            );
        }
        assert_eq!(
            sim.row(5).locked_until,
            None,
            "{dialect:?}: four claimed in all"
        );
        let mark = sim.mark();
        hold_first_settlement(&mut sim);
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        // The worker is free once the handler has settled: row 3 goes to it at once, while
        // row 1's settlement has not even run, and without a claim.
        assert_eq!(
            sim.delivered_rows(0, mark),
            [3],
            "{dialect:?}: claimed ahead, in order"
        );
        assert!(sim.runs(0, mark).is_empty(), "{dialect:?}");
        sim.run();
        let held = sim.take_held(0);
        assert_eq!(held.len(), 1, "{dialect:?}: row 1's settlement");
        sim.hook(|_, _| Intercept::Run);
        for command in held {
            sim.run_command(0, command);
        }
        sim.run();
        assert!(!sim.db.rows.contains_key(&1), "{dialect:?}");
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
    }
}

/// A row claimed ahead is extended like a lease in work, so it is still held when handed.
#[test]
fn rows_claimed_ahead_are_extended_while_they_wait() {
    let mut sim = start_prefetching(Dialect::Postgres, 1, 1, &[0, 1]);
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    sim.advance_to(T0.plus(EXTEND));
    let extended: BTreeSet<Value> = sim
        .runs_of(0, 0, StatementKind::ExtendLease)
        .iter()
        .map(|r| r.bind(Arg::Id))
        .collect();
    assert_eq!(extended, BTreeSet::from([Value::Int(1), Value::Int(2)]));
    assert_eq!(
        sim.row(2).locked_until,
        Some(T0.plus(EXTEND).plus(LEASE_TIME).micros())
    );
}

/// A row claimed ahead whose lease another process took meanwhile is never handed, and the
/// runtime hears nothing of it.
#[test]
fn a_row_claimed_ahead_whose_lease_was_lost_is_never_handed() {
    let mut sim = start_prefetching(Dialect::Postgres, 1, 1, &[0, 1, 2]);
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    // Another process's lease on row 2.
    let theirs = T0.plus(LEASE_TIME * 9).micros();
    sim.db.rows.get_mut(&2).expect("row 2").locked_until = Some(theirs);
    let mark = sim.mark();
    sim.advance_to(T0.plus(EXTEND));
    assert!(
        !sim.events(0, mark)
            .iter()
            .any(|e| matches!(e, Event::LeaseLost { .. })),
        "{:?}",
        sim.events(0, mark)
    );
    sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
    sim.run();
    assert_ne!(
        sim.delivered_rows(0, mark).first(),
        Some(&2),
        "row 2 is not handed"
    );
    assert_eq!(sim.row(2).locked_until, Some(theirs), "row 2 is untouched");
}

/// When the subscription stops, the rows still waiting are given back at once (their
/// leases released), and no longer count as in work.
#[test]
fn stopping_gives_back_the_rows_claimed_ahead() {
    for dialect in ALL {
        let mut sim = start_prefetching(dialect, 1, 2, &[0, 1, 2]);
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
        let mark = sim.mark();
        let sub = sim.procs[0].sub;
        sim.procs[0].broker.stop(sub, sim.now);
        sim.poll(0);
        sim.run();
        assert_eq!(
            sim.runs_of(0, mark, StatementKind::ReleaseLease).len(),
            2,
            "{dialect:?}"
        );
        for row in [2, 3] {
            assert_eq!(
                sim.row(row).locked_until,
                None,
                "{dialect:?}: row {row} is back"
            );
        }
        assert_eq!(sim.procs[0].broker.claimed_ahead(sub), 0);
        assert_eq!(sim.in_work(0), 1, "{dialect:?}: the one in work goes on");
        assert!(
            !sim.events(0, mark)
                .iter()
                .any(|e| matches!(e, Event::Returned { .. } | Event::Delivered(_))),
            "{dialect:?}: {:?}",
            sim.events(0, mark)
        );
    }
}

/// At the shutdown, the rows claimed ahead are given back at once; the one in work keeps its
/// lease.
#[test]
fn the_shutdown_gives_back_the_rows_claimed_ahead() {
    let mut sim = start_prefetching(Dialect::Postgres, 1, 2, &[0, 1, 2]);
    let mark = sim.mark();
    sim.shutdown(0);
    sim.run();
    assert_eq!(sim.runs_of(0, mark, StatementKind::ReleaseLease).len(), 2);
    assert_eq!(sim.row(2).locked_until, None);
    assert_eq!(sim.row(3).locked_until, None);
    assert_eq!(sim.row(1).locked_until, Some(T0.plus(LEASE_TIME).micros()));
    assert_eq!(sim.closed(0).len(), 1);
}

// ===== the row lock and advisory forms: rows claimed ahead (prefetch) =====

fn prefetching(
    dialect: Dialect,
    desc: TableDesc,
    workers: usize,
    prefetch: usize,
    rows: i64,
) -> Sim {
    let mut sim = Sim::new(dialect, desc, workers);
    sim.prefetch = prefetch;
    for channel in 0..rows {
        sim.insert(channel);
    }
    sim.spawn();
    sim.run();
    sim
}

/// The row lock form: a row claimed ahead waits in its claim's transaction, on a connection of
/// its own, and goes to the next free worker without a claim.
#[test]
fn row_lock_rows_claimed_ahead_wait_in_their_transactions_and_go_to_the_next_free_worker() {
    for dialect in SERVERS {
        let mut sim = prefetching(dialect, row_lock(), 2, 2, 6);
        let sub = sim.procs[0].sub;
        assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{dialect:?}: two workers");
        assert_eq!(sim.procs[0].broker.claimed_ahead(sub), 2, "{dialect:?}");
        assert_eq!(
            sim.procs[0].broker.held_connections(),
            4,
            "{dialect:?}: a connection per row held"
        );
        let mut sessions = BTreeSet::new();
        for row in [1, 2, 3, 4] {
            let sess = *sim
                .db
                .row_locks
                .get(&row)
                .unwrap_or_else(|| panic!("{dialect:?}: row {row} is locked"));
            assert!(sim.db.sessions[&sess].in_tx, "{dialect:?}: row {row}");
            sessions.insert(sess);
        }
        assert_eq!(sessions.len(), 4, "{dialect:?}: a session of its own each");
        assert!(
            !sim.db.row_locks.contains_key(&5),
            "{dialect:?}: four claimed in all"
        );
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        // The freed worker takes row 3 at once, before anything has run.
        assert_eq!(
            sim.delivered_rows(0, mark),
            [3],
            "{dialect:?}: in claim order"
        );
        assert!(sim.runs(0, mark).is_empty(), "{dialect:?}");
        sim.run();
        assert!(
            !sim.db.rows.contains_key(&1),
            "{dialect:?}: row 1 is settled"
        );
        // Row 1's slot goes to the next claim, which claims row 5 ahead.
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
        assert_eq!(sim.procs[0].broker.claimed_ahead(sub), 2, "{dialect:?}");
        assert!(sim.db.row_locks.contains_key(&5), "{dialect:?}");
        assert_eq!(
            sim.row(3).attempt,
            1,
            "{dialect:?}: counted once, when claimed"
        );
    }
}

/// The advisory lock form: a row claimed ahead waits under its key's lock, on a connection of
/// its own, and goes to the next free worker without a claim.
#[test]
fn advisory_rows_claimed_ahead_wait_under_their_keys_and_go_to_the_next_free_worker() {
    for dialect in SERVERS {
        let mut sim = prefetching(dialect, advisory(), 1, 2, 4);
        let sub = sim.procs[0].sub;
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}: one worker");
        assert_eq!(sim.procs[0].broker.claimed_ahead(sub), 2, "{dialect:?}");
        assert_eq!(sim.procs[0].broker.held_connections(), 3, "{dialect:?}");
        for channel in 0..3 {
            let arg = lock_arg(dialect, &format!("jobs-{channel}"));
            assert!(
                sim.db.advisory.contains_key(&arg),
                "{dialect:?}: the key of channel {channel} is locked"
            );
        }
        let arg = lock_arg(dialect, "jobs-3");
        assert!(
            !sim.db.advisory.contains_key(&arg),
            "{dialect:?}: three in all"
        );
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        assert_eq!(
            sim.delivered_rows(0, mark),
            [2],
            "{dialect:?}: in claim order"
        );
        assert!(sim.runs(0, mark).is_empty(), "{dialect:?}");
        sim.run();
        assert!(!sim.db.rows.contains_key(&1), "{dialect:?}");
        assert!(
            !sim.db.advisory.contains_key(&lock_arg(dialect, "jobs-0")),
            "{dialect:?}: row 1's key is released"
        );
        assert_eq!(
            sim.procs[0].broker.claimed_ahead(sub),
            2,
            "{dialect:?}: rows 3 and 4"
        );
        assert_eq!(sim.in_work(0), 1, "{dialect:?}");
    }
}

/// Stopping the subscription gives back the rows claimed ahead at once: their transactions
/// roll back, or their keys' locks are released; the one in work goes on.
#[test]
fn stopping_gives_back_the_rows_claimed_ahead_in_every_form_that_holds_a_session() {
    for dialect in SERVERS {
        for desc in [row_lock(), advisory()] {
            let form = desc.form();
            let mut sim = prefetching(dialect, desc, 1, 2, 3);
            let sub = sim.procs[0].sub;
            assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?} {form:?}");
            assert_eq!(
                sim.procs[0].broker.claimed_ahead(sub),
                2,
                "{dialect:?} {form:?}"
            );
            let mark = sim.mark();
            sim.procs[0].broker.stop(sub, sim.now);
            sim.poll(0);
            sim.run();
            assert_eq!(
                sim.procs[0].broker.claimed_ahead(sub),
                0,
                "{dialect:?} {form:?}"
            );
            assert_eq!(
                sim.in_work(0),
                1,
                "{dialect:?} {form:?}: the one in work goes on"
            );
            assert_eq!(
                sim.procs[0].broker.held_connections(),
                1,
                "{dialect:?} {form:?}: the rows ahead gave their connections back"
            );
            let ops = sim.ops(0, mark);
            assert_eq!(
                ops.iter().filter(|op| **op == Release).count(),
                2,
                "{dialect:?} {form:?}: back to the pool, not closed: {ops:?}"
            );
            assert!(!ops.contains(&Close), "{dialect:?} {form:?}: {ops:?}");
            if form == Form::RowLock {
                assert_eq!(
                    sim.runs_of(0, mark, StatementKind::Rollback).len(),
                    2,
                    "{dialect:?}"
                );
                assert_eq!(sim.db.row_locks.keys().copied().collect::<Vec<_>>(), [1]);
            } else {
                assert_eq!(sim.db.advisory.len(), 1, "{dialect:?}: only row 1's key");
            }
            for row in [2, 3] {
                assert_eq!(sim.row(row).attempt, 1, "{dialect:?} {form:?}: row {row}");
            }
            assert!(
                !sim.events(0, mark)
                    .iter()
                    .any(|e| matches!(e, Event::Returned { .. } | Event::Delivered(_))),
                "{dialect:?} {form:?}: the runtime hears nothing of them: {:?}",
                sim.events(0, mark)
            );
        }
    }
}

/// At the shutdown the rows claimed ahead are given back with the rows in work, and the
/// advisory counts include their keys; nothing is held after it.
#[test]
fn the_shutdown_gives_back_the_rows_claimed_ahead_in_every_form_that_holds_a_session() {
    for dialect in SERVERS {
        for desc in [row_lock(), advisory()] {
            let form = desc.form();
            let mut sim = prefetching(dialect, desc, 1, 2, 3);
            sim.shutdown(0);
            sim.run();
            let (counts, _) = only(sim.closed(0));
            if form == Form::Advisory {
                assert_eq!(
                    counts.locks_released, 3,
                    "{dialect:?}: the key in work and the two ahead"
                );
            }
            assert!(sim.db.row_locks.is_empty(), "{dialect:?} {form:?}");
            assert!(sim.db.advisory.is_empty(), "{dialect:?} {form:?}");
            assert_eq!(
                sim.procs[0].broker.held_connections(),
                0,
                "{dialect:?} {form:?}"
            );
        }
    }
}

/// A crash returns the rows claimed ahead at once, as it returns the rows in work.
#[test]
fn a_crash_returns_the_rows_claimed_ahead_at_once() {
    for dialect in SERVERS {
        for desc in [row_lock(), advisory()] {
            let form = desc.form();
            let mut sim = prefetching(dialect, desc, 1, 2, 3);
            assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?} {form:?}");
            // A second process with three workers, claiming nothing ahead.
            sim.workers = 3;
            sim.prefetch = 0;
            let second = sim.spawn();
            sim.run();
            assert!(sim.delivered(second, 0).is_empty(), "{dialect:?} {form:?}");
            sim.crash(0);
            sim.advance(POLL);
            let mut rows = sim.delivered_rows(second, 0);
            rows.sort_unstable();
            assert_eq!(rows, [1, 2, 3], "{dialect:?} {form:?}");
        }
    }
}

/// A claim that reads the first due rows alone (SQLite's registry, a custom lock) claims
/// nothing ahead.
#[test]
fn a_claim_of_the_first_due_rows_alone_claims_nothing_ahead() {
    for (dialect, desc) in [
        (Dialect::Sqlite, advisory()),
        (Dialect::Sqlite, custom()),
        (Dialect::Postgres, custom()),
    ] {
        let sim = prefetching(dialect, desc, 1, 3, 4);
        let sub = sim.procs[0].sub;
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
        assert_eq!(sim.procs[0].broker.claimed_ahead(sub), 0, "{dialect:?}");
        assert_eq!(sim.procs[0].broker.held_connections(), 1, "{dialect:?}");
    }
}

/// A row claimed ahead that waited [`PING_AHEAD_AFTER`] is handed once its session answered a
/// `SELECT 1`; one that waited less is handed at once (above).
#[test]
fn a_row_claimed_ahead_that_waited_is_handed_once_its_session_answers() {
    for dialect in SERVERS {
        for desc in [row_lock(), advisory()] {
            let form = desc.form();
            let mut sim = prefetching(dialect, desc, 1, 1, 2);
            assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?} {form:?}");
            let conn = sim.conn_of(0, 2);
            sim.advance(PING_AHEAD_AFTER);
            let mark = sim.mark();
            sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
            assert!(
                sim.delivered(0, mark).is_empty(),
                "{dialect:?} {form:?}: not before its session answered"
            );
            sim.run();
            assert_eq!(
                sim.ops_on(0, conn, mark).first(),
                Some(&Exec(StatementKind::Ping)),
                "{dialect:?} {form:?}"
            );
            let d = only(sim.delivered(0, mark));
            assert_eq!(d.row, Some(2), "{dialect:?} {form:?}");
            assert_eq!(d.attempt, Some(1), "{dialect:?} {form:?}");
            assert_eq!(sim.in_work(0), 1, "{dialect:?} {form:?}");
        }
    }
}

/// A row claimed ahead whose session the server ended while it waited (its transaction or
/// its key's lock gone with it) is never handed: its connection closes, and the row is
/// claimed again, with its next attempt.
#[test]
fn a_row_claimed_ahead_whose_session_ended_is_never_handed() {
    for dialect in SERVERS {
        for desc in [row_lock(), advisory()] {
            let form = desc.form();
            let mut sim = prefetching(dialect, desc, 1, 1, 2);
            assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?} {form:?}");
            let sess = sim.sess_of(0, sim.conn_of(0, 2));
            sim.advance(PING_AHEAD_AFTER);
            sim.db.kill(sess);
            let mark = sim.mark();
            sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
            sim.run();
            let handed = sim.delivered(0, mark);
            assert!(
                handed.iter().all(|d| d.attempt == Some(2)),
                "{dialect:?} {form:?}: the stale claim of row 2 is never handed: {handed:?}"
            );
            let d = only(handed);
            assert_eq!(d.row, Some(2), "{dialect:?} {form:?}: claimed again");
            assert!(
                sim.events(0, mark)
                    .iter()
                    .any(|e| matches!(e, Event::Error { .. })),
                "{dialect:?} {form:?}: the lost session is told"
            );
            assert_eq!(sim.row(2).attempt, 2, "{dialect:?} {form:?}");
        }
    }
}

/// A MySQL count's select that answers more rows than it asked for, or one row twice (a
/// server or driver that breaks its `LIMIT`): the claim counts the rows it may, once each,
/// and goes on to lock and deliver them, rather than leaving its connection in a
/// transaction with nothing after it.
#[test]
fn a_count_select_answering_more_rows_than_asked_counts_those_it_may() {
    let mut sim = Sim::new(Dialect::MySql, row_lock(), 1);
    let first = sim.insert(0);
    let second = sim.insert(1);
    let mut answered = false;
    sim.hook(move |_, c| match kind_of(c) {
        Some(StatementKind::SelectRowId) if !answered => {
            answered = true;
            let row = |id: i64| {
                Row::values(vec![
                    Value::Int(id),
                    Value::Int(0),
                    Db::mark_value(Dialect::MySql, id),
                ])
            };
            Intercept::Answer(Reply::Rows(vec![row(first), row(first), row(second)]))
        }
        _ => Intercept::Run,
    });
    let p = sim.spawn();
    sim.run();
    let delivered = sim.delivered(p, 0);
    assert_eq!(
        delivered.iter().map(|d| d.row).collect::<Vec<_>>(),
        [Some(first)],
        "one worker: the first row, counted once"
    );
    assert_eq!(sim.db.rows[&first].attempt, 1);
    assert_eq!(
        sim.db.rows[&second].attempt, 0,
        "the row past the limit is not counted"
    );
    assert_eq!(
        sim.procs[p].broker.held_connections(),
        1,
        "the delivery's connection only"
    );
}

/// Two processes claim from one table in the row lock form with an attempt column. Between the
/// first one's count and its locks no transaction holds the counted rows; the second one's
/// count passes over them (the first holds their marks) and counts the others, so every row
/// is counted once and taken at attempt 1. The marks go once the locks have answered.
#[test]
fn a_count_passes_over_rows_another_process_counted_and_has_not_locked_yet() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, row_lock(), 2);
        for _ in 0..4 {
            sim.insert(0);
        }
        // The first process's locks of its counted rows wait.
        sim.hook(|p, c| {
            if p == 0 && locks_by_id(c) {
                Intercept::Hold
            } else {
                Intercept::Run
            }
        });
        let first = sim.spawn();
        sim.run();
        let counted: Vec<i64> = sim
            .db
            .rows
            .iter()
            .filter(|(_, r)| r.attempt == 1)
            .map(|(id, _)| *id)
            .collect();
        assert!(
            !counted.is_empty(),
            "{dialect:?}: the first process counted"
        );
        assert_eq!(
            sim.db.marks.keys().copied().collect::<Vec<_>>(),
            counted,
            "{dialect:?}: and holds their marks until its locks answer"
        );
        let second = sim.spawn();
        sim.run();
        let taken = sim.delivered_rows(second, 0);
        assert!(
            !taken.is_empty() && taken.iter().all(|row| !counted.contains(row)),
            "{dialect:?}: the second process takes rows the first did not count: {taken:?}, counted {counted:?}"
        );
        sim.hook(|_, _| Intercept::Run);
        for command in sim.take_held(first) {
            sim.run_command(first, command);
        }
        sim.run();
        let mut all = sim.delivered_rows(first, 0);
        assert!(
            counted.iter().all(|row| all.contains(row)),
            "{dialect:?}: the first process takes the rows it counted: {all:?}"
        );
        all.extend(sim.delivered_rows(second, 0));
        all.sort_unstable();
        assert_eq!(all, [1, 2, 3, 4], "{dialect:?}: each row taken once");
        for p in [first, second] {
            for d in sim.delivered(p, 0) {
                assert_eq!(d.attempt, Some(1), "{dialect:?}: {:?} counted once", d.id);
            }
        }
        for row in sim.db.rows.values() {
            assert_eq!(row.attempt, 1, "{dialect:?}: every row counted once");
        }
        assert_eq!(
            sim.db.superseded, 0,
            "{dialect:?}: no lock found its row recounted"
        );
        assert!(
            sim.db.marks.is_empty(),
            "{dialect:?}: no mark is left: {:?}",
            sim.db.marks
        );
    }
}

/// A count's leader that stops before its rows are locked (the broker shuts down between the
/// count and the locks) closes its connection instead of giving it back to the pool with the
/// marks held: the marks end with the session, and the counted rows are free.
#[test]
fn a_leader_that_ends_holding_marks_closes_its_connection() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, row_lock(), 2);
        for _ in 0..2 {
            sim.insert(0);
        }
        sim.hook(|_, c| {
            if kind_of(c) == Some(StatementKind::Begin) {
                Intercept::Hold
            } else {
                Intercept::Run
            }
        });
        let p = sim.spawn();
        sim.run();
        // The MySQL count's own BEGIN waits too: let it and its count through.
        loop {
            let held = sim.take_held(p);
            if !sim.db.marks.is_empty() || held.is_empty() {
                sim.procs[p].held = held;
                break;
            }
            for command in held {
                sim.run_command(p, command);
            }
            sim.run();
        }
        assert!(
            !sim.db.marks.is_empty(),
            "{dialect:?}: the count marked its rows"
        );
        sim.shutdown(p);
        sim.hook(|_, _| Intercept::Run);
        for command in sim.take_held(p) {
            sim.run_command(p, command);
        }
        sim.run();
        assert!(
            sim.db.marks.is_empty(),
            "{dialect:?}: the marks ended with the leader's session: {:?}",
            sim.db.marks
        );
        assert!(
            sim.events(p, 0)
                .iter()
                .any(|e| matches!(e, Event::Closed(_))),
            "{dialect:?}: the broker closed"
        );
    }
}

/// A count answered after the shutdown began takes no row: its leader closes its connection
/// instead of giving it back to the pool, and the marks end with the session.
#[test]
fn a_count_answered_after_the_shutdown_leaves_no_mark() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, row_lock(), 1);
        for _ in 0..4 {
            sim.insert(0);
        }
        let counting = if dialect == Dialect::Postgres {
            StatementKind::CountRow
        } else {
            StatementKind::MarkRows(1)
        };
        sim.hook(move |_, c| {
            if kind_of(c) == Some(counting) {
                Intercept::Hold
            } else {
                Intercept::Run
            }
        });
        let p = sim.spawn();
        sim.run();
        let held = sim.take_held(p);
        assert_eq!(held.len(), 1, "{dialect:?}: the count waits");
        let reply = sim.exec(p, &held[0]);
        assert!(
            !sim.db.marks.is_empty(),
            "{dialect:?}: the count marked its row"
        );
        sim.shutdown(p);
        sim.run();
        sim.hook(|_, _| Intercept::Run);
        sim.answer(p, held[0].clone(), reply);
        sim.run();
        assert!(
            sim.db.violations.is_empty(),
            "{dialect:?}: {:?}",
            sim.db.violations
        );
        assert!(sim.db.marks.is_empty(), "{dialect:?}: {:?}", sim.db.marks);
        assert!(
            sim.ops(p, 0).contains(&Close),
            "{dialect:?}: the leader's connection closed: {:?}",
            sim.ops(p, 0)
        );
        assert!(
            sim.events(p, 0)
                .iter()
                .any(|e| matches!(e, Event::Closed(_))),
            "{dialect:?}: the broker closed"
        );
    }
}

/// A counted row's lock that finds the row held (a count of another process that looks at it,
/// or any other transaction) passes it over and tries again shortly, holding the row's mark
/// meanwhile: once the row is free the claim takes it at its count. Held past the tries
/// (ten, over about a second), the claim gives the row up: its attempt spent, its mark
/// released, and the next claim counts it again.
#[test]
fn a_counted_row_found_held_is_locked_again_shortly() {
    for dialect in SERVERS {
        for released in [true, false] {
            let mut sim = Sim::new(dialect, row_lock(), 1);
            let row = sim.insert(0);
            sim.hook(|_, c| {
                if locks_by_id(c) {
                    Intercept::Hold
                } else {
                    Intercept::Run
                }
            });
            let p = sim.spawn();
            sim.run();
            let held = sim.take_held(p);
            assert_eq!(held.len(), 1, "{dialect:?}: the counted row's lock waits");
            // Another transaction takes the row before the lock runs.
            const FOREIGN: SessId = 9_999;
            sim.db.row_locks.insert(row, FOREIGN);
            sim.hook(|_, _| Intercept::Run);
            for command in held {
                sim.run_command(p, command);
            }
            sim.run();
            sim.advance(Duration::from_millis(6));
            assert!(
                sim.delivered_rows(p, 0).is_empty(),
                "{dialect:?}: the held row is not taken"
            );
            assert_eq!(
                sim.runs_of(p, 0, StatementKind::LockRowByIdUnmarking).len(),
                3,
                "{dialect:?}: the lock tried again at 1 and 3 ms"
            );
            assert_eq!(
                sim.db.marks.keys().copied().collect::<Vec<_>>(),
                [row],
                "{dialect:?}: the mark is kept while the lock tries again"
            );
            if released {
                sim.db.row_locks.remove(&row);
                sim.advance(Duration::from_millis(8));
                let delivered = sim.delivered(p, 0);
                assert_eq!(delivered.len(), 1, "{dialect:?}: taken once free");
                assert_eq!(delivered[0].attempt, Some(1), "{dialect:?}: at its count");
            } else {
                sim.advance(Duration::from_millis(1_100));
                assert!(sim.delivered_rows(p, 0).is_empty(), "{dialect:?}");
                assert_eq!(
                    sim.runs_of(p, 0, StatementKind::LockRowByIdUnmarking).len(),
                    11,
                    "{dialect:?}: ten tries again, then the row is given up"
                );
                assert_eq!(sim.row(row).attempt, 1, "{dialect:?}: its attempt spent");
            }
            assert!(
                sim.db.marks.is_empty(),
                "{dialect:?}: the mark is released: {:?}",
                sim.db.marks
            );
            if !released {
                // Free again, the row is counted and taken by the next claim.
                sim.db.row_locks.remove(&row);
                sim.advance(POLL * 2);
                let delivered = sim.delivered(p, 0);
                assert_eq!(delivered.len(), 1, "{dialect:?}: taken by a later claim");
                assert_eq!(delivered[0].attempt, Some(2), "{dialect:?}");
            }
        }
    }
}

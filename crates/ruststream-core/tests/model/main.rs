//! Model-based tests of the broker machine: several processes, each a `Broker`, run against one
//! in-memory database under random interleavings of statements and replies, failed
//! statements, lost connections, crashed processes, dropped deliveries and shutdowns, each
//! process's clock off the database's by up to three leases either way (the database keeps
//! its own). After every step the invariants of the design hold:
//!
//! - a row is in work with at most one delivery (in the lease form, while its lease holds by
//!   the database's clock); in the advisory form, a key is in work with at most one delivery,
//!   across every process;
//! - a delivery is handed out only while its row or key is held, and its attempt is the row's;
//! - every claimed row ends settled or returns to the queue: after the chaos, a clean process
//!   drains every row that was not settled;
//! - no row leaves the table but by an acknowledgement; a row is marked failed only when it was
//!   rejected or its take counted past `max_attempts`; a failed row, a row not yet due and a
//!   row past its budget are never handed; a row's attempts never pass the budget plus one
//!   plus the interruptions (failed statements, crashes, shutdowns, drops, lapsed leases);
//! - after shutdown the broker holds no lock and no transaction, and publishing is refused.
//!
//! A shrunk failure prints the schedule: the list of steps, each readable. With
//! `RUSTSTREAM_MODEL_LOG=1`, each failing run also prints the commands it ran and the events
//! it saw, newest first.

mod db;
mod scenarios;
mod sim;

use std::collections::BTreeMap;
use std::time::Duration;

use db::{Db, SessId, key_text, lock_arg};
use proptest::prelude::*;
use ruststream_core::spec::{
    Advisory, Attempt, Column, Due, ErrorText, Failed, InboxSpec, KeyPart, Lease, Payload,
    Processed, own,
};
use ruststream_core::{
    Action, Broker, BrokerError, CONNECTION_LINGER, Command, CommandId, ConnId, DbError,
    DeliveryId, Dialect, ErrorKind, Event, Form, Outcome, Publish, PublisherId, Reply, Settlement,
    SubId, SubscribeOptions, TableDesc, Time, Value,
};

const ROW_LOCK: InboxSpec<(Payload, Attempt, Due, Failed, ErrorText)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .due(Column::new("due_at"))
        .failed(Column::new("failed_at"))
        .error(Column::new("error"));

/// Claimed in id order (no due column): the claims start past the rows taken before them.
const ROW_LOCK_BY_ID: InboxSpec<(Payload, Attempt, Failed, ErrorText)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .failed(Column::new("failed_at"))
        .error(Column::new("error"));

const LEASE: InboxSpec<(Payload, Attempt, Due, Lease, Failed, ErrorText)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .due(Column::new("due_at"))
        .lease(Column::new("locked_until"))
        .failed(Column::new("failed_at"))
        .error(Column::new("error"));

const LEASE_MARKED: InboxSpec<(Payload, Attempt, Lease, Processed)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"))
        .processed_at(Column::new("processed_at"));

const KEY: &[KeyPart] = &[KeyPart::Literal("jobs-"), KeyPart::Column("channel")];

const ADVISORY: InboxSpec<(Advisory, Attempt, Payload, Failed)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .advisory(KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .failed(Column::new("failed_at"));

const CUSTOM: InboxSpec<(Advisory, Attempt, Payload, own::Lock, own::Unlock)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .advisory(KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .own::<own::Lock>()
        .own::<own::Unlock>();

const LEASE_TIME: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_secs(1);

/// A table, a dialect and a number of workers.
#[derive(Clone, Copy, Debug)]
struct Config {
    dialect: Dialect,
    table: Table,
    workers: usize,
    processes: usize,
    /// The brokers' connection linger: none, or the default.
    linger: Duration,
    /// Rows claimed ahead beyond the workers.
    prefetch: usize,
    /// The attempt budget, on tables that keep failed rows.
    max_attempts: Option<u32>,
    /// How far each slot's clock runs ahead of the database's (behind where negative), in
    /// microseconds: by more than a lease, so that no process's clock may decide whether a
    /// row is held.
    skew: [i64; 4],
}

/// Every process's clock reads the database's.
const NO_SKEW: [i64; 4] = [0; 4];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Table {
    RowLock,
    RowLockById,
    Lease,
    LeaseMarked,
    Advisory,
    Custom,
}

impl Table {
    fn desc(self) -> TableDesc {
        *match self {
            Table::RowLock => ROW_LOCK.desc(),
            Table::RowLockById => ROW_LOCK_BY_ID.desc(),
            Table::Lease => LEASE.desc(),
            Table::LeaseMarked => LEASE_MARKED.desc(),
            Table::Advisory => ADVISORY.desc(),
            Table::Custom => CUSTOM.desc(),
        }
    }
}

/// One step of a schedule. Indices pick among what exists then, modulo its number.
#[derive(Clone, Debug)]
enum Step {
    /// A process's adapter runs one of its waiting commands on the database.
    Run { process: usize, command: usize },
    /// The same, but the statement fails; `lost` drops the connection too.
    Fail {
        process: usize,
        command: usize,
        lost: bool,
    },
    /// A reply reaches a process's broker.
    Reply { process: usize, reply: usize },
    /// A handler settles its message; a retry waits `delay_ms`.
    Settle {
        process: usize,
        handler: usize,
        outcome: Outcome,
        delay_ms: u64,
    },
    /// A handler is dropped unsettled.
    Drop { process: usize, handler: usize },
    /// A handler asks for its row lock claim's transaction, to write in it.
    Lend { process: usize, handler: usize },
    /// Time passes.
    Advance { millis: u64 },
    /// A process dies (SIGKILL) and starts again.
    Crash { process: usize },
    /// A process shuts down.
    Shutdown { process: usize },
    /// A row is published, with this channel.
    Publish { process: usize, channel: i64 },
    /// Several rows in one publish.
    PublishAll {
        process: usize,
        channel: i64,
        rows: usize,
    },
    /// Another system's session takes a key's lock (the database's lock, as the billing of
    /// the custom lock example would), or releases the one it holds.
    Foreign { channel: i64, hold: bool },
    /// Every process runs what it can at this time, then the liveness invariant holds.
    Check,
}

fn step() -> impl Strategy<Value = Step> {
    let outcome = prop_oneof![
        6 => Just(Outcome::Ack),
        3 => Just(Outcome::Retry),
        1 => Just(Outcome::Reject),
    ];
    prop_oneof![
        30 => (0..4usize, 0..8usize).prop_map(|(process, command)| Step::Run { process, command }),
        3 => (0..4usize, 0..8usize, any::<bool>())
            .prop_map(|(process, command, lost)| Step::Fail { process, command, lost }),
        30 => (0..4usize, 0..8usize).prop_map(|(process, reply)| Step::Reply { process, reply }),
        8 => (0..4usize, 0..8usize, outcome, prop_oneof![Just(0u64), 0..5_000u64])
            .prop_map(|(process, handler, outcome, delay_ms)| {
                Step::Settle { process, handler, outcome, delay_ms }
            }),
        1 => (0..4usize, 0..8usize).prop_map(|(process, handler)| Step::Drop { process, handler }),
        2 => (0..4usize, 0..8usize).prop_map(|(process, handler)| Step::Lend { process, handler }),
        6 => prop_oneof![0..2_000u64, 0..70_000u64].prop_map(|millis| Step::Advance { millis }),
        1 => (0..4usize).prop_map(|process| Step::Crash { process }),
        1 => (0..4usize).prop_map(|process| Step::Shutdown { process }),
        4 => (0..4usize, 0..4i64).prop_map(|(process, channel)| Step::Publish { process, channel }),
        1 => (0..4usize, 0..4i64, 2..6usize)
            .prop_map(|(process, channel, rows)| Step::PublishAll { process, channel, rows }),
    ]
}

#[derive(Debug)]
struct Handler {
    row: i64,
    key: Option<String>,
    /// The session that held the row or the key when the message was delivered.
    holder: Option<SessId>,
    /// The lease form: the expiry the row held when the message was delivered, by the
    /// database's clock.
    lease: Option<i64>,
}

struct Process {
    broker: Broker<i64>,
    sub: SubId,
    publisher: PublisherId,
    /// Commands polled and not yet run.
    waiting: Vec<Command>,
    /// Replies computed and not yet handed to the broker.
    replies: Vec<(CommandId, Reply<i64>)>,
    /// Commands that run SQL, polled and not yet answered.
    sql_outstanding: std::collections::BTreeSet<CommandId>,
    conns: BTreeMap<ConnId, SessId>,
    closed_conns: std::collections::BTreeSet<ConnId>,
    handlers: BTreeMap<DeliveryId, Handler>,
    /// Advisory deliveries in work when the shutdown began.
    held_at_shutdown: usize,
    shutdown: bool,
    closed: bool,
}

struct World {
    config: Config,
    desc: TableDesc,
    db: Db,
    now: Time,
    processes: Vec<Process>,
    /// The process number of each slot, which changes when it restarts.
    ids: Vec<usize>,
    next_id: usize,
    /// The last attempt delivered per row.
    attempts: BTreeMap<i64, i64>,
    settled: BTreeMap<i64, u32>,
    /// Rows a handler acknowledged: the only rows that may leave the table.
    acked: std::collections::BTreeSet<i64>,
    /// Rows a handler rejected: with the attempt budget, the only rows that may fail.
    rejected: std::collections::BTreeSet<i64>,
    /// Steps that may cut a take or a settlement short: failed statements, crashes,
    /// shutdowns, drops, and in the lease form time passing (a lease that lapses).
    interruptions: u64,
    log: Vec<String>,
    /// Counts every command run and every change outside the brokers: the order of looks,
    /// releases and inserts.
    tick: u64,
    /// By slot: when the process ran its advisory claims' candidates, each with the keys the
    /// look passed over, and by lock argument when it last tried a key's lock.
    looked: Vec<Vec<(u64, Vec<String>)>>,
    tried: Vec<BTreeMap<Value, u64>>,
    /// By lock argument: when a session last released the key, and the process it belonged to.
    released: BTreeMap<Value, (u64, usize)>,
    /// By row: when it was inserted, and by which process (`None`: another program).
    inserted: BTreeMap<i64, (u64, Option<usize>)>,
    /// The other system's session that holds keys.
    foreign: Option<SessId>,
    /// By row: until when (the database's clock) a retry's delay may keep it in a process,
    /// on a table with nowhere to write it.
    waits_until: BTreeMap<i64, i64>,
    /// By row: the process that retried it on such a table, the delivery, and until when
    /// (the database's clock) that process may not take it again.
    retried_here: BTreeMap<i64, (usize, DeliveryId, i64)>,
}

/// The process number of the other system whose session holds keys.
const FOREIGN: usize = 1_000;

fn start(desc: TableDesc, config: Config, now: Time) -> Process {
    let mut broker = Broker::new(config.dialect);
    broker.set_connection_linger(config.linger);
    let options = SubscribeOptions {
        workers: config.workers,
        poll_interval: POLL,
        lease: LEASE_TIME,
        extend_every: Duration::from_secs(10),
        prefetch: config.prefetch,
        max_attempts: config.max_attempts,
        row_fields: &[],
        ..SubscribeOptions::default()
    };
    let sub = broker.subscribe(desc, options, now).expect("subscribes");
    let publisher = broker.publisher(desc).expect("publishes");
    Process {
        broker,
        sub,
        publisher,
        waiting: Vec::new(),
        replies: Vec::new(),
        sql_outstanding: Default::default(),
        conns: BTreeMap::new(),
        closed_conns: Default::default(),
        handlers: BTreeMap::new(),
        held_at_shutdown: 0,
        shutdown: false,
        closed: false,
    }
}

impl World {
    fn new(config: Config) -> Self {
        let desc = config.table.desc();
        let now = Time(1_700_000_000_000_000);
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

    fn form(&self) -> Form {
        self.desc.form()
    }

    /// Drains a process's broker: commands wait to run, events are handled.
    fn pump(&mut self, slot: usize) {
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

    fn on_event(&mut self, slot: usize, event: Event<i64>) {
        self.log
            .push(format!("  p{} event {event:?}", self.ids[slot]));
        match event {
            Event::Lent { delivery, conn } => {
                let p = &self.processes[slot];
                if let Some(conn) = conn {
                    let handler = p
                        .handlers
                        .get(&delivery)
                        .unwrap_or_else(|| panic!("{delivery} lent but not in work"));
                    let session = p.conns.get(&conn).copied();
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
            Event::Delivered(d) => {
                let row = d.row.expect("the row");
                assert_eq!(d.id, Value::Int(row));
                let key = d.key.as_deref().map(str::to_owned);
                let db_row = self
                    .db
                    .rows
                    .get(&row)
                    .unwrap_or_else(|| panic!("row {row} delivered but not in the table"));
                if self.desc.advisory.is_some() {
                    assert_eq!(key.as_deref(), Some(key_text(db_row.channel).as_str()));
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
                // The attempt handed out is the row's, and grows with every take.
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
                // Delivered only while held.
                let holder = self.holder_of(slot, row, key.as_deref());
                match self.form() {
                    Form::Lease => {
                        let until = db_row.locked_until.expect("a leased row has an expiry");
                        assert!(
                            until > self.now.micros(),
                            "row {row} delivered with a lease that ran out"
                        );
                    }
                    Form::Advisory
                        if self.config.dialect == Dialect::Sqlite
                            && self.config.table != Table::Custom => {}
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
                // No other live delivery of the row, or of the key, anywhere.
                for (other_slot, p) in self.processes.iter().enumerate() {
                    for h in p.handlers.values() {
                        if !self.still_held(other_slot, h) {
                            continue;
                        }
                        assert_ne!(h.row, row, "row {row} is in work twice");
                        if self.form() == Form::Advisory {
                            assert_ne!(h.key, key, "key {key:?} is in work twice");
                        }
                    }
                }
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
            Event::Closed(counts) => {
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
        }
    }

    fn run_command(&mut self, slot: usize, index: usize, fail: Option<bool>) {
        let p = &mut self.processes[slot];
        if p.waiting.is_empty() {
            return;
        }
        let command = p.waiting.remove(index % p.waiting.len());
        let process = self.ids[slot];
        self.tick += 1;
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
        if p.closed_conns.contains(&command.conn) {
            // Closed while this command waited: the adapter cuts it short.
            assert!(
                !matches!(
                    command.action,
                    Action::Acquire | Action::Release | Action::Close
                ),
                "{:?} on {} after it was closed",
                command.action,
                command.conn
            );
            let lost = DbError::new(ErrorKind::ConnectionLost, "the connection was closed");
            self.processes[slot]
                .replies
                .push((command.id, Reply::Failed(lost)));
            return;
        }
        let reply = match (&command.action, fail) {
            (Action::Acquire, Some(_)) => {
                Reply::Failed(DbError::new(ErrorKind::PoolClosed, "no connection"))
            }
            (Action::Acquire, None) => {
                let sess = self.db.acquire(process);
                p.conns.insert(command.conn, sess);
                Reply::Done
            }
            (Action::Release, _) => {
                let sess = p.conns.remove(&command.conn).expect("a held connection");
                if self.db.sessions[&sess].alive {
                    self.db.release(sess);
                }
                Reply::Done
            }
            (Action::Close, _) => {
                p.closed_conns.insert(command.conn);
                let sess = p.conns.remove(&command.conn).expect("a held connection");
                self.db.kill(sess);
                Reply::Done
            }
            (_, Some(lost)) => {
                let sess = p.conns[&command.conn];
                if lost {
                    self.db.kill(sess);
                    Reply::Failed(DbError::new(ErrorKind::ConnectionLost, "connection lost"))
                } else if command.id.0.is_multiple_of(2) {
                    // A deadlock or serialization failure: the statement rolled back, and it
                    // may run again.
                    Reply::Failed(DbError::new(ErrorKind::Serialization, "deadlock detected"))
                } else {
                    Reply::Failed(DbError::new(ErrorKind::Other, "statement failed"))
                }
            }
            (Action::Execute { statement, binds }, None) => {
                let sess = *p
                    .conns
                    .get(&command.conn)
                    .unwrap_or_else(|| panic!("{} was never acquired", command.conn));
                self.db.clock = self.now.micros();
                self.db
                    .execute(self.config.dialect, &self.desc, sess, statement, binds)
            }
            (Action::Lock { key, .. }, None) => {
                let sess = p.conns[&command.conn];
                self.db.custom_lock(sess, key)
            }
            (Action::Unlock { key, .. }, None) => {
                let sess = p.conns[&command.conn];
                self.db.custom_unlock(sess, key)
            }
        };
        assert!(self.db.violations.is_empty(), "{:?}", self.db.violations);
        self.note_changes(locks, rows, Some(process));
        self.processes[slot].replies.push((command.id, reply));
    }

    /// The time by the clock of the process in `slot`.
    fn local(&self, slot: usize) -> Time {
        Time(self.now.0 + self.config.skew[slot % self.config.skew.len()])
    }

    fn deliver_reply(&mut self, slot: usize, index: usize) {
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

    /// No row left the table but by an acknowledgement, and only a rejected row, or one past
    /// its attempt budget, is marked failed.
    fn check_no_loss(&self) {
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

    fn apply(&mut self, step: &Step) {
        self.apply_step(step);
        self.check_no_loss();
    }

    fn apply_step(&mut self, step: &Step) {
        self.log.push(format!("{step:?}"));
        let interrupts = match step {
            Step::Fail { .. } | Step::Crash { .. } | Step::Shutdown { .. } | Step::Drop { .. } => {
                true
            }
            Step::Advance { .. } => self.form() == Form::Lease,
            _ => false,
        };
        if interrupts {
            self.interruptions += 1;
        }
        let slots = self.processes.len();
        match *step {
            Step::Foreign { channel, hold } => self.foreign(channel, hold),
            Step::Check => {
                self.quiesce();
                self.check_liveness();
            }
            Step::Run { process, command } => self.run_command(process % slots, command, None),
            Step::Fail {
                process,
                command,
                lost,
            } => self.run_command(process % slots, command, Some(lost)),
            Step::Reply { process, reply } => self.deliver_reply(process % slots, reply),
            Step::Settle {
                process,
                handler,
                outcome,
                delay_ms,
            } => {
                let slot = process % slots;
                let now = self.local(slot);
                let p = &mut self.processes[slot];
                if p.handlers.is_empty() {
                    return;
                }
                let id = *p
                    .handlers
                    .keys()
                    .nth(handler % p.handlers.len())
                    .expect("a handler");
                let h = p.handlers.remove(&id).expect("a handler");
                // A retry at the last attempt the budget allows fails the row at once.
                let last = self.config.max_attempts.is_some_and(|max| {
                    self.attempts
                        .get(&h.row)
                        .is_some_and(|a| *a >= i64::from(max))
                });
                if outcome != Outcome::Retry || last {
                    *self.settled.entry(h.row).or_default() += 1;
                }
                match outcome {
                    Outcome::Ack => self.acked.insert(h.row),
                    Outcome::Reject => self.rejected.insert(h.row),
                    Outcome::Retry if last => self.rejected.insert(h.row),
                    Outcome::Retry => false,
                };
                let mut settlement = Settlement::new(outcome).error(format!("error of {}", h.row));
                if delay_ms > 0 {
                    settlement = settlement.delay(Duration::from_millis(delay_ms));
                    let until = self.now.plus(Duration::from_millis(delay_ms)).micros();
                    self.waits_until.insert(h.row, until);
                    let nowhere = self.desc.due.is_none() && self.desc.locked_until.is_none();
                    if nowhere && outcome == Outcome::Retry {
                        self.retried_here.insert(h.row, (self.ids[slot], id, until));
                    }
                }
                p.broker.settle_with(id, settlement, now);
                self.pump(slot);
            }
            Step::Drop { process, handler } => {
                let slot = process % slots;
                let now = self.local(slot);
                let p = &mut self.processes[slot];
                if p.handlers.is_empty() {
                    return;
                }
                let id = *p
                    .handlers
                    .keys()
                    .nth(handler % p.handlers.len())
                    .expect("a handler");
                p.handlers.remove(&id);
                p.broker.drop_delivery(id, now);
                self.pump(slot);
            }
            Step::Lend { process, handler } => {
                let slot = process % slots;
                let now = self.local(slot);
                let p = &mut self.processes[slot];
                if p.handlers.is_empty() {
                    return;
                }
                let id = *p
                    .handlers
                    .keys()
                    .nth(handler % p.handlers.len())
                    .expect("a handler");
                p.broker.lend_transaction(id, now);
                self.pump(slot);
            }
            Step::Advance { millis } => {
                self.now = self.now.plus(Duration::from_millis(millis));
                for slot in 0..slots {
                    let now = self.local(slot);
                    let due = self.processes[slot]
                        .broker
                        .poll_timeout()
                        .is_some_and(|t| t <= now);
                    if due {
                        self.processes[slot].broker.handle_timeout(now);
                        self.pump(slot);
                    }
                }
            }
            Step::Crash { process } => {
                let slot = process % slots;
                let locks = self.db.advisory.clone();
                self.tick += 1;
                self.db.kill_process(self.ids[slot]);
                self.note_changes(locks, self.db.next_id, None);
                self.looked[slot].clear();
                self.tried[slot].clear();
                self.ids[slot] = self.next_id;
                self.next_id += 1;
                self.processes[slot] = start(self.desc, self.config, self.local(slot));
                self.pump(slot);
            }
            Step::Shutdown { process } => {
                let slot = process % slots;
                let now = self.local(slot);
                let p = &mut self.processes[slot];
                if p.shutdown {
                    return;
                }
                p.shutdown = true;
                p.held_at_shutdown = p.handlers.len();
                p.broker.shutdown(now);
                self.pump(slot);
                // A publisher kept past the shutdown writes nothing.
                let rows = self.db.rows.len();
                let p = &mut self.processes[slot];
                let refused = p.broker.publish(p.publisher, publish(&self.desc, 0), now);
                assert_eq!(refused, Err(BrokerError::Closed));
                assert_eq!(self.db.rows.len(), rows);
            }
            Step::PublishAll {
                process,
                channel,
                rows,
            } => {
                let slot = process % slots;
                let now = self.local(slot);
                let p = &mut self.processes[slot];
                if p.shutdown {
                    let (locks, before) = (self.db.advisory.clone(), self.db.next_id);
                    self.tick += 1;
                    for _ in 0..rows {
                        self.db.insert(channel, self.now.micros());
                    }
                    self.note_changes(locks, before, None);
                    return;
                }
                let batch = (0..rows).map(|_| publish(&self.desc, channel)).collect();
                p.broker
                    .publish_all(p.publisher, batch, now)
                    .expect("a running broker publishes");
                p.broker.wake(p.sub, now);
                self.pump(slot);
            }
            Step::Publish { process, channel } => {
                let slot = process % slots;
                let now = self.local(slot);
                let p = &mut self.processes[slot];
                if p.shutdown {
                    let (locks, rows) = (self.db.advisory.clone(), self.db.next_id);
                    self.tick += 1;
                    self.db.insert(channel, self.now.micros());
                    self.note_changes(locks, rows, None);
                    return;
                }
                p.broker
                    .publish(p.publisher, publish(&self.desc, channel), now)
                    .expect("a running broker publishes");
                p.broker.wake(p.sub, now);
                self.pump(slot);
            }
        }
    }

    /// What a command (or a crash, or another program) changed that the liveness invariant
    /// reads: the keys released since `locks`, the rows inserted since `rows`.
    fn note_changes(
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
    fn foreign(&mut self, channel: i64, hold: bool) {
        if self.desc.advisory.is_none() || self.config.dialect == Dialect::Sqlite {
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
    fn quiesce(&mut self) {
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

    /// Liveness, where the database holds the keys: with nothing left to run at this time, no
    /// process has a free worker while a due row's key is free (held by no session), unless
    /// the process has not looked at the key (in a look that did not pass over it) nor tried
    /// its lock since another session released that key, or since another process inserted
    /// the row: nothing told it, and it looks again at its poll.
    fn check_liveness(&self) {
        if self.desc.advisory.is_none()
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

    /// Every process shuts down; commands run and replies arrive until all are closed.
    fn finish(&mut self) {
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
    fn drain(&mut self) {
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

/// A row of `channel`: the key's column where the description's key reads it.
fn publish(desc: &TableDesc, channel: i64) -> Publish {
    let columns = if desc.key_columns().contains(&"channel") {
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

fn short(action: &Action) -> String {
    match action {
        Action::Execute { statement, binds } => format!("{:?} {binds:?}", statement.kind),
        other => format!("{other:?}"),
    }
}

fn configs(table: Table) -> impl Strategy<Value = Config> {
    let dialects = if matches!(table, Table::RowLock | Table::RowLockById) {
        prop_oneof![
            Just(Dialect::Postgres),
            Just(Dialect::MySql),
            Just(Dialect::MariaDb)
        ]
        .boxed()
    } else {
        prop_oneof![
            Just(Dialect::Postgres),
            Just(Dialect::MySql),
            Just(Dialect::MariaDb),
            Just(Dialect::Sqlite)
        ]
        .boxed()
    };
    (
        dialects,
        1..4usize,
        prop_oneof![1 => Just(1usize), 3 => 2..4usize],
        prop_oneof![Just(Duration::ZERO), Just(CONNECTION_LINGER)],
        prop_oneof![2 => Just(0usize), 1 => 1..4usize],
        prop_oneof![Just(None), (1..4u32).prop_map(Some)],
        skews(),
    )
        .prop_map(
            move |(dialect, workers, processes, linger, prefetch, max_attempts, skew)| Config {
                dialect,
                table,
                workers,
                linger,
                prefetch,
                max_attempts: max_attempts.filter(|_| table.desc().failed_at.is_some()),
                // SQLite's clock is its process's machine's.
                skew: if dialect == Dialect::Sqlite {
                    NO_SKEW
                } else {
                    skew
                },
                // One process serves a SQLite database.
                processes: if dialect == Dialect::Sqlite {
                    1
                } else {
                    processes
                },
            },
        )
}

/// Clocks off the database's by up to three leases either way, or in step.
fn skews() -> impl Strategy<Value = [i64; 4]> {
    let lease = i64::try_from(LEASE_TIME.as_micros()).expect("fits");
    prop_oneof![
        1 => Just(NO_SKEW),
        3 => prop::array::uniform4(-3 * lease..3 * lease),
    ]
}

fn run(config: Config, steps: &[Step]) {
    let mut world = World::new(config);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for step in steps {
            world.apply(step);
        }
        world.finish();
        world.drain();
    }));
    if let Err(panic) = result {
        if std::env::var_os("RUSTSTREAM_MODEL_LOG").is_none() {
            std::panic::resume_unwind(panic);
        }
        let tail: Vec<&String> = world.log.iter().rev().take(400).collect();
        eprintln!("config: {config:?}\nlast steps, newest first:");
        for line in tail {
            eprintln!("{line}");
        }
        std::panic::resume_unwind(panic);
    }
}

#[test]
/// MySQL, advisory: a claim locks a key whose row was failed by another process since its look,
/// and releases it; a claim beside it had passed over the key, as this process was trying its
/// lock. The key's next row (9, published here) is taken by a claim that runs as soon as they
/// end, not at the poll.
fn regression_advisory_take_of_a_row_gone_looks_again_at_once() {
    let config = Config {
        dialect: Dialect::MySql,
        table: Table::Advisory,
        workers: 2,
        processes: 3,
        linger: Duration::from_millis(5),
        prefetch: 2,
        max_attempts: None,
        skew: NO_SKEW,
    };
    run(
        config,
        &[
            Step::Publish {
                process: 3,
                channel: 0,
            },
            Step::Check,
            Step::Publish {
                process: 1,
                channel: 0,
            },
            Step::Run {
                process: 1,
                command: 1,
            },
            Step::Settle {
                process: 3,
                handler: 0,
                outcome: Outcome::Ack,
                delay_ms: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Settle {
                process: 2,
                handler: 0,
                outcome: Outcome::Ack,
                delay_ms: 0,
            },
            Step::Run {
                process: 1,
                command: 0,
            },
            Step::Settle {
                process: 1,
                handler: 0,
                outcome: Outcome::Ack,
                delay_ms: 0,
            },
            Step::Reply {
                process: 1,
                reply: 6,
            },
            Step::Check,
            Step::Publish {
                process: 3,
                channel: 2,
            },
            Step::Run {
                process: 0,
                command: 1,
            },
            Step::Reply {
                process: 3,
                reply: 0,
            },
            Step::Publish {
                process: 0,
                channel: 0,
            },
            Step::Run {
                process: 0,
                command: 2,
            },
            Step::Run {
                process: 3,
                command: 5,
            },
            Step::Reply {
                process: 0,
                reply: 1,
            },
            Step::Settle {
                process: 0,
                handler: 0,
                outcome: Outcome::Ack,
                delay_ms: 0,
            },
            Step::Settle {
                process: 1,
                handler: 0,
                outcome: Outcome::Reject,
                delay_ms: 0,
            },
            Step::Check,
        ],
    );
}

#[test]
fn regression_row_lock_count_beside_a_failed_leader_keeps_no_mark() {
    let config = Config {
        dialect: Dialect::Postgres,
        table: Table::RowLock,
        workers: 3,
        processes: 1,
        linger: Duration::from_millis(5),
        prefetch: 0,
        max_attempts: None,
        skew: NO_SKEW,
    };
    run(
        config,
        &[
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Fail {
                process: 0,
                command: 0,
                lost: false,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Advance { millis: 1000 },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Publish {
                process: 0,
                channel: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 1,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 2,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 1,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Fail {
                process: 0,
                command: 3,
                lost: false,
            },
            Step::Run {
                process: 0,
                command: 5,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
        ],
    );
}

#[test]
fn regression_row_lock_lock_waiting_for_a_count_keeps_its_mark() {
    let config = Config {
        dialect: Dialect::MySql,
        table: Table::RowLock,
        workers: 2,
        processes: 3,
        linger: Duration::from_millis(5),
        prefetch: 1,
        max_attempts: None,
        skew: NO_SKEW,
    };
    run(
        config,
        &[
            Step::Run {
                process: 3,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Run {
                process: 3,
                command: 0,
            },
            Step::Run {
                process: 2,
                command: 0,
            },
            Step::Reply {
                process: 3,
                reply: 0,
            },
            Step::Reply {
                process: 2,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Run {
                process: 2,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Shutdown { process: 1 },
            Step::Fail {
                process: 3,
                command: 0,
                lost: false,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 3,
                reply: 0,
            },
            Step::Advance { millis: 1000 },
            Step::Run {
                process: 3,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Run {
                process: 3,
                command: 0,
            },
            Step::Reply {
                process: 2,
                reply: 0,
            },
            Step::Reply {
                process: 3,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Run {
                process: 2,
                command: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 2,
                reply: 0,
            },
            Step::Run {
                process: 2,
                command: 0,
            },
            Step::Reply {
                process: 3,
                reply: 0,
            },
            Step::Run {
                process: 3,
                command: 0,
            },
            Step::Reply {
                process: 3,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::PublishAll {
                process: 2,
                channel: 0,
                rows: 2,
            },
            Step::Run {
                process: 3,
                command: 0,
            },
            Step::Reply {
                process: 2,
                reply: 0,
            },
            Step::Run {
                process: 2,
                command: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Run {
                process: 2,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
        ],
    );
}

#[test]
fn regression_row_lock_counted_row_taken_in_the_gap() {
    let config = Config {
        dialect: Dialect::Postgres,
        table: Table::RowLock,
        workers: 1,
        processes: 2,
        linger: Duration::ZERO,
        prefetch: 0,
        max_attempts: None,
        skew: NO_SKEW,
    };
    run(
        config,
        &[
            Step::Run {
                process: 2,
                command: 0,
            },
            Step::Reply {
                process: 2,
                reply: 0,
            },
            Step::Run {
                process: 2,
                command: 0,
            },
            Step::Reply {
                process: 2,
                reply: 0,
            },
            Step::Run {
                process: 1,
                command: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 1,
                reply: 0,
            },
            Step::Run {
                process: 1,
                command: 0,
            },
            Step::Reply {
                process: 1,
                reply: 0,
            },
            Step::Run {
                process: 1,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Reply {
                process: 1,
                reply: 0,
            },
            Step::Run {
                process: 1,
                command: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 1,
                reply: 0,
            },
            Step::Run {
                process: 1,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Reply {
                process: 1,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 2,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Run {
                process: 1,
                command: 0,
            },
            Step::Reply {
                process: 0,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Reply {
                process: 2,
                reply: 0,
            },
            Step::Settle {
                process: 0,
                handler: 0,
                outcome: Outcome::Retry,
                delay_ms: 0,
            },
            Step::Reply {
                process: 1,
                reply: 0,
            },
            Step::Run {
                process: 1,
                command: 0,
            },
            Step::Reply {
                process: 1,
                reply: 0,
            },
            Step::Run {
                process: 0,
                command: 0,
            },
            Step::Run {
                process: 1,
                command: 0,
            },
            Step::Reply {
                process: 1,
                reply: 0,
            },
        ],
    );
}

fn schedule() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(), 0..150)
}

/// A step of a liveness schedule: no failed statements (a failed claim waits for its poll),
/// keys held by another system, and checks of the liveness invariant.
fn liveness_step() -> impl Strategy<Value = Step> {
    let outcome = prop_oneof![
        6 => Just(Outcome::Ack),
        3 => Just(Outcome::Retry),
        1 => Just(Outcome::Reject),
    ];
    prop_oneof![
        30 => (0..4usize, 0..8usize).prop_map(|(process, command)| Step::Run { process, command }),
        30 => (0..4usize, 0..8usize).prop_map(|(process, reply)| Step::Reply { process, reply }),
        10 => (0..4usize, 0..8usize, outcome)
            .prop_map(|(process, handler, outcome)| {
                Step::Settle { process, handler, outcome, delay_ms: 0 }
            }),
        1 => (0..4usize, 0..8usize).prop_map(|(process, handler)| Step::Drop { process, handler }),
        3 => (0..2_000u64).prop_map(|millis| Step::Advance { millis }),
        1 => (0..4usize).prop_map(|process| Step::Crash { process }),
        5 => (0..4usize, 0..6i64).prop_map(|(process, channel)| Step::Publish { process, channel }),
        1 => (0..4usize, 0..6i64, 2..6usize)
            .prop_map(|(process, channel, rows)| Step::PublishAll { process, channel, rows }),
        2 => (0..6i64, any::<bool>()).prop_map(|(channel, hold)| Step::Foreign { channel, hold }),
        6 => Just(Step::Check),
    ]
}

/// Several processes on the database's locks, sharing keys, some held elsewhere.
fn liveness_configs() -> impl Strategy<Value = Config> {
    (
        prop_oneof![
            Just(Dialect::Postgres),
            Just(Dialect::MySql),
            Just(Dialect::MariaDb)
        ],
        1..4usize,
        1..4usize,
        prop_oneof![Just(Duration::ZERO), Just(CONNECTION_LINGER)],
        prop_oneof![2 => Just(0usize), 1 => 1..3usize],
        skews(),
    )
        .prop_map(
            |(dialect, workers, processes, linger, prefetch, skew)| Config {
                dialect,
                table: Table::Advisory,
                workers,
                processes,
                linger,
                prefetch,
                max_attempts: None,
                skew,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 600,
        max_shrink_iters: 4_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn row_lock(config in configs(Table::RowLock), steps in schedule()) {
        run(config, &steps);
    }

    #[test]
    fn row_lock_in_id_order(config in configs(Table::RowLockById), steps in schedule()) {
        run(config, &steps);
    }

    #[test]
    fn lease(config in configs(Table::Lease), steps in schedule()) {
        run(config, &steps);
    }

    #[test]
    fn lease_marking_processed(config in configs(Table::LeaseMarked), steps in schedule()) {
        run(config, &steps);
    }

    #[test]
    fn advisory(config in configs(Table::Advisory), steps in schedule()) {
        run(config, &steps);
    }

    #[test]
    fn custom_lock(config in configs(Table::Custom), steps in schedule()) {
        run(config, &steps);
    }

    /// Whenever a worker is free and a due row's key is free, a claim takes the row without
    /// waiting for a poll: several processes sharing keys, keys held by another system, long
    /// deliveries, rows claimed ahead.
    #[test]
    fn advisory_liveness(config in liveness_configs(), steps in prop::collection::vec(liveness_step(), 0..150)) {
        run(config, &steps);
    }
}

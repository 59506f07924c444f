//! The broker machine: the checks, claims, deliveries, publishes and shutdown of every
//! subscription of one database.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::dialect::{Arg, Dialect, Statement, StatementKind, Statements};
use crate::keys::{mysql_lock_name, postgres_key_hash};
use crate::spec::{DescError, Form, TableDesc};
use crate::types::{
    Action, CheckError, ClosedCounts, Command, CommandId, ConnId, Delivered, DeliveryId, Event,
    Outcome, PublishId, PublisherId, Reply, Row, SettleError, SubId,
};
use crate::value::{DbError, ErrorKind, Time, Value};

/// How long a dropped delivery may take to release its lock before its connection is closed.
pub const DROP_GRACE: Duration = Duration::from_secs(5);

/// How long the broker keeps a connection its flow gave back, for the next flow that needs one,
/// before it gives the connection back to the pool, unless set otherwise
/// ([`Broker::set_connection_linger`]).
///
/// A claim, a settlement or a publish that finds such a connection runs at once, without the
/// pool's acquire and release (a round trip each on some pools: sqlx tests a connection when it
/// is taken and when it comes back). Only a connection whose session is clean is kept: no
/// transaction open or in doubt, no statement that failed on it, no custom lock run on it. The
/// shutdown gives every kept connection back.
pub const CONNECTION_LINGER: Duration = Duration::from_millis(5);

/// The row lock and advisory lock forms: a row claimed ahead that waited this long for a free
/// worker is handed only after a `SELECT 1` on its connection answered
/// ([`StatementKind::Ping`]). Its session holds the row's transaction or its key's lock; a
/// session the server ended meanwhile (`idle_in_transaction_session_timeout`, `wait_timeout`,
/// a kill) held them no longer, and another process may have taken the row: such a row is
/// never handed, its connection closes, and the next claim takes what is due.
pub const PING_AHEAD_AFTER: Duration = Duration::from_secs(1);

/// The settings of one subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubscribeOptions {
    /// How many messages may be in work at once.
    pub workers: usize,
    /// How long a subscription waits between claims that found nothing.
    pub poll_interval: Duration,
    /// The lease form: how long a lease lasts.
    pub lease: Duration,
    /// The lease form: how often a lease in work is extended.
    pub extend_every: Duration,
    /// How many rows a subscription may claim ahead, beyond `workers`. A row claimed ahead is
    /// held as a row in work is (by its lease, extended like a lease in work; by its claim's
    /// transaction, on a connection of its own, in the row lock form; by its key's lock, on a
    /// connection of its own, in the advisory lock form) and handed to the runtime as soon as
    /// a worker frees, without a claim's round trip; at most `workers` are in work at once.
    /// When the subscription stops or the broker shuts down, the rows still waiting are given
    /// back at once. A claim that reads the first due rows alone (SQLite's advisory form, a
    /// custom lock) claims none ahead.
    pub prefetch: usize,
}

impl Default for SubscribeOptions {
    fn default() -> Self {
        Self {
            workers: 1,
            poll_interval: Duration::from_secs(1),
            lease: Duration::from_secs(30),
            extend_every: Duration::from_secs(10),
            prefetch: 0,
        }
    }
}

/// A row to publish.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Publish {
    /// The id, where the table's id is not generated.
    pub id: Option<Value>,
    /// The encoded message.
    pub payload: Vec<u8>,
    /// The values of the key's columns, by column name.
    pub columns: Vec<(&'static str, Value)>,
    /// When the row becomes due; now when `None`.
    pub due: Option<Time>,
}

/// Why a call was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The broker is shutting down or shut down: nothing is written.
    #[error("the broker is shut down")]
    Closed,
    /// The description breaks a rule.
    #[error(transparent)]
    Desc(#[from] DescError),
    /// A publish names no value for a column the table needs.
    #[error("table `{table}`: the publish gives no value for column `{column}`")]
    MissingValue {
        /// The table.
        table: &'static str,
        /// The column.
        column: &'static str,
    },
    /// No such subscription or publisher.
    #[error("no such {0}")]
    Unknown(&'static str),
}

/// How a subscription holds keys, in the advisory lock form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyMode {
    /// Not the advisory lock form.
    None,
    /// The database's locks: PostgreSQL's hash, MySQL's names.
    Database,
    /// SQLite: the process's registry of keys in work.
    Registry,
    /// The service's own `Lock` and `Unlock`.
    Custom,
}

impl KeyMode {
    /// Whether a claim reads the first due rows alone: it takes nothing while they are in work,
    /// and the release of a key starts the next claim at once.
    fn first_rows_only(self) -> bool {
        matches!(self, KeyMode::Registry | KeyMode::Custom)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SubState {
    Checking,
    Ready,
    Failed,
}

#[derive(Debug)]
struct Sub {
    desc: TableDesc,
    statements: Statements,
    options: SubscribeOptions,
    mode: KeyMode,
    state: SubState,
    /// MySQL and MariaDB: the database's name, for lock names.
    database: Option<String>,
    /// The connection the check runs on.
    check_conn: Option<ConnId>,
    /// When a check that failed on a passing error runs again.
    next_check_at: Option<Time>,
    in_work: usize,
    /// The deliveries handed to the runtime and not yet ended.
    handed: usize,
    /// The deliveries handed to the runtime that it has not settled or dropped yet: at most
    /// `workers`. A row claimed ahead goes to the runtime when this falls below `workers`.
    handling: usize,
    /// Rows claimed ahead, beyond `workers` ([`SubscribeOptions::prefetch`]).
    prefetch: usize,
    /// Slots that claims in flight hold.
    claiming: usize,
    claims_in_flight: usize,
    /// The row lock form with an attempt column: the claim between its count and its lock.
    counting: Option<u64>,
    /// Claims that hold a connection and wait for the count to be theirs, in order.
    count_queue: VecDeque<u64>,
    /// Claims no more: the runtime stopped it.
    stopped: bool,
    next_claim_at: Option<Time>,
    last_full: bool,
    /// The lease form, where the database returns the rows a statement settled: the
    /// delivery whose settlement statement runs now. Settlements asked for meanwhile wait
    /// in `settle_waiting` and then run together in one statement.
    settling: Option<DeliveryId>,
    settle_waiting: VecDeque<DeliveryId>,
    /// The settlements of several leases in one statement, by the rows they settle; empty
    /// where the database cannot tell which rows such a statement settled.
    settle_batches: BTreeMap<usize, Statement>,
    batches_settlements: bool,
}

impl Sub {
    /// Whether a claim may start while another of the subscription runs.
    ///
    /// Row lock claims, lease claims and advisory claims on the database's locks run side by
    /// side: `SKIP LOCKED`, the lease's fence and the key's lock keep two claims from taking
    /// one row. A row lock claim that counts an attempt commits the count before it locks the
    /// row, and a second claim of the process in that window would count the same row again:
    /// such claims acquire their connections side by side and then count one at a time
    /// ([`Sub::counts_attempts`]). A claim that reads the first due rows only (SQLite's
    /// registry, a custom lock) runs alone, so the first row is read once.
    fn side_by_side(&self) -> bool {
        match self.statements.form {
            Form::RowLock | Form::Lease => true,
            Form::Advisory => self.mode == KeyMode::Database,
        }
    }

    /// The row lock form with an attempt column: a claim counts and commits the attempt, then
    /// locks the counted row.
    fn counts_attempts(&self) -> bool {
        self.statements.form == Form::RowLock
            && (self.statements.count_row.is_some() || self.statements.select_row_id.is_some())
    }

    fn free(&self) -> usize {
        if self.mode == KeyMode::Registry && self.in_work + self.claiming > 0 {
            // SQLite's registry: one delivery in work at a time. A claim meanwhile would read
            // the row in work, or take a second.
            return 0;
        }
        (self.options.workers + self.prefetch).saturating_sub(self.in_work + self.claiming)
    }
}

#[derive(Debug)]
struct Candidate {
    id: Value,
    key: Arc<str>,
}

#[derive(Debug)]
enum ClaimStage {
    Acquire,
    Begin,
    LockRow,
    CountAttempt,
    CountRow,
    BeginCount,
    SelectRowId,
    CountCommit,
    BeginLock,
    LockRowById,
    ClaimLease,
    SelectLease,
    MarkLease,
    Commit,
    Rollback,
    Candidates,
    Lock,
    Take,
    TakeCount,
    ReadRow,
    Unlock,
    Release,
    Close,
}

/// A claim in flight. `R` rows wait in `taken` until the claim can deliver them.
#[derive(Debug)]
struct Claim<R> {
    sub: SubId,
    conn: Option<ConnId>,
    limit: usize,
    found: usize,
    taken: Vec<Row<R>>,
    candidates: VecDeque<Candidate>,
    current: Option<Candidate>,
    /// The row lock form: the row whose attempt was counted, and the count, to lock next.
    row_id: Option<(Value, i64)>,
    /// The advisory lock form: the candidates have been read.
    loaded: bool,
    /// The advisory lock form: keys this claim found held (in work here or elsewhere). Their
    /// later candidates are passed over too, so no row overtakes an earlier row of its key.
    passed: BTreeSet<Arc<str>>,
    /// The lease form: the expiry the claim wrote.
    until: Option<Time>,
    failed: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeliveryState {
    /// The handler has it.
    InWork,
    /// A statement of its settlement, extension or release runs.
    Busy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Settle(Outcome),
    Drop,
    Shutdown,
}

#[derive(Debug)]
struct Delivery {
    sub: SubId,
    id: Value,
    key: Option<Arc<str>>,
    /// Row lock and advisory lock forms: the connection that holds the row or the key.
    conn: Option<ConnId>,
    /// The lease form: the expiry this process wrote last.
    fence: Option<Time>,
    state: DeliveryState,
    ending: Option<Ending>,
    extend_at: Option<Time>,
    lease_lost: bool,
    /// A dropped delivery's connection is closed by then.
    deadline: Option<Time>,
    /// A settlement asked for while an extension ran.
    queued: Option<Ending>,
    /// Whether its key or row is still held.
    holds: bool,
    /// Whether the settlement's statement took effect.
    settled: bool,
    /// Whether the runtime was handed it (a claim cut short by the shutdown hands nothing).
    delivered: bool,
    /// Handed to the runtime, which has not settled or dropped it yet.
    handling: bool,
    /// The lease form: other deliveries of its subscription whose settlements ride on this
    /// one's statement.
    batch: Vec<DeliveryId>,
    /// When its claim took it.
    claimed_at: Time,
}

#[derive(Debug)]
enum DeliveryStage {
    Acquire,
    Extend {
        until: Time,
    },
    Settle,
    /// The lease form: the settlement of this delivery and of its batch in one statement.
    SettleBatch,
    ReleaseLease,
    Commit,
    Rollback,
    Unlock,
    /// A row claimed ahead: its session answers, so it is handed.
    Ping,
    Release,
    Close,
}

#[derive(Debug)]
enum CheckStage {
    Acquire,
    Columns,
    Database,
    Isolation,
    Release,
    Close,
}

#[derive(Debug)]
enum PublishStage {
    Acquire,
    Begin,
    Insert,
    Commit,
    Release,
    Close,
}

#[derive(Debug)]
enum Step {
    Check {
        sub: SubId,
        stage: CheckStage,
    },
    Claim {
        claim: u64,
        stage: ClaimStage,
    },
    Delivery {
        delivery: DeliveryId,
        stage: DeliveryStage,
    },
    Publish {
        publish: PublishId,
        stage: PublishStage,
    },
    /// A command whose flow has ended (a connection closed past its deadline): its reply is
    /// only awaited.
    Orphan,
}

#[derive(Debug)]
struct PublishFlow {
    publisher: PublisherId,
    conn: ConnId,
    /// The inserts still to run, in order.
    inserts: VecDeque<(Statement, Vec<Value>)>,
    /// The inserts run in one transaction: a batch of more than one statement.
    in_tx: bool,
    /// Its inserts do not notify: a notification follows them ([`NOTIFY_EVERY`]).
    quiet: bool,
    /// The broker's own notification after quiet inserts: no [`Event::Published`].
    internal: bool,
    result: Option<Result<(), DbError>>,
}

#[derive(Debug)]
struct Publisher {
    desc: TableDesc,
    statement: Statement,
    /// `BEGIN` and `COMMIT`, around a batch of several inserts.
    begin: Statement,
    commit: Statement,
    /// The inserts of a batch, by the rows they write.
    batches: BTreeMap<usize, Statement>,
    /// PostgreSQL: the inserts without the notification, by the rows they write, and the
    /// notification on its own ([`NOTIFY_EVERY`]).
    quiet_batches: BTreeMap<usize, Statement>,
    notify: Option<Statement>,
    /// When this publisher's last notifying statement started.
    notified_at: Option<Time>,
    /// When the notification owed for quiet inserts that took effect is due.
    notify_due: Option<Time>,
}

impl Publisher {
    /// The insert of `rows` rows, notifying or `quiet`, rendered once per size; a table whose
    /// rows have no column to write takes its one-row insert.
    fn insert(&mut self, dialect: Dialect, rows: usize, quiet: bool) -> Statement {
        if rows == 1 && !quiet {
            return self.statement.clone();
        }
        let desc = self.desc;
        let one = &self.statement;
        let rendered = if quiet {
            &mut self.quiet_batches
        } else {
            &mut self.batches
        };
        rendered
            .entry(rows)
            .or_insert_with(|| {
                if quiet {
                    Statements::publish_quiet(dialect, &desc, rows)
                } else {
                    Statements::publish_rows(dialect, &desc, rows)
                }
                .unwrap_or_else(|| one.clone())
            })
            .clone()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Running,
    ShuttingDown,
    Closed,
}

/// The broker of one database: every subscription's check, claims and deliveries, every
/// publish, and the shutdown.
///
/// It does no IO, reads no clock and spawns nothing. Its methods fall in four groups:
///
/// - **getters** (`&self`): [`Broker::is_closed`], [`Broker::statements`], [`Broker::in_work`];
/// - **inputs**, each with the time: [`Broker::handle_reply`], [`Broker::handle_timeout`],
///   [`Broker::settle`], [`Broker::drop_delivery`], [`Broker::wake`], [`Broker::shutdown`];
/// - **application calls**: [`Broker::subscribe`], [`Broker::publisher`], [`Broker::publish`];
/// - **outputs**: [`Broker::poll_command`], [`Broker::poll_event`], [`Broker::poll_timeout`].
///
/// After any input, drain [`Broker::poll_command`] and [`Broker::poll_event`] until both are
/// empty, then arm one timer for [`Broker::poll_timeout`]. A spurious `handle_timeout` is
/// harmless. `R` is the adapter's row type, which the core carries to the runtime unread.
///
/// Commands of one connection come out in the order they must run. On SQLite the broker hands
/// out one statement at a time (the next after the reply to the last): SQLite takes one
/// writer at a time, and statements handed out side by side would wait on each other in its
/// busy handler, which sleeps.
#[derive(Debug)]
pub struct Broker<R> {
    dialect: Dialect,
    state: State,
    subs: Vec<Sub>,
    publishers: Vec<Publisher>,
    claims: BTreeMap<u64, Claim<R>>,
    deliveries: BTreeMap<DeliveryId, Delivery>,
    /// By subscription: rows claimed ahead, waiting for a free worker, in claim order
    /// ([`SubscribeOptions::prefetch`]).
    ahead: Vec<VecDeque<Delivered<R>>>,
    /// Rows claimed ahead whose session is asked whether it still answers before they are
    /// handed ([`PING_AHEAD_AFTER`]), each with a worker's slot kept for it.
    pinging: BTreeMap<DeliveryId, Delivered<R>>,
    publishes: BTreeMap<PublishId, PublishFlow>,
    pending: BTreeMap<CommandId, Step>,
    /// Connections the core holds, acquired and not yet released or closed, by the ids the
    /// flows know them by.
    conns: BTreeSet<ConnId>,
    /// Connections a flow gave back that the broker keeps for the next acquire, with the time
    /// each was given back, the most recent last ([`CONNECTION_LINGER`]).
    idle: Vec<(ConnId, Time)>,
    /// How long a connection is kept ([`Broker::set_connection_linger`]).
    linger: Duration,
    /// A flow's connection that is a kept one: the flow's id, and the id the adapter knows.
    alias: BTreeMap<ConnId, ConnId>,
    /// Connections (the adapter's ids) that are not kept when given back: a transaction was
    /// begun and is not known to be over, a command failed on it, or a custom lock ran on it.
    unclean: BTreeSet<ConnId>,
    /// Commands whose reply tells whether their connection stays clean: the connection and
    /// the statement's kind (`None` for a custom lock or unlock).
    watched: BTreeMap<CommandId, (ConnId, Option<StatementKind>)>,
    /// Acquires handed to the adapter and not yet answered: while one waits for the pool, a
    /// connection given back goes to the pool, where that acquire finds it.
    acquiring: BTreeSet<CommandId>,
    /// Acquires and releases the broker answered itself (a kept connection), to answer
    /// [`Reply::Done`] in order.
    answered_here: VecDeque<CommandId>,
    /// Keys in work in this process: the registry on SQLite, a shortcut elsewhere.
    keys: BTreeSet<Arc<str>>,
    commands: VecDeque<Command>,
    /// SQLite: the statement the adapter runs now. The core hands SQLite one statement at a
    /// time, so no two of its statements wait on each other for the database's write lock.
    running_statement: Option<CommandId>,
    /// SQLite: commands held back until the statement before them has answered, in order.
    held_back: VecDeque<Command>,
    events: VecDeque<Event<R>>,
    counts: ClosedCounts,
    next_command: u64,
    next_conn: u64,
    next_claim: u64,
    next_delivery: u64,
    next_publish: u64,
    now: Time,
}

impl<R> Broker<R> {
    /// A broker for a database of this dialect.
    pub fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            state: State::Running,
            subs: Vec::new(),
            publishers: Vec::new(),
            claims: BTreeMap::new(),
            deliveries: BTreeMap::new(),
            ahead: Vec::new(),
            pinging: BTreeMap::new(),
            publishes: BTreeMap::new(),
            pending: BTreeMap::new(),
            conns: BTreeSet::new(),
            idle: Vec::new(),
            linger: CONNECTION_LINGER,
            alias: BTreeMap::new(),
            unclean: BTreeSet::new(),
            watched: BTreeMap::new(),
            answered_here: VecDeque::new(),
            acquiring: BTreeSet::new(),
            keys: BTreeSet::new(),
            commands: VecDeque::new(),
            running_statement: None,
            held_back: VecDeque::new(),
            events: VecDeque::new(),
            counts: ClosedCounts::default(),
            next_command: 0,
            next_conn: 0,
            next_claim: 0,
            next_delivery: 0,
            next_publish: 0,
            now: Time(0),
        }
    }

    /// How long a connection a flow gave back is kept for the next flow before it goes back
    /// to the pool; [`CONNECTION_LINGER`] unless set. `Duration::ZERO` keeps none: every flow
    /// acquires its connection from the pool and releases it there.
    pub fn set_connection_linger(&mut self, linger: Duration) {
        self.linger = linger;
        if linger.is_zero() {
            self.release_idle(true);
        }
    }

    // ----- getters -----

    /// The dialect.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Whether the shutdown is complete.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Whether the broker refuses new work: shutting down or shut down.
    pub fn is_shutting_down(&self) -> bool {
        self.state != State::Running
    }

    /// The statements of a subscription, rendered when it subscribed.
    pub fn statements(&self, sub: SubId) -> Option<&Statements> {
        self.subs.get(sub.0).map(|s| &s.statements)
    }

    /// The description of a subscription's table.
    pub fn table(&self, sub: SubId) -> Option<&TableDesc> {
        self.subs.get(sub.0).map(|s| &s.desc)
    }

    /// How many messages are in work, over every subscription.
    pub fn in_work_total(&self) -> usize {
        self.subs.iter().map(|s| s.handed).sum()
    }

    /// How many messages of a subscription are in work.
    pub fn in_work(&self, sub: SubId) -> usize {
        self.subs.get(sub.0).map_or(0, |s| s.handed)
    }

    /// How many rows a subscription claimed ahead and holds for its next free worker
    /// ([`SubscribeOptions::prefetch`]).
    pub fn claimed_ahead(&self, sub: SubId) -> usize {
        self.ahead.get(sub.0).map_or(0, VecDeque::len)
    }

    /// The connections the core holds now: those its flows use and those it keeps for the
    /// next flow ([`CONNECTION_LINGER`]).
    pub fn held_connections(&self) -> usize {
        self.conns.len() + self.idle.len()
    }

    /// What the shutdown has done so far to the advisory locks.
    pub fn counts(&self) -> ClosedCounts {
        self.counts
    }

    // ----- application calls -----

    /// Adds a subscription to `desc`'s table. It checks the table first, then claims.
    pub fn subscribe(
        &mut self,
        desc: TableDesc,
        options: SubscribeOptions,
        now: Time,
    ) -> Result<SubId, BrokerError> {
        self.now = now;
        if self.state != State::Running {
            return Err(BrokerError::Closed);
        }
        desc.validate()?;
        if desc.form() == Form::RowLock && !self.dialect.has_row_locks() {
            return Err(DescError::NoRowLocks {
                table: desc.table,
                dialect: self.dialect.name(),
            }
            .into());
        }
        let options = SubscribeOptions {
            workers: options.workers.max(1),
            ..options
        };
        let mode = match (desc.form(), desc.custom_lock(), self.dialect) {
            (Form::Advisory, true, _) => KeyMode::Custom,
            (Form::Advisory, false, Dialect::Sqlite) => KeyMode::Registry,
            (Form::Advisory, false, _) => KeyMode::Database,
            _ => KeyMode::None,
        };
        let id = SubId(self.subs.len());
        // A claim that reads the first due rows alone takes one row at a time: none ahead.
        let prefetch = if mode.first_rows_only() {
            0
        } else {
            options.prefetch
        };
        self.subs.push(Sub {
            desc,
            statements: Statements::render(self.dialect, &desc, options.workers + prefetch),
            options,
            mode,
            state: SubState::Checking,
            database: None,
            check_conn: None,
            next_check_at: None,
            in_work: 0,
            handed: 0,
            handling: 0,
            prefetch,
            claiming: 0,
            counting: None,
            count_queue: VecDeque::new(),
            claims_in_flight: 0,
            stopped: false,
            next_claim_at: None,
            last_full: false,
            settling: None,
            settle_waiting: VecDeque::new(),
            settle_batches: BTreeMap::new(),
            batches_settlements: Statements::settles_leases_together(self.dialect, &desc),
        });
        self.ahead.push(VecDeque::new());
        self.start_check(id);
        self.drive();
        Ok(id)
    }

    /// A publisher of rows into `desc`'s table; its statement is rendered once.
    pub fn publisher(&mut self, desc: TableDesc) -> Result<PublisherId, BrokerError> {
        desc.validate()?;
        let statements = Statements::render(self.dialect, &desc, 1);
        self.publishers.push(Publisher {
            desc,
            statement: statements.publish,
            begin: statements.begin,
            commit: statements.commit,
            batches: BTreeMap::new(),
            quiet_batches: BTreeMap::new(),
            notify: Statements::notify(self.dialect, &desc),
            notified_at: None,
            notify_due: None,
        });
        Ok(PublisherId(self.publishers.len() - 1))
    }

    /// Publishes a row. Refused with [`BrokerError::Closed`] from the shutdown on: nothing is
    /// written then.
    pub fn publish(
        &mut self,
        publisher: PublisherId,
        row: Publish,
        now: Time,
    ) -> Result<PublishId, BrokerError> {
        self.publish_all(publisher, vec![row], now)
    }

    /// Publishes rows together: all of them or, when a statement fails, none. Up to
    /// [`PUBLISH_BATCH`] rows go into one insert; more run as several inserts in one
    /// transaction. One [`Event::Published`] answers the whole batch. Refused with
    /// [`BrokerError::Closed`] from the shutdown on, and with [`BrokerError::MissingValue`]
    /// when a row lacks a column the table needs: nothing is written then.
    pub fn publish_all(
        &mut self,
        publisher: PublisherId,
        rows: Vec<Publish>,
        now: Time,
    ) -> Result<PublishId, BrokerError> {
        self.now = now;
        if self.state != State::Running {
            return Err(BrokerError::Closed);
        }
        let dialect = self.dialect;
        let p = self
            .publishers
            .get_mut(publisher.0)
            .ok_or(BrokerError::Unknown("publisher"))?;
        let mut binds = Vec::with_capacity(rows.len());
        for row in &rows {
            binds.push(row_binds(p, row, now)?);
        }
        // PostgreSQL: a notification commits one at a time with the other notifying
        // transactions of the database, so a publisher notifies at most once per
        // `NOTIFY_EVERY` and owes one notification after the inserts it left quiet.
        let quiet = p.notify.is_some()
            && !binds.is_empty()
            && p.notified_at
                .is_some_and(|t| now < t.plus(NOTIFY_EVERY) && now >= t);
        if p.notify.is_some() && !quiet && !binds.is_empty() {
            p.notified_at = Some(now);
        }
        let mut inserts = VecDeque::new();
        let mut binds = binds.into_iter().peekable();
        while binds.peek().is_some() {
            let chunk: Vec<Vec<Value>> = binds.by_ref().take(PUBLISH_BATCH).collect();
            let statement = p.insert(dialect, chunk.len(), quiet);
            if statement.args.len() == chunk.iter().map(Vec::len).sum::<usize>() {
                inserts.push_back((statement, chunk.concat()));
            } else {
                // Rows with no column to write: one `DEFAULT VALUES` insert each.
                let one = p.insert(dialect, 1, quiet);
                for binds in chunk {
                    inserts.push_back((one.clone(), binds));
                }
            }
        }
        let id = PublishId(self.next_publish);
        self.next_publish += 1;
        let conn = self.new_conn();
        let in_tx = inserts.len() > 1;
        self.publishes.insert(
            id,
            PublishFlow {
                publisher,
                conn,
                inserts,
                in_tx,
                quiet,
                internal: false,
                result: None,
            },
        );
        self.send(
            conn,
            Action::Acquire,
            Step::Publish {
                publish: id,
                stage: PublishStage::Acquire,
            },
        );
        self.drive();
        Ok(id)
    }

    // ----- inputs -----

    /// A subscription's table has new rows: claim now rather than at the next poll.
    pub fn wake(&mut self, sub: SubId, now: Time) {
        self.now = now;
        if let Some(s) = self.subs.get_mut(sub.0)
            && !s.stopped
        {
            s.next_claim_at = Some(now);
        }
        self.drive();
    }

    /// Time has passed: claims due, lease extensions due, deadlines of dropped deliveries.
    pub fn handle_timeout(&mut self, now: Time) {
        self.now = now;
        self.release_idle(false);
        if self.state != State::Closed {
            self.notify_owed(false);
        }
        let due: Vec<DeliveryId> = self
            .deliveries
            .iter()
            .filter(|(_, d)| d.deadline.is_some_and(|t| t <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.force_close(id);
        }
        if self.state == State::Running {
            let extend: Vec<DeliveryId> = self
                .deliveries
                .iter()
                .filter(|(_, d)| {
                    d.state == DeliveryState::InWork && d.extend_at.is_some_and(|t| t <= now)
                })
                .map(|(id, _)| *id)
                .collect();
            for id in extend {
                self.extend(id);
            }
        }
        self.drive();
    }

    /// The handler settled a delivery.
    pub fn settle(&mut self, delivery: DeliveryId, outcome: Outcome, now: Time) {
        self.now = now;
        self.handler_done(delivery);
        self.end(delivery, Ending::Settle(outcome));
        self.drive();
    }

    /// The runtime dropped a delivery without settling it: its row returns to the queue, and a
    /// lock it holds is released (its connection closed) within [`DROP_GRACE`].
    pub fn drop_delivery(&mut self, delivery: DeliveryId, now: Time) {
        self.now = now;
        self.handler_done(delivery);
        self.end(delivery, Ending::Drop);
        self.drive();
    }

    /// Stops a subscription's claims. Its deliveries in work go on and settle as usual; the
    /// runtime stops every subscription this way before it shuts the broker down.
    pub fn stop(&mut self, sub: SubId, now: Time) {
        self.now = now;
        if let Some(s) = self.subs.get_mut(sub.0) {
            s.stopped = true;
            s.next_claim_at = None;
            self.give_back_ahead(sub);
        }
        self.drive();
    }

    /// Begins the shutdown: no claim starts, no publish is taken, extensions stop, every
    /// advisory lock in work is released and every row lock rolled back; lease deliveries keep
    /// their leases. [`Event::Closed`] follows once every command has been answered.
    pub fn shutdown(&mut self, now: Time) {
        self.now = now;
        if self.state != State::Running {
            return;
        }
        self.state = State::ShuttingDown;
        for waiting in &mut self.ahead {
            waiting.clear();
        }
        self.release_idle(true);
        self.notify_owed(true);
        // A lease extension in flight ends with the shutdown once it is answered.
        for d in self.deliveries.values_mut() {
            if d.state == DeliveryState::Busy && d.ending.is_none() && d.queued.is_none() {
                d.queued = Some(Ending::Shutdown);
            }
        }
        let held: Vec<DeliveryId> = self
            .deliveries
            .iter()
            .filter(|(_, d)| d.state == DeliveryState::InWork)
            .map(|(id, _)| *id)
            .collect();
        for id in held {
            self.end(id, Ending::Shutdown);
        }
        self.drive();
    }

    /// The reply to a command.
    pub fn handle_reply(&mut self, id: CommandId, reply: Reply<R>, now: Time) {
        self.now = now;
        self.statement_answered(id);
        self.acquiring.remove(&id);
        if let Some((conn, kind)) = self.watched.remove(&id) {
            let failed = matches!(reply, Reply::Failed(_));
            match kind.and_then(|k| k.transaction_after(!failed)) {
                _ if failed || kind.is_none() => {
                    self.unclean.insert(conn);
                }
                Some(false) => {
                    self.unclean.remove(&conn);
                }
                _ => {}
            }
        }
        let Some(step) = self.pending.remove(&id) else {
            return;
        };
        self.dispatch(step, reply);
        self.drive();
    }

    fn dispatch(&mut self, step: Step, reply: Reply<R>) {
        match step {
            Step::Check { sub, stage } => self.on_check(sub, stage, reply),
            Step::Claim { claim, stage } => self.on_claim(claim, stage, reply),
            Step::Delivery { delivery, stage } => self.on_delivery(delivery, stage, reply),
            Step::Publish { publish, stage } => self.on_publish(publish, stage, reply),
            Step::Orphan => {}
        }
    }

    /// Answers the acquires and releases the broker took on itself (a kept connection), and
    /// whatever those answers start in turn.
    fn answer_here(&mut self) {
        while let Some(id) = self.answered_here.pop_front() {
            if let Some(step) = self.pending.remove(&id) {
                self.dispatch(step, Reply::Done);
            }
        }
    }

    /// Gives kept connections back to the pool: those kept longer than [`CONNECTION_LINGER`],
    /// or all of them.
    fn release_idle(&mut self, all: bool) {
        let now = self.now;
        let (expired, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.idle)
            .into_iter()
            .partition(|(_, since)| all || since.plus(self.linger) <= now);
        self.idle = kept;
        for (conn, _) in expired {
            self.send_now(conn, Action::Release, Step::Orphan);
        }
    }

    // ----- outputs -----

    /// The next command to run.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event<R>> {
        self.events.pop_front()
    }

    /// When [`Broker::handle_timeout`] is next due, if anything waits for time.
    pub fn poll_timeout(&self) -> Option<Time> {
        let mut next: Option<Time> = None;
        let mut consider = |t: Time| next = Some(next.map_or(t, |n: Time| n.min(t)));
        for (_, since) in &self.idle {
            consider(since.plus(self.linger));
        }
        if self.state != State::Closed {
            for p in &self.publishers {
                if let Some(t) = p.notify_due {
                    consider(t);
                }
            }
        }
        for d in self.deliveries.values() {
            if let Some(t) = d.deadline {
                consider(t);
            }
            if self.state == State::Running
                && d.state == DeliveryState::InWork
                && let Some(t) = d.extend_at
            {
                consider(t);
            }
        }
        if self.state == State::Running {
            for s in &self.subs {
                if let Some(t) = s.next_check_at
                    && s.check_conn.is_none()
                {
                    consider(t);
                }
                if let Some(t) = s.next_claim_at
                    && self.may_claim(s)
                {
                    consider(t);
                }
            }
        }
        next
    }

    // ----- the machinery -----

    fn new_conn(&mut self) -> ConnId {
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        conn
    }

    /// Sends a flow's command on its connection `conn`. An acquire takes a kept connection
    /// when there is one, and a release of a clean connection keeps it
    /// ([`CONNECTION_LINGER`]); the broker answers both itself.
    fn send(&mut self, conn: ConnId, action: Action, step: Step) {
        match action {
            Action::Acquire => {
                self.conns.insert(conn);
                if self.state == State::Running
                    && let Some((kept, _)) = self.idle.pop()
                {
                    self.alias.insert(conn, kept);
                    self.answer_later(step);
                    return;
                }
            }
            Action::Release | Action::Close => {
                self.conns.remove(&conn);
                let physical = self.alias.remove(&conn).unwrap_or(conn);
                if matches!(action, Action::Release)
                    && self.state == State::Running
                    && !self.linger.is_zero()
                    && self.acquiring.is_empty()
                    && !self.unclean.contains(&physical)
                {
                    self.idle.push((physical, self.now));
                    self.answer_later(step);
                    return;
                }
                self.unclean.remove(&physical);
                self.send_now(physical, action, step);
                return;
            }
            _ => {}
        }
        let physical = self.alias.get(&conn).copied().unwrap_or(conn);
        self.send_now(physical, action, step);
    }

    fn answer_later(&mut self, step: Step) {
        let id = CommandId(self.next_command);
        self.next_command += 1;
        self.pending.insert(id, step);
        self.answered_here.push_back(id);
    }

    /// Hands a command to the adapter, on the adapter's connection `conn`.
    fn send_now(&mut self, conn: ConnId, action: Action, step: Step) {
        let id = CommandId(self.next_command);
        self.next_command += 1;
        match &action {
            Action::Execute { statement, .. } => {
                if statement.kind == StatementKind::Begin {
                    self.unclean.insert(conn);
                }
                self.watched.insert(id, (conn, Some(statement.kind)));
            }
            Action::Lock { .. } | Action::Unlock { .. } => {
                self.watched.insert(id, (conn, None));
            }
            Action::Acquire => {
                self.acquiring.insert(id);
            }
            _ => {}
        }
        self.pending.insert(id, step);
        let command = Command { id, conn, action };
        if self.dialect == Dialect::Sqlite {
            // A command waits behind an earlier command of its connection that waits, and a
            // statement behind the statement that runs.
            let behind = self.held_back.iter().any(|c| c.conn == conn)
                || (runs_sql(&command.action) && self.running_statement.is_some());
            if behind {
                self.held_back.push_back(command);
                return;
            }
            if runs_sql(&command.action) {
                self.running_statement = Some(id);
            }
        }
        self.commands.push_back(command);
    }

    /// SQLite: the statement that ran has answered; the commands held back behind it go out,
    /// up to the next statement.
    fn statement_answered(&mut self, id: CommandId) {
        if self.running_statement != Some(id) {
            return;
        }
        self.running_statement = None;
        let mut waiting = std::mem::take(&mut self.held_back);
        while let Some(command) = waiting.pop_front() {
            let behind = self.held_back.iter().any(|c| c.conn == command.conn)
                || (runs_sql(&command.action) && self.running_statement.is_some());
            if behind {
                self.held_back.push_back(command);
                continue;
            }
            if runs_sql(&command.action) {
                self.running_statement = Some(command.id);
            }
            self.commands.push_back(command);
        }
    }

    fn execute(&mut self, conn: ConnId, statement: &Statement, binds: Vec<Value>, step: Step) {
        self.send(
            conn,
            Action::Execute {
                statement: statement.clone(),
                binds,
            },
            step,
        );
    }

    fn may_claim(&self, s: &Sub) -> bool {
        s.state == SubState::Ready
            && !s.stopped
            && s.free() > 0
            && (s.side_by_side() || s.claims_in_flight == 0)
    }

    /// Starts the claims that are due, and ends the shutdown when nothing is left.
    fn drive(&mut self) {
        loop {
            self.answer_here();
            self.drive_once();
            if self.answered_here.is_empty() {
                break;
            }
        }
    }

    fn drive_once(&mut self) {
        let now = self.now;
        if self.state == State::Running {
            for i in 0..self.subs.len() {
                let s = &self.subs[i];
                if s.state == SubState::Checking
                    && s.check_conn.is_none()
                    && s.next_check_at.is_some_and(|t| t <= now)
                {
                    self.start_check(SubId(i));
                }
                loop {
                    let s = &self.subs[i];
                    if !self.may_claim(s) || s.next_claim_at.is_none_or(|t| t > now) {
                        break;
                    }
                    let started = self.start_claim(SubId(i));
                    let s = &self.subs[i];
                    if !started || s.statements.form != Form::RowLock || !s.last_full {
                        break;
                    }
                }
            }
        }
        if self.state == State::ShuttingDown && self.pending.is_empty() {
            debug_assert!(
                self.conns.is_empty() && self.idle.is_empty(),
                "a connection outlived the shutdown"
            );
            debug_assert!(
                self.deliveries.is_empty(),
                "a delivery outlived the shutdown"
            );
            self.state = State::Closed;
            self.events.push_back(Event::Closed(self.counts));
        }
    }

    fn start_claim(&mut self, sub: SubId) -> bool {
        let s = &mut self.subs[sub.0];
        let free = s.free();
        if free == 0 {
            return false;
        }
        let limit = match (s.statements.form, s.mode) {
            (Form::RowLock, _) => 1,
            (_, mode) if mode.first_rows_only() => 1,
            (Form::Advisory, _) => free,
            _ => free,
        };
        s.claiming += limit;
        s.claims_in_flight += 1;
        // After a claim that found all it asked for, the next may start as soon as a slot
        // frees, beside this one; otherwise this claim's end decides when the next runs.
        s.next_claim_at = (s.side_by_side() && s.last_full).then_some(self.now);
        let claim = self.next_claim;
        self.next_claim += 1;
        let conn = self.new_conn();
        self.claims.insert(
            claim,
            Claim {
                sub,
                conn: Some(conn),
                limit,
                found: 0,
                taken: Vec::new(),
                candidates: VecDeque::new(),
                current: None,
                row_id: None,
                loaded: false,
                passed: BTreeSet::new(),
                until: None,
                failed: false,
            },
        );
        self.send(
            conn,
            Action::Acquire,
            Step::Claim {
                claim,
                stage: ClaimStage::Acquire,
            },
        );
        true
    }

    // ----- checks -----

    fn on_check(&mut self, sub: SubId, stage: CheckStage, reply: Reply<R>) {
        let conn_of = |b: &Self| b.check_conn(sub);
        let table = self.subs[sub.0].desc.table;
        if let Reply::Failed(error) = reply {
            let acquired = !matches!(stage, CheckStage::Acquire);
            if matches!(stage, CheckStage::Release | CheckStage::Close) {
                self.on_check_done(sub);
                return;
            }
            if error.kind == ErrorKind::UndefinedTable {
                self.check_failed(sub, CheckError::MissingTable { table });
            } else {
                // A passing failure: the check runs again after a poll interval.
                let s = &mut self.subs[sub.0];
                s.next_check_at = Some(self.now.plus(s.options.poll_interval));
                self.events.push_back(Event::Error { sub, error });
            }
            let conn = conn_of(self);
            if acquired {
                self.send(
                    conn,
                    Action::Close,
                    Step::Check {
                        sub,
                        stage: CheckStage::Close,
                    },
                );
            } else {
                self.conns.remove(&conn);
                self.subs[sub.0].check_conn = None;
            }
            return;
        }
        let conn = conn_of(self);
        match stage {
            CheckStage::Acquire => {
                let s = &self.subs[sub.0];
                let statement = s.statements.list_columns.clone();
                let (schema, name) = match s.desc.table.rsplit_once('.') {
                    Some((schema, name)) => (schema, name),
                    None => ("", s.desc.table),
                };
                let binds = statement.binds(|arg| match arg {
                    Arg::Schema => Value::Text(schema.to_owned()),
                    _ => Value::Text(name.to_owned()),
                });
                self.execute(
                    conn,
                    &statement,
                    binds,
                    Step::Check {
                        sub,
                        stage: CheckStage::Columns,
                    },
                );
            }
            CheckStage::Columns => {
                let rows = rows_of(reply);
                let found: BTreeSet<String> = rows
                    .iter()
                    .filter_map(|r| {
                        r.values
                            .first()
                            .and_then(|v| v.as_text())
                            .map(str::to_owned)
                    })
                    .collect();
                let desc = self.subs[sub.0].desc;
                if found.is_empty() {
                    self.check_failed(sub, CheckError::MissingTable { table });
                    self.check_release(sub, conn);
                    return;
                }
                if let Some((column, role)) = missing_column(&desc, &found) {
                    self.check_failed(
                        sub,
                        CheckError::MissingColumn {
                            table,
                            column,
                            role,
                        },
                    );
                    self.check_release(sub, conn);
                    return;
                }
                self.check_next(sub, conn, CheckStage::Columns);
            }
            CheckStage::Database => {
                let db = rows_of(reply)
                    .first()
                    .and_then(|r| r.values.first())
                    .and_then(|v| v.as_text().map(str::to_owned));
                self.subs[sub.0].database = db;
                self.check_next(sub, conn, CheckStage::Database);
            }
            CheckStage::Isolation => {
                let level = rows_of(reply)
                    .first()
                    .and_then(|r| r.values.first())
                    .and_then(|v| v.as_text().map(str::to_owned))
                    .unwrap_or_default();
                if !level.eq_ignore_ascii_case("read committed")
                    && !level.eq_ignore_ascii_case("read uncommitted")
                {
                    self.check_failed(sub, CheckError::Isolation { table, level });
                    self.check_release(sub, conn);
                    return;
                }
                self.check_next(sub, conn, CheckStage::Isolation);
            }
            CheckStage::Release | CheckStage::Close => self.on_check_done(sub),
        }
    }

    fn check_conn(&self, sub: SubId) -> ConnId {
        self.subs[sub.0]
            .check_conn
            .expect("a check in flight holds its connection")
    }
}

/// The most lease settlements one statement runs: settlements asked for while another of
/// the subscription's runs wait for it, then run together.
pub const SETTLE_BATCH: usize = 64;

/// PostgreSQL: a publisher's notifying statements start at most this often. A publish within
/// this time of the publisher's last notification inserts without notifying, and one
/// notification follows once the time has passed and the insert has taken effect: concurrent
/// publishers are not made to commit one at a time (PostgreSQL commits notifying
/// transactions one at a time), and a subscription in another process still hears of the
/// rows within this time of their insert.
pub const NOTIFY_EVERY: Duration = Duration::from_millis(2);

/// The most rows one insert of a batch publish writes.
pub const PUBLISH_BATCH: usize = 100;

/// The binds of `row` for its publisher's single-row insert.
fn row_binds(p: &Publisher, row: &Publish, now: Time) -> Result<Vec<Value>, BrokerError> {
    let mut missing = None;
    let binds = p.statement.binds(|arg| match arg {
        Arg::Id => row.id.clone().unwrap_or_else(|| {
            missing = Some(p.desc.id.name);
            Value::Null
        }),
        Arg::Payload => Value::Bytes(row.payload.clone()),
        Arg::Due => Value::Int(row.due.unwrap_or(now).micros()),
        Arg::Column(name) => row
            .columns
            .iter()
            .find(|(c, _)| *c == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| {
                missing = Some(name);
                Value::Null
            }),
        _ => Value::Null,
    });
    match missing {
        Some(column) => Err(BrokerError::MissingValue {
            table: p.desc.table,
            column,
        }),
        None => Ok(binds),
    }
}

/// Whether the action runs SQL on the database: a statement, or the service's own lock.
fn runs_sql(action: &Action) -> bool {
    matches!(
        action,
        Action::Execute { .. } | Action::Lock { .. } | Action::Unlock { .. }
    )
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn rows_of<R>(reply: Reply<R>) -> Vec<Row<R>> {
    match reply {
        Reply::Rows(rows) => rows,
        _ => Vec::new(),
    }
}

/// The first described column the table lacks, with its role.
fn missing_column(
    desc: &TableDesc,
    found: &BTreeSet<String>,
) -> Option<(&'static str, &'static str)> {
    let mut roles: Vec<(&'static str, &'static str)> = vec![(desc.id.name, "the id")];
    let described = [
        (desc.payload, "the payload"),
        (desc.attempt, "the attempt"),
        (desc.locked_until, "the lease's `locked_until`"),
        (desc.processed_at, "`processed_at`"),
        (desc.due, "the due time"),
    ];
    for (column, role) in described {
        if let Some(column) = column {
            roles.push((column.name, role));
        }
    }
    for column in desc.key_columns() {
        roles.push((column, "a part of the advisory lock key"));
    }
    for order in desc.order {
        roles.push((order.column, "a column of the claim order"));
    }
    roles.into_iter().find(|(column, _)| {
        !found.contains(*column) && !found.iter().any(|f| f.eq_ignore_ascii_case(column))
    })
}

// ----- checks, claims, deliveries and publishes -----

impl<R> Broker<R> {
    fn start_check(&mut self, sub: SubId) {
        let conn = self.new_conn();
        let s = &mut self.subs[sub.0];
        s.check_conn = Some(conn);
        s.next_check_at = None;
        self.send(
            conn,
            Action::Acquire,
            Step::Check {
                sub,
                stage: CheckStage::Acquire,
            },
        );
    }

    fn check_failed(&mut self, sub: SubId, error: CheckError) {
        self.subs[sub.0].state = SubState::Failed;
        self.events.push_back(Event::CheckFailed { sub, error });
    }

    fn check_release(&mut self, sub: SubId, conn: ConnId) {
        self.send(
            conn,
            Action::Release,
            Step::Check {
                sub,
                stage: CheckStage::Release,
            },
        );
    }

    /// The check's step after `after`: the database's name, the isolation level, then done.
    fn check_next(&mut self, sub: SubId, conn: ConnId, after: CheckStage) {
        let s = &self.subs[sub.0];
        let next = match after {
            CheckStage::Columns if s.statements.current_database.is_some() => {
                Some((s.statements.current_database.clone(), CheckStage::Database))
            }
            CheckStage::Columns | CheckStage::Database if s.statements.isolation.is_some() => {
                Some((s.statements.isolation.clone(), CheckStage::Isolation))
            }
            _ => None,
        };
        match next {
            Some((Some(statement), stage)) => {
                self.execute(conn, &statement, Vec::new(), Step::Check { sub, stage });
            }
            _ => self.check_release(sub, conn),
        }
    }

    fn on_check_done(&mut self, sub: SubId) {
        let now = self.now;
        let s = &mut self.subs[sub.0];
        s.check_conn = None;
        if s.state == SubState::Checking
            && s.next_check_at.is_none()
            && self.state == State::Running
        {
            s.state = SubState::Ready;
            if !s.stopped {
                s.next_claim_at = Some(now);
            }
            self.events.push_back(Event::Ready { sub });
        }
    }

    // ----- claims -----

    fn claim_step(&mut self, claim: u64, conn: ConnId, action: Action, stage: ClaimStage) {
        self.send(conn, action, Step::Claim { claim, stage });
    }

    fn claim_execute(
        &mut self,
        claim: u64,
        conn: ConnId,
        statement: &Statement,
        binds: Vec<Value>,
        stage: ClaimStage,
    ) {
        self.execute(conn, statement, binds, Step::Claim { claim, stage });
    }

    fn on_claim(&mut self, claim: u64, stage: ClaimStage, reply: Reply<R>) {
        let Some(c) = self.claims.get(&claim) else {
            return;
        };
        let sub = c.sub;
        let conn = c.conn;
        let now = self.now;
        if let Reply::Failed(error) = reply {
            self.on_claim_failed(claim, stage, error);
            return;
        }
        if matches!(stage, ClaimStage::Release | ClaimStage::Close) {
            let c = self.claims.get_mut(&claim).expect("claim in flight");
            c.conn = None;
            if c.failed || c.candidates.is_empty() && c.current.is_none() {
                self.finish_claim(claim);
            } else {
                self.next_candidate(claim);
            }
            return;
        }
        let Some(conn) = conn else {
            return;
        };
        let statements = &self.subs[sub.0].statements;
        let form = statements.form;
        let options = self.subs[sub.0].options;
        match stage {
            ClaimStage::Acquire => match form {
                Form::RowLock if self.subs[sub.0].counts_attempts() => {
                    let s = &mut self.subs[sub.0];
                    s.count_queue.push_back(claim);
                    if s.counting.is_none() {
                        self.next_count(sub);
                    }
                }
                Form::RowLock => {
                    let begin = statements.begin.clone();
                    self.claim_execute(claim, conn, &begin, Vec::new(), ClaimStage::Begin);
                }
                Form::Lease if self.dialect.update_returning() => {
                    let statement = statements.claim_lease.clone().expect("lease statements");
                    let until = now.plus(options.lease);
                    let c = self.claims.get_mut(&claim).expect("claim in flight");
                    c.until = Some(until);
                    let limit = c.limit;
                    let binds = statement.binds(|arg| match arg {
                        Arg::Until => Value::Int(until.micros()),
                        Arg::Limit => Value::Int(limit as i64),
                        _ => Value::Int(now.micros()),
                    });
                    self.claim_execute(claim, conn, &statement, binds, ClaimStage::ClaimLease);
                }
                Form::Lease => {
                    let begin = statements.begin.clone();
                    self.claim_execute(claim, conn, &begin, Vec::new(), ClaimStage::Begin);
                }
                Form::Advisory => {
                    if !self.claims[&claim].loaded {
                        let statement = statements.candidates.clone().expect("advisory");
                        let s = &self.subs[sub.0];
                        // Enough to pass over the rows in work (claimed ahead too) and the rows
                        // the subscription's other claims are taking, and still find this
                        // claim's: `claiming` counts this claim's slots and theirs.
                        let limit = if s.mode.first_rows_only() {
                            1
                        } else {
                            s.in_work + s.claiming + self.claims[&claim].limit
                        };
                        let binds = statement.binds(|arg| match arg {
                            Arg::Limit => Value::Int(limit as i64),
                            _ => Value::Int(now.micros()),
                        });
                        self.claim_execute(claim, conn, &statement, binds, ClaimStage::Candidates);
                    } else {
                        self.lock_current(claim);
                    }
                }
            },
            ClaimStage::Begin => {
                let statement = match form {
                    Form::RowLock => statements.lock_row.clone(),
                    _ => statements.select_lease.clone(),
                }
                .expect("the form's claim statement");
                let limit = self.claims[&claim].limit;
                let binds = statement.binds(|arg| match arg {
                    Arg::Limit => Value::Int(limit as i64),
                    _ => Value::Int(now.micros()),
                });
                let stage = if form == Form::RowLock {
                    ClaimStage::LockRow
                } else {
                    ClaimStage::SelectLease
                };
                self.claim_execute(claim, conn, &statement, binds, stage);
            }
            ClaimStage::LockRow | ClaimStage::LockRowById => {
                self.end_count(claim);
                let statements = &self.subs[sub.0].statements;
                let mut rows = rows_of(reply);
                let Some(row) = rows.pop() else {
                    if matches!(stage, ClaimStage::LockRowById) {
                        // Another claim took the counted row first: claim again at once.
                        let c = self.claims.get_mut(&claim).expect("claim in flight");
                        c.found = c.limit;
                    }
                    let rollback = statements.rollback.clone();
                    self.claim_execute(claim, conn, &rollback, Vec::new(), ClaimStage::Rollback);
                    return;
                };
                self.claim_delivers_conn(claim, row, None, 0);
                self.finish_claim(claim);
            }
            ClaimStage::CountRow | ClaimStage::SelectRowId => {
                let row = rows_of(reply).pop().map(|r| {
                    let mut values = r.values.into_iter();
                    let id = values.next().unwrap_or(Value::Null);
                    let attempt = values.next().and_then(|v| v.as_int()).unwrap_or(0);
                    (id, attempt)
                });
                let Some((id, attempt)) = row else {
                    self.end_count(claim);
                    let statements = &self.subs[sub.0].statements;
                    if matches!(stage, ClaimStage::SelectRowId) {
                        let rollback = statements.rollback.clone();
                        self.claim_execute(
                            claim,
                            conn,
                            &rollback,
                            Vec::new(),
                            ClaimStage::Rollback,
                        );
                    } else {
                        self.claim_release(claim);
                    }
                    return;
                };
                let c = self.claims.get_mut(&claim).expect("claim in flight");
                // MySQL reads the attempt before it counts it.
                let counted = if matches!(stage, ClaimStage::SelectRowId) {
                    attempt + 1
                } else {
                    attempt
                };
                c.row_id = Some((id.clone(), counted));
                if matches!(stage, ClaimStage::SelectRowId) {
                    let statement = statements
                        .count_attempt
                        .clone()
                        .expect("a table with an attempt column counts it");
                    let binds = statement.binds(|_| id.clone());
                    self.claim_execute(claim, conn, &statement, binds, ClaimStage::CountAttempt);
                } else {
                    self.claim_lock_counted(claim, conn);
                }
            }
            ClaimStage::CountAttempt => {
                let commit = statements.commit.clone();
                self.claim_execute(claim, conn, &commit, Vec::new(), ClaimStage::CountCommit);
            }
            ClaimStage::CountCommit => self.claim_lock_counted(claim, conn),
            ClaimStage::BeginCount => {
                let statement = statements
                    .select_row_id
                    .clone()
                    .expect("MySQL counts the attempt in a transaction of its own");
                let binds = statement.binds(|_| Value::Int(now.micros()));
                self.claim_execute(claim, conn, &statement, binds, ClaimStage::SelectRowId);
            }
            ClaimStage::BeginLock => {
                let statement = statements
                    .lock_row_by_id
                    .clone()
                    .expect("a table with an attempt column locks the counted row");
                let (id, attempt) = self.claims[&claim].row_id.clone().expect("the counted row");
                let binds = statement.binds(|arg| match arg {
                    Arg::Id => id.clone(),
                    Arg::Attempt => Value::Int(attempt),
                    _ => Value::Int(now.micros()),
                });
                self.claim_execute(claim, conn, &statement, binds, ClaimStage::LockRowById);
            }
            ClaimStage::ClaimLease => {
                let rows = rows_of(reply);
                self.deliver_leased(claim, rows, 0);
                self.claim_release(claim);
            }
            ClaimStage::SelectLease => {
                let mut rows = rows_of(reply);
                // More rows than the limit asked for are not this claim's to take.
                rows.truncate(self.claims[&claim].limit);
                if rows.is_empty() {
                    let commit = statements.commit.clone();
                    self.claim_execute(claim, conn, &commit, Vec::new(), ClaimStage::Commit);
                    return;
                }
                let statement = statements
                    .mark_lease(rows.len())
                    .cloned()
                    .expect("a lease statement for every batch size up to the workers");
                let until = now.plus(options.lease);
                let ids: Vec<Value> = rows
                    .iter()
                    .map(|r| r.values.first().cloned().unwrap_or(Value::Null))
                    .collect();
                let binds = statement.binds(|arg| match arg {
                    Arg::IdAt(i) => ids[i].clone(),
                    _ => Value::Int(until.micros()),
                });
                let c = self.claims.get_mut(&claim).expect("claim in flight");
                c.taken = rows;
                c.until = Some(until);
                self.claim_execute(claim, conn, &statement, binds, ClaimStage::MarkLease);
            }
            ClaimStage::MarkLease => {
                let commit = statements.commit.clone();
                self.claim_execute(claim, conn, &commit, Vec::new(), ClaimStage::Commit);
            }
            ClaimStage::Commit => {
                let c = self.claims.get_mut(&claim).expect("claim in flight");
                let rows = std::mem::take(&mut c.taken);
                // The rows were read before their attempts were counted.
                self.deliver_leased(claim, rows, 1);
                self.claim_release(claim);
            }
            ClaimStage::Rollback => self.claim_release(claim),
            ClaimStage::Candidates => {
                let rows = rows_of(reply);
                let c = self.claims.get_mut(&claim).expect("claim in flight");
                for row in rows {
                    let mut values = row.values.into_iter();
                    let id = values.next().unwrap_or(Value::Null);
                    let key = match values.next() {
                        Some(Value::Text(t)) => t,
                        Some(Value::Null) | None => String::new(),
                        Some(other) => other.to_string(),
                    };
                    c.candidates.push_back(Candidate {
                        id,
                        key: key.into(),
                    });
                }
                c.loaded = true;
                self.next_candidate(claim);
            }
            ClaimStage::Lock => {
                let locked = match reply {
                    Reply::Bool(b) => b,
                    Reply::Rows(rows) => rows
                        .first()
                        .and_then(|r| r.values.first())
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                    _ => false,
                };
                let mode = self.subs[sub.0].mode;
                if locked {
                    let key = self.claims[&claim]
                        .current
                        .as_ref()
                        .map(|c| c.key.clone())
                        .expect("a candidate is being locked");
                    if mode == KeyMode::Database {
                        self.keys.insert(key);
                    }
                    if self.state == State::Running {
                        self.take_current(claim);
                    } else {
                        // The shutdown began while the lock ran: release the key and take
                        // nothing, so no attempt is spent on a row no handler will see.
                        self.unlock_current(claim);
                    }
                } else if mode == KeyMode::Custom {
                    // The first due row's key is held: the claim takes nothing more.
                    let c = self.claims.get_mut(&claim).expect("claim in flight");
                    c.current = None;
                    c.candidates.clear();
                    self.next_candidate(claim);
                } else {
                    let c = self.claims.get_mut(&claim).expect("claim in flight");
                    if let Some(candidate) = c.current.take() {
                        c.passed.insert(candidate.key);
                    }
                    self.next_candidate(claim);
                }
            }
            ClaimStage::Take | ClaimStage::ReadRow => {
                let mut rows = rows_of(reply);
                match rows.pop() {
                    Some(row) => {
                        // The take's row already counts this attempt.
                        let c = self.claims.get_mut(&claim).expect("claim in flight");
                        let candidate = c.current.take().expect("a candidate is being taken");
                        c.found += 1;
                        self.claim_delivers_conn(claim, row, Some(candidate.key), 0);
                        self.next_candidate(claim);
                    }
                    None => self.unlock_current(claim),
                }
            }
            ClaimStage::TakeCount => {
                if matches!(reply, Reply::Affected(n) if n > 0) {
                    let statement = statements.read_row.clone();
                    let id = self.claims[&claim]
                        .current
                        .as_ref()
                        .map(|c| c.id.clone())
                        .expect("a candidate is being taken");
                    let binds = statement.binds(|_| id.clone());
                    self.claim_execute(claim, conn, &statement, binds, ClaimStage::ReadRow);
                } else {
                    self.unlock_current(claim);
                }
            }
            ClaimStage::Unlock => {
                let released = match reply {
                    Reply::Bool(b) => b,
                    Reply::Rows(rows) => rows
                        .first()
                        .and_then(|r| r.values.first())
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                    _ => false,
                };
                let c = self.claims.get_mut(&claim).expect("claim in flight");
                let candidate = c.current.take().expect("a candidate is being unlocked");
                self.keys.remove(&candidate.key);
                if released {
                    self.next_candidate(claim);
                } else {
                    // The session may still hold the key: closing it ends the lock.
                    let c = self.claims.get_mut(&claim).expect("claim in flight");
                    c.conn = None;
                    self.claim_step(claim, conn, Action::Close, ClaimStage::Close);
                }
            }
            ClaimStage::Release | ClaimStage::Close => {}
        }
    }

    fn on_claim_failed(&mut self, claim: u64, stage: ClaimStage, error: DbError) {
        self.end_count(claim);
        let c = self.claims.get_mut(&claim).expect("claim in flight");
        let sub = c.sub;
        c.failed = true;
        c.candidates.clear();
        let current = c.current.take();
        let conn = c.conn.take();
        c.row_id = None;
        c.taken.clear();
        if let Some(candidate) = current
            && !matches!(stage, ClaimStage::Lock)
        {
            // A key locked on this connection ends with it; the registry forgets it.
            self.keys.remove(&candidate.key);
        }
        let serialization = error.kind == ErrorKind::Serialization
            && self.subs[sub.0].statements.form == Form::RowLock;
        let error = if serialization {
            DbError::new(
                ErrorKind::Serialization,
                format!(
                    "table `{}`: {}; the row lock form needs `default_transaction_isolation` = 'read committed'",
                    self.subs[sub.0].desc.table, error.message
                ),
            )
        } else {
            error
        };
        match stage {
            ClaimStage::Release | ClaimStage::Close => {
                self.finish_claim(claim);
                return;
            }
            ClaimStage::Acquire => {
                if let Some(conn) = conn {
                    self.conns.remove(&conn);
                }
            }
            _ => {
                if let Some(conn) = conn {
                    self.claim_step(claim, conn, Action::Close, ClaimStage::Close);
                }
            }
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

    /// The row lock form: the counted row is locked for the handler in a new transaction,
    /// unless the broker is shutting down (the attempt is spent and the row is free).
    fn claim_lock_counted(&mut self, claim: u64, conn: ConnId) {
        if self.state != State::Running {
            self.end_count(claim);
            self.claim_release(claim);
            return;
        }
        let sub = self.claims[&claim].sub;
        let begin = self.subs[sub.0].statements.begin.clone();
        self.claim_execute(claim, conn, &begin, Vec::new(), ClaimStage::BeginLock);
    }

    /// Delivers the rows a lease claim took, under the lease it wrote. A reply that comes
    /// after the lease ran out delivers nothing: another claim may hold the rows by now, and
    /// the attempt is spent.
    fn deliver_leased(&mut self, claim: u64, rows: Vec<Row<R>>, add: i64) {
        let now = self.now;
        let c = self.claims.get_mut(&claim).expect("claim in flight");
        let sub = c.sub;
        c.found = rows.len();
        let Some(until) = c.until else {
            debug_assert!(rows.is_empty(), "rows taken without a lease");
            return;
        };
        if now >= until {
            let table = self.subs[sub.0].desc.table;
            self.events.push_back(Event::Error {
                sub,
                error: DbError::new(
                    ErrorKind::Timeout,
                    format!(
                        "table `{table}`: the claim of {} rows answered after their lease ran out; they return to the queue",
                        rows.len()
                    ),
                ),
            });
            return;
        }
        for row in rows {
            self.deliver(sub, row, None, None, Some(until), add);
        }
    }

    /// The claim's connection goes to a delivery of `row`.
    fn claim_delivers_conn(&mut self, claim: u64, row: Row<R>, key: Option<Arc<str>>, add: i64) {
        let c = self.claims.get_mut(&claim).expect("claim in flight");
        let sub = c.sub;
        let conn = c.conn.take();
        if c.found == 0 {
            c.found = 1;
        }
        self.deliver(sub, row, conn, key, None, add);
    }

    fn claim_release(&mut self, claim: u64) {
        let c = self.claims.get_mut(&claim).expect("claim in flight");
        match c.conn.take() {
            Some(conn) => self.claim_step(claim, conn, Action::Release, ClaimStage::Release),
            None => self.finish_claim(claim),
        }
    }

    /// The row lock form with an attempt column: `claim`'s count and lock are done, or it
    /// ended; the next claim waiting for the count starts it.
    fn end_count(&mut self, claim: u64) {
        let Some(sub) = self.claims.get(&claim).map(|c| c.sub) else {
            return;
        };
        let s = &mut self.subs[sub.0];
        s.count_queue.retain(|c| *c != claim);
        if s.counting == Some(claim) {
            s.counting = None;
            self.next_count(sub);
        }
    }

    /// Starts the count of the first claim waiting for it. With an attempt column, the attempt
    /// is counted and committed before the row is locked for the handler, so a crash spends
    /// it. From the shutdown on, a waiting claim counts nothing and lets its connection go.
    fn next_count(&mut self, sub: SubId) {
        while self.subs[sub.0].counting.is_none() {
            let Some(claim) = self.subs[sub.0].count_queue.pop_front() else {
                return;
            };
            let Some(conn) = self.claims.get(&claim).and_then(|c| c.conn) else {
                continue;
            };
            if self.state != State::Running {
                self.claim_release(claim);
                continue;
            }
            self.subs[sub.0].counting = Some(claim);
            let now = self.now;
            let statements = &self.subs[sub.0].statements;
            if let Some(count) = statements.count_row.clone() {
                let binds = count.binds(|_| Value::Int(now.micros()));
                self.claim_execute(claim, conn, &count, binds, ClaimStage::CountRow);
            } else {
                let begin = statements.begin.clone();
                self.claim_execute(claim, conn, &begin, Vec::new(), ClaimStage::BeginCount);
            }
        }
    }

    /// The advisory claim's next candidate, or its end.
    fn next_candidate(&mut self, claim: u64) {
        loop {
            let running = self.state == State::Running;
            let c = self.claims.get_mut(&claim).expect("claim in flight");
            let sub = c.sub;
            if !running || c.found >= c.limit {
                c.candidates.clear();
            }
            let Some(candidate) = c.candidates.pop_front() else {
                self.claim_release(claim);
                return;
            };
            let mode = self.subs[sub.0].mode;
            match mode {
                KeyMode::Database
                    if self.keys.contains(&candidate.key) || c.passed.contains(&candidate.key) =>
                {
                    let c = self.claims.get_mut(&claim).expect("claim in flight");
                    c.passed.insert(candidate.key);
                    continue;
                }
                KeyMode::Registry if self.keys.contains(&candidate.key) => {
                    // The first due rows are in work: the claim takes nothing while they are.
                    let c = self.claims.get_mut(&claim).expect("claim in flight");
                    c.candidates.clear();
                    continue;
                }
                _ => {}
            }
            let c = self.claims.get_mut(&claim).expect("claim in flight");
            c.current = Some(candidate);
            match c.conn {
                Some(_) => self.lock_current(claim),
                None => {
                    let conn = self.new_conn();
                    let c = self.claims.get_mut(&claim).expect("claim in flight");
                    c.conn = Some(conn);
                    self.claim_step(claim, conn, Action::Acquire, ClaimStage::Acquire);
                }
            }
            return;
        }
    }

    fn lock_current(&mut self, claim: u64) {
        let c = &self.claims[&claim];
        let sub = c.sub;
        let conn = c.conn.expect("a connection to lock on");
        let key = c.current.as_ref().expect("a candidate to lock").key.clone();
        if self.state != State::Running {
            // The shutdown began while the claim's connection was acquired: take nothing.
            let c = self.claims.get_mut(&claim).expect("claim in flight");
            c.current = None;
            c.candidates.clear();
            self.next_candidate(claim);
            return;
        }
        match self.subs[sub.0].mode {
            KeyMode::Registry => {
                self.keys.insert(key);
                self.take_current(claim);
            }
            KeyMode::Custom => {
                self.claim_step(claim, conn, Action::Lock { sub, key }, ClaimStage::Lock);
            }
            KeyMode::Database | KeyMode::None => {
                let statement = self.subs[sub.0]
                    .statements
                    .try_lock
                    .clone()
                    .expect("the advisory form locks keys");
                let arg = self.key_arg(sub, &key);
                let binds = statement.binds(|_| arg.clone());
                self.claim_execute(claim, conn, &statement, binds, ClaimStage::Lock);
            }
        }
    }

    /// The bind that names a key's lock in the database.
    fn key_arg(&self, sub: SubId, key: &str) -> Value {
        match self.dialect {
            Dialect::Postgres => Value::Int(postgres_key_hash(key)),
            _ => Value::Text(mysql_lock_name(
                self.subs[sub.0].database.as_deref().unwrap_or(""),
                key,
            )),
        }
    }

    fn take_current(&mut self, claim: u64) {
        let c = &self.claims[&claim];
        let sub = c.sub;
        let conn = c.conn.expect("a connection to take on");
        let id = c.current.as_ref().expect("a candidate to take").id.clone();
        let now = self.now;
        let statements = &self.subs[sub.0].statements;
        let (statement, stage) = match (&statements.take, &statements.take_count) {
            (Some(take), _) => (take.clone(), ClaimStage::Take),
            (None, Some(count)) => (count.clone(), ClaimStage::TakeCount),
            (None, None) => unreachable!("the advisory form renders a take"),
        };
        let binds = statement.binds(|arg| match arg {
            Arg::Id => id.clone(),
            _ => Value::Int(now.micros()),
        });
        self.claim_execute(claim, conn, &statement, binds, stage);
    }

    /// The current candidate's row is no longer claimable: release its key.
    fn unlock_current(&mut self, claim: u64) {
        let c = &self.claims[&claim];
        let sub = c.sub;
        let conn = c.conn.expect("the connection that holds the key");
        let key = c
            .current
            .as_ref()
            .expect("a candidate to unlock")
            .key
            .clone();
        match self.subs[sub.0].mode {
            KeyMode::Registry => {
                self.keys.remove(&key);
                let c = self.claims.get_mut(&claim).expect("claim in flight");
                c.current = None;
                self.next_candidate(claim);
            }
            KeyMode::Custom => {
                self.claim_step(claim, conn, Action::Unlock { sub, key }, ClaimStage::Unlock);
            }
            KeyMode::Database | KeyMode::None => {
                let statement = self.subs[sub.0]
                    .statements
                    .unlock
                    .clone()
                    .expect("the advisory form unlocks keys");
                let arg = self.key_arg(sub, &key);
                let binds = statement.binds(|_| arg.clone());
                self.claim_execute(claim, conn, &statement, binds, ClaimStage::Unlock);
            }
        }
    }

    fn finish_claim(&mut self, claim: u64) {
        self.end_count(claim);
        let Some(c) = self.claims.remove(&claim) else {
            return;
        };
        debug_assert!(c.conn.is_none(), "a claim ended holding a connection");
        let now = self.now;
        let s = &mut self.subs[c.sub.0];
        s.claiming -= c.limit;
        s.claims_in_flight -= 1;
        s.last_full = !c.failed && c.found >= c.limit;
        let next = if s.last_full {
            now
        } else {
            now.plus(s.options.poll_interval)
        };
        // A wake that came while the claim ran keeps its earlier time.
        if !s.stopped {
            s.next_claim_at = Some(s.next_claim_at.map_or(next, |t| t.min(next)));
        }
    }

    // ----- deliveries -----

    fn deliver(
        &mut self,
        sub: SubId,
        row: Row<R>,
        conn: Option<ConnId>,
        key: Option<Arc<str>>,
        fence: Option<Time>,
        add: i64,
    ) {
        let id = DeliveryId(self.next_delivery);
        self.next_delivery += 1;
        let s = &mut self.subs[sub.0];
        s.in_work += 1;
        let attempt_at = s.desc.attempt.map(|_| 1);
        let row_id = row.values.first().cloned().unwrap_or(Value::Null);
        let attempt = attempt_at
            .and_then(|i| row.values.get(i))
            .and_then(Value::as_int)
            .map(|a| a + add);
        // Extend when `extend_every` has passed since the lease was written.
        let early = s.options.lease.saturating_sub(s.options.extend_every);
        let extend_at =
            fence.map(|until| Time(until.micros().saturating_sub(micros(early))).max(self.now));
        self.deliveries.insert(
            id,
            Delivery {
                sub,
                id: row_id.clone(),
                key: key.clone(),
                conn,
                fence,
                state: DeliveryState::InWork,
                ending: None,
                extend_at,
                lease_lost: false,
                deadline: None,
                queued: None,
                holds: true,
                settled: false,
                delivered: self.state == State::Running,
                handling: false,
                batch: Vec::new(),
                claimed_at: self.now,
            },
        );
        if self.state == State::Running {
            let delivered = Delivered {
                sub,
                delivery: id,
                id: row_id,
                attempt,
                key,
                row: row.raw,
            };
            let s = &mut self.subs[sub.0];
            if s.handling < s.options.workers {
                s.handed += 1;
                s.handling += 1;
                if let Some(d) = self.deliveries.get_mut(&id) {
                    d.handling = true;
                }
                self.events.push_back(Event::Delivered(delivered));
            } else {
                // Claimed ahead: held (by its lease, its transaction or its key's lock) until a
                // worker frees, or given back at once when the subscription has stopped
                // meanwhile.
                let stopped = s.stopped;
                if let Some(d) = self.deliveries.get_mut(&id) {
                    d.delivered = false;
                }
                if stopped {
                    self.end(id, Ending::Drop);
                } else {
                    self.ahead[sub.0].push_back(delivered);
                }
            }
        } else {
            self.end(id, Ending::Shutdown);
        }
    }

    /// Hands rows claimed ahead to the runtime while workers are free; a row whose lease was
    /// lost meanwhile is passed over and ends.
    fn hand_ahead(&mut self, sub: SubId) {
        while self.state == State::Running {
            let s = &self.subs[sub.0];
            if s.handling >= s.options.workers || s.stopped {
                return;
            }
            let Some(next) = self.ahead[sub.0].pop_front() else {
                return;
            };
            let now = self.now;
            let Some(d) = self.deliveries.get_mut(&next.delivery) else {
                continue;
            };
            // A lease that ran out while the row waited may be another process's now. A row
            // lock or a key's lock holds while its session does: one that waited long is
            // handed once its session has answered a ping.
            let ran_out = self.subs[sub.0].statements.form == Form::Lease
                && d.fence.is_none_or(|until| until <= now);
            if d.lease_lost || d.ending.is_some() || ran_out {
                match d.state {
                    DeliveryState::InWork if d.ending.is_none() => {
                        d.ending = Some(Ending::Drop);
                        self.finish_delivery(next.delivery);
                    }
                    // An extension runs: the row is given back once it has answered.
                    DeliveryState::Busy if d.ending.is_none() && d.queued.is_none() => {
                        d.queued = Some(Ending::Drop);
                    }
                    _ => {}
                }
                continue;
            }
            d.handling = true;
            let waited = now.since(d.claimed_at) >= PING_AHEAD_AFTER;
            let conn = d.conn;
            let s = &mut self.subs[sub.0];
            s.handling += 1;
            if let (true, Some(ping), Some(conn)) = (waited, s.statements.ping.clone(), conn) {
                // The worker's slot is kept for the row while its session is asked.
                if let Some(d) = self.deliveries.get_mut(&next.delivery) {
                    d.state = DeliveryState::Busy;
                }
                let delivery = next.delivery;
                self.pinging.insert(delivery, next);
                self.delivery_execute(delivery, conn, &ping, Vec::new(), DeliveryStage::Ping);
                continue;
            }
            s.handed += 1;
            if let Some(d) = self.deliveries.get_mut(&next.delivery) {
                d.delivered = true;
            }
            self.events.push_back(Event::Delivered(next));
        }
    }

    /// A row claimed ahead whose session answered its ping: handed, or given back when the
    /// subscription stopped or the broker began its shutdown meanwhile.
    fn pinged(&mut self, delivery: DeliveryId) {
        let Some(next) = self.pinging.remove(&delivery) else {
            return;
        };
        let Some(d) = self.deliveries.get_mut(&delivery) else {
            return;
        };
        d.state = DeliveryState::InWork;
        let sub = d.sub;
        let queued = d.queued.take();
        let stopped = self.subs[sub.0].stopped;
        if queued.is_some() || stopped || self.state != State::Running {
            d.handling = false;
            self.subs[sub.0].handling -= 1;
            self.end(delivery, queued.unwrap_or(Ending::Drop));
            return;
        }
        d.delivered = true;
        self.subs[sub.0].handed += 1;
        self.events.push_back(Event::Delivered(next));
    }

    /// The runtime settled or dropped a delivery: its worker is free for a row claimed ahead.
    fn handler_done(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get_mut(&delivery) else {
            return;
        };
        if !d.handling {
            return;
        }
        d.handling = false;
        let sub = d.sub;
        self.subs[sub.0].handling -= 1;
        self.hand_ahead(sub);
    }

    /// Gives back the rows a subscription claimed ahead, at once: their leases released, their
    /// transactions rolled back, their keys' locks released.
    fn give_back_ahead(&mut self, sub: SubId) {
        let waiting: Vec<DeliveryId> = self.ahead[sub.0].drain(..).map(|d| d.delivery).collect();
        for delivery in waiting {
            let ends = self
                .deliveries
                .get(&delivery)
                .is_some_and(|d| d.state == DeliveryState::InWork && d.ending.is_none());
            if ends {
                self.end(delivery, Ending::Drop);
            }
        }
    }

    fn delivery_step(
        &mut self,
        delivery: DeliveryId,
        conn: ConnId,
        action: Action,
        stage: DeliveryStage,
    ) {
        self.send(conn, action, Step::Delivery { delivery, stage });
    }

    fn delivery_execute(
        &mut self,
        delivery: DeliveryId,
        conn: ConnId,
        statement: &Statement,
        binds: Vec<Value>,
        stage: DeliveryStage,
    ) {
        self.execute(conn, statement, binds, Step::Delivery { delivery, stage });
    }

    fn end(&mut self, delivery: DeliveryId, ending: Ending) {
        let now = self.now;
        let running = self.state == State::Running;
        let Some(d) = self.deliveries.get_mut(&delivery) else {
            if matches!(ending, Ending::Settle(_)) {
                let error = if running {
                    SettleError::NotInWork
                } else {
                    SettleError::Closed
                };
                self.events
                    .push_back(Event::SettleFailed { delivery, error });
            }
            return;
        };
        match d.state {
            DeliveryState::Busy => {
                if d.ending.is_none() && d.queued.is_none() {
                    d.queued = Some(ending);
                } else if matches!(ending, Ending::Settle(_)) {
                    let error = if !running || d.ending == Some(Ending::Shutdown) {
                        SettleError::Closed
                    } else {
                        SettleError::NotInWork
                    };
                    self.events
                        .push_back(Event::SettleFailed { delivery, error });
                }
                return;
            }
            DeliveryState::InWork => {}
        }
        let sub = d.sub;
        let form = self.subs[sub.0].statements.form;
        if let Ending::Settle(_) = ending {
            if !running && form == Form::Lease {
                // The lease runs out unless settled before the shutdown; no new connection now.
                self.events.push_back(Event::SettleFailed {
                    delivery,
                    error: SettleError::Closed,
                });
                d.ending = Some(Ending::Shutdown);
                self.finish_delivery(delivery);
                return;
            }
            if d.lease_lost {
                self.events.push_back(Event::SettleFailed {
                    delivery,
                    error: SettleError::LeaseLost,
                });
                d.ending = Some(ending);
                self.finish_delivery(delivery);
                return;
            }
        }
        d.ending = Some(ending);
        d.state = DeliveryState::Busy;
        d.extend_at = None;
        if ending == Ending::Drop && d.conn.is_some() {
            d.deadline = Some(now.plus(DROP_GRACE));
        }
        let conn = d.conn;
        let id = d.id.clone();
        let delivered = d.delivered;
        let statements = &self.subs[sub.0].statements;
        match (form, ending) {
            (Form::RowLock, Ending::Settle(Outcome::Ack | Outcome::Reject)) => {
                let statement = statements.settle.clone();
                let binds = statement.binds(|arg| match arg {
                    Arg::Id => id.clone(),
                    _ => Value::Int(now.micros()),
                });
                let conn = conn.expect("a row lock delivery holds its connection");
                self.delivery_execute(delivery, conn, &statement, binds, DeliveryStage::Settle);
            }
            (Form::RowLock, Ending::Settle(Outcome::Retry)) => {
                let commit = statements.commit.clone();
                let conn = conn.expect("a row lock delivery holds its connection");
                self.delivery_execute(delivery, conn, &commit, Vec::new(), DeliveryStage::Commit);
            }
            (Form::RowLock, Ending::Drop | Ending::Shutdown) => {
                let rollback = statements.rollback.clone();
                let conn = conn.expect("a row lock delivery holds its connection");
                self.delivery_execute(
                    delivery,
                    conn,
                    &rollback,
                    Vec::new(),
                    DeliveryStage::Rollback,
                );
            }
            (Form::Lease, Ending::Shutdown) if delivered => {
                // The delivery keeps its lease, which runs out unless it settles first.
                self.finish_delivery(delivery);
            }
            (Form::Lease, _) => {
                if matches!(ending, Ending::Settle(Outcome::Ack | Outcome::Reject))
                    && self.subs[sub.0].batches_settlements
                {
                    let s = &mut self.subs[sub.0];
                    if s.settling.is_some() {
                        // Rides on the next settlement statement.
                        s.settle_waiting.push_back(delivery);
                        return;
                    }
                    s.settling = Some(delivery);
                }
                let conn = self.new_conn();
                self.delivery_step(delivery, conn, Action::Acquire, DeliveryStage::Acquire);
                if let Some(d) = self.deliveries.get_mut(&delivery) {
                    d.conn = Some(conn);
                }
            }
            (Form::Advisory, Ending::Settle(Outcome::Ack | Outcome::Reject)) => {
                let statement = statements.settle.clone();
                let binds = statement.binds(|arg| match arg {
                    Arg::Id => id.clone(),
                    _ => Value::Int(now.micros()),
                });
                let conn = conn.expect("an advisory delivery holds its connection");
                self.delivery_execute(delivery, conn, &statement, binds, DeliveryStage::Settle);
            }
            (Form::Advisory, _) => self.delivery_unlock(delivery),
        }
    }

    /// The lease form: extend a lease in work.
    fn extend(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get_mut(&delivery) else {
            return;
        };
        d.state = DeliveryState::Busy;
        d.extend_at = None;
        let conn = self.new_conn();
        if let Some(d) = self.deliveries.get_mut(&delivery) {
            d.conn = Some(conn);
        }
        self.delivery_step(delivery, conn, Action::Acquire, DeliveryStage::Acquire);
    }

    fn delivery_unlock(&mut self, delivery: DeliveryId) {
        let d = &self.deliveries[&delivery];
        let sub = d.sub;
        let conn = d.conn.expect("an advisory delivery holds its connection");
        let key = d.key.clone().expect("an advisory delivery has a key");
        match self.subs[sub.0].mode {
            KeyMode::Registry => {
                self.keys.remove(&key);
                self.after_unlock(delivery, true);
            }
            KeyMode::Custom => {
                self.delivery_step(
                    delivery,
                    conn,
                    Action::Unlock { sub, key },
                    DeliveryStage::Unlock,
                );
            }
            KeyMode::Database | KeyMode::None => {
                let statement = self.subs[sub.0]
                    .statements
                    .unlock
                    .clone()
                    .expect("the advisory form unlocks keys");
                let arg = self.key_arg(sub, &key);
                let binds = statement.binds(|_| arg.clone());
                self.delivery_execute(delivery, conn, &statement, binds, DeliveryStage::Unlock);
            }
        }
    }

    /// The key is released (`true`) or may still be held (`false`): the connection goes back
    /// to the pool, or is closed.
    fn after_unlock(&mut self, delivery: DeliveryId, released: bool) {
        let now = self.now;
        let d = self
            .deliveries
            .get_mut(&delivery)
            .expect("delivery in flight");
        if let Some(key) = &d.key {
            self.keys.remove(key);
        }
        let s = &mut self.subs[d.sub.0];
        if released && s.mode.first_rows_only() && !s.stopped {
            // A claim that reads the first due rows alone may find them free now: the next
            // one need not wait for the poll.
            s.next_claim_at = Some(now);
        }
        d.holds = false;
        if d.ending == Some(Ending::Settle(Outcome::Retry)) {
            // A retry runs no statement: the release returns the row.
            d.settled = true;
            self.events.push_back(Event::Settled {
                delivery,
                outcome: Outcome::Retry,
            });
        }
        let conn = d
            .conn
            .take()
            .expect("an advisory delivery holds its connection");
        let shutdown = d.ending == Some(Ending::Shutdown);
        // A delivery the runtime dropped closes its connection; a row claimed ahead and given
        // back before it was handed gives its connection back to the pool.
        let close = !released || (d.ending == Some(Ending::Drop) && d.delivered);
        if shutdown {
            if released {
                self.counts.locks_released += 1;
            } else {
                self.counts.connections_closed += 1;
            }
        }
        let (action, stage) = if close {
            (Action::Close, DeliveryStage::Close)
        } else {
            (Action::Release, DeliveryStage::Release)
        };
        self.delivery_step(delivery, conn, action, stage);
    }

    fn on_delivery(&mut self, delivery: DeliveryId, stage: DeliveryStage, reply: Reply<R>) {
        let now = self.now;
        let Some(d) = self.deliveries.get(&delivery) else {
            return;
        };
        let sub = d.sub;
        let form = self.subs[sub.0].statements.form;
        let ending = d.ending;
        let conn = d.conn;
        if let Reply::Failed(error) = reply {
            self.on_delivery_failed(delivery, stage, error);
            return;
        }
        let statements = &self.subs[sub.0].statements;
        let options = self.subs[sub.0].options;
        match stage {
            DeliveryStage::Acquire => {
                let conn = conn.expect("the lease's connection was asked for");
                let d = &self.deliveries[&delivery];
                let id = d.id.clone();
                let fence = d.fence.unwrap_or_default();
                match ending {
                    None => {
                        let statement = statements.extend_lease.clone().expect("lease");
                        let until = now.plus(options.lease);
                        let binds = statement.binds(|arg| match arg {
                            Arg::Id => id.clone(),
                            Arg::Fence => Value::Int(fence.micros()),
                            _ => Value::Int(until.micros()),
                        });
                        self.delivery_execute(
                            delivery,
                            conn,
                            &statement,
                            binds,
                            DeliveryStage::Extend { until },
                        );
                    }
                    Some(Ending::Settle(Outcome::Ack | Outcome::Reject))
                        if self.subs[sub.0].settling == Some(delivery)
                            && !self.subs[sub.0].settle_waiting.is_empty() =>
                    {
                        self.settle_batch(delivery, conn);
                    }
                    Some(Ending::Settle(Outcome::Ack | Outcome::Reject)) => {
                        let statement = statements.settle.clone();
                        let binds = statement.binds(|arg| match arg {
                            Arg::Id => id.clone(),
                            Arg::Fence => Value::Int(fence.micros()),
                            _ => Value::Int(now.micros()),
                        });
                        self.delivery_execute(
                            delivery,
                            conn,
                            &statement,
                            binds,
                            DeliveryStage::Settle,
                        );
                    }
                    Some(_) => {
                        let statement = statements.release_lease.clone().expect("lease");
                        let binds = statement.binds(|arg| match arg {
                            Arg::Id => id.clone(),
                            _ => Value::Int(fence.micros()),
                        });
                        self.delivery_execute(
                            delivery,
                            conn,
                            &statement,
                            binds,
                            DeliveryStage::ReleaseLease,
                        );
                    }
                }
            }
            DeliveryStage::Extend { until } => {
                let d = self
                    .deliveries
                    .get_mut(&delivery)
                    .expect("delivery in flight");
                if matches!(reply, Reply::Affected(n) if n > 0) {
                    d.fence = Some(until);
                    d.extend_at = Some(now.plus(options.extend_every));
                } else {
                    d.lease_lost = true;
                    d.holds = false;
                    if d.delivered {
                        self.events.push_back(Event::LeaseLost { delivery });
                    }
                }
                let conn = d.conn.take().expect("the extension's connection");
                self.delivery_step(delivery, conn, Action::Release, DeliveryStage::Release);
            }
            DeliveryStage::Settle => {
                let affected = matches!(reply, Reply::Affected(n) if n > 0);
                let outcome = match ending {
                    Some(Ending::Settle(o)) => o,
                    _ => Outcome::Ack,
                };
                match form {
                    Form::RowLock => {
                        let commit = statements.commit.clone();
                        let conn = conn.expect("a row lock delivery holds its connection");
                        self.delivery_execute(
                            delivery,
                            conn,
                            &commit,
                            Vec::new(),
                            DeliveryStage::Commit,
                        );
                    }
                    Form::Lease => {
                        let d = self
                            .deliveries
                            .get_mut(&delivery)
                            .expect("delivery in flight");
                        d.holds = false;
                        if affected {
                            d.settled = true;
                            self.events.push_back(Event::Settled { delivery, outcome });
                        } else {
                            self.events.push_back(Event::SettleFailed {
                                delivery,
                                error: SettleError::LeaseLost,
                            });
                        }
                        let conn = d.conn.take().expect("the settlement's connection");
                        self.delivery_step(delivery, conn, Action::Release, DeliveryStage::Release);
                        self.settle_done(sub, delivery);
                    }
                    Form::Advisory => {
                        let d = self
                            .deliveries
                            .get_mut(&delivery)
                            .expect("delivery in flight");
                        d.settled = true;
                        self.events.push_back(Event::Settled { delivery, outcome });
                        self.delivery_unlock(delivery);
                    }
                }
            }
            DeliveryStage::SettleBatch => {
                let settled: BTreeSet<Value> = rows_of(reply)
                    .into_iter()
                    .filter_map(|row| row.values.into_iter().next())
                    .collect();
                let d = self
                    .deliveries
                    .get_mut(&delivery)
                    .expect("delivery in flight");
                let batch = std::mem::take(&mut d.batch);
                for each in std::iter::once(delivery).chain(batch.iter().copied()) {
                    let Some(d) = self.deliveries.get_mut(&each) else {
                        continue;
                    };
                    d.holds = false;
                    let outcome = match d.ending {
                        Some(Ending::Settle(o)) => o,
                        _ => Outcome::Ack,
                    };
                    if settled.contains(&d.id) {
                        d.settled = true;
                        self.events.push_back(Event::Settled {
                            delivery: each,
                            outcome,
                        });
                    } else {
                        self.events.push_back(Event::SettleFailed {
                            delivery: each,
                            error: SettleError::LeaseLost,
                        });
                    }
                }
                for each in batch {
                    self.finish_delivery(each);
                }
                let d = self
                    .deliveries
                    .get_mut(&delivery)
                    .expect("delivery in flight");
                let conn = d.conn.take().expect("the settlement's connection");
                self.delivery_step(delivery, conn, Action::Release, DeliveryStage::Release);
                self.settle_done(sub, delivery);
            }
            DeliveryStage::ReleaseLease => {
                let d = self
                    .deliveries
                    .get_mut(&delivery)
                    .expect("delivery in flight");
                d.holds = false;
                if let Some(Ending::Settle(outcome)) = ending {
                    if matches!(reply, Reply::Affected(n) if n > 0) {
                        d.settled = true;
                        self.events.push_back(Event::Settled { delivery, outcome });
                    } else {
                        self.events.push_back(Event::SettleFailed {
                            delivery,
                            error: SettleError::LeaseLost,
                        });
                    }
                }
                let conn = d.conn.take().expect("the release's connection");
                self.delivery_step(delivery, conn, Action::Release, DeliveryStage::Release);
            }
            DeliveryStage::Commit => {
                let d = self
                    .deliveries
                    .get_mut(&delivery)
                    .expect("delivery in flight");
                d.holds = false;
                d.settled = true;
                if let Some(Ending::Settle(outcome)) = ending {
                    self.events.push_back(Event::Settled { delivery, outcome });
                }
                let conn = d
                    .conn
                    .take()
                    .expect("a row lock delivery holds its connection");
                self.delivery_step(delivery, conn, Action::Release, DeliveryStage::Release);
            }
            DeliveryStage::Rollback => {
                let d = self
                    .deliveries
                    .get_mut(&delivery)
                    .expect("delivery in flight");
                d.holds = false;
                let conn = d
                    .conn
                    .take()
                    .expect("a row lock delivery holds its connection");
                self.delivery_step(delivery, conn, Action::Release, DeliveryStage::Release);
            }
            DeliveryStage::Unlock => {
                let released = match reply {
                    Reply::Bool(b) => b,
                    Reply::Rows(rows) => rows
                        .first()
                        .and_then(|r| r.values.first())
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                    _ => false,
                };
                self.after_unlock(delivery, released);
            }
            DeliveryStage::Ping => self.pinged(delivery),
            DeliveryStage::Release | DeliveryStage::Close => {
                let d = self
                    .deliveries
                    .get_mut(&delivery)
                    .expect("delivery in flight");
                if d.ending.is_none() {
                    // An extension ended: back to work, or to the settlement asked for meanwhile.
                    d.state = DeliveryState::InWork;
                    if let Some(queued) = d.queued.take() {
                        self.end(delivery, queued);
                    }
                } else {
                    self.finish_delivery(delivery);
                }
            }
        }
    }

    fn on_delivery_failed(&mut self, delivery: DeliveryId, stage: DeliveryStage, error: DbError) {
        if matches!(stage, DeliveryStage::Ping) {
            // Its session no longer answers: the row is never handed, and ends as its
            // connection closes.
            self.pinging.remove(&delivery);
            let d = self
                .deliveries
                .get_mut(&delivery)
                .expect("delivery in flight");
            d.ending = Some(d.queued.take().unwrap_or(Ending::Drop));
        }
        let d = self
            .deliveries
            .get_mut(&delivery)
            .expect("delivery in flight");
        let sub = d.sub;
        if matches!(stage, DeliveryStage::Release | DeliveryStage::Close) {
            d.conn = None;
            if d.ending.is_none() {
                d.state = DeliveryState::InWork;
                if let Some(queued) = d.queued.take() {
                    self.end(delivery, queued);
                }
            } else {
                self.finish_delivery(delivery);
            }
            return;
        }
        if matches!(d.ending, Some(Ending::Settle(_)))
            && matches!(
                stage,
                DeliveryStage::Acquire
                    | DeliveryStage::Settle
                    | DeliveryStage::SettleBatch
                    | DeliveryStage::ReleaseLease
                    | DeliveryStage::Commit
            )
        {
            self.events.push_back(Event::SettleFailed {
                delivery,
                error: SettleError::Db(error.clone()),
            });
            let batch = std::mem::take(
                &mut self
                    .deliveries
                    .get_mut(&delivery)
                    .expect("delivery in flight")
                    .batch,
            );
            for each in batch {
                self.events.push_back(Event::SettleFailed {
                    delivery: each,
                    error: SettleError::Db(error.clone()),
                });
                if let Some(d) = self.deliveries.get_mut(&each) {
                    d.holds = false;
                }
                self.finish_delivery(each);
            }
            self.settle_done(sub, delivery);
        } else {
            self.events.push_back(Event::Error {
                sub,
                error: error.clone(),
            });
        }
        let d = self
            .deliveries
            .get_mut(&delivery)
            .expect("delivery in flight");
        if let Some(key) = d.key.clone()
            && d.holds
        {
            // The connection closes, and the key's lock with it.
            self.keys.remove(&key);
            if d.ending == Some(Ending::Shutdown) {
                self.counts.connections_closed += 1;
            }
        }
        d.holds = false;
        let conn = d.conn.take();
        match (stage, conn) {
            (DeliveryStage::Acquire, Some(conn)) => {
                self.conns.remove(&conn);
                self.after_failed_step(delivery);
            }
            (_, Some(conn)) => {
                self.delivery_step(delivery, conn, Action::Close, DeliveryStage::Close);
            }
            (_, None) => self.after_failed_step(delivery),
        }
    }

    fn after_failed_step(&mut self, delivery: DeliveryId) {
        let d = self
            .deliveries
            .get_mut(&delivery)
            .expect("delivery in flight");
        if d.ending.is_none() {
            d.state = DeliveryState::InWork;
            d.extend_at = Some(self.now.plus(Duration::from_secs(1)));
            if let Some(queued) = d.queued.take() {
                self.end(delivery, queued);
            }
        } else {
            self.finish_delivery(delivery);
        }
    }

    /// A dropped delivery's deadline passed: close its connection, whatever still runs on it.
    fn force_close(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.get_mut(&delivery) else {
            return;
        };
        d.deadline = None;
        let conn = d.conn.take();
        let key = d.key.clone();
        let holds = d.holds;
        d.holds = false;
        for step in self.pending.values_mut() {
            if matches!(step, Step::Delivery { delivery: d, .. } if *d == delivery) {
                *step = Step::Orphan;
            }
        }
        if let Some(key) = key
            && holds
        {
            self.keys.remove(&key);
        }
        if let Some(conn) = conn {
            self.send(conn, Action::Close, Step::Orphan);
        }
        self.finish_delivery(delivery);
    }

    fn finish_delivery(&mut self, delivery: DeliveryId) {
        let Some(d) = self.deliveries.remove(&delivery) else {
            return;
        };
        debug_assert!(d.conn.is_none(), "a delivery ended holding a connection");
        debug_assert!(
            d.batch.is_empty(),
            "a settlement ended with its batch unsettled"
        );
        self.settle_done(d.sub, delivery);
        let s = &mut self.subs[d.sub.0];
        s.in_work -= 1;
        if d.delivered {
            s.handed -= 1;
        }
        if d.handling {
            s.handling -= 1;
        }
        if !d.settled && matches!(d.ending, Some(Ending::Drop | Ending::Shutdown)) && d.delivered {
            let kept_lease = s.statements.form == Form::Lease && d.ending == Some(Ending::Shutdown);
            if !kept_lease {
                self.events.push_back(Event::Returned { delivery });
            }
        }
        if d.delivered || d.handling {
            self.hand_ahead(d.sub);
        }
    }

    /// The lease form: settles `delivery` and the settlements waiting behind it, up to
    /// [`SETTLE_BATCH`], in one statement on `conn`.
    fn settle_batch(&mut self, delivery: DeliveryId, conn: ConnId) {
        let now = self.now;
        let sub = self.deliveries[&delivery].sub;
        let s = &mut self.subs[sub.0];
        let more = s.settle_waiting.len().min(SETTLE_BATCH - 1);
        let batch: Vec<DeliveryId> = s.settle_waiting.drain(..more).collect();
        let rows = batch.len() + 1;
        let (dialect, desc) = (self.dialect, s.desc);
        let statement = s
            .settle_batches
            .entry(rows)
            .or_insert_with(|| {
                Statements::settle_leases(dialect, &desc, rows).expect("a batch settlement")
            })
            .clone();
        let mut ids = Vec::with_capacity(rows);
        let mut fences = Vec::with_capacity(rows);
        for each in std::iter::once(delivery).chain(batch.iter().copied()) {
            let d = &self.deliveries[&each];
            ids.push(d.id.clone());
            fences.push(d.fence.unwrap_or_default());
        }
        let binds = statement.binds(|arg| match arg {
            Arg::IdAt(i) => ids[i].clone(),
            Arg::FenceAt(i) => Value::Int(fences[i].micros()),
            _ => Value::Int(now.micros()),
        });
        self.deliveries
            .get_mut(&delivery)
            .expect("delivery in flight")
            .batch = batch;
        self.delivery_execute(
            delivery,
            conn,
            &statement,
            binds,
            DeliveryStage::SettleBatch,
        );
    }

    /// A settlement statement of `sub` that `delivery` ran has answered or will not run: the
    /// settlements waiting behind it start, together.
    fn settle_done(&mut self, sub: SubId, delivery: DeliveryId) {
        let s = &mut self.subs[sub.0];
        if s.settling != Some(delivery) {
            return;
        }
        s.settling = None;
        let Some(next) = s.settle_waiting.pop_front() else {
            return;
        };
        s.settling = Some(next);
        let conn = self.new_conn();
        if let Some(d) = self.deliveries.get_mut(&next) {
            d.conn = Some(conn);
        }
        self.delivery_step(next, conn, Action::Acquire, DeliveryStage::Acquire);
    }

    // ----- publishes -----

    fn on_publish(&mut self, publish: PublishId, stage: PublishStage, reply: Reply<R>) {
        let Some(flow) = self.publishes.get_mut(&publish) else {
            return;
        };
        let conn = flow.conn;
        if let Reply::Failed(error) = reply {
            if flow.result.is_none() {
                flow.result = Some(Err(error));
            }
            match stage {
                PublishStage::Acquire => {
                    self.conns.remove(&conn);
                    self.end_publish(publish);
                }
                PublishStage::Begin | PublishStage::Insert | PublishStage::Commit => {
                    // Closing the session ends a transaction left open: nothing is written.
                    self.publish_step(publish, Action::Close, PublishStage::Close);
                }
                PublishStage::Release | PublishStage::Close => self.end_publish(publish),
            }
            return;
        }
        match stage {
            PublishStage::Acquire if flow.in_tx => {
                let begin = self.publishers[flow.publisher.0].begin.clone();
                self.execute(
                    conn,
                    &begin,
                    Vec::new(),
                    Step::Publish {
                        publish,
                        stage: PublishStage::Begin,
                    },
                );
            }
            PublishStage::Acquire | PublishStage::Begin | PublishStage::Insert => {
                match flow.inserts.pop_front() {
                    Some((statement, binds)) => self.execute(
                        conn,
                        &statement,
                        binds,
                        Step::Publish {
                            publish,
                            stage: PublishStage::Insert,
                        },
                    ),
                    None if flow.in_tx => {
                        let commit = self.publishers[flow.publisher.0].commit.clone();
                        self.execute(
                            conn,
                            &commit,
                            Vec::new(),
                            Step::Publish {
                                publish,
                                stage: PublishStage::Commit,
                            },
                        );
                    }
                    None => {
                        flow.result = Some(Ok(()));
                        self.publish_step(publish, Action::Release, PublishStage::Release);
                    }
                }
            }
            PublishStage::Commit => {
                flow.result = Some(Ok(()));
                self.publish_step(publish, Action::Release, PublishStage::Release);
            }
            PublishStage::Release | PublishStage::Close => self.end_publish(publish),
        }
    }

    fn publish_step(&mut self, publish: PublishId, action: Action, stage: PublishStage) {
        let conn = self.publish_conn(publish);
        self.send(conn, action, Step::Publish { publish, stage });
    }

    fn publish_conn(&self, publish: PublishId) -> ConnId {
        self.publishes[&publish].conn
    }

    fn end_publish(&mut self, publish: PublishId) {
        if let Some(flow) = self.publishes.remove(&publish) {
            let result = flow.result.unwrap_or(Ok(()));
            if flow.quiet && result.is_ok() {
                let p = &mut self.publishers[flow.publisher.0];
                let due = p
                    .notified_at
                    .map_or(self.now, |t| t.plus(NOTIFY_EVERY))
                    .max(self.now);
                if p.notify_due.is_none_or(|t| t > due) {
                    p.notify_due = Some(due);
                }
                if self.state == State::ShuttingDown {
                    self.notify_owed(true);
                }
            }
            if !flow.internal {
                self.events.push_back(Event::Published { publish, result });
            }
        }
    }

    /// PostgreSQL: the notifications owed for quiet inserts, those due (or all of them, at
    /// the shutdown).
    fn notify_owed(&mut self, all: bool) {
        let now = self.now;
        for i in 0..self.publishers.len() {
            let p = &mut self.publishers[i];
            let due = p.notify_due.is_some_and(|t| all || t <= now);
            let Some(statement) = p.notify.clone().filter(|_| due) else {
                continue;
            };
            p.notify_due = None;
            p.notified_at = Some(now);
            let id = PublishId(self.next_publish);
            self.next_publish += 1;
            let conn = self.new_conn();
            self.publishes.insert(
                id,
                PublishFlow {
                    publisher: PublisherId(i),
                    conn,
                    inserts: VecDeque::from([(statement, Vec::new())]),
                    in_tx: false,
                    quiet: false,
                    internal: true,
                    result: None,
                },
            );
            self.send(
                conn,
                Action::Acquire,
                Step::Publish {
                    publish: id,
                    stage: PublishStage::Acquire,
                },
            );
        }
    }
}

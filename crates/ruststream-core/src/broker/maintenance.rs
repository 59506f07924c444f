//! The maintenance a broker runs by itself, on its own timers: retention and periodic jobs.
//!
//! **Retention** ([`Broker::retain`]) deletes a table's rows marked processed or failed once
//! their mark is older than an age, every [`Retention::every`]: on one connection it takes
//! the table's retention lock without waiting (PostgreSQL's two-key advisory lock, MySQL's
//! and MariaDB's `GET_LOCK`; on SQLite one broker runs it alone), deletes up to
//! [`Retention::batch`] rows per statement, each statement its own short transaction, until a
//! statement deletes fewer, releases the lock and gives the connection back. A process that
//! finds the lock taken leaves the run to the process that holds it.
//!
//! **Periodic jobs** ([`Broker::periodic`]) publish one row per tick of a schedule into a
//! table, across every process on the schedule: per tick one transaction moves the
//! schedule's `last_tick` in [`PERIODIC_TABLE`](crate::dialect::PERIODIC_TABLE) forward where
//! it is still behind, and only where it moved inserts the row. At its start a job reads
//! the schedule's last tick and publishes the ticks missed while no process ran, the latest
//! [`PeriodicJob::catch_up`] of them.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::dialect::{Arg, PeriodicStatements, RetentionStatements, Statement, Statements};
use crate::spec::{DescError, TableDesc};
use crate::types::{Action, ConnId, Event, Reply};
use crate::value::{DbError, ErrorKind, Time, Value};

use super::options::{BrokerError, Publish};
use super::publish::Inserts;
use super::timers::Timer;
use super::{Broker, State, Step};

/// How often a table's retention runs, unless set.
pub const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// The most rows one retention statement deletes, unless set.
pub const RETENTION_BATCH: usize = 1_000;

/// How many missed ticks a periodic job publishes at its start, the latest ones, unless set.
pub const PERIODIC_CATCH_UP: usize = 10;

/// How long a periodic job waits before it tries again after a statement failed.
pub const MAINTENANCE_RETRY: Duration = Duration::from_secs(1);

/// The retention of one table's marked rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Rows whose `processed_at` is older than this are deleted; `None` keeps them.
    pub processed: Option<Duration>,
    /// Rows whose `failed_at` is older than this are deleted; `None` keeps them.
    pub failed: Option<Duration>,
    /// How often the retention runs: its first run is at the start.
    pub every: Duration,
    /// The most rows one statement deletes.
    pub batch: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            processed: None,
            failed: None,
            every: RETENTION_EVERY,
            batch: RETENTION_BATCH,
        }
    }
}

/// A schedule and the row each of its ticks publishes. The runtime implements it over a
/// cron expression; the core only asks it for times and rows.
pub trait Ticks: fmt::Debug + Send {
    /// The first tick strictly after `t`, or `None` when the schedule has no more.
    fn after(&self, t: Time) -> Option<Time>;
    /// The last tick strictly before `t`, or `None` when there is none.
    fn before(&self, t: Time) -> Option<Time>;
    /// The row `tick` publishes, or why there is none: the tick is then reported and passed
    /// over.
    fn row(&self, tick: Time) -> Result<Publish, String>;
}

/// A periodic job: a named schedule that publishes one row per tick into a table.
#[derive(Debug)]
pub struct PeriodicJob {
    /// The schedule's name: its row in the state table, shared by every process that runs
    /// the same job.
    pub name: Arc<str>,
    /// The table the rows go into.
    pub table: TableDesc,
    /// The schedule and its rows.
    pub ticks: Box<dyn Ticks>,
    /// At the start: how many ticks missed while no process ran are published, the latest
    /// ones (0 publishes none). The same, but at least 1, bounds the ticks one late wake-up
    /// publishes.
    pub catch_up: usize,
    /// Whether the job creates the state table where it is missing.
    pub create_table: bool,
}

/// What the maintenance did ([`Event::Maintained`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Maintained {
    /// A table's retention ran.
    Retention {
        /// The table.
        table: &'static str,
        /// Another process held the table's retention lock: it runs the retention, and this
        /// run deleted nothing.
        held_elsewhere: bool,
        /// The rows marked processed it deleted.
        processed: u64,
        /// The rows marked failed it deleted.
        failed: u64,
    },
    /// A tick of a periodic job was published, by this process or by another.
    Tick {
        /// The schedule's name.
        schedule: Arc<str>,
        /// The tick.
        tick: Time,
        /// Whether this process published it; `false`: another process did first.
        published: bool,
    },
    /// A run failed; it runs again later (a periodic job after [`MAINTENANCE_RETRY`], a
    /// retention at its next run).
    Failed {
        /// What failed: the retention of a table or a schedule, named.
        task: Arc<str>,
        /// Why.
        error: DbError,
    },
}

/// A runner of the maintenance, as its timer and its replies name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Task {
    Retain(usize),
    Periodic(usize),
}

/// Where a run of the maintenance is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MaintenanceStage {
    Acquire,
    TryLock,
    DeleteProcessed,
    DeleteFailed,
    Unlock,
    CreateTable,
    InsertState,
    ReadState,
    Begin,
    Advance,
    Insert,
    Commit,
    Release,
    Close,
}

/// The runners of one broker.
#[derive(Debug, Default)]
pub(super) struct Maintenance {
    retainers: Vec<Retainer>,
    periodic: Vec<Periodic>,
}

/// A run's connection, what it deleted and what failed.
#[derive(Debug, Default)]
struct Run {
    conn: Option<ConnId>,
    processed: u64,
    failed: u64,
    held_elsewhere: bool,
    error: Option<DbError>,
}

#[derive(Debug)]
struct Retainer {
    desc: TableDesc,
    retention: Retention,
    statements: RetentionStatements,
    /// When the next run starts; `None` while one runs.
    next_at: Option<Time>,
    run: Run,
}

/// A statement of a tick's row, with its binds.
type Insert = (Statement, Vec<Value>);

#[derive(Debug)]
struct Periodic {
    job: PeriodicJob,
    statements: PeriodicStatements,
    inserts: Inserts,
    /// The last tick published (by any process) that this job knows of; `None` until it has
    /// read the state table.
    cursor: Option<Time>,
    /// The database's clock less this process's, as the last read of the state table saw
    /// it: the database's time decides which ticks are due; this process's clock only when
    /// to look again.
    offset: i64,
    /// When the next run starts; `None` while one runs, or when the schedule has ended.
    next_at: Option<Time>,
    run: Run,
    /// The ticks this run publishes, earliest first.
    ticks: VecDeque<Time>,
    /// The tick in its transaction, and the inserts of its row still to run.
    tick: Option<(Time, VecDeque<Insert>)>,
}

impl Periodic {
    /// The ticks after `cursor` up to `now`, the latest `limit` of them, earliest first.
    fn due(&self, cursor: Time, now: Time, limit: usize) -> VecDeque<Time> {
        let mut out = VecDeque::new();
        let mut t = Time(now.0.saturating_add(1));
        while out.len() < limit {
            match self.job.ticks.before(t) {
                Some(tick) if tick > cursor && tick < t => {
                    out.push_front(tick);
                    t = tick;
                }
                _ => break,
            }
        }
        out
    }

    /// When, by this process's clock, the first tick after `cursor` that is still to come
    /// at the database's time `db_now` is due; `None` when the schedule has ended.
    fn next_look(&self, cursor: Time, db_now: Time) -> Option<Time> {
        let tick = self.job.ticks.after(cursor.max(db_now))?;
        Some(Time(tick.0.saturating_sub(self.offset)))
    }

    fn task_name(&self) -> Arc<str> {
        format!(
            "schedule `{}` into table `{}`",
            self.job.name, self.job.table.table
        )
        .into()
    }
}

impl<R> Broker<R> {
    /// Deletes `desc`'s rows marked processed or failed once older than `retention` says,
    /// every [`Retention::every`], by one process at a time across the database; a second
    /// retention of the same table is ignored.
    pub fn retain(
        &mut self,
        desc: TableDesc,
        retention: Retention,
        now: Time,
    ) -> Result<(), BrokerError> {
        // Refused for an age of a mark the table does not have, naming the column, and once the
        // broker shuts down.
        self.now = now;
        if self.state != State::Running {
            return Err(BrokerError::Closed);
        }
        desc.validate()?;
        let needs = [
            (
                retention.processed.is_some() && desc.processed_at.is_none(),
                "retain_processed",
                "processed_at",
                ".processed(..)` (`#[field(processed_at)]`)",
            ),
            (
                retention.failed.is_some() && desc.failed_at.is_none(),
                "retain_failed",
                "failed_at",
                ".failed(..)` (`#[field(failed_at)]`)",
            ),
        ];
        if let Some((_, setting, role, method)) = needs.into_iter().find(|n| n.0) {
            return Err(DescError::NeedsColumn {
                table: desc.table,
                setting,
                role,
                method,
            }
            .into());
        }
        let known = self
            .maintenance
            .retainers
            .iter()
            .any(|r| r.desc.table == desc.table);
        if known || (retention.processed.is_none() && retention.failed.is_none()) {
            return Ok(());
        }
        let statements = Statements::retention(self.dialect, &desc, retention.batch);
        self.maintenance.retainers.push(Retainer {
            desc,
            retention,
            statements,
            next_at: Some(now),
            run: Run::default(),
        });
        self.drive();
        Ok(())
    }

    /// Publishes one job per tick of `job`'s schedule into its table, once per tick across
    /// every process that runs a job of that name; at the start, the latest
    /// [`PeriodicJob::catch_up`] ticks missed ([Periodic jobs](https://github.com/ruststream/ruststream/blob/main/docs/src/operating.md#retention-and-periodic-jobs)).
    pub fn periodic(&mut self, job: PeriodicJob, now: Time) -> Result<(), BrokerError> {
        // Refused for a table whose description breaks a rule, and once the broker shuts down.
        self.now = now;
        if self.state != State::Running {
            return Err(BrokerError::Closed);
        }
        job.table.validate()?;
        self.maintenance.periodic.push(Periodic {
            statements: Statements::periodic(self.dialect),
            inserts: Inserts::new(self.dialect, job.table),
            job,
            cursor: None,
            offset: 0,
            next_at: Some(now),
            run: Run::default(),
            ticks: VecDeque::new(),
            tick: None,
        });
        self.drive();
        Ok(())
    }

    /// Starts the runs that are due.
    pub(super) fn start_maintenance_due(&mut self) {
        let now = self.now;
        for i in 0..self.maintenance.retainers.len() {
            let r = &mut self.maintenance.retainers[i];
            if r.next_at.is_some_and(|t| t <= now) {
                r.next_at = None;
                r.run = Run::default();
                self.maintenance_acquire(Task::Retain(i));
            }
        }
        for i in 0..self.maintenance.periodic.len() {
            let p = &mut self.maintenance.periodic[i];
            if p.next_at.is_none_or(|t| t > now) {
                continue;
            }
            p.next_at = None;
            p.run = Run::default();
            if let Some(cursor) = p.cursor {
                // A wake-up publishes its own tick, whatever the catch-up at the start.
                let db_now = Time(now.0.saturating_add(p.offset));
                if p.due(cursor, db_now, 1).is_empty() {
                    p.next_at = p.next_look(cursor, db_now);
                    continue;
                }
            }
            self.maintenance_acquire(Task::Periodic(i));
        }
    }

    /// Arms the timers of the runs that wait.
    pub(super) fn rearm_maintenance(&mut self) {
        let running = self.state == State::Running;
        for (i, r) in self.maintenance.retainers.iter().enumerate() {
            let at = r.next_at.filter(|_| running);
            self.timers.set(Timer::Maintenance(Task::Retain(i)), at);
        }
        for (i, p) in self.maintenance.periodic.iter().enumerate() {
            let at = p.next_at.filter(|_| running);
            self.timers.set(Timer::Maintenance(Task::Periodic(i)), at);
        }
    }

    fn run_of(&mut self, task: Task) -> &mut Run {
        match task {
            Task::Retain(i) => &mut self.maintenance.retainers[i].run,
            Task::Periodic(i) => &mut self.maintenance.periodic[i].run,
        }
    }

    fn maintenance_acquire(&mut self, task: Task) {
        let conn = self.new_conn();
        self.run_of(task).conn = Some(conn);
        self.maintenance_send(task, Action::Acquire, MaintenanceStage::Acquire);
    }

    fn maintenance_send(&mut self, task: Task, action: Action, stage: MaintenanceStage) {
        let Some(conn) = self.run_of(task).conn else {
            return;
        };
        self.send(conn, action, Step::Maintenance { task, stage });
    }

    fn maintenance_execute(
        &mut self,
        task: Task,
        statement: Statement,
        binds: Vec<Value>,
        stage: MaintenanceStage,
    ) {
        self.maintenance_send(task, Action::Execute { statement, binds }, stage);
    }

    /// SQLite: keeps the other connections' statements back while a tick's transaction on
    /// `conn` holds the writer lock (`Some`), or lets them out (`None`).
    fn reserve_writer(&mut self, conn: Option<ConnId>) {
        let physical = conn.map(|c| self.conns.physical(c));
        let released = self.gate.reserve(physical);
        self.commands.extend(released);
    }

    /// The reply to a run's command.
    pub(super) fn on_maintenance(&mut self, task: Task, stage: MaintenanceStage, reply: Reply<R>) {
        if matches!(task, Task::Periodic(_))
            && (stage == MaintenanceStage::Commit || matches!(reply, Reply::Failed(_)))
        {
            self.reserve_writer(None);
        }
        if let Reply::Failed(error) = reply {
            let run = self.run_of(task);
            if run.error.is_none() {
                run.error = Some(error);
            }
            match stage {
                MaintenanceStage::Acquire => {
                    if let Some(conn) = run.conn.take() {
                        self.conns.forget(conn);
                    }
                    self.maintenance_done(task);
                }
                MaintenanceStage::Release | MaintenanceStage::Close => self.maintenance_done(task),
                // Closing the session ends its lock and its open transaction.
                _ => self.maintenance_send(task, Action::Close, MaintenanceStage::Close),
            }
            return;
        }
        match stage {
            MaintenanceStage::Release | MaintenanceStage::Close => {
                self.run_of(task).conn = None;
                self.maintenance_done(task);
            }
            _ => match task {
                Task::Retain(i) => self.retain_step(i, stage, reply),
                Task::Periodic(i) => self.periodic_step(i, stage, reply),
            },
        }
    }

    fn retain_step(&mut self, i: usize, stage: MaintenanceStage, reply: Reply<R>) {
        let task = Task::Retain(i);
        let r = &mut self.maintenance.retainers[i];
        let next = match stage {
            MaintenanceStage::Acquire => match r.statements.try_lock.clone() {
                Some(lock) => {
                    return self.maintenance_execute(
                        task,
                        lock,
                        Vec::new(),
                        MaintenanceStage::TryLock,
                    );
                }
                None => Some(MaintenanceStage::DeleteProcessed),
            },
            MaintenanceStage::TryLock => {
                if answered_true(&reply) {
                    Some(MaintenanceStage::DeleteProcessed)
                } else {
                    r.run.held_elsewhere = true;
                    return self.maintenance_send(task, Action::Release, MaintenanceStage::Release);
                }
            }
            MaintenanceStage::DeleteProcessed | MaintenanceStage::DeleteFailed => {
                let n = match reply {
                    Reply::Affected(n) => n,
                    _ => 0,
                };
                if stage == MaintenanceStage::DeleteProcessed {
                    r.run.processed += n;
                } else {
                    r.run.failed += n;
                }
                let full = usize::try_from(n).unwrap_or(usize::MAX) >= r.retention.batch.max(1);
                if full && self.state == State::Running {
                    Some(stage)
                } else if stage == MaintenanceStage::DeleteProcessed {
                    Some(MaintenanceStage::DeleteFailed)
                } else {
                    None
                }
            }
            MaintenanceStage::Unlock => {
                let action = if answered_true(&reply) {
                    (Action::Release, MaintenanceStage::Release)
                } else {
                    (Action::Close, MaintenanceStage::Close)
                };
                return self.maintenance_send(task, action.0, action.1);
            }
            _ => None,
        };
        self.retain_next(i, next);
    }

    /// Runs the delete of `stage` where the retention has it (or the next one), else ends the
    /// run: unlock and give the connection back.
    fn retain_next(&mut self, i: usize, mut stage: Option<MaintenanceStage>) {
        let task = Task::Retain(i);
        let running = self.state == State::Running;
        let r = &self.maintenance.retainers[i];
        while let Some(s) = stage {
            let (age, statement) = match s {
                MaintenanceStage::DeleteProcessed => {
                    (r.retention.processed, &r.statements.delete_processed)
                }
                _ => (r.retention.failed, &r.statements.delete_failed),
            };
            if let (Some(age), Some(statement), true) = (age, statement, running) {
                // Old enough by the database's clock.
                let age = i64::try_from(age.as_micros()).unwrap_or(i64::MAX);
                let statement = statement.clone();
                let binds = statement.binds(|_| Value::Int(age));
                return self.maintenance_execute(task, statement, binds, s);
            }
            stage =
                (s == MaintenanceStage::DeleteProcessed).then_some(MaintenanceStage::DeleteFailed);
        }
        match r.statements.unlock.clone() {
            Some(unlock) => {
                self.maintenance_execute(task, unlock, Vec::new(), MaintenanceStage::Unlock)
            }
            None => self.maintenance_send(task, Action::Release, MaintenanceStage::Release),
        }
    }

    /// The schedule's last tick and the database's time, read from the state table: the
    /// ticks due from it on by the database's clock, or a failed run where its row has none.
    fn periodic_read_state(&mut self, i: usize, reply: &Reply<R>) {
        let task = Task::Periodic(i);
        let now = self.now;
        let p = &mut self.maintenance.periodic[i];
        let (last, read_at) = match reply {
            Reply::Rows(rows) => rows.first().map_or((None, None), |row| {
                let int = |i: usize| match row.values.get(i) {
                    Some(Value::Int(micros)) => Some(Time(*micros)),
                    _ => None,
                };
                (int(0), int(1))
            }),
            _ => (None, None),
        };
        if let Some(read_at) = read_at {
            p.offset = read_at.micros().saturating_sub(now.micros());
        }
        let Some(last) = last else {
            p.run.error = Some(DbError::new(
                ErrorKind::Other,
                format!(
                    "the state table's row of schedule `{}` has no last tick",
                    p.job.name
                ),
            ));
            return self.maintenance_send(task, Action::Release, MaintenanceStage::Release);
        };
        // The first run publishes the ticks missed while no process ran, as many as its
        // catch-up says; a later one at least its own.
        let limit = match p.cursor {
            None => p.job.catch_up,
            Some(_) => p.job.catch_up.max(1),
        };
        let db_now = Time(now.0.saturating_add(p.offset));
        p.cursor = Some(p.cursor.map_or(last, |c| c.max(last)));
        p.ticks = p.due(last, db_now, limit);
        self.periodic_next_tick(i);
    }

    fn periodic_step(&mut self, i: usize, stage: MaintenanceStage, reply: Reply<R>) {
        let task = Task::Periodic(i);
        let now = self.now;
        let p = &mut self.maintenance.periodic[i];
        match stage {
            MaintenanceStage::Acquire if p.cursor.is_none() && p.job.create_table => {
                let create = p.statements.create_table.clone();
                self.maintenance_execute(task, create, Vec::new(), MaintenanceStage::CreateTable);
            }
            MaintenanceStage::Acquire | MaintenanceStage::CreateTable if p.cursor.is_none() => {
                let insert = p.statements.insert_state.clone();
                let binds = schedule_binds(&insert, &p.job.name, now);
                self.maintenance_execute(task, insert, binds, MaintenanceStage::InsertState);
            }
            // Every run reads the last tick and the database's time again.
            MaintenanceStage::InsertState
            | MaintenanceStage::Acquire
            | MaintenanceStage::CreateTable => {
                let read = p.statements.read_state.clone();
                let binds = schedule_binds(&read, &p.job.name, now);
                self.maintenance_execute(task, read, binds, MaintenanceStage::ReadState);
            }
            MaintenanceStage::ReadState => self.periodic_read_state(i, &reply),
            MaintenanceStage::Begin => {
                let Some((tick, _)) = &p.tick else {
                    return;
                };
                let advance = p.statements.advance.clone();
                let binds = schedule_binds(&advance, &p.job.name, *tick);
                self.maintenance_execute(task, advance, binds, MaintenanceStage::Advance);
            }
            MaintenanceStage::Advance | MaintenanceStage::Insert => {
                let Some((_, inserts)) = &mut p.tick else {
                    return;
                };
                if stage == MaintenanceStage::Advance {
                    let moved = matches!(reply, Reply::Affected(n) if n > 0);
                    if moved {
                        p.run.processed = 1;
                    } else {
                        inserts.clear();
                    }
                }
                match inserts.pop_front() {
                    Some((statement, binds)) => {
                        self.maintenance_execute(task, statement, binds, MaintenanceStage::Insert)
                    }
                    None => {
                        let commit = p.statements.commit.clone();
                        self.maintenance_execute(
                            task,
                            commit,
                            Vec::new(),
                            MaintenanceStage::Commit,
                        );
                    }
                }
            }
            MaintenanceStage::Commit => {
                if let Some((tick, _)) = p.tick.take() {
                    p.cursor = Some(p.cursor.map_or(tick, |c| c.max(tick)));
                    let published = std::mem::take(&mut p.run.processed) > 0;
                    let schedule = p.job.name.clone();
                    self.events.push_back(Event::Maintained(Maintained::Tick {
                        schedule,
                        tick,
                        published,
                    }));
                }
                self.periodic_next_tick(i);
            }
            _ => {}
        }
    }

    /// Opens the next tick's transaction, or ends the run.
    fn periodic_next_tick(&mut self, i: usize) {
        let task = Task::Periodic(i);
        loop {
            let p = &mut self.maintenance.periodic[i];
            let tick = match p.ticks.pop_front() {
                Some(tick) if self.state == State::Running => tick,
                _ => {
                    return self.maintenance_send(task, Action::Release, MaintenanceStage::Release);
                }
            };
            let inserts = p
                .job
                .ticks
                .row(tick)
                .map_err(|why| why.to_string())
                .and_then(|row| p.inserts.statements(&[row]).map_err(|e| e.to_string()));
            match inserts {
                Ok(inserts) => {
                    p.tick = Some((tick, inserts.into()));
                    let begin = p.statements.begin.clone();
                    let conn = p.run.conn;
                    self.reserve_writer(conn);
                    return self.maintenance_execute(
                        task,
                        begin,
                        Vec::new(),
                        MaintenanceStage::Begin,
                    );
                }
                Err(why) => {
                    // A tick without a row is passed over: every process would fail alike.
                    p.cursor = Some(p.cursor.map_or(tick, |c| c.max(tick)));
                    let error = DbError::new(
                        ErrorKind::Other,
                        format!("the row of tick {} has no message: {why}", tick.micros()),
                    );
                    let task_name = p.task_name();
                    self.events.push_back(Event::Maintained(Maintained::Failed {
                        task: task_name,
                        error,
                    }));
                }
            }
        }
    }

    /// A run ended, its connection given back: reports it and sets the next.
    fn maintenance_done(&mut self, task: Task) {
        let now = self.now;
        match task {
            Task::Retain(i) => {
                let r = &mut self.maintenance.retainers[i];
                let run = std::mem::take(&mut r.run);
                r.next_at = Some(now.plus(r.retention.every));
                let event = match run.error {
                    Some(error) => Maintained::Failed {
                        task: format!("retention of table `{}`", r.desc.table).into(),
                        error,
                    },
                    None => Maintained::Retention {
                        table: r.desc.table,
                        held_elsewhere: run.held_elsewhere,
                        processed: run.processed,
                        failed: run.failed,
                    },
                };
                self.events.push_back(Event::Maintained(event));
            }
            Task::Periodic(i) => {
                let p = &mut self.maintenance.periodic[i];
                let run = std::mem::take(&mut p.run);
                p.ticks.clear();
                p.tick = None;
                match run.error {
                    Some(error) => {
                        p.next_at = Some(now.plus(MAINTENANCE_RETRY));
                        let task = p.task_name();
                        self.events
                            .push_back(Event::Maintained(Maintained::Failed { task, error }));
                    }
                    None => {
                        let db_now = Time(now.0.saturating_add(p.offset));
                        p.next_at = p.next_look(p.cursor.unwrap_or(db_now), db_now);
                    }
                }
            }
        }
    }
}

/// Whether a lock's reply is a row whose first value is true.
fn answered_true<R>(reply: &Reply<R>) -> bool {
    match reply {
        Reply::Rows(rows) => rows
            .first()
            .and_then(|row| row.values.first())
            .is_some_and(|v| *v == Value::Bool(true)),
        Reply::Bool(b) => *b,
        _ => false,
    }
}

/// The binds of a statement of the state table: the schedule's name and a tick.
fn schedule_binds(statement: &Statement, name: &str, tick: Time) -> Vec<Value> {
    statement.binds(|arg| match arg {
        Arg::Schedule => Value::Text(name.to_owned()),
        _ => Value::Int(tick.micros()),
    })
}

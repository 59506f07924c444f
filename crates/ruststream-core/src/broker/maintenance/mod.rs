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

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::dialect::{Arg, Statement, Statements};
use crate::spec::{DescError, TableDesc};
use crate::types::{Action, ConnId, Event, Reply};
use crate::value::{DbError, Time, Value};

use super::options::{BrokerError, Publish};
use super::timers::Timer;
use super::{Broker, State, Step};

mod periodic;
mod retain;

use periodic::Periodic;
use retain::Retainer;

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

/// What a run decided, for the broker to carry out in order: the runners own their state and
/// their transitions, and reach nothing of the broker's.
#[derive(Debug)]
enum Do {
    /// Runs a statement with its binds on the run's connection; the reply comes back at the
    /// stage.
    Execute(Statement, Vec<Value>, MaintenanceStage),
    /// Gives the run's connection back.
    Release,
    /// Closes the run's session, which ends its lock and its open transaction.
    Close,
    /// SQLite: keeps the other connections' statements back while the run's tick holds the
    /// writer lock.
    ReserveWriter,
    /// Reports to the service.
    Report(Maintained),
}

impl Do {
    /// Runs `statement` without binds, its reply at `stage`.
    fn run(statement: Statement, stage: MaintenanceStage) -> Self {
        Self::Execute(statement, Vec::new(), stage)
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
        self.maintenance
            .retainers
            .push(Retainer::new(desc, retention, statements, now));
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
        self.maintenance
            .periodic
            .push(Periodic::new(job, self.dialect, now));
        self.drive();
        Ok(())
    }

    /// Starts the runs that are due.
    pub(super) fn start_maintenance_due(&mut self) {
        let now = self.now;
        for i in 0..self.maintenance.retainers.len() {
            if self.maintenance.retainers[i].start(now) {
                self.maintenance_acquire(Task::Retain(i));
            }
        }
        for i in 0..self.maintenance.periodic.len() {
            if self.maintenance.periodic[i].start(now) {
                self.maintenance_acquire(Task::Periodic(i));
            }
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
                _ => self.carry_out(task, vec![Do::Close]),
            }
            return;
        }
        if matches!(stage, MaintenanceStage::Release | MaintenanceStage::Close) {
            self.run_of(task).conn = None;
            return self.maintenance_done(task);
        }
        let (now, running) = (self.now, self.state == State::Running);
        let decided = match task {
            Task::Retain(i) => vec![self.maintenance.retainers[i].step(stage, &reply, running)],
            Task::Periodic(i) => self.maintenance.periodic[i].step(stage, &reply, now, running),
        };
        self.carry_out(task, decided);
    }

    /// Carries out what a run decided, in order.
    fn carry_out(&mut self, task: Task, decided: Vec<Do>) {
        for step in decided {
            match step {
                Do::Execute(statement, binds, stage) => {
                    self.maintenance_send(task, Action::Execute { statement, binds }, stage);
                }
                Do::Release => {
                    self.maintenance_send(task, Action::Release, MaintenanceStage::Release);
                }
                Do::Close => self.maintenance_send(task, Action::Close, MaintenanceStage::Close),
                Do::ReserveWriter => {
                    let conn = self.run_of(task).conn;
                    self.reserve_writer(conn);
                }
                Do::Report(maintained) => self.events.push_back(Event::Maintained(maintained)),
            }
        }
    }

    /// A run ended, its connection given back: reports it and sets the next.
    fn maintenance_done(&mut self, task: Task) {
        let now = self.now;
        let report = match task {
            Task::Retain(i) => Some(self.maintenance.retainers[i].done(now)),
            Task::Periodic(i) => self.maintenance.periodic[i].done(now),
        };
        if let Some(maintained) = report {
            self.events.push_back(Event::Maintained(maintained));
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

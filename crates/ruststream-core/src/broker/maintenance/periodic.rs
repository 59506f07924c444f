//! A periodic job's runner: per run, the schedule's last tick and the database's time read
//! from the state table, then per due tick one transaction that moves the last tick forward
//! and, only where it moved, inserts the tick's row.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::dialect::{Dialect, PeriodicStatements, Statement, Statements};
use crate::types::Reply;
use crate::value::{DbError, ErrorKind, Time, Value};

use super::{
    Do, MAINTENANCE_RETRY, Maintained, MaintenanceStage, PeriodicJob, Run, schedule_binds,
};
use crate::broker::publish::Inserts;

/// A statement of a tick's row, with its binds.
type Insert = (Statement, Vec<Value>);

/// A periodic job, and its run.
#[derive(Debug)]
pub(super) struct Periodic {
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
    pub(super) next_at: Option<Time>,
    pub(super) run: Run,
    /// The ticks this run publishes, earliest first.
    ticks: VecDeque<Time>,
    /// The tick in its transaction, and the inserts of its row still to run.
    tick: Option<(Time, VecDeque<Insert>)>,
}

impl Periodic {
    /// The job on `dialect`, its first run at `now`.
    pub(super) fn new(job: PeriodicJob, dialect: Dialect, now: Time) -> Self {
        Self {
            statements: Statements::periodic(dialect),
            inserts: Inserts::new(dialect, job.table),
            job,
            cursor: None,
            offset: 0,
            next_at: Some(now),
            run: Run::default(),
            ticks: VecDeque::new(),
            tick: None,
        }
    }

    /// Whether a run starts at `now`: it is due, none runs, and (after the first run) a
    /// tick is due by the database's clock; otherwise the next look is set.
    pub(super) fn start(&mut self, now: Time) -> bool {
        if self.next_at.is_none_or(|t| t > now) {
            return false;
        }
        self.next_at = None;
        self.run = Run::default();
        if let Some(cursor) = self.cursor {
            // A wake-up publishes its own tick, whatever the catch-up at the start.
            let db_now = self.db_time(now);
            if self.due(cursor, db_now, 1).is_empty() {
                self.next_at = self.next_look(cursor, db_now);
                return false;
            }
        }
        true
    }

    /// The database's time when this process's clock reads `now`.
    fn db_time(&self, now: Time) -> Time {
        Time(now.0.saturating_add(self.offset))
    }

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

    /// Moves the cursor to `tick` where it is behind.
    fn passed(&mut self, tick: Time) {
        self.cursor = Some(self.cursor.map_or(tick, |c| c.max(tick)));
    }

    /// What the run does after the reply to `stage`, in order; `running`: the broker has not
    /// begun to shut down.
    pub(super) fn step<R>(
        &mut self,
        stage: MaintenanceStage,
        reply: &Reply<R>,
        now: Time,
        running: bool,
    ) -> Vec<Do> {
        let name = &self.job.name;
        match stage {
            MaintenanceStage::Acquire if self.cursor.is_none() && self.job.create_table => {
                vec![Do::run(
                    self.statements.create_table.clone(),
                    MaintenanceStage::CreateTable,
                )]
            }
            MaintenanceStage::Acquire | MaintenanceStage::CreateTable if self.cursor.is_none() => {
                let insert = self.statements.insert_state.clone();
                let binds = schedule_binds(&insert, name, now);
                vec![Do::Execute(insert, binds, MaintenanceStage::InsertState)]
            }
            // Every run reads the last tick and the database's time again.
            MaintenanceStage::InsertState
            | MaintenanceStage::Acquire
            | MaintenanceStage::CreateTable => {
                let read = self.statements.read_state.clone();
                let binds = schedule_binds(&read, name, now);
                vec![Do::Execute(read, binds, MaintenanceStage::ReadState)]
            }
            MaintenanceStage::ReadState => self.read_state(reply, now, running),
            MaintenanceStage::Begin => {
                let Some((tick, _)) = &self.tick else {
                    return Vec::new();
                };
                let advance = self.statements.advance.clone();
                let binds = schedule_binds(&advance, name, *tick);
                vec![Do::Execute(advance, binds, MaintenanceStage::Advance)]
            }
            MaintenanceStage::Advance | MaintenanceStage::Insert => self.insert(stage, reply),
            MaintenanceStage::Commit => {
                let mut decided = Vec::new();
                if let Some((tick, _)) = self.tick.take() {
                    self.passed(tick);
                    let published = std::mem::take(&mut self.run.processed) > 0;
                    decided.push(Do::Report(Maintained::Tick {
                        schedule: self.job.name.clone(),
                        tick,
                        published,
                    }));
                }
                self.next_tick(running, &mut decided);
                decided
            }
            _ => Vec::new(),
        }
    }

    /// After the tick's advance (where it moved the last tick) or an insert of its row: the
    /// next insert, or the commit.
    fn insert<R>(&mut self, stage: MaintenanceStage, reply: &Reply<R>) -> Vec<Do> {
        let Some((_, inserts)) = &mut self.tick else {
            return Vec::new();
        };
        if stage == MaintenanceStage::Advance {
            if matches!(reply, Reply::Affected(n) if *n > 0) {
                self.run.processed = 1;
            } else {
                // Another process published the tick first.
                inserts.clear();
            }
        }
        match inserts.pop_front() {
            Some((statement, binds)) => {
                vec![Do::Execute(statement, binds, MaintenanceStage::Insert)]
            }
            None => vec![Do::run(
                self.statements.commit.clone(),
                MaintenanceStage::Commit,
            )],
        }
    }

    /// The schedule's last tick and the database's time, read from the state table: the
    /// ticks due from it on by the database's clock, or a failed run where its row has none.
    fn read_state<R>(&mut self, reply: &Reply<R>, now: Time, running: bool) -> Vec<Do> {
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
            self.offset = read_at.micros().saturating_sub(now.micros());
        }
        let Some(last) = last else {
            self.run.error = Some(DbError::new(
                ErrorKind::Other,
                format!(
                    "the state table's row of schedule `{}` has no last tick",
                    self.job.name
                ),
            ));
            return vec![Do::Release];
        };
        // The first run publishes the ticks missed while no process ran, as many as its
        // catch-up says; a later one at least its own.
        let limit = match self.cursor {
            None => self.job.catch_up,
            Some(_) => self.job.catch_up.max(1),
        };
        let db_now = self.db_time(now);
        self.passed(last);
        self.ticks = self.due(last, db_now, limit);
        let mut decided = Vec::new();
        self.next_tick(running, &mut decided);
        decided
    }

    /// Opens the next tick's transaction, or ends the run; a tick without a row is reported
    /// and passed over (every process would fail alike).
    fn next_tick(&mut self, running: bool, decided: &mut Vec<Do>) {
        loop {
            let tick = match self.ticks.pop_front() {
                Some(tick) if running => tick,
                _ => return decided.push(Do::Release),
            };
            let inserts = self
                .job
                .ticks
                .row(tick)
                .and_then(|row| self.inserts.statements(&[row]).map_err(|e| e.to_string()));
            match inserts {
                Ok(inserts) => {
                    self.tick = Some((tick, inserts.into()));
                    decided.push(Do::ReserveWriter);
                    decided.push(Do::run(
                        self.statements.begin.clone(),
                        MaintenanceStage::Begin,
                    ));
                    return;
                }
                Err(why) => {
                    self.passed(tick);
                    let error = DbError::new(
                        ErrorKind::Other,
                        format!("the row of tick {} has no message: {why}", tick.micros()),
                    );
                    decided.push(Do::Report(Maintained::Failed {
                        task: self.task_name(),
                        error,
                    }));
                }
            }
        }
    }

    /// The run ended, its connection given back: the next run set, and a failure reported.
    pub(super) fn done(&mut self, now: Time) -> Option<Maintained> {
        let run = std::mem::take(&mut self.run);
        self.ticks.clear();
        self.tick = None;
        match run.error {
            Some(error) => {
                self.next_at = Some(now.plus(MAINTENANCE_RETRY));
                Some(Maintained::Failed {
                    task: self.task_name(),
                    error,
                })
            }
            None => {
                let db_now = self.db_time(now);
                self.next_at = self.next_look(self.cursor.unwrap_or(db_now), db_now);
                None
            }
        }
    }
}

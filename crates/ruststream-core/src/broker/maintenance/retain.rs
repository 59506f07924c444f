//! Retention's runner: on one connection, the table's retention lock taken without waiting,
//! the deletes of marked rows in batches, the lock released.

use crate::dialect::RetentionStatements;
use crate::spec::TableDesc;
use crate::types::Reply;
use crate::value::{Time, Value};

use super::{Do, Maintained, MaintenanceStage, Retention, Run, answered_true};

/// The retention of one table, and its run.
#[derive(Debug)]
pub(super) struct Retainer {
    pub(super) desc: TableDesc,
    retention: Retention,
    statements: RetentionStatements,
    /// When the next run starts; `None` while one runs.
    pub(super) next_at: Option<Time>,
    pub(super) run: Run,
}

impl Retainer {
    /// The retention of `desc`, its first run at `now`.
    pub(super) fn new(
        desc: TableDesc,
        retention: Retention,
        statements: RetentionStatements,
        now: Time,
    ) -> Self {
        Self {
            desc,
            retention,
            statements,
            next_at: Some(now),
            run: Run::default(),
        }
    }

    /// Whether a run starts at `now`: it is due, and none runs.
    pub(super) fn start(&mut self, now: Time) -> bool {
        if self.next_at.is_none_or(|t| t > now) {
            return false;
        }
        self.next_at = None;
        self.run = Run::default();
        true
    }

    /// The next step of the run after the reply to `stage`; `running`: the broker has not
    /// begun to shut down.
    pub(super) fn step<R>(
        &mut self,
        stage: MaintenanceStage,
        reply: &Reply<R>,
        running: bool,
    ) -> Do {
        let next = match stage {
            MaintenanceStage::Acquire => match &self.statements.try_lock {
                Some(lock) => return Do::run(lock.clone(), MaintenanceStage::TryLock),
                None => Some(MaintenanceStage::DeleteProcessed),
            },
            MaintenanceStage::TryLock => {
                if !answered_true(reply) {
                    self.run.held_elsewhere = true;
                    return Do::Release;
                }
                Some(MaintenanceStage::DeleteProcessed)
            }
            MaintenanceStage::DeleteProcessed | MaintenanceStage::DeleteFailed => {
                let n = match reply {
                    Reply::Affected(n) => *n,
                    _ => 0,
                };
                if stage == MaintenanceStage::DeleteProcessed {
                    self.run.processed += n;
                } else {
                    self.run.failed += n;
                }
                let full = usize::try_from(n).unwrap_or(usize::MAX) >= self.retention.batch.max(1);
                if full && running {
                    Some(stage)
                } else if stage == MaintenanceStage::DeleteProcessed {
                    Some(MaintenanceStage::DeleteFailed)
                } else {
                    None
                }
            }
            MaintenanceStage::Unlock if answered_true(reply) => return Do::Release,
            MaintenanceStage::Unlock => return Do::Close,
            _ => None,
        };
        self.next(next, running)
    }

    /// The delete of `stage` where the retention has it (or the next one), else the run's
    /// end: unlock, and give the connection back.
    fn next(&self, mut stage: Option<MaintenanceStage>, running: bool) -> Do {
        while let Some(s) = stage {
            let (age, statement) = match s {
                MaintenanceStage::DeleteProcessed => {
                    (self.retention.processed, &self.statements.delete_processed)
                }
                _ => (self.retention.failed, &self.statements.delete_failed),
            };
            if let (Some(age), Some(statement), true) = (age, statement, running) {
                // Old enough by the database's clock.
                let age = i64::try_from(age.as_micros()).unwrap_or(i64::MAX);
                let binds = statement.binds(|_| Value::Int(age));
                return Do::Execute(statement.clone(), binds, s);
            }
            stage =
                (s == MaintenanceStage::DeleteProcessed).then_some(MaintenanceStage::DeleteFailed);
        }
        match &self.statements.unlock {
            Some(unlock) => Do::run(unlock.clone(), MaintenanceStage::Unlock),
            None => Do::Release,
        }
    }

    /// The run ended, its connection given back: what it did, and the next run set.
    pub(super) fn done(&mut self, now: Time) -> Maintained {
        let run = std::mem::take(&mut self.run);
        self.next_at = Some(now.plus(self.retention.every));
        match run.error {
            Some(error) => Maintained::Failed {
                task: format!("retention of table `{}`", self.desc.table).into(),
                error,
            },
            None => Maintained::Retention {
                table: self.desc.table,
                held_elsewhere: run.held_elsewhere,
                processed: run.processed,
                failed: run.failed,
            },
        }
    }
}

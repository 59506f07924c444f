//! Maintenance the broker runs by itself: retention of a table's marked rows and periodic
//! jobs, set on a subscription ([`SubscriberBuilder::retain_processed`],
//! [`SubscriberBuilder::retain_failed`], [`SubscriberBuilder::periodic`]).
//!
//! **Retention** deletes the table's rows marked processed (`processed_at`) or failed
//! (`failed_at`) once the mark is older than an age, every minute unless set
//! ([`SubscriberBuilder::retention_every`]), at most [`RETENTION_BATCH`] rows per statement,
//! each statement its own short transaction. One process at a time runs a table's retention
//! across the fleet: it takes a lock without waiting (PostgreSQL's two-key
//! `pg_try_advisory_lock` of the schema and table, MySQL's and MariaDB's `GET_LOCK`), holds it
//! on one connection while the batches run, and releases it; a process that finds it taken
//! leaves that run to the holder. On SQLite one broker runs a table's retention at a time.
//!
//! **Periodic jobs** publish one row per tick of a cron schedule ([`Schedule`], in UTC or in
//! a time zone's wall clock) into the subscription's table, across every process that runs
//! the same job (by name): each tick once. The schedule's last tick is kept, as a UTC
//! instant, in the state table [`PERIODIC_TABLE`](ruststream_core::dialect::PERIODIC_TABLE)
//! (its DDL per dialect in [`periodic_table_ddl`](ruststream_core::dialect::periodic_table_ddl);
//! created where missing unless [`Periodic::create_table`] says not to); per tick one
//! transaction moves it forward where it is still behind and, only then, inserts the row. So
//! a tick is published once whatever became of its row (acknowledged and deleted, or marked),
//! and a restart publishes the ticks missed while no process ran: the latest
//! [`Periodic::catch_up`] of them ([`PERIODIC_CATCH_UP`] unless set).
//!
//! [`SubscriberBuilder::retain_processed`]: crate::SubscriberBuilder::retain_processed
//! [`SubscriberBuilder::retain_failed`]: crate::SubscriberBuilder::retain_failed
//! [`SubscriberBuilder::retention_every`]: crate::SubscriberBuilder::retention_every
//! [`SubscriberBuilder::periodic`]: crate::SubscriberBuilder::periodic

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ruststream_core::{
    Broker, BrokerError, Maintained, PeriodicJob, Publish, Retention, TableDesc, Ticks, Time,
};

pub use ruststream_core::{PERIODIC_CATCH_UP, RETENTION_BATCH, RETENTION_EVERY};

/// An IANA time zone (`Tz::Europe__Berlin`) for [`Schedule::in_zone`], from `chrono-tz`.
pub use chrono_tz::Tz;
pub use schedule::{Schedule, ScheduleError};

mod schedule;

use crate::adapter::Adapter;
use crate::error::PublishError;
use crate::handle::Message;
use crate::subscriber::Subscription;

/// What a periodic job publishes for a tick.
type MessageOf = Arc<dyn Fn(SystemTime) -> Result<Message, PublishError> + Send + Sync>;

/// A periodic job: a named cron schedule that publishes one row per tick into its
/// subscription's table, across every process that runs a job of the same name.
///
/// ```
/// # use ruststream::{Message, Periodic, Schedule};
/// let nightly = Periodic::new(
///     "nightly-report",
///     Schedule::cron("0 0 3 * * *").expect("a valid pattern"),
///     |tick| Message::json(&serde_json::json!({ "for": format!("{tick:?}") })),
/// )
/// .catch_up(1);
/// # let _ = nightly;
/// ```
#[derive(Clone)]
pub struct Periodic {
    name: Arc<str>,
    schedule: Schedule,
    message: MessageOf,
    catch_up: usize,
    create_table: bool,
}

impl fmt::Debug for Periodic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Periodic")
            .field("name", &self.name)
            .field("schedule", &self.schedule)
            .field("catch_up", &self.catch_up)
            .field("create_table", &self.create_table)
            .finish_non_exhaustive()
    }
}

impl Periodic {
    /// A job named `name` (its row in the state table: every process that runs a job of this
    /// name shares its ticks) that publishes `message(tick)` at each tick of `schedule`. A
    /// tick whose message fails to encode is reported and passed over.
    pub fn new(
        name: impl Into<Arc<str>>,
        schedule: Schedule,
        message: impl Fn(SystemTime) -> Result<Message, PublishError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            schedule,
            message: Arc::new(message),
            catch_up: PERIODIC_CATCH_UP,
            create_table: true,
        }
    }

    /// How many ticks missed while no process ran the job are published at the start, the
    /// latest ones ([`PERIODIC_CATCH_UP`] unless set; 0 publishes none). The same bound, but
    /// at least 1, holds for the ticks one late wake-up publishes.
    pub fn catch_up(mut self, ticks: usize) -> Self {
        self.catch_up = ticks;
        self
    }

    /// Whether the job creates the state table where it is missing (`true` unless set); a
    /// service whose database user may not create tables creates it beforehand with
    /// [`periodic_table_ddl`](ruststream_core::dialect::periodic_table_ddl).
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The job for the core, publishing into `table`.
    pub(crate) fn into_job(self, table: TableDesc) -> PeriodicJob {
        PeriodicJob {
            name: self.name,
            table,
            catch_up: self.catch_up,
            create_table: self.create_table,
            ticks: Box::new(CronTicks {
                schedule: self.schedule,
                message: self.message,
            }),
        }
    }
}

/// A schedule and its messages, as the core asks for them.
struct CronTicks {
    schedule: Schedule,
    message: MessageOf,
}

impl fmt::Debug for CronTicks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CronTicks").field(&self.schedule).finish()
    }
}

impl Ticks for CronTicks {
    fn after(&self, t: Time) -> Option<Time> {
        self.schedule.after(t)
    }

    fn before(&self, t: Time) -> Option<Time> {
        self.schedule.before(t)
    }

    fn row(&self, tick: Time) -> Result<Publish, String> {
        (self.message)(system_time(tick))
            .map(Message::into_publish)
            .map_err(|e| e.to_string())
    }
}

/// The maintenance a subscription asks of its broker.
#[derive(Clone, Debug, Default)]
pub(crate) struct Maintenance {
    pub(crate) retention: Retention,
    pub(crate) periodic: Vec<Periodic>,
}

impl Maintenance {
    /// Whether the subscription asks for a retention.
    pub(crate) fn retains(&self) -> bool {
        self.retention.processed.is_some() || self.retention.failed.is_some()
    }
}

/// Reports what the maintenance did: a failure as a warning, the rest at debug level.
pub(crate) fn report(maintained: &Maintained) {
    match maintained {
        Maintained::Retention {
            table,
            held_elsewhere: true,
            ..
        } => tracing::debug!(table, "retention runs in another process"),
        Maintained::Retention {
            table,
            processed,
            failed,
            ..
        } => tracing::debug!(table, processed, failed, "retention deleted old rows"),
        Maintained::Tick {
            schedule,
            tick,
            published,
        } => tracing::debug!(
            schedule = &**schedule,
            tick = tick.micros(),
            published,
            "periodic tick"
        ),
        Maintained::Failed { task, error } => {
            tracing::warn!("{task}: {error}; it runs again later");
        }
    }
}

/// Hands the core every subscription's retention (one per table) and periodic jobs.
pub(crate) fn register<R, A: Adapter>(
    core: &mut Broker<R>,
    subs: &[Subscription<A>],
    now: Time,
) -> Result<(), BrokerError> {
    for sub in subs {
        if sub.maintenance.retains() {
            core.retain(sub.desc, sub.maintenance.retention, now)?;
        }
        for job in &sub.maintenance.periodic {
            core.periodic(job.clone().into_job(sub.desc), now)?;
        }
    }
    Ok(())
}

fn time_of(at: SystemTime) -> Time {
    let micros = at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0);
    Time(i64::try_from(micros).unwrap_or(i64::MAX))
}

fn system_time(t: Time) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(u64::try_from(t.micros()).unwrap_or(0))
}

#[cfg(test)]
mod tests;

//! The wake-up scenario: with a one-second poll interval and an idle subscription, the time
//! from a publish to the start of its handler.
//!
//! Two publishers, in turn, one job at a time:
//!
//! - **same process**: the publisher of the broker that runs the subscription. The publish
//!   wakes its own subscriptions, on every database.
//! - **other process**: the publisher of a second broker of the same adapter and database,
//!   with no subscription (its own pool and connections, as a second process would have). On
//!   PostgreSQL the publish notifies `ruststream` and the first broker's listening connection
//!   wakes the subscription; elsewhere nothing crosses brokers and the job waits for the poll.
//!
//! Before each publish the subscription has been idle for `IDLE` (its claim after the last
//! settlement found nothing and it waits for its poll), so what is measured is a wake-up, not
//! a claim that was about to run anyway. Where nothing wakes the subscription (another
//! process, off PostgreSQL), the idle time also varies over one poll interval, so the publishes
//! fall at every phase of the poll and the latencies spread as a real arrival's would. The latency is the publisher's wall clock at the
//! publish call, carried in the payload, to the handler's wall clock at its start.

use std::io::Write;
use std::num::NonZeroUsize;
use std::time::Duration;

use ruststream::adapter::TakesRows;
use ruststream::core::Form;
use ruststream::{
    BrokerHandle, Context, Handle, HandlerOutcome, InboxContext, InboxQueue, InboxTable,
    IntoSubscription, Message, PayloadRow, subscriber,
};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::framework::{AdvisoryJob, LeaseJob, RowLockJob};
use crate::stats::{Job, now_us};
use crate::{BoxError, Config, Database, Lines, drivers};

/// The subscription's poll interval: a wake-up that waits for it shows.
pub const POLL: Duration = Duration::from_secs(1);
/// How long the subscription is idle before each publish.
const IDLE: Duration = Duration::from_millis(150);
/// How long one sample may take before the scenario gives up.
const PATIENCE: Duration = Duration::from_secs(10);

/// Where the publisher is, as seen from the subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Publisher {
    /// The broker that runs the subscription.
    SameProcess,
    /// A second broker on the same database.
    OtherProcess,
}

/// One line of the scenario's JSON: the latencies of one publisher.
#[derive(Debug, Serialize)]
pub struct WakeupRecord {
    /// Always `wakeup`.
    pub scenario: &'static str,
    /// `sqlx`, `rusqlite`, `tokio-postgres` or `mysql-async`.
    pub adapter: &'static str,
    /// The database's family.
    pub database: &'static str,
    /// The form of the table.
    pub form: &'static str,
    /// Where the publisher is.
    pub publisher: Publisher,
    /// The subscription's poll interval, in milliseconds.
    pub poll_interval_ms: u64,
    /// How many jobs were timed.
    pub samples: usize,
    /// Publish call to handler start, median, in milliseconds.
    pub p50_ms: f64,
    /// The 99th percentile, in milliseconds.
    pub p99_ms: f64,
    /// The slowest, in milliseconds.
    pub max_ms: f64,
    /// The 1-minute load average at the end.
    pub load1: Option<f64>,
    /// When it ended (UTC, RFC 3339).
    pub date: String,
}

/// The handler: sends each job's pickup latency, in microseconds.
struct Timer {
    tx: mpsc::UnboundedSender<i64>,
}

impl Handle<Job, (), (), InboxContext> for Timer {
    async fn handle(
        &self,
        job: &Job,
        _outs: &(),
        _ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let _ = self.tx.send(now_us() - job.t);
        Ok(())
    }
}

/// Runs the scenario for `config`'s adapter, database and forms: `config.jobs` samples per
/// publisher (at most 200 for the other process where nothing wakes across brokers, since
/// each waits for the poll). Writes one JSON line per publisher and prints a summary.
pub async fn run_wakeup(config: &Config, out: &mut (dyn Write + Send)) -> Result<(), BoxError> {
    let forms = if config.forms.is_empty() {
        vec![config.form]
    } else {
        config.forms.clone()
    };
    if config.dead > 0 && !config.hold_xmin {
        return Err("--dead takes --hold-xmin: without it vacuum may remove the rows".into());
    }
    let _xmin = crate::hold_xmin(config).await?;
    let mut records = Vec::new();
    for form in forms {
        let mut of_form = config.clone();
        of_form.form = form;
        let table = of_form.table().table;
        drivers::prepare(&config.database, table, config.dead, 1).await?;
        if config.dead > 0 {
            drivers::delete_all(&config.database, table).await?;
        }
        for publisher in [Publisher::SameProcess, Publisher::OtherProcess] {
            let latencies = measure(config, form, publisher).await?;
            records.push(record(config, form, publisher, latencies));
        }
    }
    let mut lines = Lines::open(config, out)?;
    for r in &records {
        lines.emit(r)?;
    }
    for r in &records {
        eprintln!(
            "wakeup {} {} {} {:?}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over {} jobs (poll interval {} ms)",
            r.adapter,
            r.database,
            r.form,
            r.publisher,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.samples,
            r.poll_interval_ms
        );
    }
    Ok(())
}

fn record(config: &Config, form: Form, publisher: Publisher, mut us: Vec<i64>) -> WakeupRecord {
    let mut of_form = config.clone();
    of_form.form = form;
    us.sort_unstable();
    let at = |q: f64| -> f64 {
        if us.is_empty() {
            return f64::NAN;
        }
        let i = ((us.len() as f64 - 1.0) * q).round() as usize;
        us[i.min(us.len() - 1)] as f64 / 1000.0
    };
    WakeupRecord {
        scenario: "wakeup",
        adapter: config.adapter.name(),
        database: config.database.family(),
        form: of_form.form_name(),
        publisher,
        poll_interval_ms: POLL.as_millis() as u64,
        samples: us.len(),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: at(1.0),
        load1: crate::stats::load_average(),
        date: crate::stats::utc_now(),
    }
}

/// The samples of one publisher, in microseconds.
async fn measure(config: &Config, form: Form, publisher: Publisher) -> Result<Vec<i64>, BoxError> {
    let polled = matches!(
        (publisher, &config.database),
        (
            Publisher::OtherProcess,
            Database::MySql(_) | Database::Sqlite(_)
        )
    );
    let samples = if polled {
        config.jobs.min(20) as usize
    } else {
        config.jobs as usize
    };
    with_broker!(
        config,
        config.pool_size(),
        |make| match form {
            Form::RowLock =>
                sample::<_, RowLockJob>(make, publisher, samples, polled, config).await,
            Form::Lease => sample::<_, LeaseJob>(make, publisher, samples, polled, config).await,
            Form::Advisory => {
                sample::<_, AdvisoryJob>(make, publisher, samples, polled, config).await
            }
        },
        match form {
            Form::RowLock => Err("SQLite has no row locks".into()),
            Form::Lease => sample::<_, LeaseJob>(make, publisher, samples, polled, config).await,
            Form::Advisory => {
                sample::<_, AdvisoryJob>(make, publisher, samples, polled, config).await
            }
        }
    )
}

/// Starts a broker made by `make` with the subscription, and, for the other process, a second
/// one to publish from; times `samples` jobs one at a time.
async fn sample<A, T>(
    make: impl Fn() -> A,
    publisher: Publisher,
    samples: usize,
    polled: bool,
    config: &Config,
) -> Result<Vec<i64>, BoxError>
where
    A: TakesRows<T>,
    T: InboxTable + PayloadRow + ruststream::DecodesAs<Job>,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = BrokerHandle::new(make());
    let jobs = subscriber("wakeup", Timer { tx })
        .map_source(|_| InboxQueue::<T>::new("wakeup"))
        .workers(NonZeroUsize::new(config.workers.max(1)).expect("at least one"))
        .poll_interval(POLL);
    let running = consumer
        .start(vec![jobs.into_subscription()], ruststream::exec::current())
        .await?;
    let other = match publisher {
        Publisher::SameProcess => None,
        Publisher::OtherProcess => Some(BrokerHandle::new(make())),
    };
    let other_running = match &other {
        Some(handle) => Some(
            handle
                .start(Vec::new(), ruststream::exec::current())
                .await?,
        ),
        None => None,
    };
    let publishing = match &other {
        Some(handle) => handle.publisher::<T>(),
        None => consumer.publisher::<T>(),
    };
    let bar = crate::bar(
        config,
        samples as u64,
        format!("wakeup {:?}", publisher).to_lowercase(),
    );
    let mut latencies = Vec::with_capacity(samples);
    let mut result = Ok(());
    for i in 0..samples {
        // Spread over one poll interval where only the poll picks the job up: 0, 0.5 s,
        // 0.25 s, 0.75 s, ... (the bits of `i` reversed), so every phase is sampled evenly.
        let phase = if polled {
            let spread = (i as u32).reverse_bits() as f64 / (u32::MAX as f64 + 1.0);
            POLL.mul_f64(spread)
        } else {
            Duration::ZERO
        };
        tokio::time::sleep(IDLE + phase).await;
        let mut message = Message::json(&Job { t: now_us() })?;
        if ruststream::core::spec::Described::table_desc(&T::TABLE)
            .advisory()
            .is_some()
        {
            message = message.column("k", ruststream::core::Value::Int(i as i64));
        }
        if let Err(error) = publishing.publish(message).await {
            result = Err(format!("publish {i} failed: {error}").into());
            break;
        }
        match tokio::time::timeout(PATIENCE, rx.recv()).await {
            Ok(Some(us)) => latencies.push(us),
            _ => {
                result = Err(format!("job {i} was not handled within {PATIENCE:?}").into());
                break;
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    if let Some(r) = other_running {
        r.shutdown().await;
    }
    running.stop();
    running.drained().await;
    running.shutdown().await;
    result.map(|()| latencies)
}

//! One service, as the parent starts it: `ruststream-chaos child ..`.
//!
//! It runs one subscription of `chaos_jobs` on the adapter and form it is given, with a pool
//! of `--pool` connections, until SIGTERM (or its standard input closes: its parent is gone),
//! then shuts down gracefully. Its handler records each delivery in the log table through a
//! pool of its own (not the broker's, which pool_exhaustion starves): a row at the start (job,
//! attempt, key, pid, start time) and the end time and outcome before it answers. The outcome
//! is [`plan::outcome`] of the job and attempt.
//!
//! The times it records are its wall clock's less `--clock-offset-us`: clock_skew sets a
//! child's wall clock off by that much (libfaketime), and the log's times stay on the one
//! clock of the machine, comparable across processes and with the parent's.
//!
//! Standard output carries three lines for the parent: `clock wall_us=N` first (the child's
//! wall clock, uncorrected, in µs since the epoch: the parent checks that the skew it set is
//! in effect), `ready` once the broker started, and
//! `closed locks_released=N connections_closed=N` after the shutdown.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use ruststream::adapter::{Adapter, TakesRows};
use ruststream::exec::BoxFuture;
use ruststream::{
    AppInfo, BrokerHandle, ClosedCounts, Context, Handle, HandlerOutcome, InboxContext, InboxQueue,
    InboxTable, IntoSubscription, PayloadRow, RetryPolicy, RustStream, subscriber,
};
use ruststream_mysql_async::MySqlAsyncBroker;
use ruststream_sqlx::SqlxBroker;
use ruststream_tokio_postgres::TokioPostgresBroker;
use ruststream_tokio_postgres::deadpool_postgres::PoolConfig;
use serde::de::IgnoredAny;
use sqlx::mysql::{MySql, MySqlPoolOptions};
use sqlx::postgres::{PgPoolOptions, Postgres};
use tokio::io::AsyncReadExt;

use crate::plan::{self, Mode, Outcome};
use crate::rows::{
    AdvisoryJob, BareAdvisoryJob, BareLeaseJob, BareRowLockJob, LeaseJob, RowLockJob,
};
use crate::{BoxError, Form, Target};

/// The settings of one service.
#[derive(Args, Debug, Clone)]
pub struct ChildArgs {
    /// The adapter and its database.
    #[arg(long, value_enum)]
    pub target: Target,
    /// The form.
    #[arg(long, value_enum)]
    pub form: Form,
    /// The broker's URL (the run's database).
    #[arg(long)]
    pub url: String,
    /// The log pool's URL.
    #[arg(long)]
    pub log_url: String,
    /// The log table, as the log pool names it.
    #[arg(long)]
    pub log_table: String,
    /// This process's number in the run (each start, restarts included, has its own).
    #[arg(long)]
    pub spawn: i64,
    /// The subscription's workers.
    #[arg(long)]
    pub workers: usize,
    /// The broker's pool size.
    #[arg(long)]
    pub pool: usize,
    /// Connections of the broker's pool that other users of it hold, on and off, through the
    /// run.
    #[arg(long, default_value_t = 0)]
    pub drain: usize,
    /// How the handlers answer.
    #[arg(long, value_enum)]
    pub mode: Mode,
    /// The handlers' mean work, in milliseconds.
    #[arg(long)]
    pub handler_ms: u64,
    /// The lease, in milliseconds.
    #[arg(long)]
    pub lease_ms: u64,
    /// The subscription's `max_attempts`.
    #[arg(long)]
    pub max_attempts: u32,
    /// How long the handlers in work may take to finish at shutdown, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub shutdown_ms: u64,
    /// How far this process's wall clock is off the machine's, in µs (ahead when positive):
    /// subtracted from every time the handlers record.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub clock_offset_us: i64,
    /// The table is bare (poison_rows): no due column, no `failed_at`, no `max_attempts`.
    #[arg(long)]
    pub bare: bool,
    /// Runs as a service does, through `RustStream::run`: a start that fails on a passing
    /// error is reported and tried again until it succeeds or a signal ends it (failed_start).
    #[arg(long)]
    pub app: bool,
    /// PostgreSQL behind a pooler in transaction pooling (pooler): statements under the simple
    /// query protocol, the listening session on this direct URL.
    #[arg(long)]
    pub listen_url: Option<String>,
}

/// Microseconds since the Unix epoch, by this process's wall clock (the machine's, unless
/// clock_skew set it off: a child records [`Recorder::now`]).
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The handlers' log: a pool of its own on the run's database.
#[derive(Clone)]
enum LogPool {
    Postgres(sqlx::PgPool),
    MySql(sqlx::MySqlPool),
}

/// How long a log write may keep failing before the service gives up: a log that misses a
/// delivery would make the run's check wrong.
const LOG_PATIENCE: Duration = Duration::from_secs(120);

struct Log {
    pool: LogPool,
    table: String,
}

impl Log {
    fn open(args: &ChildArgs) -> Result<Self, BoxError> {
        let size = (args.workers + 1) as u32;
        let pool = if args.target.postgres() {
            LogPool::Postgres(
                PgPoolOptions::new()
                    .max_connections(size)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect_lazy(&args.log_url)?,
            )
        } else {
            LogPool::MySql(
                MySqlPoolOptions::new()
                    .max_connections(size)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect_lazy(&args.log_url)?,
            )
        };
        Ok(Self {
            pool,
            table: args.log_table.clone(),
        })
    }

    /// Runs `write` until it succeeds; exits the process after [`LOG_PATIENCE`] of failures.
    async fn persist<F, Fut>(&self, what: &str, mut write: F)
    where
        F: FnMut(LogPool) -> Fut,
        Fut: Future<Output = Result<(), sqlx::Error>>,
    {
        let since = Instant::now();
        loop {
            match write(self.pool.clone()).await {
                Ok(()) => return,
                Err(error) if since.elapsed() < LOG_PATIENCE => {
                    tracing_free_note(&format!("log write ({what}) failed, trying again: {error}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => {
                    eprintln!(
                        "chaos child: the log write ({what}) failed for {LOG_PATIENCE:?}: {error}"
                    );
                    std::process::exit(5);
                }
            }
        }
    }

    async fn start(&self, record: Start) {
        let table = self.table.clone();
        self.persist("start", |pool| {
            let table = table.clone();
            let r = record.clone();
            async move {
                match pool {
                    LogPool::Postgres(pool) => {
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "INSERT INTO {table} (spawn, seq, job, attempt, key, pid, start_us) \
                             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING"
                        )))
                        .bind(r.spawn)
                        .bind(r.seq)
                        .bind(r.job)
                        .bind(r.attempt)
                        .bind(r.key)
                        .bind(r.pid)
                        .bind(r.start_us)
                        .execute(&pool)
                        .await?;
                    }
                    LogPool::MySql(pool) => {
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "INSERT IGNORE INTO {table} \
                             (spawn, seq, job, attempt, `key`, pid, start_us) \
                             VALUES (?, ?, ?, ?, ?, ?, ?)"
                        )))
                        .bind(r.spawn)
                        .bind(r.seq)
                        .bind(r.job)
                        .bind(r.attempt)
                        .bind(r.key)
                        .bind(r.pid)
                        .bind(r.start_us)
                        .execute(&pool)
                        .await?;
                    }
                }
                Ok(())
            }
        })
        .await;
    }

    async fn end(&self, spawn: i64, seq: i64, end_us: i64, outcome: Outcome) {
        let table = self.table.clone();
        self.persist("end", |pool| {
            let table = table.clone();
            async move {
                let placeholders = match pool {
                    LogPool::Postgres(_) => ["$1", "$2", "$3", "$4"],
                    LogPool::MySql(_) => ["?", "?", "?", "?"],
                };
                let sql = format!(
                    "UPDATE {table} SET end_us = {}, outcome = {} WHERE spawn = {} AND seq = {}",
                    placeholders[0], placeholders[1], placeholders[2], placeholders[3]
                );
                match pool {
                    LogPool::Postgres(pool) => {
                        sqlx::query(sqlx::AssertSqlSafe(sql))
                            .bind(end_us)
                            .bind(outcome.name())
                            .bind(spawn)
                            .bind(seq)
                            .execute(&pool)
                            .await?;
                    }
                    LogPool::MySql(pool) => {
                        sqlx::query(sqlx::AssertSqlSafe(sql))
                            .bind(end_us)
                            .bind(outcome.name())
                            .bind(spawn)
                            .bind(seq)
                            .execute(&pool)
                            .await?;
                    }
                }
                Ok(())
            }
        })
        .await;
    }

    async fn close(&self) {
        match &self.pool {
            LogPool::Postgres(pool) => pool.close().await,
            LogPool::MySql(pool) => pool.close().await,
        }
    }
}

/// A note on standard error, at most one a second, so a long outage does not flood it.
fn tracing_free_note(text: &str) {
    static LAST: AtomicI64 = AtomicI64::new(0);
    let now = now_us();
    let last = LAST.load(Ordering::Relaxed);
    if now - last > 1_000_000
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        eprintln!("chaos child: {text}");
    }
}

/// The log row a handler writes as it starts.
#[derive(Clone)]
struct Start {
    spawn: i64,
    seq: i64,
    job: i64,
    attempt: i64,
    key: Option<String>,
    pid: i64,
    start_us: i64,
}

/// The handler: records its start, works, records its end and outcome, answers.
struct Recorder {
    log: Arc<Log>,
    spawn: i64,
    seq: AtomicI64,
    pid: i64,
    mode: Mode,
    handler_ms: u64,
    clock_offset_us: i64,
}

impl Recorder {
    /// The time to record: this process's wall clock brought back to the machine's.
    fn now(&self) -> i64 {
        now_us() - self.clock_offset_us
    }
}

impl Handle<IgnoredAny, (), (), InboxContext> for Recorder {
    async fn handle(
        &self,
        _message: &IgnoredAny,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let start_us = self.now();
        let info = ctx.kind().info();
        let job = info.id.as_int().unwrap_or(-1);
        let attempt = info.attempt.unwrap_or(-1);
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.log
            .start(Start {
                spawn: self.spawn,
                seq,
                job,
                attempt,
                key: info.key.as_deref().map(str::to_owned),
                pid: self.pid,
                start_us,
            })
            .await;
        let work = plan::work(self.handler_ms, job, attempt);
        if work.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(work).await;
        }
        let outcome = plan::outcome(self.mode, job, attempt);
        self.log.end(self.spawn, seq, self.now(), outcome).await;
        match outcome {
            Outcome::Ack => Ok(()),
            Outcome::Retry => Err(HandlerOutcome::retry()),
            Outcome::Reject => {
                Err(HandlerOutcome::reject().with_error(plan::reject_error(job, attempt)))
            }
        }
    }
}

/// A broker whose pool other users of the service can take connections from.
trait Drain {
    /// A connection of the broker's pool, held until the box drops; `None` where the pool is
    /// not built yet or gives none.
    fn hold(&self) -> BoxFuture<Option<Box<dyn Send>>>;
}

impl Drain for SqlxBroker<Postgres> {
    fn hold(&self) -> BoxFuture<Option<Box<dyn Send>>> {
        let pool = self.pool();
        Box::pin(async move {
            let conn = pool?.acquire().await.ok()?;
            Some(Box::new(conn) as Box<dyn Send>)
        })
    }
}

impl Drain for SqlxBroker<MySql> {
    fn hold(&self) -> BoxFuture<Option<Box<dyn Send>>> {
        let pool = self.pool();
        Box::pin(async move {
            let conn = pool?.acquire().await.ok()?;
            Some(Box::new(conn) as Box<dyn Send>)
        })
    }
}

impl Drain for TokioPostgresBroker {
    fn hold(&self) -> BoxFuture<Option<Box<dyn Send>>> {
        let pool = self.pool();
        Box::pin(async move {
            let conn = pool?.get().await.ok()?;
            Some(Box::new(conn) as Box<dyn Send>)
        })
    }
}

impl Drain for MySqlAsyncBroker {
    fn hold(&self) -> BoxFuture<Option<Box<dyn Send>>> {
        let pool = self.pool();
        Box::pin(async move {
            let conn = pool?.get_conn().await.ok()?;
            Some(Box::new(conn) as Box<dyn Send>)
        })
    }
}

/// Completes at `termination` (SIGTERM or SIGINT), or when standard input closes (the parent
/// is gone).
async fn stopped(termination: impl Future<Output = ()>) {
    let orphaned = async {
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
    };
    tokio::select! {
        () = termination => {}
        () = orphaned => {}
    }
}

/// Runs the service on `broker` for rows of `T` until stopped; answers the shutdown's counts.
async fn serve<A, T>(
    broker: A,
    args: &ChildArgs,
    log: Arc<Log>,
    stop: impl Future<Output = ()>,
) -> Result<ClosedCounts, BoxError>
where
    A: TakesRows<T> + Drain,
    T: InboxTable + PayloadRow + ruststream::DecodesAs<serde::de::IgnoredAny>,
{
    let recorder = Recorder {
        log,
        spawn: args.spawn,
        seq: AtomicI64::new(0),
        pid: i64::from(std::process::id()),
        mode: args.mode,
        handler_ms: args.handler_ms,
        clock_offset_us: args.clock_offset_us,
    };
    let policy = match args.mode {
        Mode::Normal | Mode::Poison => RetryPolicy::fixed(args.mode.retry_delay()),
        Mode::Storm => RetryPolicy::immediate(),
    };
    let mut jobs = subscriber("chaos", recorder)
        .map_source(|_| InboxQueue::<T>::new("chaos"))
        .workers(NonZeroUsize::new(args.workers.max(1)).expect("at least one"))
        .poll_interval(Duration::from_millis(100))
        .lease(Duration::from_millis(args.lease_ms))
        .retry_policy(policy);
    if !args.bare {
        jobs = jobs.max_attempts(args.max_attempts);
    }
    let handle = BrokerHandle::new(broker);
    if args.app {
        return serve_app(handle, jobs.into_subscription(), args).await;
    }
    let running = handle
        .start(vec![jobs.into_subscription()], ruststream::exec::current())
        .await?;
    println!("ready");

    // pool_exhaustion: other users of the broker's pool hold `drain` of its connections, each
    // for 0.5 to 2 s with a pause of 0.1 s, until the stop.
    let draining = Arc::new(AtomicBool::new(true));
    let mut drainers = Vec::new();
    for i in 0..args.drain {
        let handle = handle.clone();
        let draining = draining.clone();
        let mut rng = fastrand::Rng::with_seed(args.spawn as u64 * 1000 + i as u64);
        drainers.push(tokio::spawn(async move {
            while draining.load(Ordering::Relaxed) {
                if let Some(conn) = handle.adapter().hold().await {
                    tokio::time::sleep(Duration::from_millis(rng.u64(500..2000))).await;
                    drop(conn);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }

    stop.await;
    draining.store(false, Ordering::Relaxed);
    for drainer in drainers {
        drainer.abort();
        let _ = drainer.await;
    }
    running.stop();
    let _ = tokio::time::timeout(Duration::from_millis(args.shutdown_ms), running.drained()).await;
    Ok(running.shutdown().await)
}

/// Runs the subscription as a service (`--app`): `RustStream::run`, which reports a start that
/// fails on a passing error and tries it again until it succeeds or SIGTERM ends it. It says
/// `ready` once started; it has no shutdown counts to say.
async fn serve_app<A: Adapter>(
    handle: BrokerHandle<A>,
    jobs: ruststream::Subscription<A>,
    args: &ChildArgs,
) -> Result<ClosedCounts, BoxError> {
    let service = RustStream::new(AppInfo::new("chaos", "0"))
        .shutdown_timeout(Duration::from_millis(args.shutdown_ms))
        .with_broker(handle, move |b| {
            b.include(jobs);
        })
        .on_started(async || {
            println!("ready");
            Ok::<(), BoxError>(())
        });
    service.run().await?;
    Ok(ClosedCounts::default())
}

/// The child's `main`: exit code 0 after a graceful shutdown, 3 when the broker did not start,
/// 5 when the log could not be written.
pub async fn main(args: ChildArgs) -> std::process::ExitCode {
    // The wall clock as this process sees it, for the parent to compare with its own.
    println!("clock wall_us={}", now_us());
    // The handler goes in first: a SIGTERM during the start stops the service once started.
    let stop = stopped(ruststream::termination());
    let log = match Log::open(&args) {
        Ok(log) => Arc::new(log),
        Err(error) => {
            eprintln!("chaos child: cannot open the log pool: {error}");
            return std::process::ExitCode::from(3);
        }
    };
    let n = args.pool.max(1);
    // A service (`--app`) whose start fails is told so within seconds: sqlx's pool would
    // try a refused connection again for its 30 s default before answering.
    let acquire = if args.app {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(30)
    };
    let result = match args.target {
        Target::SqlxPostgres => {
            let mut broker = SqlxBroker::<Postgres>::from_url(
                args.url.clone(),
                PgPoolOptions::new()
                    .max_connections(n as u32)
                    .acquire_timeout(acquire),
            );
            if let Some(direct) = &args.listen_url {
                match direct.parse() {
                    Ok(options) => broker = broker.simple_query(true).listen_on(options),
                    Err(error) => return bad_listen_url(direct, &error),
                }
            }
            by_form(broker, &args, log.clone(), stop).await
        }
        Target::SqlxMysql => {
            let broker = SqlxBroker::<MySql>::from_url(
                args.url.clone(),
                MySqlPoolOptions::new()
                    .max_connections(n as u32)
                    .acquire_timeout(acquire),
            );
            by_form(broker, &args, log.clone(), stop).await
        }
        Target::TokioPostgres => {
            let mut broker = TokioPostgresBroker::from_url(args.url.clone(), PoolConfig::new(n));
            if let Some(direct) = &args.listen_url {
                match direct.parse() {
                    Ok(config) => {
                        broker = broker
                            .simple_query(true)
                            .listen_on(config, ruststream_tokio_postgres::tokio_postgres::NoTls)
                    }
                    Err(error) => return bad_listen_url(direct, &error),
                }
            }
            by_form(broker, &args, log.clone(), stop).await
        }
        Target::MysqlAsync => {
            // mysql_async closes every connection given back beyond `pool_min`: keep both.
            let sep = if args.url.contains('?') { '&' } else { '?' };
            let url = format!("{}{sep}pool_min={n}&pool_max={n}", args.url);
            by_form(MySqlAsyncBroker::from_url(url), &args, log.clone(), stop).await
        }
    };
    log.close().await;
    match result {
        Ok(counts) => {
            println!(
                "closed locks_released={} connections_closed={}",
                counts.locks_released, counts.connections_closed
            );
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("chaos child: the service did not start: {error}");
            std::process::ExitCode::from(3)
        }
    }
}

/// Exit code 2: `--listen-url` does not parse.
fn bad_listen_url(url: &str, error: &dyn std::fmt::Display) -> std::process::ExitCode {
    eprintln!("chaos child: --listen-url {url}: {error}");
    std::process::ExitCode::from(2)
}

async fn by_form<A>(
    broker: A,
    args: &ChildArgs,
    log: Arc<Log>,
    stop: impl Future<Output = ()>,
) -> Result<ClosedCounts, BoxError>
where
    A: TakesRows<RowLockJob> + TakesRows<LeaseJob> + TakesRows<AdvisoryJob> + Drain,
    A: TakesRows<BareRowLockJob> + TakesRows<BareLeaseJob> + TakesRows<BareAdvisoryJob>,
{
    match (args.form, args.bare) {
        (Form::RowLock, false) => serve::<A, RowLockJob>(broker, args, log, stop).await,
        (Form::Lease, false) => serve::<A, LeaseJob>(broker, args, log, stop).await,
        (Form::Advisory, false) => serve::<A, AdvisoryJob>(broker, args, log, stop).await,
        (Form::RowLock, true) => serve::<A, BareRowLockJob>(broker, args, log, stop).await,
        (Form::Lease, true) => serve::<A, BareLeaseJob>(broker, args, log, stop).await,
        (Form::Advisory, true) => serve::<A, BareAdvisoryJob>(broker, args, log, stop).await,
    }
}

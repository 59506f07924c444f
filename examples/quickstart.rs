//! The quick start: a batch of jobs over a set of keys, published into a SQLite file under
//! `target/` (or a table on PostgreSQL or MySQL/MariaDB), processed in the advisory lock form
//! with several workers and a few retries, and a summary at the end: jobs per second, attempts,
//! and a check that no two jobs of one key were ever in work together.
//!
//! ```sh
//! cargo run --release --example quickstart
//! cargo run --release --example quickstart -- --jobs 2000 --keys 20 --workers 4
//! cargo run --release --example quickstart -- --url postgres://postgres@127.0.0.1:5432/test
//! cargo run --release --example quickstart -- --url mysql://root@127.0.0.1:3306/test
//! cargo run --release --example quickstart -- --help
//! ```
//!
//! SQLite runs on `ruststream-rusqlite`; a `postgres://` or `mysql://` URL runs the same batch
//! on `ruststream-sqlx`, in the table `quickstart_jobs` of that database, which the quick start
//! drops and creates anew from the row type's description (`JobRow::TABLE.ddl(..)`). SQLite
//! runs in WAL mode with `synchronous = NORMAL`: a crash of the process loses nothing, a power
//! loss may undo the last commits.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use ruststream::adapter::TakesRows;
use ruststream::core::Dialect;
use ruststream::{
    BoxError, BrokerHandle, Inbox, InboxQueue, InboxTable, IntoSubscription, Message, RetryPolicy,
    State, subscriber,
};
use ruststream_rusqlite::rusqlite::Connection;
use ruststream_rusqlite::{RusqliteBroker, Synchronous};
use ruststream_sqlx::SqlxBroker;
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, Connection as _};

/// One row of `quickstart_jobs`, held by a lock on its channel's key while it is in work; a job
/// that fails for good stays, marked failed with its error. It decodes with serde on rusqlite
/// and with `sqlx::FromRow` on sqlx.
#[derive(Inbox, Deserialize, sqlx::FromRow)]
#[inbox(
    table = "quickstart_jobs",
    advisory_lock = "quickstart_jobs-{channel}",
    failed_at = "failed_at",
    error = "error"
)]
pub struct JobRow {
    #[field(id, generated)]
    id: i64,
    channel: i64,
    #[field(attempt, generated)]
    attempt: i32,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The message a job carries.
#[derive(Serialize, Deserialize)]
pub struct Job {
    /// The job's number.
    pub n: u64,
    /// The job fails its first attempt and is retried.
    pub flaky: bool,
}

/// The table, dropped and created anew from `JobRow`'s description in the database's dialect:
/// its `CREATE TABLE` and any index the claims need. The description only names `channel`, a
/// key's column, which would be text; here it holds integers.
fn schema(dialect: Dialect) -> String {
    let ddl = JobRow::TABLE
        .ddl(dialect)
        .column_type("channel", "BIGINT NOT NULL");
    format!("DROP TABLE IF EXISTS quickstart_jobs;\n{ddl}")
}

/// Where the jobs go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Database {
    /// A SQLite file, on `ruststream-rusqlite`.
    Sqlite(PathBuf),
    /// A PostgreSQL database (`postgres://..`), on `ruststream-sqlx`.
    Postgres(String),
    /// A MySQL or MariaDB database (`mysql://..`), on `ruststream-sqlx`.
    MySql(String),
}

impl Database {
    /// The database a `--url` names: `postgres://..`, `postgresql://..`, `mysql://..`,
    /// `sqlite:PATH`, or a bare path of a SQLite file.
    pub fn from_url(url: &str) -> Result<Self, String> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Database::Postgres(url.to_owned()));
        }
        if url.starts_with("mysql://") {
            return Ok(Database::MySql(url.to_owned()));
        }
        match url.strip_prefix("sqlite:") {
            Some(path) => Ok(Database::Sqlite(PathBuf::from(
                path.trim_start_matches("//"),
            ))),
            None if url.contains("://") => Err(format!(
                "--url {url}: the quick start runs on SQLite (sqlite:PATH), PostgreSQL (postgres://..) or MySQL/MariaDB (mysql://..)"
            )),
            None => Ok(Database::Sqlite(PathBuf::from(url))),
        }
    }
}

impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "{} (SQLite, rusqlite)", path.display()),
            Database::Postgres(url) => write!(f, "{} (PostgreSQL, sqlx)", redact(url)),
            Database::MySql(url) => write!(f, "{} (MySQL/MariaDB, sqlx)", redact(url)),
        }
    }
}

/// The URL with its password hidden.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let host_start = rest.find('/').unwrap_or(rest.len());
    match rest[..host_start].rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// The quick start's command line.
#[derive(clap::Parser, Debug)]
#[command(
    name = "quickstart",
    about = "Publishes a batch of jobs over a set of keys and processes them in the advisory \
             lock form: one job of a key in work at a time, several workers, a few retries."
)]
struct Cli {
    /// Where the jobs go: sqlite:PATH (or a bare path), postgres://.. or mysql://..
    /// [default: sqlite:target/quickstart.db]
    #[arg(long)]
    url: Option<String>,
    /// How many jobs to publish.
    #[arg(long, default_value_t = 10_000)]
    jobs: u64,
    /// Over how many keys.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// How many workers.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    workers: u64,
    /// Every how many jobs one fails its first attempt and is retried (0: none).
    #[arg(long, default_value_t = 50)]
    flaky_every: u64,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// The quick start's settings.
#[derive(Clone, Debug)]
pub struct Args {
    /// Where the jobs go.
    pub database: Database,
    /// How many jobs to publish.
    pub jobs: u64,
    /// Over how many keys.
    pub keys: u64,
    /// How many workers.
    pub workers: usize,
    /// Every how many jobs one fails its first attempt.
    pub flaky_every: u64,
    /// Show a progress bar.
    pub progress: bool,
}

impl Args {
    /// Reads `--url`, `--jobs`, `--keys`, `--workers`, `--flaky-every`, `--quiet`; `--help`
    /// answers the help as its error.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, clap::Error> {
        use clap::Parser;
        let cli = Cli::try_parse_from(std::iter::once("quickstart".to_owned()).chain(args))?;
        let database = match cli.url {
            Some(url) => Database::from_url(&url)
                .map_err(|e| clap::Error::raw(clap::error::ErrorKind::InvalidValue, e))?,
            None => {
                let target = std::env::var_os("CARGO_TARGET_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("target"));
                Database::Sqlite(target.join("quickstart.db"))
            }
        };
        Ok(Args {
            database,
            jobs: cli.jobs,
            keys: cli.keys,
            workers: cli.workers as usize,
            flaky_every: cli.flaky_every,
            progress: !cli.quiet,
        })
    }
}

/// What the run measured.
#[derive(Debug)]
pub struct Summary {
    /// Jobs acknowledged.
    pub done: u64,
    /// Takes, over every job.
    pub attempts: u64,
    /// Jobs retried.
    pub retries: u64,
    /// The most jobs of one key ever in work at once.
    pub max_per_key: usize,
    /// Rows left in the table.
    pub rows_left: i64,
    /// How long the processing took.
    pub elapsed: Duration,
}

/// What the handler counts, shared by its workers.
#[derive(Default)]
struct Counts {
    in_work: Mutex<HashMap<i64, usize>>,
    max_per_key: AtomicUsize,
    done: AtomicU64,
    /// Woken at each job done.
    finished: tokio::sync::Notify,
    attempts: AtomicU64,
    retries: AtomicU64,
}

/// Counts the jobs of each key in work, fails a flaky job's first attempt (an error retries
/// it under the retry policy).
#[subscriber(InboxQueue::<JobRow>::new("jobs"))]
async fn work(
    job: &Job,
    this: ruststream::Job<JobRow>,
    State(counts): State<Arc<Counts>>,
    State(progress): State<ProgressBar>,
) -> Result<(), BoxError> {
    let key: i64 = this
        .key()
        .and_then(|k| k.rsplit('-').next())
        .and_then(|k| k.parse().ok())
        .unwrap_or(-1);
    {
        let mut in_work = counts.in_work.lock().expect("not poisoned");
        let n = in_work.entry(key).or_default();
        *n += 1;
        counts.max_per_key.fetch_max(*n, Ordering::SeqCst);
    }
    // The work itself.
    tokio::task::yield_now().await;
    counts
        .in_work
        .lock()
        .expect("not poisoned")
        .entry(key)
        .and_modify(|n| *n -= 1);
    counts.attempts.fetch_add(1, Ordering::SeqCst);
    if job.flaky && this.attempt() == 1 {
        counts.retries.fetch_add(1, Ordering::SeqCst);
        return Err(format!("job {} fails its first attempt", job.n).into());
    }
    counts.done.fetch_add(1, Ordering::SeqCst);
    counts.finished.notify_waiters();
    progress.inc(1);
    Ok(())
}

/// Runs the quick start.
pub async fn run(args: Args) -> Result<Summary, BoxError> {
    let progress = progress_bar(&args);
    let counts = Arc::new(Counts::default());
    let worker = (counts.clone(), progress.clone());
    let (elapsed, rows_left) = match &args.database {
        Database::Sqlite(path) => on_sqlite(path, &args, worker).await?,
        Database::Postgres(url) => {
            on_server::<sqlx::Postgres>(url, Dialect::Postgres, &args, worker).await?
        }
        Database::MySql(url) => {
            on_server::<sqlx::MySql>(url, Dialect::MySql, &args, worker).await?
        }
    };
    progress.finish();
    Ok(Summary {
        done: counts.done.load(Ordering::SeqCst),
        attempts: counts.attempts.load(Ordering::SeqCst),
        retries: counts.retries.load(Ordering::SeqCst),
        max_per_key: counts.max_per_key.load(Ordering::SeqCst),
        rows_left,
        elapsed,
    })
}

/// A progress bar of the jobs done, or a hidden one.
fn progress_bar(args: &Args) -> ProgressBar {
    if !args.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(args.jobs);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {bar:40} {pos}/{len} jobs  {per_sec}  {elapsed}")
            .expect("a valid template"),
    );
    bar
}

/// The pool of a server: a connection for each job in work, for the claims and for the
/// publishes.
fn connections(args: &Args) -> u32 {
    args.workers as u32 + 4
}

/// The run on a fresh SQLite file: how long the processing took, and the rows left.
async fn on_sqlite(
    path: &std::path::Path,
    args: &Args,
    worker: (Arc<Counts>, ProgressBar),
) -> Result<(Duration, i64), BoxError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.to_path_buf().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
    Connection::open(path)?.execute_batch(&schema(Dialect::Sqlite))?;
    // WAL (which the broker sets) with `synchronous = NORMAL`: a commit does not wait for the
    // disk. A crash of the process loses nothing; a power loss may undo the last commits (a
    // finished job runs again, a published one is gone).
    let broker = RusqliteBroker::open(path).synchronous(Synchronous::Normal);
    let elapsed = process(broker.handle(), args, worker).await?;
    let rows_left: i64 =
        Connection::open(path)?
            .query_row("SELECT COUNT(*) FROM quickstart_jobs", [], |r| r.get(0))?;
    Ok((elapsed, rows_left))
}

/// The run on PostgreSQL or on MySQL/MariaDB (`DB`, in `dialect`): how long the processing
/// took, and the rows left.
async fn on_server<DB>(
    url: &str,
    dialect: Dialect,
    args: &Args,
    worker: (Arc<Counts>, ProgressBar),
) -> Result<(Duration, i64), BoxError>
where
    DB: ruststream_sqlx::SqlxDatabase,
    SqlxBroker<DB>: TakesRows<JobRow>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    // The table, on a connection of its own: a server that does not answer fails here at
    // once, naming the URL.
    let mut conn = DB::Connection::connect(url)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", redact(url)))?;
    sqlx::raw_sql(AssertSqlSafe(schema(dialect)))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    let pool = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(connections(args))
        .connect(url)
        .await?;
    let elapsed = process(SqlxBroker::new(pool.clone()).handle(), args, worker).await?;
    let (rows_left,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM quickstart_jobs")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    Ok((elapsed, rows_left))
}

/// Starts the broker with the jobs' subscription, publishes the batch, waits until every job
/// is done, and shuts the broker down. Answers how long the processing took.
async fn process<A>(
    broker: BrokerHandle<A>,
    args: &Args,
    (counts, progress): (Arc<Counts>, ProgressBar),
) -> Result<Duration, BoxError>
where
    A: TakesRows<JobRow>,
{
    let state = counts.clone();
    let publisher = broker.publisher::<JobRow>();
    // A flaky job's retry waits 10 ms, then 20, 40, .. (a service's default starts at 1 s).
    let retries = RetryPolicy::exponential(Duration::from_millis(10), Duration::from_secs(1));
    let jobs = work
        .workers(args.workers)
        .retry_policy(retries)
        .poll_interval(Duration::from_millis(1))
        .state(counts)
        .state(progress);
    let running = broker
        .start(vec![jobs.into_subscription()], ruststream::exec::current())
        .await?;

    // The whole batch in one publish: all of it is written, or none. The clock starts once it
    // has committed, when the workers can see it.
    let batch = (0..args.jobs)
        .map(|n| {
            let flaky = args.flaky_every > 0 && n % args.flaky_every == 0;
            Ok(Message::json(&Job { n, flaky })?.column("channel", (n % args.keys) as i64))
        })
        .collect::<Result<Vec<_>, ruststream::PublishError>>()?;
    publisher.publish_all(batch).await?;
    let started = Instant::now();
    // Until every job is done: each wakes this wait.
    loop {
        let finished = state.finished.notified();
        if state.done.load(Ordering::SeqCst) >= args.jobs {
            break;
        }
        finished.await;
    }
    let elapsed = started.elapsed();
    running.stop();
    running.drained().await;
    running.shutdown().await;
    Ok(elapsed)
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        // `--help` too: clap prints it, and the usage of a wrong argument.
        Err(error) => error.exit(),
    };
    println!(
        "publishing {} jobs over {} keys into {}, {} workers, advisory lock form",
        args.jobs, args.keys, args.database, args.workers
    );
    match run(args).await {
        Ok(s) => {
            let rate = s.done as f64 / s.elapsed.as_secs_f64();
            println!(
                "processed {} jobs in {:.2?}: {rate:.0} jobs/s",
                s.done, s.elapsed
            );
            println!("attempts: {} ({} jobs retried once)", s.attempts, s.retries);
            println!("rows left in the table: {}", s.rows_left);
            if s.max_per_key <= 1 {
                println!("check: no two jobs of one key were ever in work together");
                std::process::ExitCode::SUCCESS
            } else {
                println!(
                    "check FAILED: {} jobs of one key were in work together",
                    s.max_per_key
                );
                std::process::ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

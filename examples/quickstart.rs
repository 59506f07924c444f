//! The quick start: a batch of jobs over a set of keys, published into a SQLite file under
//! `target/`, processed in the advisory lock form with several workers and a few retries, and a
//! summary at the end: jobs per second, attempts, and a check that no two jobs of one key were
//! ever in work together.
//!
//! ```sh
//! cargo run --release --example quickstart
//! cargo run --release --example quickstart -- --jobs 2000 --keys 20 --workers 4
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use ruststream::{
    Context, Handle, HandlerOutcome, Inbox, InboxContext, InboxQueue, IntoSubscription, Message,
    subscriber,
};
use ruststream_rusqlite::RusqliteBroker;
use ruststream_rusqlite::rusqlite::Connection;
use serde::{Deserialize, Serialize};

/// One row of `quickstart_jobs`, held by a lock on its channel's key while it is in work.
#[derive(Inbox, Deserialize)]
#[inbox(table = "quickstart_jobs", advisory_lock = "quickstart_jobs-{channel}")]
pub struct JobRow {
    #[field(id, generated)]
    id: i64,
    channel: i64,
    #[field(attempt, generated)]
    attempt: i64,
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

const SCHEMA: &str = "
DROP TABLE IF EXISTS quickstart_jobs;
CREATE TABLE quickstart_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel INTEGER NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    payload BLOB NOT NULL
);
";

/// The quick start's settings, from the command line.
#[derive(Clone, Debug)]
pub struct Args {
    /// The SQLite file.
    pub path: PathBuf,
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
    /// Reads `--url`, `--jobs`, `--keys`, `--workers`, `--flaky-every`, `--quiet`.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("target"));
        let mut out = Args {
            path: target.join("quickstart.db"),
            jobs: 10_000,
            keys: 100,
            workers: 8,
            flaky_every: 50,
            progress: true,
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
            match arg.as_str() {
                "--url" => {
                    let url = value("--url")?;
                    out.path = match url.strip_prefix("sqlite:") {
                        Some(path) => PathBuf::from(path.trim_start_matches("//")),
                        None if url.contains("://") => {
                            return Err(format!(
                                "--url {url}: the quick start runs on SQLite (sqlite:PATH); the adapters for PostgreSQL and MySQL are not available yet"
                            ));
                        }
                        None => PathBuf::from(url),
                    };
                }
                "--jobs" => out.jobs = number(&value("--jobs")?, "--jobs")?,
                "--keys" => out.keys = number(&value("--keys")?, "--keys")?.max(1),
                "--workers" => {
                    out.workers = number(&value("--workers")?, "--workers")?.max(1) as usize
                }
                "--flaky-every" => {
                    out.flaky_every = number(&value("--flaky-every")?, "--flaky-every")?
                }
                "--quiet" => out.progress = false,
                other => {
                    return Err(format!(
                        "unknown argument {other}; try --jobs N --keys K --workers W --url sqlite:PATH"
                    ));
                }
            }
        }
        Ok(out)
    }
}

fn number(text: &str, name: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| format!("{name} {text}: not a number"))
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

#[derive(Default)]
struct State {
    in_work: Mutex<HashMap<i64, usize>>,
    max_per_key: AtomicUsize,
    done: AtomicU64,
    attempts: AtomicU64,
    retries: AtomicU64,
}

/// Counts the jobs of each key in work, fails a flaky job's first attempt.
struct Worker {
    state: Arc<State>,
    progress: ProgressBar,
}

impl Handle<Job, (), (), InboxContext> for Worker {
    async fn handle(
        &self,
        job: &Job,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let info = ctx.kind().info();
        let key: i64 = info
            .key
            .as_deref()
            .and_then(|k| k.rsplit('-').next())
            .and_then(|k| k.parse().ok())
            .unwrap_or(-1);
        let attempt = info.attempt.unwrap_or(1);
        {
            let mut in_work = self.state.in_work.lock().expect("not poisoned");
            let n = in_work.entry(key).or_default();
            *n += 1;
            self.state.max_per_key.fetch_max(*n, Ordering::SeqCst);
        }
        // The work itself.
        tokio::task::yield_now().await;
        self.state
            .in_work
            .lock()
            .expect("not poisoned")
            .entry(key)
            .and_modify(|n| *n -= 1);
        self.state.attempts.fetch_add(1, Ordering::SeqCst);
        if job.flaky && attempt == 1 {
            self.state.retries.fetch_add(1, Ordering::SeqCst);
            return Err(HandlerOutcome::retry());
        }
        self.state.done.fetch_add(1, Ordering::SeqCst);
        self.progress.inc(1);
        Ok(())
    }
}

/// Runs the quick start.
pub async fn run(args: Args) -> Result<Summary, Box<dyn std::error::Error + Send + Sync>> {
    if let Some(dir) = args.path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut file = args.path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
    Connection::open(&args.path)?.execute_batch(SCHEMA)?;

    let progress = if args.progress {
        let bar = ProgressBar::new(args.jobs);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {bar:40} {pos}/{len} jobs  {per_sec}  {elapsed}",
            )
            .expect("a valid template"),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let state = Arc::new(State::default());
    let broker = RusqliteBroker::open(&args.path).handle();
    let publisher = broker.publisher::<JobRow>();
    let worker = Worker {
        state: state.clone(),
        progress: progress.clone(),
    };
    let jobs = subscriber("jobs", worker)
        .map_source(|_| InboxQueue::<JobRow>::new("jobs"))
        .workers(std::num::NonZeroUsize::new(args.workers).expect("at least one worker"))
        .poll_interval(Duration::from_millis(1));
    let running = broker
        .start(vec![jobs.into_subscription()], ruststream::exec::current())
        .await?;

    let started = Instant::now();
    for n in 0..args.jobs {
        let flaky = args.flaky_every > 0 && n % args.flaky_every == 0;
        let message = Message::json(&Job { n, flaky })?.column("channel", (n % args.keys) as i64);
        publisher.publish(message).await?;
    }
    while state.done.load(Ordering::SeqCst) < args.jobs {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    progress.finish();
    running.stop();
    running.drained().await;
    running.shutdown().await;

    let rows_left: i64 = Connection::open(&args.path)?.query_row(
        "SELECT COUNT(*) FROM quickstart_jobs",
        [],
        |r| r.get(0),
    )?;
    Ok(Summary {
        done: state.done.load(Ordering::SeqCst),
        attempts: state.attempts.load(Ordering::SeqCst),
        retries: state.retries.load(Ordering::SeqCst),
        max_per_key: state.max_per_key.load(Ordering::SeqCst),
        rows_left,
        elapsed,
    })
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("error: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    println!(
        "publishing {} jobs over {} keys into {}, {} workers, advisory lock form",
        args.jobs,
        args.keys,
        args.path.display(),
        args.workers
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

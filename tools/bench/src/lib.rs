//! The ruststream benchmark: one form on one database through one adapter, beside a raw SQL
//! baseline that runs the same statements on the same driver.
//!
//! ```sh
//! cargo run --release -p ruststream-bench -- --adapter sqlx \
//!     --url postgres://postgres@127.0.0.1:5432/test --form lease --jobs 2000 --workers 4
//! ```
//!
//! Each round runs the baseline, then ruststream, on a table `bench_jobs_<form>` dropped,
//! created and filled anew before each run: the whole backlog is published first (multi-row
//! inserts of 200, each payload carrying its insert time), then the service or the loop
//! starts. So the pickup latency (publish to handler start) is mostly the time a job waited in
//! the backlog: it grows with `--jobs` and falls with throughput. The settle latency is from
//! the handler's end to the row settled (the settle statement's reply; in the row lock form the
//! commit after it).
//!
//! Every run prints a line and writes one JSON line (to stdout, or appended to `--json
//! FILE`); the last line is the summary, with the median of the rounds' ratios
//! ruststream/baseline in jobs per second.
//!
//! Scaling out (`tools/bench/measure-scale.sh`, tools/bench/src/scale.rs):
//!
//! - `--processes N` (1): the ruststream side runs as N child processes of the bench's own
//!   binary on the one table, each a service with W workers; the parent fills the table once,
//!   starts them together, ends the run when their settled rows add up to the run's, stops
//!   them (each shuts its service down and exits) and reports the summed rate, rows over the
//!   time from their start to the last settlement of any of them, with each one's rows in
//!   `per_process_jobs`. The latencies are the children's samples merged; the peak connections
//!   the sum of each child's peak; the peak memory the largest child's. The baseline runs N×W
//!   tasks, each with its connection, in the parent: the database's rate at that concurrency.
//!   With N = 1 the service runs in the bench's own process, as without the option.
//! - `--hot-keys H --hot-ms MS` (advisory form): the rows of the first H keys (`bench-0` ..)
//!   take MS in the handler, the others `--handler-ms`, on both sides.
//! - `--held-keys H` (advisory form, PostgreSQL and MySQL/MariaDB): a session of the bench's
//!   own holds the locks of the last H keys (`bench-{K-H}` .. `bench-{K-1}`) through each run of
//!   both sides: on PostgreSQL `pg_try_advisory_lock` on the core's 64-bit hash of the key, on
//!   MySQL/MariaDB `GET_LOCK` on the core's lock name. The keys are `n % K` in insert order, so
//!   the held keys' rows lie through the table as the others' do. A run ends when the other
//!   keys' rows are settled, and its rate counts those rows (`settled_jobs`); after it, only
//!   the held keys' rows may be left in the table.
//!
//! In the advisory form every run checks the order of each key's rows
//! (tools/bench/src/order.rs): each handler's start and end are recorded by key, in every
//! process, and a run fails, naming the key and the two rows, if a key's rows started out of id
//! order or two of them were in work at once; its JSON line then says `order_checked: true`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// Builds the broker of `$config`'s adapter on its database, with a pool of `$n` connections,
/// as `$make`, a closure that builds a new one on each call, and evaluates `$server` (on
/// PostgreSQL and MySQL/MariaDB) or `$sqlite` (on SQLite, which takes no row lock form) with
/// it. The one place that sizes each driver's pool: the mysql-async pool keeps `pool_min =
/// pool_max`, since mysql_async closes every connection given back beyond `pool_min`.
macro_rules! with_broker {
    ($config:expr, $n:expr, |$make:ident| $server:expr, $sqlite:expr) => {{
        use ruststream_mysql_async::MySqlAsyncBroker;
        use ruststream_sqlx::SqlxBroker;
        use ruststream_tokio_postgres::TokioPostgresBroker;
        use ruststream_tokio_postgres::deadpool_postgres::PoolConfig;
        use $crate::{AdapterKind, Database};

        let n: usize = $n;
        match ($config.adapter, &$config.database) {
            (AdapterKind::Sqlx, Database::Postgres(url)) => {
                let $make = || {
                    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(n as u32);
                    SqlxBroker::from_url(url.clone(), pool)
                };
                $server
            }
            (AdapterKind::Sqlx, Database::MySql(url)) => {
                let $make = || {
                    let pool = sqlx::mysql::MySqlPoolOptions::new().max_connections(n as u32);
                    SqlxBroker::from_url(url.clone(), pool)
                };
                $server
            }
            (AdapterKind::Sqlx, Database::Sqlite(path)) => {
                let $make = || {
                    let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(n as u32);
                    SqlxBroker::from_connect_options($crate::drivers::sqlite_options(path), pool)
                };
                $sqlite
            }
            (AdapterKind::Rusqlite, Database::Sqlite(path)) => {
                let $make = || $crate::drivers::rusqlite_broker(path, n);
                $sqlite
            }
            (AdapterKind::TokioPostgres, Database::Postgres(url)) => {
                let $make = || TokioPostgresBroker::from_url(url.clone(), PoolConfig::new(n));
                $server
            }
            (AdapterKind::MysqlAsync, Database::MySql(url)) => {
                let sep = if url.contains('?') { '&' } else { '?' };
                let url = format!("{url}{sep}pool_min={n}&pool_max={n}");
                let $make = || MySqlAsyncBroker::from_url(url.clone());
                $server
            }
            (adapter, database) => Err(format!(
                "--adapter {} does not run on {}",
                adapter.name(),
                database.family()
            )
            .into()),
        }
    }};
}

mod baseline;
mod drivers;
mod framework;
mod graphile;
mod growth;
mod limit;
mod order;
mod peer;
mod publish;
mod scale;
mod stats;
mod timeline;
mod wakeup;

pub use timeline::Sample;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ruststream::InboxTable;
use ruststream::core::spec::Described;
use ruststream::core::{Dialect, Form, Statements, TableDesc, Value};
use serde::Serialize;

pub use framework::{AdvisoryJob, LeaseJob, RowLockJob};
pub use growth::{GrowthRecord, run_growth};
pub use peer::{PeerKind, PeerSummary};
pub use publish::{PublishJob, PublishRecord, PublishSummary, run_publish};
pub use stats::{Job, now_us};

use baseline::{RawConn, Shared};
use stats::{Stats, median, quantile_ms};

/// An error of the benchmark.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The adapter under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdapterKind {
    /// `ruststream-sqlx`, on PostgreSQL, MySQL/MariaDB or SQLite.
    Sqlx,
    /// `ruststream-rusqlite`, on SQLite.
    Rusqlite,
    /// `ruststream-tokio-postgres`, on PostgreSQL.
    TokioPostgres,
    /// `ruststream-mysql-async`, on MySQL/MariaDB.
    MysqlAsync,
}

impl AdapterKind {
    /// The name `--adapter` takes.
    pub fn name(self) -> &'static str {
        match self {
            AdapterKind::Sqlx => "sqlx",
            AdapterKind::Rusqlite => "rusqlite",
            AdapterKind::TokioPostgres => "tokio-postgres",
            AdapterKind::MysqlAsync => "mysql-async",
        }
    }
}

/// The database a `--url` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Database {
    /// `postgres://..`.
    Postgres(String),
    /// `mysql://..` (MySQL or MariaDB).
    MySql(String),
    /// `sqlite:PATH`.
    Sqlite(PathBuf),
}

impl Database {
    /// The database of a URL: `postgres://`, `postgresql://`, `mysql://`, `sqlite:PATH`.
    pub fn from_url(url: &str) -> Result<Self, String> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Database::Postgres(url.to_owned()))
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            Ok(Database::MySql(url.replacen("mariadb://", "mysql://", 1)))
        } else if let Some(path) = url.strip_prefix("sqlite:") {
            Ok(Database::Sqlite(PathBuf::from(
                path.trim_start_matches("//"),
            )))
        } else {
            Err(format!(
                "--url {url}: expected postgres://.., mysql://.. or sqlite:PATH"
            ))
        }
    }

    fn family(&self) -> &'static str {
        match self {
            Database::Postgres(_) => "PostgreSQL",
            Database::MySql(_) => "MySQL/MariaDB",
            Database::Sqlite(_) => "SQLite",
        }
    }
}

/// What an invocation measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Throughput of a form beside the raw SQL loop (the default).
    Claim,
    /// The claim's latency as the table grows, most rows not yet due
    /// (`tools/bench/src/growth.rs`).
    Growth,
    /// Rows published per second through ruststream's `Publisher` beside raw inserts
    /// (`tools/bench/src/publish.rs`).
    Publish,
    /// Publish to handler start with a one-second poll interval, from the subscription's own
    /// broker and from another (`tools/bench/src/wakeup.rs`).
    Wakeup,
}

/// A run's settings, from the command line.
#[derive(Clone, Debug)]
pub struct Config {
    /// What the invocation measures: `--scenario claim|growth|publish`.
    pub scenario: Scenario,
    /// The adapter.
    pub adapter: AdapterKind,
    /// The database.
    pub database: Database,
    /// The form.
    pub form: Form,
    /// Growth: the forms to measure (`--form` takes a list there; default: every form the
    /// database has). Claim: the one form.
    pub forms: Vec<Form>,
    /// Growth: the table sizes, in rows (`--rows 10000,1000000`).
    pub rows: Vec<u64>,
    /// Growth: how many of the rows are due (`--due`, 1000); the others are due a day later.
    pub due: u64,
    /// Growth: the claims timed per size and form (`--claims`, 200).
    pub claims: usize,
    /// Growth: whether the table gets the claim's index on `(due_at, id)` (`--index due`, the
    /// default) or none (`--index none`).
    pub index: bool,
    /// Publish: the publishers in flight at once (`--concurrency 1,4,16`).
    pub concurrency: Vec<usize>,
    /// Publish: the rows of one batched insert (`--batch`, 100).
    pub batch: usize,
    /// Publish: the rows of each batched run (`--batch-jobs`, 20000).
    pub batch_jobs: u64,
    /// Jobs per run.
    pub jobs: u64,
    /// Workers (ruststream's `workers(W)`; the baseline's tasks and connections).
    pub workers: usize,
    /// Distinct advisory keys over the jobs.
    pub keys: u64,
    /// How long each handler works, in milliseconds (0: it yields once).
    pub handler_ms: u64,
    /// Rows ruststream claims ahead beyond the workers (`--prefetch`, 0).
    pub prefetch: usize,
    /// Rounds of (baseline, ruststream).
    pub rounds: usize,
    /// Where the JSON lines go; stdout when `None`.
    pub json: Option<PathBuf>,
    /// Show progress bars (on stderr, when it is a terminal).
    pub progress: bool,
    /// Skip the baseline (ruststream only).
    pub no_baseline: bool,
    /// A queue library run beside ruststream in each round (`--peer apalis`; PostgreSQL).
    pub peer: Option<PeerKind>,
    /// Claim: the processes the ruststream side runs as, each a service with W workers on the
    /// one table (`--processes N`, 1); the baseline runs N×W tasks.
    pub processes: usize,
    /// PostgreSQL: a transaction of the bench's own holds an xid (`BEGIN; SELECT
    /// txid_current()`) through the whole invocation, so vacuum removes none of the rows the
    /// runs settle (`--hold-xmin`).
    pub hold_xmin: bool,
    /// Run every side on tokio's current-thread runtime instead of its multi-thread one
    /// (`--runtime current`; `--runtime multi` is the default).
    pub current_thread: bool,
    /// Print each run's timeline in one line on stderr (`--timeline`); the JSON line has
    /// every sample either way.
    pub timeline: bool,
    /// SQLite: `PRAGMA synchronous = NORMAL` on every connection of every side
    /// (`--sqlite-synchronous normal`; default `full`, SQLite's own).
    pub sqlite_normal: bool,
    /// Advisory form: the first keys whose rows take `hot_ms` in the handler (`--hot-keys H`).
    pub hot_keys: u64,
    /// How long a hot key's row takes in the handler, in milliseconds (`--hot-ms MS`).
    pub hot_ms: u64,
    /// Advisory form: the last keys a session of the bench's own holds through each run
    /// (`--held-keys H`).
    pub held_keys: u64,
    /// The wake-up scenario: rows inserted and deleted before the samples, after
    /// `--hold-xmin`'s transaction began, so their index entries stay at the head of the
    /// table's index (`--dead N`).
    pub dead: u64,
    /// The arguments as given (without the program's name): a child process gets them again.
    pub args: Vec<String>,
    /// The command line, as `cargo run --release -p ruststream-bench -- ..`.
    pub command: String,
}

const USAGE: &str = "usage: ruststream-bench --adapter sqlx|rusqlite|tokio-postgres|mysql-async \
--url postgres://..|mysql://..|sqlite:PATH --form row-lock|lease|advisory [--jobs N] \
[--workers W] [--keys K] [--handler-ms MS] [--prefetch N] [--rounds R] [--json FILE] [--quiet] [--no-baseline] [--peer apalis[:N]] \
[--processes N] [--hot-keys H --hot-ms MS] [--held-keys H] [--sqlite-synchronous normal|full] [--hold-xmin] [--timeline] [--runtime multi|current]
       ruststream-bench --scenario growth --adapter A --url URL [--form F,F,..] \
[--rows N,N,..] [--due D] [--claims C] [--index due|none] [--workers W] [--json FILE] [--quiet]
       ruststream-bench --scenario publish --adapter A --url URL [--jobs N] \
[--concurrency C,C,..] [--batch B] [--batch-jobs N] [--keys K] [--rounds R] [--json FILE] [--quiet]
       ruststream-bench --scenario wakeup --adapter A --url URL [--form F,F,..] [--jobs N] \
[--workers W] [--hold-xmin [--dead N]] [--json FILE] [--quiet]

--processes N: the ruststream side as N child processes on the one table, each with W
  workers, their rates summed; the baseline runs N×W tasks (default 1: in this process).
--hot-keys H --hot-ms MS (advisory): the rows of the first H keys take MS in the handler.
--held-keys H (advisory, PostgreSQL and MySQL/MariaDB): a session of the bench's own holds
  the locks of the last H keys through each run; the rate counts the other keys' rows.
--sqlite-synchronous normal: SQLite's connections on every side commit without waiting for
  the disk (WAL with synchronous NORMAL; default full, SQLite's own).
--hold-xmin (PostgreSQL): a transaction holds an xid through the whole invocation (BEGIN;
  SELECT txid_current()), so vacuum cannot remove the rows the claims leave behind.
--dead N (wakeup, with --hold-xmin): N rows inserted and deleted once the transaction holds
  its xid, so each table's index starts with N entries no scan can pass over for free.
--runtime current: every side runs on tokio's current-thread runtime (default multi: tokio's
  multi-thread runtime, a worker thread a CPU).
--timeline: prints each run's rate, claim p99 and (PostgreSQL) dead tuples over time; the
  JSON lines hold each second's sample either way.
Advisory runs check each key's order: rows start in id order, one at a time.";

impl Config {
    /// Reads the command line (without the program's name).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let mut adapter = None;
        let mut url = None;
        let mut forms: Option<Vec<Form>> = None;
        let mut config = Config {
            scenario: Scenario::Claim,
            adapter: AdapterKind::Sqlx,
            database: Database::Sqlite(PathBuf::new()),
            form: Form::Lease,
            forms: Vec::new(),
            rows: vec![10_000, 1_000_000],
            due: 1000,
            claims: 200,
            index: true,
            concurrency: vec![1, 4, 16],
            batch: 100,
            batch_jobs: 20_000,
            jobs: 2000,
            workers: 4,
            keys: 100,
            handler_ms: 0,
            prefetch: 0,
            rounds: 3,
            json: None,
            progress: true,
            no_baseline: false,
            peer: None,
            processes: 1,
            sqlite_normal: false,
            hold_xmin: false,
            dead: 0,
            timeline: false,
            current_thread: false,
            hot_keys: 0,
            hot_ms: 0,
            held_keys: 0,
            args: Vec::new(),
            command: String::new(),
        };
        let args: Vec<String> = args.into_iter().collect();
        config.command = format!(
            "cargo run --release -p ruststream-bench -- {}",
            args.join(" ")
        );
        config.args = args.clone();
        let mut hot_ms = None;
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
            match arg.as_str() {
                "--scenario" => {
                    config.scenario = match value("--scenario")?.as_str() {
                        "claim" => Scenario::Claim,
                        "growth" => Scenario::Growth,
                        "publish" => Scenario::Publish,
                        "wakeup" => Scenario::Wakeup,
                        other => return Err(format!("--scenario {other}: unknown\n{USAGE}")),
                    }
                }
                "--rows" => config.rows = numbers(&value("--rows")?, "--rows")?,
                "--due" => config.due = number(&value("--due")?, "--due")?.max(1),
                "--claims" => {
                    config.claims = number(&value("--claims")?, "--claims")?.max(1) as usize
                }
                "--index" => {
                    config.index = match value("--index")?.as_str() {
                        "due" => true,
                        "none" => false,
                        other => return Err(format!("--index {other}: due or none\n{USAGE}")),
                    }
                }
                "--concurrency" => {
                    config.concurrency = numbers(&value("--concurrency")?, "--concurrency")?
                        .into_iter()
                        .map(|c| c.max(1) as usize)
                        .collect()
                }
                "--batch" => config.batch = number(&value("--batch")?, "--batch")?.max(1) as usize,
                "--batch-jobs" => {
                    config.batch_jobs = number(&value("--batch-jobs")?, "--batch-jobs")?.max(1)
                }
                "--adapter" => {
                    adapter = Some(match value("--adapter")?.as_str() {
                        "sqlx" => AdapterKind::Sqlx,
                        "rusqlite" => AdapterKind::Rusqlite,
                        "tokio-postgres" => AdapterKind::TokioPostgres,
                        "mysql-async" => AdapterKind::MysqlAsync,
                        other => return Err(format!("--adapter {other}: unknown\n{USAGE}")),
                    })
                }
                "--url" => url = Some(value("--url")?),
                "--form" => {
                    let mut list = Vec::new();
                    for name in value("--form")?.split(',') {
                        list.push(match name {
                            "row-lock" | "row_lock" => Form::RowLock,
                            "lease" => Form::Lease,
                            "advisory" => Form::Advisory,
                            other => return Err(format!("--form {other}: unknown\n{USAGE}")),
                        });
                    }
                    forms = Some(list);
                }
                "--jobs" => config.jobs = number(&value("--jobs")?, "--jobs")?.max(1),
                "--workers" => {
                    config.workers = number(&value("--workers")?, "--workers")?.max(1) as usize
                }
                "--keys" => config.keys = number(&value("--keys")?, "--keys")?.max(1),
                "--prefetch" => {
                    config.prefetch = number(&value("--prefetch")?, "--prefetch")? as usize
                }
                "--handler-ms" => {
                    config.handler_ms = number(&value("--handler-ms")?, "--handler-ms")?
                }
                "--rounds" => {
                    config.rounds = number(&value("--rounds")?, "--rounds")?.max(1) as usize
                }
                "--json" => config.json = Some(PathBuf::from(value("--json")?)),
                "--quiet" => config.progress = false,
                "--no-baseline" => config.no_baseline = true,
                "--hold-xmin" => config.hold_xmin = true,
                "--dead" => config.dead = number(&value("--dead")?, "--dead")?,
                "--timeline" => config.timeline = true,
                "--runtime" => {
                    config.current_thread = match value("--runtime")?.as_str() {
                        "current" => true,
                        "multi" => false,
                        other => {
                            return Err(format!("--runtime takes current or multi, not `{other}`"));
                        }
                    }
                }
                "--sqlite-synchronous" => {
                    config.sqlite_normal = match value("--sqlite-synchronous")?.as_str() {
                        "normal" => true,
                        "full" => false,
                        other => {
                            return Err(format!(
                                "--sqlite-synchronous takes normal or full, not `{other}`"
                            ));
                        }
                    }
                }
                "--peer" => config.peer = Some(PeerKind::from_name(&value("--peer")?)?),
                "--processes" => {
                    config.processes =
                        number(&value("--processes")?, "--processes")?.max(1) as usize
                }
                "--hot-keys" => config.hot_keys = number(&value("--hot-keys")?, "--hot-keys")?,
                "--hot-ms" => hot_ms = Some(number(&value("--hot-ms")?, "--hot-ms")?),
                "--held-keys" => config.held_keys = number(&value("--held-keys")?, "--held-keys")?,
                "--help" | "-h" => return Err(USAGE.to_owned()),
                other => return Err(format!("unknown argument {other}\n{USAGE}")),
            }
        }
        config.adapter = adapter.ok_or_else(|| format!("--adapter is needed\n{USAGE}"))?;
        let url = match url {
            Some(url) => url,
            None => default_url(config.adapter),
        };
        config.database = Database::from_url(&url)?;
        let fits = matches!(
            (config.adapter, &config.database),
            (AdapterKind::Sqlx, _)
                | (AdapterKind::Rusqlite, Database::Sqlite(_))
                | (AdapterKind::TokioPostgres, Database::Postgres(_))
                | (AdapterKind::MysqlAsync, Database::MySql(_))
        );
        if !fits {
            return Err(format!(
                "--adapter {} does not run on {}",
                config.adapter.name(),
                config.database.family()
            ));
        }
        let sqlite = matches!(config.database, Database::Sqlite(_));
        config.forms = match (config.scenario, forms) {
            (Scenario::Claim, Some(list)) if list.len() == 1 => list,
            (Scenario::Claim, Some(_)) => {
                return Err(format!("--form takes one form in this scenario\n{USAGE}"));
            }
            (Scenario::Claim, None) => return Err(format!("--form is needed\n{USAGE}")),
            (_, Some(list)) => list,
            (_, None) if sqlite => vec![Form::Lease, Form::Advisory],
            (_, None) => vec![Form::RowLock, Form::Lease, Form::Advisory],
        };
        config.form = config.forms[0];
        if sqlite && config.forms.contains(&Form::RowLock) {
            return Err("SQLite has no row locks: --form lease or advisory".to_owned());
        }
        if config.rows.is_empty() || config.concurrency.is_empty() {
            return Err(format!("--rows and --concurrency need a number\n{USAGE}"));
        }
        peer::check(&config)?;
        config.hot_ms = match (config.hot_keys, hot_ms) {
            (0, None) => 0,
            (0, Some(_)) => return Err(format!("--hot-ms needs --hot-keys\n{USAGE}")),
            (_, Some(ms)) => ms,
            (_, None) => return Err(format!("--hot-keys needs --hot-ms\n{USAGE}")),
        };
        config.check_scale()?;
        Ok(config)
    }

    /// The rules of `--processes`, `--hot-keys` and `--held-keys`.
    fn check_scale(&self) -> Result<(), String> {
        let keyed = self.hot_keys > 0 || self.held_keys > 0;
        if (self.processes > 1 || keyed) && self.scenario != Scenario::Claim {
            return Err("--processes, --hot-keys and --held-keys measure the claim".to_owned());
        }
        if keyed && self.form != Form::Advisory {
            return Err("--hot-keys and --held-keys need --form advisory".to_owned());
        }
        let sqlite = matches!(self.database, Database::Sqlite(_));
        if self.processes > 1 && sqlite && self.form == Form::Advisory {
            return Err(
                "SQLite's advisory form keeps its keys in the process: one process serves a database file, --processes 1"
                    .to_owned(),
            );
        }
        if (self.processes > 1 || keyed) && self.peer.is_some() {
            return Err(
                "--peer runs in one process with no hot or held keys: leave --processes, --hot-keys and --held-keys out"
                    .to_owned(),
            );
        }
        if self.held_keys > 0 && sqlite {
            return Err("--held-keys: SQLite has no locks a session holds".to_owned());
        }
        if self.held_keys >= self.keys {
            return Err(format!(
                "--held-keys {} leaves no key free of --keys {}",
                self.held_keys, self.keys
            ));
        }
        if self.hot_keys + self.held_keys > self.keys {
            return Err(format!(
                "--hot-keys {} and --held-keys {} are more than --keys {}",
                self.hot_keys, self.held_keys, self.keys
            ));
        }
        if self.target() == 0 {
            return Err("--jobs: no row of a free key to settle".to_owned());
        }
        Ok(())
    }

    /// How long each handler works.
    pub(crate) fn work(&self) -> Work {
        Work {
            handler_ms: self.handler_ms,
            hot_keys: self.hot_keys,
            hot_ms: self.hot_ms,
        }
    }

    /// The key of row `n` (from 0, in insert order): `n % K`.
    fn key_of(&self, n: u64) -> u64 {
        n % self.keys.max(1)
    }

    /// Whether key `k` is held through the run: the last `held_keys` keys.
    fn held(&self, k: u64) -> bool {
        k >= self.keys.saturating_sub(self.held_keys)
    }

    /// The rows of the held keys.
    pub(crate) fn held_rows(&self) -> u64 {
        if self.held_keys == 0 {
            return 0;
        }
        (0..self.jobs)
            .filter(|&n| self.held(self.key_of(n)))
            .count() as u64
    }

    /// The rows a run settles: every job but the held keys' rows.
    pub(crate) fn target(&self) -> u64 {
        self.jobs - self.held_rows()
    }

    /// The held keys' text, as the table's key template renders it.
    pub(crate) fn held_key_names(&self) -> Vec<String> {
        (self.keys - self.held_keys.min(self.keys)..self.keys)
            .map(|k| format!("bench-{k}"))
            .collect()
    }

    /// The baseline's tasks: W for each process of the ruststream side.
    fn baseline_tasks(&self) -> usize {
        self.workers * self.processes
    }

    fn table(&self) -> TableDesc {
        match self.form {
            Form::RowLock => *RowLockJob::TABLE.table_desc(),
            Form::Lease => *LeaseJob::TABLE.table_desc(),
            Form::Advisory => *AdvisoryJob::TABLE.table_desc(),
        }
    }

    fn form_name(&self) -> &'static str {
        match self.form {
            Form::RowLock => "row-lock",
            Form::Lease => "lease",
            Form::Advisory => "advisory",
        }
    }

    /// The pool size ruststream gets: a connection per worker, one for claims, one spare, and
    /// in the row lock and advisory forms one per row claimed ahead (each holds one).
    fn pool_size(&self) -> usize {
        let ahead = match self.form {
            Form::Lease => 0,
            Form::RowLock | Form::Advisory => self.prefetch,
        };
        self.workers + ahead + 2
    }
}

fn default_url(adapter: AdapterKind) -> String {
    let pg = || {
        std::env::var("RUSTSTREAM_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
    };
    let my = || {
        std::env::var("RUSTSTREAM_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
    };
    match adapter {
        AdapterKind::Sqlx | AdapterKind::TokioPostgres => pg(),
        AdapterKind::MysqlAsync => my(),
        AdapterKind::Rusqlite => {
            let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
            format!("sqlite:{target}/bench.db")
        }
    }
}

fn number(text: &str, name: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| format!("{name} {text}: not a number"))
}

/// A comma-separated list of numbers: `10000,1000000`.
fn numbers(text: &str, name: &str) -> Result<Vec<u64>, String> {
    text.split(',')
        .filter(|part| !part.is_empty())
        .map(|part| number(part, name))
        .collect()
}

/// How long a handler works: `--handler-ms`, or `--hot-ms` on a row of the first
/// `--hot-keys` keys.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Work {
    pub(crate) handler_ms: u64,
    pub(crate) hot_keys: u64,
    pub(crate) hot_ms: u64,
}

impl Work {
    /// The milliseconds of a row of `key` (`bench-{k}`).
    pub(crate) fn ms(&self, key: Option<&str>) -> u64 {
        let k = key
            .and_then(|key| key.strip_prefix("bench-"))
            .and_then(|k| k.parse::<u64>().ok());
        match k {
            Some(k) if k < self.hot_keys => self.hot_ms,
            _ => self.handler_ms,
        }
    }
}

/// The handler's work: a sleep of `ms`, or one yield.
pub(crate) async fn work(ms: u64) {
    if ms == 0 {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// Waits until `jobs` rows are settled; fails after 60 s without a settlement.
pub(crate) async fn wait_settled(stats: &Stats, jobs: u64) -> Result<(), BoxError> {
    while stats.settled() < jobs {
        if stats.idle() > Duration::from_secs(60) {
            return Err(format!(
                "no settlement for 60 s: {} of {jobs} settled",
                stats.settled()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// One run's results, as its JSON line writes them.
#[derive(Clone, Debug, Serialize)]
pub struct RunRecord {
    /// `"run"`.
    pub kind: &'static str,
    /// `"baseline"`, `"ruststream"`, or the peer (`"apalis"`).
    pub implementation: &'static str,
    /// The round, from 1.
    pub round: usize,
    /// The adapter (the baseline runs on the same driver).
    pub adapter: &'static str,
    /// The database as the baseline's dialect names it.
    pub database: &'static str,
    /// The form.
    pub form: &'static str,
    /// The jobs.
    pub jobs: u64,
    /// The workers.
    pub workers: usize,
    /// The advisory keys.
    pub keys: u64,
    /// The handler's work in milliseconds.
    pub handler_ms: u64,
    /// Rows ruststream claims ahead beyond the workers.
    pub prefetch: usize,
    /// `--processes`: the processes of the ruststream side (the baseline runs `processes` ×
    /// `workers` tasks in one process).
    pub processes: usize,
    /// ruststream: the rows each process settled; `null` for the baseline and the peer.
    pub per_process_jobs: Option<Vec<u64>>,
    /// `--hot-keys`: the first keys whose rows take `hot_ms`.
    pub hot_keys: u64,
    /// `--hot-ms`.
    pub hot_ms: u64,
    /// `--held-keys`: the last keys a session of the bench's own held through the run.
    pub held_keys: u64,
    /// The rows the run settled and its rate counts: the jobs but the held keys' rows.
    pub settled_jobs: u64,
    /// Whether the run checked each key's rows started in id order, one at a time (the
    /// advisory form).
    pub order_checked: bool,
    /// Start to the last settlement, in seconds.
    pub elapsed_s: f64,
    /// Rows settled per second (`settled_jobs / elapsed_s`).
    pub jobs_per_s: f64,
    /// Publish (insert, before the run) to handler start: median, ms.
    pub pickup_p50_ms: Option<f64>,
    /// Publish to handler start: 99th percentile, ms.
    pub pickup_p99_ms: Option<f64>,
    /// The claim statements (those that find or take rows; tools/bench/src/timeline.rs) from
    /// issue to reply: median, ms (`null` where the side's statements are not seen: the peer,
    /// several processes).
    pub claim_p50_ms: Option<f64>,
    /// The claim statements: 99th percentile, ms.
    pub claim_p99_ms: Option<f64>,
    /// Each second of the run: rows settled, the claims' latency, on PostgreSQL the table's
    /// dead and live tuples.
    pub timeline: Vec<Sample>,
    /// Handler end to row settled: median, ms.
    pub settle_p50_ms: Option<f64>,
    /// Handler end to row settled: 99th percentile, ms.
    pub settle_p99_ms: Option<f64>,
    /// The most connections held at once (ruststream: counted from the adapter's acquire and
    /// release commands, with several processes the sum of each one's most; baseline: its
    /// open connections).
    pub peak_connections: i64,
    /// `VmHWM` after the run, KiB (reset before the run when the kernel allows it); with
    /// several processes, the largest child's.
    pub peak_memory_kib: Option<u64>,
    /// Whether `VmHWM` was reset before the run (else it is the process's peak so far); a
    /// child process's is its own run's.
    pub peak_memory_reset: bool,
    /// Statements executed per job (ruststream: every statement the core sent, checks
    /// included; pool acquire/release not counted).
    pub statements_per_job: f64,
    /// Statements and pool operations, by kind.
    pub statements: BTreeMap<String, u64>,
    /// The mean time from issuing a statement (or pool operation) to its reply, by kind,
    /// microseconds (ruststream: from the adapter's `execute` to its reply).
    pub statement_mean_us: BTreeMap<String, u64>,
    /// The bench process's CPU time (user and system) per settled job, microseconds: the
    /// client's cost of a job, the side's own and its driver's (a run in child processes,
    /// `--processes`, counts only the parent's).
    pub client_cpu_us_per_job: Option<f64>,
    /// The share of the machine's CPU time that was busy during the run, every process (the
    /// database's) included: 1.0 is every core busy.
    pub machine_busy: Option<f64>,
    /// When the run ended, UTC.
    pub date: String,
    /// The machine's CPUs.
    pub cpus: usize,
    /// The 1-minute load average when the run ended.
    pub load1: Option<f64>,
}

/// The summary line of an invocation.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// `"summary"`.
    pub kind: &'static str,
    /// The adapter.
    pub adapter: &'static str,
    /// The database.
    pub database: &'static str,
    /// The form.
    pub form: &'static str,
    /// The jobs per run.
    pub jobs: u64,
    /// The workers.
    pub workers: usize,
    /// The advisory keys.
    pub keys: u64,
    /// The handler's work in milliseconds.
    pub handler_ms: u64,
    /// Rows ruststream claims ahead beyond the workers.
    pub prefetch: usize,
    /// The rounds.
    pub rounds: usize,
    /// `--processes`.
    pub processes: usize,
    /// `--hot-keys`.
    pub hot_keys: u64,
    /// `--hot-ms`.
    pub hot_ms: u64,
    /// `--held-keys`.
    pub held_keys: u64,
    /// The rows each run settled: the jobs but the held keys' rows.
    pub settled_jobs: u64,
    /// Whether every run of the invocation checked the order of each key's rows.
    pub order_checked: bool,
    /// ruststream's jobs per second, median over the rounds.
    pub ruststream_jobs_per_s: Option<f64>,
    /// The baseline's jobs per second, median over the rounds.
    pub baseline_jobs_per_s: Option<f64>,
    /// Each round's ratio ruststream/baseline.
    pub ratios: Vec<f64>,
    /// The median of the ratios.
    pub ratio_median: Option<f64>,
    /// The limit loop's jobs per second, median over the rounds.
    pub limit_jobs_per_s: Option<f64>,
    /// The median of each round's ratio ruststream/limit.
    pub limit_ratio_median: Option<f64>,
    /// The limit loop's statements per job, last round.
    pub limit_statements_per_job: Option<f64>,
    /// ruststream's pickup p50 and p99, medians over the rounds, ms.
    pub ruststream_pickup_p50_ms: Option<f64>,
    /// See `ruststream_pickup_p50_ms`.
    pub ruststream_pickup_p99_ms: Option<f64>,
    /// The baseline's pickup p50 and p99, medians over the rounds, ms.
    pub baseline_pickup_p50_ms: Option<f64>,
    /// See `baseline_pickup_p50_ms`.
    pub baseline_pickup_p99_ms: Option<f64>,
    /// ruststream's statements per job, last round.
    pub ruststream_statements_per_job: Option<f64>,
    /// The baseline's statements per job, last round.
    pub baseline_statements_per_job: Option<f64>,
    /// The command that produced this line.
    pub command: String,
    /// When the invocation ended, UTC.
    pub date: String,
    /// The machine's CPUs.
    pub cpus: usize,
    /// The 1-minute load average at the end.
    pub load1: Option<f64>,
    /// With `--peer`: the peer's jobs per second and the ratios ruststream/peer.
    #[serde(flatten)]
    pub peer: Option<PeerSummary>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The limit loop: the fewest statements and commits that keep the form's guarantees
    /// (tools/bench/src/baseline.rs).
    Limit,
    /// The loop of the core's own statements, as the core sequences them.
    Baseline,
    RustStream,
    /// The peer of `--peer` (tools/bench/src/peer.rs).
    Peer,
}

/// Runs the benchmark: `rounds` times the baseline then ruststream, a JSON line per run and a
/// summary line into `out` (or `--json FILE`), a line per run on stderr. Answers the summary.
pub async fn run(config: &Config, out: &mut (dyn Write + Send)) -> Result<Summary, BoxError> {
    let mut file = match &config.json {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        ),
        None => None,
    };
    let mut emit = |line: String| -> Result<(), BoxError> {
        match file.as_mut() {
            Some(f) => writeln!(f, "{line}")?,
            None => writeln!(out, "{line}")?,
        }
        Ok(())
    };
    drivers::set_sqlite_normal(config.sqlite_normal);
    let _xmin = hold_xmin(config).await?;
    let desc = config.table();
    let mut records: Vec<RunRecord> = Vec::new();
    let mut dialect_name = config.database.family();
    for round in 1..=config.rounds {
        for side in peer::sides(config) {
            match side {
                Side::Peer => peer::prepare(config).await?,
                _ => {
                    drivers::prepare(&config.database, desc.table, config.jobs, config.keys).await?
                }
            }
            let bar = progress(config, side, round);
            let stats = Arc::new(Stats::new(bar.clone()));
            let mut reset = stats::reset_peak_memory();
            let holder = match side {
                Side::Peer => None,
                _ => scale::Holder::hold(config).await?,
            };
            let target = config.target();
            let sampler =
                timeline::Sampler::start(&config.database, desc.table, stats.clone()).await?;
            let mut per_process_jobs = None;
            let mut child_memory = None;
            let cpu_mark = stats::CpuMark::now();
            let elapsed = match side {
                Side::Baseline | Side::Limit => {
                    let limit = side == Side::Limit;
                    let (elapsed, dialect) =
                        run_baseline(config, &desc, stats.clone(), limit).await?;
                    dialect_name = dialect.name();
                    elapsed
                }
                Side::RustStream if config.processes > 1 => {
                    let children = scale::run_children(config, &stats, target).await?;
                    per_process_jobs = Some(children.per_process_jobs);
                    child_memory = Some(children.peak_memory_kib);
                    reset = true;
                    children.elapsed
                }
                Side::RustStream => {
                    let settled = stats.clone();
                    let until = async move { wait_settled(&settled, target).await };
                    let elapsed = run_framework(config, stats.clone(), until).await?;
                    per_process_jobs = Some(vec![stats.settled()]);
                    elapsed
                }
                Side::Peer => peer::run(config, stats.clone(), round).await?,
            };
            let cpu = cpu_mark.and_then(|mark| mark.since(target));
            let timeline = sampler.finish().await;
            bar.finish_and_clear();
            let name = peer::implementation(config, side);
            if side != Side::Peer && (config.processes > 1 || config.held_keys > 0) {
                let left = drivers::remaining(&config.database, desc.table).await?;
                if left != config.held_rows() {
                    return Err(format!(
                        "round {round} {name}: {left} rows left in {}, where the held keys have {}",
                        desc.table,
                        config.held_rows()
                    )
                    .into());
                }
            }
            if let Some(holder) = holder {
                holder.release().await?;
            }
            let order_checked = side != Side::Peer && !stats.order.is_empty();
            if order_checked {
                stats
                    .order
                    .verify()
                    .map_err(|e| format!("round {round} {name}: per-key order: {e}"))?;
            }
            let statements = stats.statements();
            let executed: u64 = statements
                .iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "acquire"
                            | "release"
                            | "close"
                            | "busy retry"
                            | "candidates from the floor"
                            | "candidates from the start"
                    )
                })
                .map(|(_, n)| n)
                .sum();
            let pickups = stats.pickups();
            let settles = stats.settles();
            let record = RunRecord {
                kind: "run",
                implementation: peer::implementation(config, side),
                round,
                adapter: config.adapter.name(),
                database: dialect_name,
                form: config.form_name(),
                jobs: config.jobs,
                workers: config.workers,
                keys: config.keys,
                handler_ms: config.handler_ms,
                prefetch: config.prefetch,
                processes: config.processes,
                per_process_jobs,
                hot_keys: config.hot_keys,
                hot_ms: config.hot_ms,
                held_keys: config.held_keys,
                settled_jobs: target,
                order_checked,
                elapsed_s: elapsed.as_secs_f64(),
                jobs_per_s: target as f64 / elapsed.as_secs_f64(),
                pickup_p50_ms: quantile_ms(&pickups, 0.5),
                pickup_p99_ms: quantile_ms(&pickups, 0.99),
                claim_p50_ms: quantile_ms(&timeline.claims_us, 0.5),
                claim_p99_ms: quantile_ms(&timeline.claims_us, 0.99),
                timeline: timeline.samples,
                settle_p50_ms: quantile_ms(&settles, 0.5),
                settle_p99_ms: quantile_ms(&settles, 0.99),
                peak_connections: stats.peak_connections(),
                peak_memory_kib: child_memory.unwrap_or_else(stats::peak_memory_kib),
                peak_memory_reset: reset,
                statements_per_job: executed as f64 / target as f64,
                statements,
                statement_mean_us: stats.mean_us(),
                client_cpu_us_per_job: cpu.map(|c| c.client_cpu_us_per_job),
                machine_busy: cpu.and_then(|c| c.machine_busy),
                date: stats::utc_now(),
                cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
                load1: stats::load_average(),
            };
            eprintln!(
                "round {round} {:<10} {} {} {} W={}{}: {:.0} jobs/s, pickup p50 {} p99 {}, settle p50 {} p99 {}, {} conns, {:.1} statements/job, client CPU {} us/job, machine busy {}, VmHWM {} KiB",
                record.implementation,
                record.adapter,
                record.database,
                record.form,
                record.workers,
                scale_label(
                    config,
                    record.per_process_jobs.as_deref(),
                    record.order_checked
                ),
                record.jobs_per_s,
                ms(record.pickup_p50_ms),
                ms(record.pickup_p99_ms),
                ms(record.settle_p50_ms),
                ms(record.settle_p99_ms),
                record.peak_connections,
                record.statements_per_job,
                num(record.client_cpu_us_per_job),
                record
                    .machine_busy
                    .map_or_else(|| "-".to_owned(), |b| format!("{:.0}%", b * 100.0)),
                record.peak_memory_kib.unwrap_or(0),
            );
            if config.timeline {
                eprintln!("  {}", timeline::describe(&record.timeline));
            }
            emit(serde_json::to_string(&record)?)?;
            records.push(record);
        }
    }
    let of = |side: &str| -> Vec<&RunRecord> {
        records
            .iter()
            .filter(|r| r.implementation == side)
            .collect()
    };
    let rs = of("ruststream");
    let base = of("baseline");
    let limit = of("limit");
    let ratios_to = |other: &[&RunRecord]| -> Vec<f64> {
        rs.iter()
            .filter_map(|r| {
                other
                    .iter()
                    .find(|b| b.round == r.round)
                    .map(|b| r.jobs_per_s / b.jobs_per_s)
            })
            .collect()
    };
    let ratios = ratios_to(&base);
    let limit_ratios = ratios_to(&limit);
    let med = |runs: &[&RunRecord], f: fn(&RunRecord) -> Option<f64>| -> Option<f64> {
        median(&runs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
    };
    let summary = Summary {
        kind: "summary",
        adapter: config.adapter.name(),
        database: dialect_name,
        form: config.form_name(),
        jobs: config.jobs,
        workers: config.workers,
        keys: config.keys,
        handler_ms: config.handler_ms,
        prefetch: config.prefetch,
        rounds: config.rounds,
        processes: config.processes,
        hot_keys: config.hot_keys,
        hot_ms: config.hot_ms,
        held_keys: config.held_keys,
        settled_jobs: config.target(),
        order_checked: records
            .iter()
            .filter(|r| r.implementation != "apalis")
            .all(|r| r.order_checked)
            && config.form == Form::Advisory,
        ruststream_jobs_per_s: med(&rs, |r| Some(r.jobs_per_s)),
        baseline_jobs_per_s: med(&base, |r| Some(r.jobs_per_s)),
        ratio_median: median(&ratios),
        ratios,
        limit_jobs_per_s: med(&limit, |r| Some(r.jobs_per_s)),
        limit_ratio_median: median(&limit_ratios),
        limit_statements_per_job: limit.last().map(|r| r.statements_per_job),
        ruststream_pickup_p50_ms: med(&rs, |r| r.pickup_p50_ms),
        ruststream_pickup_p99_ms: med(&rs, |r| r.pickup_p99_ms),
        baseline_pickup_p50_ms: med(&base, |r| r.pickup_p50_ms),
        baseline_pickup_p99_ms: med(&base, |r| r.pickup_p99_ms),
        ruststream_statements_per_job: rs.last().map(|r| r.statements_per_job),
        baseline_statements_per_job: base.last().map(|r| r.statements_per_job),
        command: config.command.clone(),
        date: stats::utc_now(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        load1: stats::load_average(),
        peer: peer::summary(config, &records),
    };
    eprintln!(
        "summary {} {} {} W={}{}: ruststream {} jobs/s, limit {} jobs/s (ratio {}), same statements {} jobs/s (ratio {})",
        summary.adapter,
        summary.database,
        summary.form,
        summary.workers,
        scale_label(config, None, summary.order_checked),
        num(summary.ruststream_jobs_per_s),
        num(summary.limit_jobs_per_s),
        summary
            .limit_ratio_median
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
        num(summary.baseline_jobs_per_s),
        summary
            .ratio_median
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
    );
    emit(serde_json::to_string(&summary)?)?;
    Ok(summary)
}

/// `--hold-xmin`: a connection whose transaction holds an xid until it is dropped.
pub(crate) async fn hold_xmin(config: &Config) -> Result<Option<sqlx::PgConnection>, BoxError> {
    use sqlx::Connection;
    if !config.hold_xmin {
        return Ok(None);
    }
    let Database::Postgres(url) = &config.database else {
        return Err("--hold-xmin runs on PostgreSQL only".into());
    };
    let mut conn = sqlx::PgConnection::connect(url).await?;
    sqlx::query("BEGIN").execute(&mut conn).await?;
    sqlx::query("SELECT txid_current()")
        .execute(&mut conn)
        .await?;
    Ok(Some(conn))
}

/// The scaling settings of a run's line on stderr: ` P=3 [330, 340, 330] held=1 hot=2×400ms
/// order ok`, each part only where it applies.
fn scale_label(config: &Config, per_process: Option<&[u64]>, order_checked: bool) -> String {
    let mut label = String::new();
    if config.processes > 1 {
        label.push_str(&format!(" P={}", config.processes));
        if let Some(jobs) = per_process {
            label.push_str(&format!(" {jobs:?}"));
        }
    }
    if config.form == Form::Advisory {
        label.push_str(&format!(" K={}", config.keys));
    }
    if config.held_keys > 0 {
        label.push_str(&format!(" held={}", config.held_keys));
    }
    if config.hot_keys > 0 {
        label.push_str(&format!(" hot={}×{}ms", config.hot_keys, config.hot_ms));
    }
    if order_checked {
        label.push_str(" order ok");
    }
    label
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}ms"))
}

fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"))
}

/// Where the JSON lines of the growth and publish scenarios go: appended to `--json FILE`, or
/// written to `out`.
pub(crate) struct Lines<'a> {
    file: Option<std::fs::File>,
    out: &'a mut (dyn Write + Send),
}

impl<'a> Lines<'a> {
    pub(crate) fn open(config: &Config, out: &'a mut (dyn Write + Send)) -> Result<Self, BoxError> {
        let file = match &config.json {
            Some(path) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
            None => None,
        };
        Ok(Self { file, out })
    }

    /// Writes `record` as one JSON line.
    pub(crate) fn emit(&mut self, record: &impl Serialize) -> Result<(), BoxError> {
        let line = serde_json::to_string(record)?;
        match self.file.as_mut() {
            Some(f) => writeln!(f, "{line}")?,
            None => writeln!(self.out, "{line}")?,
        }
        Ok(())
    }
}

/// A progress bar of `len` steps on stderr, or a hidden one under `--quiet`.
pub(crate) fn bar(config: &Config, len: u64, prefix: String) -> ProgressBar {
    if !config.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{prefix:<32} {bar:30} {pos}/{len} {per_sec} {elapsed}")
            .expect("a valid template"),
    );
    bar.set_prefix(prefix);
    bar
}

fn progress(config: &Config, side: Side, round: usize) -> ProgressBar {
    if !config.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(config.target()), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{prefix:<24} {bar:30} {pos}/{len} {per_sec} {elapsed}")
            .expect("a valid template"),
    );
    bar.set_prefix(format!(
        "round {round} {}",
        peer::implementation(config, side)
    ));
    bar
}

/// The ruststream side in this process: the adapter's broker with one subscription of W
/// workers, until `until` completes.
pub(crate) async fn run_framework(
    config: &Config,
    stats: Arc<Stats>,
    until: impl Future<Output = Result<(), BoxError>>,
) -> Result<Duration, BoxError> {
    with_broker!(
        config,
        config.pool_size(),
        |make| match config.form {
            Form::RowLock => framework::run::<_, RowLockJob>(make(), config, stats, until).await,
            Form::Lease => framework::run::<_, LeaseJob>(make(), config, stats, until).await,
            Form::Advisory => {
                framework::run::<_, AdvisoryJob>(make(), config, stats, until).await
            }
        },
        match config.form {
            Form::RowLock => Err("SQLite has no row locks".into()),
            Form::Lease => framework::run::<_, LeaseJob>(make(), config, stats, until).await,
            Form::Advisory => {
                framework::run::<_, AdvisoryJob>(make(), config, stats, until).await
            }
        }
    )
}

/// The baseline: W connections of the adapter's driver (N×W with `--processes N`), each in a
/// task of claim → take → settle. Answers the time from the start to the last settlement, and
/// the dialect.
async fn run_baseline(
    config: &Config,
    desc: &TableDesc,
    stats: Arc<Stats>,
    limit: bool,
) -> Result<(Duration, Dialect), BoxError> {
    use sqlx::Connection;
    let w = config.baseline_tasks();
    match (config.adapter, &config.database) {
        (AdapterKind::Sqlx, Database::Postgres(url)) => {
            let mut conns = Vec::new();
            for _ in 0..w {
                conns.push(sqlx::PgConnection::connect(url).await?);
            }
            spawn_all(config, desc, Dialect::Postgres, conns, stats, limit).await
        }
        (AdapterKind::Sqlx, Database::MySql(url)) => {
            let mut conns = Vec::new();
            for _ in 0..w {
                conns.push(sqlx::MySqlConnection::connect(url).await?);
            }
            spawn_all(config, desc, Dialect::MariaDb, conns, stats, limit).await
        }
        (AdapterKind::Sqlx, Database::Sqlite(path)) => {
            let mut conns = Vec::new();
            for _ in 0..w {
                conns.push(
                    sqlx::SqliteConnection::connect_with(&drivers::sqlite_options(path)).await?,
                );
            }
            spawn_all(config, desc, Dialect::Sqlite, conns, stats, limit).await
        }
        (AdapterKind::TokioPostgres, Database::Postgres(url)) => {
            let mut conns = Vec::new();
            for _ in 0..w {
                conns.push(drivers::TokioPg::connect(url).await?);
            }
            spawn_all(config, desc, Dialect::Postgres, conns, stats, limit).await
        }
        (AdapterKind::MysqlAsync, Database::MySql(url)) => {
            let opts = mysql_async::Opts::from_url(url)?;
            let mut conns = Vec::new();
            for _ in 0..w {
                conns.push(drivers::MyAsync(
                    mysql_async::Conn::new(opts.clone()).await?,
                ));
            }
            spawn_all(config, desc, Dialect::MariaDb, conns, stats, limit).await
        }
        (AdapterKind::Rusqlite, Database::Sqlite(path)) => {
            // Blocking connections: each task gets a thread of its own with a current-thread
            // runtime for the handler's sleep.
            let mut conns = Vec::new();
            for _ in 0..w {
                conns.push(drivers::open_rusqlite(path)?);
            }
            let statements = Statements::render(Dialect::Sqlite, desc, w);
            let shared = shared(
                config,
                desc,
                statements,
                String::new(),
                stats.clone(),
                limit,
            );
            let started = std::time::Instant::now();
            let mut threads = Vec::new();
            for conn in conns {
                stats.acquired();
                let shared = shared.clone();
                threads.push(std::thread::spawn(move || -> Result<(), BoxError> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_time()
                        .build()?;
                    rt.block_on(baseline::worker(conn, shared))
                }));
            }
            let results = tokio::task::spawn_blocking(move || {
                threads
                    .into_iter()
                    .map(|t| t.join().unwrap_or_else(|_| Err("a thread panicked".into())))
                    .collect::<Vec<_>>()
            })
            .await?;
            let elapsed = started.elapsed();
            for result in results {
                result?;
            }
            Ok((elapsed, Dialect::Sqlite))
        }
        (adapter, database) => Err(format!(
            "--adapter {} does not run on {}",
            adapter.name(),
            database.family()
        )
        .into()),
    }
}

fn shared(
    config: &Config,
    desc: &TableDesc,
    statements: Statements,
    database: String,
    stats: Arc<Stats>,
    limit: bool,
) -> Arc<Shared> {
    Arc::new(Shared {
        limit,
        statements,
        stats,
        desc: *desc,
        jobs: config.target(),
        workers: config.baseline_tasks(),
        work: config.work(),
        database,
        claim: tokio::sync::Mutex::new(()),
        keys: Mutex::new(HashSet::new()),
        excluding: Mutex::new(HashMap::new()),
        batch: limit::Batch::default(),
    })
}

async fn spawn_all<C: RawConn>(
    config: &Config,
    desc: &TableDesc,
    dialect: Dialect,
    mut conns: Vec<C>,
    stats: Arc<Stats>,
    limit: bool,
) -> Result<(Duration, Dialect), BoxError> {
    let mut dialect = dialect;
    let mut database = String::new();
    if matches!(dialect, Dialect::MySql | Dialect::MariaDb)
        && let Some(conn) = conns.first_mut()
    {
        let text = |rows: Vec<Vec<Value>>| {
            rows.into_iter()
                .next()
                .and_then(|r| r.into_iter().next())
                .and_then(|v| v.as_text().map(str::to_owned))
                .unwrap_or_default()
        };
        let version = text(
            conn.query("SELECT VERSION() AS db", Vec::new(), &["db"])
                .await?,
        );
        dialect = if version.contains("MariaDB") {
            Dialect::MariaDb
        } else {
            Dialect::MySql
        };
        database = text(
            conn.query("SELECT DATABASE() AS db", Vec::new(), &["db"])
                .await?,
        );
    }
    let statements = Statements::render(dialect, desc, config.baseline_tasks());
    let shared = shared(config, desc, statements, database, stats.clone(), limit);
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for conn in conns {
        stats.acquired();
        tasks.push(tokio::spawn(baseline::worker(conn, shared.clone())));
    }
    let mut result = Ok(());
    for task in tasks {
        if let Err(error) = task.await? {
            result = Err(error);
        }
    }
    let elapsed = started.elapsed();
    result.map(|()| (elapsed, dialect))
}

/// The program: parses the command line, runs, and answers the exit code.
pub fn main_with(args: impl IntoIterator<Item = String>) -> std::process::ExitCode {
    let config = match Config::parse(args) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{error}");
            return std::process::ExitCode::from(2);
        }
    };
    let mut builder = if config.current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: could not start the tokio runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if std::env::var_os(scale::CHILD_ENV).is_some() {
        return match runtime.block_on(scale::child_main(&config)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: child process: {error}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let mut stdout = std::io::stdout();
    let result = runtime.block_on(async {
        match config.scenario {
            Scenario::Claim => run(&config, &mut stdout).await.map(drop),
            Scenario::Growth => run_growth(&config, &mut stdout).await.map(drop),
            Scenario::Publish => run_publish(&config, &mut stdout).await.map(drop),
            Scenario::Wakeup => wakeup::run_wakeup(&config, &mut stdout).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

//! The chaos program of ruststream: services run as child processes against real databases,
//! faults are injected from outside, and the invariants are checked from outside, from what
//! the handlers recorded and what the server says.
//!
//! ```sh
//! cargo run --release -p ruststream-chaos -- --scenario repeated_kills --adapter sqlx-postgres \
//!     --form row-lock --jobs 300
//! cargo run --release -p ruststream-chaos                  # every scenario, adapter and form
//! cargo run --release -p ruststream-chaos -- --rotate 0     # each scenario × form once
//! cargo run --release -p ruststream-chaos -- --long         # a million jobs with kills throughout
//! ```
//!
//! Each run (one scenario on one adapter, database and form) works in a database of its own
//! (`chaos_<pid>_<n>`, created and dropped by the run): the parent creates the queue table
//! `chaos_jobs` and the handlers' log `chaos_log` there, inserts the jobs, starts the services
//! (this binary again, `ruststream-chaos child ..`), injects the scenario's faults, waits until
//! every row is acknowledged or failed, stops the services with SIGTERM, and checks:
//!
//! - every row ended as its handlers' outcomes say: deleted after an acknowledgement, failed
//!   after a rejection (with its error and attempt) or past its attempt budget, never left
//!   queued and never deleted without an acknowledgement (`check.rs`);
//! - no row was in work twice at once, and in the advisory form no key: the handler intervals
//!   of one row (of one key) do not overlap; an interval a SIGKILLed child left open ends at
//!   the kill;
//! - attempts are exact: a row's attempts rise at each start, and without a fault in between
//!   (a kill, a killed session, a restart) they are consecutive; no handler runs past the
//!   budget;
//! - a retry waits its delay: a row's next delivery after one that retried starts no sooner
//!   than that one's end plus the delay (100 ms; not in retry_storm, whose retries are due at
//!   once), unless a fault hit the retrying process or the server in between;
//! - the services exit in time on SIGTERM, and nothing of theirs is left on the server: no
//!   session of the run's database, no advisory lock (PostgreSQL) or `GET_LOCK` lock
//!   (MySQL/MariaDB), no open transaction.
//!
//! The scenarios (`--scenario`): `repeated_kills` (a process SIGKILLed and started again every
//! second), `db_restart` (a throwaway PostgreSQL restarted twice), `backend_kill` (sessions
//! killed on the server), `pool_exhaustion` (starved pools), `retry_storm` (most rows retried
//! at once), `idle_in_tx` (a transaction held open for the whole run) and `clock_skew` (two
//! processes whose wall clocks libfaketime sets off the machine's, the first 45 s ahead and the
//! second 45 s behind, the monotonic clock left alone; each child subtracts its skew from the
//! times it records, so the log stays on one clock, and the parent checks from the child's
//! first line that the skew is in effect). clock_skew needs libfaketime (Debian's
//! `libfaketime` package) and a lease shorter than the skew. `poison_rows` runs ten times
//! the jobs (handlers twenty times quicker) on a bare table, with no due column and no
//! `failed_at`, one row in a hundred holding a payload that does not decode: the other rows
//! all settle, of the poison rows' keys too, and each poison row stays, never handed, taken
//! again no sooner than its delay by each process. `failed_start` adds two processes run as
//! services (`RustStream::run`) whose start cannot succeed: one on a port that refuses to the
//! end, which must report it again and again and still exit on SIGTERM; one on a port that
//! opens a few seconds in, which must then start. `pooler` (PostgreSQL) puts PgBouncer in
//! transaction pooling between the services and the server: the lease form runs through it
//! under every check, the row lock and advisory forms (the table counts attempts) must refuse
//! at the start naming transaction pooling. It needs PgBouncer (Debian's `pgbouncer`).
//!
//! Each run prints one line: scenario, adapter, database, form, jobs, processes, faults,
//! elapsed, jobs/s, verdict and the first violations. The program exits non-zero when any run
//! found a violation.

mod bouncer;
mod check;
mod child;
mod cluster;
mod db;
mod gate;
mod plan;
mod rows;
mod run;

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// An error of the chaos program itself (not a violation of the library).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The command line.
#[derive(Parser, Debug)]
#[command(
    name = "ruststream-chaos",
    about = "Runs ruststream services as child processes against real databases, injects faults, \
             and checks the queue's invariants from outside.",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    child: Option<Sub>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// One service: what the parent starts for each process (not for use by hand).
    #[command(hide = true)]
    Child(child::ChildArgs),
}

/// A scenario: the fault the run injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// N processes, one SIGKILLed and restarted every `--kill-every-ms`.
    #[value(name = "repeated_kills")]
    RepeatedKills,
    /// PostgreSQL (a throwaway server of the run's own) restarted twice mid-run.
    #[value(name = "db_restart")]
    DbRestart,
    /// Random sessions of the services killed on the server in a loop
    /// (`pg_terminate_backend`, `KILL CONNECTION`).
    #[value(name = "backend_kill")]
    BackendKill,
    /// One service with a pool smaller than its workers, one whose pool other users drain.
    #[value(name = "pool_exhaustion")]
    PoolExhaustion,
    /// Most handlers retry once or twice at once (`RetryPolicy::immediate`).
    #[value(name = "retry_storm")]
    RetryStorm,
    /// A transaction held open elsewhere for the whole run.
    #[value(name = "idle_in_tx")]
    IdleInTx,
    /// Two processes whose wall clocks are set wrong through libfaketime: the first 45 s
    /// ahead of the machine's, the second 45 s behind.
    #[value(name = "clock_skew")]
    ClockSkew,
    /// Ten times the jobs, one in a hundred of them a row whose payload does not decode, on a
    /// table with no due column and no `failed_at`.
    #[value(name = "poison_rows")]
    PoisonRows,
    /// Two more processes whose start cannot succeed: one pointed at a port that refuses to
    /// the end, one at a port that opens a few seconds in.
    #[value(name = "failed_start")]
    FailedStart,
    /// PostgreSQL behind PgBouncer in transaction pooling: the lease form works through it,
    /// the forms that hold session locks refuse at the start.
    #[value(name = "pooler")]
    Pooler,
}

impl Scenario {
    /// Every scenario, in the order a round runs them.
    pub const ALL: [Scenario; 10] = [
        Scenario::RepeatedKills,
        Scenario::DbRestart,
        Scenario::BackendKill,
        Scenario::PoolExhaustion,
        Scenario::RetryStorm,
        Scenario::IdleInTx,
        Scenario::ClockSkew,
        Scenario::PoisonRows,
        Scenario::FailedStart,
        Scenario::Pooler,
    ];

    /// The scenario's name on the command line and in the result line.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::RepeatedKills => "repeated_kills",
            Scenario::DbRestart => "db_restart",
            Scenario::BackendKill => "backend_kill",
            Scenario::PoolExhaustion => "pool_exhaustion",
            Scenario::RetryStorm => "retry_storm",
            Scenario::IdleInTx => "idle_in_tx",
            Scenario::ClockSkew => "clock_skew",
            Scenario::PoisonRows => "poison_rows",
            Scenario::FailedStart => "failed_start",
            Scenario::Pooler => "pooler",
        }
    }

    /// Whether the scenario runs on PostgreSQL only (a throwaway server it restarts, a pooler
    /// of PostgreSQL's).
    pub fn postgres_only(self) -> bool {
        matches!(self, Scenario::DbRestart | Scenario::Pooler)
    }
}

/// An adapter on its database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// `ruststream-sqlx` on PostgreSQL.
    SqlxPostgres,
    /// `ruststream-sqlx` on MySQL/MariaDB.
    SqlxMysql,
    /// `ruststream-tokio-postgres` on PostgreSQL.
    TokioPostgres,
    /// `ruststream-mysql-async` on MySQL/MariaDB.
    MysqlAsync,
}

impl Target {
    /// Every adapter and database.
    pub const ALL: [Target; 4] = [
        Target::SqlxPostgres,
        Target::TokioPostgres,
        Target::SqlxMysql,
        Target::MysqlAsync,
    ];

    /// The adapter's name in the result line.
    pub fn adapter(self) -> &'static str {
        match self {
            Target::SqlxPostgres | Target::SqlxMysql => "sqlx",
            Target::TokioPostgres => "tokio-postgres",
            Target::MysqlAsync => "mysql-async",
        }
    }

    /// Whether the database is PostgreSQL (else MySQL/MariaDB).
    pub fn postgres(self) -> bool {
        matches!(self, Target::SqlxPostgres | Target::TokioPostgres)
    }

    /// The name `--adapter` takes.
    pub fn name(self) -> &'static str {
        match self {
            Target::SqlxPostgres => "sqlx-postgres",
            Target::SqlxMysql => "sqlx-mysql",
            Target::TokioPostgres => "tokio-postgres",
            Target::MysqlAsync => "mysql-async",
        }
    }
}

/// The form the queue table takes its rows in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Form {
    /// The row lock form (`FOR UPDATE SKIP LOCKED`).
    RowLock,
    /// The lease form (`locked_until`).
    Lease,
    /// The advisory lock form, keyed `chaos-{k}`.
    Advisory,
}

impl Form {
    /// Every form.
    pub const ALL: [Form; 3] = [Form::RowLock, Form::Lease, Form::Advisory];

    /// The form's name on the command line and in the result line.
    pub fn name(self) -> &'static str {
        match self {
            Form::RowLock => "row-lock",
            Form::Lease => "lease",
            Form::Advisory => "advisory",
        }
    }
}

/// What the parent runs: scenarios × adapters × forms, each run bounded in rows and time.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The scenarios (comma-separated); every one by default.
    #[arg(long, value_delimiter = ',')]
    pub scenario: Vec<Scenario>,
    /// The adapters on their databases (comma-separated); every one by default.
    #[arg(long, value_delimiter = ',')]
    pub adapter: Vec<Target>,
    /// The forms (comma-separated); every one by default.
    #[arg(long, value_delimiter = ',')]
    pub form: Vec<Form>,
    /// Jobs per run.
    #[arg(long, default_value_t = 300)]
    pub jobs: u64,
    /// The longest a run may take to drain its table, in seconds.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// Service processes per run (default: 3 in repeated_kills, 2 in the others).
    #[arg(long)]
    pub processes: Option<usize>,
    /// Workers per process (default: 6 in pool_exhaustion and retry_storm, 4 in the others).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Distinct advisory keys over the jobs.
    #[arg(long, default_value_t = 20)]
    pub keys: u64,
    /// How long a handler works, in milliseconds, on average (each job and attempt takes 50 %
    /// to 150 % of it; 0: it only records).
    #[arg(long, default_value_t = 100)]
    pub handler_ms: u64,
    /// repeated_kills: one process is SIGKILLed and restarted this often, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub kill_every_ms: u64,
    /// backend_kill: one session of the services is killed on the server this often.
    #[arg(long, default_value_t = 300)]
    pub session_kill_every_ms: u64,
    /// The lease of the lease form, in milliseconds (short, so a killed row returns soon).
    #[arg(long, default_value_t = 2000)]
    pub lease_ms: u64,
    /// `max_attempts` of the subscriptions.
    #[arg(long, default_value_t = 5)]
    pub max_attempts: u32,
    /// The seed of the random choices (which process to kill, which session); from the
    /// clock by default, and printed in each result line.
    #[arg(long)]
    pub seed: Option<u64>,
    /// PostgreSQL: the server the runs use (db_restart starts a throwaway one of its own).
    #[arg(
        long,
        env = "RUSTSTREAM_PG_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    pub pg_url: String,
    /// MySQL/MariaDB: the server the runs use.
    #[arg(
        long,
        env = "RUSTSTREAM_MYSQL_URL",
        default_value = "mysql://root@127.0.0.1:3306/test"
    )]
    pub mysql_url: String,
    /// A directory of PostgreSQL's binaries (initdb, pg_ctl) for db_restart; the newest
    /// /usr/lib/postgresql/*/bin by default.
    #[arg(long)]
    pub pg_bin: Option<std::path::PathBuf>,
    /// The long run: a million jobs in repeated_kills (unless --scenario says otherwise), the
    /// handlers only recording, kills throughout, up to two hours per run.
    #[arg(long)]
    pub long: bool,
    /// Runs each scenario × form once instead of on every adapter, the adapters taken in
    /// turn from this offset (db_restart among the PostgreSQL ones): every scenario, form
    /// and adapter in a third of the runs (scripts/test passes a number from the commit, so
    /// successive commits cover the other pairings).
    #[arg(long)]
    pub rotate: Option<usize>,
    /// Keep a failed run's database for inspection instead of dropping it.
    #[arg(long)]
    pub keep_failed: bool,
}

impl RunArgs {
    /// Applies `--long` and the defaults of empty lists.
    fn resolve(mut self) -> Self {
        if self.long {
            if self.scenario.is_empty() {
                self.scenario = vec![Scenario::RepeatedKills];
            }
            if self.jobs == 300 {
                self.jobs = 1_000_000;
            }
            if self.seconds == 30 {
                self.seconds = 7200;
            }
            if self.handler_ms == 100 {
                self.handler_ms = 0;
            }
        }
        if self.scenario.is_empty() {
            self.scenario = Scenario::ALL.to_vec();
        }
        if self.adapter.is_empty() {
            self.adapter = Target::ALL.to_vec();
        }
        if self.form.is_empty() {
            self.form = Form::ALL.to_vec();
        }
        self
    }

    /// The drain bound.
    pub fn bound(&self) -> Duration {
        Duration::from_secs(self.seconds.max(1))
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("ruststream-chaos: cannot start the tokio runtime: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    let code = match cli.child {
        Some(Sub::Child(args)) => runtime.block_on(child::main(args)),
        None => runtime.block_on(run::main(cli.run.resolve())),
    };
    // Not a wait for blocking tasks that never end (the child's read of its standard input).
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

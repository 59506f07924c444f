//! Publishing: rows published per second through ruststream's `Publisher`, beside raw inserts
//! of the same statement on the same driver.
//!
//! ```sh
//! cargo run --release -p ruststream-bench -- --scenario publish --adapter sqlx \
//!     --url postgres://postgres@127.0.0.1:5432/test --jobs 10000 --concurrency 1,4,16
//! ```
//!
//! For each round and each `--concurrency C`, four runs (six on PostgreSQL), each on the
//! table `bench_publish` dropped and created anew (the bench's columns; its description is the
//! advisory form on `bench-{k}`, so a publish writes the payload and `k`):
//!
//! - **raw, single**: C tasks, each on a connection of its own opened before the clock, run
//!   the publish statement the core renders ([`Statements::render`]`(..).publish`, the
//!   statement `Publisher::publish` runs) one row at a time until `--jobs` rows (2000) are
//!   written.
//! - **ruststream, single**: a broker of the adapter (pool of C + 2, no subscription) and C
//!   tasks, each calling `Publisher::publish(Message)` and awaiting it before the next.
//! - **raw, batched**: the same as raw, single, with the core's insert of `--batch B` rows
//!   (100; [`Statements::publish_rows`], the statement `Publisher::publish_all` runs for a
//!   batch of B rows up to 100), until `--batch-jobs` rows (20000) are written.
//! - **ruststream, batched**: C tasks, each calling `Publisher::publish_all` with B messages.
//! - **raw-insert-only, single and batched**: where the publish statement wraps the insert
//!   (on PostgreSQL, a `WITH` whose query notifies the listening sessions), the two raw runs
//!   with the insert alone, so the wrapper's cost shows.
//!
//! Before the clock, each side writes once per connection, untimed (raw: one statement on
//! each; ruststream: C publishes at once, which opens the pool's connections). Each payload is
//! a [`Job`] with its publish time. The rusqlite raw tasks run on threads of their own
//! (blocking calls), the others on the tokio runtime.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream::adapter::Adapter;
use ruststream::core::spec::Described;
use ruststream::core::{Arg, Column, Dialect, Form, InboxSpec, Statement, Statements, Value};
use ruststream::{Advisory, Attempt, BrokerHandle, InboxTable, Message, Payload};
use serde::Serialize;
use sqlx::Connection;

use crate::baseline::RawConn;
use crate::framework::Counted;
use crate::growth::dialect_of;
use crate::stats::{Job, Stats, median, now_us, quantile_ms};
use crate::{AdapterKind, BoxError, Config, Database, Lines, drivers};

/// The table the publish scenario writes.
pub const TABLE: &str = "bench_publish";

/// A row of `bench_publish`: the advisory form on `bench-{k}`, with an attempt column, so a
/// publish writes the payload and `k`.
#[derive(Debug)]
pub struct PublishJob {
    id: i64,
}

impl InboxTable for PublishJob {
    type Id = i64;
    type Table = InboxSpec<(Advisory, Attempt, Payload)>;
    const TABLE: Self::Table = InboxSpec::new(TABLE, Column::new("id").generated())
        .advisory(crate::framework::KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"));

    fn id(&self) -> &i64 {
        &self.id
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Raw,
    /// Raw, with the insert alone, where the core's publish statement wraps it (PostgreSQL's
    /// notification).
    RawPlain,
    RustStream,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Raw => "raw",
            Side::RawPlain => "raw-insert-only",
            Side::RustStream => "ruststream",
        }
    }
}

/// One publish run, as its JSON line writes it.
#[derive(Clone, Debug, Serialize)]
pub struct PublishRecord {
    /// `"publish"`.
    pub kind: &'static str,
    /// `"raw"` or `"ruststream"`.
    pub implementation: &'static str,
    /// `"single"` (a row per statement) or `"batch"` (a multi-row insert).
    pub mode: &'static str,
    /// Rows per insert statement.
    pub rows_per_insert: usize,
    /// The statement each insert ran (ruststream: the one the core renders for the same rows).
    pub sql: String,
    /// The round, from 1.
    pub round: usize,
    /// The adapter (the raw side runs on its driver).
    pub adapter: &'static str,
    /// The database, as its dialect names it.
    pub database: &'static str,
    /// Publishers in flight at once.
    pub concurrency: usize,
    /// Rows published in the timed part.
    pub jobs: u64,
    /// Start to the last reply, seconds.
    pub elapsed_s: f64,
    /// Rows published per second.
    pub jobs_per_s: f64,
    /// One publish call (ruststream) or insert statement (raw), issue to reply: median, ms.
    pub call_p50_ms: Option<f64>,
    /// See `call_p50_ms`: 99th percentile.
    pub call_p99_ms: Option<f64>,
    /// Statements and pool operations, by kind (ruststream: what the core sent through the
    /// adapter, the untimed first publishes included).
    pub statements: BTreeMap<String, u64>,
    /// The mean time from issue to reply, by kind, microseconds.
    pub statement_mean_us: BTreeMap<String, u64>,
    /// The most connections held at once.
    pub peak_connections: i64,
    /// When the run ended, UTC.
    pub date: String,
    /// The machine's CPUs.
    pub cpus: usize,
    /// The 1-minute load average when the run ended.
    pub load1: Option<f64>,
}

/// The summary of one concurrency over the rounds.
#[derive(Clone, Debug, Serialize)]
pub struct PublishSummary {
    /// `"publish-summary"`.
    pub kind: &'static str,
    /// The adapter.
    pub adapter: &'static str,
    /// The database.
    pub database: &'static str,
    /// Publishers in flight at once.
    pub concurrency: usize,
    /// Rows per single-row run.
    pub jobs: u64,
    /// Rows per batched run.
    pub batch_jobs: u64,
    /// The rounds.
    pub rounds: usize,
    /// ruststream's `Publisher::publish`, rows per second, median over the rounds.
    pub ruststream_single_per_s: Option<f64>,
    /// Raw single-row inserts, rows per second, median over the rounds.
    pub raw_single_per_s: Option<f64>,
    /// Each round's ratio ruststream/raw, single rows.
    pub ratios: Vec<f64>,
    /// The median of the ratios.
    pub ratio_median: Option<f64>,
    /// Rows per batched insert.
    pub batch: usize,
    /// Raw multi-row inserts, rows per second, median over the rounds.
    pub raw_batch_per_s: Option<f64>,
    /// Raw single-row inserts of the insert alone, where the publish statement wraps it
    /// (PostgreSQL: without the notification), rows per second, median over the rounds.
    pub raw_insert_only_single_per_s: Option<f64>,
    /// The same in multi-row inserts.
    pub raw_insert_only_batch_per_s: Option<f64>,
    /// ruststream's `Publisher::publish_all` of `batch` rows a call, rows per second, median
    /// over the rounds.
    pub ruststream_batch_per_s: Option<f64>,
    /// Each round's ratio ruststream/raw, batches.
    pub batch_ratios: Vec<f64>,
    /// The median of the batch ratios.
    pub batch_ratio_median: Option<f64>,
    /// The command.
    pub command: String,
    /// When the summary was written, UTC.
    pub date: String,
    /// The machine's CPUs.
    pub cpus: usize,
    /// The 1-minute load average at the end.
    pub load1: Option<f64>,
}

/// What the tasks of one run share.
struct Shared {
    next: AtomicU64,
    total: u64,
    rows_per_insert: u64,
    keys: u64,
    sql: String,
    statement: Statement,
    calls_us: Mutex<Vec<i64>>,
    stats: Arc<Stats>,
}

impl Shared {
    /// The first row of the next insert, or `None` when every row is taken.
    fn take(&self) -> Option<u64> {
        let first = self.next.fetch_add(self.rows_per_insert, Ordering::SeqCst);
        (first < self.total).then_some(first)
    }

    fn binds(&self, first: u64, rows: u64) -> Result<Vec<Value>, BoxError> {
        let mut binds = Vec::with_capacity(rows as usize * self.statement.args.len());
        for n in first..first + rows {
            let payload = serde_json::to_vec(&Job { t: now_us() })?;
            binds.extend(self.statement.binds(|arg| match arg {
                Arg::Payload => Value::Bytes(payload.clone()),
                Arg::Column(_) => Value::Int((n % self.keys) as i64),
                _ => Value::Null,
            }));
        }
        Ok(binds)
    }

    fn called(&self, took: Duration) {
        self.calls_us
            .lock()
            .expect("not poisoned")
            .push(took.as_micros() as i64);
    }
}

/// Runs the publish scenario: for each round and concurrency, raw single-row inserts,
/// ruststream's `publish`, and raw multi-row inserts. Writes a JSON line per run and a summary
/// per concurrency; answers the summaries.
pub async fn run_publish(
    config: &Config,
    out: &mut (dyn std::io::Write + Send),
) -> Result<Vec<PublishSummary>, BoxError> {
    let mut lines = Lines::open(config, out)?;
    let dialect = detect(config).await?;
    let statement = Statements::render(dialect, PublishJob::TABLE.table_desc(), 1).publish;
    let plain = insert_only(&statement)?;
    let mut records: Vec<PublishRecord> = Vec::new();
    for round in 1..=config.rounds {
        for &c in &config.concurrency {
            let mut runs = vec![
                (Side::Raw, 1),
                (Side::RustStream, 1),
                (Side::Raw, config.batch),
                (Side::RustStream, config.batch),
            ];
            if plain.is_some() {
                runs.extend([(Side::RawPlain, 1), (Side::RawPlain, config.batch)]);
            }
            for (side, rows) in runs {
                let statement = match (side, &plain) {
                    (Side::RawPlain, Some(plain)) => plain,
                    _ => &statement,
                };
                drivers::prepare(&config.database, TABLE, 0, 1).await?;
                let jobs = if rows == 1 {
                    config.jobs
                } else {
                    config.batch_jobs
                };
                let inserts = (jobs / rows as u64).max(1);
                let total = inserts * rows as u64;
                let mode = if rows == 1 { "single" } else { "batch" };
                let bar = crate::bar(
                    config,
                    total,
                    format!("round {round} C={c} {} {mode}", side.name()),
                );
                let stats = Arc::new(Stats::new(bar.clone()));
                // The batched insert `Publisher::publish_all` runs (`Statements::publish_rows`);
                // the insert alone repeated for the raw-insert-only side.
                let sql = match (rows, side) {
                    (1, _) => statement.sql.to_string(),
                    (_, Side::RawPlain) => multi_row(statement, rows)?,
                    _ => Statements::publish_rows(dialect, PublishJob::TABLE.table_desc(), rows)
                        .map_or_else(|| multi_row(statement, rows), |s| Ok(s.sql.to_string()))?,
                };
                let shared = Arc::new(Shared {
                    next: AtomicU64::new(0),
                    total,
                    rows_per_insert: rows as u64,
                    keys: config.keys,
                    sql,
                    statement: statement.clone(),
                    calls_us: Mutex::new(Vec::new()),
                    stats: stats.clone(),
                });
                let elapsed = match side {
                    Side::Raw | Side::RawPlain => raw(config, c, shared.clone()).await?,
                    Side::RustStream => framework(config, c, shared.clone()).await?,
                };
                bar.finish_and_clear();
                let mut calls = shared.calls_us.lock().expect("not poisoned").clone();
                calls.sort_unstable();
                let record = PublishRecord {
                    kind: "publish",
                    implementation: side.name(),
                    mode,
                    rows_per_insert: rows,
                    sql: shared.sql.clone(),
                    round,
                    adapter: config.adapter.name(),
                    database: dialect.name(),
                    concurrency: c,
                    jobs: total,
                    elapsed_s: elapsed.as_secs_f64(),
                    jobs_per_s: total as f64 / elapsed.as_secs_f64(),
                    call_p50_ms: quantile_ms(&calls, 0.5),
                    call_p99_ms: quantile_ms(&calls, 0.99),
                    statements: stats.statements(),
                    statement_mean_us: stats.mean_us(),
                    peak_connections: stats.peak_connections(),
                    date: crate::stats::utc_now(),
                    cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
                    load1: crate::stats::load_average(),
                };
                eprintln!(
                    "round {round} C={c:<3} {:<10} {:<6} {} {}: {:.0} rows/s, call p50 {} p99 {} ms, {} conns",
                    record.implementation,
                    record.mode,
                    record.adapter,
                    record.database,
                    record.jobs_per_s,
                    ms(record.call_p50_ms),
                    ms(record.call_p99_ms),
                    record.peak_connections,
                );
                lines.emit(&record)?;
                records.push(record);
            }
        }
    }
    let mut summaries = Vec::new();
    for &c in &config.concurrency {
        let of = |side: &str, mode: &str| -> Vec<&PublishRecord> {
            records
                .iter()
                .filter(|r| r.concurrency == c && r.implementation == side && r.mode == mode)
                .collect()
        };
        let rate = |runs: &[&PublishRecord]| {
            median(&runs.iter().map(|r| r.jobs_per_s).collect::<Vec<_>>())
        };
        let ratios = |rs: &[&PublishRecord], raw: &[&PublishRecord]| -> Vec<f64> {
            rs.iter()
                .filter_map(|r| {
                    raw.iter()
                        .find(|b| b.round == r.round)
                        .map(|b| r.jobs_per_s / b.jobs_per_s)
                })
                .collect()
        };
        let rs = of("ruststream", "single");
        let raw_single = of("raw", "single");
        let rs_batch = of("ruststream", "batch");
        let raw_batch = of("raw", "batch");
        let single_ratios = ratios(&rs, &raw_single);
        let batch_ratios = ratios(&rs_batch, &raw_batch);
        let summary = PublishSummary {
            kind: "publish-summary",
            adapter: config.adapter.name(),
            database: dialect.name(),
            concurrency: c,
            jobs: config.jobs,
            batch_jobs: config.batch_jobs,
            rounds: config.rounds,
            ruststream_single_per_s: rate(&rs),
            raw_single_per_s: rate(&raw_single),
            ratio_median: median(&single_ratios),
            ratios: single_ratios,
            batch: config.batch,
            raw_batch_per_s: rate(&raw_batch),
            raw_insert_only_single_per_s: rate(&of("raw-insert-only", "single")),
            raw_insert_only_batch_per_s: rate(&of("raw-insert-only", "batch")),
            ruststream_batch_per_s: rate(&rs_batch),
            batch_ratio_median: median(&batch_ratios),
            batch_ratios,
            command: config.command.clone(),
            date: crate::stats::utc_now(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            load1: crate::stats::load_average(),
        };
        eprintln!(
            "summary publish {} {} C={c}: ruststream {} rows/s, raw {} rows/s, median ratio {}; batches of {}: ruststream {} rows/s, raw {} rows/s, median ratio {}",
            summary.adapter,
            summary.database,
            num(summary.ruststream_single_per_s),
            num(summary.raw_single_per_s),
            summary
                .ratio_median
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
            summary.batch,
            num(summary.ruststream_batch_per_s),
            num(summary.raw_batch_per_s),
            summary
                .batch_ratio_median
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
        );
        lines.emit(&summary)?;
        summaries.push(summary);
    }
    Ok(summaries)
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"))
}

/// The database's dialect, read on a connection of the adapter's driver.
async fn detect(config: &Config) -> Result<Dialect, BoxError> {
    match &config.database {
        Database::Postgres(_) => Ok(Dialect::Postgres),
        Database::Sqlite(_) => Ok(Dialect::Sqlite),
        Database::MySql(url) => {
            let mut conn = sqlx::MySqlConnection::connect(url).await?;
            let dialect = dialect_of(&mut conn, &config.database).await;
            conn.close().await?;
            dialect
        }
    }
}

/// Where the `VALUES` tuple of an insert begins and ends in its text.
fn values_tuple(sql: &str) -> Result<(usize, usize), BoxError> {
    const VALUES: &str = " VALUES ";
    let start = sql
        .find(VALUES)
        .ok_or_else(|| format!("no VALUES in the publish statement: {sql}"))?
        + VALUES.len();
    let mut depth = 0;
    for (i, c) in sql[start..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Ok((start, start + i + 1));
                }
            }
            _ => {}
        }
    }
    Err(format!("no closed VALUES tuple in: {sql}").into())
}

/// The insert alone, where the publish statement wraps it (on PostgreSQL, a `WITH` whose
/// query notifies the listening sessions); `None` where the statement is the insert.
pub(crate) fn insert_only(statement: &Statement) -> Result<Option<Statement>, BoxError> {
    let sql = &*statement.sql;
    let start = sql
        .find("INSERT INTO ")
        .ok_or_else(|| format!("no INSERT in the publish statement: {sql}"))?;
    let (_, end) = values_tuple(sql)?;
    if start == 0 && end == sql.len() {
        return Ok(None);
    }
    Ok(Some(Statement {
        sql: sql[start..end].into(),
        ..statement.clone()
    }))
}

/// The publish statement with its `VALUES` tuple repeated `rows` times, the placeholders of
/// PostgreSQL (`$n`) and SQLite (`?n`) numbered on; what follows the tuple (PostgreSQL's
/// notification around the insert) stays once.
pub(crate) fn multi_row(statement: &Statement, rows: usize) -> Result<String, BoxError> {
    let sql = &*statement.sql;
    let (start, end) = values_tuple(sql)?;
    let tuple = &sql[start..end];
    let per_row = statement.args.len();
    let mut out = sql[..start].to_owned();
    for row in 0..rows {
        if row > 0 {
            out.push_str(", ");
        }
        let mut chars = tuple.chars().peekable();
        while let Some(c) = chars.next() {
            out.push(c);
            if c == '$' || c == '?' {
                let mut digits = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(*d);
                    chars.next();
                }
                if !digits.is_empty() {
                    let n: usize = digits.parse()?;
                    out.push_str(&(n + row * per_row).to_string());
                }
            }
        }
    }
    out.push_str(&sql[end..]);
    Ok(out)
}

/// One raw task: inserts until every row is taken.
async fn raw_task<C: RawConn>(mut conn: C, shared: Arc<Shared>) -> Result<(), BoxError> {
    let kind = if shared.rows_per_insert == 1 {
        "Publish"
    } else {
        "Publish (multi-row)"
    };
    while let Some(first) = shared.take() {
        let binds = shared.binds(first, shared.rows_per_insert)?;
        shared.stats.count(kind);
        let issued = Instant::now();
        conn.execute(&shared.sql, binds).await?;
        let took = issued.elapsed();
        shared.stats.timed(kind, took);
        shared.called(took);
        shared.stats.bar.inc(shared.rows_per_insert);
    }
    Ok(())
}

/// Opens `c` connections, writes one untimed insert on each, then runs the raw tasks.
/// Answers the time from the start to the last reply.
async fn raw(config: &Config, c: usize, shared: Arc<Shared>) -> Result<Duration, BoxError> {
    async fn warm<C: RawConn>(conn: &mut C, shared: &Shared) -> Result<(), BoxError> {
        let binds = shared.binds(u64::MAX / 2, shared.rows_per_insert)?;
        conn.execute(&shared.sql, binds).await?;
        Ok(())
    }
    async fn spawn_all<C: RawConn>(
        conns: Vec<C>,
        shared: Arc<Shared>,
    ) -> Result<Duration, BoxError> {
        let started = Instant::now();
        let mut tasks = Vec::new();
        for conn in conns {
            shared.stats.acquired();
            tasks.push(tokio::spawn(raw_task(conn, shared.clone())));
        }
        let mut result = Ok(());
        for task in tasks {
            if let Err(error) = task.await? {
                result = Err(error);
            }
        }
        result.map(|()| started.elapsed())
    }
    match (config.adapter, &config.database) {
        (AdapterKind::Sqlx, Database::Postgres(url)) => {
            let mut conns = Vec::new();
            for _ in 0..c {
                let mut conn = sqlx::PgConnection::connect(url).await?;
                warm(&mut conn, &shared).await?;
                conns.push(conn);
            }
            spawn_all(conns, shared).await
        }
        (AdapterKind::Sqlx, Database::MySql(url)) => {
            let mut conns = Vec::new();
            for _ in 0..c {
                let mut conn = sqlx::MySqlConnection::connect(url).await?;
                warm(&mut conn, &shared).await?;
                conns.push(conn);
            }
            spawn_all(conns, shared).await
        }
        (AdapterKind::Sqlx, Database::Sqlite(path)) => {
            let mut conns = Vec::new();
            for _ in 0..c {
                let mut conn =
                    sqlx::SqliteConnection::connect_with(&drivers::sqlite_options(path)).await?;
                warm(&mut conn, &shared).await?;
                conns.push(conn);
            }
            spawn_all(conns, shared).await
        }
        (AdapterKind::TokioPostgres, Database::Postgres(url)) => {
            let mut conns = Vec::new();
            for _ in 0..c {
                let mut conn = drivers::TokioPg::connect(url).await?;
                warm(&mut conn, &shared).await?;
                conns.push(conn);
            }
            spawn_all(conns, shared).await
        }
        (AdapterKind::MysqlAsync, Database::MySql(url)) => {
            let opts = mysql_async::Opts::from_url(url)?;
            let mut conns = Vec::new();
            for _ in 0..c {
                let mut conn = drivers::MyAsync(mysql_async::Conn::new(opts.clone()).await?);
                warm(&mut conn, &shared).await?;
                conns.push(conn);
            }
            spawn_all(conns, shared).await
        }
        (AdapterKind::Rusqlite, Database::Sqlite(path)) => {
            // Blocking connections: each task on a thread of its own.
            let mut conns = Vec::new();
            for _ in 0..c {
                let mut conn = drivers::open_rusqlite(path)?;
                warm(&mut conn, &shared).await?;
                conns.push(conn);
            }
            let started = Instant::now();
            let mut threads = Vec::new();
            for conn in conns {
                shared.stats.acquired();
                let shared = shared.clone();
                threads.push(std::thread::spawn(move || -> Result<(), BoxError> {
                    let rt = tokio::runtime::Builder::new_current_thread().build()?;
                    rt.block_on(raw_task(conn, shared))
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
            Ok(elapsed)
        }
        (adapter, database) => Err(format!(
            "--adapter {} does not run on {}",
            adapter.name(),
            database.family()
        )
        .into()),
    }
}

/// The ruststream side: the adapter's broker, started with no subscription, and `c` tasks
/// publishing through one `Publisher`.
async fn framework(config: &Config, c: usize, shared: Arc<Shared>) -> Result<Duration, BoxError> {
    with_broker!(
        config,
        c + 2,
        |make| publish_through(make(), c, shared).await,
        publish_through(make(), c, shared).await
    )
}

fn message(shared: &Shared, n: u64) -> Result<Message, BoxError> {
    Ok(Message::json(&Job { t: now_us() })?.column("k", (n % shared.keys) as i64))
}

async fn publish_through<A: Adapter>(
    adapter: A,
    c: usize,
    shared: Arc<Shared>,
) -> Result<Duration, BoxError> {
    let handle = BrokerHandle::new(Counted::new(adapter, shared.stats.clone(), Form::Advisory));
    let running = handle
        .start(Vec::new(), ruststream::exec::current())
        .await?;
    let publisher = handle.publisher::<PublishJob>();
    // Untimed: c publishes at once (of a batch, in the batch runs) open the pool's
    // connections.
    let rows = shared.rows_per_insert;
    let mut warm = Vec::new();
    for _ in 0..c {
        let publisher = publisher.clone();
        let messages = (0..rows)
            .map(|n| message(&shared, n))
            .collect::<Result<Vec<_>, _>>()?;
        warm.push(tokio::spawn(async move {
            publisher.publish_all(messages).await
        }));
    }
    for task in warm {
        task.await??;
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..c {
        let publisher = publisher.clone();
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(first) = shared.take() {
                if shared.rows_per_insert == 1 {
                    let message = message(&shared, first)?;
                    let issued = Instant::now();
                    publisher.publish(message).await?;
                    shared.called(issued.elapsed());
                } else {
                    let messages = (first..first + shared.rows_per_insert)
                        .map(|n| message(&shared, n))
                        .collect::<Result<Vec<_>, _>>()?;
                    let issued = Instant::now();
                    publisher.publish_all(messages).await?;
                    shared.called(issued.elapsed());
                }
                shared.stats.bar.inc(shared.rows_per_insert);
            }
            Ok::<(), BoxError>(())
        }));
    }
    let mut result = Ok(());
    for task in tasks {
        if let Err(error) = task.await? {
            result = Err(error);
        }
    }
    let elapsed = started.elapsed();
    running.shutdown().await;
    result.map(|()| elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_row_insert_repeats_the_tuple_and_numbers_the_placeholders_on() {
        let desc = PublishJob::TABLE.table_desc();
        for dialect in [
            Dialect::Postgres,
            Dialect::MariaDb,
            Dialect::MySql,
            Dialect::Sqlite,
        ] {
            let statement = Statements::render(dialect, desc, 1).publish;
            let sql = multi_row(&statement, 3).expect("a VALUES tuple");
            let one = multi_row(&statement, 1).expect("a VALUES tuple");
            assert_eq!(one, &*statement.sql, "one row is the statement itself");
            let tuples = match dialect {
                Dialect::Postgres => "($1, $2), ($3, $4), ($5, $6)",
                Dialect::Sqlite => "(?1, ?2), (?3, ?4), (?5, ?6)",
                Dialect::MySql | Dialect::MariaDb => "(?, ?), (?, ?), (?, ?)",
            };
            assert!(sql.contains(tuples), "{dialect:?}: {sql}");
            assert_eq!(sql.matches(" VALUES ").count(), 1);
            let core = Statements::publish_rows(dialect, desc, 3).expect("columns to write");
            assert_eq!(sql, &*core.sql, "the core's batched insert");
            let insert = insert_only(&statement)
                .expect("an insert")
                .map_or(statement.sql.clone(), |s| s.sql);
            assert!(insert.starts_with("INSERT INTO "), "{insert}");
            assert!(insert.ends_with(')'), "{insert}");
        }
    }
}

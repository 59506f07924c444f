//! The peer: another queue on the same PostgreSQL, doing the same jobs in the same
//! invocation: apalis (`--peer apalis`), below, or graphile-worker (`--peer graphile`,
//! tools/bench/src/graphile.rs).
//!
//! **apalis** 1.0 with its PostgreSQL storage (`apalis-postgres` 1.0, on the same sqlx 0.9):
//!
//! - Before each of its runs, `PostgresStorage::setup` (its migrations, idempotent) and
//!   `TRUNCATE apalis.jobs, apalis.workers` on a connection of its own, then the backlog is
//!   pushed through apalis's own `TaskSink::push_bulk` in chunks of 200 (one
//!   `INSERT .. SELECT unnest(..)` transaction each, the same chunks as the other sides'
//!   multi-row inserts), each job carrying its insert time.
//! - The run: one apalis `Worker` named `ruststream-bench-<pid>-<round>` on a
//!   `PostgresStorage` with apalis-postgres's default `Config` (batch size 10, or N with
//!   `--peer apalis:N`; results persisted, tasks locked while in work, heartbeat 30 s) in
//!   queue `ruststream-bench`, `.concurrency(W)` (tower's concurrency limit: W handlers at
//!   once), woken every 1 ms (`poll_with_interval`, the same poll interval the ruststream side
//!   gets), a pool of W + 2 sqlx connections opened lazily (inside the clock, as the ruststream
//!   side's pool is). The handler is the same as the other sides': it records the pickup
//!   latency from the job's insert time and works `--handler-ms` (a yield when 0). Without
//!   the interval, once a fetch finds the queue empty the worker is woken by its heartbeat
//!   (30 s) alone, and the acknowledgements of jobs that ended meanwhile wait for it: a run
//!   can end 30 s late.
//! - The clock runs from spawning the worker to the last job **settled in the database**: the
//!   handlers count their ends; once all N have ended, a connection of the bench's own (opened
//!   before the clock) polls `SELECT count(*) .. WHERE status = 'Done'` every millisecond
//!   until it reads N. apalis writes a job's end from the worker's event loop in batches (an
//!   `UPDATE` of the done jobs from a JSON array), after the handler returns, so counting the
//!   handlers alone would stop its clock before its last acknowledgement.
//! - Statements: sqlx reports every statement it runs as a `tracing` event of target
//!   `sqlx::query` (its first four words and its time); the worker's future runs under a
//!   subscriber of its own (`WithSubscriber`, so no other side is observed) that counts them by
//!   those words, with their mean time from sqlx's start of the statement to its end, into the
//!   JSON's `statements` and `statement_mean_us`. sqlx reports its `COMMIT`s but not the
//!   `BEGIN` it sends before each transaction (one round trip per `COMMIT`), so the peer's
//!   `statements_per_job` leaves the `BEGIN`s out.
//! - Peak connections: the pool's connections in use (`size - num_idle`), sampled every 1-2
//!   ms. Settle latency is not seen (apalis acknowledges inside its storage).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use apalis::prelude::{
    BackendExt, BoxDynError, Data, TaskSink, WorkerBuilder, WorkerBuilderExt, WorkerContext,
};
use apalis_postgres::PostgresStorage;
use serde::Serialize;
use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;
use tracing::instrument::WithSubscriber;

use crate::stats::{Job, Stats, median, now_us};
use crate::{BoxError, Config, Database, RunRecord, Side};

/// A queue library run beside ruststream (`--peer NAME`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PeerKind {
    /// apalis 1.0 on `apalis-postgres` 1.0 (PostgreSQL only): `--peer apalis` with its default
    /// batch size (10 jobs per fetch), `--peer apalis:N` with N.
    Apalis {
        /// Jobs claimed per fetch (apalis-postgres's `Config::batch_size`).
        batch: usize,
    },
    /// graphile-worker 0.17 (Node.js): `--peer graphile`; `graphile:queues` puts each job in
    /// the named queue of its key; `..:batch` turns on its local queue and batched
    /// completions.
    Graphile {
        /// Jobs in named queues, one per key.
        queues: bool,
        /// Its batching options.
        batch: bool,
    },
}

impl PeerKind {
    /// The peer's name, its `implementation` in the JSON lines.
    pub fn name(self) -> &'static str {
        match self {
            PeerKind::Apalis { .. } => "apalis",
            PeerKind::Graphile {
                queues: false,
                batch: false,
            } => "graphile",
            PeerKind::Graphile {
                queues: true,
                batch: false,
            } => "graphile-queues",
            PeerKind::Graphile {
                queues: false,
                batch: true,
            } => "graphile-batch",
            PeerKind::Graphile {
                queues: true,
                batch: true,
            } => "graphile-queues-batch",
        }
    }

    /// The peer of a `--peer` value: `apalis`, `apalis:BATCH`, `graphile`, `graphile:queues`,
    /// `graphile:batch` or `graphile:queues:batch`.
    pub fn from_name(name: &str) -> Result<Self, String> {
        if let Some(rest) = name.strip_prefix("graphile") {
            let options: Vec<&str> = rest.split(':').filter(|o| !o.is_empty()).collect();
            if !rest.is_empty() && !rest.starts_with(':')
                || options.iter().any(|o| !matches!(*o, "queues" | "batch"))
            {
                return Err(format!(
                    "--peer {name}: unknown (graphile, graphile:queues, graphile:batch, graphile:queues:batch)"
                ));
            }
            return Ok(PeerKind::Graphile {
                queues: options.contains(&"queues"),
                batch: options.contains(&"batch"),
            });
        }
        let (peer, batch) = match name.split_once(':') {
            Some((peer, batch)) => match batch.parse::<usize>() {
                Ok(n) if n > 0 => (peer, Some(n)),
                _ => return Err(format!("--peer {name}: the batch size is a number above 0")),
            },
            None => (name, None),
        };
        match peer {
            "apalis" => Ok(PeerKind::Apalis {
                batch: batch.unwrap_or(apalis_postgres::Config::default().batch_size),
            }),
            _ => Err(format!(
                "--peer {name}: unknown (apalis, apalis:BATCH, graphile[:queues][:batch])"
            )),
        }
    }

    /// Jobs claimed per fetch (graphile-worker: its local queue, W + 1, or 1).
    fn batch(self, workers: usize) -> usize {
        match self {
            PeerKind::Apalis { batch } => batch,
            PeerKind::Graphile { batch: true, .. } => workers + 1,
            PeerKind::Graphile { batch: false, .. } => 1,
        }
    }
}

/// apalis's queue (its `job_type`) for the bench's jobs.
pub const QUEUE: &str = "ruststream-bench";

/// How often the worker is woken to fetch and to write its acknowledgements when idle: the
/// ruststream side's poll interval.
const POLL_INTERVAL: Duration = Duration::from_millis(1);

/// Jobs per `push_bulk` when the backlog is published: the same chunks as the other sides.
const CHUNK: u64 = 200;

/// The peer's part of the summary line: its jobs per second and the ratios ruststream/peer.
#[derive(Clone, Debug, Serialize)]
pub struct PeerSummary {
    /// The peer (`"apalis"`).
    pub peer: &'static str,
    /// apalis-postgres's batch size (jobs claimed per fetch).
    pub peer_batch_size: usize,
    /// The interval the peer's worker is woken at, ms.
    pub peer_poll_interval_ms: f64,
    /// The peer's jobs per second, median over the rounds.
    pub peer_jobs_per_s: Option<f64>,
    /// Each round's ratio ruststream/peer in jobs per second.
    pub peer_ratios: Vec<f64>,
    /// The median of `peer_ratios`.
    pub peer_ratio_median: Option<f64>,
    /// The peer's pickup p50, median over the rounds, ms.
    pub peer_pickup_p50_ms: Option<f64>,
    /// The peer's pickup p99, median over the rounds, ms.
    pub peer_pickup_p99_ms: Option<f64>,
}

/// The sides of a round: baseline (unless `--no-baseline`), ruststream, then the peer.
pub(crate) fn sides(config: &Config) -> Vec<Side> {
    let mut sides = Vec::new();
    if !config.no_baseline {
        sides.push(Side::Limit);
        sides.push(Side::Baseline);
    }
    sides.push(Side::RustStream);
    if config.peer.is_some() {
        sides.push(Side::Peer);
    }
    sides
}

/// The name a side's JSON lines carry in `implementation`.
pub(crate) fn implementation(config: &Config, side: Side) -> &'static str {
    match side {
        Side::Limit => "limit",
        Side::Baseline => "baseline",
        Side::RustStream => "ruststream",
        Side::Peer => config.peer.map_or("peer", PeerKind::name),
    }
}

/// Checks that the peer runs on the database the command line names.
pub(crate) fn check(config: &Config) -> Result<(), String> {
    match (config.peer, &config.database) {
        (Some(peer), database) if !matches!(database, Database::Postgres(_)) => Err(format!(
            "--peer {} runs on PostgreSQL only, not on {}",
            peer.name(),
            database.family()
        )),
        _ => Ok(()),
    }
}

fn url(config: &Config) -> Result<&str, BoxError> {
    match &config.database {
        Database::Postgres(url) => Ok(url),
        other => Err(format!(
            "the peer runs on PostgreSQL only, not on {}",
            other.family()
        )
        .into()),
    }
}

fn storage_config(peer: PeerKind) -> apalis_postgres::Config {
    // The defaults but the batch size (10 unless `--peer apalis:N`): results persisted (the
    // acknowledgement: without it a job never reads done), tasks locked while in work,
    // heartbeat 30 s.
    apalis_postgres::Config::default()
        .queue(QUEUE)
        .batch_size(peer.batch(0))
}

fn peer_of(config: &Config) -> Result<PeerKind, BoxError> {
    config.peer.ok_or_else(|| "no --peer".into())
}

/// Before a peer run: apalis's schema, an empty queue, and the backlog pushed through
/// apalis's storage in chunks of 200, each job carrying its insert time.
pub(crate) async fn prepare(config: &Config) -> Result<(), BoxError> {
    let peer = peer_of(config)?;
    if let PeerKind::Graphile { queues, .. } = peer {
        return crate::graphile::prepare(config, url(config)?, queues).await;
    }
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(url(config)?)
        .await?;
    PostgresStorage::setup(&pool)
        .await
        .map_err(|e| format!("apalis setup: {e}"))?;
    sqlx::query("TRUNCATE apalis.jobs, apalis.workers")
        .execute(&pool)
        .await?;
    let mut storage = PostgresStorage::<Job>::new(&pool).with_config(storage_config(peer));
    let mut n = 0;
    while n < config.jobs {
        let chunk = (config.jobs - n).min(CHUNK);
        let jobs: Vec<Job> = (0..chunk).map(|_| Job { t: now_us() }).collect();
        storage
            .push_bulk(jobs)
            .await
            .map_err(|e| format!("apalis push_bulk: {e}"))?;
        n += chunk;
    }
    pool.close().await;
    Ok(())
}

/// What the peer's handler shares.
#[derive(Clone)]
struct Shared {
    stats: Arc<Stats>,
    handler_ms: u64,
    ended: Arc<AtomicU64>,
}

/// The handler: records the pickup latency, works `handler_ms`, counts its end.
async fn handle(job: Job, shared: Data<Shared>) -> Result<(), BoxDynError> {
    shared.stats.pickup(job.t);
    crate::work(shared.handler_ms).await;
    shared.ended.fetch_add(1, Ordering::SeqCst);
    shared.stats.bar.inc(1);
    Ok(())
}

/// A `tracing` subscriber that counts sqlx's statements (events of target `sqlx::query`) by
/// their first words, and their time, into the run's stats; it observes nothing else.
struct Statements {
    stats: Arc<Stats>,
}

/// The fields of a `sqlx::query` event the count needs.
#[derive(Default)]
struct QueryFields {
    summary: String,
    elapsed_secs: f64,
}

impl tracing::field::Visit for QueryFields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "summary" {
            value.clone_into(&mut self.summary);
        }
    }

    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        if field.name() == "elapsed_secs" {
            self.elapsed_secs = value;
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" {
            self.summary = format!("{value:?}").trim_matches('"').to_owned();
        }
    }
}

impl tracing::Subscriber for Statements {
    fn register_callsite(
        &self,
        meta: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if meta.target() == "sqlx::query" {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        meta.target() == "sqlx::query"
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::DEBUG)
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = QueryFields::default();
        event.record(&mut fields);
        let kind = fields.summary.trim_end_matches(" …");
        self.stats.count(kind);
        self.stats
            .timed(kind, Duration::from_secs_f64(fields.elapsed_secs.max(0.0)));
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// One peer run on the prepared backlog: answers the time from the worker's start to the last
/// job settled in the database.
pub(crate) async fn run(
    config: &Config,
    stats: Arc<Stats>,
    round: usize,
) -> Result<Duration, BoxError> {
    let url = url(config)?;
    if let PeerKind::Graphile { batch, .. } = peer_of(config)? {
        return crate::graphile::run(config, url, batch, stats).await;
    }
    let mut probe = sqlx::PgConnection::connect(url).await?;
    // A connection per worker and two, as ruststream's pool where no row claimed ahead holds
    // one.
    let pool = PgPoolOptions::new()
        .max_connections((config.workers + 2) as u32)
        .connect_lazy(url)?;
    let storage = PostgresStorage::<Job>::new(&pool)
        .with_config(storage_config(peer_of(config)?))
        .poll_with_interval(POLL_INTERVAL);
    let ended = Arc::new(AtomicU64::new(0));
    let shared = Shared {
        stats: stats.clone(),
        handler_ms: config.handler_ms,
        ended: ended.clone(),
    };
    let ctx = WorkerContext::new(&format!("ruststream-bench-{}-{round}", std::process::id()));
    let worker = WorkerBuilder::new(&ctx)
        .backend(storage)
        .data(shared)
        .concurrency(config.workers)
        .build(handle);
    let in_use = || pool.size() as i64 - pool.num_idle() as i64;

    let started = Instant::now();
    let counter = tracing::Dispatch::new(Statements {
        stats: stats.clone(),
    });
    let running = tokio::spawn(worker.run().with_subscriber(counter));
    let result = async {
        // The handlers' ends, then the database's count of done jobs.
        let mut last = (0, Instant::now());
        while ended.load(Ordering::SeqCst) < config.jobs {
            stats.peak_at_least(in_use());
            let now = ended.load(Ordering::SeqCst);
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(60) || running.is_finished() {
                return Err::<(), BoxError>(
                    format!(
                        "apalis: no handler ended for 60 s or the worker stopped: {now} of {} ended",
                        config.jobs
                    )
                    .into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let waiting = Instant::now();
        loop {
            stats.peak_at_least(in_use());
            let (done, failed): (i64, i64) = sqlx::query_as(
                "SELECT count(*) FILTER (WHERE status = 'Done'), \
                 count(*) FILTER (WHERE status IN ('Failed', 'Killed')) \
                 FROM apalis.jobs WHERE job_type = $1",
            )
            .bind(QUEUE)
            .fetch_one(&mut probe)
            .await?;
            if failed > 0 {
                return Err(format!("apalis: {failed} jobs failed").into());
            }
            if done as u64 >= config.jobs {
                return Ok(());
            }
            if waiting.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "apalis: {done} of {} jobs done 60 s after every handler ended",
                    config.jobs
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    .await;
    let elapsed = started.elapsed();
    let _ = ctx.stop();
    match tokio::time::timeout(Duration::from_secs(30), running).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(error))) if result.is_ok() => return Err(format!("apalis: {error}").into()),
        Ok(Err(error)) if result.is_ok() => return Err(error.into()),
        Err(_) if result.is_ok() => return Err("apalis: the worker did not stop in 30 s".into()),
        _ => {}
    }
    pool.close().await;
    probe.close().await?;
    result.map(|()| elapsed)
}

/// The peer's part of the summary, and its line on stderr; `None` without `--peer`.
pub(crate) fn summary(config: &Config, records: &[RunRecord]) -> Option<PeerSummary> {
    let peer = config.peer?;
    let of = |side: &str| -> Vec<&RunRecord> {
        records
            .iter()
            .filter(|r| r.implementation == side)
            .collect()
    };
    let rs = of("ruststream");
    let them = of(peer.name());
    let ratios: Vec<f64> = rs
        .iter()
        .filter_map(|r| {
            them.iter()
                .find(|p| p.round == r.round)
                .map(|p| r.jobs_per_s / p.jobs_per_s)
        })
        .collect();
    let med = |f: fn(&RunRecord) -> Option<f64>| -> Option<f64> {
        median(&them.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
    };
    let summary = PeerSummary {
        peer: peer.name(),
        peer_batch_size: peer.batch(config.workers),
        peer_poll_interval_ms: match peer {
            // graphile-worker is woken by its LISTEN; its poll is the fallback.
            PeerKind::Graphile { .. } => 1000.0,
            PeerKind::Apalis { .. } => POLL_INTERVAL.as_secs_f64() * 1000.0,
        },
        peer_jobs_per_s: med(|r| Some(r.jobs_per_s)),
        peer_ratio_median: median(&ratios),
        peer_ratios: ratios,
        peer_pickup_p50_ms: med(|r| r.pickup_p50_ms),
        peer_pickup_p99_ms: med(|r| r.pickup_p99_ms),
    };
    eprintln!(
        "summary {} W={}: {} {} jobs/s, median ratio ruststream/{} {}",
        config.form_name(),
        config.workers,
        summary.peer,
        summary
            .peer_jobs_per_s
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.0}")),
        summary.peer,
        summary
            .peer_ratio_median
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
    );
    Some(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        Config::parse(args.iter().map(|a| (*a).to_owned()))
    }

    #[test]
    fn peer_runs_after_the_others_on_postgres() {
        let config = parse(&[
            "--adapter",
            "tokio-postgres",
            "--url",
            "postgres://postgres@127.0.0.1:5432/test",
            "--form",
            "lease",
            "--peer",
            "apalis",
        ])
        .expect("a valid command line");
        assert_eq!(config.peer, Some(PeerKind::Apalis { batch: 10 }));
        assert_eq!(
            PeerKind::from_name("apalis:4"),
            Ok(PeerKind::Apalis { batch: 4 })
        );
        assert!(PeerKind::from_name("apalis:0").is_err());
        let sides = sides(&config);
        assert!(sides == [Side::Limit, Side::Baseline, Side::RustStream, Side::Peer]);
        assert_eq!(implementation(&config, Side::Peer), "apalis");
    }

    #[test]
    fn peer_is_postgres_only_and_known() {
        let sqlite = parse(&[
            "--adapter",
            "sqlx",
            "--url",
            "sqlite:target/bench.db",
            "--form",
            "lease",
            "--peer",
            "apalis",
        ]);
        assert!(sqlite.is_err_and(|e| e.contains("PostgreSQL only")));
        let unknown = parse(&[
            "--adapter",
            "sqlx",
            "--url",
            "postgres://postgres@127.0.0.1:5432/test",
            "--form",
            "lease",
            "--peer",
            "sqlxmq",
        ]);
        assert!(unknown.is_err_and(|e| e.contains("unknown")));
    }

    #[test]
    fn without_peer_the_sides_are_as_before() {
        let config = parse(&[
            "--adapter",
            "sqlx",
            "--url",
            "postgres://postgres@127.0.0.1:5432/test",
            "--form",
            "row-lock",
            "--no-baseline",
        ])
        .expect("a valid command line");
        assert!(sides(&config) == [Side::RustStream]);
        assert!(summary(&config, &[]).is_none());
    }
}

#[cfg(test)]
mod graphile_names {
    use super::PeerKind;

    #[test]
    fn graphile_takes_its_queues_and_batching_options() {
        let peer = |q, b| PeerKind::Graphile {
            queues: q,
            batch: b,
        };
        assert_eq!(PeerKind::from_name("graphile"), Ok(peer(false, false)));
        assert_eq!(
            PeerKind::from_name("graphile:queues"),
            Ok(peer(true, false))
        );
        assert_eq!(PeerKind::from_name("graphile:batch"), Ok(peer(false, true)));
        assert_eq!(
            PeerKind::from_name("graphile:queues:batch"),
            Ok(peer(true, true))
        );
        assert_eq!(peer(true, true).name(), "graphile-queues-batch");
        assert!(PeerKind::from_name("graphile:fast").is_err());
        assert!(PeerKind::from_name("graphileworker").is_err());
    }
}

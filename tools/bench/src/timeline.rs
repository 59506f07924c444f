//! A run over time: every second, the rows settled in that second, the claim statements'
//! latency in it, and on PostgreSQL the queue table's dead and live tuples as the server's
//! statistics count them (`pg_stat_user_tables`). With a transaction held open elsewhere
//! (`--hold-xmin`) vacuum cannot remove the rows the run deletes, so the dead tuples grow
//! through the run; the samples show whether the rate and the claims' latency follow them.
//!
//! The claim statements are those that find or take a row: the row lock form's count, mark
//! and lock, the lease form's claim, the advisory form's candidates, lock try and take (and
//! the limit loop's statements of the same names).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::stats::{Stats, quantile_ms};
use crate::{BoxError, Database};

/// Whether a statement kind (as the bench counts it) finds or takes rows.
pub(crate) fn is_claim(kind: &str) -> bool {
    const CLAIMS: &[&str] = &[
        "CountRow",
        "CountAttempt",
        "SelectRowId",
        "LockRow",
        "LockRowById",
        "LockRowByIdUnmarking",
        "MarkRows",
        "ClaimLease",
        "SelectLease",
        "MarkLease",
        "Candidates",
        "TryLock",
        "Take",
        "TakeCount",
    ];
    let head = kind.split('(').next().unwrap_or(kind);
    CLAIMS.contains(&head)
}

/// One second of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Seconds from the run's start to the sample's end.
    pub t_s: f64,
    /// Rows settled in the second.
    pub jobs_per_s: f64,
    /// Rows settled so far.
    pub settled: u64,
    /// Claim statements that replied in the second.
    pub claims: usize,
    /// Their median time from issue to reply, ms.
    pub claim_p50_ms: Option<f64>,
    /// Their 99th percentile, ms.
    pub claim_p99_ms: Option<f64>,
    /// The advisory form: its looks from the table's start in the second (the others start
    /// past the rows taken before them).
    pub looks_from_start: u64,
    /// PostgreSQL: the queue table's dead tuples (`n_dead_tup`) at the sample.
    pub dead_tuples: Option<i64>,
    /// PostgreSQL: its live tuples (`n_live_tup`).
    pub live_tuples: Option<i64>,
}

/// The sampler of one run: started before it, finished after it.
pub(crate) struct Sampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<Timeline>,
}

/// A run's samples, and every claim statement's time through it.
#[derive(Default)]
pub(crate) struct Timeline {
    /// One a second.
    pub(crate) samples: Vec<Sample>,
    /// Every claim statement's time from issue to reply, microseconds, sorted.
    pub(crate) claims_us: Vec<i64>,
}

impl Sampler {
    /// Samples `stats` every second until [`Sampler::finish`]; on PostgreSQL reads `table`'s
    /// tuples on a connection of its own.
    pub(crate) async fn start(
        database: &Database,
        table: &str,
        stats: Arc<Stats>,
    ) -> Result<Self, BoxError> {
        let conn = match database {
            Database::Postgres(url) => {
                use sqlx::Connection;
                Some(sqlx::PgConnection::connect(url).await?)
            }
            _ => None,
        };
        let table = table.to_owned();
        let (stop, mut stopped) = watch::channel(false);
        stats.keep_claim_samples();
        let task = tokio::spawn(async move {
            let mut conn = conn;
            let began = Instant::now();
            let mut samples = Vec::new();
            let mut all = Vec::new();
            let mut last = 0u64;
            let mut last_from_start = 0u64;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                let end = tokio::select! {
                    _ = tick.tick() => false,
                    _ = stopped.changed() => true,
                };
                let settled = stats.settled();
                let from_start = stats
                    .statements()
                    .get("candidates from the start")
                    .copied()
                    .unwrap_or(0);
                let mut claims = stats.take_claim_samples();
                claims.sort_unstable();
                let (dead, live) = match conn.as_mut() {
                    Some(conn) => tuples(conn, &table).await.unwrap_or((None, None)),
                    None => (None, None),
                };
                let t_s = began.elapsed().as_secs_f64();
                let window = t_s - samples.last().map_or(0.0, |s: &Sample| s.t_s);
                samples.push(Sample {
                    t_s,
                    jobs_per_s: (settled - last) as f64 / window.max(1e-3),
                    settled,
                    claims: claims.len(),
                    looks_from_start: from_start - last_from_start,
                    claim_p50_ms: quantile_ms(&claims, 0.5),
                    claim_p99_ms: quantile_ms(&claims, 0.99),
                    dead_tuples: dead,
                    live_tuples: live,
                });
                last = settled;
                last_from_start = from_start;
                all.extend_from_slice(&claims);
                if end {
                    all.sort_unstable();
                    return Timeline {
                        samples,
                        claims_us: all,
                    };
                }
            }
        });
        Ok(Self { stop, task })
    }

    /// Stops the sampler: the samples, the last one up to now.
    pub(crate) async fn finish(self) -> Timeline {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// The table's dead and live tuples as the server's statistics count them.
async fn tuples(
    conn: &mut sqlx::PgConnection,
    table: &str,
) -> Result<(Option<i64>, Option<i64>), sqlx::Error> {
    let row: Option<(i64, i64)> =
        sqlx::query_as("SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables WHERE relname = $1")
            .bind(table)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(row.map_or((None, None), |(d, l)| (Some(d), Some(l))))
}

/// What a run's samples say in one line: the rate of its first and last fifth, the dead
/// tuples at the end, the claims' p99 in the first and last fifth.
pub(crate) fn describe(samples: &[Sample]) -> String {
    if samples.len() < 2 {
        return String::new();
    }
    let fifth = (samples.len() / 5).max(1);
    let (first, last) = (&samples[..fifth], &samples[samples.len() - fifth..]);
    let rate = |s: &[Sample]| s.iter().map(|s| s.jobs_per_s).sum::<f64>() / s.len() as f64;
    let p99 = |s: &[Sample]| {
        let v: Vec<f64> = s.iter().filter_map(|s| s.claim_p99_ms).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
    let dead = samples.iter().filter_map(|s| s.dead_tuples).max();
    format!(
        "over time: {:.0} → {:.0} jobs/s (first/last fifth), claim p99 {} → {} ms{}",
        rate(first),
        rate(last),
        ms(p99(first)),
        ms(p99(last)),
        dead.map_or_else(String::new, |d| format!(", dead tuples up to {d}")),
    )
}

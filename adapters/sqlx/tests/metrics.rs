//! A service on PostgreSQL (`RUSTSTREAM_PG_URL`, default `postgres://postgres@127.0.0.1:5432/test`)
//! records its metrics through the `metrics` facade, in the row lock form: publishes (a
//! publisher's and an outbox's in a transaction), claims, settlements by outcome, retries,
//! failures (rejected, and at the last attempt `max_attempts` allows), the rows in work, and the claim, pickup,
//! handler and settlement times.
//!
//! The recorder is global to this test binary: a test reads only the series labelled with its
//! table.

#[path = "databases/common.rs"]
mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::{Pg, TestDb, eventually};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use ruststream::{RetryPolicy, metrics};
use ruststream_sqlx::prelude::*;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

/// The snapshots of the recorder this binary installs.
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("no other recorder is installed");
        snapshotter
    })
}

/// A series: its name and its labels, sorted.
type Series = (String, Vec<(String, String)>);

/// What the recorder holds, summed over the snapshots taken (a snapshot empties the counters
/// and histograms it reads).
#[derive(Default)]
struct Recorded {
    counters: HashMap<Series, u64>,
    gauges: HashMap<Series, f64>,
    histograms: HashMap<Series, Vec<f64>>,
}

impl Recorded {
    /// Adds a snapshot of the recorder.
    fn take(&mut self) {
        for (key, _, _, value) in snapshotter().snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let series = (key.name().to_owned(), labels);
            match value {
                DebugValue::Counter(n) => *self.counters.entry(series).or_default() += n,
                DebugValue::Gauge(v) => {
                    self.gauges.insert(series, v.into_inner());
                }
                DebugValue::Histogram(vs) => self
                    .histograms
                    .entry(series)
                    .or_default()
                    .extend(vs.into_iter().map(|v| v.into_inner())),
            }
        }
    }

    fn matching<'a, V>(
        map: &'a HashMap<Series, V>,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a V> + 'a {
        map.iter()
            .filter(move |((n, ls), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, v)| v)
    }

    /// The sum of the counters of `name` that carry `labels`.
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        Self::matching(&self.counters, name, labels).sum()
    }

    /// The gauge of `name` that carries `labels`, as last read.
    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<f64> = Self::matching(&self.gauges, name, labels)
            .copied()
            .collect();
        assert!(found.len() <= 1, "one gauge {name} {labels:?}: {found:?}");
        found.first().copied()
    }

    /// The samples of the histograms of `name` that carry `labels`.
    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        Self::matching(&self.histograms, name, labels)
            .flatten()
            .copied()
            .collect()
    }
}

/// A row of `pg_metrics_jobs`: the row lock form, attempts counted, failed rows kept.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(table = "pg_metrics_jobs", failed_at = "failed_at", error = "error")]
struct MetricsJob {
    #[field(id, generated)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i32,
    #[field(payload)]
    payload: Vec<u8>,
}

const TABLE: &str = "pg_metrics_jobs";
const SUBSCRIPTION: &str = "pg-metrics-jobs";

/// What the handler does with a message.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
enum Act {
    /// Waits until the test lets it go, then acknowledges.
    Hold,
    Ack,
    /// Retries the first attempt, acknowledges the second.
    RetryOnce,
    Reject,
    /// Retries every attempt: past `max_attempts` the row fails without the handler.
    AlwaysRetry,
}

#[derive(Debug, Serialize, Deserialize)]
struct Job {
    n: u32,
    act: Act,
}

#[derive(Clone)]
struct Acts {
    held: Arc<AtomicBool>,
    release: Arc<Semaphore>,
}

impl Handle<Job, (), (), InboxContext> for Acts {
    async fn handle(
        &self,
        job: &Job,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let Ctx(attempt) = Ctx::<keys::Attempt>::from_context(ctx).await?;
        match job.act {
            Act::Hold => {
                self.held.store(true, Ordering::SeqCst);
                self.release.acquire().await.expect("open").forget();
                Ok(())
            }
            Act::Ack => Ok(()),
            Act::RetryOnce if attempt == 1 => Err(HandlerOutcome::retry()),
            Act::RetryOnce => Ok(()),
            Act::Reject => Err(HandlerOutcome::reject().with_error("rejected by the test")),
            Act::AlwaysRetry => Err(HandlerOutcome::retry().with_error("retried by the test")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_service_records_its_metrics() {
    const EACH: u32 = 3;
    snapshotter();
    let db = Pg::new("metrics").await;
    db.exec(
        "CREATE TABLE pg_metrics_jobs (id BIGSERIAL PRIMARY KEY, attempt INT NOT NULL DEFAULT 0,
             payload BYTEA NOT NULL, failed_at TIMESTAMPTZ, error TEXT);",
    )
    .await;
    // The held row goes in through the outbox, in a transaction, before the service starts.
    let mut tx = db.admin.begin().await.unwrap();
    SqlxOutbox::<MetricsJob, Postgres>::new()
        .publish(
            &mut tx,
            Message::json(&Job {
                n: 0,
                act: Act::Hold,
            })
            .unwrap(),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let acts = Acts {
        held: Arc::new(AtomicBool::new(false)),
        release: Arc::new(Semaphore::new(0)),
    };
    let broker = db.broker().handle();
    let publisher = broker.publisher::<MetricsJob>();
    let service = RustStream::new(AppInfo::new("metrics", "0.1.0"))
        .shutdown_timeout(Duration::from_secs(10))
        .with_broker(broker, |b| {
            b.include(
                subscriber(SUBSCRIPTION, acts.clone())
                    .map_source(|_| InboxQueue::<MetricsJob>::new(SUBSCRIPTION))
                    .workers(nonzero!(2))
                    .poll_interval(Duration::from_millis(100))
                    .retry_policy(RetryPolicy::immediate())
                    .max_attempts(2)
                    .build(),
            );
        });
    let sub = [("table", TABLE), ("subscription", SUBSCRIPTION)];
    let mut recorded = Recorded::default();
    service
        .run_until(async {
            eventually("the held row's handler starts", || async {
                acts.held.load(Ordering::SeqCst)
            })
            .await;
            recorded.take();
            assert_eq!(
                recorded.gauge(metrics::IN_WORK, &sub),
                Some(1.0),
                "the held row is in work"
            );
            assert_eq!(recorded.counter(metrics::CLAIMED, &sub), 1);
            assert_eq!(
                recorded.counter(metrics::PUBLISHED, &[("table", TABLE)]),
                1,
                "the outbox's row is counted"
            );
            acts.release.add_permits(1);
            let mut jobs = Vec::new();
            for act in [Act::Ack, Act::RetryOnce, Act::Reject, Act::AlwaysRetry] {
                for n in 0..EACH {
                    jobs.push(Message::json(&Job { n, act }).unwrap());
                }
            }
            publisher.publish_all(jobs).await.unwrap();
            let failed = 2 * i64::from(EACH);
            eventually(
                "every row is settled: the failed rows alone are left",
                || async {
                    db.scalar("SELECT COUNT(*) FROM pg_metrics_jobs").await == failed
                        && db
                            .scalar(
                                "SELECT COUNT(*) FROM pg_metrics_jobs WHERE failed_at IS NOT NULL",
                            )
                            .await
                            == failed
                },
            )
            .await;
        })
        .await
        .expect("the service runs");
    recorded.take();
    db.drop().await;

    let each = u64::from(EACH);
    // The held row, then three of each act: a retried row is handed twice, and a row retried
    // on every attempt is handed twice, and its second retry, the last attempt
    // `max_attempts(2)` allows, fails it at once.
    let handed = 1 + each + 2 * each + each + 2 * each;
    assert_eq!(
        recorded.counter(metrics::PUBLISHED, &[("table", TABLE)]),
        1 + 4 * each,
        "the outbox's row and the publisher's"
    );
    assert_eq!(recorded.counter(metrics::CLAIMED, &sub), handed);
    let settled = |outcome: &str| {
        recorded.counter(
            metrics::SETTLED,
            &[
                ("table", TABLE),
                ("subscription", SUBSCRIPTION),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(settled("acknowledged"), 1 + 2 * each);
    assert_eq!(settled("retried"), 2 * each);
    assert_eq!(settled("rejected"), 2 * each);
    assert_eq!(recorded.counter(metrics::SETTLED, &sub), handed);
    assert_eq!(recorded.counter(metrics::RETRIED, &sub), 2 * each);
    assert_eq!(
        recorded.counter(metrics::FAILED, &sub),
        2 * each,
        "rejected, and at the last attempt max_attempts allows"
    );
    assert_eq!(recorded.counter(metrics::RETURNED, &sub), 0);
    assert_eq!(recorded.gauge(metrics::IN_WORK, &sub), Some(0.0));
    assert_eq!(recorded.gauge(metrics::CLAIMED_AHEAD, &sub), Some(0.0));
    for histogram in [
        metrics::PICKUP,
        metrics::HANDLER_DURATION,
        metrics::SETTLE_DURATION,
    ] {
        let samples = recorded.samples(histogram, &sub);
        assert_eq!(
            samples.len() as u64,
            handed,
            "{histogram}: one sample per delivery: {samples:?}"
        );
        assert!(
            samples
                .iter()
                .all(|s| s.is_finite() && *s >= 0.0 && *s < 30.0),
            "{histogram}: {samples:?}"
        );
    }
    let claims = recorded.samples(metrics::CLAIM_DURATION, &sub);
    assert!(
        !claims.is_empty() && claims.iter().all(|s| s.is_finite() && *s > 0.0),
        "each claim's search is timed: {claims:?}"
    );
}

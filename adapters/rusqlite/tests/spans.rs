//! A service on a real SQLite file records a `delivery` span through `tracing` for each
//! delivery, with its table, subscription, row id, attempt and outcome. (The metrics every
//! adapter records are the conformance suite's `service_records_its_metrics`.)
//!
//! The tracing subscriber is global to this test binary: each test works on a table of its own
//! and reads only the spans labelled with it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ruststream::RetryPolicy;
use ruststream_rusqlite::RusqliteOutbox;
use ruststream_rusqlite::prelude::*;
use ruststream_rusqlite::rusqlite::Connection;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

const WAIT: Duration = Duration::from_secs(30);

/// The fields of every `delivery` span, by span.
type Spans = Arc<Mutex<BTreeMap<u64, BTreeMap<&'static str, String>>>>;

/// A tracing subscriber that keeps the fields of the `delivery` spans, as recorded.
struct Capture {
    next: AtomicU64,
    spans: Spans,
}

struct Fields<'a>(&'a mut BTreeMap<&'static str, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        if span.metadata().name() == "delivery" {
            let mut fields = BTreeMap::new();
            span.record(&mut Fields(&mut fields));
            self.spans.lock().unwrap().insert(id, fields);
        }
        tracing::span::Id::from_u64(id)
    }

    fn record(&self, span: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        if let Some(fields) = self.spans.lock().unwrap().get_mut(&span.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, _: &tracing::Event<'_>) {}

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// The `delivery` spans this binary's services opened.
fn spans() -> &'static Spans {
    static SPANS: OnceLock<Spans> = OnceLock::new();
    SPANS.get_or_init(|| {
        let spans = Spans::default();
        tracing::subscriber::set_global_default(Capture {
            next: AtomicU64::new(1),
            spans: spans.clone(),
        })
        .expect("no other tracing subscriber is installed");
        spans
    })
}

/// The spans of `table`'s deliveries.
fn spans_of(table: &str) -> Vec<BTreeMap<&'static str, String>> {
    spans()
        .lock()
        .unwrap()
        .values()
        .filter(|fields| fields.get("table").is_some_and(|t| t == table))
        .cloned()
        .collect()
}

/// A row of `metrics_jobs`: the lease form, attempts counted, failed rows kept.
#[derive(Inbox, Deserialize)]
#[inbox(table = "metrics_jobs", failed_at = "failed_at", error = "error")]
struct MetricsJob {
    #[field(id, generated)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i64,
    #[field(locked_until)]
    locked_until: Option<i64>,
    #[field(payload)]
    payload: Vec<u8>,
}

const TABLE: &str = "metrics_jobs";
const SUBSCRIPTION: &str = "metrics-jobs";

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

fn count(path: &std::path::Path, sql: &str) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn until(what: &str, check: impl Fn() -> bool) {
    let since = Instant::now();
    while !check() {
        assert!(since.elapsed() < WAIT, "waited {WAIT:?} for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_records_a_span_per_delivery() {
    const EACH: u32 = 3;
    spans();
    let dir = std::env::temp_dir().join(format!("ruststream-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("metrics.db");
    let _ = std::fs::remove_file(&path);
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE metrics_jobs (id INTEGER PRIMARY KEY AUTOINCREMENT,
             attempt INTEGER NOT NULL DEFAULT 0, locked_until INTEGER,
             payload BLOB NOT NULL, failed_at INTEGER, error TEXT);",
    )
    .unwrap();
    // The held row goes in through the outbox, before the service starts.
    RusqliteOutbox::<MetricsJob>::new()
        .publish(
            &conn,
            Message::json(&Job {
                n: 0,
                act: Act::Hold,
            })
            .unwrap(),
        )
        .unwrap();

    let acts = Acts {
        held: Arc::new(AtomicBool::new(false)),
        release: Arc::new(Semaphore::new(0)),
    };
    let broker = RusqliteBroker::open(&path).handle();
    let publisher = broker.publisher::<MetricsJob>();
    let service = RustStream::new(AppInfo::new("metrics", "0.1.0"))
        .shutdown_timeout(Duration::from_secs(10))
        .with_broker(broker, |b| {
            b.include(
                subscriber(SUBSCRIPTION, acts.clone())
                    .map_source(|_| InboxQueue::<MetricsJob>::new(SUBSCRIPTION))
                    .workers(nonzero!(2))
                    .poll_interval(Duration::from_millis(20))
                    .retry_policy(RetryPolicy::immediate())
                    .max_attempts(2)
                    .build(),
            );
        });
    service
        .run_until(async {
            until("the held row's handler starts", || {
                acts.held.load(Ordering::SeqCst)
            })
            .await;
            acts.release.add_permits(1);
            let mut jobs = Vec::new();
            for act in [Act::Ack, Act::RetryOnce, Act::Reject, Act::AlwaysRetry] {
                for n in 0..EACH {
                    jobs.push(Message::json(&Job { n, act }).unwrap());
                }
            }
            publisher.publish_all(jobs).await.unwrap();
            until(
                "every row is settled: the failed rows alone are left",
                || {
                    count(&path, "SELECT COUNT(*) FROM metrics_jobs") == 2 * i64::from(EACH)
                        && count(
                            &path,
                            "SELECT COUNT(*) FROM metrics_jobs WHERE failed_at IS NOT NULL",
                        ) == 2 * i64::from(EACH)
                },
            )
            .await;
        })
        .await
        .expect("the service runs");
    let each = u64::from(EACH);
    // The held row, then three of each act: a retried row is handed twice, and a row retried
    // on every attempt is handed twice, and its second retry, the last attempt
    // `max_attempts(2)` allows, fails it at once.
    let handed = 1 + each + 2 * each + each + 2 * each;
    let spans = spans_of(TABLE);
    assert_eq!(
        spans.len() as u64,
        handed,
        "one span per delivery: {spans:?}"
    );
    let with = |field: &str, value: &str| {
        spans
            .iter()
            .filter(|s| s.get(field).is_some_and(|v| v == value))
            .count() as u64
    };
    assert_eq!(with("outcome", "acknowledged"), 1 + 2 * each, "{spans:?}");
    assert_eq!(with("outcome", "retried"), 2 * each, "{spans:?}");
    assert_eq!(with("outcome", "rejected"), 2 * each, "{spans:?}");
    assert_eq!(with("subscription", SUBSCRIPTION), handed);
    assert_eq!(with("attempt", "2"), 2 * each, "{spans:?}");
    assert!(
        spans
            .iter()
            .all(|s| s.get("id").is_some_and(|id| !id.is_empty())),
        "{spans:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

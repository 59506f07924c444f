//! Metrics: what a service records through the `metrics` facade, read back from a recorder
//! this test binary installs (each scenario reads only the series labelled with its table).

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use ruststream::adapter::TakesRows;
use ruststream::{HandlerOutcome, InboxQueue, Message, RetryPolicy, Value, metrics, subscriber};

use super::{body, run};
use crate::harness::{Harness, Runs, TxEnd};
use crate::rows::{Job, Rows, SuiteRow};
use crate::schema;
use crate::support::{Cx, Gate, POLL, Recorder, Seen};
use crate::{Form, NotApplicable, TestName, Verdict};

const SHUTDOWN: Duration = Duration::from_secs(10);

/// A series: its name and its labels, sorted.
type Series = (String, Vec<(String, String)>);

/// What the recorder held, summed over every snapshot any scenario of this binary took (a
/// snapshot empties what it reads, gauges included: the runtime moves its gauges by their
/// changes, so their sum is their value).
#[derive(Default)]
struct Recorded {
    counters: HashMap<Series, u64>,
    gauges: HashMap<Series, f64>,
    histograms: HashMap<Series, Vec<f64>>,
}

/// The recorder's snapshots, and their sum so far.
fn recorder() -> &'static (Snapshotter, Mutex<Recorded>) {
    static RECORDER: OnceLock<(Snapshotter, Mutex<Recorded>)> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the conformance suite installs the only metrics recorder of its binary");
        (snapshotter, Mutex::default())
    })
}

/// The series of one table, as recorded up to now.
struct Table {
    name: &'static str,
}

impl Table {
    /// Installs the recorder (before the scenario's broker registers its series).
    fn new(name: &'static str) -> Self {
        recorder();
        Self { name }
    }

    /// Adds the recorder's latest snapshot to the sum, and reads from it.
    fn read<V>(&self, read: impl FnOnce(&Recorded) -> V) -> V {
        let (snapshotter, sum) = recorder();
        let mut sum = sum.lock().unwrap_or_else(|e| e.into_inner());
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let series = (key.name().to_owned(), labels);
            match value {
                DebugValue::Counter(n) => *sum.counters.entry(series).or_default() += n,
                DebugValue::Gauge(v) => *sum.gauges.entry(series).or_default() += v.into_inner(),
                DebugValue::Histogram(vs) => sum
                    .histograms
                    .entry(series)
                    .or_default()
                    .extend(vs.into_iter().map(|v| v.into_inner())),
            }
        }
        read(&sum)
    }

    /// Whether `series` is `name` of this table, with `labels` among its labels.
    fn matches(&self, series: &Series, name: &str, labels: &[(&str, &str)]) -> bool {
        let (n, ls) = series;
        let has = |k: &str, v: &str| ls.iter().any(|(lk, lv)| lk == k && lv == v);
        n == name && has("table", self.name) && labels.iter().all(|(k, v)| has(k, v))
    }

    /// The sum of the counters of `name` with `labels`.
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.read(|r| {
            r.counters
                .iter()
                .filter(|(s, _)| self.matches(s, name, labels))
                .map(|(_, v)| v)
                .sum()
        })
    }

    /// The value of the gauge `name` with `labels`; `None` if no such series exists.
    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.read(|r| {
            let found: Vec<f64> = r
                .gauges
                .iter()
                .filter(|(s, _)| self.matches(s, name, labels))
                .map(|(_, v)| *v)
                .collect();
            assert!(found.len() <= 1, "one gauge {name} {labels:?}: {found:?}");
            found.first().copied()
        })
    }

    /// The samples of the histograms `name` with `labels`.
    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.read(|r| {
            r.histograms
                .iter()
                .filter(|(s, _)| self.matches(s, name, labels))
                .flat_map(|(_, v)| v.iter().copied())
                .collect()
        })
    }
}

/// What the handler of [`service_records_its_metrics`] does with job `n`.
fn act(seen: &Seen) -> Result<(), HandlerOutcome> {
    match seen.n {
        // Acknowledged.
        1..=3 => Ok(()),
        // Retried once.
        4..=6 if seen.attempt == 1 => Err(HandlerOutcome::retry()),
        4..=6 => Ok(()),
        // Rejected: failed at once.
        7..=9 => Err(HandlerOutcome::reject().with_error("rejected by the scenario")),
        // Retried at every attempt: failed at the last one `max_attempts(2)` allows.
        10..=12 => Err(HandlerOutcome::retry().with_error("retried by the scenario")),
        _ => Ok(()),
    }
}

/// Publishes job 0 through the outbox, in a transaction beside a write of the service's own.
async fn publish_in_outbox<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let mut message = Message::json(&Job { n: 0 }).expect("a job encodes");
    if matches!(T::FORM, Form::Advisory | Form::Custom) {
        message = message.column("k", Value::Int(0));
    }
    let write = format!(
        "INSERT INTO {} (n, attempt) VALUES (0, 0)",
        schema::log(cx.table.name)
    );
    if let Err(error) = cx
        .harness
        .publish_in_transaction::<T>(&cx.db, &write, vec![message], TxEnd::Commit)
        .await
    {
        panic!("{cx}: publishing job 0 through the outbox failed: {error}");
    }
}

/// A service records its metrics: the rows published (through the outbox too), claimed, settled by outcome, retried and
/// failed (rejected, and at the last attempt `max_attempts` allows); the rows in work while a
/// handler runs and none after; one sample of the pickup, handler and settlement times per
/// delivery; and each claim's search timed.
pub async fn service_records_its_metrics<R: Rows, H: Runs<R::ServiceRecordsItsMetrics>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(Metrics => metrics_in);
    run::<H, R::ServiceRecordsItsMetrics, _>(harness, form, test, Metrics).await
}

async fn metrics_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let recorded = Table::new(T::NAME);
    let gate = Gate::default();
    let held = gate.clone();
    // Job 0 waits at the gate; the others answer as `act` says.
    let recorder = Recorder::new(move |seen| {
        let gate = (seen.n == 0).then(|| held.clone());
        async move {
            if let Some(gate) = gate {
                gate.wait().await;
            }
            act(&seen)
        }
    });
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let subscription = subscriber(T::NAME, recorder.clone())
        .map_source(|_| InboxQueue::<T>::new(T::NAME))
        .workers(NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN))
        .poll_interval(POLL)
        .retry_policy(RetryPolicy::immediate())
        .max_attempts(2)
        .build();
    let service = cx.service(&broker, subscription, SHUTDOWN);
    let sub = [("subscription", T::NAME)];
    let stop = async {
        publish_in_outbox::<H, T>(cx).await;
        cx.until("job 0's handler starts", || async { recorder.saw(0) })
            .await;
        // The runtime moves its gauges after it hands a row over: the handler may start first.
        cx.until("the gauge counts job 0 in work", || async {
            recorded.gauge(metrics::IN_WORK, &sub) == Some(1.0)
        })
        .await;
        assert_eq!(
            recorded.counter(metrics::CLAIMED, &sub),
            1,
            "{cx}: one claim"
        );
        assert_eq!(
            recorded.counter(metrics::PUBLISHED, &[]),
            1,
            "{cx}: the outbox's row is counted"
        );
        gate.open();
        for n in 1..=12 {
            cx.publish(&publisher, n, n).await;
        }
        cx.until(
            "every row is settled: the failed rows alone are left",
            || async { cx.count("1=1").await == 6 && cx.count("failed_at IS NOT NULL").await == 6 },
        )
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    drop(broker);
    assert_totals(cx, &recorded);
}

/// What [`service_records_its_metrics`] recorded once every row is settled.
fn assert_totals<H: Harness>(cx: &Cx<'_, H>, recorded: &Table) {
    let sub = [("subscription", recorded.name)];
    // Job 0, then three of each act: a row retried once is handed twice, and so is a row
    // retried at every attempt, whose second retry fails it.
    let handed = 1 + 3 + 2 * 3 + 3 + 2 * 3;
    assert_eq!(
        recorded.counter(metrics::PUBLISHED, &[]),
        13,
        "{cx}: published"
    );
    assert_eq!(
        recorded.counter(metrics::CLAIMED, &sub),
        handed,
        "{cx}: claimed"
    );
    let settled =
        |outcome: &str| recorded.counter(metrics::SETTLED, &[sub[0], ("outcome", outcome)]);
    assert_eq!(settled("acknowledged"), 1 + 3 + 3, "{cx}: acknowledged");
    assert_eq!(settled("retried"), 2 * 3, "{cx}: settled as retries");
    assert_eq!(settled("rejected"), 2 * 3, "{cx}: settled as rejections");
    assert_eq!(
        recorded.counter(metrics::SETTLED, &sub),
        handed,
        "{cx}: settled"
    );
    assert_eq!(
        recorded.counter(metrics::RETRIED, &sub),
        2 * 3,
        "{cx}: retried"
    );
    assert_eq!(
        recorded.counter(metrics::FAILED, &sub),
        2 * 3,
        "{cx}: rejected, and at the last attempt max_attempts allows"
    );
    assert_eq!(
        recorded.counter(metrics::RETURNED, &sub),
        0,
        "{cx}: returned"
    );
    assert_eq!(
        recorded.gauge(metrics::IN_WORK, &sub),
        Some(0.0),
        "{cx}: in work at the end"
    );
    assert_eq!(
        recorded.gauge(metrics::CLAIMED_AHEAD, &sub),
        Some(0.0),
        "{cx}: claimed ahead at the end"
    );
    for histogram in [
        metrics::PICKUP,
        metrics::HANDLER_DURATION,
        metrics::SETTLE_DURATION,
    ] {
        let samples = recorded.samples(histogram, &sub);
        assert_eq!(
            samples.len() as u64,
            handed,
            "{cx}: {histogram}: one sample per delivery: {samples:?}"
        );
        assert!(
            samples
                .iter()
                .all(|s| s.is_finite() && (0.0..60.0).contains(s)),
            "{cx}: {histogram}: {samples:?}"
        );
    }
    let claims = recorded.samples(metrics::CLAIM_DURATION, &sub);
    assert!(
        !claims.is_empty() && claims.iter().all(|s| s.is_finite() && *s > 0.0),
        "{cx}: each claim's search is timed: {claims:?}"
    );
}

/// Two brokers of one process on one table, under one subscription name, add their rows in
/// work to the same gauge, rather than overwrite each other's count; a broker that ends takes
/// its share back.
pub async fn brokers_add_their_gauges<R: Rows, H: Runs<R::BrokersAddTheirGauges>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    if form == Form::Advisory && harness.dialect() == ruststream_core::Dialect::Sqlite {
        return Err(NotApplicable {
            harness: harness.name(),
            reason: "SQLite's advisory form holds one key at a time in a process: the second \
                     broker takes nothing while the first one's row is in work"
                .to_owned(),
        });
    }
    body!(Gauges => gauges_in);
    run::<H, R::BrokersAddTheirGauges, _>(harness, form, test, Gauges).await
}

async fn gauges_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let recorded = Table::new(T::NAME);
    let gate = Gate::default();
    let first = Recorder::gated(&gate, |_| true);
    let second = first.sharing({
        let gate = gate.clone();
        move |_| {
            let gate = gate.clone();
            async move {
                gate.wait().await;
                Ok(())
            }
        }
    });
    let subscription = |recorder: &Recorder| {
        subscriber(T::NAME, recorder.clone())
            .map_source(|_| InboxQueue::<T>::new(T::NAME))
            .poll_interval(POLL)
            .build()
    };
    let (one, two) = (cx.broker(), cx.broker());
    let sub = [("subscription", T::NAME)];
    let both = async {
        let publisher = one.publisher::<T>();
        cx.publish(&publisher, 1, 1).await;
        cx.publish(&publisher, 2, 2).await;
        cx.until("each broker's worker holds a row", || async {
            first.in_work() == 2
        })
        .await;
        cx.until("the gauge counts both rows", || async {
            recorded.gauge(metrics::IN_WORK, &sub) == Some(2.0)
        })
        .await;
        gate.open();
        cx.until("both rows are settled", || async {
            cx.count("1=1").await == 0
        })
        .await;
    };
    let services = futures::future::join(
        cx.service(&one, subscription(&first), SHUTDOWN)
            .run_until(both),
        cx.service(&two, subscription(&second), SHUTDOWN)
            .run_until(async { gate.wait().await }),
    );
    let (a, b) = services.await;
    a.expect("the first service runs");
    b.expect("the second service runs");
    cx.until("the gauge reads 0 once both rows are settled", || async {
        recorded.gauge(metrics::IN_WORK, &sub) == Some(0.0)
    })
    .await;
}

//! Shutdown ([shutdown](https://github.com/ruststream/ruststream/blob/main/docs/src/shutdown.md)): every lock released, the counts, leases kept past it, publishers
//! closed.

use std::time::{Duration, Instant};

use ruststream::adapter::TakesRows;
use ruststream::{IntoSubscription, Message, PublishError};

use super::{body, run};
use crate::harness::{Harness, Runs};
use crate::rows::{Job, Rows, SuiteRow};
use crate::support::{Cx, Opts, POLL, Recorder, now_micros, one_at_a_time, sleep, subscription};
use crate::{Form, TestName, Verdict};

const SHUTDOWN: Duration = Duration::from_secs(10);
/// The shutdown timeout of a service stopped with handlers in work.
const SHORT_SHUTDOWN: Duration = Duration::from_millis(300);
/// How long a handler in work at the shutdown takes: longer than any scenario.
const FOREVER: Duration = Duration::from_secs(300);
/// What "at once" allows a second broker to take a row.
const AT_ONCE: Duration = Duration::from_secs(2);

/// How many deliveries of two rows of different keys a subscription of two workers has in
/// work.
fn in_work_of_two(cx: &Cx<'_, impl Harness>) -> usize {
    if one_at_a_time(cx.dialect(), cx.form()) {
        1
    } else {
        2
    }
}

/// A service stopped with handlers in work (`run_until`, a short shutdown timeout) releases
/// every lock: a second broker takes the rows at once, the ones that were in work at their
/// second attempt. The row lock form rolls the claims back; the advisory lock forms release
/// the keys (the custom unlock empties `held_keys`).
pub async fn shutdown_releases_locks<R: Rows, H: Runs<R::ShutdownReleasesLocks>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(ShutdownReleases => shutdown_releases_in);
    run::<H, R::ShutdownReleasesLocks, _>(harness, form, test, ShutdownReleases).await
}

async fn shutdown_releases_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let expected = in_work_of_two(cx);
    let first = Recorder::sleeping(FOREVER);
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let opts = Opts::default().workers(2);
    let service = cx.service(&broker, subscription::<T>(&first, opts), SHORT_SHUTDOWN);
    let stop = async {
        cx.publish(&publisher, 1, 1).await;
        cx.publish(&publisher, 2, 2).await;
        cx.until(&format!("{expected} deliveries are in work"), || async {
            first.in_work() >= expected
        })
        .await;
        // Time for another claim: no further row goes into work.
        sleep(POLL * 4).await;
        assert_eq!(first.in_work(), expected, "{cx}: deliveries in work");
    };
    service.run_until(stop).await.expect("the service runs");
    let stopped = Instant::now();
    assert_eq!(
        first.in_work(),
        expected,
        "{cx}: the handlers were still in work when the service stopped"
    );
    if cx.form() == Form::Custom {
        assert_eq!(
            cx.held_keys().await,
            0,
            "{cx}: the shutdown released every key"
        );
    }
    let was_in_work = first.ns();

    let second = Recorder::acking();
    let broker = cx.broker();
    let service = cx.service(&broker, subscription::<T>(&second, opts), SHUTDOWN);
    let stop = async {
        cx.until("a second broker handles both rows", || async {
            second.count() >= 2 && cx.count("1=1").await == 0
        })
        .await;
    };
    service
        .run_until(stop)
        .await
        .expect("the second service runs");
    for n in was_in_work {
        let seen = second.seen(n, 2).unwrap_or_else(|| {
            panic!(
                "{cx}: job {n}, in work at the shutdown, is taken again at attempt 2: {:?}",
                second.pairs()
            )
        });
        let after = seen.at.saturating_duration_since(stopped);
        assert!(
            after <= AT_ONCE,
            "{cx}: a second broker takes job {n} at once after the shutdown, not after {after:?}"
        );
    }
}

/// A broker shut down by hand (`RunningBroker::shutdown`) with deliveries in work releases
/// the lock of each and counts it in `locks_released`, closing no connection.
pub async fn shutdown_counts_locks_released<R: Rows, H: Runs<R::ShutdownCountsLocksReleased>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(ShutdownCounts => shutdown_counts_in);
    run::<H, R::ShutdownCountsLocksReleased, _>(harness, form, test, ShutdownCounts).await
}

async fn shutdown_counts_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let expected = in_work_of_two(cx);
    let recorder = Recorder::sleeping(FOREVER);
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let sub = subscription::<T>(&recorder, Opts::default().workers(2));
    let running = broker
        .start(
            vec![IntoSubscription::<H::Adapter>::into_subscription(sub)],
            ruststream::exec::current(),
        )
        .await
        .unwrap_or_else(|e| panic!("{cx}: the broker did not start: {e}"));
    cx.publish(&publisher, 1, 1).await;
    cx.publish(&publisher, 2, 2).await;
    cx.until(&format!("{expected} deliveries are in work"), || async {
        recorder.in_work() >= expected
    })
    .await;
    sleep(POLL * 4).await;
    assert_eq!(recorder.in_work(), expected, "{cx}: deliveries in work");
    running.stop();
    let counts = running.shutdown().await;
    let attempts = cx
        .i64s(&format!(
            "SELECT attempt FROM {} ORDER BY id",
            cx.table.name
        ))
        .await;
    assert_eq!(
        counts.locks_released,
        expected,
        "{cx}: the shutdown released the lock of each delivery in work ({counts:?}; handled {:?}; attempts by row {attempts:?})",
        recorder.pairs()
    );
    assert_eq!(
        counts.connections_closed, 0,
        "{cx}: every unlock answered yes: no connection closed ({counts:?})"
    );
    assert!(broker.is_closed(), "{cx}: the broker is closed");
    if cx.form() == Form::Custom {
        assert_eq!(
            cx.held_keys().await,
            0,
            "{cx}: the custom unlock emptied held_keys"
        );
    }
    assert_eq!(
        cx.count("attempt = 1").await,
        i64::try_from(expected).expect("a small count"),
        "{cx}: the rows in work were taken once"
    );
}

/// A delivery of the lease form in work at the shutdown keeps its lease (no longer
/// extended), and its row returns when the lease runs out: not before.
pub async fn lease_kept_past_shutdown<R: Rows, H: Runs<R::LeaseKeptPastShutdown>>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    body!(LeaseKept => lease_kept_in);
    run::<H, R::LeaseKeptPastShutdown, _>(harness, Form::Lease, test, LeaseKept).await
}

async fn lease_kept_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    const LEASE: Duration = Duration::from_secs(2);
    let first = Recorder::sleeping(FOREVER);
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let opts = Opts::default().lease(LEASE);
    let service = cx.service(&broker, subscription::<T>(&first, opts), SHORT_SHUTDOWN);
    let stop = async {
        cx.publish(&publisher, 1, 1).await;
        cx.until("job 1 is in work", || async { first.saw(1) })
            .await;
    };
    service.run_until(stop).await.expect("the service runs");
    let stopped = now_micros();
    let id = cx.i64(&format!("SELECT id FROM {}", cx.table.name)).await;
    let until = cx.micros_of("locked_until", id).await;
    assert!(
        until > stopped,
        "{cx}: the delivery in work keeps its lease past the shutdown (locked_until {until}, stopped {stopped})"
    );
    sleep(LEASE / 2).await;
    assert_eq!(
        cx.micros_of("locked_until", id).await,
        until,
        "{cx}: the shutdown stopped the extension of the lease"
    );

    let second = Recorder::acking();
    let broker = cx.broker();
    let service = cx.service(&broker, subscription::<T>(&second, opts), SHUTDOWN);
    let stop = async {
        cx.until("the row returns and is handled", || async {
            second.count() >= 1 && cx.count("1=1").await == 0
        })
        .await;
    };
    service
        .run_until(stop)
        .await
        .expect("the second service runs");
    let seen = second
        .seen(1, 2)
        .unwrap_or_else(|| panic!("{cx}: the row returns at attempt 2: {:?}", second.pairs()));
    // A server's clock may differ from this process's by a little.
    assert!(
        seen.wall >= until - 50_000,
        "{cx}: the row returns when its lease runs out, not {} ms before",
        (until - seen.wall) / 1000
    );
    assert!(
        seen.wall <= until + 2_000_000,
        "{cx}: the row returns soon after its lease runs out, not {} ms after",
        (seen.wall - until) / 1000
    );
    println!(
        "{cx}: the row returned {} ms after its lease ran out",
        (seen.wall - until) / 1000
    );
}

/// A publisher kept past the shutdown answers `PublishError::Closed` and writes no row, as it
/// does before the service starts.
pub async fn publisher_closed_after_shutdown<R: Rows, H: Runs<R::PublisherClosedAfterShutdown>>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    body!(PublisherClosed => publisher_closed_in);
    let form = Form::Lease;
    run::<H, R::PublisherClosedAfterShutdown, _>(harness, form, test, PublisherClosed).await
}

async fn publisher_closed_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let message = || Message::json(&Job { n: 9 }).expect("a job encodes");
    let recorder = Recorder::acking();
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let early = publisher.publish(message()).await;
    assert!(
        matches!(early, Err(PublishError::Closed)),
        "{cx}: a publisher answers Closed before the service starts: {early:?}"
    );
    let service = cx.service(
        &broker,
        subscription::<T>(&recorder, Opts::default()),
        SHUTDOWN,
    );
    let stop = async {
        cx.publish(&publisher, 1, 1).await;
        cx.until("job 1 is handled", || async {
            recorder.saw(1) && cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert!(broker.is_closed(), "{cx}: the broker is closed after run");
    let late = publisher.publish(message()).await;
    assert!(
        matches!(late, Err(PublishError::Closed)),
        "{cx}: a publisher kept past the shutdown answers Closed: {late:?}"
    );
    let taken_late = broker.publisher::<T>().publish(message()).await;
    assert!(
        matches!(taken_late, Err(PublishError::Closed)),
        "{cx}: a publisher taken after the shutdown answers Closed: {taken_late:?}"
    );
    sleep(POLL * 2).await;
    assert_eq!(
        cx.count("1=1").await,
        0,
        "{cx}: no row is written past the shutdown"
    );
    assert_eq!(recorder.pairs(), [(1, 1)]);
}

/// `publish_all` writes a batch larger than one insert takes (several inserts in one
/// transaction) and a batch that fits one insert; the subscription takes every row once.
pub async fn publish_all_writes_every_row<R: Rows, H: Runs<R::PublishAllWritesEveryRow>>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    body!(PublishAll => publish_all_in);
    let form = Form::Lease;
    run::<H, R::PublishAllWritesEveryRow, _>(harness, form, test, PublishAll).await
}

async fn publish_all_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let large = 2 * ruststream_core::PUBLISH_BATCH as i64 + 7;
    let message = |n: i64| Message::json(&Job { n }).expect("a job encodes");
    let recorder = Recorder::acking();
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(
        &broker,
        subscription::<T>(&recorder, Opts::default()),
        SHUTDOWN,
    );
    let stop = async {
        let written = publisher.publish_all((1..=large).map(message)).await;
        assert!(
            written.is_ok(),
            "{cx}: the large batch is written: {written:?}"
        );
        let written = publisher
            .publish_all((large + 1..=large + 3).map(message))
            .await;
        assert!(
            written.is_ok(),
            "{cx}: the small batch is written: {written:?}"
        );
        let nothing = publisher.publish_all(Vec::<Message>::new()).await;
        assert!(
            nothing.is_ok(),
            "{cx}: an empty batch answers Ok: {nothing:?}"
        );
        cx.until("every job of both batches is handled", || async {
            recorder.count() >= (large + 3) as usize && cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    let mut ns = recorder.ns();
    ns.sort_unstable();
    assert_eq!(
        ns,
        (1..=large + 3).collect::<Vec<_>>(),
        "{cx}: every row of the batches delivered once"
    );
}

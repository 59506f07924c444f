//! Rows claimed ahead, beyond the workers, in every form.

use std::time::Duration;

use ruststream::adapter::TakesRows;
use ruststream::core::PING_AHEAD_AFTER;

use super::{body, run};
use crate::harness::{Harness, Runs};
use crate::rows::{Rows, SuiteRow};
use crate::support::{Cx, Opts, Recorder, subscription};
use crate::{Form, TestName, Verdict};

/// How long each service of the scenario may take to shut down.
const SHUTDOWN: Duration = Duration::from_secs(10);

/// Rows claimed ahead (`prefetch`): at most `workers` messages in work at once and every job
/// handled once; at the shutdown the rows still waiting are given back at once (their leases
/// released, their transactions rolled back, their keys unlocked), so another service takes
/// them at once, long before a 30 s lease would have run out. A claim that reads the first due
/// rows alone (a custom lock, SQLite's advisory form) claims none ahead, and the same holds.
/// Rows that wait longer than [`PING_AHEAD_AFTER`] are handed, once each (in the row lock and
/// advisory forms after their sessions answered a ping).
pub async fn claims_ahead<R: Rows, H: Runs<R::ClaimsAhead>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(ClaimsAhead => claims_ahead_in);
    run::<H, R::ClaimsAhead, _>(harness, form, test, ClaimsAhead).await
}

async fn claims_ahead_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let opts = Opts::default().workers(2).prefetch(3);
    // Every job once, two at a time.
    let recorder = Recorder::sleeping(Duration::from_millis(20));
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(&broker, subscription::<T>(&recorder, opts), SHUTDOWN);
    let stop = async {
        for n in 1..=12 {
            cx.publish(&publisher, n, n).await;
        }
        cx.until("every job is handled and settled", || async {
            recorder.count() >= 12 && cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    let mut ns = recorder.ns();
    ns.sort_unstable();
    assert_eq!(
        ns,
        (1..=12).collect::<Vec<_>>(),
        "{cx}: every job handled once"
    );
    assert!(
        recorder.max_in_work() <= 2,
        "{cx}: {} in work at once with workers(2)",
        recorder.max_in_work()
    );
    given_back_at_shutdown::<H, T>(cx, opts).await;
    handed_after_a_ping::<H, T>(cx).await;
}

/// The shutdown gives back the rows claimed ahead: the next service takes them at once.
async fn given_back_at_shutdown<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>, opts: Opts)
where
    H::Adapter: TakesRows<T>,
{
    let slow = Recorder::sleeping(Duration::from_millis(400));
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(&broker, subscription::<T>(&slow, opts), SHUTDOWN);
    let stop = async {
        for n in 101..=108 {
            cx.publish(&publisher, n, n).await;
        }
        cx.until("two jobs are in work", || async { slow.count() >= 2 })
            .await;
    };
    service.run_until(stop).await.expect("the service runs");
    let handled = slow.count();
    assert!(
        (2..8).contains(&handled),
        "{cx}: {handled} of 8 handled before the shutdown"
    );
    let left = 8 - handled as i64;
    assert_eq!(
        cx.count("1=1").await,
        left,
        "{cx}: the handled rows are settled"
    );
    let after = Recorder::acking();
    let broker = cx.broker();
    let service = cx.service(
        &broker,
        subscription::<T>(&after, Opts::default().workers(4)),
        SHUTDOWN,
    );
    let stop = async {
        cx.until_within(
            "the rows given back are taken by the next service",
            Duration::from_secs(5),
            || async { after.count() >= left as usize && cx.count("1=1").await == 0 },
        )
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    let mut all = slow.ns();
    all.extend(after.ns());
    all.sort_unstable();
    assert_eq!(
        all,
        (101..=108).collect::<Vec<_>>(),
        "{cx}: every job handled once, before or after the shutdown"
    );
}

/// Rows that wait longer than `PING_AHEAD_AFTER` for the one worker: in the row lock and
/// advisory forms each is handed after its session answered a ping, once, at its first
/// attempt.
async fn handed_after_a_ping<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let long = Recorder::sleeping(PING_AHEAD_AFTER + Duration::from_millis(200));
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let opts = Opts::default().workers(1).prefetch(2);
    let service = cx.service(&broker, subscription::<T>(&long, opts), SHUTDOWN);
    let stop = async {
        for n in 201..=203 {
            cx.publish(&publisher, n, n).await;
        }
        cx.until_within(
            "the three jobs are handled and settled",
            Duration::from_secs(20),
            || async { long.count() >= 3 && cx.count("1=1").await == 0 },
        )
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    let mut pairs = long.pairs();
    pairs.sort_unstable();
    assert_eq!(
        pairs,
        [(201, 1), (202, 1), (203, 1)],
        "{cx}: each handled once, at its first attempt"
    );
    assert_eq!(long.max_in_work(), 1, "{cx}: one at a time with workers(1)");
}

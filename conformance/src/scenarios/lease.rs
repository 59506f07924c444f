//! Leases: extended while their delivery is in work; settled together when their handlers end
//! together; claimed ahead.

use std::time::Duration;

use ruststream::adapter::TakesRows;

use super::{body, run};
use crate::harness::Harness;
use crate::rows::{self, SuiteRow};
use crate::support::{Cx, Opts, Recorder, subscription};
use crate::{Form, TestName, Verdict};

/// A lease is extended while its delivery is in work: a handler that runs for more than two
/// leases keeps its row, which no other claim takes meanwhile, and settles it.
pub async fn lease_extended_while_in_work<H: Harness>(harness: &H, test: &TestName) -> Verdict {
    body!(LeaseExtended => lease_extended_in);
    let form = Form::Lease;
    run::<H, rows::lease_extended_while_in_work::Family, _>(harness, form, test, LeaseExtended)
        .await
}

async fn lease_extended_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    const LEASE: Duration = Duration::from_secs(1);
    let recorder = Recorder::sleeping(LEASE * 5 / 2);
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    // A second worker claims all along, and would take the row were its lease to run out.
    let opts = Opts::default().workers(2).lease(LEASE);
    let service = cx.service(&broker, subscription::<T>(&recorder, opts), LEASE * 10);
    let stop = async {
        cx.publish(&publisher, 1, 1).await;
        cx.until("the row is handled and deleted", || async {
            recorder.saw(1) && cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(
        recorder.pairs(),
        [(1, 1)],
        "{cx}: while its delivery is in work, the lease is extended and no other claim takes the row"
    );
}

/// Handlers that end together settle together: many lease settlements asked for at once
/// (eight handlers that sleep the same time) all take effect, each row deleted once and every
/// job handled once. Where the database returns the rows a statement settled, those asked for
/// while another runs settle in one statement.
pub async fn lease_acks_together<H: Harness>(harness: &H, test: &TestName) -> Verdict {
    body!(LeaseAcksTogether => settle_together_in);
    let form = Form::Lease;
    run::<H, rows::lease_acks_together::Family, _>(harness, form, test, LeaseAcksTogether).await
}

/// As [`lease_acks_together`], on a table with `processed_at`: every row is marked once, its
/// lease cleared.
pub async fn lease_marks_together<H: Harness>(harness: &H, test: &TestName) -> Verdict {
    body!(LeaseMarksTogether => settle_together_in);
    let form = Form::Lease;
    run::<H, rows::lease_marks_together::Family, _>(harness, form, test, LeaseMarksTogether).await
}

async fn settle_together_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    const JOBS: i64 = 40;
    let marks = cx.table.processed;
    let recorder = Recorder::sleeping(Duration::from_millis(30));
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let opts = Opts::default().workers(8);
    let service = cx.service(
        &broker,
        subscription::<T>(&recorder, opts),
        Duration::from_secs(10),
    );
    let open = if marks { "processed_at IS NULL" } else { "1=1" };
    let stop = async {
        for n in 1..=JOBS {
            cx.publish(&publisher, n, n).await;
        }
        cx.until("every job is handled and settled", || async {
            recorder.count() >= JOBS as usize && cx.count(open).await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    let mut ns = recorder.ns();
    ns.sort_unstable();
    assert_eq!(
        ns,
        (1..=JOBS).collect::<Vec<_>>(),
        "{cx}: every job handled once"
    );
    if marks {
        assert_eq!(
            cx.count("processed_at IS NOT NULL AND locked_until IS NULL")
                .await,
            JOBS,
            "{cx}: every row marked processed, its lease cleared"
        );
    } else {
        assert_eq!(cx.count("1=1").await, 0, "{cx}: every row deleted");
    }
}

/// Rows claimed ahead (`prefetch`): at most `workers` messages in work at once and every job
/// handled once; at the shutdown the rows still waiting are given back at once, so another
/// service takes them long before their 30 s leases would have run out.
pub async fn lease_claims_ahead<H: Harness>(harness: &H, test: &TestName) -> Verdict {
    body!(LeaseClaimsAhead => claims_ahead_in);
    let form = Form::Lease;
    run::<H, rows::lease_claims_ahead::Family, _>(harness, form, test, LeaseClaimsAhead).await
}

async fn claims_ahead_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    const SHUTDOWN: Duration = Duration::from_secs(10);
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

    // The shutdown gives back the rows claimed ahead.
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

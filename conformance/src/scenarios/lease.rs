//! Leases: extended while their delivery is in work; settled together when their handlers end
//! together.

use std::time::Duration;

use ruststream::adapter::TakesRows;

use super::{body, run};
use crate::harness::{Harness, Runs};
use crate::rows::{Rows, SuiteRow};
use crate::support::{Cx, Opts, Recorder, subscription};
use crate::{Form, TestName, Verdict};

/// A lease is extended while its delivery is in work: a handler that runs for more than two
/// leases keeps its row, which no other claim takes meanwhile, and settles it.
pub async fn lease_extended_while_in_work<R: Rows, H: Runs<R::LeaseExtendedWhileInWork>>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    body!(LeaseExtended => lease_extended_in);
    let form = Form::Lease;
    run::<H, R::LeaseExtendedWhileInWork, _>(harness, form, test, LeaseExtended).await
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
pub async fn lease_acks_together<R: Rows, H: Runs<R::LeaseAcksTogether>>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    body!(LeaseAcksTogether => settle_together_in);
    let form = Form::Lease;
    run::<H, R::LeaseAcksTogether, _>(harness, form, test, LeaseAcksTogether).await
}

/// As [`lease_acks_together`], on a table with `processed_at`: every row is marked once, its
/// lease cleared.
pub async fn lease_marks_together<R: Rows, H: Runs<R::LeaseMarksTogether>>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    body!(LeaseMarksTogether => settle_together_in);
    let form = Form::Lease;
    run::<H, R::LeaseMarksTogether, _>(harness, form, test, LeaseMarksTogether).await
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

//! Leases: extended while their delivery is in work.

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

//! Claims and settlements: the claim order, ack, and retry. Failed rows are in `failures.rs`.

use std::time::Duration;

use ruststream::HandlerOutcome;
use ruststream::adapter::TakesRows;

use super::{body, run};
use crate::harness::{Harness, Runs};
use crate::rows::{Rows, SuiteRow};
use crate::support::{Cx, Opts, Recorder, now_micros, subscription};
use crate::{Form, TestName, Verdict};

const SHUTDOWN: Duration = Duration::from_secs(10);

/// One worker takes the rows in claim order: by id, whatever order they were written in.
pub async fn claim_order<R: Rows, H: Runs<R::ClaimOrder>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(ClaimOrder => claim_order_in);
    run::<H, R::ClaimOrder, _>(harness, form, test, ClaimOrder).await
}

async fn claim_order_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    // Written out of order, before the service starts: the first claim sees them all.
    for n in [3, 1, 5, 2, 4] {
        cx.insert_job(n).await;
    }
    let recorder = Recorder::acking();
    let broker = cx.broker();
    let service = cx.service(
        &broker,
        subscription::<T>(&recorder, Opts::default()),
        SHUTDOWN,
    );
    let stop = async {
        cx.until("all five rows are handled and deleted", || async {
            recorder.count() >= 5 && cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(
        recorder.ns(),
        [1, 2, 3, 4, 5],
        "{cx}: one worker takes the rows in id order"
    );
    assert_eq!(
        recorder.pairs(),
        [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)],
        "{cx}: each row once, at attempt 1"
    );
}

/// An acknowledgement deletes the row (a table without `processed_at`).
pub async fn ack_deletes<R: Rows, H: Runs<R::AckDeletes>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(AckDeletes => ack_deletes_in);
    run::<H, R::AckDeletes, _>(harness, form, test, AckDeletes).await
}

async fn ack_deletes_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let recorder = Recorder::acking();
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(
        &broker,
        subscription::<T>(&recorder, Opts::default()),
        SHUTDOWN,
    );
    let stop = async {
        for n in 1..=3 {
            cx.publish(&publisher, n, n).await;
        }
        cx.until("three rows are handled and deleted", || async {
            recorder.count() >= 3 && cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(
        cx.count("1=1").await,
        0,
        "{cx}: acknowledged rows are deleted"
    );
    assert_eq!(
        recorder.pairs(),
        [(1, 1), (2, 1), (3, 1)],
        "{cx}: each row once"
    );
    if cx.form() == Form::Custom {
        assert_eq!(
            cx.held_keys().await,
            0,
            "{cx}: the custom unlock released every key"
        );
    }
}

/// An acknowledgement marks `processed_at` (with the time, and clears the lease) instead of
/// deleting the row.
pub async fn ack_marks_processed<R: Rows, H: Runs<R::AckMarksProcessed>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(AckMarksProcessed => ack_marks_processed_in);
    run::<H, R::AckMarksProcessed, _>(harness, form, test, AckMarksProcessed).await
}

async fn ack_marks_processed_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let recorder = Recorder::acking();
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(
        &broker,
        subscription::<T>(&recorder, Opts::default()),
        SHUTDOWN,
    );
    let before = now_micros();
    let stop = async {
        for n in 1..=3 {
            cx.publish(&publisher, n, n).await;
        }
        cx.until("three rows are marked processed", || async {
            cx.count("processed_at IS NOT NULL").await == 3
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    let after = now_micros();
    assert_eq!(
        cx.count("1=1").await,
        3,
        "{cx}: marked rows stay in the table"
    );
    assert_eq!(
        cx.count("processed_at IS NOT NULL AND attempt = 1").await,
        3,
        "{cx}: each row marked processed after one attempt"
    );
    for id in cx.i64s(&format!("SELECT id FROM {}", cx.table.name)).await {
        let at = cx.micros_of("processed_at", id).await;
        assert!(
            (before - 1_000_000..=after + 1_000_000).contains(&at),
            "{cx}: row {id}'s processed_at ({at} µs) is the time of its settlement ({before}..{after})"
        );
        if cx.form() == Form::Lease {
            assert_eq!(
                cx.micros_of("locked_until", id).await,
                -1,
                "{cx}: the settlement cleared row {id}'s lease"
            );
        }
    }
    assert_eq!(
        recorder.pairs(),
        [(1, 1), (2, 1), (3, 1)],
        "{cx}: each row once"
    );
}

/// A retry returns the row with its attempt counted: the handler sees attempt 1, then 2.
pub async fn retry_counts_the_attempt<R: Rows, H: Runs<R::RetryCountsTheAttempt>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(Retry => retry_in);
    run::<H, R::RetryCountsTheAttempt, _>(harness, form, test, Retry).await
}

async fn retry_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let recorder = Recorder::new(|seen| async move {
        if seen.attempt == 1 {
            Err(HandlerOutcome::retry())
        } else {
            Ok(())
        }
    });
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(
        &broker,
        subscription::<T>(&recorder, Opts::default()),
        SHUTDOWN,
    );
    let stop = async {
        for n in 1..=2 {
            cx.publish(&publisher, n, n).await;
        }
        cx.until("both rows are retried once and settled", || async {
            cx.count("processed_at IS NOT NULL").await == 2
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(
        recorder.pairs(),
        [(1, 1), (1, 2), (2, 1), (2, 2)],
        "{cx}: each row twice: attempt 1 (retried), then attempt 2"
    );
    assert_eq!(
        cx.count("processed_at IS NOT NULL AND attempt = 2").await,
        2,
        "{cx}: the retry kept the first attempt counted, the second take counted the second"
    );
}

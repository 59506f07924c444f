//! Publishing in a transaction the service holds (the outbox), and with no broker running.

use std::time::{Duration, Instant};

use ruststream::Message;
use ruststream::adapter::TakesRows;
use ruststream_core::Dialect;

use super::crash::ChildWorker;
use super::{body, needs, run, table};
use crate::harness::{ABORT_MARK, Harness, Runs, TxEnd};
use crate::rows::{Job, Rows, SuiteRow};
use crate::schema;
use crate::support::{Cx, Opts, Recorder, sleep, subscription};
use crate::{CHILD_ENV, Form, TestName, Verdict};

const SHUTDOWN: Duration = Duration::from_secs(10);

/// The outbox: rows published in the service's own transaction beside a write of its own
/// (an order in `t_log`) commit with it and roll back with it, and a crash between the publish
/// and the commit leaves neither; rows published with no broker running are written too. A
/// service running all along takes every committed row once. On PostgreSQL it polls every 30
/// seconds, so the rows it takes within a few seconds of the commit show that the wake-up
/// rode in the transaction.
pub async fn outbox_commits_with_the_transaction<
    R: Rows,
    H: Runs<R::OutboxCommitsWithTheTransaction>,
>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    let form = Form::Lease;
    if let Ok(db) = std::env::var(CHILD_ENV) {
        body!(Crash => crash_in);
        let cx = Cx::attach(
            harness,
            db,
            table::<R::OutboxCommitsWithTheTransaction>(form),
            test,
        );
        <H as Runs<R::OutboxCommitsWithTheTransaction>>::on_form(form, Crash, &cx)?.await;
        return Ok(());
    }
    needs(harness, harness.capabilities().kill_process)?;
    body!(Outbox => outbox_in);
    run::<H, R::OutboxCommitsWithTheTransaction, _>(harness, form, test, Outbox).await
}

/// Job `n`.
fn message(n: i64) -> Message {
    Message::json(&Job { n }).expect("a job encodes")
}

/// The service's own write beside job `n`: order `n` in `t_log`.
fn order<H: Harness>(cx: &Cx<'_, H>, n: i64) -> String {
    format!(
        "INSERT INTO {} (n, attempt) VALUES ({n}, 0)",
        schema::log(cx.table.name)
    )
}

/// The child: publishes job 4 beside order 4, then aborts with the transaction open.
async fn crash_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let ended = cx
        .harness
        .publish_in_transaction::<T>(&cx.db, &order(cx, 4), vec![message(4)], TxEnd::Crash)
        .await;
    eprintln!("{cx}: the child did not abort: {ended:?}");
    std::process::exit(3);
}

/// How many orders `n` the log table holds.
async fn orders<H: Harness>(cx: &Cx<'_, H>, n: i64) -> i64 {
    let sql = format!(
        "SELECT COUNT(*) FROM {} WHERE n = {n}",
        schema::log(cx.table.name)
    );
    cx.i64(&sql).await
}

async fn outbox_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let wakes = cx.dialect() == Dialect::Postgres;
    let (poll, within) = if wakes {
        (Duration::from_secs(30), Duration::from_secs(5))
    } else {
        (Duration::from_millis(200), Duration::from_secs(20))
    };
    let recorder = Recorder::acking();
    let broker = cx.broker();
    let service = cx.service(
        &broker,
        subscription::<T>(&recorder, Opts::default().poll(poll)),
        SHUTDOWN,
    );
    let stop = async {
        // The service's first look at the empty table has passed: a later row waits for a
        // wake-up or the next poll.
        sleep(Duration::from_millis(500)).await;
        rolled_back::<H, T>(cx).await;
        committed::<H, T>(cx, &recorder, within, poll).await;
        crashed(cx).await;
        without_broker::<H, T>(cx, &recorder, within).await;
    };
    service.run_until(stop).await.expect("the service runs");
    let mut ns = recorder.ns();
    ns.sort_unstable();
    assert_eq!(
        ns,
        [2, 3, 5, 6],
        "{cx}: each committed job once, none other"
    );
}

/// Rolled back: neither the order nor the job.
async fn rolled_back<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let written = cx
        .harness
        .publish_in_transaction::<T>(&cx.db, &order(cx, 1), vec![message(1)], TxEnd::Rollback)
        .await
        .unwrap_or_else(|e| panic!("{cx}: the rolled back transaction: {e}"));
    assert!(written.wrote_all(), "{cx}: the publish before the rollback");
    assert_eq!(orders(cx, 1).await, 0, "{cx}: the order rolled back");
    assert_eq!(
        cx.count("1=1").await,
        0,
        "{cx}: no row of a rolled back publish"
    );
}

/// Committed: the order and both jobs, taken at once.
async fn committed<H: Harness, T: SuiteRow>(
    cx: &Cx<'_, H>,
    recorder: &Recorder,
    within: Duration,
    poll: Duration,
) where
    H::Adapter: TakesRows<T>,
{
    let committed = Instant::now();
    let written = cx
        .harness
        .publish_in_transaction::<T>(
            &cx.db,
            &order(cx, 2),
            vec![message(2), message(3)],
            TxEnd::Commit,
        )
        .await
        .unwrap_or_else(|e| panic!("{cx}: the committed transaction: {e}"));
    assert!(written.wrote_all(), "{cx}: the committed publish");
    assert_eq!(orders(cx, 2).await, 1, "{cx}: the order committed");
    cx.until_within("both committed jobs are handled", within, || async {
        recorder.saw(2) && recorder.saw(3)
    })
    .await;
    println!(
        "{cx}: the committed jobs were handled {:?} after the commit (poll {poll:?})",
        committed.elapsed()
    );
    cx.until("the committed rows are settled", || async {
        cx.count("1=1").await == 0
    })
    .await;
}

/// A crash between the publish and the commit: neither.
async fn crashed<H: Harness>(cx: &Cx<'_, H>) {
    let child = ChildWorker::spawn(cx.test, &cx.db);
    cx.until("the child aborts", || async { child.exited() })
        .await;
    sleep(Duration::from_millis(100)).await;
    assert!(
        child.stderr().contains(ABORT_MARK),
        "{cx}: the child aborts with its transaction open: {}",
        child.stderr()
    );
    assert_eq!(orders(cx, 4).await, 0, "{cx}: the crashed order");
    assert_eq!(
        cx.count("k = 4").await,
        0,
        "{cx}: no row of a crashed publish"
    );
}

/// No broker: the harness's own pool.
async fn without_broker<H: Harness, T: SuiteRow>(
    cx: &Cx<'_, H>,
    recorder: &Recorder,
    within: Duration,
) where
    H::Adapter: TakesRows<T>,
{
    let written = cx
        .harness
        .publish_without_broker::<T>(&cx.db, vec![message(5), message(6)])
        .await
        .unwrap_or_else(|e| panic!("{cx}: the publish without a broker: {e}"));
    assert!(written.wrote_all(), "{cx}: the publish without a broker");
    cx.until_within(
        "the jobs published without a broker are handled",
        within,
        || async { recorder.saw(5) && recorder.saw(6) },
    )
    .await;
    cx.until("every row is settled", || async {
        cx.count("1=1").await == 0
    })
    .await;
}

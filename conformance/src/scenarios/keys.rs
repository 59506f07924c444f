//! Keys: rows sharing a key go into work one at a time, a key held elsewhere is passed over,
//! the custom lock's answers, and `workers(n)`.

use std::time::Duration;

use ruststream::Publisher;
use ruststream::adapter::TakesRows;

use super::{body, needs, run};
use crate::harness::{Harness, Runs};
use crate::rows::{Rows, SuiteRow};
use crate::schema;
use crate::support::{Cx, Gate, Opts, POLL, Recorder, one_at_a_time, sleep, subscription};
use crate::{Form, TestName, Verdict};

const SHUTDOWN: Duration = Duration::from_secs(10);

/// Rows sharing a key go into work one at a time (the handler counts the deliveries in work
/// per key: never more than one), in claim order, while rows of other keys proceed: beside
/// them where the database holds the keys, after them where the form takes one row at a time
/// (SQLite's registry, the custom lock).
pub async fn key_one_at_a_time<R: Rows, H: Runs<R::KeyOneAtATime>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(KeyOneAtATime => key_one_at_a_time_in);
    run::<H, R::KeyOneAtATime, _>(harness, form, test, KeyOneAtATime).await
}

async fn key_one_at_a_time_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    // Jobs 1, 2 and 4 share key 1; jobs 3 and 5 share key 2.
    let rows = [(1, 1), (2, 1), (3, 2), (4, 1), (5, 2)];
    let recorder = Recorder::sleeping(Duration::from_millis(60));
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let opts = Opts::default().workers(4);
    let service = cx.service(&broker, subscription::<T>(&recorder, opts), SHUTDOWN);
    let stop = async {
        for (n, k) in rows {
            cx.publish(&publisher, n, k).await;
        }
        cx.until("all five rows are handled and deleted", || async {
            recorder.count() >= 5 && cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(
        recorder.max_by_key(),
        1,
        "{cx}: rows that share a key go into work one at a time"
    );
    let order = recorder.ns();
    let of_key = |k: i64| -> Vec<i64> {
        order
            .iter()
            .copied()
            .filter(|n| rows.iter().any(|&(m, key)| m == *n && key == k))
            .collect()
    };
    assert_eq!(
        of_key(1),
        [1, 2, 4],
        "{cx}: the rows of a key in claim order"
    );
    assert_eq!(of_key(2), [3, 5], "{cx}: the rows of a key in claim order");
    assert_eq!(recorder.count(), 5, "{cx}: each row once");
    if one_at_a_time(cx.dialect(), cx.form()) {
        assert_eq!(
            recorder.max_in_work(),
            1,
            "{cx}: this form takes one row at a time"
        );
    } else {
        assert!(
            recorder.max_in_work() >= 2,
            "{cx}: rows of another key go into work beside a key's row (at most {} were)",
            recorder.max_in_work()
        );
    }
}

/// A key held elsewhere is passed over: its row waits, untaken (its attempt not counted),
/// until the key is released, then it is handled. The advisory lock form holds the key on the
/// harness's own connection, as another process would, and the rows of other keys go on
/// meanwhile; the custom lock form holds it in `held_keys`, and a claim there takes nothing
/// while the first due row's key is held ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)).
pub async fn key_held_elsewhere<R: Rows, H: Runs<R::KeyHeldElsewhere>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    if form == Form::Advisory {
        needs(harness, harness.capabilities().hold_key)?;
    }
    body!(KeyHeldElsewhere => key_held_elsewhere_in);
    run::<H, R::KeyHeldElsewhere, _>(harness, form, test, KeyHeldElsewhere).await
}

async fn key_held_elsewhere_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let custom = cx.form() == Form::Custom;
    let held = if custom {
        cx.hold_in_held_keys(1).await;
        None
    } else {
        let key = cx.key(1);
        let held = cx
            .harness
            .hold_key(&cx.db, &key)
            .await
            .unwrap_or_else(|e| panic!("{cx}: the harness did not hold key {key}: {e}"));
        Some(held)
    };
    let recorder = Recorder::acking();
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(
        &broker,
        subscription::<T>(&recorder, Opts::default()),
        SHUTDOWN,
    );
    let stop = async {
        // Job 1's key is held; job 2's is free.
        cx.publish(&publisher, 1, 1).await;
        cx.publish(&publisher, 2, 2).await;
        if custom {
            sleep(POLL * 10).await;
            assert_eq!(
                recorder.count(),
                0,
                "{cx}: while the first due row's key is held, a claim takes nothing"
            );
        } else {
            cx.until("job 2, whose key is free, is handled", || async {
                recorder.saw(2)
            })
            .await;
            sleep(POLL * 6).await;
            assert!(
                !recorder.saw(1),
                "{cx}: a row whose key is held elsewhere waits"
            );
        }
        assert_eq!(
            cx.attempt_of(1).await,
            0,
            "{cx}: a row whose key is held elsewhere is not taken: no attempt counted"
        );
        match held {
            Some(held) => held
                .release()
                .await
                .unwrap_or_else(|e| panic!("{cx}: releasing the key failed: {e}")),
            None => cx.release_in_held_keys(1).await,
        }
        cx.until("both rows are handled once the key is released", || async {
            recorder.count() >= 2 && cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(
        recorder.pairs(),
        [(1, 1), (2, 1)],
        "{cx}: the held row is handled at its first attempt once released"
    );
    if custom {
        assert_eq!(recorder.ns(), [1, 2], "{cx}: in claim order");
        assert_eq!(cx.held_keys().await, 0, "{cx}: every key released");
    }
}

/// The custom lock's answers ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)): a lock that answers false takes nothing (no attempt
/// counted, the row waits); an unlock that answers false closes the connection, whose session
/// (recorded by the lock) never takes a key again, while the row settles and the service goes
/// on.
pub async fn custom_lock_answers<R: Rows, H: Runs<R::CustomLockAnswers>>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    body!(CustomLockAnswers => custom_lock_answers_in);
    let form = Form::Custom;
    run::<H, R::CustomLockAnswers, _>(harness, form, test, CustomLockAnswers).await
}

async fn custom_lock_answers_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let gate = Gate::default();
    let recorder = Recorder::gated(&gate, |seen| seen.n == 2);
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(
        &broker,
        subscription::<T>(&recorder, Opts::default()),
        SHUTDOWN,
    );
    let (held_keys, key) = (
        schema::held_keys(cx.table.name),
        schema::key_column(cx.dialect()),
    );
    let mut closed = None;
    let stop = async {
        lock_answers_false(cx, &publisher, &recorder).await;

        // Unlock answers false: the key is gone from held_keys while job 2 is in work.
        cx.publish(&publisher, 2, 2).await;
        cx.until("job 2 is in work", || async { recorder.saw(2) })
            .await;
        let session = cx
            .i64(&format!(
                "SELECT COALESCE(session, -1) FROM {held_keys} WHERE {key} = '{}'",
                cx.key(2)
            ))
            .await;
        cx.release_in_held_keys(2).await;
        gate.open();
        cx.until(
            "job 2 settles although its unlock answers false",
            || async { cx.count("1=1").await == 0 },
        )
        .await;

        // The service goes on, on connections other than the closed one.
        for n in 3..=5 {
            cx.publish(&publisher, n, n).await;
        }
        cx.until("jobs 3 to 5 are handled and deleted", || async {
            recorder.count() >= 5 && cx.count("1=1").await == 0
        })
        .await;
        closed = Some(session);
    };
    service.run_until(stop).await.expect("the service runs");
    let session = closed.expect("the scenario ran to its end");
    assert_eq!(recorder.pairs(), [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]);
    let later: Vec<i64> = cx
        .i64s(&format!(
            "SELECT session FROM {} WHERE {key} IN ('{}', '{}', '{}')",
            schema::lock_log(cx.table.name),
            cx.key(3),
            cx.key(4),
            cx.key(5)
        ))
        .await;
    assert_eq!(later.len(), 3, "{cx}: the lock log holds jobs 3 to 5");
    assert!(
        !later.contains(&session),
        "{cx}: an unlock that answers false closes its connection: session {session} took a key again ({later:?})"
    );
    assert_eq!(cx.held_keys().await, 0, "{cx}: every key released");
}

/// Lock answers false: another system holds job 1's key, so the job waits, its attempt
/// uncounted, until the key is free.
async fn lock_answers_false<H: Harness, T: SuiteRow>(
    cx: &Cx<'_, H>,
    publisher: &Publisher<T, H::Adapter>,
    recorder: &Recorder,
) where
    H::Adapter: TakesRows<T>,
{
    cx.hold_in_held_keys(1).await;
    cx.publish(publisher, 1, 1).await;
    sleep(POLL * 10).await;
    assert_eq!(
        recorder.count(),
        0,
        "{cx}: a lock that answers false takes nothing"
    );
    assert_eq!(
        cx.attempt_of(1).await,
        0,
        "{cx}: a lock that answers false counts no attempt"
    );
    cx.release_in_held_keys(1).await;
    cx.until("job 1 is handled once its key is free", || async {
        recorder.saw(1) && cx.count("1=1").await == 0
    })
    .await;
}

/// `workers(n)`: where the form takes one row at a time (SQLite's advisory lock form, the
/// custom lock form everywhere) one delivery is in work at a time, and the next row waits up to
/// a poll interval after a settlement (measured); where the database holds the keys, `n`
/// deliveries of different keys are in work at once.
pub async fn workers<R: Rows, H: Runs<R::Workers>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(Workers => workers_in);
    run::<H, R::Workers, _>(harness, form, test, Workers).await
}

async fn workers_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    const POLL_INTERVAL: Duration = Duration::from_millis(300);
    // A claim's own time, and a loaded machine's.
    const SLACK: Duration = Duration::from_millis(150);
    for n in 1..=3 {
        cx.insert_job(n).await;
    }
    let recorder = if one_at_a_time(cx.dialect(), cx.form()) {
        // Short beside the poll interval, so a wait of more than one interval shows.
        Recorder::sleeping(Duration::from_millis(20))
    } else {
        // Each handler waits until the three are in work together (or 10 s pass), so the
        // check does not depend on how fast a loaded machine takes the three rows.
        let started = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        Recorder::new(move |_| {
            let started = started.clone();
            async move {
                started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while started.load(std::sync::atomic::Ordering::SeqCst) < 3
                    && std::time::Instant::now() < deadline
                {
                    sleep(Duration::from_millis(5)).await;
                }
                Ok(())
            }
        })
    };
    let broker = cx.broker();
    let opts = Opts::default().workers(3).poll(POLL_INTERVAL);
    let service = cx.service(&broker, subscription::<T>(&recorder, opts), SHUTDOWN);
    let stop = async {
        cx.until("three rows are handled and deleted", || async {
            recorder.count() >= 3 && cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    if one_at_a_time(cx.dialect(), cx.form()) {
        assert_eq!(recorder.ns(), [1, 2, 3], "{cx}: in claim order");
        assert_eq!(
            recorder.max_in_work(),
            1,
            "{cx}: with workers(3), one delivery is in work at a time"
        );
        let starts = recorder.starts();
        let ends = recorder.ends();
        let mut gaps = Vec::new();
        for (end, next) in ends.iter().zip(starts.iter().skip(1)) {
            let gap = next.at.saturating_duration_since(end.1);
            gaps.push(gap);
            assert!(
                gap <= POLL_INTERVAL + SLACK,
                "{cx}: the next row waits up to a poll interval ({POLL_INTERVAL:?}) after a settlement, not {gap:?}"
            );
        }
        println!(
            "{cx}: waits of the next row after a settlement, poll interval {POLL_INTERVAL:?}: {gaps:?}"
        );
    } else {
        // Three handlers in work at once start in the order their tasks first run, which the
        // executor picks: each row once, whatever that order.
        let mut ns = recorder.ns();
        ns.sort_unstable();
        assert_eq!(ns, [1, 2, 3], "{cx}: each row once");
        assert_eq!(
            recorder.max_in_work(),
            3,
            "{cx}: with workers(3), three deliveries of different keys are in work at once"
        );
    }
}

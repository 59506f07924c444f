//! Failed rows: a rejection keeps the row, marked failed with its error; rows that do not
//! decode fail the same way; a retry waits its delay; a take past `max_attempts` fails the
//! row without the handler, crashes counted; a panic or a timeout is a retry with its error;
//! failed rows are redriven or deleted through the broker.
//!
//! The tables keep failed rows (`due_at`, `failed_at`, `error`); an acknowledgement deletes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream::adapter::TakesRows;
use ruststream::{
    FailedRowsOf, Failure, HandlerOutcome, InboxContext, InboxQueue, RetryPolicy, Subscriber,
    Value, subscriber,
};

use super::crash::ChildWorker;
use super::{body, needs, run, table};
use crate::harness::{Harness, Runs};
use crate::rows::{Job, Rows, SuiteRow};
use crate::schema;
use crate::support::{Cx, POLL, Recorder, sleep};
use crate::{CHILD_ENV, Form, TestName, Verdict};
use ruststream_core::Dialect;

const SHUTDOWN: Duration = Duration::from_secs(10);
/// The lease of these scenarios: short, so a crashed worker's row returns soon.
const LEASE: Duration = Duration::from_secs(2);

/// The failures a subscription reported, as its hook saw them.
#[derive(Clone, Default)]
struct Failures(Arc<Mutex<Vec<Failure>>>);

impl Failures {
    fn all(&self) -> Vec<Failure> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The settings of a failing subscription beside its handler.
#[derive(Clone, Default)]
struct Setup {
    max_attempts: Option<u32>,
    timeout: Option<Duration>,
    policy: Option<RetryPolicy>,
    failures: Option<Failures>,
}

/// The subscription of `T`'s table, handled by `recorder`, with `setup`.
fn failing<T: SuiteRow>(
    recorder: &Recorder,
    setup: Setup,
) -> Subscriber<Recorder, InboxQueue<T>, Job, (), (), InboxContext> {
    let mut builder = subscriber(T::NAME, recorder.clone())
        .map_source(|_| InboxQueue::<T>::new(T::NAME))
        .poll_interval(POLL)
        .lease(LEASE);
    if let Some(max) = setup.max_attempts {
        builder = builder.max_attempts(max);
    }
    if let Some(timeout) = setup.timeout {
        builder = builder.timeout(timeout);
    }
    if let Some(policy) = setup.policy {
        builder = builder.retry_policy(policy);
    }
    if let Some(failures) = setup.failures {
        builder = builder.on_failure(move |failure| {
            failures
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(failure.clone());
        });
    }
    builder.build()
}

/// A rejection keeps the row, marked failed with the handler's error, after its one attempt;
/// no claim takes it again; the failure reaches the service's hook.
pub async fn reject_keeps_the_row_failed<R: Rows, H: Runs<R::RejectKeepsTheRowFailed>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(Reject => reject_in);
    run::<H, R::RejectKeepsTheRowFailed, _>(harness, form, test, Reject).await
}

async fn reject_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let recorder = Recorder::new(|seen| async move {
        match seen.n {
            3 => Ok(()),
            n => Err(HandlerOutcome::reject().with_error(format!("declined job {n}"))),
        }
    });
    let failures = Failures::default();
    let setup = Setup {
        failures: Some(failures.clone()),
        ..Setup::default()
    };
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(&broker, failing::<T>(&recorder, setup), SHUTDOWN);
    let stop = async {
        for n in 1..=3 {
            cx.publish(&publisher, n, n).await;
        }
        cx.until("both rejected rows are marked failed", || async {
            cx.count("failed_at IS NOT NULL").await == 2
        })
        .await;
        // Time enough for a retry, were there one.
        sleep(POLL * 8).await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(
        recorder.pairs(),
        [(1, 1), (2, 1), (3, 1)],
        "{cx}: a rejected row is handled once, never taken again"
    );
    assert_eq!(
        cx.count("1=1").await,
        2,
        "{cx}: the acknowledged row is deleted, the rejected rows stay"
    );
    for n in [1, 2] {
        assert_eq!(
            cx.count(&format!(
                "id = {n} AND failed_at IS NOT NULL AND attempt = 1 AND error = 'declined job {n}'"
            ))
            .await,
            1,
            "{cx}: row {n} is marked failed with its error, after its one attempt"
        );
    }
    let mut reported: Vec<(Value, Option<String>, bool)> = failures
        .all()
        .into_iter()
        .map(|f| (f.id, f.error.map(|e| e.to_string()), f.kept))
        .collect();
    reported.sort_by_key(|(id, ..)| id.as_int());
    assert_eq!(
        reported,
        [
            (Value::Int(1), Some("declined job 1".to_owned()), true),
            (Value::Int(2), Some("declined job 2".to_owned()), true),
        ],
        "{cx}: each failure reaches the hook once, with its row and error"
    );
    if cx.form() == Form::Custom {
        assert_eq!(cx.held_keys().await, 0, "{cx}: every key released");
    }
}

/// Rows inserted by hand that do not decode (a payload that is not JSON, a `NULL` payload,
/// bytes that are not UTF-8) fail without the handler, each with an error that names its row;
/// the rows beside them go on.
pub async fn undecodable_rows_fail<R: Rows, H: Runs<R::UndecodableRowsFail>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(Undecodable => undecodable_in);
    run::<H, R::UndecodableRowsFail, _>(harness, form, test, Undecodable).await
}

async fn undecodable_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    cx.insert(Some(1), 1, b"not json").await;
    cx.execute(&format!(
        "INSERT INTO {} (id, k, payload) VALUES (2, 2, NULL)",
        cx.table.name
    ))
    .await;
    cx.insert(Some(3), 3, &[0xff, 0xfe, 0x00, 0x9f]).await;
    cx.insert_job(4).await;
    let recorder = Recorder::acking();
    let failures = Failures::default();
    let setup = Setup {
        failures: Some(failures.clone()),
        ..Setup::default()
    };
    let broker = cx.broker();
    let service = cx.service(&broker, failing::<T>(&recorder, setup), SHUTDOWN);
    let stop = async {
        cx.until("the three broken rows are marked failed", || async {
            cx.count("failed_at IS NOT NULL").await == 3 && cx.count("1=1").await == 3
        })
        .await;
        sleep(POLL * 8).await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(
        recorder.pairs(),
        [(4, 1)],
        "{cx}: the handler sees the job, never a row that does not decode"
    );
    for id in 1..=3 {
        assert_eq!(
            cx.count(&format!(
                "id = {id} AND attempt = 1 AND failed_at IS NOT NULL AND error LIKE '%row {id}%does not decode%'"
            ))
            .await,
            1,
            "{cx}: row {id} is kept, failed after one attempt, its error naming it"
        );
    }
    let mut ids: Vec<i64> = failures
        .all()
        .iter()
        .filter(|f| f.kept)
        .filter_map(|f| f.id.as_int())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2, 3], "{cx}: each broken row is reported");
}

/// A retry with a delay is not taken before its time, in every form: the delay is written
/// into `due_at` (with the error), and the row returns after it.
pub async fn delayed_retry_waits<R: Rows, H: Runs<R::DelayedRetryWaits>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(Delayed => delayed_in);
    run::<H, R::DelayedRetryWaits, _>(harness, form, test, Delayed).await
}

async fn delayed_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    const DELAY: Duration = Duration::from_millis(1_500);
    let recorder = Recorder::new(|seen| async move {
        match seen.attempt {
            1 => Err(HandlerOutcome::retry_in(DELAY).with_error("the mail server is busy")),
            _ => Ok(()),
        }
    });
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(&broker, failing::<T>(&recorder, Setup::default()), SHUTDOWN);
    let stop = async {
        cx.publish(&publisher, 1, 1).await;
        cx.until("the retry's delay is written", || async {
            cx.count("error = 'the mail server is busy'").await == 1
        })
        .await;
        assert_eq!(
            cx.count("failed_at IS NULL").await,
            1,
            "{cx}: a retry does not fail the row"
        );
        cx.until("the row returns and is acknowledged", || async {
            cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    let (first, second) = match (recorder.seen(1, 1), recorder.seen(1, 2)) {
        (Some(a), Some(b)) => (a, b),
        _ => panic!("{cx}: attempts 1 and 2: {:?}", recorder.pairs()),
    };
    let waited = second.at.saturating_duration_since(first.at);
    assert!(
        waited >= DELAY - Duration::from_millis(50),
        "{cx}: the row returned after {waited:?}, before its delay of {DELAY:?}"
    );
    assert!(
        waited < DELAY + Duration::from_secs(5),
        "{cx}: the row returned {waited:?} after its retry, long after its delay of {DELAY:?}"
    );
    println!("{cx}: retried with a delay of {DELAY:?}, back after {waited:?}");
}

/// A row that fails every time, on a table with nowhere to keep it failed or to write its
/// delay (no `failed_at`, no due column: the shape of the spec's own tables), waits each
/// retry's delay in the process: its attempts follow the retry policy, not a loop, and the
/// rows behind it, of its key too, are served meanwhile.
pub async fn failing_row_waits_its_delay<R: Rows, H: Runs<R::FailingRowWaitsItsDelay>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(Waits => waits_in);
    run::<H, R::FailingRowWaitsItsDelay, _>(harness, form, test, Waits).await
}

async fn waits_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    const DELAY: Duration = Duration::from_millis(800);
    const RUN: Duration = Duration::from_secs(4);
    let recorder = Recorder::new(|seen| async move {
        match seen.n {
            1 => Err(HandlerOutcome::reject().with_error("a poison row")),
            _ => Ok(()),
        }
    });
    let setup = Setup {
        policy: Some(RetryPolicy::fixed(DELAY)),
        ..Setup::default()
    };
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(&broker, failing::<T>(&recorder, setup), SHUTDOWN);
    let started = Instant::now();
    let stop = async {
        // Every row on one key: the poison row first.
        for n in 1..=4 {
            cx.publish(&publisher, n, 0).await;
        }
        cx.until("the rows behind the poison row are served", || async {
            cx.count("1=1").await == 1
        })
        .await;
        // The stats of the table show the row waiting in this process.
        cx.until("the stats count the poison row waiting", || async {
            let stats = broker.stats::<T>().await.expect("the stats read");
            assert!(
                matches!(stats.waiting, Some(0 | 1)),
                "{cx}: the stats count {:?} rows waiting, not one at most",
                stats.waiting
            );
            stats.waiting == Some(1)
        })
        .await;
        sleep(RUN.saturating_sub(started.elapsed())).await;
    };
    service.run_until(stop).await.expect("the service runs");
    let elapsed = started.elapsed();
    let attempts = recorder.pairs().iter().filter(|(n, _)| *n == 1).count();
    // One attempt at once, then one per delay at most.
    let most = 2 + usize::try_from(elapsed.as_millis() / DELAY.as_millis()).unwrap_or(usize::MAX);
    assert!(
        (2..=most).contains(&attempts),
        "{cx}: the poison row was taken {attempts} times in {elapsed:?} with a delay of {DELAY:?}: {:?}",
        recorder.pairs()
    );
    for n in 2..=4 {
        assert!(
            recorder.saw(n),
            "{cx}: row {n} is served behind the poison row"
        );
    }
    assert_eq!(
        cx.count("id = 1").await,
        1,
        "{cx}: the poison row stays, as its table keeps no failed rows"
    );
    println!("{cx}: the poison row taken {attempts} times in {elapsed:?}");
}

/// `max_attempts(3)`: a row that is retried every time is handed at attempts 1 to 3, and the
/// third's retry fails it at once, with the handler's own error, without a fourth take.
pub async fn max_attempts_fails_the_row<R: Rows, H: Runs<R::MaxAttemptsFailsTheRow>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(MaxAttempts => max_attempts_in);
    run::<H, R::MaxAttemptsFailsTheRow, _>(harness, form, test, MaxAttempts).await
}

async fn max_attempts_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let recorder = Recorder::new(|seen| async move {
        match seen.n {
            1 => {
                Err(HandlerOutcome::retry().with_error(format!("attempt {} failed", seen.attempt)))
            }
            _ => Ok(()),
        }
    });
    let failures = Failures::default();
    let setup = Setup {
        max_attempts: Some(3),
        policy: Some(RetryPolicy::immediate()),
        failures: Some(failures.clone()),
        ..Setup::default()
    };
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(&broker, failing::<T>(&recorder, setup), SHUTDOWN);
    let stop = async {
        cx.publish(&publisher, 1, 1).await;
        cx.publish(&publisher, 2, 2).await;
        cx.until("the row is marked failed at its last attempt", || async {
            cx.count("failed_at IS NOT NULL").await == 1
        })
        .await;
        cx.until("the other row is acknowledged", || async {
            cx.count("1=1").await == 1
        })
        .await;
        sleep(POLL * 8).await;
    };
    service.run_until(stop).await.expect("the service runs");
    let attempts: Vec<i64> = recorder
        .pairs()
        .into_iter()
        .filter(|(n, _)| *n == 1)
        .map(|(_, a)| a)
        .collect();
    assert_eq!(
        attempts,
        [1, 2, 3],
        "{cx}: handed at attempts 1 to 3, never a fourth"
    );
    assert_eq!(
        cx.count("attempt = 3 AND failed_at IS NOT NULL AND error = 'attempt 3 failed'")
            .await,
        1,
        "{cx}: the third attempt's retry fails the row, with the handler's error"
    );
    let history = match cx.dialect() {
        Dialect::Postgres => {
            "jsonb_array_length(errors) = 3 AND errors->0->>'error' = 'attempt 1 failed' AND (errors->0->>'attempt')::int = 1 AND errors->2->>'error' = 'attempt 3 failed' AND (errors->2->>'attempt')::int = 3"
        }
        Dialect::MySql | Dialect::MariaDb => {
            "JSON_LENGTH(errors) = 3 AND JSON_UNQUOTE(JSON_EXTRACT(errors, '$[0].error')) = 'attempt 1 failed' AND JSON_EXTRACT(errors, '$[0].attempt') = 1 AND JSON_UNQUOTE(JSON_EXTRACT(errors, '$[2].error')) = 'attempt 3 failed' AND JSON_EXTRACT(errors, '$[2].attempt') = 3"
        }
        Dialect::Sqlite => {
            "json_array_length(errors) = 3 AND json_extract(errors, '$[0].error') = 'attempt 1 failed' AND json_extract(errors, '$[0].attempt') = 1 AND json_extract(errors, '$[2].error') = 'attempt 3 failed' AND json_extract(errors, '$[2].attempt') = 3"
        }
    };
    assert_eq!(
        cx.count(&format!("failed_at IS NOT NULL AND {history}"))
            .await,
        1,
        "{cx}: the row's history holds its three attempts' errors, oldest first"
    );
    let reported = failures.all();
    assert_eq!(reported.len(), 1, "{cx}: one failure: {reported:?}");
    assert_eq!(reported[0].attempt, Some(3));
    assert_eq!(
        reported[0].error.as_deref(),
        Some("attempt 3 failed"),
        "{cx}: the report carries the handler's error"
    );
}

/// A worker process that crashes on every attempt: each crash spends an attempt, and the
/// take past `max_attempts` fails the row, in the process that comes next, without running
/// its handler. The failure shows on the worker's standard error though it installs no
/// `tracing` subscriber.
///
/// Each child runs the service with `max_attempts(2)`; its handler marks `t_log` and the
/// child aborts. The parent starts children one after the other until the row fails.
pub async fn crashing_worker_fails_its_row<R: Rows, H: Runs<R::CrashingWorkerFailsItsRow>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    needs(harness, harness.capabilities().kill_process)?;
    if let Ok(db) = std::env::var(CHILD_ENV) {
        body!(Worker => crashing_child);
        let cx = Cx::attach(
            harness,
            db,
            table::<R::CrashingWorkerFailsItsRow>(form),
            test,
        );
        <H as Runs<R::CrashingWorkerFailsItsRow>>::on_form(form, Worker, &cx)?.await;
        return Ok(());
    }
    body!(Crashing => crashing_in);
    run::<H, R::CrashingWorkerFailsItsRow, _>(harness, form, test, Crashing).await
}

/// The child: aborts the process as soon as its handler starts (once the start is marked);
/// exits after a minute should nothing happen.
async fn crashing_child<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let recorder = Recorder::sleeping(Duration::from_secs(600));
    let setup = Setup {
        max_attempts: Some(2),
        ..Setup::default()
    };
    let broker = cx.broker();
    let service = cx.service(&broker, failing::<T>(&recorder, setup), SHUTDOWN);
    let log = schema::log(cx.table.name);
    let stop = async {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            if let Some(seen) = recorder.starts().first() {
                cx.execute(&format!(
                    "INSERT INTO {log} (n, attempt) VALUES ({}, {})",
                    seen.n, seen.attempt
                ))
                .await;
                std::process::abort();
            }
            sleep(Duration::from_millis(5)).await;
        }
    };
    let _ = service.run_until(stop).await;
    std::process::exit(3);
}

async fn crashing_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    cx.insert_job(1).await;
    let log = schema::log(cx.table.name);
    let mut children = 0;
    let last = loop {
        assert!(
            children < 5,
            "{cx}: {children} workers crashed and the row is not failed"
        );
        let child = ChildWorker::spawn(cx.test, &cx.db);
        children += 1;
        cx.until_within(
            "the worker crashed on the row, or failed it",
            Duration::from_secs(60),
            || async { child.exited() || cx.count("failed_at IS NOT NULL").await == 1 },
        )
        .await;
        if cx.count("failed_at IS NOT NULL").await == 1 {
            // The reporting child idles: give it a moment to write, then end it and read
            // what it wrote.
            sleep(Duration::from_millis(500)).await;
            child.kill();
            sleep(Duration::from_millis(200)).await;
            break child.stderr();
        }
        // Wait until the crashed worker's lease runs out before the next starts.
        if cx.form() == Form::Lease {
            sleep(LEASE + Duration::from_millis(200)).await;
        }
    };
    let handled = cx.i64(&format!("SELECT COUNT(*) FROM {log}")).await;
    assert_eq!(
        handled, 2,
        "{cx}: the handler ran at attempts 1 and 2, each a crash"
    );
    assert_eq!(
        children, 3,
        "{cx}: two workers crashed, the third failed the row"
    );
    assert_eq!(
        cx.count("attempt = 3 AND failed_at IS NOT NULL AND error LIKE '%past max_attempts (2)%'")
            .await,
        1,
        "{cx}: the third take, past the budget, failed the row"
    );
    assert!(
        last.contains("ruststream: table `") && last.contains("past max_attempts (2)"),
        "{cx}: the failure is on the worker's stderr without a tracing subscriber:\n{last}"
    );
}

/// A handler that panics is caught and its row retried with the panic's message as its
/// error; one that runs past `timeout` is ended and retried with an error that says so; the
/// third attempt acknowledges.
pub async fn panics_and_timeouts_retry<R: Rows, H: Runs<R::PanicsAndTimeoutsRetry>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(Panics => panics_in);
    run::<H, R::PanicsAndTimeoutsRetry, _>(harness, form, test, Panics).await
}

async fn panics_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    const TIMEOUT: Duration = Duration::from_millis(400);
    let recorder = Recorder::new(|seen| async move {
        match seen.attempt {
            1 => panic!("the handler of job {} broke", seen.n),
            2 => {
                sleep(Duration::from_secs(30)).await;
                Ok(())
            }
            _ => Ok(()),
        }
    });
    let setup = Setup {
        timeout: Some(TIMEOUT),
        policy: Some(RetryPolicy::immediate()),
        ..Setup::default()
    };
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(&broker, failing::<T>(&recorder, setup), SHUTDOWN);
    let stop = async {
        cx.publish(&publisher, 1, 1).await;
        cx.until("the panic is recorded", || async {
            cx.count("error LIKE '%the handler panicked: the handler of job 1 broke%'")
                .await
                == 1
                || recorder.seen(1, 3).is_some()
        })
        .await;
        cx.until("the row is acknowledged at its third attempt", || async {
            cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(
        recorder.pairs(),
        [(1, 1), (1, 2), (1, 3)],
        "{cx}: the panic and the timeout are retried"
    );
    let second = recorder.seen(1, 2).expect("attempt 2");
    let third = recorder.seen(1, 3).expect("attempt 3");
    let ran = third.at.saturating_duration_since(second.at);
    assert!(
        ran >= TIMEOUT - Duration::from_millis(20) && ran < Duration::from_secs(10),
        "{cx}: the timed-out attempt ended after {ran:?}, its timeout {TIMEOUT:?}"
    );
}

/// Failed rows return to the queue through the broker, by their error's text, and are
/// handled again from attempt 1; a failed row is deleted by id; a row that is not failed is
/// left alone.
pub async fn failed_rows_redriven_or_deleted<R: Rows, H: Runs<R::FailedRowsRedrivenOrDeleted>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(Redrive => redrive_in);
    run::<H, R::FailedRowsRedrivenOrDeleted, _>(harness, form, test, Redrive).await
}

async fn redrive_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let healed = Arc::new(AtomicBool::new(false));
    let recorder =
        {
            let healed = healed.clone();
            Recorder::new(move |seen| {
                let healed = healed.load(Ordering::SeqCst);
                async move {
                    match (healed, seen.n) {
                        (true, _) => Ok(()),
                        (false, 3) => Err(HandlerOutcome::reject().with_error("other trouble")),
                        (false, n) => Err(HandlerOutcome::reject()
                            .with_error(format!("the 50% quota_{n} ran out"))),
                    }
                }
            })
        };
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let failed = broker.failed_rows::<T>();
    let service = cx.service(&broker, failing::<T>(&recorder, Setup::default()), SHUTDOWN);
    let stop = async {
        for n in 1..=3 {
            cx.publish(&publisher, n, n).await;
        }
        cx.until("three rows failed", || async {
            cx.count("failed_at IS NOT NULL").await == 3
        })
        .await;
        healed.store(true, Ordering::SeqCst);
        // `%` and `_` in the text are matched as themselves.
        let none = failed
            .redrive(FailedRowsOf::ErrorContains("50_ quota".to_owned()))
            .await
            .expect("a redrive");
        assert_eq!(none, 0, "{cx}: `_` matches itself, not any character");
        let back = failed
            .redrive(FailedRowsOf::ErrorContains("50% quota".to_owned()))
            .await
            .expect("a redrive");
        assert_eq!(back, 2, "{cx}: the two rows whose error contains the text");
        cx.until("the redriven rows are handled and deleted", || async {
            cx.count("1=1").await == 1
        })
        .await;
        let deleted = failed
            .delete(FailedRowsOf::Ids(vec![Value::Int(3), Value::Int(99)]))
            .await
            .expect("a deletion");
        assert_eq!(deleted, 1, "{cx}: the one failed row among the ids");
        let nothing = failed.redrive(FailedRowsOf::All).await.expect("a redrive");
        assert_eq!(nothing, 0, "{cx}: no failed row is left");
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(cx.count("1=1").await, 0, "{cx}: the table is empty");
    assert_eq!(
        recorder.pairs(),
        [(1, 1), (1, 1), (2, 1), (2, 1), (3, 1)],
        "{cx}: redriven rows start again at attempt 1"
    );
}

/// Rows written with `#[derive(Inbox)]`: a field `locked_until: Option<i64>` decodes SQLite's
/// integer column, and no server's time column, so on a server the broker refuses to start,
/// naming the field and the column, before it claims a row; the same table with
/// `locked_until` named in `#[inbox(..)]` and no field runs on every database.
pub async fn role_fields_checked_at_start<R: Rows, H: Harness>(
    harness: &H,
    test: &TestName,
) -> Verdict
where
    H::Adapter: TakesRows<R::RoleFieldAsInteger> + TakesRows<R::RoleColumnOnly>,
{
    let spec = crate::schema::TableSpec {
        name: <R::RoleColumnOnly as SuiteRow>::NAME,
        form: Form::Lease,
        processed: false,
        failing: false,
    };
    let cx = Cx::prepare(harness, spec, test).await;
    let server = cx.dialect() != ruststream_core::Dialect::Sqlite;
    for n in 1..=3 {
        cx.insert_job(n).await;
    }
    let recorder = Recorder::acking();
    let broker = cx.broker();
    let as_integer = failing::<R::RoleFieldAsInteger>(&recorder, Setup::default());
    let service = cx.service(&broker, as_integer, SHUTDOWN);
    if server {
        let refused = service
            .run_until(async {})
            .await
            .expect_err("a field that cannot decode its column stops the start");
        let text = refused.to_string();
        assert!(
            text.contains("field `locked_until: Option<i64>`")
                && text.contains("column `locked_until`")
                && text.contains(cx.table.name),
            "{cx}: the refusal names the table, the field and the column: {text}"
        );
        println!("{cx}: refused at start: {text}");
        assert_eq!(recorder.count(), 0, "{cx}: no row was handed");
        assert_eq!(cx.count("attempt = 0").await, 3, "{cx}: no row was claimed");
    } else {
        service
            .run_until(async {
                cx.until("the rows are handled", || async {
                    cx.count("1=1").await == 0
                })
                .await;
            })
            .await
            .expect("an integer field decodes SQLite's integer column");
        for n in 1..=3 {
            cx.insert_job(n + 10).await;
        }
    }
    let recorder = Recorder::acking();
    let broker = cx.broker();
    let column_only = failing::<R::RoleColumnOnly>(&recorder, Setup::default());
    let service = cx.service(&broker, column_only, SHUTDOWN);
    service
        .run_until(async {
            cx.until("the rows are handled", || async {
                cx.count("1=1").await == 0
            })
            .await;
        })
        .await
        .expect("a column without a field needs no decoding");
    assert_eq!(recorder.count(), 3, "{cx}: each row handled once");
    if let Err(error) = harness.cleanup(&cx.db).await {
        println!("{cx}: cleaning up failed: {error}");
    }
    Ok(())
}

//! Crashes: a handler that panics, a worker process killed with SIGKILL, a connection
//! killed from the server side.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream::HandlerOutcome;
use ruststream::adapter::TakesRows;

use super::{body, needs, run, table};
use crate::harness::{Harness, Runs};
use crate::rows::{Rows, SuiteRow};
use crate::schema;
use crate::support::{Cx, Gate, Opts, Recorder, sleep, subscription};
use crate::{CHILD_ENV, Form, TestName, Verdict};

const SHUTDOWN: Duration = Duration::from_secs(10);
/// The lease of the crash tests: short, so the row returns soon.
const LEASE: Duration = Duration::from_secs(2);
/// What "at once" allows a row to return after a crash.
const AT_ONCE: Duration = Duration::from_secs(3);

/// A handler that panics does not take its row down: the panic is caught, the delivery
/// settles as a retry (its key released, its transaction ended), and the row is handled
/// again, at its second attempt, at once.
pub async fn panicking_handler_returns_the_row<
    R: Rows,
    H: Runs<R::PanickingHandlerReturnsTheRow>,
>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(Panicking => panicking_in);
    run::<H, R::PanickingHandlerReturnsTheRow, _>(harness, form, test, Panicking).await
}

async fn panicking_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let recorder = Recorder::new(|seen| async move {
        if seen.attempt == 1 {
            // Unwinds as a panic does, without the panic hook's report and backtrace, so that
            // a failure of this test is what its output shows.
            std::panic::resume_unwind(Box::new("conformance: this handler panics on purpose"));
        }
        Ok::<(), HandlerOutcome>(())
    });
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(
        &broker,
        subscription::<T>(&recorder, Opts::default()),
        SHUTDOWN,
    );
    let stop = async {
        cx.publish(&publisher, 1, 1).await;
        cx.until("the panicked row returns and is settled", || async {
            cx.count("processed_at IS NOT NULL").await == 1
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(
        recorder.pairs(),
        [(1, 1), (1, 2)],
        "{cx}: the row is handled again, at attempt 2"
    );
    let first = recorder.seen(1, 1).expect("attempt 1");
    let second = recorder.seen(1, 2).expect("attempt 2");
    let back = second.at.saturating_duration_since(first.at);
    assert!(
        back <= AT_ONCE,
        "{cx}: the row of a panicked handler returns at once, not after {back:?}"
    );
    println!("{cx}: the panicked row was taken again after {back:?}");
    assert_eq!(
        cx.count("attempt = 2").await,
        1,
        "{cx}: two attempts counted"
    );
    if cx.form() == Form::Custom {
        assert_eq!(cx.held_keys().await, 0, "{cx}: every key released");
    }
}

/// A worker killed with SIGKILL while its handler runs: the take committed, so the crash spent
/// the attempt, and the row returns: at once in the row lock and advisory lock forms, in the
/// lease form only when the lease runs out (not before).
///
/// The scenario re-runs the current test binary as a child (the test's exact name, with
/// [`CHILD_ENV`] naming the database), which plays the worker: it runs the service with a
/// handler that marks `started` in a table, then sleeps. The parent waits for the mark, kills
/// the child, and takes the row with a service of its own.
pub async fn sigkill_worker<R: Rows, H: Runs<R::SigkillWorker>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    needs(harness, harness.capabilities().kill_process)?;
    if let Ok(db) = std::env::var(CHILD_ENV) {
        body!(Worker => child_worker);
        let cx = Cx::attach(harness, db, table::<R::SigkillWorker>(form), test);
        <H as Runs<R::SigkillWorker>>::on_form(form, Worker, &cx)?.await;
        return Ok(());
    }
    body!(Sigkill => sigkill_in);
    run::<H, R::SigkillWorker, _>(harness, form, test, Sigkill).await
}

/// The child of [`sigkill_worker`]: the service, and a mark in `t_log` for each delivery its
/// handler starts. It exits after a minute, should its parent not kill it.
async fn child_worker<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let recorder = Recorder::sleeping(Duration::from_secs(600));
    let broker = cx.broker();
    let opts = Opts::default().lease(LEASE);
    let service = cx.service(&broker, subscription::<T>(&recorder, opts), SHUTDOWN);
    let log = schema::log(cx.table.name);
    let stop = async {
        let started = Instant::now();
        let mut marked = 0;
        while started.elapsed() < Duration::from_secs(60) {
            for seen in recorder.starts().into_iter().skip(marked) {
                cx.execute(&format!(
                    "INSERT INTO {log} (n, attempt) VALUES ({}, {})",
                    seen.n, seen.attempt
                ))
                .await;
                marked += 1;
            }
            sleep(Duration::from_millis(10)).await;
        }
    };
    let _ = service.run_until(stop).await;
    eprintln!("{cx}: the child worker was not killed within a minute");
    std::process::exit(3);
}

/// The child process and what it wrote to stderr.
pub(super) struct ChildWorker {
    child: Mutex<Child>,
    stderr: Arc<Mutex<String>>,
}

impl ChildWorker {
    pub(super) fn spawn(test: &TestName, db: &str) -> Self {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut child = Command::new(exe)
            .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, db)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the test binary starts as a child");
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(mut pipe) = child.stderr.take() {
            let into = stderr.clone();
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = pipe.read_to_string(&mut text);
                into.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_str(&text);
            });
        }
        Self {
            child: Mutex::new(child),
            stderr,
        }
    }

    /// Whether the child has exited.
    pub(super) fn exited(&self) -> bool {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        matches!(child.try_wait(), Ok(Some(_)))
    }

    /// What the child wrote to stderr so far (all of it, once it exited and a moment passed).
    pub(super) fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Panics if the child has exited.
    pub(super) fn check_alive(&self, what: &str) {
        let status = self
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .try_wait();
        if let Ok(Some(status)) = status {
            // Let the reader take what the child wrote.
            std::thread::sleep(Duration::from_millis(100));
            let stderr = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
            panic!(
                "{what}: the child worker exited ({status}) before its handler started:\n{stderr}"
            );
        }
    }

    /// SIGKILL, and waits until the process is gone.
    pub(super) fn kill(&self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        child.kill().expect("the child is killed");
        child.wait().expect("the killed child is reaped");
    }
}

impl Drop for ChildWorker {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

async fn sigkill_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    cx.insert_job(1).await;
    let log = schema::log(cx.table.name);
    let child = ChildWorker::spawn(cx.test, &cx.db);
    let what = cx.to_string();
    cx.until_within(
        "the child's handler started",
        Duration::from_secs(60),
        || async {
            child.check_alive(&what);
            cx.i64(&format!("SELECT COUNT(*) FROM {log}")).await > 0
        },
    )
    .await;
    let killed_wall = crate::support::now_micros();
    child.kill();
    let killed = Instant::now();
    assert_eq!(
        cx.attempt_of(1).await,
        1,
        "{cx}: the take committed before the handler ran: the crash spent the attempt"
    );
    let until = if cx.form() == Form::Lease {
        let until = cx.micros_of("locked_until", 1).await;
        assert!(
            until > killed_wall,
            "{cx}: the killed worker's lease still holds the row"
        );
        Some(until)
    } else {
        None
    };

    let recorder = Recorder::acking();
    let broker = cx.broker();
    let opts = Opts::default().lease(LEASE);
    let service = cx.service(&broker, subscription::<T>(&recorder, opts), SHUTDOWN);
    let stop = async {
        cx.until(
            "the row of the killed worker returns and is handled",
            || async { recorder.count() >= 1 && cx.count("1=1").await == 0 },
        )
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    let seen = recorder
        .seen(1, 2)
        .unwrap_or_else(|| panic!("{cx}: the row returns at attempt 2: {:?}", recorder.pairs()));
    match until {
        Some(until) => {
            assert!(
                seen.wall >= until - 50_000,
                "{cx}: the row returns when the killed worker's lease runs out, not {} ms before",
                (until - seen.wall) / 1000
            );
            assert!(
                seen.wall <= until + 2_000_000,
                "{cx}: the row returns soon after the lease runs out, not {} ms after",
                (seen.wall - until) / 1000
            );
            println!(
                "{cx}: the row returned {} ms after the kill, {} ms after the lease ran out",
                (seen.wall - killed_wall) / 1000,
                (seen.wall - until) / 1000
            );
        }
        None => {
            let back = seen.at.saturating_duration_since(killed);
            assert!(
                back <= AT_ONCE,
                "{cx}: the row of a killed worker returns at once, not after {back:?}"
            );
            println!("{cx}: the row returned {back:?} after the kill");
        }
    }
}

/// A connection killed from the server side while its delivery is in work (the advisory lock
/// form): the key's lock ends with it, the settlement on it fails, the row returns and is
/// handled again at its second attempt, and the service goes on.
pub async fn killed_connection<R: Rows, H: Runs<R::KilledConnection>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    needs(harness, harness.capabilities().kill_connection)?;
    body!(Killed => killed_in);
    run::<H, R::KilledConnection, _>(harness, form, test, Killed).await
}

async fn killed_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let gate = Gate::default();
    let recorder = Recorder::gated(&gate, |seen| seen.attempt == 1 && seen.n == 1);
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let service = cx.service(
        &broker,
        subscription::<T>(&recorder, Opts::default()),
        SHUTDOWN,
    );
    let stop = async {
        cx.publish(&publisher, 1, 1).await;
        cx.until("job 1 is in work", || async { recorder.saw(1) })
            .await;
        let key = cx.key(1);
        let found = cx
            .harness
            .kill_key_holder(&cx.db, &key)
            .await
            .unwrap_or_else(|e| panic!("{cx}: killing the holder of {key} failed: {e}"));
        assert!(
            found,
            "{cx}: the harness found the connection that holds {key}"
        );
        gate.open();
        cx.until("job 1 returns and is handled again", || async {
            recorder.seen(1, 2).is_some() && cx.count("1=1").await == 0
        })
        .await;
        cx.publish(&publisher, 2, 2).await;
        cx.until("the service goes on: job 2 is handled", || async {
            recorder.saw(2) && cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(recorder.pairs(), [(1, 1), (1, 2), (2, 1)]);
}

/// A row claimed ahead whose connection the server killed while the row waited (its key's
/// lock gone with it) is never handed: once the worker frees, the row is taken again from the
/// queue, at its next attempt, and handled once.
pub async fn killed_while_claimed_ahead<R: Rows, H: Runs<R::KilledWhileClaimedAhead>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    needs(harness, harness.capabilities().kill_connection)?;
    body!(KilledAhead => killed_ahead_in);
    run::<H, R::KilledWhileClaimedAhead, _>(harness, form, test, KilledAhead).await
}

async fn killed_ahead_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let gate = Gate::default();
    let recorder = Recorder::gated(&gate, |seen| seen.n == 1);
    let broker = cx.broker();
    let publisher = broker.publisher::<T>();
    let opts = Opts::default().workers(1).prefetch(1);
    let service = cx.service(&broker, subscription::<T>(&recorder, opts), SHUTDOWN);
    let stop = async {
        cx.publish(&publisher, 1, 1).await;
        cx.until("job 1 is in work", || async { recorder.saw(1) })
            .await;
        cx.publish(&publisher, 2, 2).await;
        // Taken (its attempt counted): the claim is over, and the key's lock stays with the
        // row's connection while the row waits.
        cx.until("job 2 is claimed ahead", || async {
            cx.count("attempt = 1").await == 2
        })
        .await;
        let key = cx.key(2);
        cx.until(
            "the connection that holds job 2's key is killed",
            || async {
                cx.harness
                    .kill_key_holder(&cx.db, &key)
                    .await
                    .unwrap_or_else(|e| panic!("{cx}: killing the holder of {key} failed: {e}"))
            },
        )
        .await;
        // Long enough for the row to be pinged before it is handed.
        sleep(ruststream::core::PING_AHEAD_AFTER + Duration::from_millis(200)).await;
        assert!(!recorder.saw(2), "{cx}: job 2 waits for the one worker");
        gate.open();
        cx.until("job 2 is handled and settled", || async {
            recorder.saw(2) && cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(
        recorder.pairs(),
        [(1, 1), (2, 2)],
        "{cx}: the claim of job 2 whose session was killed is never handed; the next one is"
    );
}

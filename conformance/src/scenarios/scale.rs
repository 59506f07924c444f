//! Scaling out: several processes on one table, each take counting one attempt in every form;
//! in the advisory lock form several processes on one table and its keys, a key held by
//! another system while the others flow, and a hot key whose rows take long. Each runs with
//! a poll interval long enough that a claim waiting for it would show, and asserts that no
//! row waited for one where nothing held it: the rate, not only the end state.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ruststream::adapter::TakesRows;
use ruststream::{HandlerOutcome, InboxQueue, RetryPolicy, subscriber};

use super::{body, needs, run};
use crate::harness::{Harness, Runs};
use crate::rows::{Job, Rows, SuiteRow};
use crate::support::{Cx, Opts, Recorder, Seen, one_at_a_time, sleep, subscription};
use crate::{Form, NotApplicable, TestName, Verdict};

/// The subscriptions' poll interval: a claim that waited for it would take longer than every
/// bound below.
const LONG_POLL: Duration = Duration::from_secs(5);
/// What the scenarios allow for the work itself on a loaded machine, well under
/// [`LONG_POLL`].
const NO_STALL: Duration = Duration::from_secs(4);
const SHUTDOWN: Duration = Duration::from_secs(10);

/// Where the database holds the keys; SQLite's registry and the custom lock take the first
/// due rows alone, so a row there may wait for the poll by the spec.
fn applies<H: Harness>(harness: &H, form: Form) -> Verdict {
    if one_at_a_time(harness.dialect(), form) {
        return Err(NotApplicable {
            harness: harness.name(),
            reason: format!(
                "{} takes one row at a time in this form, and one process serves its database",
                harness.dialect().name()
            ),
        });
    }
    Ok(())
}

/// Inserts job `n` with key column `k` for each pair, with the harness's own SQL (no publish,
/// so no broker hears of them: each finds them by its first claim).
async fn insert_jobs<H: Harness>(cx: &Cx<'_, H>, jobs: &[(i64, i64)]) {
    for &(n, k) in jobs {
        let payload = serde_json::to_vec(&Job { n }).expect("a job encodes");
        cx.insert(Some(n), k, &payload).await;
    }
}

/// The jobs of each key, in the order their deliveries started.
fn by_key(starts: &[Seen], jobs: &[(i64, i64)]) -> BTreeMap<i64, Vec<i64>> {
    let mut out: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for seen in starts {
        if let Some(&(_, k)) = jobs.iter().find(|(n, _)| *n == seen.n) {
            out.entry(k).or_default().push(seen.n);
        }
    }
    out
}

/// Asserts that each key's jobs went into work in claim order (the order of their ids).
fn assert_key_order<H: Harness>(cx: &Cx<'_, H>, recorder: &Recorder, jobs: &[(i64, i64)]) {
    for (k, ns) in by_key(&recorder.starts(), jobs) {
        let mut sorted = ns.clone();
        sorted.sort_unstable();
        assert_eq!(ns, sorted, "{cx}: the rows of key {k} in claim order");
    }
}

/// Two brokers (two processes) on one table and its keys, one of which holds keys for long:
/// the rows of the free keys are all handled while the long rows are in work (a claim that
/// found only held keys and waited for the poll would leave them to the end), each broker
/// takes rows, and a key is in work once across both.
pub async fn two_brokers_share_keys<R: Rows, H: Runs<R::TwoBrokersShareKeys>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    applies(harness, form)?;
    body!(TwoBrokersShareKeys => two_brokers_share_keys_in);
    run::<H, R::TwoBrokersShareKeys, _>(harness, form, test, TwoBrokersShareKeys).await
}

async fn two_brokers_share_keys_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    const LONG: Duration = Duration::from_millis(2500);
    // Jobs 1 to 3 (keys 1 to 3) take long; jobs 4 to 15 (two each of keys 4 to 9) are
    // quick. Four workers over the two brokers take the first rows: one broker holds two long
    // rows, the other one long row and a worker free for the quick ones behind them.
    let jobs: Vec<(i64, i64)> = (1..=15)
        .map(|n| (n, if n <= 3 { n } else { (n - 4) % 6 + 4 }))
        .collect();
    insert_jobs(cx, &jobs).await;
    let handled = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
    let each = |count: &Arc<AtomicUsize>| {
        let count = count.clone();
        move |seen: Seen| {
            let count = count.clone();
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                let quick = Duration::from_millis(50);
                sleep(if seen.n <= 3 { LONG } else { quick }).await;
                Ok(())
            }
        }
    };
    let first = Recorder::new(each(&handled[0]));
    let second = first.sharing(each(&handled[1]));
    let opts = Opts::default().workers(2).poll(LONG_POLL);
    let (a, b) = (cx.broker(), cx.broker());
    let service_a = cx.service(&a, subscription::<T>(&first, opts), SHUTDOWN);
    let service_b = cx.service(&b, subscription::<T>(&second, opts), SHUTDOWN);
    let drained = || {
        cx.until("both brokers drain the table", || async {
            first.count() >= jobs.len() && cx.count("1=1").await == 0
        })
    };
    let (ran_a, ran_b) = futures::join!(
        service_a.run_until(drained()),
        service_b.run_until(drained())
    );
    ran_a.expect("the first service runs");
    ran_b.expect("the second service runs");
    let ends = first.ends();
    let first_long_end = ends
        .iter()
        .filter(|(n, _)| *n <= 3)
        .map(|(_, at)| *at)
        .min()
        .unwrap_or_else(|| panic!("{cx}: no long row ended"));
    let late: Vec<i64> = ends
        .iter()
        .filter(|(n, at)| *n > 3 && *at > first_long_end)
        .map(|(n, _)| *n)
        .collect();
    assert!(
        late.is_empty(),
        "{cx}: the rows of free keys {late:?} were left until the long rows ended: a claim that found only held keys waited for the poll ({LONG_POLL:?})"
    );
    let counts = [
        handled[0].load(Ordering::SeqCst),
        handled[1].load(Ordering::SeqCst),
    ];
    assert!(
        counts.iter().all(|&n| n >= 2),
        "{cx}: each broker takes rows (they took {counts:?})"
    );
    assert_eq!(
        first.max_by_key(),
        1,
        "{cx}: a key is in work once across both brokers"
    );
    assert_key_order(cx, &first, &jobs);
    let pairs = first.pairs();
    assert_eq!(pairs.len(), jobs.len(), "{cx}: each row once: {pairs:?}");
    assert!(
        pairs.iter().all(|&(_, attempt)| attempt == 1),
        "{cx}: {pairs:?}"
    );
}

/// A key held by another system's session while the rows of the other keys flow: they are
/// handled without waiting for the poll, the held key's rows are not taken (no attempt
/// counted), and once released they follow in order, each right after the one before.
pub async fn free_keys_flow_past_a_held_key<R: Rows, H: Runs<R::FreeKeysFlowPastAHeldKey>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    applies(harness, form)?;
    needs(harness, harness.capabilities().hold_key)?;
    body!(FreeKeysFlowPastAHeldKey => free_keys_flow_past_a_held_key_in);
    run::<H, R::FreeKeysFlowPastAHeldKey, _>(harness, form, test, FreeKeysFlowPastAHeldKey).await
}

async fn free_keys_flow_past_a_held_key_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    // 15 jobs over 5 keys; key 1's are jobs 1, 6 and 11.
    let jobs: Vec<(i64, i64)> = (1..=15).map(|n| (n, (n - 1) % 5 + 1)).collect();
    let held_jobs = [1, 6, 11];
    insert_jobs(cx, &jobs).await;
    let key = cx.key(1);
    let held = cx
        .harness
        .hold_key(&cx.db, &key)
        .await
        .unwrap_or_else(|e| panic!("{cx}: the harness did not hold key {key}: {e}"));
    let recorder = Recorder::sleeping(Duration::from_millis(50));
    let broker = cx.broker();
    let opts = Opts::default().workers(2).poll(LONG_POLL);
    let service = cx.service(&broker, subscription::<T>(&recorder, opts), SHUTDOWN);
    let stop = async {
        let started = Instant::now();
        cx.until("the rows of the free keys are handled", || async {
            recorder.count() >= jobs.len() - held_jobs.len()
        })
        .await;
        let took = started.elapsed();
        assert!(
            took < NO_STALL,
            "{cx}: 12 rows of 4 free keys took {took:?} while another system held key 1: a claim waited for the poll ({LONG_POLL:?})"
        );
        for n in held_jobs {
            assert!(!recorder.saw(n), "{cx}: job {n}'s key is held elsewhere");
            assert_eq!(cx.attempt_of(n).await, 0, "{cx}: job {n} is not taken");
        }
        held.release()
            .await
            .unwrap_or_else(|e| panic!("{cx}: releasing the key failed: {e}"));
        cx.until("the held key's rows follow", || async {
            recorder.count() >= jobs.len() && cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    let starts = recorder.starts();
    let of_key: Vec<&Seen> = starts.iter().filter(|s| held_jobs.contains(&s.n)).collect();
    assert_eq!(
        of_key.iter().map(|s| s.n).collect::<Vec<_>>(),
        held_jobs,
        "{cx}: the held key's rows in claim order once released"
    );
    // Each next row of the key follows the settlement of the one before, without a poll.
    for pair in of_key.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(
            gap < NO_STALL,
            "{cx}: job {} waited {gap:?} after job {} of its key: a claim waited for the poll",
            pair[1].n,
            pair[0].n
        );
    }
    assert_key_order(cx, &recorder, &jobs);
    assert_eq!(recorder.max_by_key(), 1, "{cx}: a key is in work once");
}

/// A hot key whose rows take long, among keys whose rows are quick: the quick rows are handled
/// while the hot key's first row is in work, and the hot key's rows follow one another, each
/// as soon as the one before settles.
pub async fn hot_key_long_handler<R: Rows, H: Runs<R::HotKeyLongHandler>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    applies(harness, form)?;
    body!(HotKeyLongHandler => hot_key_long_handler_in);
    run::<H, R::HotKeyLongHandler, _>(harness, form, test, HotKeyLongHandler).await
}

async fn hot_key_long_handler_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    const HOT: Duration = Duration::from_millis(400);
    // Jobs 1 to 4 share the hot key 1; jobs 5 to 10 each have a key of their own.
    let jobs: Vec<(i64, i64)> = vec![
        (1, 1),
        (5, 2),
        (2, 1),
        (6, 3),
        (3, 1),
        (7, 4),
        (4, 1),
        (8, 5),
        (9, 6),
        (10, 7),
    ];
    let mut sorted = jobs.clone();
    sorted.sort_unstable();
    insert_jobs(cx, &sorted).await;
    let recorder = Recorder::new(|seen: Seen| async move {
        sleep(if seen.n <= 4 {
            HOT
        } else {
            Duration::from_millis(20)
        })
        .await;
        Ok(())
    });
    let broker = cx.broker();
    let opts = Opts::default().workers(2).poll(LONG_POLL);
    let service = cx.service(&broker, subscription::<T>(&recorder, opts), SHUTDOWN);
    let started = Instant::now();
    let stop = async {
        cx.until("every row is handled", || async {
            recorder.count() >= jobs.len() && cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    let took = started.elapsed();
    let ends = recorder.ends();
    let end_of = |n: i64| {
        ends.iter()
            .find(|(m, _)| *m == n)
            .map(|(_, at)| *at)
            .unwrap_or_else(|| panic!("{cx}: job {n} never ended"))
    };
    let first_hot_end = end_of(1);
    for n in 5..=10 {
        assert!(
            end_of(n) <= first_hot_end + Duration::from_millis(300),
            "{cx}: job {n}, of a free key, waited past the hot key's first row ({:?} after the start)",
            end_of(n).duration_since(started)
        );
    }
    assert!(
        took < 4 * HOT + NO_STALL,
        "{cx}: four 400 ms rows of one key and six quick rows took {took:?}: a claim waited for the poll ({LONG_POLL:?})"
    );
    let starts = recorder.starts();
    let hot: Vec<&Seen> = starts.iter().filter(|s| s.n <= 4).collect();
    assert_eq!(
        hot.iter().map(|s| s.n).collect::<Vec<_>>(),
        [1, 2, 3, 4],
        "{cx}: the hot key's rows in claim order"
    );
    for pair in hot.windows(2) {
        let waited = pair[1].at.duration_since(end_of(pair[0].n));
        assert!(
            waited < Duration::from_secs(2),
            "{cx}: job {} of the hot key started {waited:?} after job {} ended: a claim waited for the poll",
            pair[1].n,
            pair[0].n
        );
    }
    assert_eq!(recorder.max_by_key(), 1, "{cx}: a key is in work once");
}

/// Three brokers (three processes) on one table, each with several workers: every take counts
/// one attempt, across the processes. A count of one process never counts a row another has
/// counted and not yet locked, so with `max_attempts(2)` and every fourth job retried once,
/// each job is handled at attempt 1 (and its retry at 2), none fails past its budget, and the
/// table drains without a claim waiting for the poll.
pub async fn brokers_count_each_take_once<R: Rows, H: Runs<R::BrokersCountEachTakeOnce>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    applies(harness, form)?;
    body!(BrokersCountEachTakeOnce => brokers_count_each_take_once_in);
    run::<H, R::BrokersCountEachTakeOnce, _>(harness, form, test, BrokersCountEachTakeOnce).await
}

async fn brokers_count_each_take_once_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    const JOBS: i64 = 90;
    const BROKERS: usize = 3;
    let retried = |n: i64| n % 4 == 0;
    // Keys 1 to 30: three jobs a key, so the advisory form has keys to spread over.
    let jobs: Vec<(i64, i64)> = (1..=JOBS).map(|n| (n, (n - 1) % 30 + 1)).collect();
    insert_jobs(cx, &jobs).await;
    let act = move |seen: Seen| async move {
        sleep(Duration::from_millis(3)).await;
        if retried(seen.n) && seen.attempt == 1 {
            return Err(HandlerOutcome::retry());
        }
        Ok(())
    };
    let first = Recorder::new(act);
    let recorders: Vec<Recorder> = (1..BROKERS).map(|_| first.sharing(act)).collect();
    let opts = Opts::default().workers(3).poll(LONG_POLL);
    let brokers: Vec<_> = (0..BROKERS).map(|_| cx.broker()).collect();
    let expected = jobs.len() + jobs.iter().filter(|(n, _)| retried(*n)).count();
    let drained = || async {
        cx.until_within("the brokers drain the table", NO_STALL * 2, || async {
            first.count() >= expected && cx.count("1=1").await == 0
        })
        .await;
    };
    let started = Instant::now();
    let runs = brokers
        .iter()
        .zip(std::iter::once(&first).chain(&recorders))
        .map(|(broker, recorder)| {
            let subscription = subscriber(T::NAME, recorder.clone())
                .map_source(|_| InboxQueue::<T>::new(T::NAME))
                .workers(NonZeroUsize::new(opts.workers).unwrap_or(NonZeroUsize::MIN))
                .poll_interval(opts.poll)
                .lease(opts.lease)
                .max_attempts(2)
                .retry_policy(RetryPolicy::immediate())
                .build();
            cx.service(broker, subscription, SHUTDOWN)
                .run_until(drained())
        });
    for ran in futures::future::join_all(runs).await {
        ran.expect("each service runs");
    }
    let took = started.elapsed();
    let mut pairs = first.pairs();
    pairs.sort_unstable();
    let want: Vec<(i64, i64)> = jobs
        .iter()
        .flat_map(|&(n, _)| {
            if retried(n) {
                vec![(n, 1), (n, 2)]
            } else {
                vec![(n, 1)]
            }
        })
        .collect();
    assert_eq!(
        pairs, want,
        "{cx}: each job handled once at attempt 1, a retried one again at 2"
    );
    assert_eq!(
        cx.count("1=1").await,
        0,
        "{cx}: every row acknowledged, none failed past its budget"
    );
    assert!(
        took < NO_STALL * 2,
        "{cx}: {JOBS} jobs over {BROKERS} brokers took {took:?}: a claim waited for the poll ({LONG_POLL:?})"
    );
    if matches!(T::FORM, Form::Advisory) {
        assert_eq!(first.max_by_key(), 1, "{cx}: a key in work once at a time");
    }
}

//! The claim extractor: a handler's writes in the transaction its delivery lends it.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ruststream::adapter::TakesRows;
use ruststream::{
    Context, Handle, HandlerOutcome, InboxContext, InboxQueue, Subscriber, subscriber,
};

use super::crash::ChildWorker;
use super::{body, needs, run, table};
use crate::harness::{Harness, Runs};
use crate::rows::{Job, Rows, SuiteRow};
use crate::support::{Cx, POLL, sleep};
use crate::{CHILD_ENV, Form, TestName, Verdict};

const SHUTDOWN: Duration = Duration::from_secs(10);
/// The lease: the killed child's runs out soon after the kill.
const LEASE: Duration = Duration::from_secs(3);

/// A handler takes a transaction on its delivery's connection (the adapter's claim): what it
/// writes there commits with the acknowledgement, rolls back with a retry, and is gone with a
/// worker killed between the write and the commit. Both or neither, never one.
///
/// The kill: the test binary runs again as a child, whose handler writes its effect in the
/// claim's transaction, creates a marker file and waits; the parent kills it with SIGKILL.
pub async fn claim_commits_with_the_ack<R: Rows, H: Runs<R::ClaimCommitsWithTheAck>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    needs(harness, harness.capabilities().kill_process)?;
    if form == Form::Lease {
        needs(harness, harness.capabilities().claim_in_lease)?;
    }
    if let Ok(db) = std::env::var(CHILD_ENV) {
        body!(Child => child_in);
        let cx = Cx::attach(harness, db, table::<R::ClaimCommitsWithTheAck>(form), test);
        <H as Runs<R::ClaimCommitsWithTheAck>>::on_form(form, Child, &cx)?.await;
        return Ok(());
    }
    body!(Claim => claim_in);
    run::<H, R::ClaimCommitsWithTheAck, _>(harness, form, test, Claim).await
}

/// Writes `<table>_effects (n, attempt)` in the claim's transaction; then waits to be killed
/// (the child, marking it first), retries the attempts below `retry_below`, or acknowledges.
struct Effect<H> {
    effects: String,
    marker: Option<PathBuf>,
    retry_below: i64,
    handled: Arc<AtomicUsize>,
    harness: PhantomData<fn() -> H>,
}

impl<H: Harness> Handle<Job, (), (), InboxContext> for Effect<H> {
    async fn handle(
        &self,
        job: &Job,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let attempt = ctx.kind().info().attempt.unwrap_or(0);
        // A second attempt's write would break the primary key if the first one's stayed.
        let sql = format!(
            "INSERT INTO {} (n, attempt) VALUES ({}, {attempt})",
            self.effects, job.n
        );
        H::write_in_claim(ctx, sql).await?;
        if let Some(marker) = &self.marker {
            std::fs::write(marker, b"written").expect("the marker");
            sleep(Duration::from_secs(600)).await;
        }
        self.handled.fetch_add(1, Ordering::SeqCst);
        if attempt < self.retry_below {
            return Err(HandlerOutcome::retry().with_error("not yet"));
        }
        Ok(())
    }
}

/// The table of the handler's writes, beside the scenario's.
fn effects<H: Harness>(cx: &Cx<'_, H>) -> String {
    format!("{}_effects", cx.table.name)
}

/// The file the child's handler creates once it wrote: a file, since on SQLite the claim's
/// transaction holds the write lock until it ends.
fn marker<H: Harness>(cx: &Cx<'_, H>) -> PathBuf {
    let mut hasher = DefaultHasher::new();
    cx.db.hash(&mut hasher);
    let name = format!("{}-{:016x}.marker", cx.table.name, hasher.finish());
    std::env::temp_dir().join(name)
}

/// The subscription of `T`'s table, handled by `effect`, retrying at once.
fn effect_subscription<H: Harness, T: SuiteRow>(
    effect: Effect<H>,
) -> Subscriber<Effect<H>, InboxQueue<T>, Job, (), (), InboxContext> {
    subscriber(T::NAME, effect)
        .map_source(|_| InboxQueue::<T>::new(T::NAME))
        .poll_interval(POLL)
        .lease(LEASE)
        .retry_policy(ruststream::RetryPolicy::immediate())
        .build()
}

/// The child: the service, whose handler writes, marks and waits to be killed.
async fn child_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let effect = Effect::<H> {
        effects: effects(cx),
        marker: Some(marker(cx)),
        retry_below: 0,
        handled: Arc::default(),
        harness: PhantomData,
    };
    let broker = cx.broker();
    let service = cx.service(&broker, effect_subscription::<H, T>(effect), SHUTDOWN);
    let _ = service.run_until(sleep(Duration::from_secs(60))).await;
    eprintln!("{cx}: the child was not killed within a minute");
    std::process::exit(3);
}

/// The parent: job 1 in the table; the child killed between its write and the commit leaves
/// neither; then a service whose handler writes and retries below attempt 3 takes job 1 again
/// and job 2, and keeps exactly each one's acknowledged write.
async fn claim_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    let effects = effects(cx);
    cx.execute(&format!("DROP TABLE IF EXISTS {effects}")).await;
    cx.execute(&format!(
        "CREATE TABLE {effects} (n BIGINT PRIMARY KEY, attempt BIGINT NOT NULL)"
    ))
    .await;
    let payload = serde_json::to_vec(&Job { n: 1 }).expect("a job encodes");
    cx.insert(None, 1, &payload).await;
    killed_before_the_commit(cx, &effects).await;

    let handled = Arc::new(AtomicUsize::new(0));
    let effect = Effect::<H> {
        effects: effects.clone(),
        marker: None,
        retry_below: 3,
        handled: handled.clone(),
        harness: PhantomData,
    };
    let payload = serde_json::to_vec(&Job { n: 2 }).expect("a job encodes");
    cx.insert(None, 2, &payload).await;
    let broker = cx.broker();
    let service = cx.service(&broker, effect_subscription::<H, T>(effect), SHUTDOWN);
    let stop = async {
        cx.until("both rows are settled", || async {
            cx.count("1=1").await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");
    assert_eq!(
        handled.load(Ordering::SeqCst),
        5,
        "{cx}: job 1's attempts 2 and 3, job 2's attempts 1 to 3"
    );
    for n in [1, 2] {
        let sql = format!("SELECT COUNT(*) FROM {effects} WHERE n = {n} AND attempt = 3");
        assert_eq!(
            cx.i64(&sql).await,
            1,
            "{cx}: job {n}'s acknowledged attempt's write, once"
        );
    }
    assert_eq!(
        cx.i64(&format!("SELECT COUNT(*) FROM {effects}")).await,
        2,
        "{cx}: nothing of the killed attempt or the retried ones"
    );
}

/// Runs the child until its handler wrote job 1's effect in its claim, kills it, and waits
/// until its transaction is rolled back: no effect, the row still there.
async fn killed_before_the_commit<H: Harness>(cx: &Cx<'_, H>, effects: &str) {
    let marker = marker(cx);
    let _ = std::fs::remove_file(&marker);
    let child = ChildWorker::spawn(cx.test, &cx.db);
    let what = cx.to_string();
    cx.until_within(
        "the child's handler wrote in its claim",
        Duration::from_secs(60),
        || async {
            child.check_alive(&what);
            marker.exists()
        },
    )
    .await;
    child.kill();
    let _ = std::fs::remove_file(&marker);
    let all = format!("SELECT COUNT(*) FROM {effects}");
    cx.until("the killed child's transaction is rolled back", || async {
        cx.i64(&all).await == 0 && cx.count("1=1").await == 1
    })
    .await;
}

//! A handler takes a transaction on its delivery's connection (`TokioPostgresClaim`): the row
//! lock form's claim transaction, the lease form's transaction begun on a connection taken
//! for it. A write on it commits with the acknowledgement and rolls back with a retry.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use ruststream::{FromContext, IntoSubscription};
use ruststream_tokio_postgres::TokioPostgresClaim;
use ruststream_tokio_postgres::prelude::*;

/// A job of `claimed`, in the row lock form.
#[derive(Inbox, serde::Deserialize)]
#[inbox(table = "claimed")]
struct Claimed {
    #[field(id, generated)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i32,
    #[field(payload)]
    payload: Vec<u8>,
}

/// A job of `leased`, in the lease form.
#[derive(Inbox, serde::Deserialize)]
#[inbox(table = "leased", locked_until = "locked_until")]
struct Leased {
    #[field(id, generated)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i32,
    #[field(payload)]
    payload: Vec<u8>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job {
    n: i64,
}

/// Writes its job's effect in the claim's transaction; retries its first attempt.
#[derive(Clone, Default)]
struct Effect {
    handled: Arc<AtomicUsize>,
}

impl Handle<Job, (), (), InboxContext> for Effect {
    async fn handle(
        &self,
        job: &Job,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let attempt = ctx.kind().info().attempt.unwrap_or(0);
        let claim = TokioPostgresClaim::from_context(ctx).await?;
        claim
            .execute(
                "INSERT INTO effects (n, attempt) VALUES ($1, $2)",
                &[&job.n, &attempt],
            )
            .await
            .map_err(|e| HandlerOutcome::retry().with_error(e))?;
        self.handled.fetch_add(1, Ordering::SeqCst);
        if attempt < 2 {
            return Err(HandlerOutcome::retry().with_error("not yet"));
        }
        Ok(())
    }
}

async fn writes_commit_with_the_ack_and_roll_back_with_a_retry<T>(name: &str, table: &str)
where
    T: ruststream::InboxTable
        + ruststream::PayloadRow
        + ruststream::DecodesAs<Job>
        + serde::de::DeserializeOwned
        + 'static,
    TokioPostgresBroker: ruststream::adapter::TakesRows<T>,
{
    let db = Db::new(name).await;
    db.execute(&format!(
        "CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, attempt INT NOT NULL DEFAULT 0,
             payload BYTEA NOT NULL, locked_until TIMESTAMPTZ);
         CREATE TABLE effects (n BIGINT PRIMARY KEY, attempt BIGINT NOT NULL);"
    ))
    .await;
    let effect = Effect::default();
    let subscription = ruststream::subscriber("claims", effect.clone())
        .map_source(|_| InboxQueue::<T>::new("claims"))
        .poll_interval(POLL)
        .retry_policy(ruststream::RetryPolicy::immediate())
        .into_subscription();
    let broker = TokioPostgresBroker::from_url(
        db.url(),
        ruststream_tokio_postgres::deadpool_postgres::PoolConfig::new(4),
    );
    let running = broker
        .start([subscription])
        .await
        .expect("the broker starts");
    running
        .publisher::<T>()
        .publish(Message::json(&Job { n: 7 }).unwrap())
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || effect.handled.load(Ordering::SeqCst) >= 2).await,
        "attempts 1 and 2 handled"
    );
    assert_eq!(
        db.wait_count(&format!("SELECT COUNT(*) FROM {table}"), 0)
            .await,
        0
    );
    running.shutdown().await;
    assert_eq!(
        db.count("SELECT COUNT(*) FROM effects WHERE n = 7 AND attempt = 2")
            .await,
        1,
        "the acknowledged attempt's write"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM effects").await,
        1,
        "nothing of the retried attempt"
    );
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_transaction_commits_with_the_ack_and_rolls_back_with_a_retry() {
    writes_commit_with_the_ack_and_roll_back_with_a_retry::<Claimed>("claim", "claimed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_delivery_lends_a_transaction_that_commits_with_the_ack() {
    writes_commit_with_the_ack_and_roll_back_with_a_retry::<Leased>("claim_lease", "leased").await;
}

//! Wake-up across processes on PostgreSQL: a row another broker publishes is picked up at once
//! (LISTEN/NOTIFY), not at the next poll, also after the listening session was terminated; a
//! raw insert that notifies wakes too; and nothing of the listener stays after the shutdown.
//!
//! The subscriptions poll every 30 seconds: only a notification explains a pickup within a
//! second.

use std::time::{Duration, Instant};

use ruststream::{Handle, HandlerOutcome, InboxContext, IntoSubscription, Subscription};
use ruststream_sqlx::prelude::*;
use ruststream_sqlx::sqlx;
use tokio::sync::mpsc;

use crate::common::*;

mod across {
    crate::tables!("pg_wake");
}
mod raw {
    crate::tables!("pg_wake_raw");
}

/// Longer than any test waits for a pickup.
const LONG_POLL: Duration = Duration::from_secs(30);
/// A pickup slower than this is not a notification's.
const PROMPT: Duration = Duration::from_secs(1);

/// The listening session, by the statement it ran.
const LISTENER: &str = "AND query = 'LISTEN ruststream' AND state = 'idle'";

/// Sends each message's number, and when its handler saw it.
#[derive(Clone)]
struct Stamp(mpsc::UnboundedSender<(u32, Instant)>);

impl Handle<Job, (), (), InboxContext> for Stamp {
    async fn handle(
        &self,
        job: &Job,
        _outs: &(),
        _ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let _ = self.0.send((job.n, Instant::now()));
        Ok(())
    }
}

fn stamped<T>(tx: &mpsc::UnboundedSender<(u32, Instant)>) -> Subscription<SqlxBroker<Postgres>>
where
    T: InboxTable + PayloadRow + ruststream::DecodesAs<Job>,
    SqlxBroker<Postgres>: ruststream::adapter::TakesRows<T>,
{
    ruststream::subscriber("jobs", Stamp(tx.clone()))
        .map_source(|_| InboxQueue::<T>::new("jobs"))
        .poll_interval(LONG_POLL)
        .into_subscription()
}

/// How long the subscriber is left to settle a row and find no other: the claim that follows
/// a delivery must not pick up the next row in place of a notification.
const QUIET: Duration = Duration::from_millis(200);

/// Waits until `table` is empty (every row settled) and the subscriber has gone quiet.
async fn quiet(db: &Pg, table: &str) {
    eventually("every row is settled", || async {
        db.scalar(&format!("SELECT COUNT(*) FROM {table}")).await == 0
    })
    .await;
    tokio::time::sleep(QUIET).await;
}

/// How long after `since` the message `n` was handled; fails after [`WAIT`].
async fn picked_up(
    rx: &mut mpsc::UnboundedReceiver<(u32, Instant)>,
    n: u32,
    since: Instant,
) -> Duration {
    let (got, at) = tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("message {n} was not handled within {WAIT:?}"))
        .expect("the handler lives");
    assert_eq!(got, n, "the messages come one at a time, in order");
    at - since
}

/// The pid of the listening session, once there is one.
async fn listener_pid(db: &Pg) -> i64 {
    eventually("the subscriber's broker listens", || async {
        db.sessions(LISTENER).await == 1
    })
    .await;
    db.scalar(&format!(
        "SELECT CAST(pid AS BIGINT) FROM pg_stat_activity WHERE application_name = '{}' {LISTENER}",
        db.schema
    ))
    .await
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_brokers_publish_wakes_the_subscriber_also_after_its_listener_is_terminated() {
    use across::RowLock;
    let db = Pg::new("pg_wake").await;
    db.exec(&schema(Dialect::Postgres, across::PREFIX)).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    // A: the subscriber. B: another service that only publishes, and so does not listen.
    let a = db
        .broker()
        .start([stamped::<RowLock>(&tx)])
        .await
        .expect("the subscriber's broker starts");
    let b = db
        .broker()
        .start(Vec::new())
        .await
        .expect("the publisher's broker starts");
    let publisher = b.publisher::<RowLock>();
    let table = "pg_wake_rowlock";
    let first = listener_pid(&db).await;
    quiet(&db, table).await;

    let mut latencies = Vec::new();
    for n in 0..20 {
        let since = Instant::now();
        publisher.publish(message(n, None)).await.expect("publish");
        let latency = picked_up(&mut rx, n, since).await;
        assert!(
            latency < PROMPT,
            "message {n} waited {latency:?}: a notification, not the poll, wakes the subscriber"
        );
        latencies.push(latency);
        quiet(&db, table).await;
    }
    eprintln!(
        "sqlx: pickup of another broker's publish: p50 {:?}, max {:?}",
        median(latencies.clone()),
        latencies.iter().max().expect("samples")
    );

    // The server ends the listening session: the next publish still wakes the subscriber,
    // through the session that replaces it (which wakes every subscription when it opens).
    let terminated = db
        .scalar(&format!(
            "SELECT COUNT(*) FROM (SELECT pg_terminate_backend({first})) t"
        ))
        .await;
    assert_eq!(terminated, 1);
    let since = Instant::now();
    publisher
        .publish(message(100, None))
        .await
        .expect("publish");
    let latency = picked_up(&mut rx, 100, since).await;
    assert!(
        latency < PROMPT,
        "the row published while the listener was gone waited {latency:?}"
    );
    quiet(&db, table).await;
    eventually("the terminated session is gone", || async {
        db.sessions(&format!("AND pid = {first}")).await == 0
    })
    .await;
    let second = listener_pid(&db).await;
    assert_ne!(second, first, "a new session listens");
    quiet(&db, table).await;
    for n in 101..106 {
        let since = Instant::now();
        publisher.publish(message(n, None)).await.expect("publish");
        let latency = picked_up(&mut rx, n, since).await;
        assert!(
            latency < PROMPT,
            "message {n} waited {latency:?} after the listener came back"
        );
        quiet(&db, table).await;
    }

    b.shutdown().await;
    a.shutdown().await;
    // The close waited for the listening connection to close; its backend exits a moment later.
    let start = Instant::now();
    while db.sessions("").await > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "sessions of the brokers left after the shutdown: {} (listening: {})",
            db.sessions("").await,
            db.sessions(LISTENER).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    db.drop().await;
}

/// A row inserted by hand wakes the subscriber when its writer notifies, with the statement
/// the core gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_insert_that_notifies_wakes_the_subscriber() {
    use raw::RowLock;
    let db = Pg::new("pg_wake_raw").await;
    db.exec(&schema(Dialect::Postgres, raw::PREFIX)).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let a = db
        .broker()
        .start([stamped::<RowLock>(&tx)])
        .await
        .expect("the broker starts");
    listener_pid(&db).await;
    let table = format!("{}_rowlock", raw::PREFIX);
    quiet(&db, &table).await;
    let notify = ruststream::core::Dialect::Postgres
        .notify_statement(&table)
        .expect("PostgreSQL notifies");
    let payload = serde_json::to_vec(&Job { n: 1 }).expect("a job encodes");
    let since = Instant::now();
    let mut tx_raw = db.admin.begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (payload) VALUES ($1)"
    )))
    .bind(payload)
    .execute(&mut *tx_raw)
    .await
    .expect("insert");
    sqlx::raw_sql(sqlx::AssertSqlSafe(notify))
        .execute(&mut *tx_raw)
        .await
        .expect("notify");
    tx_raw.commit().await.expect("commit");
    let latency = picked_up(&mut rx, 1, since).await;
    assert!(latency < PROMPT, "the raw row waited {latency:?}");
    a.shutdown().await;
    db.drop().await;
}

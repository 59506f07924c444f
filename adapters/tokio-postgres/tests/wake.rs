//! Wake-up across processes on the real PostgreSQL: a row another broker publishes is picked
//! up at once (LISTEN/NOTIFY), not at the next poll, under both protocols and also after the
//! listening session was terminated; a broker without a listener waits for its poll; a broker
//! on the service's own pool listens where it is told; and nothing of the listener stays after
//! the shutdown.
//!
//! The subscriptions poll every 30 seconds: only a notification explains a pickup within a
//! second.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ruststream::Subscription;
use ruststream_tokio_postgres::deadpool_postgres::PoolConfig;
use ruststream_tokio_postgres::prelude::*;
use ruststream_tokio_postgres::tokio_postgres::{self, NoTls};
use tokio::sync::mpsc;

/// Longer than any test waits for a pickup.
const LONG_POLL: Duration = Duration::from_secs(30);
/// A pickup slower than this is not a notification's.
const PROMPT: Duration = Duration::from_secs(1);

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

type Stamps = mpsc::UnboundedReceiver<(u32, Instant)>;

/// A subscription of `invoices` (the row lock form) that polls every `poll`.
fn stamped(poll: Duration) -> (Subscription<TokioPostgresBroker>, Stamps) {
    let (tx, rx) = mpsc::unbounded_channel();
    let subscription = ruststream::IntoSubscription::<TokioPostgresBroker>::into_subscription(
        subscriber("invoices", Stamp(tx))
            .map_source(|_| InboxQueue::<Invoice>::new("invoices"))
            .poll_interval(poll)
            .build(),
    );
    (subscription, rx)
}

/// How long after `since` the message `n` was handled; fails after [`WAIT`].
async fn picked_up(rx: &mut Stamps, n: u32, since: Instant) -> Duration {
    let (got, at) = tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("message {n} was not handled within {WAIT:?}"))
        .expect("the handler lives");
    assert_eq!(got, n, "the messages come one at a time, in order");
    at - since
}

/// How long the subscriber is left to settle a row and find no other: the claim that follows
/// a delivery must not pick up the next row in place of a notification.
const QUIET: Duration = Duration::from_millis(200);

/// Publishes `n` through `publisher` and answers how long until the subscriber handled it;
/// then waits until the row is settled and the subscriber has gone quiet.
async fn pickup(
    db: &Db,
    publisher: &TokioPostgresPublisher<Invoice>,
    rx: &mut Stamps,
    n: u32,
) -> Duration {
    let since = Instant::now();
    publisher
        .publish(message(Form::RowLock, n))
        .await
        .expect("publish");
    let latency = picked_up(rx, n, since).await;
    assert_eq!(
        db.wait_count("SELECT COUNT(*) FROM invoices", 0).await,
        0,
        "the row is settled"
    );
    tokio::time::sleep(QUIET).await;
    latency
}

/// The test's listening sessions.
fn listeners(db: &Db) -> String {
    format!(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = '{}' \
         AND query = 'LISTEN ruststream' AND state = 'idle'",
        db.name
    )
}

/// The pid of the one listening session, once there is one.
async fn listener_pid(db: &Db) -> i64 {
    assert_eq!(
        db.wait_count(&listeners(db), 1).await,
        1,
        "one session listens"
    );
    db.count(&format!(
        "SELECT pid::bigint FROM pg_stat_activity WHERE application_name = '{}' \
         AND query = 'LISTEN ruststream' AND state = 'idle'",
        db.name
    ))
    .await
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

async fn another_brokers_publish_wakes_the_subscriber(test: &str, simple: bool) {
    let db = Db::new(test).await;
    // A: the subscriber. B: another service that only publishes, and so does not listen.
    let (subscription, mut rx) = stamped(LONG_POLL);
    let a = db
        .broker(4, simple)
        .start([subscription])
        .await
        .expect("the subscriber's broker starts");
    let b = db
        .broker(2, simple)
        .start(Vec::new())
        .await
        .expect("the publisher's broker starts");
    let publisher = b.publisher::<Invoice>();
    let first = listener_pid(&db).await;
    // The claim a new listening session wakes is over.
    tokio::time::sleep(QUIET).await;

    let mut latencies = Vec::new();
    for n in 0..20 {
        let latency = pickup(&db, &publisher, &mut rx, n).await;
        assert!(
            latency < PROMPT,
            "message {n} waited {latency:?}: a notification, not the poll, wakes the subscriber"
        );
        latencies.push(latency);
    }
    eprintln!(
        "tokio-postgres (simple query: {simple}): pickup of another broker's publish: p50 {:?}, max {:?}",
        median(latencies.clone()),
        latencies.iter().max().expect("samples")
    );

    // The server ends the listening session: the next publish still wakes the subscriber,
    // through the session that replaces it (which wakes every subscription when it opens).
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM (SELECT pg_terminate_backend({first})) t"
        ))
        .await,
        1
    );
    let latency = pickup(&db, &publisher, &mut rx, 100).await;
    assert!(
        latency < PROMPT,
        "the row published while the listener was gone waited {latency:?}"
    );
    let gone = format!("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = {first}");
    assert_eq!(db.wait_count(&gone, 0).await, 0);
    let second = listener_pid(&db).await;
    assert_ne!(second, first, "a new session listens");
    tokio::time::sleep(QUIET).await;
    for n in 101..106 {
        let latency = pickup(&db, &publisher, &mut rx, n).await;
        assert!(
            latency < PROMPT,
            "message {n} waited {latency:?} after the listener came back"
        );
    }

    b.shutdown().await;
    a.shutdown().await;
    assert!(
        db.sessions_gone().await,
        "no session of the brokers is left, the listening one neither"
    );
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_brokers_publish_wakes_the_subscriber_extended() {
    another_brokers_publish_wakes_the_subscriber("wake_ext", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_brokers_publish_wakes_the_subscriber_simple() {
    another_brokers_publish_wakes_the_subscriber("wake_simple", true).await;
}

/// Without a listener, another broker's row waits for the poll: what the tests above measure
/// is the notification's doing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_listener_another_brokers_rows_wait_for_the_poll() {
    const POLL: Duration = Duration::from_secs(3);
    let db = Db::new("wake_none").await;
    let (subscription, mut rx) = stamped(POLL);
    let a = db
        .broker(4, false)
        .without_listener()
        .start([subscription])
        .await
        .expect("the subscriber's broker starts");
    let b = db
        .broker(2, false)
        .start(Vec::new())
        .await
        .expect("the publisher's broker starts");
    // The subscriber's own publish wakes it; it then claims again, finds nothing, and polls
    // next in `POLL`, well after the quiet time `pickup` waits.
    let own = a.publisher::<Invoice>();
    let latency = pickup(&db, &own, &mut rx, 0).await;
    assert!(latency < PROMPT, "the own publish waited {latency:?}");
    // The claims that follow the own row's settlement (a look back past the floor among them)
    // are over well before the next poll, on a loaded machine too.
    tokio::time::sleep(PROMPT - QUIET).await;
    let latency = pickup(&db, &b.publisher::<Invoice>(), &mut rx, 1).await;
    assert!(
        latency > PROMPT && latency < POLL + PROMPT,
        "another broker's row waits for the poll: {latency:?}"
    );
    assert_eq!(db.count(&listeners(&db)).await, 0, "nothing listens");
    b.shutdown().await;
    a.shutdown().await;
    assert!(db.sessions_gone().await);
    db.finish().await;
}

/// A broker on the service's own pool listens only where it is told, and its close ends that
/// session while the pool stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_on_its_own_pool_listens_where_it_is_told() {
    let db = Db::new("wake_own").await;
    let pool = db.pool(4);
    let config: tokio_postgres::Config = db.url().parse().expect("the test URL parses");
    let (subscription, mut rx) = stamped(LONG_POLL);
    let a = TokioPostgresBroker::new(pool.clone())
        .listen_on(config, NoTls)
        .start([subscription])
        .await
        .expect("the subscriber's broker starts");
    let b = TokioPostgresBroker::from_url(db.url(), PoolConfig::new(2))
        .start(Vec::new())
        .await
        .expect("the publisher's broker starts");
    listener_pid(&db).await;
    tokio::time::sleep(QUIET).await;
    let latency = pickup(&db, &b.publisher::<Invoice>(), &mut rx, 0).await;
    assert!(latency < PROMPT, "another broker's row waited {latency:?}");
    b.shutdown().await;
    a.shutdown().await;
    assert_eq!(
        db.wait_count_within(&listeners(&db), 0, Duration::from_secs(2))
            .await,
        0,
        "the listening session ended with the broker"
    );
    assert!(!pool.is_closed(), "the service's own pool stays open");
    pool.close();
    assert!(db.sessions_gone().await);
    db.finish().await;
}

/// A broker on the service's own pool, told nothing, does not listen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_on_its_own_pool_does_not_listen_by_default() {
    let db = Db::new("wake_own_none").await;
    let pool = db.pool(2);
    let (subscription, _rx) = stamped(LONG_POLL);
    let a = TokioPostgresBroker::new(pool.clone())
        .start([subscription])
        .await
        .expect("the broker starts");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(db.count(&listeners(&db)).await, 0, "nothing listens");
    a.shutdown().await;
    pool.close();
    assert!(db.sessions_gone().await);
    db.finish().await;
}

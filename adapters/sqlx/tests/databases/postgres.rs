//! `SqlxBroker<Postgres>` on the PostgreSQL at `RUSTSTREAM_PG_URL`.

use std::time::Duration;

use ruststream::StartError;
use ruststream::core::CheckError;
use ruststream::core::keys::{POSTGRES_KEY_HASH_SQL, postgres_key_hash};
use ruststream_sqlx::prelude::*;
use ruststream_sqlx::sqlx;
use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;

use crate::common::*;
use crate::forms;

mod e2e_row_lock {
    crate::tables!("pg_rl");
}
mod e2e_lease {
    crate::tables!("pg_ls");
}
mod e2e_advisory {
    crate::tables!("pg_ad");
}
mod conns {
    crate::tables!("pg_conns");
}
mod held {
    crate::tables!("pg_held");
}
mod isolation {
    crate::tables!("pg_iso");
}
mod shutdown {
    crate::tables!("pg_shut");
}
mod own_pool {
    crate::tables!("pg_own");
}
mod killed {
    crate::tables!("pg_kill");
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_lock_service_end_to_end() {
    let db = Pg::new("pg_rl").await;
    db.exec(&schema(Dialect::Postgres, e2e_row_lock::PREFIX))
        .await;
    forms::end_to_end::<_, e2e_row_lock::RowLock>(&db, 4, None, false).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_service_end_to_end() {
    let db = Pg::new("pg_ls").await;
    db.exec(&schema(Dialect::Postgres, e2e_lease::PREFIX)).await;
    forms::end_to_end::<_, e2e_lease::Leased>(&db, 4, Some(Duration::from_secs(10)), false).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_service_end_to_end() {
    let db = Pg::new("pg_ad").await;
    db.exec(&schema(Dialect::Postgres, e2e_advisory::PREFIX))
        .await;
    forms::end_to_end::<_, e2e_advisory::Keyed>(&db, 3, None, true).await;
    assert_eq!(db.advisory_locks().await, 0, "no advisory lock is left");
    db.drop().await;
}

/// The row lock form holds a connection, in a transaction, per message in work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_lock_holds_one_connection_per_message_in_work() {
    use conns::RowLock;
    let db = Pg::new("pg_conns").await;
    db.exec(&schema(Dialect::Postgres, conns::PREFIX)).await;
    let (seen, gate) = (Seen::default(), Gate::shut());
    let running = db
        .broker()
        .start([subscription::<RowLock, Postgres>(
            Record::new(&seen, &gate),
            4,
            None,
        )])
        .await
        .expect("the broker starts");
    let publisher = running.publisher::<RowLock>();
    for n in 0..6 {
        publisher.publish(message(n, None)).await.expect("publish");
    }
    eventually("four handlers block", || async { seen.in_work() == 4 }).await;
    assert_eq!(
        db.sessions("AND state = 'idle in transaction'").await,
        4,
        "each message in work holds a connection of its own, in its claim's transaction"
    );
    assert!(db.sessions("").await >= 4);
    // A publish's connection is kept for the next flow for a few milliseconds, then given back.
    eventually(
        "the core holds the four connections in work alone",
        || async { running.broker().connections_held() == 4 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(seen.in_work(), 4, "no fifth message while four are in work");
    assert_eq!(running.broker().connections_held(), 4);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM pg_conns_rowlock").await, 6);

    gate.set_open(true);
    eventually("every message is handled", || async { seen.len() == 6 }).await;
    eventually("every row is settled", || async {
        db.scalar("SELECT COUNT(*) FROM pg_conns_rowlock").await == 0
    })
    .await;
    let closed = running.shutdown().await;
    assert_eq!(closed, ClosedSqlxBroker::default());
    eventually("the pool's sessions end", || async {
        db.sessions("").await == 0
    })
    .await;
    db.drop().await;
}

/// A key another session holds, through the same hash, is passed over until it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_locked_by_another_session_is_passed_over() {
    use held::Keyed;
    let db = Pg::new("pg_held").await;
    db.exec(&schema(Dialect::Postgres, held::PREFIX)).await;
    let key = format!("{}a", held::KEY_PREFIX);
    let hash = POSTGRES_KEY_HASH_SQL.replace("{key}", &format!("'{key}'"));
    assert_eq!(
        db.scalar(&format!("SELECT {hash}")).await,
        postgres_key_hash(&key),
        "the server's hash is the core's"
    );
    let mut other = PgConnection::connect_with(&db.options.clone().application_name("other"))
        .await
        .expect("another session");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT pg_advisory_lock({hash})"
    )))
    .execute(&mut other)
    .await
    .expect("the other session takes the key");

    let (seen, gate) = (Seen::default(), Gate::open());
    let running = db
        .broker()
        .start([subscription::<Keyed, Postgres>(
            Record::new(&seen, &gate),
            2,
            None,
        )])
        .await
        .expect("the broker starts");
    let publisher = running.publisher::<Keyed>();
    publisher
        .publish(message(1, Some("a")))
        .await
        .expect("publish");
    publisher
        .publish(message(2, Some("b")))
        .await
        .expect("publish");
    eventually("the free key's row is handled", || async {
        seen.contains(2)
    })
    .await;
    tokio::time::sleep(POLL * 6).await;
    assert!(!seen.contains(1), "the held key's row is passed over");

    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT pg_advisory_unlock({hash})"
    )))
    .execute(&mut other)
    .await
    .expect("the other session releases the key");
    other.close().await.ok();
    eventually("the freed key's row is handled", || async {
        seen.contains(1)
    })
    .await;
    running.shutdown().await;
    assert_eq!(db.advisory_locks().await, 0);
    db.drop().await;
}

/// A session whose default isolation is serializable fails the row lock table's check, with a
/// message naming `default_transaction_isolation`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serializable_default_isolation_fails_the_check() {
    use isolation::RowLock;
    let db = Pg::new("pg_iso").await;
    db.exec(&schema(Dialect::Postgres, isolation::PREFIX)).await;
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql("SET default_transaction_isolation = 'serializable'")
                    .execute(conn)
                    .await?;
                Ok(())
            })
        });
    let (seen, gate) = (Seen::default(), Gate::open());
    let started = db
        .broker_with(pool)
        .start([subscription::<RowLock, Postgres>(
            Record::new(&seen, &gate),
            1,
            None,
        )])
        .await;
    match started {
        Err(SqlxBrokerError::Start(StartError::Check(error @ CheckError::Isolation { .. }))) => {
            let message = error.to_string();
            assert!(
                message.contains("default_transaction_isolation")
                    && message.contains("serializable"),
                "the error names the setting and the level: {message}"
            );
        }
        Err(other) => panic!("expected the isolation check to fail, got: {other}"),
        Ok(running) => {
            running.shutdown().await;
            panic!("a serializable session passed the row lock form's check");
        }
    }
    eventually("the pool's sessions end", || async {
        db.sessions("").await == 0
    })
    .await;
    db.drop().await;
}

/// After the shutdown nothing of the broker is left on the server: no advisory lock, no
/// session; the pool it built is closed, and a publisher kept past it answers `Closed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_locks_and_closes_the_pool() {
    use shutdown::Keyed;
    let db = Pg::new("pg_shut").await;
    db.exec(&schema(Dialect::Postgres, shutdown::PREFIX)).await;
    let (seen, gate) = (Seen::default(), Gate::shut());
    // The pool the broker builds from a URL.
    let running = SqlxBroker::from_url(db.broker_url(), sqlx::pool::PoolOptions::new())
        .start([subscription::<Keyed, Postgres>(
            Record::new(&seen, &gate),
            3,
            None,
        )])
        .await
        .expect("the broker starts");
    let publisher = running.publisher::<Keyed>();
    for (n, k) in [(1, "a"), (2, "b"), (3, "c")] {
        publisher
            .publish(message(n, Some(k)))
            .await
            .expect("publish");
    }
    eventually("three handlers block", || async { seen.in_work() == 3 }).await;
    assert_eq!(db.advisory_locks().await, 3, "each delivery holds its key");
    let pool = running.broker().pool().expect("started");

    let closed = running.shutdown().await;
    assert_eq!(
        closed,
        ClosedSqlxBroker {
            locks_released: 3,
            connections_closed: 0
        }
    );
    assert_eq!(db.advisory_locks().await, 0, "no advisory lock is left");
    assert!(pool.is_closed(), "the pool the broker built is closed");
    eventually("no session of the pool is left", || async {
        db.sessions("").await == 0
    })
    .await;
    let late = publisher.publish(message(4, Some("d"))).await;
    assert!(matches!(late, Err(SqlxBrokerError::Closed)), "{late:?}");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM pg_shut_keyed").await,
        3,
        "the rows in work returned, and the late publish wrote nothing"
    );
    gate.set_open(true);
    db.drop().await;
}

/// The service's own pool stays open after the service stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_own_pool_stays_open() {
    use own_pool::Keyed;
    let db = Pg::new("pg_own").await;
    db.exec(&schema(Dialect::Postgres, own_pool::PREFIX)).await;
    let pool = PgPoolOptions::new()
        .max_connections(6)
        .connect_with(db.options.clone())
        .await
        .expect("the service's pool");
    let route = SqlxBroker::new(pool.clone()).route::<Keyed>("jobs");
    assert!(!route.handle().adapter().owns_pool());
    let publisher = route.publisher();
    let (seen, gate) = (Seen::default(), Gate::open());
    let service = RustStream::new(AppInfo::new("own-pool", "0.1.0")).with_broker(route, |b| {
        b.include(builder::<Keyed>(Record::new(&seen, &gate), 2, None));
    });
    service
        .run_until(async {
            for n in 0..4 {
                let k = (n % 2).to_string();
                publisher
                    .publish(message(n, Some(&k)))
                    .await
                    .expect("publish");
            }
            eventually("every message is handled", || async { seen.len() == 4 }).await;
        })
        .await
        .expect("the service runs");
    assert!(!pool.is_closed(), "the service's own pool stays open");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&pool)
        .await
        .expect("the pool still lends connections");
    assert_eq!(one, 1);
    assert_eq!(db.advisory_locks().await, 0, "no advisory lock is left");
    assert!(matches!(
        publisher.publish(message(9, Some("x"))).await,
        Err(SqlxBrokerError::Closed)
    ));
    pool.close().await;
    eventually("the pool's sessions end", || async {
        db.sessions("").await == 0
    })
    .await;
    db.drop().await;
}

/// A delivery's connection killed by the server: its row returns (the transaction rolls back)
/// and the broker carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_killed_mid_delivery_returns_the_row() {
    use killed::RowLock;
    let db = Pg::new("pg_kill").await;
    db.exec(&schema(Dialect::Postgres, killed::PREFIX)).await;
    let (seen, gate) = (Seen::default(), Gate::shut());
    let running = db
        .broker()
        .start([subscription::<RowLock, Postgres>(
            Record::new(&seen, &gate),
            1,
            None,
        )])
        .await
        .expect("the broker starts");
    let publisher = running.publisher::<RowLock>();
    for n in 0..3 {
        publisher.publish(message(n, None)).await.expect("publish");
    }
    eventually("a handler blocks", || async { seen.in_work() == 1 }).await;
    let pid = db
        .scalar(&format!(
            "SELECT CAST(pid AS BIGINT) FROM pg_stat_activity WHERE application_name = '{}' AND state = 'idle in transaction'",
            db.schema
        ))
        .await;
    db.exec(&format!("SELECT pg_terminate_backend({pid})"))
        .await;
    gate.set_open(true);
    eventually("every row is settled", || async {
        db.scalar("SELECT COUNT(*) FROM pg_kill_rowlock").await == 0
    })
    .await;
    let all = seen.all();
    assert_eq!(seen.counts().len(), 3, "every message handled: {all:?}");
    assert!(
        all.contains(&(0, Some(2))),
        "the killed delivery's row returned and was taken again: {all:?}"
    );
    publisher
        .publish(message(7, None))
        .await
        .expect("publish after the kill");
    eventually("the broker carries on", || async { seen.contains(7) }).await;
    running.shutdown().await;
    eventually("the pool's sessions end", || async {
        db.sessions("").await == 0
    })
    .await;
    db.drop().await;
}

/// An unreachable server fails the start with a message naming the URL, without its password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_fails_the_start_naming_the_url() {
    let broker = SqlxBroker::from_url(
        "postgres://someone:hunter2@127.0.0.1:1/nowhere",
        PgPoolOptions::new().acquire_timeout(Duration::from_secs(2)),
    );
    let started = broker.start([]).await;
    let message = match started {
        Err(error) => error.to_string(),
        Ok(_) => panic!("a broker of port 1 started"),
    };
    assert!(
        message.contains("postgres://someone:***@127.0.0.1:1/nowhere"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
}

mod floor {
    crate::tables!("pg_floor");
}

/// A message's number and the attempt it came with.
type Start = (u32, Option<i64>);

/// What the handlers of several brokers saw, in the order they started: each message's number
/// and attempt. Message `n` is keyed `n % KEYS`.
#[derive(Clone, Default)]
struct KeyOrder {
    starts: std::sync::Arc<std::sync::Mutex<Vec<Start>>>,
    /// Messages of each key in work now.
    in_work: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<u32, usize>>>,
    /// Most messages of one key ever in work at once.
    most: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

const KEYS: u32 = 6;

impl ruststream::Handle<Job, (), (), ruststream::InboxContext> for KeyOrder {
    async fn handle(
        &self,
        job: &Job,
        _outs: &(),
        ctx: &mut Context<'_, ruststream::InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let attempt = ctx.kind().info().attempt;
        let key = job.n % KEYS;
        {
            let mut in_work = self.in_work.lock().unwrap();
            let now = in_work.entry(key).or_default();
            *now += 1;
            self.most
                .fetch_max(*now, std::sync::atomic::Ordering::SeqCst);
            self.starts.lock().unwrap().push((job.n, attempt));
        }
        tokio::time::sleep(Duration::from_micros(u64::from(job.n % 3) * 700)).await;
        *self.in_work.lock().unwrap().get_mut(&key).unwrap() -= 1;
        // Every fifth message fails its first attempt: its key goes back, and the row comes
        // back before any later row of its key.
        if job.n.is_multiple_of(5) && attempt == Some(1) {
            return Err(HandlerOutcome::retry());
        }
        Ok(())
    }
}

/// Three brokers (three pools, so three sets of sessions, as three processes) share a keyed
/// table without a due column, the table whose advisory claims start past the rows taken
/// before them: every row is handled, each key's rows in id order with a retried row again
/// before the later rows of its key, and no two rows of one key in work at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_sharing_a_table_without_a_due_column_keep_each_keys_order() {
    use floor::Keyed;
    use ruststream::core::dialect::Statements;
    assert!(
        Statements::candidates_from(ruststream::core::Dialect::Postgres, Keyed::TABLE.desc(), 0)
            .is_some(),
        "the table's claims start past the rows taken before them"
    );
    const ROWS: u32 = 240;
    let db = Pg::new("pg_floor").await;
    db.exec(&schema(Dialect::Postgres, floor::PREFIX)).await;
    let order = KeyOrder::default();
    let mut brokers = Vec::new();
    for _ in 0..3 {
        let subscription = ruststream::subscriber("jobs", order.clone())
            .map_source(|_| InboxQueue::<Keyed>::new("jobs"))
            .workers(nonzero!(3))
            .poll_interval(POLL)
            .retry_policy(ruststream::RetryPolicy::immediate())
            .into_subscription();
        brokers.push(
            db.broker()
                .start([subscription])
                .await
                .expect("the broker starts"),
        );
    }
    let publisher = brokers[0].publisher::<Keyed>();
    let messages = (0..ROWS)
        .map(|n| message(n, Some(&(n % KEYS).to_string())))
        .collect::<Vec<_>>();
    publisher.publish_all(messages).await.expect("publish");
    eventually("every row is settled", || async {
        db.scalar("SELECT COUNT(*) FROM pg_floor_keyed").await == 0
    })
    .await;
    for broker in brokers {
        broker.shutdown().await;
    }
    let starts = order.starts.lock().unwrap().clone();
    for key in 0..KEYS {
        let of_key: Vec<Start> = starts
            .iter()
            .copied()
            .filter(|(n, _)| n % KEYS == key)
            .collect();
        let expected: Vec<Start> = (0..ROWS)
            .filter(|n| n % KEYS == key)
            .flat_map(|n| {
                if n.is_multiple_of(5) {
                    vec![(n, Some(1)), (n, Some(2))]
                } else {
                    vec![(n, Some(1))]
                }
            })
            .collect();
        assert_eq!(
            of_key, expected,
            "key {key}: its rows in id order, a retried row again before the next"
        );
    }
    assert_eq!(
        order.most.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one row of a key in work at a time, across the brokers"
    );
    assert_eq!(db.advisory_locks().await, 0, "no advisory lock is left");
    db.drop().await;
}

//! Services on the real PostgreSQL: each form end to end under both protocols, a connection
//! per message in the row lock form, keys held elsewhere, the shutdown's counts and what it
//! leaves on the server, a publisher kept past the shutdown, a connection the server
//! terminates mid-delivery, and the service's own pool.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use ruststream::adapter::Adapter;
use ruststream_core::keys::POSTGRES_KEY_HASH_SQL;
use ruststream_core::{Action, Command, CommandId, ConnId, ErrorKind, Reply};
use ruststream_tokio_postgres::deadpool_postgres::PoolConfig;
use ruststream_tokio_postgres::prelude::*;
use tokio::sync::Semaphore;

fn service(
    handle: &BrokerHandle<TokioPostgresBroker>,
    include: impl FnOnce(&mut ruststream::BrokerScope<TokioPostgresBroker>),
) -> RustStream {
    RustStream::new(AppInfo::new("tokio-postgres-tests", "0.1.0"))
        .shutdown_timeout(Duration::from_secs(10))
        .with_broker(handle.clone(), include)
}

/// Publishes `N` messages into `form`'s table, retries the first attempt of every third, and
/// checks what the handler saw, what the table holds after the shutdown, and that nothing of
/// the broker is left on the server.
async fn end_to_end(test: &str, form: Form, simple: bool) {
    const N: u32 = 9;
    let db = Db::new(test).await;
    let table = form.table();
    let handle = db.broker(6, simple).handle();
    let early = publish(&handle, form, message(form, 99)).await;
    assert!(
        matches!(early, Err(TokioPostgresBrokerError::Closed)),
        "a publisher answers Closed before the service starts: {early:?}"
    );

    let seen = Seen::default();
    let service = service(&handle, |b| include(b, form, Record::retrying(&seen), 2));
    let retried = (0..N).filter(|n| n.is_multiple_of(3)).count();
    let unsettled = match form {
        Form::Lease => format!("SELECT COUNT(*) FROM {table} WHERE processed_at IS NULL"),
        _ => format!("SELECT COUNT(*) FROM {table}"),
    };
    let stop = async {
        for n in 0..N {
            publish(&handle, form, message(form, n)).await.unwrap();
        }
        assert!(
            eventually(WAIT, || seen.len() >= N as usize + retried).await,
            "every message and every retry handled: {:?}",
            seen.all()
        );
        assert_eq!(db.wait_count(&unsettled, 0).await, 0, "every row settled");
    };
    service.run_until(stop).await.unwrap();

    let expected: Vec<(u32, i64)> = (0..N)
        .flat_map(|n| {
            let retry = n.is_multiple_of(3).then_some((n, 2));
            std::iter::once((n, 1)).chain(retry)
        })
        .collect();
    assert_eq!(
        seen.all(),
        expected,
        "each message once, the retried ones again at attempt 2"
    );
    match form {
        Form::Lease => {
            assert_eq!(
                db.count(&format!(
                    "SELECT COUNT(*) FROM {table} WHERE processed_at IS NOT NULL AND locked_until IS NULL"
                ))
                .await,
                i64::from(N),
                "acknowledged lease rows are marked processed, their lease cleared"
            );
            assert_eq!(
                db.count(&format!("SELECT SUM(attempt)::bigint FROM {table}"))
                    .await,
                i64::from(N) + retried as i64,
                "each take counted its attempt, and only its take"
            );
        }
        _ => assert_eq!(
            db.count(&format!("SELECT COUNT(*) FROM {table}")).await,
            0,
            "acknowledged rows are deleted"
        ),
    }
    if form == Form::Custom {
        assert_eq!(db.count("SELECT COUNT(*) FROM held_keys").await, 0);
    }

    // Nothing of the broker is left: no lock, and no session of the pool it built.
    let adapter = handle.adapter();
    assert!(adapter.is_closed());
    assert!(adapter.pool().expect("the pool it built").is_closed());
    assert_eq!(db.advisory_locks().await, 0);
    assert!(
        db.sessions_gone().await,
        "the pool the broker built is closed: no session of it is left"
    );
    let acquire = Command {
        id: CommandId(u64::MAX),
        conn: ConnId(u64::MAX),
        action: Action::Acquire,
    };
    match adapter.execute(acquire, None).await {
        Reply::Failed(error) => assert_eq!(error.kind, ErrorKind::PoolClosed, "{error}"),
        other => panic!("an acquire after the close answers {other:?}"),
    }

    // A publisher kept past the shutdown answers Closed and writes nothing.
    let before = db.count(&format!("SELECT COUNT(*) FROM {table}")).await;
    let late = publish(&handle, form, message(form, 100)).await;
    assert!(
        matches!(late, Err(TokioPostgresBrokerError::Closed)),
        "{late:?}"
    );
    assert_eq!(
        db.count(&format!("SELECT COUNT(*) FROM {table}")).await,
        before
    );
    db.finish().await;
}

macro_rules! end_to_end {
    ($($name:ident: $form:ident, $simple:expr;)+) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            end_to_end(stringify!($name), Form::$form, $simple).await;
        }
    )+};
}

end_to_end! {
    row_lock_end_to_end: RowLock, false;
    row_lock_end_to_end_simple: RowLock, true;
    lease_end_to_end: Lease, false;
    lease_end_to_end_simple: Lease, true;
    advisory_end_to_end: Advisory, false;
    advisory_end_to_end_simple: Advisory, true;
    custom_lock_end_to_end: Custom, false;
    custom_lock_end_to_end_simple: Custom, true;
}

/// Four handlers block: each holds its row's transaction on a connection of its own.
async fn row_lock_connection_per_message(test: &str, simple: bool) {
    let db = Db::new(test).await;
    let gate = Arc::new(Semaphore::new(0));
    let seen = Seen::default();
    let running = db
        .broker(8, simple)
        .start(vec![subscription(
            Form::RowLock,
            Record::gated(&seen, &gate),
            4,
        )])
        .await
        .unwrap();
    let publisher = running.publisher::<Invoice>();
    for n in 0..6 {
        publisher.publish(message(Form::RowLock, n)).await.unwrap();
    }
    assert!(eventually(WAIT, || seen.len() >= 4).await);
    assert_eq!(
        db.wait_count(&db.in_transaction_sql(), 4).await,
        4,
        "a session in a transaction per message in work"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM (SELECT id FROM invoices FOR UPDATE SKIP LOCKED) s")
            .await,
        2,
        "the four rows in work are locked"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(seen.len(), 4, "no fifth row while four are in work");
    assert_eq!(running.broker().connections_held(), 4);

    gate.add_permits(100);
    assert!(eventually(WAIT, || seen.len() >= 6).await);
    assert_eq!(db.wait_count("SELECT COUNT(*) FROM invoices", 0).await, 0);
    let closed = running.shutdown().await;
    assert_eq!(closed, ClosedTokioPostgresBroker::default());
    assert!(
        db.sessions_gone().await,
        "no session of the pool it built is left"
    );
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_lock_holds_a_connection_per_message() {
    row_lock_connection_per_message("row_lock_conns", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_lock_holds_a_connection_per_message_simple() {
    row_lock_connection_per_message("row_lock_conns_simple", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_elsewhere_is_passed_over() {
    let db = Db::new("key_held_elsewhere").await;
    let other = db.client().await;
    let held = key("held");
    let expr = POSTGRES_KEY_HASH_SQL.replace("{key}", "$1::text");
    let full_key = format!("rs-tp-videos-{held}");
    let taken: bool = other
        .query_one(
            &format!("SELECT pg_try_advisory_lock({expr})"),
            &[&full_key],
        )
        .await
        .unwrap()
        .get(0);
    assert!(taken, "another session takes the key first");

    let seen = Seen::default();
    let running = db
        .broker(6, false)
        .start(vec![subscription(Form::Advisory, Record::new(&seen), 2)])
        .await
        .unwrap();
    let publisher = running.publisher::<Video>();
    let channels = [held.clone(), key("free"), held.clone(), key("free2")];
    for (n, channel) in channels.iter().enumerate() {
        let message = Message::json(&Job { n: n as u32 })
            .unwrap()
            .column("channel", channel.clone());
        publisher.publish(message).await.unwrap();
    }
    assert!(eventually(WAIT, || seen.len() >= 2).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        seen.all(),
        vec![(1, 1), (3, 1)],
        "the rows of the held key are passed over, the others taken"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM videos").await,
        2,
        "the held key's rows wait, their attempts not spent"
    );
    assert_eq!(db.count("SELECT SUM(attempt)::bigint FROM videos").await, 0);

    let released: bool = other
        .query_one(&format!("SELECT pg_advisory_unlock({expr})"), &[&full_key])
        .await
        .unwrap()
        .get(0);
    assert!(released);
    assert!(eventually(WAIT, || seen.len() >= 4).await);
    assert_eq!(seen.all(), vec![(0, 1), (1, 1), (2, 1), (3, 1)]);
    assert_eq!(db.wait_count("SELECT COUNT(*) FROM videos", 0).await, 0);
    assert_eq!(
        running.shutdown().await,
        ClosedTokioPostgresBroker::default()
    );
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_every_advisory_lock_and_closes_its_pool() {
    let db = Db::new("shutdown_advisory").await;
    let gate = Arc::new(Semaphore::new(0));
    let seen = Seen::default();
    let running = db
        .broker(6, false)
        .start(vec![subscription(
            Form::Advisory,
            Record::gated(&seen, &gate),
            3,
        )])
        .await
        .unwrap();
    let publisher = running.publisher::<Video>();
    for n in 0..3 {
        let message = Message::json(&Job { n })
            .unwrap()
            .column("channel", key(format!("s{n}")));
        publisher.publish(message).await.unwrap();
    }
    assert!(eventually(WAIT, || seen.len() >= 3).await);
    assert_eq!(db.wait_count(&db.advisory_sql(), 3).await, 3);
    assert_eq!(
        db.count(&db.in_transaction_sql()).await,
        0,
        "no transaction stays open while the handlers run"
    );

    let closed = running.shutdown().await;
    assert_eq!(
        closed,
        ClosedTokioPostgresBroker {
            locks_released: 3,
            connections_closed: 0
        }
    );
    assert_eq!(
        db.advisory_locks().await,
        0,
        "no advisory lock of the broker is left"
    );
    assert!(
        db.sessions_gone().await,
        "no session of the pool it built is left"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM videos WHERE attempt = 1")
            .await,
        3,
        "the rows in work returned to the queue"
    );

    // The handlers finish after the shutdown: their settlements write nothing.
    gate.add_permits(100);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late = publisher
        .publish(
            Message::json(&Job { n: 9 })
                .unwrap()
                .column("channel", key("late")),
        )
        .await;
    assert!(
        matches!(late, Err(TokioPostgresBrokerError::Closed)),
        "{late:?}"
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM videos").await, 3);
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_the_connection_whose_unlock_answers_no() {
    let db = Db::new("shutdown_custom").await;
    let gate = Arc::new(Semaphore::new(0));
    let seen = Seen::default();
    // One worker: while its row is in work no claim runs, so none takes the key this test
    // drops from `held_keys` (the service's lock decides, and would let a claim take it).
    let running = db
        .broker(6, false)
        .start(vec![subscription(
            Form::Custom,
            Record::gated(&seen, &gate),
            1,
        )])
        .await
        .unwrap();
    let publisher = running.publisher::<Payout>();
    let message = Message::json(&Job { n: 0 })
        .unwrap()
        .column("account", key("a0"));
    publisher.publish(message).await.unwrap();
    assert!(eventually(WAIT, || seen.len() >= 1).await);
    assert_eq!(db.wait_count("SELECT COUNT(*) FROM held_keys", 1).await, 1);
    // Another system drops the key: the unlock then answers no, and the connection closes.
    db.execute(&format!(
        "DELETE FROM held_keys WHERE key = 'rs-tp-accounts-{}'",
        key("a0")
    ))
    .await;
    let closed = running.shutdown().await;
    assert_eq!(
        closed,
        ClosedTokioPostgresBroker {
            locks_released: 0,
            connections_closed: 1
        }
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM held_keys").await, 0);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM payouts").await,
        1,
        "the row returned"
    );
    assert!(
        db.sessions_gone().await,
        "no session of the pool it built is left"
    );
    gate.add_permits(100);
    db.finish().await;
}

/// The server terminates the connection of a delivery in work: its settlement fails, the row
/// returns and is taken again, and the broker goes on with new rows.
async fn terminated_mid_delivery(test: &str, form: Form, simple: bool) {
    let db = Db::new(test).await;
    let gate = Arc::new(Semaphore::new(0));
    let seen = Seen::default();
    let handle = db.broker(6, simple).handle();
    let running = handle
        .start(
            vec![subscription(form, Record::gated(&seen, &gate), 1)],
            ruststream::exec::current(),
        )
        .await
        .unwrap();
    publish(&handle, form, message(form, 0)).await.unwrap();
    assert!(eventually(WAIT, || seen.len() >= 1).await);
    let holder = match form {
        Form::RowLock => format!(
            "SELECT pid FROM pg_stat_activity WHERE application_name = '{}' \
             AND state = 'idle in transaction'",
            db.name
        ),
        _ => format!(
            "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = '{}'",
            db.name
        ),
    };
    let count_holders = format!("SELECT COUNT(*) FROM ({holder}) h");
    assert_eq!(db.wait_count(&count_holders, 1).await, 1);
    let pid: i32 = {
        let client = db.client().await;
        client.query_one(&holder, &[]).await.unwrap().get(0)
    };
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM (SELECT pg_terminate_backend({pid})) t"
        ))
        .await,
        1
    );
    // The handler acknowledges; the settlement finds its connection gone.
    gate.add_permits(100);
    assert!(
        eventually(WAIT, || seen.len() >= 2).await,
        "the row returned and was taken again: {:?}",
        seen.all()
    );
    publish(&handle, form, message(form, 1)).await.unwrap();
    assert!(eventually(WAIT, || seen.len() >= 3).await);
    assert_eq!(seen.all(), vec![(0, 1), (0, 2), (1, 1)]);
    assert_eq!(
        db.wait_count(&format!("SELECT COUNT(*) FROM {}", form.table()), 0)
            .await,
        0
    );
    running.shutdown().await;
    assert!(
        db.sessions_gone().await,
        "no session of the pool it built is left"
    );
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_connection_returns_its_row_advisory() {
    terminated_mid_delivery("terminated_advisory", Form::Advisory, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_connection_returns_its_row_row_lock() {
    terminated_mid_delivery("terminated_row_lock", Form::RowLock, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_connection_returns_its_row_row_lock_simple() {
    terminated_mid_delivery("terminated_row_lock_simple", Form::RowLock, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_own_pool_stays_open() {
    const N: u32 = 4;
    let db = Db::new("own_pool").await;
    let pool = db.pool(6);
    let handle = TokioPostgresBroker::new(pool.clone()).handle();
    assert!(!handle.adapter().owns_pool());
    let seen = Seen::default();
    let service = service(&handle, |b| include(b, Form::Lease, Record::new(&seen), 2));
    let stop = async {
        for n in 0..N {
            publish(&handle, Form::Lease, message(Form::Lease, n))
                .await
                .unwrap();
        }
        assert!(eventually(WAIT, || seen.len() >= N as usize).await);
    };
    service.run_until(stop).await.unwrap();
    assert!(handle.adapter().is_closed());
    assert!(!pool.is_closed(), "the service's own pool stays open");
    let client = pool.get().await.expect("the pool still lends");
    let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    let acquire = Command {
        id: CommandId(1),
        conn: ConnId(1),
        action: Action::Acquire,
    };
    match handle.adapter().execute(acquire, None).await {
        Reply::Failed(error) => assert_eq!(error.kind, ErrorKind::PoolClosed, "{error}"),
        other => panic!("the closed broker lends nothing: {other:?}"),
    }
    drop(client);
    pool.close();
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_fails_the_start_naming_the_url() {
    let broker = TokioPostgresBroker::from_url(
        "postgres://postgres:secret@127.0.0.1:1/nowhere",
        PoolConfig::new(2),
    );
    let error = broker.start(Vec::new()).await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("postgres://postgres:***@127.0.0.1:1/nowhere"),
        "{text}"
    );
    assert!(
        !text.contains("secret"),
        "the password stays hidden: {text}"
    );

    let bad = TokioPostgresBroker::from_url("postgres://[::1", PoolConfig::new(2));
    let error = bad.start(Vec::new()).await.unwrap_err().to_string();
    assert!(error.contains("does not parse"), "{error}");
}

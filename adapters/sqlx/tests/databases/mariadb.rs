//! `SqlxBroker<MySql>` on the MariaDB at `RUSTSTREAM_MYSQL_URL`.

use std::time::Duration;

use ruststream::core::keys::mysql_lock_name;
use ruststream_sqlx::prelude::*;
use ruststream_sqlx::sqlx;
use sqlx::Connection;

use crate::common::*;
use crate::forms;

mod e2e_row_lock {
    crate::tables!("my_rl");
}
mod e2e_lease {
    crate::tables!("my_ls");
}
mod e2e_advisory {
    crate::tables!("my_ad");
}
mod conns {
    crate::tables!("my_conns");
}
mod held {
    crate::tables!("my_held");
}
mod shutdown {
    crate::tables!("my_shut");
}
mod killed {
    crate::tables!("my_kill");
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_lock_service_end_to_end() {
    let db = My::new("my_rl").await;
    db.exec(&schema(Dialect::MariaDb, e2e_row_lock::PREFIX))
        .await;
    forms::end_to_end::<_, e2e_row_lock::RowLock>(&db, 4, None, false).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_service_end_to_end() {
    let db = My::new("my_ls").await;
    db.exec(&schema(Dialect::MariaDb, e2e_lease::PREFIX)).await;
    forms::end_to_end::<_, e2e_lease::Leased>(&db, 4, Some(Duration::from_secs(10)), false).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_service_end_to_end() {
    let db = My::new("my_ad").await;
    db.exec(&schema(Dialect::MariaDb, e2e_advisory::PREFIX))
        .await;
    forms::end_to_end::<_, e2e_advisory::Keyed>(&db, 3, None, true).await;
    db.drop().await;
}

/// The row lock form holds a connection, in a transaction, per message in work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_lock_holds_one_connection_per_message_in_work() {
    use conns::RowLock;
    let db = My::new("my_conns").await;
    db.exec(&schema(Dialect::MariaDb, conns::PREFIX)).await;
    let (seen, gate) = (Seen::default(), Gate::shut());
    let running = db
        .broker()
        .start([subscription::<RowLock, MySql>(
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
        db.in_transaction().await.len(),
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

    gate.set_open(true);
    eventually("every message is handled", || async { seen.len() == 6 }).await;
    eventually("every row is settled", || async {
        db.scalar("SELECT COUNT(*) FROM my_conns_rowlock").await == 0
    })
    .await;
    running.shutdown().await;
    eventually("the pool's connections end", || async {
        db.sessions("").await == 0
    })
    .await;
    db.drop().await;
}

/// A key another session holds by `GET_LOCK` of the same name is passed over until it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_locked_by_another_session_is_passed_over() {
    use held::Keyed;
    let db = My::new("my_held").await;
    db.exec(&schema(Dialect::MariaDb, held::PREFIX)).await;
    let name = mysql_lock_name(&db.database, &format!("{}a", held::KEY_PREFIX));
    let mut other = MySqlConnection::connect_with(&db.options)
        .await
        .expect("another session");
    let taken: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
        .bind(&name)
        .fetch_one(&mut other)
        .await
        .expect("GET_LOCK");
    assert_eq!(taken, Some(1), "the other session takes {name}");

    let (seen, gate) = (Seen::default(), Gate::open());
    let running = db
        .broker()
        .start([subscription::<Keyed, MySql>(
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

    let released: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
        .bind(&name)
        .fetch_one(&mut other)
        .await
        .expect("RELEASE_LOCK");
    assert_eq!(released, Some(1));
    other.close().await.ok();
    eventually("the freed key's row is handled", || async {
        seen.contains(1)
    })
    .await;
    running.shutdown().await;
    db.drop().await;
}

/// After the shutdown nothing of the broker is left on the server: no lock name in use, no
/// connection; the pool it built is closed, and a publisher kept past it answers `Closed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_locks_and_closes_the_pool() {
    use shutdown::Keyed;
    let db = My::new("my_shut").await;
    db.exec(&schema(Dialect::MariaDb, shutdown::PREFIX)).await;
    let (seen, gate) = (Seen::default(), Gate::shut());
    // The pool the broker builds from a URL.
    let running = SqlxBroker::from_url(db.broker_url(), sqlx::pool::PoolOptions::new())
        .start([subscription::<Keyed, MySql>(
            Record::new(&seen, &gate),
            3,
            None,
        )])
        .await
        .expect("the broker starts");
    let publisher = running.publisher::<Keyed>();
    let keys = ["a", "b", "c"];
    for (n, k) in keys.iter().enumerate() {
        publisher
            .publish(message(n as u32, Some(k)))
            .await
            .expect("publish");
    }
    eventually("three handlers block", || async { seen.in_work() == 3 }).await;
    let used = |k: &str| {
        let name = mysql_lock_name(&db.database, &format!("{}{k}", shutdown::KEY_PREFIX));
        format!(
            "SELECT COUNT(*) FROM (SELECT IS_USED_LOCK('{name}') AS holder) t WHERE holder IS NOT NULL"
        )
    };
    for k in keys {
        assert_eq!(db.scalar(&used(k)).await, 1, "key {k} is held in work");
    }
    let pool = running.broker().pool().expect("started");

    let closed = running.shutdown().await;
    assert_eq!(
        closed,
        ClosedSqlxBroker {
            locks_released: 3,
            connections_closed: 0
        }
    );
    for k in keys {
        assert_eq!(
            db.scalar(&used(k)).await,
            0,
            "IS_USED_LOCK of key {k} is NULL"
        );
    }
    assert!(pool.is_closed(), "the pool the broker built is closed");
    eventually("no connection of the pool is left", || async {
        db.sessions("").await == 0
    })
    .await;
    let late = publisher.publish(message(4, Some("d"))).await;
    assert!(matches!(late, Err(SqlxBrokerError::Closed)), "{late:?}");
    assert_eq!(db.scalar("SELECT COUNT(*) FROM my_shut_keyed").await, 3);
    gate.set_open(true);
    db.drop().await;
}

/// A delivery's connection killed by the server: its row returns (the transaction rolls back)
/// and the broker carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_killed_mid_delivery_returns_the_row() {
    use killed::RowLock;
    let db = My::new("my_kill").await;
    db.exec(&schema(Dialect::MariaDb, killed::PREFIX)).await;
    let (seen, gate) = (Seen::default(), Gate::shut());
    let running = db
        .broker()
        .start([subscription::<RowLock, MySql>(
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
    let holders = db.in_transaction().await;
    assert_eq!(holders.len(), 1, "the delivery's connection: {holders:?}");
    db.exec(&format!("KILL CONNECTION {}", holders[0])).await;
    gate.set_open(true);
    eventually("every row is settled", || async {
        db.scalar("SELECT COUNT(*) FROM my_kill_rowlock").await == 0
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
    eventually("the pool's connections end", || async {
        db.sessions("").await == 0
    })
    .await;
    db.drop().await;
}

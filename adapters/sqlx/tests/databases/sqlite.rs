//! `SqlxBroker<Sqlite>` on SQLite files of the tests' own: the lease and advisory lock forms,
//! the service's own lock, and the shutdown.

use std::time::Duration;

use ruststream_sqlx::prelude::*;
use ruststream_sqlx::{Lock, Unlock, sqlx};
use sqlx::sqlite::SqlitePoolOptions;

use crate::common::*;
use crate::forms;

mod e2e_lease {
    crate::tables!("lite_ls");
}
mod e2e_advisory {
    crate::tables!("lite_ad");
}
mod shutdown {
    crate::tables!("lite_shut");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_service_end_to_end() {
    let db = Lite::new("lite_ls").await;
    db.exec(&schema(Dialect::Sqlite, e2e_lease::PREFIX)).await;
    forms::end_to_end::<_, e2e_lease::Leased>(&db, 4, Some(Duration::from_secs(10)), false).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_service_end_to_end() {
    let db = Lite::new("lite_ad").await;
    db.exec(&schema(Dialect::Sqlite, e2e_advisory::PREFIX))
        .await;
    forms::end_to_end::<_, e2e_advisory::Keyed>(&db, 3, None, true).await;
    db.drop().await;
}

/// A payout held by the key of its account, in `held_keys` (a custom lock).
#[derive(Debug, sqlx::FromRow)]
struct Payout {
    id: i64,
    attempt: i32,
    payload: Vec<u8>,
}

impl InboxTable for Payout {
    type Id = i64;
    type Table = InboxSpec<(Advisory, Attempt, Payload, own::Lock, own::Unlock)>;
    const TABLE: Self::Table = InboxSpec::new("lite_own_keyed", Column::new("id").generated())
        .advisory(&[KeyPart::Literal("accounts-"), KeyPart::Column("k")])
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .own::<own::Lock>()
        .own::<own::Unlock>();

    fn id(&self) -> &i64 {
        &self.id
    }
}

crate::payload_rows!(Payout);

impl Lock<Sqlite> for Payout {
    async fn lock(conn: &mut SqliteConnection, key: &str) -> Result<bool, sqlx::Error> {
        let taken = sqlx::query("INSERT OR IGNORE INTO held_keys (key) VALUES (?)")
            .bind(key)
            .execute(conn)
            .await?;
        Ok(taken.rows_affected() == 1)
    }
}

impl Unlock<Sqlite> for Payout {
    async fn unlock(conn: &mut SqliteConnection, key: &str) -> Result<bool, sqlx::Error> {
        let released = sqlx::query("DELETE FROM held_keys WHERE key = ?")
            .bind(key)
            .execute(conn)
            .await?;
        Ok(released.rows_affected() == 1)
    }
}

/// The service's own lock decides: a payout whose account billing holds waits until billing
/// releases the key; the broker's keys are gone from `held_keys` once the payouts settle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_own_lock_decides() {
    let db = Lite::new("lite_own").await;
    db.exec(&schema(Dialect::Sqlite, "lite_own")).await;
    db.exec("CREATE TABLE held_keys (key TEXT PRIMARY KEY)")
        .await;
    db.exec("INSERT INTO held_keys (key) VALUES ('accounts-a')")
        .await;
    let (seen, gate) = (Seen::default(), Gate::open());
    let running = db
        .broker()
        .start([subscription::<Payout, Sqlite>(
            Record::new(&seen, &gate),
            2,
            None,
        )])
        .await
        .expect("the broker starts");
    let publisher = running.publisher::<Payout>();
    publisher
        .publish(message(1, Some("a")))
        .await
        .expect("publish");
    publisher
        .publish(message(2, Some("b")))
        .await
        .expect("publish");
    tokio::time::sleep(POLL * 6).await;
    assert!(
        !seen.contains(1),
        "billing holds account a: its payout waits"
    );

    db.exec("DELETE FROM held_keys WHERE key = 'accounts-a'")
        .await;
    eventually("both payouts are handled", || async {
        seen.contains(1) && seen.contains(2)
    })
    .await;
    eventually("the payouts are settled", || async {
        db.scalar("SELECT COUNT(*) FROM lite_own_keyed").await == 0
    })
    .await;
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM held_keys").await,
        0,
        "the broker released its keys"
    );
    running.shutdown().await;
    db.drop().await;
}

/// The shutdown releases the keys in work and closes the pool the broker built (`from_url`);
/// a publisher kept past it answers `Closed` and writes no row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_the_pool_it_built() {
    use shutdown::Keyed;
    let db = Lite::new("lite_shut").await;
    db.exec(&schema(Dialect::Sqlite, shutdown::PREFIX)).await;
    let (seen, gate) = (Seen::default(), Gate::shut());
    let broker = SqlxBroker::from_url(db.url(), SqlitePoolOptions::new().max_connections(4));
    assert!(broker.owns_pool());
    let running = broker
        .start([subscription::<Keyed, Sqlite>(
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
    eventually("a handler blocks", || async { seen.in_work() == 1 }).await;
    let pool = running.broker().pool().expect("started");

    let closed = running.shutdown().await;
    assert_eq!(
        closed,
        ClosedSqlxBroker {
            locks_released: 1,
            connections_closed: 0
        },
        "the key in work, which the process keeps on SQLite, is released"
    );
    assert!(pool.is_closed(), "the pool the broker built is closed");
    let late = publisher.publish(message(2, Some("b"))).await;
    assert!(matches!(late, Err(SqlxBrokerError::Closed)), "{late:?}");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM lite_shut_keyed").await,
        1,
        "the row in work returned, and the late publish wrote nothing"
    );
    gate.set_open(true);
    db.drop().await;
}

//! Deduplicated publishing on every database: a table whose description names a unique
//! column passes over a publish of a row already there, through the broker's publisher and
//! through the outbox in the service's own transaction, and says which rows it skipped.

use ruststream::{Inbox, Message, Published};
use ruststream_sqlx::{SqlxOutbox, sqlx};

use crate::common::*;

/// A receipt's job, one per order: `order_id` holds a unique index.
#[derive(Inbox)]
#[inbox(table = "receipts", locked_until = "locked_until", unique = "order_id")]
pub struct Receipt {
    #[field(id, generated)]
    id: i64,
    order_id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

fn receipt(order: i64) -> Message {
    Message::json(&Job { n: order as u32 })
        .expect("a job encodes")
        .column("order_id", order)
}

fn schema(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => {
            "CREATE TABLE receipts (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL,
                 locked_until TIMESTAMPTZ, payload BYTEA NOT NULL);
             CREATE UNIQUE INDEX receipts_order ON receipts (order_id);"
        }
        Dialect::MariaDb => {
            "CREATE TABLE receipts (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id BIGINT NOT NULL,
                 locked_until DATETIME(6) NULL, payload LONGBLOB NOT NULL,
                 UNIQUE KEY receipts_order (order_id));"
        }
        Dialect::Sqlite => {
            "CREATE TABLE receipts (id INTEGER PRIMARY KEY AUTOINCREMENT, order_id INTEGER NOT NULL,
                 locked_until INTEGER, payload BLOB NOT NULL);
             CREATE UNIQUE INDEX receipts_order ON receipts (order_id);"
        }
    }
}

/// Publishes orders 1, 2, 1, then 2, 3, then in a transaction 3, 4 that commits and 5 that
/// rolls back; every order is written once, and each publish names the rows it skipped.
pub async fn publishes_are_deduplicated<D: TestDb>(db: &D)
where
    for<'c> &'c mut <D::DB as sqlx::Database>::Connection: sqlx::Executor<'c, Database = D::DB>,
{
    db.exec(schema(db.dialect())).await;
    let running = db
        .broker()
        .start(Vec::new())
        .await
        .expect("the broker starts");
    let publisher = running.publisher::<Receipt>();
    let first = publisher
        .publish_all([receipt(1), receipt(2), receipt(1)])
        .await
        .expect("the first batch");
    assert_eq!(first.skipped, [2], "the second order 1 of the batch");
    let again = publisher
        .publish_all([receipt(2), receipt(3)])
        .await
        .expect("the second batch");
    assert_eq!(again.skipped, [0], "order 2 is there already");
    let single = publisher.publish(receipt(3)).await.expect("a single one");
    assert!(!single.wrote_all(), "order 3 is there already");

    let pool = running.broker().pool().expect("the broker's pool");
    let outbox = SqlxOutbox::<Receipt, D::DB>::new();
    let mut tx = pool.begin().await.expect("a transaction");
    let in_tx = outbox
        .publish_all(&mut tx, [receipt(3), receipt(4)])
        .await
        .expect("in the transaction");
    assert_eq!(in_tx.skipped, [0]);
    tx.commit().await.expect("commit");
    let mut tx = pool.begin().await.expect("a transaction");
    let rolled_back: Published = outbox
        .publish(&mut tx, receipt(5))
        .await
        .expect("in the transaction");
    assert!(rolled_back.wrote_all());
    tx.rollback().await.expect("roll back");

    assert_eq!(db.scalar("SELECT COUNT(*) FROM receipts").await, 4);
    assert_eq!(
        db.scalar("SELECT COUNT(DISTINCT order_id) FROM receipts")
            .await,
        4,
        "orders 1 to 4, once each"
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM receipts WHERE order_id = 5")
            .await,
        0
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let db = Pg::new("pg_dedup").await;
    publishes_are_deduplicated(&db).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb() {
    let db = My::new("my_dedup").await;
    publishes_are_deduplicated(&db).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let db = Lite::new("lite_dedup").await;
    publishes_are_deduplicated(&db).await;
    db.drop().await;
}

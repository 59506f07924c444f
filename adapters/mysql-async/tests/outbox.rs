//! The outbox on mysql_async: rows published in the service's transaction commit and roll
//! back with it, and a table that deduplicates its publishes passes over a row already there
//! and says so (`INSERT IGNORE`), inside the transaction as on a pool with no broker.

mod common;

use common::*;
use ruststream_mysql_async::MySqlAsyncOutbox;
use ruststream_mysql_async::prelude::*;

/// A receipt's job, one per order: `order_id` holds a unique index.
#[derive(Inbox)]
#[inbox(table = "receipts", locked_until = "locked_until", unique = "order_id")]
struct Receipt {
    #[field(id, generated)]
    id: i64,
    order_id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

fn receipt(order: i64) -> Message {
    Message::json(&order).unwrap().column("order_id", order)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_deduplicates_in_the_transaction_and_on_a_pool() {
    let db = TestDb::new(
        "outbox_dedup",
        &[
            "CREATE TABLE receipts (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id BIGINT NOT NULL,
             locked_until DATETIME(6) NULL, payload LONGBLOB NOT NULL,
             UNIQUE KEY receipts_order (order_id))",
        ],
    )
    .await;
    let outbox = MySqlAsyncOutbox::<Receipt>::new();
    let mut conn = db.conn().await;
    let mut tx = conn
        .start_transaction(mysql_async::TxOpts::default())
        .await
        .unwrap();
    let published = outbox
        .publish_all(&mut tx, [receipt(1), receipt(2), receipt(1)])
        .await
        .unwrap();
    assert_eq!(published.skipped, [2], "the second order 1");
    tx.commit().await.unwrap();
    let mut tx = conn
        .start_transaction(mysql_async::TxOpts::default())
        .await
        .unwrap();
    let published = outbox.publish(&mut tx, receipt(3)).await.unwrap();
    assert!(published.wrote_all());
    tx.rollback().await.unwrap();
    drop(conn);
    let pool = Pool::new(db.opts());
    let published = outbox
        .publish_on(&pool, [receipt(2), receipt(4)])
        .await
        .unwrap();
    assert_eq!(published.skipped, [0], "order 2 is there already");
    // The counts, through the same pool with no broker: two rows due, one leased.
    db.exec(
        "UPDATE receipts SET locked_until = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE order_id = 4",
    )
    .await;
    let stats = outbox.stats(&pool).await.unwrap();
    assert_eq!(stats.table, "receipts");
    assert_eq!(
        (
            stats.due.value(),
            stats.in_work.map(|c| c.value()),
            stats.failed
        ),
        (2, Some(1), None)
    );
    pool.disconnect().await.unwrap();
    assert_eq!(db.count("SELECT COUNT(*) FROM receipts").await, 3);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM receipts WHERE order_id = 3")
            .await,
        0,
        "rolled back"
    );
    db.cleanup().await;
}

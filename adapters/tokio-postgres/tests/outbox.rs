//! The outbox on tokio-postgres: rows published in the service's transaction commit and roll
//! back with it, and a table that deduplicates its publishes passes over a row already there
//! and says so, inside the transaction as on a pool with no broker; the table's counts read
//! through that pool.

mod common;

use common::*;
use ruststream_tokio_postgres::TokioPostgresOutbox;
use ruststream_tokio_postgres::deadpool_postgres::{Manager, Pool};
use ruststream_tokio_postgres::prelude::*;
use ruststream_tokio_postgres::tokio_postgres::NoTls;

/// A receipt's job, one per order: `order_id` holds a unique index.
#[derive(Inbox, serde::Deserialize)]
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
    let db = Db::new("outbox_dedup").await;
    db.execute(
        "CREATE TABLE receipts (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL,
             locked_until TIMESTAMPTZ, payload BYTEA NOT NULL);
         CREATE UNIQUE INDEX receipts_order ON receipts (order_id);",
    )
    .await;
    let outbox = TokioPostgresOutbox::<Receipt>::new();
    let mut client = connect_to(&db.url()).await;
    let tx = client.transaction().await.unwrap();
    let published = outbox
        .publish_all(&tx, [receipt(1), receipt(2), receipt(1)])
        .await
        .unwrap();
    assert_eq!(published.skipped, [2], "the second order 1");
    tx.commit().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let published = outbox.publish(&tx, receipt(3)).await.unwrap();
    assert!(published.wrote_all());
    tx.rollback().await.unwrap();
    let manager = Manager::new(db.url().parse().unwrap(), NoTls);
    let pool = Pool::builder(manager).max_size(2).build().unwrap();
    let published = outbox
        .publish_on(&pool, [receipt(2), receipt(4)])
        .await
        .unwrap();
    assert_eq!(published.skipped, [0], "order 2 is there already");
    // The counts, through the same pool with no broker: two rows due, one leased.
    db.execute("UPDATE receipts SET locked_until = now() + interval '1 hour' WHERE order_id = 4")
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
    pool.close();
    assert_eq!(db.count("SELECT COUNT(*) FROM receipts").await, 3);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM receipts WHERE order_id = 3")
            .await,
        0,
        "rolled back"
    );
    db.finish().await;
}

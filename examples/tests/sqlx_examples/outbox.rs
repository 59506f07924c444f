//! The outbox example: every order that commits gets its receipt once, an order the database
//! refuses gets none, and the receipts go out as their orders commit although the service
//! polls once a minute.

use std::time::{Duration, Instant};

use crate::common::*;
use crate::outbox_example;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_committed_order_gets_its_receipt_once_and_a_refused_one_none() {
    let _serial = serial().await;
    let db = PgSchema::new("outbox").await;
    let started = Instant::now();
    let sent = outbox_example::run(db.options.clone(), 20)
        .await
        .expect("the example runs");
    let took = started.elapsed();
    let mut orders: Vec<i64> = sent.iter().map(|r| r.order).collect();
    orders.sort_unstable();
    let committed: Vec<i64> = (1..=20).filter(|id| id % 5 != 0).collect();
    assert_eq!(orders, committed, "one receipt per committed order");
    assert!(
        sent.iter()
            .all(|r| r.email == format!("customer{}@example.com", r.order)),
        "each receipt carries its order's address"
    );
    assert_eq!(db.scalar("SELECT COUNT(*) FROM orders").await, 16);
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM receipt_jobs").await,
        0,
        "every job settled, none written for a refused order"
    );
    assert!(
        took < Duration::from_secs(30),
        "the receipts went out as their orders committed, not at the minute's poll: {took:?}"
    );
    db.drop().await;
}

//! The rusqlite outbox example: every order that commits gets its receipt once, and an order
//! the database refuses gets none.

#[path = "../rusqlite_outbox.rs"]
#[allow(dead_code)]
mod outbox;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_committed_order_gets_its_receipt_once_and_a_refused_one_none() {
    let dir = std::env::temp_dir().join(format!("ruststream-outbox-{}", std::process::id()));
    let path = dir.join("shop.db");
    let sent = outbox::run(&path, 20).await.expect("the example runs");
    let mut orders: Vec<i64> = sent.iter().map(|r| r.order).collect();
    orders.sort_unstable();
    let committed: Vec<i64> = (1..=20).filter(|id| id % 5 != 0).collect();
    assert_eq!(orders, committed, "one receipt per committed order");
    let conn = ruststream_rusqlite::rusqlite::Connection::open(&path).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(count("SELECT COUNT(*) FROM orders"), 16);
    assert_eq!(
        count("SELECT COUNT(*) FROM receipt_jobs"),
        0,
        "every job settled, none written for a refused order"
    );
    drop(conn);
    let _ = std::fs::remove_dir_all(dir);
}

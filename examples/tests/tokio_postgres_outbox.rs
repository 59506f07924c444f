//! The tokio-postgres outbox example: every order that commits gets its receipt once, an order
//! the database refuses gets none, and the receipts go out as their orders commit although the
//! service polls once a minute. PostgreSQL is at `RUSTSTREAM_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); the example runs in a schema of its own.

#[path = "../tokio_postgres_outbox.rs"]
#[allow(dead_code)]
mod outbox;

use std::time::{Duration, Instant};

use ruststream_tokio_postgres::tokio_postgres::{self, NoTls};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_committed_order_gets_its_receipt_once_and_a_refused_one_none() {
    let base = std::env::var("RUSTSTREAM_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let (admin, connection) = tokio_postgres::connect(&base, NoTls)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {base}: {e}"));
    tokio::spawn(connection);
    let schema = format!("rs_example_tp_outbox_{}", std::process::id());
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .await
        .expect("the example's schema");
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
    let started = Instant::now();
    let sent = outbox::run(&url, 20).await.expect("the example runs");
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
    let count = |table: &str| format!("SELECT COUNT(*) FROM {schema}.{table}");
    let orders: i64 = admin.query_one(&count("orders"), &[]).await.unwrap().get(0);
    let jobs: i64 = admin
        .query_one(&count("receipt_jobs"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(orders, 16, "the committed orders");
    assert_eq!(
        jobs, 0,
        "every job settled, none written for a refused order"
    );
    assert!(
        took < Duration::from_secs(30),
        "the receipts went out as their orders committed, not at the minute's poll: {took:?}"
    );
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("the schema drops");
}

//! The mysql_async outbox example: every order that commits gets its receipt once, and an
//! order the database refuses gets none. MariaDB (or MySQL) is at `RUSTSTREAM_MYSQL_URL`
//! (default `mysql://root@127.0.0.1:3306/test`); the example runs in a database of its own.

#[path = "../mysql_async_outbox.rs"]
#[allow(dead_code)]
mod outbox;

use ruststream_mysql_async::mysql_async::prelude::Queryable;
use ruststream_mysql_async::mysql_async::{Conn, Opts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_committed_order_gets_its_receipt_once_and_a_refused_one_none() {
    let base = std::env::var("RUSTSTREAM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let mut admin = Conn::new(Opts::from_url(&base).expect("the URL parses"))
        .await
        .unwrap_or_else(|e| panic!("MySQL at {base}: {e}"));
    let database = format!("rs_example_my_outbox_{}", std::process::id());
    admin
        .query_drop(format!(
            "DROP DATABASE IF EXISTS {database}; CREATE DATABASE {database}"
        ))
        .await
        .expect("the example's database");
    let url = match base.rfind('/') {
        Some(at) if at > "mysql://".len() => {
            let (server, rest) = base.split_at(at);
            let query = rest.find('?').map_or("", |q| &rest[q..]);
            format!("{server}/{database}{query}")
        }
        _ => format!("{base}/{database}"),
    };
    let sent = outbox::run(&url, 20).await.expect("the example runs");
    let mut orders: Vec<i64> = sent.iter().map(|r| r.order).collect();
    orders.sort_unstable();
    let committed: Vec<i64> = (1..=20).filter(|id| id % 5 != 0).collect();
    assert_eq!(orders, committed, "one receipt per committed order");
    let count = |table: &str| format!("SELECT COUNT(*) FROM {database}.{table}");
    let orders: Option<i64> = admin.query_first(count("orders")).await.unwrap();
    let jobs: Option<i64> = admin.query_first(count("receipt_jobs")).await.unwrap();
    assert_eq!(orders, Some(16), "the committed orders");
    assert_eq!(
        jobs,
        Some(0),
        "every job settled, none written for a refused order"
    );
    admin
        .query_drop(format!("DROP DATABASE {database}"))
        .await
        .expect("the database drops");
}

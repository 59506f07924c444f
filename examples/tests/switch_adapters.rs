//! One service written for two adapters: the files differ only in the prelude, the row's derive
//! and the broker line, and both run the same orders on SQLite.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ruststream_rusqlite::rusqlite::Connection;

#[path = "../switch/on_rusqlite.rs"]
#[allow(dead_code)]
mod on_rusqlite;
#[path = "../switch/on_sqlx.rs"]
#[allow(dead_code)]
mod on_sqlx;

const SCHEMA: &str = "
DROP TABLE IF EXISTS orders;
CREATE TABLE orders (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    customer INTEGER NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    payload BLOB NOT NULL,
    failed_at INTEGER,
    error TEXT
);";

fn orders(path: &Path, n: i64) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(SCHEMA).unwrap();
    for number in 0..n {
        conn.execute(
            "INSERT INTO orders (customer, payload) VALUES (?1, ?2)",
            (number % 3, format!("{{\"number\":{number}}}").into_bytes()),
        )
        .unwrap();
    }
}

fn left(path: &Path) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM orders", [], |r| r.get(0))
        .unwrap()
}

async fn until_shipped(shipped: &AtomicUsize, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while shipped.load(Ordering::SeqCst) < n {
        assert!(
            Instant::now() < deadline,
            "the orders were never all shipped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ruststream-switch-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_ships_every_order_on_rusqlite() {
    let dir = dir("rusqlite");
    let path = dir.join("orders.db");
    orders(&path, 12);
    let shipped = Arc::new(AtomicUsize::new(0));
    on_rusqlite::service(&path, shipped.clone())
        .run_until(until_shipped(&shipped, 12))
        .await
        .unwrap();
    assert_eq!(left(&path), 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_service_ships_every_order_on_sqlx() {
    let dir = dir("sqlx");
    let path = dir.join("orders.db");
    orders(&path, 12);
    let shipped = Arc::new(AtomicUsize::new(0));
    on_sqlx::service(&path, shipped.clone())
        .run_until(until_shipped(&shipped, 12))
        .await
        .unwrap();
    assert_eq!(left(&path), 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_two_files_differ_in_the_prelude_the_derive_and_the_broker_line_only() {
    let a = include_str!("../switch/on_rusqlite.rs");
    let b = include_str!("../switch/on_sqlx.rs");
    // The module docs name the file and its twin; the code below them is compared statement
    // by statement, whitespace aside (rustfmt may wrap a longer line).
    let code = |s: &'static str| -> Vec<String> {
        let body: String = s
            .lines()
            .skip_while(|l| l.starts_with("//!") || l.is_empty())
            .flat_map(|l| l.chars().chain(['\n']))
            .filter(|c| !c.is_whitespace())
            .collect();
        body.split(';').map(str::to_owned).collect()
    };
    let (a, b) = (code(a), code(b));
    assert_eq!(a.len(), b.len(), "the same statements");
    let differ: Vec<(&String, &String)> = a.iter().zip(&b).filter(|(x, y)| x != y).collect();
    assert_eq!(differ.len(), 3, "{differ:#?}");
    assert!(
        differ[0].0.contains("ruststream_rusqlite::prelude")
            && differ[0].1.contains("ruststream_sqlx::prelude")
    );
    assert!(
        differ[1].0.contains("derive(Inbox,Deserialize)]")
            && differ[1].1.contains("derive(Inbox,sqlx::FromRow)]")
    );
    assert!(
        differ[2].0.contains("RusqliteBroker::open")
            && differ[2].1.contains("SqlxBroker::from_url")
    );
}

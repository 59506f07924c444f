//! A table tied to its message (`#[inbox(message = ..)]`): publishers and the outbox take the
//! message itself, the key's column is filled from its field, and a subscriber decodes it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream_rusqlite::RusqliteOutbox;
use ruststream_rusqlite::prelude::*;
use ruststream_rusqlite::rusqlite::Connection;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Report {
    account: i64,
    month: String,
}

/// Keyed by the report's account.
#[derive(Inbox, Deserialize)]
#[inbox(table = "reports", advisory_lock = "reports-{account}", message = Report)]
struct ReportJob {
    #[field(id, generated)]
    id: i64,
    account: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Report>>>);

impl Handle<Report> for Seen {
    async fn handle(
        &self,
        report: &Report,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        self.0.lock().unwrap().push(report.clone());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_messages_fill_the_keys_column_and_decode() {
    let dir = std::env::temp_dir().join(format!("ruststream-typed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("typed.db");
    let _ = std::fs::remove_file(&path);
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE reports (id INTEGER PRIMARY KEY AUTOINCREMENT, account INTEGER NOT NULL,
             payload BLOB NOT NULL);",
    )
    .unwrap();
    let november = Report {
        account: 7,
        month: "2026-11".into(),
    };
    // Through the outbox, in the service's own transaction, before any broker runs.
    RusqliteOutbox::<ReportJob>::new()
        .publish(&conn, &november)
        .unwrap();
    let account: i64 = conn
        .query_row("SELECT account FROM reports", [], |r| r.get(0))
        .unwrap();
    assert_eq!(account, 7, "the key's column is the message's field");
    let stats = RusqliteOutbox::<ReportJob>::new().stats(&conn).unwrap();
    assert_eq!(
        (stats.table, stats.due.value()),
        ("reports", 1),
        "counted on the connection"
    );

    let seen = Seen::default();
    let broker = RusqliteBroker::open(&path).handle();
    let publisher = broker.publisher::<ReportJob>();
    let subscription = ruststream::subscriber("reports", seen.clone())
        .map_source(|_| InboxQueue::<ReportJob>::new("reports"))
        .poll_interval(Duration::from_millis(50));
    let december = Report {
        account: 8,
        month: "2026-12".into(),
    };
    RustStream::new(AppInfo::new("reports", "0.1.0"))
        .with_broker(broker, |b| {
            b.include(subscription.build());
        })
        .run_until(async {
            publisher.publish(&december).await.unwrap();
            let since = Instant::now();
            while seen.0.lock().unwrap().len() < 2 {
                assert!(since.elapsed() < Duration::from_secs(20), "both handled");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap();
    let mut reports = seen.0.lock().unwrap().clone();
    reports.sort_by_key(|r| r.account);
    assert_eq!(reports, [november, december]);
    let _ = std::fs::remove_dir_all(dir);
}

#[derive(Serialize, Deserialize)]
struct Order {
    order_id: i64,
}

/// One receipt per order: `order_id` holds a unique index, read from the message.
#[derive(Inbox, Deserialize)]
#[inbox(table = "receipts", locked_until = "locked_until", unique = "order_id", message = Order)]
struct Receipt {
    #[field(id, generated)]
    id: i64,
    order_id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// A table that deduplicates its publishes: the message's field fills the unique column,
/// and a row already there is passed over and named, through the broker's publisher and
/// through the outbox in a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deduplicated_publishes_name_the_rows_they_skipped() {
    let dir = std::env::temp_dir().join(format!("ruststream-dedup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("dedup.db");
    let _ = std::fs::remove_file(&path);
    let mut conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE receipts (id INTEGER PRIMARY KEY AUTOINCREMENT, order_id INTEGER NOT NULL,
             locked_until INTEGER, payload BLOB NOT NULL);
         CREATE UNIQUE INDEX receipts_order ON receipts (order_id);",
    )
    .unwrap();
    let tx = conn.transaction().unwrap();
    let published = RusqliteOutbox::<Receipt>::new()
        .publish_all(
            &tx,
            [
                &Order { order_id: 1 },
                &Order { order_id: 2 },
                &Order { order_id: 1 },
            ],
        )
        .unwrap();
    assert_eq!(published.skipped, [2]);
    tx.commit().unwrap();

    let broker = RusqliteBroker::open(&path).handle();
    let publisher = broker.publisher::<Receipt>();
    let running = broker
        .start(Vec::new(), ruststream::exec::current())
        .await
        .unwrap();
    let published = publisher
        .publish_all([&Order { order_id: 2 }, &Order { order_id: 3 }])
        .await
        .unwrap();
    assert_eq!(published.skipped, [0], "order 2 is there already");
    running.shutdown().await;
    let count: i64 = conn
        .query_row("SELECT COUNT(*) FROM receipts", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, 3, "orders 1, 2 and 3, once each");
    drop(conn);
    let _ = std::fs::remove_dir_all(dir);
}

/// The table written from the description holds the unique column and its constraint: the
/// second publish of an order is passed over.
#[test]
fn a_deduplicated_table_written_from_its_description_passes_over_a_repeat() {
    let conn = Connection::open_in_memory().unwrap();
    for sql in Receipt::TABLE
        .ddl(ruststream::core::Dialect::Sqlite)
        .statements()
    {
        conn.execute_batch(&sql).unwrap();
    }
    let published = RusqliteOutbox::<Receipt>::new()
        .publish_all(&conn, [&Order { order_id: 7 }, &Order { order_id: 7 }])
        .unwrap();
    assert_eq!(published.skipped, [1]);
    let orders: i64 = conn
        .query_row("SELECT COUNT(DISTINCT order_id) FROM receipts", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(orders, 1);
}

//! Handlers reach values by type: a `#[subscriber]` function extracts `State<T>`, given by the
//! service to every subscription or by one subscription to its own, the subscription's first;
//! a handler that asks for a type nobody gave fails its row, kept with an error naming the
//! type.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ruststream_rusqlite::prelude::*;
use ruststream_rusqlite::rusqlite::Connection;
use serde::{Deserialize, Serialize};

/// A row of `greetings`, in the lease form, failed rows kept.
#[derive(Inbox, Deserialize)]
#[inbox(table = "greetings", failed_at = "failed_at", error = "error")]
struct Greeting {
    #[field(id, generated)]
    id: i64,
    #[field(locked_until)]
    locked_until: Option<i64>,
    #[field(payload)]
    payload: Vec<u8>,
}

/// A row of `farewells`, the same shape.
#[derive(Inbox, Deserialize)]
#[inbox(table = "farewells", failed_at = "failed_at", error = "error")]
struct Farewell {
    #[field(id, generated)]
    id: i64,
    #[field(locked_until)]
    locked_until: Option<i64>,
    #[field(payload)]
    payload: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct Name {
    name: String,
}

/// What the service gives every handler.
#[derive(Clone)]
struct Greeter {
    greeted: Arc<AtomicUsize>,
    salutation: &'static str,
}

/// What no one gives.
#[derive(Clone)]
struct Missing;

#[subscriber(InboxQueue::<Greeting>::new("greetings"))]
async fn greet(name: &Name, State(greeter): State<Greeter>) -> HandlerOutcome {
    assert_eq!(greeter.salutation, "hello", "the service's greeter");
    let _ = &name.name;
    greeter.greeted.fetch_add(1, Ordering::SeqCst);
    HandlerOutcome::ack()
}

#[subscriber(InboxQueue::<Farewell>::new("farewells"))]
async fn part(name: &Name, State(greeter): State<Greeter>) -> HandlerOutcome {
    assert_eq!(
        greeter.salutation, "goodbye",
        "the subscription's own greeter"
    );
    let _ = &name.name;
    greeter.greeted.fetch_add(1, Ordering::SeqCst);
    HandlerOutcome::ack()
}

#[subscriber(InboxQueue::<Farewell>::new("farewells"))]
async fn needs_what_no_one_gives(_name: &Name, State(_m): State<Missing>) -> HandlerOutcome {
    HandlerOutcome::ack()
}

fn schema(path: &std::path::Path) {
    Connection::open(path)
        .unwrap()
        .execute_batch(
            "CREATE TABLE greetings (id INTEGER PRIMARY KEY AUTOINCREMENT, locked_until INTEGER,
                 payload BLOB NOT NULL, failed_at INTEGER, error TEXT);
             CREATE TABLE farewells (id INTEGER PRIMARY KEY AUTOINCREMENT, locked_until INTEGER,
                 payload BLOB NOT NULL, failed_at INTEGER, error TEXT);",
        )
        .unwrap();
}

fn count(path: &std::path::Path, sql: &str) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

async fn until(what: &str, check: impl Fn() -> bool) {
    let since = Instant::now();
    while !check() {
        assert!(since.elapsed() < Duration::from_secs(20), "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_extract_the_services_state_and_their_subscriptions_own_first() {
    let dir = std::env::temp_dir().join(format!("ruststream-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.db");
    let _ = std::fs::remove_file(&path);
    schema(&path);
    let (greeted, parted) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let broker = RusqliteBroker::open(&path).handle();
    let greetings = broker.publisher::<Greeting>();
    let farewells = broker.publisher::<Farewell>();
    let service = RustStream::new(AppInfo::new("greeter", "0.1.0"))
        .with_state(Greeter {
            greeted: greeted.clone(),
            salutation: "hello",
        })
        .with_broker(broker, |b| {
            b.include(greet.poll_interval(Duration::from_millis(50)));
            b.include(
                part.poll_interval(Duration::from_millis(50))
                    .state(Greeter {
                        greeted: parted.clone(),
                        salutation: "goodbye",
                    }),
            );
        });
    service
        .run_until(async {
            for name in ["ada", "grace", "edsger"] {
                let message = Message::json(&Name { name: name.into() }).unwrap();
                greetings.publish(message.clone()).await.unwrap();
                farewells.publish(message).await.unwrap();
            }
            until("every name is greeted and parted", || {
                greeted.load(Ordering::SeqCst) == 3 && parted.load(Ordering::SeqCst) == 3
            })
            .await;
        })
        .await
        .unwrap();
    assert_eq!(count(&path, "SELECT COUNT(*) FROM greetings"), 0);
    assert_eq!(count(&path, "SELECT COUNT(*) FROM farewells"), 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_no_one_gave_fails_the_row_naming_its_type() {
    let dir = std::env::temp_dir().join(format!("ruststream-nostate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.db");
    let _ = std::fs::remove_file(&path);
    schema(&path);
    let broker = RusqliteBroker::open(&path).handle();
    let farewells = broker.publisher::<Farewell>();
    let service = RustStream::new(AppInfo::new("greeter", "0.1.0")).with_broker(broker, |b| {
        b.include(needs_what_no_one_gives.poll_interval(Duration::from_millis(50)));
    });
    let failed = "SELECT COUNT(*) FROM farewells WHERE failed_at IS NOT NULL \
                  AND error LIKE '%State<state::Missing>%'";
    service
        .run_until(async {
            let message = Message::json(&Name { name: "ada".into() }).unwrap();
            farewells.publish(message).await.unwrap();
            until("the row is failed, its error naming the type", || {
                count(&path, failed) == 1
            })
            .await;
        })
        .await
        .unwrap();
    assert_eq!(count(&path, "SELECT COUNT(*) FROM farewells"), 1, "kept");
    let _ = std::fs::remove_dir_all(dir);
}

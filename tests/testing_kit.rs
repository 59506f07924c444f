//! The testing kit in a service on a real SQLite file: the handler wrapped to record its
//! outcomes, the test waits for them with no sleep loop, and the rows are settled as the
//! outcomes say.

use std::sync::Arc;
use std::time::Duration;

use ruststream::core::Dialect;
use ruststream::testing::Recorded;
use ruststream::{
    AppInfo, BoxError, HandlerOutcome, Inbox, InboxQueue, InboxTable, Message, RustStream,
    permanent, subscriber,
};
use ruststream_rusqlite::RusqliteBroker;
use ruststream_rusqlite::rusqlite::Connection;

#[derive(Inbox, serde::Deserialize)]
#[inbox(table = "emails", failed_at = "failed_at", error = "error")]
struct SendEmail {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
    #[field(locked_until)]
    locked_until: Option<i64>,
}

#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Email {
    to: String,
}

#[subscriber(InboxQueue::<SendEmail>::new("emails"))]
async fn send(email: Email) -> Result<(), BoxError> {
    if email.to.contains('@') {
        Ok(())
    } else {
        Err(permanent(format!("not an address: {}", email.to)).into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_waits_for_the_outcomes_of_a_running_service() {
    let dir = std::env::temp_dir().join(format!("ruststream-kit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("emails.db");
    let _ = std::fs::remove_file(&path);
    let ddl = SendEmail::TABLE.ddl(Dialect::Sqlite).to_string();
    Connection::open(&path)
        .unwrap()
        .execute_batch(&ddl)
        .unwrap();

    let recorded = Recorded::wrap(send);
    let broker = RusqliteBroker::open(&path).handle();
    let publisher = broker.publisher::<SendEmail>();
    let jobs = subscriber("emails", recorded.clone())
        .map_source(|_| InboxQueue::<SendEmail>::new("emails"))
        .workers(2);
    let service = RustStream::new(AppInfo::new("mail", "0.1.0")).with_broker(broker, move |b| {
        b.include(jobs.build());
    });
    let exec = ruststream::exec::current();
    let waited = Arc::new(tokio::sync::Mutex::new(None));
    let into = waited.clone();
    service
        .run_until(async move {
            for to in ["ada@example.com", "grace@example.com", "nobody"] {
                let message = Message::json(&Email { to: to.into() }).unwrap();
                publisher.publish(message).await.unwrap();
            }
            *into.lock().await = recorded.outcomes(3, Duration::from_secs(20), &exec).await;
        })
        .await
        .unwrap();
    let outcomes = waited
        .lock()
        .await
        .take()
        .expect("three outcomes within 20 s");
    let finals: Vec<(i64, HandlerOutcome)> = outcomes
        .into_iter()
        .map(|(id, o)| (id.as_int().unwrap(), o.last().unwrap().clone()))
        .collect();
    assert_eq!(finals.len(), 3);
    assert_eq!(finals[0], (1, HandlerOutcome::ack()));
    assert_eq!(finals[1], (2, HandlerOutcome::ack()));
    assert_eq!(
        finals[2],
        (
            3,
            HandlerOutcome::reject().with_error("not an address: nobody")
        )
    );
    let conn = Connection::open(&path).unwrap();
    let left: Vec<(i64, Option<String>)> = conn
        .prepare("SELECT id, error FROM emails")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(left, [(3, Some("not an address: nobody".into()))]);
    let _ = std::fs::remove_dir_all(&dir);
}

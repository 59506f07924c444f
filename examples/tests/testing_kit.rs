//! The testing kit in a service on a throwaway SQLite file: the handler wrapped to record its
//! outcomes, the test runs the service until they are final, with no sleep loop, and the rows
//! are settled as the outcomes say; a row that never settles answers the timeout. The same in
//! a PostgreSQL schema of the test's own, on the test server (`RUSTSTREAM_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`).

use std::time::Duration;

use ruststream::testing::{Recorded, Unsettled};
use ruststream::{
    AppInfo, BoxError, HandlerOutcome, Inbox, InboxQueue, Message, PublishError, RetryPolicy,
    RustStream, permanent, subscriber,
};
use ruststream_rusqlite::testing::TempDb;
use ruststream_sqlx::testing::PgSchema;

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

/// The same table on PostgreSQL, in the row lock form.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(table = "emails", failed_at = "failed_at", error = "error")]
struct PgEmail {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
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

/// A service on `$broker` whose subscription is `$jobs` and which publishes an email to each
/// address of `$to` once it runs.
macro_rules! mail_service {
    ($broker:expr, $row:ty, $jobs:expr, $to:expr) => {{
        let broker = $broker;
        let publisher = broker.publisher::<$row>();
        let jobs = $jobs;
        RustStream::new(AppInfo::new("mail", "0.1.0"))
            .on_started(async move || {
                for to in $to {
                    let email = Email { to: to.to_owned() };
                    publisher.publish(Message::json(&email)?).await?;
                }
                Ok::<(), PublishError>(())
            })
            .with_broker(broker, move |b| {
                b.include(jobs.build());
            })
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_runs_a_service_until_its_rows_settle() {
    let db = TempDb::new().with_table::<SendEmail>().unwrap();
    let recorded = Recorded::wrap(send);
    let jobs = subscriber("emails", recorded.clone())
        .map_source(|_| InboxQueue::<SendEmail>::new("emails"))
        .workers(2);
    let service = mail_service!(
        db.broker().handle(),
        SendEmail,
        jobs,
        ["ada@example.com", "grace@example.com", "nobody"]
    );
    let outcomes = recorded
        .settle(service, 3, Duration::from_secs(20))
        .await
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
    // `settle` returned after the service's shutdown: every settlement has committed.
    let left: Vec<(i64, Option<String>)> = db
        .connect()
        .unwrap()
        .prepare("SELECT id, error FROM emails")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(left, [(3, Some("not an address: nobody".into()))]);
    let path = db.path().to_owned();
    drop(db);
    assert!(!path.exists(), "the throwaway file goes with it");
}

#[subscriber(InboxQueue::<SendEmail>::new("emails"))]
async fn never_sends(_email: Email) -> Result<(), BoxError> {
    Err("the mail server is down".into())
}

/// A row that keeps retrying never has a final outcome: `settle` answers the timeout, with
/// the outcomes there were, and the service is shut down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_answers_the_timeout_with_the_outcomes_so_far() {
    let db = TempDb::new().with_table::<SendEmail>().unwrap();
    let recorded = Recorded::wrap(never_sends);
    let jobs = subscriber("emails", recorded.clone())
        .map_source(|_| InboxQueue::<SendEmail>::new("emails"))
        .retry_policy(RetryPolicy::fixed(Duration::from_millis(50)))
        .poll_interval(Duration::from_secs(10));
    let service = mail_service!(db.broker().handle(), SendEmail, jobs, ["ada@example.com"]);
    let started = std::time::Instant::now();
    let error = recorded
        .settle(service, 1, Duration::from_secs(1))
        .await
        .expect_err("no final outcome");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let Unsettled::Timeout {
        wanted,
        finished,
        outcomes,
        ..
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!((*wanted, *finished), (1, 0));
    let tries = &outcomes[&ruststream::core::Value::Int(1)];
    // Retried every 50 ms, not at the 10 s poll.
    assert!(tries.len() >= 4, "retried: {tries:?}");
    assert!(
        tries
            .iter()
            .all(|o| o.error() == Some("the mail server is down"))
    );
    assert_eq!(
        error.to_string(),
        "0 of 1 messages had a final outcome within 1s"
    );
}

/// The same service on PostgreSQL, in a schema of the test's own: the table there is the
/// service's, the rows settle as the outcomes say, and the schema goes at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_runs_a_service_in_a_postgres_schema_of_its_own() {
    let url = std::env::var("RUSTSTREAM_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = PgSchema::create(&url).await.unwrap();
    schema.create_table::<PgEmail>().await.unwrap();
    let recorded = Recorded::wrap(send);
    let jobs = subscriber("emails", recorded.clone())
        .map_source(|_| InboxQueue::<PgEmail>::new("emails"))
        .workers(2);
    let service = mail_service!(
        schema.broker().handle(),
        PgEmail,
        jobs,
        ["ada@example.com", "nobody"]
    );
    let outcomes = recorded
        .settle(service, 2, Duration::from_secs(20))
        .await
        .expect("two outcomes within 20 s");
    assert_eq!(outcomes.len(), 2);
    let pool = schema.pool(1).await.unwrap();
    let left: Vec<(i64, Option<String>)> = sqlx::query_as("SELECT id, error FROM emails")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, [(2, Some("not an address: nobody".into()))]);
    let in_schema: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = $1",
    )
    .bind(schema.name())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(in_schema, 1, "the table is the schema's");
    pool.close().await;
    let name = schema.name().to_owned();
    schema.drop().await.unwrap();
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    let left: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = $1",
    )
    .bind(&name)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(left, 0, "the schema is dropped");
}

/// A subscription given zero workers (a plain integer, as a setting read at run time may be)
/// does not start: the service answers an error naming the table and the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_workers_is_refused_naming_the_table() {
    let db = TempDb::new().with_table::<SendEmail>().unwrap();
    let workers: usize = "0".parse().unwrap();
    let service = RustStream::new(AppInfo::new("mail", "0.1.0")).with_broker(
        db.broker().handle(),
        move |b| {
            b.include(send.workers(workers));
        },
    );
    let error = tokio::time::timeout(
        Duration::from_secs(20),
        service.run_until(std::future::pending::<()>()),
    )
    .await
    .expect("the refusal comes at once")
    .expect_err("zero workers do not start");
    let text = error.to_string();
    assert!(
        text.contains("table `emails`") && text.contains("at least one worker"),
        "{text}"
    );
}

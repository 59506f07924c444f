//! The schema from the description and a table's state, on every database.
//!
//! A subscription with `ensure_schema` starts on a table that does not exist: the start
//! creates it and its claim index from the description, and the service serves it. The
//! counts through the broker and through a publisher's pool with no broker running read what
//! the table holds (rows due, due later, held by a lease, failed, the oldest due row's age);
//! failed rows are read page by page and one by one. A table made by hand without a claim
//! index is refused where the subscription says so, naming the table and the index.

use std::time::{Duration, SystemTime};

use ruststream::core::CheckError;
use ruststream::{Inbox, IntoSubscription, MissingIndex, StartError, Value};
use ruststream_sqlx::{SqlxBroker, SqlxOutbox, sqlx};

use crate::common::*;

/// A lease table with a due time and failed rows kept.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(
    table = "ops_jobs",
    locked_until = "locked_until",
    due = "due_at",
    failed_at = "failed_at",
    error = "error"
)]
#[allow(dead_code)]
pub struct OpsJob {
    #[field(id, generated)]
    id: i64,
    #[field(attempt)]
    attempt: i32,
    #[field(payload)]
    payload: Vec<u8>,
}

/// A lease table made by hand without its claim index.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(table = "bare_jobs", due = "due_at", locked_until = "locked_until")]
#[allow(dead_code)]
pub struct BareJob {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

fn bare_schema(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => {
            "CREATE TABLE bare_jobs (id BIGSERIAL PRIMARY KEY, due_at TIMESTAMPTZ NOT NULL, locked_until TIMESTAMPTZ, payload BYTEA NOT NULL)"
        }
        Dialect::MariaDb => {
            "CREATE TABLE bare_jobs (id BIGINT AUTO_INCREMENT PRIMARY KEY, due_at DATETIME(6) NOT NULL, locked_until DATETIME(6) NULL, payload LONGBLOB NOT NULL)"
        }
        Dialect::Sqlite => {
            "CREATE TABLE bare_jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, due_at INTEGER NOT NULL, locked_until INTEGER, payload BLOB NOT NULL)"
        }
    }
}

/// The indexes the server lists for `table`, by name.
async fn index_names<D: TestDb>(db: &D, table: &str) -> i64 {
    let sql = match db.dialect() {
        Dialect::Postgres => format!(
            "SELECT COUNT(*) FROM pg_indexes WHERE schemaname = current_schema() AND tablename = '{table}' AND indexname = '{table}_claim'"
        ),
        Dialect::MariaDb => format!(
            "SELECT COUNT(DISTINCT index_name) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = '{table}' AND index_name = '{table}_claim'"
        ),
        Dialect::Sqlite => format!(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = '{table}' AND name = '{table}_claim'"
        ),
    };
    db.scalar(&sql).await
}

fn failed_mark(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => "now()",
        Dialect::MariaDb => "UTC_TIMESTAMP(6)",
        Dialect::Sqlite => "1",
    }
}

pub async fn the_schema_and_the_state_of_a_table<D: TestDb>(db: &D)
where
    SqlxBroker<D::DB>: ruststream::adapter::TakesRows<OpsJob>,
{
    let dialect = db.dialect();
    let seen = Seen::default();
    let gate = Gate::shut();
    let running = db
        .broker()
        .start(vec![
            builder::<OpsJob>(Record::new(&seen, &gate), 1, Some(Duration::from_secs(30)))
                .ensure_schema()
                .into_subscription(),
        ])
        .await
        .unwrap_or_else(|e| panic!("{dialect:?}: the start creates the table: {e}"));
    assert_eq!(
        index_names(db, "ops_jobs").await,
        1,
        "{dialect:?}: the claim index"
    );

    let publisher = running.publisher::<OpsJob>();
    publisher
        .publish_all((0..5).map(|n| message(n, None)))
        .await
        .expect("publishes");
    let later = SystemTime::now() + Duration::from_secs(3600);
    publisher
        .publish_all((5..8).map(|n| message(n, None).due_at(later)))
        .await
        .expect("publishes for later");
    eventually("one row is in work", || async { seen.in_work() == 1 }).await;
    // Two of the rows due later fail, as a handler's rejection would leave them.
    db.exec(
        &format!(
            "UPDATE ops_jobs SET failed_at = {}, error = 'boom ' || id WHERE id IN (6, 8)",
            failed_mark(dialect)
        )
        .replace(
            "'boom ' || id",
            if dialect == Dialect::MariaDb {
                "CONCAT('boom ', id)"
            } else {
                "'boom ' || id"
            },
        ),
    )
    .await;

    let stats = running.stats::<OpsJob>().await.expect("the counts");
    assert_eq!(stats.table, "ops_jobs");
    assert_eq!(
        (
            stats.due.value(),
            stats.scheduled.value(),
            stats.in_work.map(|c| c.value()),
            stats.failed.map(|c| c.value()),
            stats.processed.map(|c| c.value()),
        ),
        (4, 1, Some(1), Some(2), None),
        "{dialect:?}: {stats:?}"
    );
    assert!(stats.due.is_exact());
    let age = stats.oldest_due_age().expect("rows are due");
    assert!(age < Duration::from_secs(60), "{dialect:?}: {age:?}");

    // The same counts through a pool with no broker's help.
    let pool = running.broker().pool().expect("the broker's pool");
    let outside = SqlxOutbox::<OpsJob, D::DB>::new()
        .stats(&pool)
        .await
        .expect("the counts through the pool");
    assert_eq!(
        (
            outside.due,
            outside.scheduled,
            outside.in_work,
            outside.failed
        ),
        (stats.due, stats.scheduled, stats.in_work, stats.failed)
    );

    let failed = running.failed_rows::<OpsJob>();
    let first = failed.list(1, None).await.expect("a page");
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].id, Value::Int(6));
    assert_eq!(first[0].error.as_deref(), Some("boom 6"));
    assert_eq!(first[0].attempt, Some(0));
    assert!(first[0].failed_at.is_some());
    assert_eq!(
        first[0].payload.as_deref(),
        Some(&br#"{"n":5}"#[..]),
        "{dialect:?}"
    );
    let next = failed
        .list(10, Some(first[0].id.clone()))
        .await
        .expect("the next page");
    assert_eq!(
        next.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        [Value::Int(8)]
    );
    let one = failed.get(8i64).await.expect("one row");
    assert_eq!(one.map(|r| r.error), Some(Some("boom 8".to_owned())));
    assert_eq!(failed.get(7i64).await.expect("not failed"), None);

    gate.set_open(true);
    eventually("the due rows are served", || async { seen.len() >= 5 }).await;
    running.shutdown().await;
}

pub async fn a_missing_claim_index_refuses_the_start_where_asked<D: TestDb>(db: &D)
where
    SqlxBroker<D::DB>: ruststream::adapter::TakesRows<BareJob>,
{
    let dialect = db.dialect();
    db.exec(bare_schema(dialect)).await;
    let seen = Seen::default();
    let error = db
        .broker()
        .start(vec![
            builder::<BareJob>(Record::new(&seen, &Gate::open()), 1, None)
                .missing_claim_index(MissingIndex::Fail)
                .into_subscription(),
        ])
        .await
        .expect_err("refused");
    match &error {
        ruststream::Error::Start(StartError::Check(CheckError::MissingClaimIndex {
            table,
            create,
            ..
        })) => {
            assert_eq!(*table, "bare_jobs");
            assert!(create.contains("bare_jobs_claim"), "{create}");
        }
        other => panic!("{dialect:?}: {other}"),
    }
    let message = error.to_string();
    assert!(
        message.contains("table `bare_jobs` has no index that serves its claims"),
        "{message}"
    );

    // The index the error names, created by hand, lets it start; a warning alone lets it
    // start too.
    let create = match error {
        ruststream::Error::Start(StartError::Check(CheckError::MissingClaimIndex {
            create,
            ..
        })) => create,
        _ => unreachable!(),
    };
    let running = db
        .broker()
        .start(vec![
            builder::<BareJob>(Record::new(&seen, &Gate::open()), 1, None).into_subscription(),
        ])
        .await
        .expect("a warning does not stop the start");
    running.shutdown().await;
    db.exec(&create).await;
    assert_eq!(index_names(db, "bare_jobs").await, 1);
    let running = db
        .broker()
        .start(vec![
            builder::<BareJob>(Record::new(&seen, &Gate::open()), 1, None)
                .missing_claim_index(MissingIndex::Fail)
                .into_subscription(),
        ])
        .await
        .expect("with the index it starts");
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let db = Pg::new("pg_schema").await;
    the_schema_and_the_state_of_a_table(&db).await;
    a_missing_claim_index_refuses_the_start_where_asked(&db).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb() {
    let db = My::new("my_schema").await;
    the_schema_and_the_state_of_a_table(&db).await;
    a_missing_claim_index_refuses_the_start_where_asked(&db).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let db = Lite::new("lite_schema").await;
    the_schema_and_the_state_of_a_table(&db).await;
    a_missing_claim_index_refuses_the_start_where_asked(&db).await;
    db.drop().await;
}

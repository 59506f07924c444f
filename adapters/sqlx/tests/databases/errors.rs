//! A row's history of errors, on every database: a table created from its description keeps
//! each failed attempt's error, attempt and time in its `errors` column (JSON), the newest
//! `ERRORS_KEPT` of them, oldest first; the failed rows' reading returns them; a cell written
//! by hand that holds no array starts a new history instead of failing the settlement.

use std::time::Duration;

use ruststream::core::spec::Described;
use ruststream::core::{Ddl, Dialect as CoreDialect};
use ruststream::{
    Context, ERRORS_KEPT, FailedRow, Handle, HandlerOutcome, Inbox, InboxContext, InboxQueue,
    InboxTable, IntoSubscription, RetryPolicy, RunningBroker,
};
use ruststream_sqlx::SqlxBroker;

use crate::common::*;

/// The lease form: fenced settlements.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(
    table = "err_leased",
    locked_until = "locked_until",
    failed_at = "failed_at",
    error = "error",
    errors = "errors"
)]
#[allow(dead_code)]
pub struct ErrLeased {
    #[field(id, generated)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i32,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The row lock form, with a due column the retries write.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(
    table = "err_locked",
    due = "due",
    failed_at = "failed_at",
    error = "error",
    errors = "errors"
)]
#[allow(dead_code)]
pub struct ErrLocked {
    #[field(id, generated)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i32,
    #[field(payload)]
    payload: Vec<u8>,
}

/// Fails every attempt with an error naming it.
#[derive(Clone)]
struct FailEvery;

impl Handle<Job, (), (), InboxContext> for FailEvery {
    async fn handle(
        &self,
        _job: &Job,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let attempt = ctx.kind().info().attempt;
        Err(HandlerOutcome::retry().with_error(format!("failure {}", attempt.unwrap_or(0))))
    }
}

fn core_dialect(dialect: Dialect) -> CoreDialect {
    match dialect {
        Dialect::Postgres => CoreDialect::Postgres,
        Dialect::MariaDb => CoreDialect::MariaDb,
        Dialect::Sqlite => CoreDialect::Sqlite,
    }
}

/// The number of entries in the history cell, as a query's column.
fn length(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => "CAST(jsonb_array_length(errors) AS BIGINT)",
        Dialect::MariaDb => "JSON_LENGTH(errors)",
        Dialect::Sqlite => "json_array_length(errors)",
    }
}

const ATTEMPTS: u32 = 12;

/// A broker whose subscription fails every attempt of `T`'s rows, `max_attempts` of them.
async fn failing<D: TestDb, T>(db: &D, max_attempts: u32) -> RunningBroker<SqlxBroker<D::DB>>
where
    T: InboxTable + ruststream::PayloadRow + ruststream::DecodesAs<Job>,
    SqlxBroker<D::DB>: ruststream::adapter::TakesRows<T>,
{
    db.broker()
        .start(vec![
            ruststream::subscriber("jobs", FailEvery)
                .map_source(move |_| InboxQueue::<T>::new("jobs"))
                .workers(2)
                .poll_interval(POLL)
                .retry_policy(RetryPolicy::fixed(Duration::from_millis(5)))
                .max_attempts(max_attempts)
                .into_subscription(),
        ])
        .await
        .expect("the broker starts: the description's table passes the check")
}

/// Waits until the table's one row has failed, and reads it as the failed rows' reading does.
async fn the_failed_row<D: TestDb, T>(
    db: &D,
    running: &RunningBroker<SqlxBroker<D::DB>>,
) -> FailedRow
where
    T: InboxTable,
    SqlxBroker<D::DB>: ruststream::adapter::TakesRows<T>,
{
    let table = T::TABLE.table_desc().table;
    eventually("the row fails", || async {
        db.scalar(&format!(
            "SELECT COUNT(*) FROM {table} WHERE failed_at IS NOT NULL"
        ))
        .await
            == 1
    })
    .await;
    let mut rows = running
        .failed_rows::<T>()
        .list(10, None)
        .await
        .expect("the failed rows read");
    assert_eq!(rows.len(), 1, "{:?}", db.dialect());
    rows.remove(0)
}

/// A row that fails all its attempts keeps the newest errors.
async fn history_is_kept<D: TestDb, T>(db: &D)
where
    T: InboxTable + ruststream::PayloadRow + ruststream::DecodesAs<Job>,
    SqlxBroker<D::DB>: ruststream::adapter::TakesRows<T>,
{
    let dialect = db.dialect();
    let table = T::TABLE.table_desc().table;
    db.exec(&Ddl::new(core_dialect(dialect), T::TABLE.table_desc()).to_string())
        .await;
    let running = failing::<D, T>(db, ATTEMPTS).await;
    running
        .publisher::<T>()
        .publish(message(1, None))
        .await
        .expect("the row is published");
    let row = the_failed_row::<D, T>(db, &running).await;
    assert_eq!(row.attempt, Some(i64::from(ATTEMPTS)), "{dialect:?}");
    assert_eq!(
        row.error.as_deref(),
        Some(format!("failure {ATTEMPTS}").as_str()),
        "{dialect:?}: the error column holds the last attempt's own error"
    );
    let attempts: Vec<Option<i64>> = row.errors.iter().map(|e| e.attempt).collect();
    let kept = ERRORS_KEPT as i64;
    let expected: Vec<Option<i64>> = (i64::from(ATTEMPTS) - kept + 1..=i64::from(ATTEMPTS))
        .map(Some)
        .collect();
    assert_eq!(
        attempts, expected,
        "{dialect:?}: the newest {ERRORS_KEPT} attempts, oldest first"
    );
    for entry in &row.errors {
        let n = entry.attempt.expect("each entry has its attempt");
        assert_eq!(entry.error, format!("failure {n}"), "{dialect:?}");
        let at = entry.at.expect("each entry has its time");
        let failed = row.failed_at.expect("a failed row has its time");
        assert!(
            at.micros() <= failed.micros() && failed.micros() - at.micros() < 60_000_000,
            "{dialect:?}: attempt {n} failed at {at:?}, before the row's failure {failed:?}"
        );
    }
    assert!(
        row.errors.windows(2).all(|w| w[0].at <= w[1].at),
        "{dialect:?}: the entries' times rise"
    );
    assert_eq!(
        db.scalar(&format!("SELECT {} FROM {table}", length(dialect)))
            .await,
        kept,
        "{dialect:?}: the cell holds {ERRORS_KEPT} entries"
    );
    running.shutdown().await;
}

/// A history cell written by hand that holds no array: the next failed attempt starts a new
/// history, and the row is settled as the handler says.
async fn a_cell_that_is_no_array_starts_anew<D: TestDb, T>(db: &D)
where
    T: InboxTable + ruststream::PayloadRow + ruststream::DecodesAs<Job>,
    SqlxBroker<D::DB>: ruststream::adapter::TakesRows<T>,
{
    let dialect = db.dialect();
    let table = T::TABLE.table_desc().table;
    let not_an_array = match dialect {
        // A JSON column takes only JSON; SQLite's text takes anything.
        Dialect::Postgres | Dialect::MariaDb => "'{\"x\": 1}'",
        Dialect::Sqlite => "'not json'",
    };
    db.exec(&format!("DELETE FROM {table}")).await;
    let payload = match dialect {
        Dialect::Postgres => "convert_to('{\"n\": 3}', 'UTF8')",
        Dialect::MariaDb => "'{\"n\": 3}'",
        Dialect::Sqlite => "CAST('{\"n\": 3}' AS BLOB)",
    };
    let (due, now) = match (dialect, T::TABLE.table_desc().due.is_some()) {
        (_, false) => ("", ""),
        (Dialect::Postgres, true) => (", due", ", now()"),
        (Dialect::MariaDb, true) => (", due", ", UTC_TIMESTAMP(6)"),
        (Dialect::Sqlite, true) => (", due", ", 0"),
    };
    db.exec(&format!(
        "INSERT INTO {table} (payload, errors{due}) VALUES ({payload}, {not_an_array}{now})"
    ))
    .await;
    let running = failing::<D, T>(db, 2).await;
    let row = the_failed_row::<D, T>(db, &running).await;
    let attempts: Vec<Option<i64>> = row.errors.iter().map(|e| e.attempt).collect();
    assert_eq!(
        attempts,
        vec![Some(1), Some(2)],
        "{dialect:?}: a new history of its two attempts"
    );
    running.shutdown().await;
}

async fn both<D: TestDb, T>(db: &D)
where
    T: InboxTable + ruststream::PayloadRow + ruststream::DecodesAs<Job>,
    SqlxBroker<D::DB>: ruststream::adapter::TakesRows<T>,
{
    history_is_kept::<D, T>(db).await;
    a_cell_that_is_no_array_starts_anew::<D, T>(db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let db = Pg::new("pg_errors").await;
    both::<_, ErrLeased>(&db).await;
    both::<_, ErrLocked>(&db).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb() {
    let db = My::new("my_errors").await;
    both::<_, ErrLeased>(&db).await;
    both::<_, ErrLocked>(&db).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let db = Lite::new("lite_errors").await;
    both::<_, ErrLeased>(&db).await;
    db.drop().await;
}

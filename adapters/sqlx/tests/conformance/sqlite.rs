//! The conformance suite (`ruststream-conformance`) on SQLite through sqlx: every scenario in
//! the lease, advisory lock and custom lock forms; the row lock form is not applicable (SQLite
//! has no row locks).

mod common;
mod lock;
mod rows;

use std::path::Path;
use std::time::Duration;

use ruststream::BrokerHandle;
use ruststream_conformance::session::Session;
use ruststream_conformance::{
    Capabilities, ClaimFuture, Harness, HarnessFuture, HarnessResult, NoRowLocks, SqliteFiles,
    Support,
};
use ruststream_core::{Dialect, Value};
use ruststream_sqlx::SqlxBroker;
use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteRow,
};
use sqlx::{AssertSqlSafe, Connection, Row, TypeInfo, ValueRef};

use crate::common::{ACQUIRE, POOL, SqlxSession, bind, first_column};

ruststream_conformance::conformance_tests! {
    rows: rows::Rows,
    harness: SqlxSqliteHarness::new(),
}

/// SQLite on sqlx: each scenario gets a new database file under
/// `std::env::temp_dir()/ruststream-conformance-sqlx`, in WAL mode, removed once the scenario
/// passed. The harness's own SQL runs on a connection it opens for each call.
#[derive(Clone, Debug)]
pub struct SqlxSqliteHarness {
    files: SqliteFiles,
}

impl Default for SqlxSqliteHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl SqlxSqliteHarness {
    /// The harness, with its files under the system's temporary directory.
    pub fn new() -> Self {
        Self {
            files: SqliteFiles::in_temp_dir("ruststream-conformance-sqlx"),
        }
    }
}

/// How the broker and the harness open the file `db`.
fn options(db: &str) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(Path::new(db))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10))
}

async fn connect(db: &str) -> HarnessResult<SqliteConnection> {
    SqliteConnection::connect_with(&options(db))
        .await
        .map_err(|e| format!("cannot open the SQLite database {db}: {e}").into())
}

impl Harness for SqlxSqliteHarness {
    type Adapter = SqlxBroker<Sqlite>;
    type RowLock = NoRowLocks;

    fn name(&self) -> &'static str {
        "sqlx on SQLite"
    }

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            hold_key: Support::No(
                "SQLite has no locks a session holds: the process keeps the keys in work",
            ),
            kill_connection: Support::No("SQLite has no server to kill a connection from"),
            kill_process: Support::Yes,
            claim_in_lease: Support::No(
                "SQLite: the lease form lends a handler no transaction (one writer at a time)",
            ),
        }
    }

    fn prepare<'a>(&'a self, table: &'a str) -> HarnessFuture<'a, String> {
        Box::pin(async move { self.files.fresh(table) })
    }

    fn broker(&self, db: &str) -> BrokerHandle<SqlxBroker<Sqlite>> {
        let pool = SqlitePoolOptions::new()
            .max_connections(POOL)
            .acquire_timeout(ACQUIRE);
        SqlxBroker::from_connect_options(options(db), pool).handle()
    }

    fn publish_in_transaction<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
        sql: &'a str,
        messages: Vec<ruststream::Message>,
        end: ruststream_conformance::TxEnd,
    ) -> HarnessFuture<'a, ruststream::Published> {
        Box::pin(async move {
            let conn = connect(db).await?;
            crate::common::publish_in_transaction::<Sqlite, T>(conn, sql, messages, end).await
        })
    }

    fn publish_without_broker<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
        messages: Vec<ruststream::Message>,
    ) -> HarnessFuture<'a, ruststream::Published> {
        Box::pin(crate::common::publish_without_broker::<Sqlite, T>(
            db, messages,
        ))
    }

    fn outbox_stats<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
    ) -> HarnessFuture<'a, ruststream::Stats> {
        Box::pin(crate::common::outbox_stats::<Sqlite, T>(db))
    }

    fn execute<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = connect(db).await?;
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&mut conn)
                .await?;
            conn.close().await?;
            Ok(())
        })
    }

    fn session<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, Box<dyn Session>> {
        Box::pin(async move {
            let session = SqlxSession::<Sqlite> {
                conn: connect(db).await?,
                bind: bind::<Sqlite>,
                value: sqlite_value,
                affected: |done| done.rows_affected(),
            };
            Ok(Box::new(session) as Box<dyn Session>)
        })
    }

    fn query_i64s<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, Vec<i64>> {
        Box::pin(async move {
            let mut conn = connect(db).await?;
            let rows = sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .fetch_all(&mut conn)
                .await?;
            let values = first_column(&rows, sql);
            drop(rows);
            conn.close().await?;
            values
        })
    }

    fn write_in_claim<'a>(
        ctx: &'a mut ruststream::Context<'_, ruststream::InboxContext>,
        sql: String,
    ) -> ClaimFuture<'a> {
        Box::pin(crate::common::write_in_claim::<Sqlite>(ctx, sql))
    }

    fn cleanup<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, ()> {
        SqliteFiles::remove(db);
        Box::pin(async { Ok(()) })
    }
}

/// A SQLite value by its storage class; a `REAL` as the text of its decimal form.
fn sqlite_value(row: &SqliteRow, i: usize) -> HarnessResult<Value> {
    let raw = row.try_get_raw(i)?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let ty = raw.type_info().name().to_owned();
    Ok(match ty.as_str() {
        "INTEGER" | "BOOLEAN" => Value::Int(row.try_get_unchecked::<i64, _>(i)?),
        "REAL" => Value::Text(row.try_get_unchecked::<f64, _>(i)?.to_string()),
        "BLOB" => Value::Bytes(row.try_get_unchecked::<Vec<u8>, _>(i)?),
        _ => Value::Text(row.try_get_unchecked::<String, _>(i)?),
    })
}

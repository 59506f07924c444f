//! The conformance suite (`ruststream-conformance`) on MariaDB through sqlx: every scenario in
//! every form, at `RUSTSTREAM_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`), in a
//! database per scenario and process.
//!
//! A lock name starts with the database's name (`keys::mysql_lock_name`), so a database per
//! scenario keeps the suite's advisory keys apart from every other suite's on the server.

mod common;
mod lock;
mod rows;

use ruststream::BrokerHandle;
use ruststream_conformance::session::Session;
use ruststream_conformance::urls::{self, database_of, with_database};
use ruststream_conformance::{
    Capabilities, ClaimFuture, Harness, HarnessFuture, HarnessResult, HeldKey, RowLocks, Support,
};
use ruststream_core::Dialect;
use ruststream_core::Value;
use ruststream_core::keys::mysql_lock_name;
use ruststream_sqlx::SqlxBroker;
use sqlx::mysql::{MySql, MySqlConnection, MySqlPoolOptions, MySqlRow};
use sqlx::{AssertSqlSafe, Connection, Row, TypeInfo, ValueRef};

use crate::common::{ACQUIRE, POOL, SqlxSession, bind, first_column};

ruststream_conformance::conformance_tests! {
    rows: rows::Rows,
    harness: SqlxMySqlHarness::new(),
}

/// MariaDB (or MySQL) on sqlx: each scenario gets the database `<table>_q<pid>`, dropped once
/// the scenario passed. The harness's own SQL runs on a session it opens for each call.
#[derive(Clone, Debug)]
pub struct SqlxMySqlHarness {
    url: String,
}

impl Default for SqlxMySqlHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl SqlxMySqlHarness {
    /// The harness on `RUSTSTREAM_MYSQL_URL`.
    pub fn new() -> Self {
        Self { url: urls::mysql() }
    }
}

/// A session on `url`, or an error that names it.
async fn connect(url: &str) -> HarnessResult<MySqlConnection> {
    MySqlConnection::connect(url).await.map_err(|e| {
        format!(
            "cannot reach MariaDB at {url} (set {}): {e}",
            urls::MYSQL_URL_VAR
        )
        .into()
    })
}

/// The lock name of `key` in the database `db` names.
fn lock_name(db: &str, key: &str) -> HarnessResult<String> {
    let database = database_of(db).ok_or_else(|| format!("{db} names no database"))?;
    Ok(mysql_lock_name(database, key))
}

/// A lock held on a session of the harness's own.
struct Held {
    conn: MySqlConnection,
    name: String,
}

impl HeldKey for Held {
    fn release(self: Box<Self>) -> HarnessFuture<'static, ()> {
        Box::pin(async move {
            let Held { mut conn, name } = *self;
            let row = sqlx::query("SELECT RELEASE_LOCK(?)")
                .bind(&name)
                .fetch_one(&mut conn)
                .await?;
            let released: Option<i64> = row.try_get_unchecked(0)?;
            conn.close().await?;
            if released != Some(1) {
                return Err(format!("the harness's session did not hold {name}").into());
            }
            Ok(())
        })
    }
}

impl Harness for SqlxMySqlHarness {
    type Adapter = SqlxBroker<MySql>;
    type RowLock = RowLocks;

    fn name(&self) -> &'static str {
        "sqlx on MariaDB"
    }

    fn dialect(&self) -> Dialect {
        Dialect::MariaDb
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            hold_key: Support::Yes,
            kill_connection: Support::Yes,
            kill_process: Support::Yes,
            claim_in_lease: Support::Yes,
        }
    }

    fn prepare<'a>(&'a self, table: &'a str) -> HarnessFuture<'a, String> {
        Box::pin(async move {
            let database = format!("{table}_q{}", std::process::id());
            let mut conn = connect(&self.url).await?;
            sqlx::raw_sql(AssertSqlSafe(format!(
                "SET SESSION lock_wait_timeout = 10; DROP DATABASE IF EXISTS {database}; \
                 CREATE DATABASE {database}"
            )))
            .execute(&mut conn)
            .await?;
            conn.close().await?;
            Ok(with_database(&self.url, &database))
        })
    }

    fn broker(&self, db: &str) -> BrokerHandle<SqlxBroker<MySql>> {
        let pool = MySqlPoolOptions::new()
            .max_connections(POOL)
            .acquire_timeout(ACQUIRE);
        SqlxBroker::from_url(db, pool).handle()
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
            crate::common::publish_in_transaction::<MySql, T>(conn, sql, messages, end).await
        })
    }

    fn publish_without_broker<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
        messages: Vec<ruststream::Message>,
    ) -> HarnessFuture<'a, ruststream::Published> {
        Box::pin(crate::common::publish_without_broker::<MySql, T>(
            db, messages,
        ))
    }

    fn outbox_stats<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
    ) -> HarnessFuture<'a, ruststream::Stats> {
        Box::pin(crate::common::outbox_stats::<MySql, T>(db))
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
            let session = SqlxSession::<MySql> {
                conn: connect(db).await?,
                bind: bind::<MySql>,
                value: mysql_value,
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
            conn.close().await?;
            first_column(&rows, sql)
        })
    }

    fn hold_key<'a>(&'a self, db: &'a str, key: &'a str) -> HarnessFuture<'a, Box<dyn HeldKey>> {
        Box::pin(async move {
            let name = lock_name(db, key)?;
            let mut conn = connect(db).await?;
            let row = sqlx::query("SELECT GET_LOCK(?, 0)")
                .bind(&name)
                .fetch_one(&mut conn)
                .await?;
            let taken: Option<i64> = row.try_get_unchecked(0)?;
            if taken != Some(1) {
                return Err(format!("GET_LOCK('{name}', 0) answered {taken:?}").into());
            }
            Ok(Box::new(Held { conn, name }) as Box<dyn HeldKey>)
        })
    }

    fn kill_key_holder<'a>(&'a self, db: &'a str, key: &'a str) -> HarnessFuture<'a, bool> {
        Box::pin(async move {
            let name = lock_name(db, key)?;
            let mut conn = connect(db).await?;
            let row = sqlx::query("SELECT IS_USED_LOCK(?)")
                .bind(&name)
                .fetch_one(&mut conn)
                .await?;
            let holder: Option<i64> = row.try_get_unchecked(0)?;
            if let Some(holder) = holder {
                sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {holder}")))
                    .execute(&mut conn)
                    .await?;
            }
            conn.close().await?;
            Ok(holder.is_some())
        })
    }

    fn write_in_claim<'a>(
        ctx: &'a mut ruststream::Context<'_, ruststream::InboxContext>,
        sql: String,
    ) -> ClaimFuture<'a> {
        Box::pin(crate::common::write_in_claim::<MySql>(ctx, sql))
    }

    fn cleanup<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, ()> {
        Box::pin(async move {
            if let Some(database) = database_of(db) {
                let mut conn = connect(&self.url).await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "SET SESSION lock_wait_timeout = 10; DROP DATABASE IF EXISTS {database}"
                )))
                .execute(&mut conn)
                .await?;
                conn.close().await?;
            }
            Ok(())
        })
    }
}

/// A column as the core's value: integers as themselves, text and binary strings alike as
/// bytes, any other type (a time) as its type's name.
fn mysql_value(row: &MySqlRow, i: usize) -> HarnessResult<Value> {
    let raw = row.try_get_raw(i)?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let ty = raw.type_info().name().to_owned();
    Ok(match ty.as_str() {
        "BOOLEAN" => Value::Bool(row.try_get_unchecked::<bool, _>(i)?),
        "TINYINT" | "SMALLINT" | "MEDIUMINT" | "INT" | "BIGINT" => {
            Value::Int(row.try_get_unchecked::<i64, _>(i)?)
        }
        "TINYINT UNSIGNED" | "SMALLINT UNSIGNED" | "MEDIUMINT UNSIGNED" | "INT UNSIGNED"
        | "BIGINT UNSIGNED" => Value::Int(i64::try_from(row.try_get_unchecked::<u64, _>(i)?)?),
        "BINARY" | "VARBINARY" | "TINYBLOB" | "BLOB" | "MEDIUMBLOB" | "LONGBLOB" | "CHAR"
        | "VARCHAR" | "TINYTEXT" | "TEXT" | "MEDIUMTEXT" | "LONGTEXT" => {
            Value::Bytes(row.try_get_unchecked::<Vec<u8>, _>(i)?)
        }
        _ => Value::Text(ty),
    })
}

//! The drivers under the baseline, the tables, and the backlog published before each run.

use std::time::Duration;

use ruststream::core::Value;
use sqlx::{AssertSqlSafe, Connection, Row};

use crate::baseline::{ColumnKind, RawConn, column_kind};
use crate::stats::{Job, now_us};
use crate::{BoxError, Database};

// ----- sqlx -----

fn pg_bind<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    value: Value,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    match value {
        Value::Null => query.bind(Option::<i64>::None),
        Value::Bool(b) => query.bind(b),
        Value::Int(i) => query.bind(i),
        Value::Text(t) => query.bind(t),
        Value::Bytes(b) => query.bind(b),
    }
}

fn pg_value(row: &sqlx::postgres::PgRow, name: &str) -> Result<Value, sqlx::Error> {
    Ok(match column_kind(name) {
        ColumnKind::Int => row
            .try_get::<Option<i64>, _>(name)?
            .map_or(Value::Null, Value::Int),
        ColumnKind::Mark => Value::Int(row.try_get::<i32, _>(name)?.into()),
        ColumnKind::Bytes => Value::Bytes(row.try_get::<Vec<u8>, _>(name)?),
        ColumnKind::Text => Value::Text(row.try_get::<String, _>(name)?),
        ColumnKind::Truth => Value::Bool(row.try_get::<Option<bool>, _>(name)?.unwrap_or(false)),
    })
}

impl RawConn for sqlx::PgConnection {
    async fn query(
        &mut self,
        sql: &str,
        binds: Vec<Value>,
        columns: &'static [&'static str],
    ) -> Result<Vec<Vec<Value>>, BoxError> {
        let mut query = sqlx::query::<sqlx::Postgres>(AssertSqlSafe(sql.to_owned()));
        for value in binds {
            query = pg_bind(query, value);
        }
        let rows = query.fetch_all(&mut *self).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut values = Vec::with_capacity(columns.len());
            for name in columns {
                values.push(pg_value(row, name)?);
            }
            out.push(values);
        }
        Ok(out)
    }

    async fn execute(&mut self, sql: &str, binds: Vec<Value>) -> Result<u64, BoxError> {
        // As the adapter runs them: a statement without binds goes as plain text.
        if binds.is_empty() {
            return Ok(sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&mut *self)
                .await?
                .rows_affected());
        }
        let mut query = sqlx::query::<sqlx::Postgres>(AssertSqlSafe(sql.to_owned()));
        for value in binds {
            query = pg_bind(query, value);
        }
        Ok(query.execute(&mut *self).await?.rows_affected())
    }
}

fn my_bind<'q>(
    query: sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>,
    value: Value,
) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    match value {
        Value::Null => query.bind(Option::<i64>::None),
        Value::Bool(b) => query.bind(b),
        Value::Int(i) => query.bind(i),
        Value::Text(t) => query.bind(t),
        Value::Bytes(b) => query.bind(b),
    }
}

fn my_value(row: &sqlx::mysql::MySqlRow, name: &str) -> Result<Value, sqlx::Error> {
    Ok(match column_kind(name) {
        ColumnKind::Int => row
            .try_get_unchecked::<Option<i64>, _>(name)?
            .map_or(Value::Null, Value::Int),
        ColumnKind::Bytes => Value::Bytes(row.try_get_unchecked::<Vec<u8>, _>(name)?),
        ColumnKind::Text | ColumnKind::Mark => Value::Text(
            String::from_utf8_lossy(&row.try_get_unchecked::<Vec<u8>, _>(name)?).into_owned(),
        ),
        ColumnKind::Truth => Value::Bool(
            row.try_get_unchecked::<Option<i64>, _>(name)?
                .is_some_and(|n| n == 1),
        ),
    })
}

impl RawConn for sqlx::MySqlConnection {
    async fn query(
        &mut self,
        sql: &str,
        binds: Vec<Value>,
        columns: &'static [&'static str],
    ) -> Result<Vec<Vec<Value>>, BoxError> {
        let mut query = sqlx::query::<sqlx::MySql>(AssertSqlSafe(sql.to_owned()));
        for value in binds {
            query = my_bind(query, value);
        }
        let rows = query.fetch_all(&mut *self).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut values = Vec::with_capacity(columns.len());
            for name in columns {
                values.push(my_value(row, name)?);
            }
            out.push(values);
        }
        Ok(out)
    }

    async fn execute(&mut self, sql: &str, binds: Vec<Value>) -> Result<u64, BoxError> {
        // As the adapter runs them: a statement without binds goes as plain text (MySQL
        // prepares no `START TRANSACTION`).
        if binds.is_empty() {
            return Ok(sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&mut *self)
                .await?
                .rows_affected());
        }
        let mut query = sqlx::query::<sqlx::MySql>(AssertSqlSafe(sql.to_owned()));
        for value in binds {
            query = my_bind(query, value);
        }
        Ok(query.execute(&mut *self).await?.rows_affected())
    }
}

fn lite_bind<'q>(
    query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    value: Value,
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
    match value {
        Value::Null => query.bind(Option::<i64>::None),
        Value::Bool(b) => query.bind(b),
        Value::Int(i) => query.bind(i),
        Value::Text(t) => query.bind(t),
        Value::Bytes(b) => query.bind(b),
    }
}

fn lite_value(row: &sqlx::sqlite::SqliteRow, name: &str) -> Result<Value, sqlx::Error> {
    Ok(match column_kind(name) {
        ColumnKind::Int | ColumnKind::Truth | ColumnKind::Mark => {
            Value::Int(row.try_get_unchecked::<i64, _>(name)?)
        }
        ColumnKind::Bytes => Value::Bytes(row.try_get_unchecked::<Vec<u8>, _>(name)?),
        ColumnKind::Text => Value::Text(row.try_get_unchecked::<String, _>(name)?),
    })
}

impl RawConn for sqlx::SqliteConnection {
    async fn query(
        &mut self,
        sql: &str,
        binds: Vec<Value>,
        columns: &'static [&'static str],
    ) -> Result<Vec<Vec<Value>>, BoxError> {
        let mut query = sqlx::query::<sqlx::Sqlite>(AssertSqlSafe(sql.to_owned()));
        for value in binds {
            query = lite_bind(query, value);
        }
        let rows = query.fetch_all(&mut *self).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut values = Vec::with_capacity(columns.len());
            for name in columns {
                values.push(lite_value(row, name)?);
            }
            out.push(values);
        }
        Ok(out)
    }

    async fn execute(&mut self, sql: &str, binds: Vec<Value>) -> Result<u64, BoxError> {
        // As the adapter runs them: a statement without binds goes as plain text.
        if binds.is_empty() {
            return Ok(sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&mut *self)
                .await?
                .rows_affected());
        }
        let mut query = sqlx::query::<sqlx::Sqlite>(AssertSqlSafe(sql.to_owned()));
        for value in binds {
            query = lite_bind(query, value);
        }
        Ok(query.execute(&mut *self).await?.rows_affected())
    }
}

// ----- rusqlite -----

/// A rusqlite connection; its statements run on the calling thread (the baseline gives each
/// rusqlite task a thread of its own).
pub(crate) struct Rusqlite(pub(crate) rusqlite::Connection);

fn lite_param(value: Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as V;
    match value {
        Value::Null => V::Null,
        Value::Bool(b) => V::Integer(i64::from(b)),
        Value::Int(i) => V::Integer(i),
        Value::Text(t) => V::Text(t),
        Value::Bytes(b) => V::Blob(b),
    }
}

impl Rusqlite {
    fn query_now(
        &mut self,
        sql: &str,
        binds: Vec<Value>,
        columns: &'static [&'static str],
    ) -> Result<Vec<Vec<Value>>, BoxError> {
        let mut statement = self.0.prepare_cached(sql)?;
        let params: Vec<rusqlite::types::Value> = binds.into_iter().map(lite_param).collect();
        let mut rows = statement.query(rusqlite::params_from_iter(params))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let mut values = Vec::with_capacity(columns.len());
            for name in columns {
                use rusqlite::types::ValueRef;
                values.push(match row.get_ref(*name)? {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(i) => Value::Int(i),
                    ValueRef::Real(r) => Value::Text(r.to_string()),
                    ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
                });
            }
            out.push(values);
        }
        Ok(out)
    }
}

impl RawConn for Rusqlite {
    async fn query(
        &mut self,
        sql: &str,
        binds: Vec<Value>,
        columns: &'static [&'static str],
    ) -> Result<Vec<Vec<Value>>, BoxError> {
        self.query_now(sql, binds, columns)
    }

    async fn execute(&mut self, sql: &str, binds: Vec<Value>) -> Result<u64, BoxError> {
        let mut statement = self.0.prepare_cached(sql)?;
        let params: Vec<rusqlite::types::Value> = binds.into_iter().map(lite_param).collect();
        Ok(statement.execute(rusqlite::params_from_iter(params))? as u64)
    }
}

/// `--sqlite-synchronous normal`: every side's SQLite connections commit without waiting for
/// the disk.
static SQLITE_NORMAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sets `--sqlite-synchronous` for the run.
pub(crate) fn set_sqlite_normal(normal: bool) {
    SQLITE_NORMAL.store(normal, std::sync::atomic::Ordering::Relaxed);
}

fn sqlite_normal() -> bool {
    SQLITE_NORMAL.load(std::sync::atomic::Ordering::Relaxed)
}

/// Opens a rusqlite connection as the adapter does: a busy timeout, WAL, and with
/// `--sqlite-synchronous normal`, synchronous NORMAL.
pub(crate) fn open_rusqlite(path: &std::path::Path) -> Result<Rusqlite, BoxError> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let _: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if sqlite_normal() {
        conn.execute_batch("PRAGMA synchronous = NORMAL")?;
    }
    Ok(Rusqlite(conn))
}

/// The rusqlite broker of the ruststream side.
pub(crate) fn rusqlite_broker(
    path: &std::path::Path,
    n: usize,
) -> ruststream_rusqlite::RusqliteBroker {
    let broker = ruststream_rusqlite::RusqliteBroker::open(path).max_connections(n);
    if sqlite_normal() {
        broker.synchronous(ruststream_rusqlite::Synchronous::Normal)
    } else {
        broker
    }
}

// ----- tokio-postgres -----

/// A tokio-postgres client with its prepared statements.
pub(crate) struct TokioPg {
    client: tokio_postgres::Client,
    prepared: std::collections::HashMap<String, tokio_postgres::Statement>,
}

impl TokioPg {
    pub(crate) async fn connect(url: &str) -> Result<Self, BoxError> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self {
            client,
            prepared: std::collections::HashMap::new(),
        })
    }

    async fn statement(&mut self, sql: &str) -> Result<tokio_postgres::Statement, BoxError> {
        if let Some(s) = self.prepared.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql).await?;
        self.prepared.insert(sql.to_owned(), s.clone());
        Ok(s)
    }
}

type PgParam = Box<dyn tokio_postgres::types::ToSql + Sync + Send>;

fn tpg_param(value: Value) -> PgParam {
    match value {
        Value::Null => Box::new(Option::<i64>::None),
        Value::Bool(b) => Box::new(b),
        Value::Int(i) => Box::new(i),
        Value::Text(t) => Box::new(t),
        Value::Bytes(b) => Box::new(b),
    }
}

impl RawConn for TokioPg {
    async fn query(
        &mut self,
        sql: &str,
        binds: Vec<Value>,
        columns: &'static [&'static str],
    ) -> Result<Vec<Vec<Value>>, BoxError> {
        let statement = self.statement(sql).await?;
        let params: Vec<PgParam> = binds.into_iter().map(tpg_param).collect();
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
            .iter()
            .map(|p| p.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        let rows = self.client.query(&statement, &refs).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut values = Vec::with_capacity(columns.len());
            for name in columns {
                values.push(match column_kind(name) {
                    ColumnKind::Int => row
                        .try_get::<_, Option<i64>>(*name)?
                        .map_or(Value::Null, Value::Int),
                    ColumnKind::Mark => Value::Int(row.try_get::<_, i32>(*name)?.into()),
                    ColumnKind::Bytes => Value::Bytes(row.try_get::<_, Vec<u8>>(*name)?),
                    ColumnKind::Text => Value::Text(row.try_get::<_, String>(*name)?),
                    ColumnKind::Truth => {
                        Value::Bool(row.try_get::<_, Option<bool>>(*name)?.unwrap_or(false))
                    }
                });
            }
            out.push(values);
        }
        Ok(out)
    }

    async fn execute(&mut self, sql: &str, binds: Vec<Value>) -> Result<u64, BoxError> {
        let statement = self.statement(sql).await?;
        let params: Vec<PgParam> = binds.into_iter().map(tpg_param).collect();
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
            .iter()
            .map(|p| p.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        Ok(self.client.execute(&statement, &refs).await?)
    }
}

// ----- mysql_async -----

/// A mysql_async connection.
pub(crate) struct MyAsync(pub(crate) mysql_async::Conn);

fn my_param(value: Value) -> mysql_async::Value {
    match value {
        Value::Null => mysql_async::Value::NULL,
        Value::Bool(b) => mysql_async::Value::Int(i64::from(b)),
        Value::Int(i) => mysql_async::Value::Int(i),
        Value::Text(t) => mysql_async::Value::Bytes(t.into_bytes()),
        Value::Bytes(b) => mysql_async::Value::Bytes(b),
    }
}

impl RawConn for MyAsync {
    async fn query(
        &mut self,
        sql: &str,
        binds: Vec<Value>,
        columns: &'static [&'static str],
    ) -> Result<Vec<Vec<Value>>, BoxError> {
        use mysql_async::prelude::Queryable;
        let params: Vec<mysql_async::Value> = binds.into_iter().map(my_param).collect();
        let rows: Vec<mysql_async::Row> = self.0.exec(sql, params).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut values = Vec::with_capacity(columns.len());
            for name in columns {
                let raw: Option<mysql_async::Value> = row.get(*name);
                let raw = raw.unwrap_or(mysql_async::Value::NULL);
                values.push(match (column_kind(name), raw) {
                    (_, mysql_async::Value::NULL) => Value::Null,
                    (ColumnKind::Int | ColumnKind::Truth, mysql_async::Value::Int(i)) => {
                        Value::Int(i)
                    }
                    (ColumnKind::Int | ColumnKind::Truth, mysql_async::Value::UInt(u)) => {
                        Value::Int(u as i64)
                    }
                    (ColumnKind::Int | ColumnKind::Truth, mysql_async::Value::Bytes(b)) => {
                        Value::Int(String::from_utf8_lossy(&b).parse()?)
                    }
                    (ColumnKind::Bytes, mysql_async::Value::Bytes(b)) => Value::Bytes(b),
                    (ColumnKind::Text | ColumnKind::Mark, mysql_async::Value::Bytes(b)) => {
                        Value::Text(String::from_utf8_lossy(&b).into_owned())
                    }
                    (_, other) => return Err(format!("column {name}: {other:?}").into()),
                });
            }
            out.push(values);
        }
        Ok(out)
    }

    async fn execute(&mut self, sql: &str, binds: Vec<Value>) -> Result<u64, BoxError> {
        use mysql_async::prelude::Queryable;
        if binds.is_empty() {
            self.0.query_drop(sql).await?;
        } else {
            let params: Vec<mysql_async::Value> = binds.into_iter().map(my_param).collect();
            self.0.exec_drop(sql, params).await?;
        }
        Ok(self.0.affected_rows())
    }
}

// ----- tables and the backlog -----

/// The table of a form, dropped and created anew.
pub(crate) fn schema(database: &Database, table: &str) -> Vec<String> {
    let create = match database {
        Database::Postgres(_) => format!(
            "CREATE TABLE {table} (
                id BIGSERIAL PRIMARY KEY,
                k BIGINT NOT NULL DEFAULT 0,
                attempt BIGINT NOT NULL DEFAULT 0,
                payload BYTEA NOT NULL,
                locked_until TIMESTAMPTZ NULL
            )"
        ),
        // The claim order is the id, which the primary key (InnoDB's clustered index) serves.
        Database::MySql(_) => format!(
            "CREATE TABLE {table} (
                id BIGINT AUTO_INCREMENT PRIMARY KEY,
                k BIGINT NOT NULL DEFAULT 0,
                attempt BIGINT NOT NULL DEFAULT 0,
                payload LONGBLOB NOT NULL,
                locked_until DATETIME(6) NULL
            ) ENGINE = InnoDB"
        ),
        Database::Sqlite(_) => format!(
            "CREATE TABLE {table} (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                k INTEGER NOT NULL DEFAULT 0,
                attempt INTEGER NOT NULL DEFAULT 0,
                payload BLOB NOT NULL,
                locked_until INTEGER NULL
            )"
        ),
    };
    vec![format!("DROP TABLE IF EXISTS {table}"), create]
}

/// Drops and creates `table`, then publishes `jobs` rows over `keys` keys into it, 200 to an
/// insert, each payload carrying the time of its insert.
pub(crate) async fn prepare(
    database: &Database,
    table: &str,
    jobs: u64,
    keys: u64,
) -> Result<(), BoxError> {
    match database {
        Database::Postgres(url) => {
            let mut conn = sqlx::PgConnection::connect(url).await?;
            fill(&mut conn, database, table, jobs, keys).await?;
            conn.close().await?;
        }
        Database::MySql(url) => {
            let mut conn = sqlx::MySqlConnection::connect(url).await?;
            fill(&mut conn, database, table, jobs, keys).await?;
            conn.close().await?;
        }
        Database::Sqlite(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut conn = sqlx::SqliteConnection::connect_with(&sqlite_options(path)).await?;
            fill(&mut conn, database, table, jobs, keys).await?;
            conn.close().await?;
        }
    }
    Ok(())
}

async fn fill<C: RawConn>(
    conn: &mut C,
    database: &Database,
    table: &str,
    jobs: u64,
    keys: u64,
) -> Result<(), BoxError> {
    for statement in schema(database, table) {
        conn.execute(&statement, Vec::new()).await?;
    }
    let postgres = matches!(database, Database::Postgres(_));
    let mut n = 0;
    while n < jobs {
        let batch = (jobs - n).min(200);
        let mut sql = format!("INSERT INTO {table} (k, payload) VALUES ");
        let mut binds = Vec::with_capacity(2 * batch as usize);
        for i in 0..batch {
            if i > 0 {
                sql.push_str(", ");
            }
            if postgres {
                sql.push_str(&format!("(${}, ${})", 2 * i + 1, 2 * i + 2));
            } else {
                sql.push_str("(?, ?)");
            }
            binds.push(Value::Int(((n + i) % keys.max(1)) as i64));
            binds.push(Value::Bytes(serde_json::to_vec(&Job { t: now_us() })?));
        }
        conn.execute(&sql, binds).await?;
        n += batch;
    }
    Ok(())
}

/// Deletes every row of `table`; answers how many.
pub(crate) async fn delete_all(database: &Database, table: &str) -> Result<u64, BoxError> {
    let sql = format!("DELETE FROM {table}");
    match database {
        Database::Postgres(url) => {
            let mut conn = sqlx::PgConnection::connect(url).await?;
            let n = conn.execute(&sql, Vec::new()).await?;
            conn.close().await?;
            Ok(n)
        }
        Database::MySql(url) => {
            let mut conn = sqlx::MySqlConnection::connect(url).await?;
            let n = conn.execute(&sql, Vec::new()).await?;
            conn.close().await?;
            Ok(n)
        }
        Database::Sqlite(path) => {
            let mut conn = sqlx::SqliteConnection::connect_with(&sqlite_options(path)).await?;
            let n = conn.execute(&sql, Vec::new()).await?;
            conn.close().await?;
            Ok(n)
        }
    }
}

/// The rows left in `table`.
pub(crate) async fn remaining(database: &Database, table: &str) -> Result<u64, BoxError> {
    let sql = format!("SELECT COUNT(*) AS n FROM {table}");
    let rows = match database {
        Database::Postgres(url) => {
            let mut conn = sqlx::PgConnection::connect(url).await?;
            let rows = conn.query(&sql, Vec::new(), &["n"]).await?;
            conn.close().await?;
            rows
        }
        Database::MySql(url) => {
            let mut conn = sqlx::MySqlConnection::connect(url).await?;
            let rows = conn.query(&sql, Vec::new(), &["n"]).await?;
            conn.close().await?;
            rows
        }
        Database::Sqlite(path) => {
            let mut conn = sqlx::SqliteConnection::connect_with(&sqlite_options(path)).await?;
            let rows = conn.query(&sql, Vec::new(), &["n"]).await?;
            conn.close().await?;
            rows
        }
    };
    rows.first()
        .and_then(|r| r.first())
        .and_then(Value::as_int)
        .map(|n| n as u64)
        .ok_or_else(|| format!("{sql} answered no count").into())
}

/// The options of a SQLite file: a busy timeout and WAL, as the adapters set them.
pub(crate) fn sqlite_options(path: &std::path::Path) -> sqlx::sqlite::SqliteConnectOptions {
    sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .busy_timeout(Duration::from_secs(5))
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .synchronous(if sqlite_normal() {
            sqlx::sqlite::SqliteSynchronous::Normal
        } else {
            sqlx::sqlite::SqliteSynchronous::Full
        })
}

//! What differs between the three sqlx databases: how a core value binds, how a column reads
//! into a core value, which driver errors mean what, and which dialect a server speaks.

use std::sync::Arc;

use futures::future::BoxFuture;
use ruststream_core::server::{self, Server};
use ruststream_core::{
    ColumnType, DbError, Dialect, ErrorKind, OutColumn, Output, Reply, Statement, Value,
};
use sqlx::error::DatabaseError;
use sqlx::mysql::{MySql, MySqlConnection, MySqlDatabaseError, MySqlRow};
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgConnection, PgRow, PgTypeInfo, Postgres};
use sqlx::sqlite::{Sqlite, SqliteConnection, SqliteRow};
use sqlx::{AssertSqlSafe, Column, Pool, Row, TypeInfo, ValueRef};

use crate::listen::Listener;

mod sealed {
    pub trait Sealed {}
    impl Sealed for sqlx::Postgres {}
    impl Sealed for sqlx::MySql {}
    impl Sealed for sqlx::Sqlite {}
}

/// A database [`SqlxBroker`](crate::SqlxBroker) runs on: [`sqlx::Postgres`], [`sqlx::MySql`]
/// (MySQL and MariaDB) or [`sqlx::Sqlite`].
///
/// The trait is sealed: its methods are the adapter's own, per database, and hidden from the
/// documentation. `Family` is the database as the core's description rules see it: a table
/// that takes the row lock form does not compile on [`sqlx::Sqlite`], whose family has no row
/// locks.
pub trait SqlxDatabase: sqlx::Database + sealed::Sealed {
    /// The database family whose rules a table's description keeps
    /// ([`ruststream_core::spec::ValidOn`]).
    type Family: ruststream_core::spec::Database;

    /// The dialect a publish renders in before any server has answered: MySQL and MariaDB
    /// write their rows with the same statements.
    #[doc(hidden)]
    const PUBLISH_DIALECT: Dialect;

    /// Runs `statement` with `binds` on `conn` and reads the reply as its output says.
    #[doc(hidden)]
    fn run<'c>(
        conn: &'c mut Self::Connection,
        statement: &'c Statement,
        binds: Vec<Value>,
    ) -> BoxFuture<'c, Result<Reply<Self::Row>, DbError>>;

    /// The server's dialect, or why the server does not serve the queue.
    #[doc(hidden)]
    fn dialect<'c>(conn: &'c mut Self::Connection) -> BoxFuture<'c, Result<Dialect, String>>;

    /// The kind of a driver error of this database.
    #[doc(hidden)]
    fn error_kind(error: &sqlx::Error) -> ErrorKind;

    /// The sessions that hear of rows other processes publish, on connections like the
    /// pool's: PostgreSQL's `LISTEN`; `None` where the database notifies of no publish.
    #[doc(hidden)]
    fn listener(pool: &Pool<Self>) -> Option<Listener>;
}

/// A driver error as the core reads it, with its kind per database.
pub(crate) fn db_error<DB: SqlxDatabase>(error: &sqlx::Error) -> DbError {
    DbError::new(DB::error_kind(error), error.to_string())
}

/// The kinds every database shares: the connection, the pool, columns of a row.
fn common_kind(error: &sqlx::Error) -> Option<ErrorKind> {
    Some(match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => ErrorKind::ConnectionLost,
        sqlx::Error::PoolClosed | sqlx::Error::PoolTimedOut => ErrorKind::PoolClosed,
        sqlx::Error::ColumnNotFound(_) => ErrorKind::UndefinedColumn,
        sqlx::Error::Database(_) => return None,
        _ => ErrorKind::Other,
    })
}

fn database_error(error: &sqlx::Error) -> Option<&(dyn DatabaseError + 'static)> {
    match error {
        sqlx::Error::Database(db) => Some(&**db),
        _ => None,
    }
}

/// Reads the rows of a statement as its output names them, each column as its declared type,
/// keeping each driver row when asked.
fn read_rows<R: Row>(
    rows: Vec<R>,
    columns: &Arc<[OutColumn]>,
    raw: bool,
    sql: &str,
    value: impl Fn(&R, usize) -> Result<Value, String>,
) -> Result<Reply<R>, DbError> {
    let names = |row: &R| row.columns().iter().map(|c| c.name().to_owned()).collect();
    let read = |row: &R, index, ty: ColumnType| value(row, index).and_then(|v| ty.read(v));
    ruststream_core::read_rows(rows, columns, raw, sql, names, read).map(Reply::Rows)
}

/// Runs a statement: its binds through `bind`, its reply as its output says. A statement
/// without binds or rows runs as plain SQL, outside the prepared statement protocol (MySQL
/// prepares no `START TRANSACTION`).
macro_rules! run_statement {
    ($db:ty, $conn:expr, $statement:expr, $binds:expr, $bind:path, $value:path) => {{
        let conn = $conn;
        let statement: &Statement = $statement;
        let binds: Vec<Value> = $binds;
        Box::pin(async move {
            let sql = &statement.sql;
            let failed = |e: sqlx::Error| db_error::<$db>(&e);
            if binds.is_empty() && matches!(statement.output, Output::Nothing) {
                sqlx::raw_sql(AssertSqlSafe(sql.clone()))
                    .execute(&mut *conn)
                    .await
                    .map_err(failed)?;
                return Ok(Reply::Done);
            }
            let mut query = sqlx::query::<$db>(AssertSqlSafe(sql.clone()));
            for value in binds {
                query = $bind(query, value);
            }
            match &statement.output {
                Output::Nothing => {
                    query.execute(&mut *conn).await.map_err(failed)?;
                    Ok(Reply::Done)
                }
                Output::Affected => {
                    let done = query.execute(&mut *conn).await.map_err(failed)?;
                    Ok(Reply::Affected(done.rows_affected()))
                }
                Output::Rows { columns, raw } => {
                    let rows = query.fetch_all(&mut *conn).await.map_err(failed)?;
                    read_rows(rows, columns, *raw, sql, $value)
                }
            }
        })
    }};
}

type Query<'q, DB> = sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>;

// ----- PostgreSQL -----

/// A `NULL` of no declared type: PostgreSQL infers the parameter's type from where it stands,
/// so a `NULL` binds into a column of any type.
struct UntypedNull;

impl sqlx::Type<Postgres> for UntypedNull {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(Oid(0))
    }
}

impl sqlx::Encode<'_, Postgres> for UntypedNull {
    fn encode_by_ref(
        &self,
        _: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        Ok(sqlx::encode::IsNull::Yes)
    }
}

fn pg_bind(query: Query<'_, Postgres>, value: Value) -> Query<'_, Postgres> {
    match value {
        Value::Null => query.bind(UntypedNull),
        Value::Bool(b) => query.bind(b),
        Value::Int(i) => query.bind(i),
        Value::Text(t) => query.bind(t),
        Value::Bytes(b) => query.bind(b),
    }
}

fn pg_value(row: &PgRow, i: usize) -> Result<Value, String> {
    let raw = row.try_get_raw(i).map_err(|e| e.to_string())?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let ty = raw.type_info().name().to_owned();
    let get = |e: sqlx::Error| e.to_string();
    Ok(match ty.as_str() {
        "INT2" => Value::Int(row.try_get::<i16, _>(i).map_err(get)?.into()),
        "INT4" => Value::Int(row.try_get::<i32, _>(i).map_err(get)?.into()),
        "INT8" => Value::Int(row.try_get::<i64, _>(i).map_err(get)?),
        "BOOL" => Value::Bool(row.try_get::<bool, _>(i).map_err(get)?),
        "BYTEA" => Value::Bytes(row.try_get::<Vec<u8>, _>(i).map_err(get)?),
        _ => match row.try_get::<String, _>(i) {
            Ok(text) => Value::Text(text),
            Err(_) => return Err(format!("PostgreSQL type {ty} has no value in the core")),
        },
    })
}

fn pg_kind(error: &sqlx::Error) -> ErrorKind {
    if let Some(kind) = common_kind(error) {
        return kind;
    }
    database_error(error)
        .and_then(|db| db.code())
        .map_or(ErrorKind::Other, |code| server::sqlstate_kind(&code))
}

impl SqlxDatabase for Postgres {
    type Family = ruststream_core::spec::Postgres;
    const PUBLISH_DIALECT: Dialect = Dialect::Postgres;

    fn run<'c>(
        conn: &'c mut PgConnection,
        statement: &'c Statement,
        binds: Vec<Value>,
    ) -> BoxFuture<'c, Result<Reply<PgRow>, DbError>> {
        run_statement!(Postgres, conn, statement, binds, pg_bind, pg_value)
    }

    fn dialect<'c>(conn: &'c mut PgConnection) -> BoxFuture<'c, Result<Dialect, String>> {
        Box::pin(async move {
            match conn.server_version_num() {
                Some(version) => server::dialect_of(Server::Postgres, &version.to_string())
                    .map_err(|e| e.to_string()),
                None => Ok(Dialect::Postgres),
            }
        })
    }

    fn error_kind(error: &sqlx::Error) -> ErrorKind {
        pg_kind(error)
    }

    fn listener(pool: &Pool<Self>) -> Option<Listener> {
        Some(Listener::new((*pool.connect_options()).clone()))
    }
}

// ----- MySQL and MariaDB -----

fn mysql_bind(query: Query<'_, MySql>, value: Value) -> Query<'_, MySql> {
    match value {
        Value::Null => query.bind(Option::<i64>::None),
        Value::Bool(b) => query.bind(b),
        Value::Int(i) => query.bind(i),
        Value::Text(t) => query.bind(t),
        Value::Bytes(b) => query.bind(b),
    }
}

/// Bytes as text where they are UTF-8: MySQL 8 sends some text (`information_schema` names,
/// keys built by `CONCAT`) as binary strings. Binding either back compares the same bytes.
fn utf8_or_bytes(bytes: Vec<u8>) -> Value {
    match String::from_utf8(bytes) {
        Ok(text) => Value::Text(text),
        Err(e) => Value::Bytes(e.into_bytes()),
    }
}

fn mysql_value(row: &MySqlRow, i: usize) -> Result<Value, String> {
    let raw = row.try_get_raw(i).map_err(|e| e.to_string())?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let ty = raw.type_info().name().to_owned();
    let get = |e: sqlx::Error| e.to_string();
    Ok(match ty.as_str() {
        "NULL" => Value::Null,
        "BOOLEAN" => Value::Bool(row.try_get_unchecked::<bool, _>(i).map_err(get)?),
        "TINYINT" | "SMALLINT" | "MEDIUMINT" | "INT" | "BIGINT" | "YEAR" => {
            Value::Int(row.try_get_unchecked::<i64, _>(i).map_err(get)?)
        }
        "TINYINT UNSIGNED" | "SMALLINT UNSIGNED" | "MEDIUMINT UNSIGNED" | "INT UNSIGNED"
        | "BIGINT UNSIGNED" => {
            let n = row.try_get_unchecked::<u64, _>(i).map_err(get)?;
            i64::try_from(n).map_or_else(|_| Value::Text(n.to_string()), Value::Int)
        }
        "BINARY" | "VARBINARY" | "TINYBLOB" | "BLOB" | "MEDIUMBLOB" | "LONGBLOB" => {
            utf8_or_bytes(row.try_get_unchecked::<Vec<u8>, _>(i).map_err(get)?)
        }
        "CHAR" | "VARCHAR" | "TINYTEXT" | "TEXT" | "MEDIUMTEXT" | "LONGTEXT" | "ENUM" | "SET"
        | "JSON" | "DECIMAL" => utf8_or_bytes(row.try_get_unchecked::<Vec<u8>, _>(i).map_err(get)?),
        _ => return Err(format!("MySQL type {ty} has no value in the core")),
    })
}

fn mysql_kind(error: &sqlx::Error) -> ErrorKind {
    if let Some(kind) = common_kind(error) {
        return kind;
    }
    let Some(db) = database_error(error) else {
        return ErrorKind::Other;
    };
    let code = db.code();
    match db.try_downcast_ref::<MySqlDatabaseError>() {
        Some(mysql) => server::mysql_error_kind(mysql.number(), code.as_deref()),
        None => code.map_or(ErrorKind::Other, |code| server::sqlstate_kind(&code)),
    }
}

impl SqlxDatabase for MySql {
    type Family = ruststream_core::spec::MySql;
    const PUBLISH_DIALECT: Dialect = Dialect::MySql;

    fn run<'c>(
        conn: &'c mut MySqlConnection,
        statement: &'c Statement,
        binds: Vec<Value>,
    ) -> BoxFuture<'c, Result<Reply<MySqlRow>, DbError>> {
        run_statement!(MySql, conn, statement, binds, mysql_bind, mysql_value)
    }

    /// MariaDB by its version text (`10.11.6-MariaDB-..`), MySQL otherwise; refuses MySQL
    /// before 8.0.1 and MariaDB before 10.6.
    fn dialect<'c>(conn: &'c mut MySqlConnection) -> BoxFuture<'c, Result<Dialect, String>> {
        Box::pin(async move {
            let row = sqlx::query("SELECT VERSION() AS version")
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| format!("SELECT VERSION() failed: {e}"))?;
            let version = match mysql_value(&row, 0)? {
                Value::Text(text) => text,
                other => return Err(format!("SELECT VERSION() answered {other}")),
            };
            server::dialect_of(Server::MySql, &version).map_err(|e| e.to_string())
        })
    }

    fn error_kind(error: &sqlx::Error) -> ErrorKind {
        mysql_kind(error)
    }

    fn listener(_: &Pool<Self>) -> Option<Listener> {
        None
    }
}

// ----- SQLite -----

fn sqlite_bind(query: Query<'_, Sqlite>, value: Value) -> Query<'_, Sqlite> {
    match value {
        Value::Null => query.bind(Option::<i64>::None),
        Value::Bool(b) => query.bind(b),
        Value::Int(i) => query.bind(i),
        Value::Text(t) => query.bind(t),
        Value::Bytes(b) => query.bind(b),
    }
}

/// A SQLite value by its storage class. The core has no floats: a `REAL` is the text of its
/// decimal form.
fn sqlite_value(row: &SqliteRow, i: usize) -> Result<Value, String> {
    let raw = row.try_get_raw(i).map_err(|e| e.to_string())?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let ty = raw.type_info().name().to_owned();
    let get = |e: sqlx::Error| e.to_string();
    Ok(match ty.as_str() {
        "INTEGER" | "BOOLEAN" => Value::Int(row.try_get_unchecked::<i64, _>(i).map_err(get)?),
        "REAL" => Value::Text(row.try_get_unchecked::<f64, _>(i).map_err(get)?.to_string()),
        "BLOB" => Value::Bytes(row.try_get_unchecked::<Vec<u8>, _>(i).map_err(get)?),
        _ => Value::Text(row.try_get_unchecked::<String, _>(i).map_err(get)?),
    })
}

fn sqlite_kind(error: &sqlx::Error) -> ErrorKind {
    if let Some(kind) = common_kind(error) {
        return kind;
    }
    let Some(db) = database_error(error) else {
        return ErrorKind::Other;
    };
    // sqlx reports the extended result code.
    let code = db.code().and_then(|c| c.parse::<i32>().ok()).unwrap_or(0);
    server::sqlite_error_kind(code, db.message())
}

impl SqlxDatabase for Sqlite {
    type Family = ruststream_core::spec::Sqlite;
    const PUBLISH_DIALECT: Dialect = Dialect::Sqlite;

    fn run<'c>(
        conn: &'c mut SqliteConnection,
        statement: &'c Statement,
        binds: Vec<Value>,
    ) -> BoxFuture<'c, Result<Reply<SqliteRow>, DbError>> {
        run_statement!(Sqlite, conn, statement, binds, sqlite_bind, sqlite_value)
    }

    /// SQLite 3.35 or later (`RETURNING`).
    fn dialect<'c>(conn: &'c mut SqliteConnection) -> BoxFuture<'c, Result<Dialect, String>> {
        Box::pin(async move {
            let version: String = sqlx::query_scalar("SELECT sqlite_version()")
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| format!("SELECT sqlite_version() failed: {e}"))?;
            server::dialect_of(Server::Sqlite, &version).map_err(|e| e.to_string())
        })
    }

    fn error_kind(error: &sqlx::Error) -> ErrorKind {
        sqlite_kind(error)
    }

    fn listener(_: &Pool<Self>) -> Option<Listener> {
        None
    }
}

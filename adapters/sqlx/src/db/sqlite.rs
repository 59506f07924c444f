//! SQLite (the `sqlite` feature): binds, values, error kinds and the server's dialect.

use ruststream_core::server::{self, Server};
use ruststream_core::{DbError, Dialect, ErrorKind, Output, Reply, Statement, Value};
use sqlx::sqlite::{Sqlite, SqliteConnection, SqliteRow};
use sqlx::{AssertSqlSafe, Row, TypeInfo, ValueRef};

use super::{BoxFuture, Query, SqlxDatabase, common_kind, database_error, db_error, read_rows};
use crate::listen::Listener;

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
        _simple: bool,
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

    fn listener(_: crate::broker::ConnectOptionsOf<Self>) -> Option<Listener> {
        None
    }
}

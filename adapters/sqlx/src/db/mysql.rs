//! MySQL and MariaDB (the `mysql` feature): binds, values, error kinds and the server's
//! dialect.

use ruststream_core::server::{self, Server};
use ruststream_core::{DbError, Dialect, ErrorKind, Output, Reply, Statement, Value};
use sqlx::mysql::{MySql, MySqlConnection, MySqlDatabaseError, MySqlRow};
use sqlx::{AssertSqlSafe, Row, TypeInfo, ValueRef};

use super::{BoxFuture, Query, SqlxDatabase, common_kind, database_error, db_error, read_rows};
use crate::listen::Listener;

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
        _simple: bool,
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

    fn listener(_: crate::broker::ConnectOptionsOf<Self>) -> Option<Listener> {
        None
    }
}

//! PostgreSQL (the `postgres` feature): binds, values, error kinds and the server's dialect.

use ruststream_core::server::{self, Server};
use ruststream_core::{DbError, Dialect, ErrorKind, Output, Reply, Statement, Value};
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgRow, PgTypeInfo, PgValueFormat, Postgres};
use sqlx::{AssertSqlSafe, Row, TypeInfo, ValueRef};

use super::{BoxFuture, Query, SqlxDatabase, common_kind, database_error, db_error, read_rows};
use crate::listen::Listener;

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

/// A column as the core reads it: integers, booleans and `bytea` as themselves, text as text.
// A row of the extended protocol comes in binary, where only text types read as text; a row
// of the simple query protocol comes as text, which sqlx parses for the integers, booleans
// and `bytea` (its `\x` hex form), and where a column of any other type (a `uuid` id, a
// `numeric`) reads as its text, as the extended protocol cannot.
fn pg_value(row: &PgRow, i: usize) -> Result<Value, String> {
    let raw = row.try_get_raw(i).map_err(|e| e.to_string())?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let ty = raw.type_info().name().to_owned();
    let text = match raw.format() {
        PgValueFormat::Text => Some(raw.as_str().map_err(|e| e.to_string())?.to_owned()),
        PgValueFormat::Binary => None,
    };
    let get = |e: sqlx::Error| e.to_string();
    Ok(match ty.as_str() {
        "INT2" => Value::Int(row.try_get::<i16, _>(i).map_err(get)?.into()),
        "INT4" => Value::Int(row.try_get::<i32, _>(i).map_err(get)?.into()),
        "INT8" => Value::Int(row.try_get::<i64, _>(i).map_err(get)?),
        "BOOL" => Value::Bool(row.try_get::<bool, _>(i).map_err(get)?),
        "BYTEA" => Value::Bytes(row.try_get::<Vec<u8>, _>(i).map_err(get)?),
        _ => match text.map_or_else(|| row.try_get::<String, _>(i).ok(), Some) {
            Some(text) => Value::Text(text),
            None => return Err(format!("PostgreSQL type {ty} has no value in the core")),
        },
    })
}

/// Runs a statement under the simple query protocol: its binds written into its text as
/// literals ([`Statement::inline_binds`]), nothing prepared, so a pooler in transaction
/// pooling may hand each statement to any server session. Its rows come back as text.
fn run_simple<'c>(
    conn: &'c mut PgConnection,
    statement: &'c Statement,
    binds: Vec<Value>,
) -> BoxFuture<'c, Result<Reply<PgRow>, DbError>> {
    Box::pin(async move {
        let sql = statement.inline_binds(&binds)?;
        let query = sqlx::raw_sql(AssertSqlSafe(sql));
        let failed = |e: sqlx::Error| db_error::<Postgres>(&e);
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
                read_rows(rows, columns, *raw, &statement.sql, pg_value)
            }
        }
    })
}

fn pg_kind(error: &sqlx::Error) -> ErrorKind {
    // sqlx fails a statement whose server session sends a notification to a connection that
    // listens for none: the session is another client's too, one that ran `LISTEN` (a pooler
    // in transaction pooling); the queue's own connections never listen.
    if let sqlx::Error::Protocol(message) = error
        && message.contains("NotificationResponse")
    {
        return ErrorKind::SharedSession;
    }
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
        simple: bool,
    ) -> BoxFuture<'c, Result<Reply<PgRow>, DbError>> {
        if simple {
            return run_simple(conn, statement, binds);
        }
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

    fn listener(options: PgConnectOptions) -> Option<Listener> {
        Some(Listener::new(options))
    }
}

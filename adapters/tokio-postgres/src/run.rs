//! Running one statement on a pooled client: under the extended query protocol (prepared and
//! cached, with binds at the types the server inferred) or the simple query protocol (binds
//! rendered as literals).

use std::error::Error as StdError;

use bytes::BytesMut;
use deadpool_postgres::ClientWrapper;
use ruststream_core::{DbError, ErrorKind, OutColumn, Output, Reply, Row, Statement, Value};
use tokio_postgres::SimpleQueryMessage;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{Format, IsNull, ToSql, Type, to_sql_checked};

use crate::error::db_error;
use crate::row::PgRow;

/// A bind as it goes to the server: binary at the type the server inferred for its
/// placeholder, or the value's text, which the server parses as that type (a `uuid`, a
/// `numeric`, an integer into a text column).
#[derive(Debug)]
enum Param<'a> {
    Null,
    Bool(bool),
    I16(i16),
    I32(i32),
    I64(i64),
    Str(&'a str),
    Bytes(&'a [u8]),
    Text(String),
}

impl<'a> Param<'a> {
    fn of(value: &'a Value, ty: &Type) -> Result<Self, DbError> {
        let range = |i: i64, name: &str| {
            DbError::new(
                ErrorKind::Other,
                format!("the value {i} does not fit the placeholder's type `{name}`"),
            )
        };
        Ok(match value {
            Value::Null => Param::Null,
            Value::Bool(b) if *ty == Type::BOOL => Param::Bool(*b),
            Value::Bool(b) => Param::Text(b.to_string()),
            Value::Int(i) => match *ty {
                Type::INT2 => Param::I16(i16::try_from(*i).map_err(|_| range(*i, "smallint"))?),
                Type::INT4 => Param::I32(i32::try_from(*i).map_err(|_| range(*i, "integer"))?),
                Type::INT8 => Param::I64(*i),
                _ => Param::Text(i.to_string()),
            },
            Value::Text(text) if <&str as ToSql>::accepts(ty) => Param::Str(text),
            Value::Text(text) => Param::Text(text.clone()),
            Value::Bytes(bytes) if *ty == Type::BYTEA => Param::Bytes(bytes),
            Value::Bytes(bytes) => match std::str::from_utf8(bytes) {
                // A payload column of `jsonb` or `text` takes the bytes as text.
                Ok(text) => Param::Text(text.to_owned()),
                Err(_) => {
                    return Err(DbError::new(
                        ErrorKind::Other,
                        format!(
                            "bytes that are not UTF-8 text do not bind to a placeholder of type `{}`; make the column `bytea`",
                            ty.name()
                        ),
                    ));
                }
            },
        })
    }
}

impl ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        match self {
            Param::Null => Ok(IsNull::Yes),
            Param::Bool(b) => b.to_sql(ty, out),
            Param::I16(i) => i.to_sql(ty, out),
            Param::I32(i) => i.to_sql(ty, out),
            Param::I64(i) => i.to_sql(ty, out),
            Param::Str(text) => text.to_sql(ty, out),
            Param::Bytes(bytes) => bytes.to_sql(ty, out),
            Param::Text(text) => {
                out.extend_from_slice(text.as_bytes());
                Ok(IsNull::No)
            }
        }
    }

    fn accepts(_: &Type) -> bool {
        // `Param::of` picked the variant for the type.
        true
    }

    fn encode_format(&self, _ty: &Type) -> Format {
        match self {
            Param::Text(_) => Format::Text,
            _ => Format::Binary,
        }
    }

    to_sql_checked!();
}

/// Whether a failure came from a prepared statement the server no longer knows in that form
/// (its table was altered or recreated): the cache drops it and a retry prepares it anew.
fn stale_statement(error: &tokio_postgres::Error) -> bool {
    match error.as_db_error() {
        Some(db) => {
            (*db.code() == SqlState::FEATURE_NOT_SUPPORTED && db.message().contains("cached plan"))
                || *db.code() == SqlState::INVALID_SQL_STATEMENT_NAME
        }
        None => false,
    }
}

/// Runs a statement. `in_tx`: the connection is in a transaction, where a failed statement
/// cannot be retried.
pub(crate) async fn statement(
    client: &ClientWrapper,
    statement: &Statement,
    binds: &[Value],
    simple: bool,
    in_tx: bool,
) -> Reply<PgRow> {
    let result = if simple {
        run_simple(client, statement, binds).await
    } else {
        match run_extended(client, statement, binds).await {
            Err(error) if !in_tx && stale_statement(&error) => {
                client.statement_cache.remove(&statement.sql, &[]);
                run_extended(client, statement, binds)
                    .await
                    .map_err(Failure::Driver)
            }
            other => other.map_err(Failure::Driver),
        }
        .and_then(|reply| reply)
    };
    match result {
        Ok(reply) => reply,
        Err(Failure::Driver(error)) => Reply::Failed(db_error(&error)),
        Err(Failure::Db(error)) => Reply::Failed(error),
    }
}

enum Failure {
    Driver(tokio_postgres::Error),
    Db(DbError),
}

impl From<DbError> for Failure {
    fn from(error: DbError) -> Self {
        Failure::Db(error)
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(error: tokio_postgres::Error) -> Self {
        Failure::Driver(error)
    }
}

/// Runs a prepared statement. The outer error is the driver's (which a stale statement may
/// retry); the inner one is the adapter's own.
async fn run_extended(
    client: &ClientWrapper,
    statement: &Statement,
    binds: &[Value],
) -> Result<Result<Reply<PgRow>, Failure>, tokio_postgres::Error> {
    if binds.is_empty() && statement.output == Output::Nothing {
        // BEGIN, COMMIT, ROLLBACK: nothing to prepare.
        client.batch_execute(&statement.sql).await?;
        return Ok(Ok(Reply::Done));
    }
    let prepared = client.prepare_cached(&statement.sql).await?;
    let params = match params(&prepared, statement, binds) {
        Ok(params) => params,
        Err(error) => return Ok(Err(Failure::Db(error))),
    };
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
    Ok(Ok(match &statement.output {
        Output::Nothing => {
            client.execute(&prepared, &refs).await?;
            Reply::Done
        }
        Output::Affected => Reply::Affected(client.execute(&prepared, &refs).await?),
        Output::Rows { columns, raw } => {
            let rows = client.query(&prepared, &refs).await?;
            match rows_of(rows.into_iter().map(PgRow::from), columns, *raw, statement) {
                Ok(rows) => Reply::Rows(rows),
                Err(error) => return Ok(Err(Failure::Db(error))),
            }
        }
    }))
}

/// Runs a statement that answers rows on a client of the service's own (a pool's, for the
/// counts of a table), reading them as its output says.
pub(crate) async fn rows_on_client(
    client: &impl tokio_postgres::GenericClient,
    statement: &Statement,
    binds: &[Value],
) -> Result<Vec<ruststream_core::Row<PgRow>>, DbError> {
    let prepared = client
        .prepare(&statement.sql)
        .await
        .map_err(|e| db_error(&e))?;
    let params = params(&prepared, statement, binds)?;
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
    let rows = client
        .query(&prepared, &refs)
        .await
        .map_err(|e| db_error(&e))?;
    match &statement.output {
        Output::Rows { columns, raw } => {
            rows_of(rows.into_iter().map(PgRow::from), columns, *raw, statement)
        }
        Output::Nothing | Output::Affected => Ok(Vec::new()),
    }
}

/// Runs a statement that answers no rows on a client of the service's own (its transaction,
/// for a publish): prepared on it, each bind converted to the type its placeholder takes.
pub(crate) async fn on_client(
    client: &impl tokio_postgres::GenericClient,
    statement: &Statement,
    binds: &[Value],
) -> Result<u64, DbError> {
    let prepared = client
        .prepare(&statement.sql)
        .await
        .map_err(|e| db_error(&e))?;
    let params = params(&prepared, statement, binds)?;
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
    client
        .execute(&prepared, &refs)
        .await
        .map_err(|e| db_error(&e))
}

/// The binds of a prepared statement, each as the type of its placeholder.
fn params<'a>(
    prepared: &tokio_postgres::Statement,
    statement: &Statement,
    binds: &'a [Value],
) -> Result<Vec<Param<'a>>, DbError> {
    if prepared.params().len() != binds.len() {
        return Err(DbError::new(
            ErrorKind::Other,
            format!(
                "the statement has {} placeholders but {} binds: {}",
                prepared.params().len(),
                binds.len(),
                statement.sql
            ),
        ));
    }
    binds
        .iter()
        .zip(prepared.params())
        .map(|(value, ty)| Param::of(value, ty))
        .collect::<Result<Vec<Param<'_>>, DbError>>()
        .map_err(|mut error| {
            error.message = format!("{}: {}", error.message, statement.sql);
            error
        })
}

/// Runs a statement under the simple query protocol, its binds rendered as literals.
async fn run_simple(
    client: &ClientWrapper,
    statement: &Statement,
    binds: &[Value],
) -> Result<Reply<PgRow>, Failure> {
    let sql = statement.inline_binds(binds)?;
    let messages = client.simple_query(&sql).await?;
    Ok(match &statement.output {
        Output::Nothing => Reply::Done,
        Output::Affected => Reply::Affected(
            messages
                .iter()
                .rev()
                .find_map(|m| match m {
                    SimpleQueryMessage::CommandComplete(n) => Some(*n),
                    _ => None,
                })
                .unwrap_or(0),
        ),
        Output::Rows { columns, raw } => {
            let rows = messages.into_iter().filter_map(|m| match m {
                SimpleQueryMessage::Row(row) => Some(PgRow::from(row)),
                _ => None,
            });
            Reply::Rows(rows_of(rows, columns, *raw, statement)?)
        }
    })
}

fn rows_of(
    rows: impl Iterator<Item = PgRow>,
    columns: &[OutColumn],
    raw: bool,
    statement: &Statement,
) -> Result<Vec<Row<PgRow>>, DbError> {
    let names = |row: &PgRow| row.columns().into_iter().map(str::to_owned).collect();
    ruststream_core::read_rows(rows, columns, raw, &statement.sql, names, PgRow::core_value)
}

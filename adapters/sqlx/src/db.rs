//! What differs between the three sqlx databases: how a core value binds, how a column reads
//! into a core value, which driver errors mean what, and which dialect a server speaks.

use std::sync::Arc;

use futures::future::BoxFuture;
use ruststream_core::{
    ColumnType, DbError, Dialect, ErrorKind, OutColumn, Reply, Statement, Value,
};
use sqlx::error::DatabaseError;
use sqlx::{Column, Row};

use crate::broker::ConnectOptionsOf;
use crate::listen::Listener;

mod sealed {
    pub trait Sealed {}
    #[cfg(feature = "postgres")]
    impl Sealed for sqlx::Postgres {}
    #[cfg(feature = "mysql")]
    impl Sealed for sqlx::MySql {}
    #[cfg(feature = "sqlite")]
    impl Sealed for sqlx::Sqlite {}
}

/// A database [`SqlxBroker`](crate::SqlxBroker) runs on: [`sqlx::Postgres`], [`sqlx::MySql`]
/// (MySQL and MariaDB) or [`sqlx::Sqlite`]. Sealed; a table in the row lock form does not
/// compile on SQLite, which has no row locks.
// The trait's methods are the adapter's own, per database, and hidden from the documentation.
// `Family` is the database as the core's description rules see it.
pub trait SqlxDatabase: sqlx::Database + sealed::Sealed {
    /// The database family whose rules a table's description keeps
    /// ([`ruststream_core::spec::ValidOn`]).
    type Family: ruststream_core::spec::Database;

    /// The dialect a publish renders in before any server has answered: MySQL and MariaDB
    /// write their rows with the same statements.
    #[doc(hidden)]
    const PUBLISH_DIALECT: Dialect;

    /// Runs `statement` with `binds` on `conn` and reads the reply as its output says. `simple`
    /// (PostgreSQL): under the simple query protocol, the binds written into the text as
    /// literals, nothing prepared; the other databases never get it.
    #[doc(hidden)]
    fn run<'c>(
        conn: &'c mut Self::Connection,
        statement: &'c Statement,
        binds: Vec<Value>,
        simple: bool,
    ) -> BoxFuture<'c, Result<Reply<Self::Row>, DbError>>;

    /// The server's dialect, or why the server does not serve the queue.
    #[doc(hidden)]
    fn dialect<'c>(conn: &'c mut Self::Connection) -> BoxFuture<'c, Result<Dialect, String>>;

    /// The kind of a driver error of this database.
    #[doc(hidden)]
    fn error_kind(error: &sqlx::Error) -> ErrorKind;

    /// The sessions that hear of rows other processes publish, on connections of these
    /// options: PostgreSQL's `LISTEN`; `None` where the database notifies of no publish.
    #[doc(hidden)]
    fn listener(options: ConnectOptionsOf<Self>) -> Option<Listener>;
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
        sqlx::Error::Configuration(_) => ErrorKind::Config,
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

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

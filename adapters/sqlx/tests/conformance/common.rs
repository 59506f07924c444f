//! What the three harnesses of the sqlx adapter share: their brokers' pool settings, reading
//! the answer of a query, publishing through the outbox, and writing in a claim.

use std::time::Duration;

use ruststream::{
    Context, FromContext, HandlerOutcome, InboxContext, InboxTable, Message, Published, Stats,
};
use ruststream_conformance::session::{Session, SqlRow};
use ruststream_conformance::{HarnessFuture, HarnessResult, TxEnd};
use ruststream_core::Value;
use ruststream_sqlx::{SqlxClaim, SqlxDatabase, SqlxOutbox};
use sqlx::{AssertSqlSafe, Column, ColumnIndex, Decode, Row, ValueRef};

/// The most connections a broker's pool opens: the most workers of a scenario, a claim and a
/// publish, and room.
pub(crate) const POOL: u32 = 16;

/// How long a broker's pool waits for a connection.
pub(crate) const ACQUIRE: Duration = Duration::from_secs(10);

/// The first column of each row as an integer; a `NULL` is an error.
pub(crate) fn first_column<R>(rows: &[R], sql: &str) -> HarnessResult<Vec<i64>>
where
    R: Row,
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database>,
{
    rows.iter()
        .map(|row| -> HarnessResult<i64> {
            if row.try_get_raw(0)?.is_null() {
                return Err(format!("`{sql}` answered NULL").into());
            }
            Ok(row.try_get_unchecked::<i64, _>(0)?)
        })
        .collect()
}

/// In one transaction on `conn`: runs `sql`, publishes `messages` into `T`'s table through
/// [`SqlxOutbox`], and ends as `end` says; then closes the connection.
pub(crate) async fn publish_in_transaction<DB, T>(
    mut conn: DB::Connection,
    sql: &str,
    messages: Vec<Message>,
    end: TxEnd,
) -> HarnessResult<Published>
where
    DB: SqlxDatabase,
    T: InboxTable,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let mut tx = sqlx::Connection::begin(&mut conn).await?;
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(&mut *tx)
        .await?;
    let published = SqlxOutbox::<T, DB>::new()
        .publish_all(&mut tx, messages)
        .await?;
    match end {
        TxEnd::Commit => tx.commit().await?,
        TxEnd::Rollback => tx.rollback().await?,
        TxEnd::Crash => ruststream_conformance::abort_in_transaction(),
    }
    sqlx::Connection::close(conn).await?;
    Ok(published)
}

/// Publishes `messages` into `T`'s table through [`SqlxOutbox::publish_on`], on a pool of its
/// own at `url`, with no broker running.
pub(crate) async fn publish_without_broker<DB, T>(
    url: &str,
    messages: Vec<Message>,
) -> HarnessResult<Published>
where
    DB: SqlxDatabase,
    T: InboxTable,
{
    let pool = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(2)
        .connect(url)
        .await?;
    let published = SqlxOutbox::<T, DB>::new().publish_on(&pool, messages).await;
    pool.close().await;
    Ok(published?)
}

/// `T`'s table's counts through [`SqlxOutbox::stats`], on a pool of its own at `url`, with no
/// broker running.
pub(crate) async fn outbox_stats<DB, T>(url: &str) -> HarnessResult<Stats>
where
    DB: SqlxDatabase,
    T: InboxTable,
{
    let pool = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(2)
        .connect(url)
        .await?;
    let stats = SqlxOutbox::<T, DB>::new().stats(&pool).await;
    pool.close().await;
    Ok(stats?)
}

/// Runs `sql` in the transaction the delivery of `ctx` lends its handler ([`SqlxClaim`]).
pub(crate) async fn write_in_claim<DB>(
    ctx: &mut Context<'_, InboxContext>,
    sql: String,
) -> Result<(), HandlerOutcome>
where
    DB: SqlxDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let mut claim = SqlxClaim::<DB>::from_context(ctx).await?;
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *claim)
        .await
        .map(drop)
        .map_err(|e| HandlerOutcome::retry().with_error(e))
}

/// A query with its binds, as sqlx builds it for `DB`.
pub(crate) type Query<'q, DB> = sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>;

/// The suite's session on one sqlx connection: each bind and column converted by the
/// database's own functions, `bind`, `value` and `affected`.
pub(crate) struct SqlxSession<DB: sqlx::Database> {
    pub(crate) conn: DB::Connection,
    pub(crate) bind: for<'q> fn(Query<'q, DB>, Value) -> Query<'q, DB>,
    pub(crate) value: fn(&DB::Row, usize) -> HarnessResult<Value>,
    pub(crate) affected: fn(&DB::QueryResult) -> u64,
}

impl<DB> SqlxSession<DB>
where
    DB: sqlx::Database,
{
    fn build<'q>(&self, sql: &'q str, binds: &[Value]) -> Query<'q, DB> {
        let query = sqlx::query(AssertSqlSafe(sql));
        binds.iter().cloned().fold(query, self.bind)
    }
}

impl<DB> Session for SqlxSession<DB>
where
    DB: sqlx::Database,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    fn query<'a>(&'a mut self, sql: &'a str, binds: &'a [Value]) -> HarnessFuture<'a, Vec<SqlRow>> {
        Box::pin(async move {
            let query = self.build(sql, binds);
            let rows = query.fetch_all(&mut self.conn).await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                let mut cells = Vec::new();
                for (i, column) in row.columns().iter().enumerate() {
                    cells.push((column.name().to_owned(), (self.value)(row, i)?));
                }
                out.push(SqlRow(cells));
            }
            Ok(out)
        })
    }

    fn execute<'a>(&'a mut self, sql: &'a str, binds: &'a [Value]) -> HarnessFuture<'a, u64> {
        Box::pin(async move {
            let query = self.build(sql, binds);
            let done = query.execute(&mut self.conn).await?;
            Ok((self.affected)(&done))
        })
    }
}

/// A bind as MySQL and SQLite take it: a `NULL` as an integer's, which either binds into a
/// column of any type.
#[allow(
    dead_code,
    reason = "the PostgreSQL targets bind a NULL of no type instead"
)]
pub(crate) fn bind<DB>(query: Query<'_, DB>, value: Value) -> Query<'_, DB>
where
    DB: sqlx::Database,
    i64: for<'a> sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    bool: for<'a> sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    String: for<'a> sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    Vec<u8>: for<'a> sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    Option<i64>: for<'a> sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    match value {
        Value::Null => query.bind(Option::<i64>::None),
        Value::Bool(b) => query.bind(b),
        Value::Int(i) => query.bind(i),
        Value::Text(t) => query.bind(t),
        Value::Bytes(b) => query.bind(b),
    }
}

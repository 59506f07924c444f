//! Publishing in the service's own transaction, or on a pool with no broker running:
//! [`SqlxOutbox`].

use std::marker::PhantomData;

use ruststream::{InboxTable, IntoRow, Outbox, Published, Stats};
use ruststream_core::{Reply, Statement, Value};
use sqlx::pool::PoolConnection;
use sqlx::{Pool, Transaction};

use crate::SqlxBrokerError;
use crate::db::SqlxDatabase;

/// Publishes jobs into `T`'s table in a transaction the service holds, so a job commits with
/// the data it is about (the outbox), or on a connection with no broker running
/// ([Outbox](https://github.com/ruststream/ruststream/blob/main/docs/src/publishing.md#the-outbox-in-the-services-own-transaction)).
///
/// ```no_run
/// # use ruststream_sqlx::prelude::*;
/// # use ruststream_sqlx::SqlxOutbox;
/// # #[derive(sqlx::FromRow)]
/// # struct SendReceipt { id: i64, payload: Vec<u8> }
/// # impl InboxTable for SendReceipt {
/// #     type Id = i64;
/// #     type Table = InboxSpec<(Payload,)>;
/// #     const TABLE: Self::Table =
/// #         InboxSpec::new("receipt_jobs", Column::new("id").generated()).payload(Column::new("payload"));
/// #     fn id(&self) -> &i64 { &self.id }
/// # }
/// # #[derive(serde::Serialize)]
/// # struct Receipt { order: i64 }
/// async fn place_order(pool: &sqlx::PgPool, order: i64) -> Result<(), Box<dyn std::error::Error>> {
///     let mut tx = pool.begin().await?;
///     sqlx::query("INSERT INTO orders (id) VALUES ($1)").bind(order).execute(&mut *tx).await?;
///     // The job commits with the order, or neither does.
///     SqlxOutbox::<SendReceipt, Postgres>::new()
///         .publish(&mut tx, Message::json(&Receipt { order })?)
///         .await?;
///     tx.commit().await?;
///     Ok(())
/// }
/// ```
// On PostgreSQL the notification that wakes other processes' subscriptions rides in the
// service's transaction, so they hear of the rows when it commits.
pub struct SqlxOutbox<T, DB: SqlxDatabase> {
    outbox: Outbox<T>,
    /// PostgreSQL's simple query protocol ([`SqlxOutbox::simple_query`]).
    simple: bool,
    db: PhantomData<fn() -> DB>,
}

impl<T, DB: SqlxDatabase> std::fmt::Debug for SqlxOutbox<T, DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlxOutbox")
            .field("row", &std::any::type_name::<T>())
            .field("database", &DB::NAME)
            .field("simple_query", &self.simple)
            .finish()
    }
}

impl<T: InboxTable, DB: SqlxDatabase> Default for SqlxOutbox<T, DB> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: InboxTable, DB: SqlxDatabase> SqlxOutbox<T, DB> {
    /// `T`'s outbox on `DB`. Nothing connects.
    pub fn new() -> Self {
        Self {
            outbox: Outbox::new(DB::PUBLISH_DIALECT),
            simple: false,
            db: PhantomData,
        }
    }

    /// Publishes one row in the transaction, or on the connection, `on` names: it commits
    /// with the transaction, or on its own on a connection outside one.
    pub async fn publish(
        &self,
        on: &mut impl OnConnection<DB>,
        message: impl IntoRow<T>,
    ) -> Result<Published, SqlxBrokerError> {
        self.publish_all(on, [message]).await
    }

    /// Publishes rows in the transaction, or on the connection, `on` names: inside a
    /// transaction every row is written or, when it rolls back, none is.
    pub async fn publish_all(
        &self,
        on: &mut impl OnConnection<DB>,
        messages: impl IntoIterator<Item = impl IntoRow<T>>,
    ) -> Result<Published, SqlxBrokerError> {
        let statements = self.outbox.statements(messages)?;
        let written = run_all::<DB>(on.connection(), statements, self.simple).await?;
        Ok(self.outbox.published(&written))
    }

    /// Publishes rows on a connection of `pool`, with no broker running (a service that only
    /// enqueues): one insert commits on its own, several run in one transaction. A pool of
    /// connect options alone opens lazily: `PgPoolOptions::new().connect_lazy_with(options)`.
    pub async fn publish_on(
        &self,
        pool: &Pool<DB>,
        messages: impl IntoIterator<Item = impl IntoRow<T>>,
    ) -> Result<Published, SqlxBrokerError> {
        let statements = self.outbox.statements(messages)?;
        let failed = |e: sqlx::Error| SqlxBrokerError::Db(crate::db::db_error::<DB>(&e));
        let written = if statements.len() > 1 {
            let mut tx = pool.begin().await.map_err(failed)?;
            let written = run_all::<DB>(&mut tx, statements, self.simple).await?;
            tx.commit().await.map_err(failed)?;
            written
        } else {
            let mut conn = pool.acquire().await.map_err(failed)?;
            run_all::<DB>(&mut conn, statements, self.simple).await?
        };
        Ok(self.outbox.published(&written))
    }
}

#[cfg(feature = "postgres")]
impl<T: InboxTable> SqlxOutbox<T, sqlx::Postgres> {
    /// Writes its rows under PostgreSQL's simple query protocol (`true`) instead of sqlx's
    /// prepared statements (`false`, the default), for a pooler in transaction pooling, as
    /// [`SqlxBroker::simple_query`](crate::SqlxBroker::simple_query).
    pub fn simple_query(mut self, simple: bool) -> Self {
        self.simple = simple;
        self
    }
}

impl<T: InboxTable, DB: SqlxDatabase> SqlxOutbox<T, DB> {
    /// `T`'s table's counts now, read on a connection of `pool` with no broker running, in
    /// one statement ([Stats](https://github.com/ruststream/ruststream/blob/main/docs/src/operating.md#stats)).
    pub async fn stats(&self, pool: &Pool<DB>) -> Result<Stats, SqlxBrokerError> {
        let (statement, binds) = self.outbox.stats_statement();
        let failed = |e: sqlx::Error| SqlxBrokerError::Db(crate::db::db_error::<DB>(&e));
        let mut conn = pool.acquire().await.map_err(failed)?;
        let values = match DB::run(&mut conn, &statement, binds, self.simple).await {
            Ok(Reply::Rows(rows)) => rows.into_iter().next().map(|r| r.values),
            Ok(Reply::Failed(error)) | Err(error) => return Err(SqlxBrokerError::Db(error)),
            Ok(_) => None,
        };
        self.outbox.stats(&values.unwrap_or_default())
    }
}

/// Runs the statements in order; answers the rows each wrote.
async fn run_all<DB: SqlxDatabase>(
    conn: &mut DB::Connection,
    statements: Vec<(Statement, Vec<Value>)>,
    simple: bool,
) -> Result<Vec<u64>, SqlxBrokerError> {
    let mut written = Vec::with_capacity(statements.len());
    for (statement, binds) in statements {
        match DB::run(conn, &statement, binds, simple).await {
            Ok(Reply::Failed(error)) | Err(error) => return Err(SqlxBrokerError::Db(error)),
            Ok(Reply::Affected(n)) => written.push(n),
            Ok(_) => written.push(1),
        }
    }
    Ok(written)
}

/// A connection or a transaction of `DB` a publish runs on: the database's connection
/// (`PgConnection`, `MySqlConnection`, `SqliteConnection`), a [`Transaction`], or a
/// [`PoolConnection`].
pub trait OnConnection<DB: SqlxDatabase>: Send {
    /// The connection the statements run on.
    fn connection(&mut self) -> &mut DB::Connection;
}

impl<DB: SqlxDatabase> OnConnection<DB> for Transaction<'_, DB> {
    fn connection(&mut self) -> &mut DB::Connection {
        self
    }
}

impl<DB: SqlxDatabase> OnConnection<DB> for PoolConnection<DB> {
    fn connection(&mut self) -> &mut DB::Connection {
        self
    }
}

#[cfg(feature = "postgres")]
impl OnConnection<sqlx::Postgres> for sqlx::PgConnection {
    fn connection(&mut self) -> &mut sqlx::PgConnection {
        self
    }
}

#[cfg(feature = "mysql")]
impl OnConnection<sqlx::MySql> for sqlx::MySqlConnection {
    fn connection(&mut self) -> &mut sqlx::MySqlConnection {
        self
    }
}

#[cfg(feature = "sqlite")]
impl OnConnection<sqlx::Sqlite> for sqlx::SqliteConnection {
    fn connection(&mut self) -> &mut sqlx::SqliteConnection {
        self
    }
}

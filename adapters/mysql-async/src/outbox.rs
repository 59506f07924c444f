//! Publishing in the service's own transaction, or on a pool with no broker running:
//! [`MySqlAsyncOutbox`].

use mysql_async::prelude::Queryable;
use mysql_async::{Pool, TxOpts};
use ruststream::{InboxTable, IntoRow, Outbox, Published, Stats};
use ruststream_core::{Dialect, Reply, Statement, Value};

use crate::MySqlAsyncBrokerError;
use crate::value::{db_error, params};

/// Publishes jobs into `T`'s table in a transaction the service holds, so a job commits with
/// the data it is about (the outbox), or on a connection with no broker running. Other
/// processes find the jobs at their next poll ([Outbox](https://github.com/ruststream/ruststream/blob/main/docs/src/publishing.md#the-outbox-in-the-services-own-transaction)).
///
/// ```no_run
/// # use ruststream_mysql_async::prelude::*;
/// # use ruststream_mysql_async::MySqlAsyncOutbox;
/// # #[derive(FromRow)]
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
/// async fn place_order(conn: &mut Conn, order: i64) -> Result<(), Box<dyn std::error::Error>> {
///     let mut tx = conn.start_transaction(Default::default()).await?;
///     tx.exec_drop("INSERT INTO orders (id) VALUES (?)", (order,)).await?;
///     // The job commits with the order, or neither does.
///     MySqlAsyncOutbox::<SendReceipt>::new()
///         .publish(&mut tx, Message::json(&Receipt { order })?)
///         .await?;
///     tx.commit().await?;
///     Ok(())
/// }
/// ```
pub struct MySqlAsyncOutbox<T> {
    outbox: Outbox<T>,
}

impl<T> std::fmt::Debug for MySqlAsyncOutbox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlAsyncOutbox")
            .field("row", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T: InboxTable> Default for MySqlAsyncOutbox<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: InboxTable> MySqlAsyncOutbox<T> {
    /// `T`'s outbox, on MySQL or MariaDB (they write rows with the same statements). Nothing
    /// connects.
    pub fn new() -> Self {
        Self {
            outbox: Outbox::new(Dialect::MySql),
        }
    }

    /// Publishes one row in the transaction, or on the connection, `conn` names (a
    /// [`mysql_async::Transaction`] or a [`mysql_async::Conn`]): it commits with the
    /// transaction, or on its own outside one.
    pub async fn publish(
        &self,
        conn: &mut impl Queryable,
        message: impl IntoRow<T>,
    ) -> Result<Published, MySqlAsyncBrokerError> {
        self.publish_all(conn, [message]).await
    }

    /// Publishes rows in the transaction, or on the connection, `conn` names: inside a
    /// transaction every row is written or, when it rolls back, none is.
    pub async fn publish_all(
        &self,
        conn: &mut impl Queryable,
        messages: impl IntoIterator<Item = impl IntoRow<T>>,
    ) -> Result<Published, MySqlAsyncBrokerError> {
        let written = run_all(conn, self.outbox.statements(messages)?).await?;
        Ok(self.outbox.published(&written))
    }

    /// Publishes rows on a connection of `pool`, with no broker running (a service that only
    /// enqueues): one insert commits on its own, several run in one transaction.
    pub async fn publish_on(
        &self,
        pool: &Pool,
        messages: impl IntoIterator<Item = impl IntoRow<T>>,
    ) -> Result<Published, MySqlAsyncBrokerError> {
        let statements = self.outbox.statements(messages)?;
        let failed = |e: mysql_async::Error| MySqlAsyncBrokerError::Db(db_error(&e));
        let mut conn = pool.get_conn().await.map_err(failed)?;
        let written = if statements.len() > 1 {
            let mut tx = conn
                .start_transaction(TxOpts::default())
                .await
                .map_err(failed)?;
            let written = run_all(&mut tx, statements).await?;
            tx.commit().await.map_err(failed)?;
            written
        } else {
            run_all(&mut conn, statements).await?
        };
        Ok(self.outbox.published(&written))
    }

    /// `T`'s table's counts now ([`Stats`]), read on a connection of `pool` with no broker
    /// running, in one statement whose counts stop at
    /// [`STATS_CAP`](ruststream::core::STATS_CAP) rows.
    pub async fn stats(&self, pool: &Pool) -> Result<Stats, MySqlAsyncBrokerError> {
        let (statement, binds) = self.outbox.stats_statement();
        let failed = |e: mysql_async::Error| MySqlAsyncBrokerError::Db(db_error(&e));
        let mut conn = pool.get_conn().await.map_err(failed)?;
        let values = match crate::conn::run(&mut conn, &statement, binds, false).await {
            Ok(Reply::Rows(rows)) => rows.into_iter().next().map(|r| r.values),
            Ok(Reply::Failed(error)) | Err(error) => return Err(MySqlAsyncBrokerError::Db(error)),
            Ok(_) => None,
        };
        self.outbox.stats(&values.unwrap_or_default())
    }
}

/// Runs the statements in order; answers the rows each wrote.
async fn run_all(
    conn: &mut impl Queryable,
    statements: Vec<(Statement, Vec<Value>)>,
) -> Result<Vec<u64>, MySqlAsyncBrokerError> {
    let failed = |e: mysql_async::Error| MySqlAsyncBrokerError::Db(db_error(&e));
    let mut written = Vec::with_capacity(statements.len());
    for (statement, binds) in statements {
        let sql: &str = &statement.sql;
        let rows = if binds.is_empty() {
            let result = conn.query_iter(sql).await.map_err(failed)?;
            let rows = result.affected_rows();
            result.drop_result().await.map_err(failed)?;
            rows
        } else {
            let result = conn.exec_iter(sql, params(binds)).await.map_err(failed)?;
            let rows = result.affected_rows();
            result.drop_result().await.map_err(failed)?;
            rows
        };
        written.push(rows);
    }
    Ok(written)
}

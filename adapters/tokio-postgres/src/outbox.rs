//! Publishing in the service's own transaction, or on a pool with no broker running:
//! [`TokioPostgresOutbox`].

use deadpool_postgres::Pool;
use ruststream::{InboxTable, IntoRow, Outbox, Published, Stats};
use ruststream_core::{Dialect, Statement, Value};
use tokio_postgres::GenericClient;

use crate::TokioPostgresBrokerError;
use crate::error::{db_error, pool_error};
use crate::run;

/// Publishes jobs into `T`'s table in a transaction the service holds, so a job commits with
/// the data it is about (the outbox), or on a client with no broker running
/// ([Outbox](https://github.com/ruststream/ruststream/blob/main/docs/src/publishing.md#the-outbox-in-the-services-own-transaction)).
///
/// ```no_run
/// # use ruststream_tokio_postgres::prelude::*;
/// # use ruststream_tokio_postgres::TokioPostgresOutbox;
/// # #[derive(serde::Deserialize)]
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
/// async fn place_order(
///     client: &mut tokio_postgres::Client,
///     order: i64,
/// ) -> Result<(), Box<dyn std::error::Error>> {
///     let tx = client.transaction().await?;
///     tx.execute("INSERT INTO orders (id) VALUES ($1)", &[&order]).await?;
///     // The job commits with the order, or neither does.
///     TokioPostgresOutbox::<SendReceipt>::new()
///         .publish(&tx, Message::json(&Receipt { order })?)
///         .await?;
///     tx.commit().await?;
///     Ok(())
/// }
/// ```
// The notification that wakes other processes' subscriptions rides in the service's
// transaction, so they hear of the rows when it commits. Each insert is prepared on the
// service's connection and runs under the extended query protocol.
pub struct TokioPostgresOutbox<T> {
    outbox: Outbox<T>,
}

impl<T> std::fmt::Debug for TokioPostgresOutbox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokioPostgresOutbox")
            .field("row", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T: InboxTable> Default for TokioPostgresOutbox<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: InboxTable> TokioPostgresOutbox<T> {
    /// `T`'s outbox. Nothing connects.
    pub fn new() -> Self {
        Self {
            outbox: Outbox::new(Dialect::Postgres),
        }
    }

    /// Publishes one job in the transaction, or on the client, `client` names (of
    /// deadpool-postgres, `&*transaction` or `&**object`): it commits with the transaction, or
    /// on its own outside one.
    pub async fn publish(
        &self,
        client: &impl GenericClient,
        message: impl IntoRow<T>,
    ) -> Result<Published, TokioPostgresBrokerError> {
        self.publish_all(client, [message]).await
    }

    /// Publishes rows in the transaction, or on the client, `client` names: inside a
    /// transaction every row is written or, when it rolls back, none is.
    pub async fn publish_all(
        &self,
        client: &impl GenericClient,
        messages: impl IntoIterator<Item = impl IntoRow<T>>,
    ) -> Result<Published, TokioPostgresBrokerError> {
        let written = run_all(client, self.outbox.statements(messages)?).await?;
        Ok(self.outbox.published(&written))
    }

    /// Publishes rows on a connection of `pool`, with no broker running (a service that only
    /// enqueues): one insert commits on its own, several run in one transaction.
    pub async fn publish_on(
        &self,
        pool: &Pool,
        messages: impl IntoIterator<Item = impl IntoRow<T>>,
    ) -> Result<Published, TokioPostgresBrokerError> {
        let statements = self.outbox.statements(messages)?;
        let mut client = pool
            .get()
            .await
            .map_err(|e| TokioPostgresBrokerError::Db(pool_error(&e)))?;
        let failed = |e: tokio_postgres::Error| TokioPostgresBrokerError::Db(db_error(&e));
        let written = if statements.len() > 1 {
            let tx = client.transaction().await.map_err(failed)?;
            let written = run_all(&*tx, statements).await?;
            tx.commit().await.map_err(failed)?;
            written
        } else {
            run_all(&**client, statements).await?
        };
        Ok(self.outbox.published(&written))
    }
}

impl<T: InboxTable> TokioPostgresOutbox<T> {
    /// `T`'s table's counts now ([`Stats`]), read on a connection of `pool` with no broker
    /// running, in one statement whose counts stop at
    /// [`STATS_CAP`](ruststream::core::STATS_CAP) rows.
    pub async fn stats(&self, pool: &Pool) -> Result<Stats, TokioPostgresBrokerError> {
        let (statement, binds) = self.outbox.stats_statement();
        let client = pool
            .get()
            .await
            .map_err(|e| TokioPostgresBrokerError::Db(pool_error(&e)))?;
        let rows = run::rows_on_client(&**client, &statement, &binds)
            .await
            .map_err(TokioPostgresBrokerError::Db)?;
        let values = rows
            .into_iter()
            .next()
            .map(|r| r.values)
            .unwrap_or_default();
        self.outbox.stats(&values)
    }
}

/// Runs the statements in order; answers the rows each wrote.
async fn run_all(
    client: &impl GenericClient,
    statements: Vec<(Statement, Vec<Value>)>,
) -> Result<Vec<u64>, TokioPostgresBrokerError> {
    let mut written = Vec::with_capacity(statements.len());
    for (statement, binds) in statements {
        written.push(
            run::on_client(client, &statement, &binds)
                .await
                .map_err(TokioPostgresBrokerError::Db)?,
        );
    }
    Ok(written)
}

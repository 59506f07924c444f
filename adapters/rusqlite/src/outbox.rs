//! Publishing in the service's own transaction: [`RusqliteOutbox`].

use rusqlite::Connection;
use ruststream::{InboxTable, IntoRow, Outbox, Published, Stats};
use ruststream_core::{Dialect, Reply};

use crate::RusqliteBrokerError;

/// Publishes jobs into `T`'s table in a transaction the service holds, so a job commits with
/// the data it is about (the outbox), or on a connection with no broker running. The calls
/// block, as rusqlite's do ([Outbox](https://github.com/ruststream/ruststream/blob/main/docs/src/publishing.md#the-outbox-in-the-services-own-transaction)).
///
/// ```no_run
/// # use ruststream_rusqlite::prelude::*;
/// # use ruststream_rusqlite::RusqliteOutbox;
/// # #[derive(serde::Deserialize)]
/// # struct SendReceipt { id: i64, payload: Vec<u8> }
/// # impl InboxTable for SendReceipt {
/// #     type Id = i64;
/// #     type Table = InboxSpec<(Payload, Lease)>;
/// #     const TABLE: Self::Table = InboxSpec::new("receipt_jobs", Column::new("id").generated())
/// #         .payload(Column::new("payload"))
/// #         .lease(Column::new("locked_until"));
/// #     fn id(&self) -> &i64 { &self.id }
/// # }
/// # #[derive(serde::Serialize)]
/// # struct Receipt { order: i64 }
/// fn place_order(conn: &mut rusqlite::Connection, order: i64) -> Result<(), Box<dyn std::error::Error>> {
///     let tx = conn.transaction()?;
///     tx.execute("INSERT INTO orders (id) VALUES (?1)", [order])?;
///     // The job commits with the order, or neither does.
///     RusqliteOutbox::<SendReceipt>::new().publish(&tx, Message::json(&Receipt { order })?)?;
///     tx.commit()?;
///     Ok(())
/// }
/// ```
pub struct RusqliteOutbox<T> {
    outbox: Outbox<T>,
}

impl<T> std::fmt::Debug for RusqliteOutbox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RusqliteOutbox")
            .field("row", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T: InboxTable> Default for RusqliteOutbox<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: InboxTable> RusqliteOutbox<T> {
    /// `T`'s outbox. Nothing opens.
    pub fn new() -> Self {
        Self {
            outbox: Outbox::new(Dialect::Sqlite),
        }
    }

    /// Publishes one row in the transaction, or on the connection, `conn` names (a
    /// [`rusqlite::Transaction`] derefs to its connection): it commits with the transaction,
    /// or on its own outside one.
    pub fn publish(
        &self,
        conn: &Connection,
        message: impl IntoRow<T>,
    ) -> Result<Published, RusqliteBrokerError> {
        self.publish_all(conn, [message])
    }

    /// Publishes rows in the transaction, or on the connection, `conn` names: inside a
    /// transaction every row is written or, when it rolls back, none is.
    pub fn publish_all(
        &self,
        conn: &Connection,
        messages: impl IntoIterator<Item = impl IntoRow<T>>,
    ) -> Result<Published, RusqliteBrokerError> {
        let mut written = Vec::new();
        for (statement, binds) in self.outbox.statements(messages)? {
            match crate::driver::execute(conn, &statement, &binds).unwrap_or_else(Reply::Failed) {
                Reply::Failed(error) => return Err(RusqliteBrokerError::Db(error)),
                Reply::Affected(n) => written.push(n),
                _ => written.push(1),
            }
        }
        Ok(self.outbox.published(&written))
    }

    /// `T`'s table's counts now ([`Stats`]), read on `conn` with no broker running, in one
    /// statement whose counts stop at [`STATS_CAP`](ruststream::core::STATS_CAP) rows.
    pub fn stats(&self, conn: &Connection) -> Result<Stats, RusqliteBrokerError> {
        let (statement, binds) = self.outbox.stats_statement();
        let values =
            match crate::driver::execute(conn, &statement, &binds).unwrap_or_else(Reply::Failed) {
                Reply::Failed(error) => return Err(RusqliteBrokerError::Db(error)),
                Reply::Rows(rows) => rows.into_iter().next().map(|r| r.values),
                _ => None,
            };
        self.outbox.stats(&values.unwrap_or_default())
    }
}

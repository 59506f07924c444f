//! Publishing in a transaction the service holds: the statements that write a table's rows,
//! for an adapter to run on the service's own connection or transaction ([`Outbox`]).

use std::marker::PhantomData;
use std::sync::Mutex;

use ruststream_core::spec::Described;
use ruststream_core::{Dialect, Inserts, Published, Statement, Statements, Stats, Value};

use crate::error::PublishError;
use crate::handle::{IntoRow, Message};
use crate::table::InboxTable;

/// The inserts of `T`'s jobs, for an adapter to run in a transaction the service holds (so a
/// job commits with the data it is about) or on a connection with no broker running. Each
/// adapter wraps it ([Outbox](https://github.com/ruststream/ruststream/blob/main/docs/src/publishing.md#the-outbox-in-the-services-own-transaction)).
// On PostgreSQL each insert notifies the subscriptions of other processes in the same
// transaction: they hear of the rows when it commits.
pub struct Outbox<T> {
    inserts: Mutex<Inserts>,
    row: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Outbox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("row", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

impl<T: InboxTable> Outbox<T> {
    /// `T`'s inserts in `dialect`.
    pub fn new(dialect: Dialect) -> Self {
        Self {
            inserts: Mutex::new(Inserts::new(dialect, *T::TABLE.table_desc())),
            row: PhantomData,
        }
    }

    /// The statements that write `messages`, each with its binds, in order. Fails, naming the
    /// table and column, for a message that gives no value for a column the table needs or
    /// names one its insert does not write.
    pub fn statements(
        &self,
        messages: impl IntoIterator<Item = impl IntoRow<T>>,
    ) -> Result<Vec<(Statement, Vec<Value>)>, PublishError> {
        let rows = messages
            .into_iter()
            .map(|message| message.into_row().map(Message::into_publish))
            .collect::<Result<Vec<_>, PublishError>>()?;
        self.inserts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .statements(&rows)
            .map_err(PublishError::Invalid)
    }

    /// The statement that reads `T`'s table's counts now ([`Stats`]), with its binds: for an
    /// adapter to run on a connection of a pool, with no broker running.
    pub fn stats_statement(&self) -> (Statement, Vec<Value>) {
        let dialect = self
            .inserts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .dialect();
        let statement = Statements::stats(dialect, T::TABLE.table_desc());
        // The statement reads the database's time itself: it binds nothing.
        let binds = statement.binds(|_| Value::Null);
        (statement, binds)
    }

    /// The counts in the values of [`Outbox::stats_statement`]'s one row.
    pub fn stats(&self, values: &[Value]) -> Result<Stats, PublishError> {
        Stats::from_values(T::TABLE.table_desc().table, values, crate::driver::now()).map_err(
            |message| {
                PublishError::Db(ruststream_core::DbError::new(
                    ruststream_core::ErrorKind::Other,
                    message,
                ))
            },
        )
    }

    /// What a publish of [`Outbox::statements`] wrote, from the rows each statement wrote, in
    /// order: on a table that deduplicates its publishes, the rows already there. Counts the
    /// rows written in [`metrics::PUBLISHED`](crate::metrics::PUBLISHED).
    pub fn published(&self, written: &[u64]) -> Published {
        crate::metrics::published(T::TABLE.table_desc().table, written.iter().sum());
        self.inserts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .published(written)
    }
}

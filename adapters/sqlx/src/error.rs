//! The broker's errors, and its publisher.

use std::fmt;

use ruststream::{BrokerHandle, InboxTable, Message, PublishError, Publisher, StartError};
use ruststream_core::{BrokerError, DbError, ErrorKind};
use serde::Serialize;

use crate::broker::SqlxBroker;
use crate::db::SqlxDatabase;

/// Why a publish, or a start by hand, did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqlxBrokerError {
    /// The broker is shut down, or not started: nothing was written. A publisher kept past the
    /// shutdown answers this, and writes no row.
    #[error("the broker is closed: nothing was written")]
    Closed,
    /// The message did not encode into the payload.
    #[error("the message does not encode: {0}")]
    Encode(String),
    /// The publish gives no value for a column the table needs, or the table's description
    /// breaks a rule.
    #[error(transparent)]
    Invalid(BrokerError),
    /// The database failed the insert.
    #[error("the insert failed: {0}")]
    Db(DbError),
    /// The broker did not start: the pool did not connect, a description breaks a rule, or a
    /// table failed its check.
    #[error("the broker did not start: {0}")]
    Start(#[from] StartError),
}

impl From<PublishError> for SqlxBrokerError {
    fn from(error: PublishError) -> Self {
        match error {
            PublishError::Closed => SqlxBrokerError::Closed,
            PublishError::Encode(message) => SqlxBrokerError::Encode(message),
            PublishError::Invalid(error) => SqlxBrokerError::Invalid(error),
            PublishError::Db(error) => SqlxBrokerError::Db(error),
            other => SqlxBrokerError::Db(DbError::new(ErrorKind::Other, other.to_string())),
        }
    }
}

/// Publishes rows into `T`'s table through a [`SqlxBroker`]: the runtime's [`Publisher`],
/// answering [`SqlxBrokerError`].
///
/// Take it from the broker's handle ([`SqlxPublisher::new`]), a route
/// ([`SqlxRoute::publisher`](crate::SqlxRoute::publisher)) or a broker started by hand
/// ([`RunningSqlxBroker::publisher`](crate::RunningSqlxBroker::publisher)). It answers
/// [`SqlxBrokerError::Closed`] until the broker starts and from its shutdown on, and writes no
/// row then. A publish that wrote its row wakes the broker's subscriptions of the table.
pub struct SqlxPublisher<T, DB: SqlxDatabase> {
    publisher: Publisher<T, SqlxBroker<DB>>,
}

impl<T, DB: SqlxDatabase> Clone for SqlxPublisher<T, DB> {
    fn clone(&self) -> Self {
        Self {
            publisher: self.publisher.clone(),
        }
    }
}

impl<T, DB: SqlxDatabase> fmt::Debug for SqlxPublisher<T, DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxPublisher")
            .field("row", &std::any::type_name::<T>())
            .field("database", &DB::NAME)
            .finish()
    }
}

impl<T: InboxTable, DB: SqlxDatabase> SqlxPublisher<T, DB> {
    /// A publisher of `T` rows through the broker `handle` names.
    pub fn new(handle: &BrokerHandle<SqlxBroker<DB>>) -> Self {
        Self {
            publisher: handle.publisher::<T>(),
        }
    }

    /// Publishes one row: the message's payload, the values of the key's columns, when it is
    /// due.
    pub async fn publish(&self, message: Message) -> Result<(), SqlxBrokerError> {
        Ok(self.publisher.publish(message).await?)
    }

    /// Publishes one message encoded as JSON, due now.
    pub async fn publish_json<M: Serialize>(&self, message: &M) -> Result<(), SqlxBrokerError> {
        self.publish(Message::json(message)?).await
    }

    /// The runtime's publisher this one wraps.
    pub fn inner(&self) -> &Publisher<T, SqlxBroker<DB>> {
        &self.publisher
    }
}

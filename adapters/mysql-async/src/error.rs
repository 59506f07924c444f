//! The broker's errors, and its publisher.

use std::fmt;

use ruststream::{BrokerHandle, InboxTable, Message, PublishError, Publisher, StartError};
use ruststream_core::{BrokerError, DbError, ErrorKind};
use serde::Serialize;

use crate::broker::MySqlAsyncBroker;

/// Why a publish, or a start by hand, did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MySqlAsyncBrokerError {
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

impl From<PublishError> for MySqlAsyncBrokerError {
    fn from(error: PublishError) -> Self {
        match error {
            PublishError::Closed => MySqlAsyncBrokerError::Closed,
            PublishError::Encode(message) => MySqlAsyncBrokerError::Encode(message),
            PublishError::Invalid(error) => MySqlAsyncBrokerError::Invalid(error),
            PublishError::Db(error) => MySqlAsyncBrokerError::Db(error),
            other => MySqlAsyncBrokerError::Db(DbError::new(ErrorKind::Other, other.to_string())),
        }
    }
}

/// Publishes rows into `T`'s table through a [`MySqlAsyncBroker`]: the runtime's
/// [`Publisher`], answering [`MySqlAsyncBrokerError`].
///
/// Take it from the broker's handle ([`MySqlAsyncPublisher::new`]), a route
/// ([`MySqlAsyncRoute::publisher`](crate::MySqlAsyncRoute::publisher)) or a broker started by
/// hand ([`RunningMySqlAsyncBroker::publisher`](crate::RunningMySqlAsyncBroker::publisher)). It
/// answers [`MySqlAsyncBrokerError::Closed`] until the broker starts and from its shutdown on,
/// and writes no row then. A publish that wrote its row wakes the broker's subscriptions of
/// the table.
pub struct MySqlAsyncPublisher<T> {
    publisher: Publisher<T, MySqlAsyncBroker>,
}

impl<T> Clone for MySqlAsyncPublisher<T> {
    fn clone(&self) -> Self {
        Self {
            publisher: self.publisher.clone(),
        }
    }
}

impl<T> fmt::Debug for MySqlAsyncPublisher<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlAsyncPublisher")
            .field("row", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T: InboxTable> MySqlAsyncPublisher<T> {
    /// A publisher of `T` rows through the broker `handle` names.
    pub fn new(handle: &BrokerHandle<MySqlAsyncBroker>) -> Self {
        Self {
            publisher: handle.publisher::<T>(),
        }
    }

    /// Publishes one row: the message's payload, the values of the key's columns, when it is
    /// due.
    pub async fn publish(&self, message: Message) -> Result<(), MySqlAsyncBrokerError> {
        Ok(self.publisher.publish(message).await?)
    }

    /// Publishes one message encoded as JSON, due now.
    pub async fn publish_json<M: Serialize>(
        &self,
        message: &M,
    ) -> Result<(), MySqlAsyncBrokerError> {
        self.publish(Message::json(message)?).await
    }

    /// The runtime's publisher this one wraps.
    pub fn inner(&self) -> &Publisher<T, MySqlAsyncBroker> {
        &self.publisher
    }
}

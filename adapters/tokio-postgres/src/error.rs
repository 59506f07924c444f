//! The broker's errors, the mapping of driver errors into the core's kinds, and the publisher.

use std::fmt;

use deadpool_postgres::PoolError;
use ruststream::{BrokerHandle, InboxTable, Message, PublishError, Publisher, StartError};
use ruststream_core::server::sqlstate_kind;
use ruststream_core::{BrokerError, DbError, ErrorKind};
use serde::Serialize;

use crate::broker::TokioPostgresBroker;

/// Why a publish, or a start by hand, did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokioPostgresBrokerError {
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

impl From<PublishError> for TokioPostgresBrokerError {
    fn from(error: PublishError) -> Self {
        match error {
            PublishError::Closed => TokioPostgresBrokerError::Closed,
            PublishError::Encode(message) => TokioPostgresBrokerError::Encode(message),
            PublishError::Invalid(error) => TokioPostgresBrokerError::Invalid(error),
            PublishError::Db(error) => TokioPostgresBrokerError::Db(error),
            other => {
                TokioPostgresBrokerError::Db(DbError::new(ErrorKind::Other, other.to_string()))
            }
        }
    }
}

/// Publishes rows into `T`'s table through a [`TokioPostgresBroker`]: the runtime's
/// [`Publisher`], answering [`TokioPostgresBrokerError`].
///
/// Take it from the broker's handle ([`TokioPostgresPublisher::new`]), a route
/// ([`TokioPostgresRoute::publisher`](crate::TokioPostgresRoute::publisher)) or a broker
/// started by hand
/// ([`RunningTokioPostgresBroker::publisher`](crate::RunningTokioPostgresBroker::publisher)).
/// It answers [`TokioPostgresBrokerError::Closed`] until the broker starts and from its
/// shutdown on, and writes no row then. A publish that wrote its row wakes the broker's
/// subscriptions of the table.
pub struct TokioPostgresPublisher<T> {
    publisher: Publisher<T, TokioPostgresBroker>,
}

impl<T> Clone for TokioPostgresPublisher<T> {
    fn clone(&self) -> Self {
        Self {
            publisher: self.publisher.clone(),
        }
    }
}

impl<T> fmt::Debug for TokioPostgresPublisher<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokioPostgresPublisher")
            .field("row", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T: InboxTable> TokioPostgresPublisher<T> {
    /// A publisher of `T` rows through the broker `handle` names.
    pub fn new(handle: &BrokerHandle<TokioPostgresBroker>) -> Self {
        Self {
            publisher: handle.publisher::<T>(),
        }
    }

    /// Publishes one row: the message's payload, the values of the key's columns, when it is
    /// due.
    pub async fn publish(&self, message: Message) -> Result<(), TokioPostgresBrokerError> {
        Ok(self.publisher.publish(message).await?)
    }

    /// Publishes one message encoded as JSON, due now.
    pub async fn publish_json<M: Serialize>(
        &self,
        message: &M,
    ) -> Result<(), TokioPostgresBrokerError> {
        self.publish(Message::json(message)?).await
    }

    /// The runtime's publisher this one wraps.
    pub fn inner(&self) -> &Publisher<T, TokioPostgresBroker> {
        &self.publisher
    }
}

/// A tokio-postgres error as the core reads it: a server's error by its SQLSTATE
/// ([`sqlstate_kind`]); a closed connection, I/O, TLS and protocol errors as
/// [`ErrorKind::ConnectionLost`]; the client's own errors (a value that does not convert) as
/// [`ErrorKind::Other`].
pub(crate) fn db_error(error: &tokio_postgres::Error) -> DbError {
    DbError::new(error_kind(error), describe(error))
}

fn error_kind(error: &tokio_postgres::Error) -> ErrorKind {
    if let Some(code) = error.code() {
        return sqlstate_kind(code.code());
    }
    if error.is_closed() {
        return ErrorKind::ConnectionLost;
    }
    let text = error.to_string();
    // Errors of the client's own: a value that does not convert, a column that is not there.
    let local = [
        "error serializing",
        "error deserializing",
        "invalid column",
        "query returned an unexpected number of rows",
        "unexpected number of parameters",
    ];
    if local.iter().any(|l| text.starts_with(l)) {
        ErrorKind::Other
    } else {
        // I/O, TLS, a protocol error, a failed connect: the connection is gone.
        ErrorKind::ConnectionLost
    }
}

/// The error's message, with the server's detail where it sent one.
fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let mut text = format!(
                "{}: {} (SQLSTATE {})",
                db.severity(),
                db.message(),
                db.code().code()
            );
            if let Some(detail) = db.detail() {
                text.push_str(": ");
                text.push_str(detail);
            }
            text
        }
        None => match std::error::Error::source(error) {
            Some(source) => format!("{error}: {source}"),
            None => error.to_string(),
        },
    }
}

/// A pool's error as the core reads it: a closed pool, or one that gave no connection in
/// time, is [`ErrorKind::PoolClosed`]; a connection that did not open is
/// [`ErrorKind::ConnectionLost`].
pub(crate) fn pool_error(error: &PoolError) -> DbError {
    match error {
        PoolError::Closed => DbError::new(ErrorKind::PoolClosed, "the pool is closed"),
        PoolError::Timeout(which) => DbError::new(
            ErrorKind::PoolClosed,
            format!("the pool gave no connection in time ({which:?} timeout)"),
        ),
        PoolError::Backend(error) => {
            let mut db = db_error(error);
            db.message = format!("cannot open a connection of the pool: {}", db.message);
            if db.kind == ErrorKind::Other {
                db.kind = ErrorKind::ConnectionLost;
            }
            db
        }
        other => DbError::new(
            ErrorKind::PoolClosed,
            format!("the pool gave no connection: {other}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_errors_map_to_kinds() {
        assert_eq!(pool_error(&PoolError::Closed).kind, ErrorKind::PoolClosed);
    }
}

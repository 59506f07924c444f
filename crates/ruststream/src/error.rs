//! The errors of a broker: why a publish, or a start, did not happen.

use ruststream_core::{BrokerError, DbError};

use crate::adapter::AdapterError;

/// Why a publish, or a start of a broker by hand, did not happen: the error every adapter's
/// publishers and brokers answer (`SqlxBrokerError`, `TokioPostgresBrokerError`,
/// `MySqlAsyncBrokerError` and `RusqliteBrokerError` name it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    /// The broker did not start: its connections did not open, a description breaks a rule,
    /// or a table failed its check.
    #[error("the broker did not start: {0}")]
    Start(#[from] StartError),
}

/// What a publish answers: [`Error`], of which it answers every variant but
/// [`Error::Start`].
pub type PublishError = Error;

/// Why a broker did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The adapter could not open its connections.
    #[error(transparent)]
    Adapter(#[from] AdapterError),
    /// A subscription's description breaks a rule.
    #[error(transparent)]
    Description(BrokerError),
    /// A subscription's table failed its check.
    #[error(transparent)]
    Check(ruststream_core::CheckError),
    /// The listening session did not hear a notification the start sent through the pool: a
    /// pooler in transaction pooling stands between the service and PostgreSQL ([Poolers](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#poolers-and-postgresql-sessions)).
    #[error(
        "the session listening for publishes (`LISTEN ruststream`) did not hear a notification sent through the broker's pool within {waited:?}: a pooler in transaction pooling, such as PgBouncer with `pool_mode = transaction`, hands each transaction to any server connection, so the listening session hears nothing; connect to PostgreSQL directly, through a pooler in session pooling (`pool_mode = session`), give the listening session a direct connection (`listen_on` on the tokio-postgres and sqlx brokers), or turn it off (`without_listener()`)"
    )]
    ListenerHearsNothing {
        /// How long the start waited.
        waited: std::time::Duration,
    },
    /// The notification the start sent through the pool to its listening session came back
    /// on the pool's own connection, whose server session listens too: a pooler in
    /// transaction pooling handed it the listening session's server session.
    #[error(
        "the notification the start sent through the broker's pool to its listening session (`LISTEN ruststream`) came back on the pool's own connection ({error}): the pool's connections and the listening session share server sessions, as through a pooler in transaction pooling, such as PgBouncer with `pool_mode = transaction`, which hands each transaction to any server connection; connect to PostgreSQL directly, through a pooler in session pooling (`pool_mode = session`), give the listening session a direct connection (`listen_on` on the tokio-postgres and sqlx brokers), or turn it off (`without_listener()`)"
    )]
    ListenerSharesSessions {
        /// The error of the notification's statement.
        error: DbError,
    },
    /// The broker was started twice.
    #[error("the broker is already started or closed")]
    AlreadyStarted,
    /// The service was stopped (SIGTERM, SIGINT) before the broker had started.
    #[error("the service was stopped before the broker started")]
    Stopped,
}

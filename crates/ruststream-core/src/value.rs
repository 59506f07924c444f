//! The plain data that crosses the boundary between the core and an adapter: values, times and
//! database errors.

use std::time::Duration;

/// A bind parameter or a value read from a row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer of any width.
    Int(i64),
    /// Text.
    Text(String),
    /// Bytes.
    Bytes(Vec<u8>),
}

impl Value {
    /// The value as a boolean: `true`, `false`, or the integers `1` and `0` (MySQL's answer to
    /// `GET_LOCK`). `NULL` and anything else are `None`.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            Value::Int(1) => Some(true),
            Value::Int(0) => Some(false),
            _ => None,
        }
    }

    /// The value as an integer.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The value as text.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Value::Text(t) => Some(t),
            _ => None,
        }
    }
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::Int(i64::from(v))
            }
        }
    )*};
}

from_int!(i8, i16, i32, i64, u8, u16, u32);

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}

impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Bytes(v)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Null => f.write_str("NULL"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Text(t) => write!(f, "{t:?}"),
            Value::Bytes(b) => write!(f, "<{} bytes>", b.len()),
        }
    }
}

/// A point in time: microseconds since the Unix epoch, read by the driver from its clock and
/// passed to the core with every input. The core never reads a clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Time(pub i64);

impl Time {
    /// Microseconds since the Unix epoch.
    pub const fn micros(self) -> i64 {
        self.0
    }

    /// This time moved later by `d`, saturating.
    pub fn plus(self, d: Duration) -> Time {
        let micros = i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        Time(self.0.saturating_add(micros))
    }

    /// How long from `earlier` to this time; zero when `earlier` is later.
    pub fn since(self, earlier: Time) -> Duration {
        Duration::from_micros(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

/// What kind of failure a database error is, mapped from the server's codes so the core
/// reacts without reading messages: an adapter maps its driver's codes through
/// [`crate::server`] and its driver's own errors (a closed connection, a closed pool) itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The connection is gone: its session, locks and open transaction with it.
    ConnectionLost,
    /// The pool is closed, or gave no connection in time.
    PoolClosed,
    /// A serialization failure (SQLSTATE 40001) or a deadlock.
    Serialization,
    /// The table does not exist.
    UndefinedTable,
    /// A column does not exist.
    UndefinedColumn,
    /// The statement ran past a time limit.
    Timeout,
    /// The server refused the user or its password.
    Authentication,
    /// The user may not do what the statement asks (`GRANT` missing).
    Privilege,
    /// A prepared statement of the session clashed with one of another client's: a pooler in
    /// transaction pooling hands each transaction to any server session.
    PreparedStatement,
    /// The connection's server session is another client's too: it sent a notification of
    /// another client's `LISTEN` to a connection that listens for none. A pooler in
    /// transaction pooling hands each transaction to any server session.
    SharedSession,
    /// A setting names what the server does not have: an unknown database, a malformed URL.
    Config,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// Whether the failure stays until someone changes the server or the service: waiting
    /// and trying again cannot cure it.
    pub const fn is_permanent(self) -> bool {
        matches!(
            self,
            ErrorKind::UndefinedTable
                | ErrorKind::UndefinedColumn
                | ErrorKind::Authentication
                | ErrorKind::Privilege
                | ErrorKind::PreparedStatement
                | ErrorKind::SharedSession
                | ErrorKind::Config
        )
    }
}

/// A database error, as an adapter reports it to the core.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DbError {
    /// The kind of failure.
    pub kind: ErrorKind,
    /// The driver's message.
    pub message: String,
}

impl DbError {
    /// An error of this kind with this message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// Whether the connection it happened on must be closed rather than reused.
    pub fn closes_connection(&self) -> bool {
        matches!(self.kind, ErrorKind::ConnectionLost | ErrorKind::Timeout)
    }
}

//! The mapping of driver and pool errors into the core's kinds.

use deadpool_postgres::PoolError;
use ruststream_core::server::sqlstate_kind;
use ruststream_core::{DbError, ErrorKind};

/// A tokio-postgres error as the core reads it: a server's error by its SQLSTATE; a closed
/// connection, I/O, TLS and protocol errors as lost; the client's own errors as `Other`.
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

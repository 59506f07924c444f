//! The suite's custom lock on rusqlite's connection: the custom lock example's `held_keys`, beside the
//! scenario's table ([`schema::lock_statements`]).

use ruststream_conformance::schema;
use ruststream_core::Dialect;
use ruststream_rusqlite::rusqlite::{self, Connection};

/// Takes `key` unless it is held, recording the session that took it, and logs the take.
pub(crate) fn lock(conn: &Connection, table: &str, key: &str) -> rusqlite::Result<bool> {
    let sql = schema::lock_statements(Dialect::Sqlite, table);
    if let Some(session) = sql.session {
        conn.execute_batch(session)?;
    }
    let taken = conn.execute(&sql.take, [key])? == 1;
    if taken {
        conn.execute(&sql.log, [key])?;
    }
    Ok(taken)
}

/// Releases `key`, and answers whether it was held.
pub(crate) fn unlock(conn: &Connection, table: &str, key: &str) -> rusqlite::Result<bool> {
    let sql = schema::lock_statements(Dialect::Sqlite, table);
    Ok(conn.execute(&sql.release, [key])? == 1)
}

//! The suite's custom lock on mysql_async's connection: the custom lock example's `held_keys`, beside the
//! scenario's table ([`schema::lock_statements`]), the session being `CONNECTION_ID()`.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Error};
use ruststream_conformance::schema;
use ruststream_core::Dialect;

/// Takes `key` unless it is held, recording the session that took it, and logs the take.
pub(crate) async fn lock(conn: &mut Conn, table: &str, key: &str) -> Result<bool, Error> {
    let sql = schema::lock_statements(Dialect::MariaDb, table);
    conn.exec_drop(sql.take, (key,)).await?;
    let taken = conn.affected_rows() == 1;
    if taken {
        conn.exec_drop(sql.log, (key,)).await?;
    }
    Ok(taken)
}

/// Releases `key`, and answers whether it was held.
pub(crate) async fn unlock(conn: &mut Conn, table: &str, key: &str) -> Result<bool, Error> {
    let sql = schema::lock_statements(Dialect::MariaDb, table);
    conn.exec_drop(sql.release, (key,)).await?;
    Ok(conn.affected_rows() == 1)
}

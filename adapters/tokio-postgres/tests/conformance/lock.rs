//! The suite's custom lock on tokio-postgres's client: the custom lock example's `held_keys`, beside the
//! scenario's table ([`schema::lock_statements`]), the session being the backend's pid.

use ruststream_conformance::schema;
use ruststream_core::Dialect;
use ruststream_tokio_postgres::tokio_postgres::{Client, Error};

/// Takes `key` unless it is held, recording the session that took it, and logs the take.
pub(crate) async fn lock(client: &Client, table: &str, key: &str) -> Result<bool, Error> {
    let sql = schema::lock_statements(Dialect::Postgres, table);
    let taken = client.execute(&sql.take, &[&key]).await? == 1;
    if taken {
        client.execute(&sql.log, &[&key]).await?;
    }
    Ok(taken)
}

/// Releases `key`, and answers whether it was held.
pub(crate) async fn unlock(client: &Client, table: &str, key: &str) -> Result<bool, Error> {
    let sql = schema::lock_statements(Dialect::Postgres, table);
    Ok(client.execute(&sql.release, &[&key]).await? == 1)
}

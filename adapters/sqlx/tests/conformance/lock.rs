//! The suite's custom lock on each of sqlx's connections: the custom lock example's `held_keys`, beside the
//! scenario's table ([`schema::lock_statements`]).

use ruststream_conformance::schema;
use ruststream_core::Dialect;
use sqlx::{AssertSqlSafe, MySqlConnection, PgConnection, SqliteConnection};

/// On PostgreSQL: takes `key` unless it is held, recording the session (the backend's pid)
/// that took it, and logs the take.
pub(crate) async fn pg_lock(
    conn: &mut PgConnection,
    table: &str,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let sql = schema::lock_statements(Dialect::Postgres, table);
    let taken = sqlx::query(AssertSqlSafe(sql.take))
        .bind(key)
        .execute(&mut *conn)
        .await?
        .rows_affected()
        == 1;
    if taken {
        sqlx::query(AssertSqlSafe(sql.log))
            .bind(key)
            .execute(&mut *conn)
            .await?;
    }
    Ok(taken)
}

/// On PostgreSQL: releases `key`, and answers whether it was held.
pub(crate) async fn pg_unlock(
    conn: &mut PgConnection,
    table: &str,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let sql = schema::lock_statements(Dialect::Postgres, table);
    let released = sqlx::query(AssertSqlSafe(sql.release))
        .bind(key)
        .execute(&mut *conn)
        .await?;
    Ok(released.rows_affected() == 1)
}

/// On MariaDB: takes `key` unless it is held, recording the session (`CONNECTION_ID()`) that
/// took it, and logs the take.
pub(crate) async fn mysql_lock(
    conn: &mut MySqlConnection,
    table: &str,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let sql = schema::lock_statements(Dialect::MariaDb, table);
    let taken = sqlx::query(AssertSqlSafe(sql.take))
        .bind(key)
        .execute(&mut *conn)
        .await?
        .rows_affected()
        == 1;
    if taken {
        sqlx::query(AssertSqlSafe(sql.log))
            .bind(key)
            .execute(&mut *conn)
            .await?;
    }
    Ok(taken)
}

/// On MariaDB: releases `key`, and answers whether it was held.
pub(crate) async fn mysql_unlock(
    conn: &mut MySqlConnection,
    table: &str,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let sql = schema::lock_statements(Dialect::MariaDb, table);
    let released = sqlx::query(AssertSqlSafe(sql.release))
        .bind(key)
        .execute(&mut *conn)
        .await?;
    Ok(released.rows_affected() == 1)
}

/// On SQLite: takes `key` unless it is held, recording the session (a random number the
/// connection keeps) that took it, and logs the take.
pub(crate) async fn sqlite_lock(
    conn: &mut SqliteConnection,
    table: &str,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let sql = schema::lock_statements(Dialect::Sqlite, table);
    if let Some(session) = sql.session {
        sqlx::raw_sql(session).execute(&mut *conn).await?;
    }
    let taken = sqlx::query(AssertSqlSafe(sql.take))
        .bind(key)
        .execute(&mut *conn)
        .await?
        .rows_affected()
        == 1;
    if taken {
        sqlx::query(AssertSqlSafe(sql.log))
            .bind(key)
            .execute(&mut *conn)
            .await?;
    }
    Ok(taken)
}

/// On SQLite: releases `key`, and answers whether it was held.
pub(crate) async fn sqlite_unlock(
    conn: &mut SqliteConnection,
    table: &str,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let sql = schema::lock_statements(Dialect::Sqlite, table);
    let released = sqlx::query(AssertSqlSafe(sql.release))
        .bind(key)
        .execute(&mut *conn)
        .await?;
    Ok(released.rows_affected() == 1)
}

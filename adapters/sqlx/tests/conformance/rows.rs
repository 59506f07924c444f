//! The suite's rows on sqlx: they decode with `sqlx::FromRow` on every database, and the
//! custom-lock rows take the lock of [`crate::lock`] on each.

/// Implements sqlx's `Lock` and `Unlock` on PostgreSQL, MySQL and SQLite for a custom-lock row
/// with the suite's lock.
macro_rules! custom_lock {
    ($row:ident) => {
        custom_lock!(@on $row, Postgres, PgConnection, pg_lock, pg_unlock);
        custom_lock!(@on $row, MySql, MySqlConnection, mysql_lock, mysql_unlock);
        custom_lock!(@on $row, Sqlite, SqliteConnection, sqlite_lock, sqlite_unlock);
    };
    (@on $row:ident, $db:ident, $conn:ident, $lock:ident, $unlock:ident) => {
        impl ruststream_sqlx::Lock<sqlx::$db> for $row {
            async fn lock(conn: &mut sqlx::$conn, key: &str) -> Result<bool, sqlx::Error> {
                let table = <Self as ruststream_conformance::SuiteRow>::NAME;
                crate::lock::$lock(conn, table, key).await
            }
        }

        impl ruststream_sqlx::Unlock<sqlx::$db> for $row {
            async fn unlock(conn: &mut sqlx::$conn, key: &str) -> Result<bool, sqlx::Error> {
                let table = <Self as ruststream_conformance::SuiteRow>::NAME;
                crate::lock::$unlock(conn, table, key).await
            }
        }
    };
}

ruststream_conformance::suite_rows! {
    #[derive(sqlx::FromRow)]
    custom_lock: custom_lock
}

//! The suite's rows on mysql_async: they decode with mysql_async's `FromRow`, and the
//! custom-lock rows take the lock of [`crate::lock`].

/// Implements mysql_async's `Lock` and `Unlock` for a custom-lock row with the suite's lock.
macro_rules! custom_lock {
    ($row:ident) => {
        impl ruststream_mysql_async::Lock for $row {
            async fn lock(
                conn: &mut mysql_async::Conn,
                key: &str,
            ) -> Result<bool, mysql_async::Error> {
                let table = <Self as ruststream_conformance::SuiteRow>::NAME;
                crate::lock::lock(conn, table, key).await
            }
        }

        impl ruststream_mysql_async::Unlock for $row {
            async fn unlock(
                conn: &mut mysql_async::Conn,
                key: &str,
            ) -> Result<bool, mysql_async::Error> {
                let table = <Self as ruststream_conformance::SuiteRow>::NAME;
                crate::lock::unlock(conn, table, key).await
            }
        }
    };
}

ruststream_conformance::suite_rows! {
    #[derive(mysql_async::prelude::FromRow)]
    custom_lock: custom_lock
}

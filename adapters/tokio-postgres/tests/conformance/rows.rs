//! The suite's rows on tokio-postgres: they decode with serde, and the custom-lock rows take
//! the lock of [`crate::lock`].

/// Implements tokio-postgres's `Lock` and `Unlock` for a custom-lock row with the suite's lock.
macro_rules! custom_lock {
    ($row:ident) => {
        impl ruststream_tokio_postgres::Lock for $row {
            async fn lock(
                client: &ruststream_tokio_postgres::tokio_postgres::Client,
                key: &str,
            ) -> Result<bool, ruststream_tokio_postgres::tokio_postgres::Error> {
                let table = <Self as ruststream_conformance::SuiteRow>::NAME;
                crate::lock::lock(client, table, key).await
            }
        }

        impl ruststream_tokio_postgres::Unlock for $row {
            async fn unlock(
                client: &ruststream_tokio_postgres::tokio_postgres::Client,
                key: &str,
            ) -> Result<bool, ruststream_tokio_postgres::tokio_postgres::Error> {
                let table = <Self as ruststream_conformance::SuiteRow>::NAME;
                crate::lock::unlock(client, table, key).await
            }
        }
    };
}

ruststream_conformance::suite_rows! {
    #[derive(serde::Deserialize)]
    custom_lock: custom_lock
}

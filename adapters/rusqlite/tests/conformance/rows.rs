//! The suite's rows on rusqlite: they decode with serde, and the custom-lock rows take the
//! lock of [`crate::lock`].

/// Implements rusqlite's `Lock` and `Unlock` for a custom-lock row with the suite's lock.
macro_rules! custom_lock {
    ($row:ident) => {
        impl ruststream_rusqlite::Lock for $row {
            fn lock(
                conn: &ruststream_rusqlite::rusqlite::Connection,
                key: &str,
            ) -> ruststream_rusqlite::rusqlite::Result<bool> {
                crate::lock::lock(conn, <Self as ruststream_conformance::SuiteRow>::NAME, key)
            }
        }

        impl ruststream_rusqlite::Unlock for $row {
            fn unlock(
                conn: &ruststream_rusqlite::rusqlite::Connection,
                key: &str,
            ) -> ruststream_rusqlite::rusqlite::Result<bool> {
                crate::lock::unlock(conn, <Self as ruststream_conformance::SuiteRow>::NAME, key)
            }
        }
    };
}

ruststream_conformance::suite_rows! {
    #[derive(serde::Deserialize)]
    custom_lock: custom_lock
}

//! The conformance suite (`ruststream-conformance`) on PostgreSQL through sqlx: every scenario
//! in every form, at `RUSTSTREAM_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`),
//! in a database of the harness's own beside the URL's (`<database>_cf_sqlx`, created when
//! missing) and a schema per scenario and process.
//!
//! A scenario's table names are fixed, and so are its advisory keys (`<table>-<k>`). A
//! PostgreSQL advisory lock belongs to the database, not to a schema: the harness works in a
//! database of its own, so its keys are not the tokio-postgres suite's, which runs in the URL's
//! database, and both suites run at once on one server.

mod common;
mod lock;
mod postgres_harness;
mod rows;

ruststream_conformance::conformance_tests! {
    rows: rows::Rows,
    harness: postgres_harness::SqlxPostgresHarness::new(),
}

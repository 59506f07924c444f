//! The conformance suite (`ruststream-conformance`) on MariaDB through mysql_async: every
//! scenario in every form, at `RUSTSTREAM_MYSQL_URL`, in a database per scenario.

mod harness;
mod lock;
mod rows;
mod session;

ruststream_conformance::conformance_tests! {
    rows: rows::Rows,
    harness: harness::MySqlAsyncHarness::new(),
}

//! The conformance suite (`ruststream-conformance`) on SQLite through rusqlite: every scenario
//! in the lease, advisory lock and custom lock forms; the row lock form is not applicable
//! (SQLite has no row locks).

mod harness;
mod lock;
mod rows;
mod session;

ruststream_conformance::conformance_tests! {
    rows: rows::Rows,
    harness: harness::RusqliteHarness::new(),
}

//! The conformance suite (`ruststream-conformance`) on PostgreSQL through tokio-postgres under
//! the simple query protocol: every statement's binds written into its text as literals. A
//! test target of its own: the suite's advisory keys are the database's, and its tables' names
//! are fixed, so it does not run beside `main.rs`'s suite in one process.

mod harness;
mod lock;
mod rows;
mod session;

ruststream_conformance::conformance_tests! {
    rows: rows::Rows,
    harness: harness::TokioPostgresHarness::new().simple_query(true),
}

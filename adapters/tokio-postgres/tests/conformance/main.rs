//! The conformance suite (`ruststream-conformance`) on PostgreSQL through tokio-postgres:
//! every scenario in every form, under the extended query protocol (prepared statements with
//! binds, the default).

mod harness;
mod lock;
mod rows;
mod session;

ruststream_conformance::conformance_tests! {
    rows: rows::Rows,
    harness: harness::TokioPostgresHarness::new(),
}

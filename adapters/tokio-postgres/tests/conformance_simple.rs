//! The conformance suite (`ruststream-conformance`) on PostgreSQL under the simple query
//! protocol: every statement's binds written into its text as literals. A test binary of its
//! own: the suite's advisory keys are the database's, and its tables' names are fixed, so it
//! does not run beside `conformance.rs` in one process.

ruststream_conformance::conformance_tests!(
    ruststream_conformance::tokio_postgres::TokioPostgresHarness::new().simple_query(true)
);

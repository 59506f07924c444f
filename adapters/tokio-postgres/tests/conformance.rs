//! The conformance suite (`ruststream-conformance`) on PostgreSQL: every scenario in every
//! form, under the extended query protocol (prepared statements with binds, the default).

ruststream_conformance::conformance_tests!(
    ruststream_conformance::tokio_postgres::TokioPostgresHarness::new()
);

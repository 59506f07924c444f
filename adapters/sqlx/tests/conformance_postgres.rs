//! The conformance suite (`ruststream-conformance`) on PostgreSQL through sqlx: every scenario
//! in every form, at `RUSTSTREAM_PG_URL`, in the database `<database>_cf_sqlx` beside the URL's
//! (its advisory keys apart from the tokio-postgres suite's) and a schema per scenario.

ruststream_conformance::conformance_tests!(ruststream_conformance::sqlx::SqlxPostgresHarness::new());

//! The conformance suite (`ruststream-conformance`) on MariaDB through sqlx: every scenario in
//! every form, at `RUSTSTREAM_MYSQL_URL`, in a database per scenario.

ruststream_conformance::conformance_tests!(ruststream_conformance::sqlx::SqlxMySqlHarness::new());

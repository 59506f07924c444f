//! The conformance suite (`ruststream-conformance`) on SQLite through sqlx: every scenario in
//! the lease, advisory lock and custom lock forms; the row lock form is not applicable (SQLite
//! has no row locks).

ruststream_conformance::conformance_tests!(ruststream_conformance::sqlx::SqlxSqliteHarness::new());

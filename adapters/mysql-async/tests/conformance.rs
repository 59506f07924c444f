//! The conformance suite (`ruststream-conformance`) on MariaDB through mysql_async: every
//! scenario in every form, at `RUSTSTREAM_MYSQL_URL`, in a database per scenario.

ruststream_conformance::conformance_tests!(
    ruststream_conformance::mysql_async::MySqlAsyncHarness::new()
);

//! The conformance suite (`ruststream-conformance`) on PostgreSQL through sqlx under the
//! simple query protocol (`SqlxBroker::simple_query(true)`: every statement sent whole, its
//! binds written into its text as literals, its rows read as text), the protocol that works
//! through a pooler in transaction pooling; at `RUSTSTREAM_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), in a database of the harness's own beside the
//! URL's (`<database>_cf_sqlx_simple`, created when missing), so that its advisory keys are
//! neither the tokio-postgres suite's nor those of the suite under prepared statements
//! (`conformance_postgres`), which may run at once on one server.

mod common;
mod lock;
mod postgres_harness;
mod rows;

ruststream_conformance::conformance_tests! {
    rows: rows::Rows,
    harness: postgres_harness::SqlxPostgresHarness::new().simple_query(),
}

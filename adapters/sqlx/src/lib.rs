//! The ruststream adapter for sqlx (`SqlxBroker`): it will run the statements the core
//! (`ruststream-core`) renders on PostgreSQL, MySQL/MariaDB and SQLite through sqlx pools.
//!
//! The adapter is not written yet; the crate holds its place in the workspace.

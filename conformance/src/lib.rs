//! The ruststream conformance suite: one set of scenarios that every adapter will run against
//! a real database (PostgreSQL, MariaDB and SQLite), for each form, including crash tests.
//!
//! The suite is not written yet; the crate holds its place in the workspace.

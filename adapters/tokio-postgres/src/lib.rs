//! The ruststream adapter for PostgreSQL on tokio-postgres: it will run the statements the
//! core (`ruststream-core`) renders on tokio-postgres connections.
//!
//! The adapter is not written yet; the crate holds its place in the workspace.

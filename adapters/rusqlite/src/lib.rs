//! The ruststream adapter for SQLite on rusqlite: it will run the statements the core
//! (`ruststream-core`) renders on blocking rusqlite connections, usable from any executor or
//! none.
//!
//! The adapter is not written yet; the crate holds its place in the workspace.

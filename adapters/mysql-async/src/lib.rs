//! The ruststream adapter for MySQL and MariaDB on mysql_async: it will run the statements
//! the core (`ruststream-core`) renders on mysql_async connections.
//!
//! The adapter is not written yet; the crate holds its place in the workspace.

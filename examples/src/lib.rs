//! The quick start and the examples of ruststream, run by the test suite.
//!
//! `cargo run --release --example quickstart` publishes a batch of jobs into a SQLite file under
//! `target/` (or, with `--url postgres://..` or `--url mysql://..`, into a server through sqlx),
//! processes them in the advisory lock form, and prints a summary.

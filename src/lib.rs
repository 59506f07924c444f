//! The quick start and the examples of ruststream, run by the test suite.
//!
//! `cargo run --release --example quickstart` publishes a batch of jobs into a SQLite file under
//! `target/`, processes them in the advisory lock form, and prints a summary.

//! Procedural macros for ruststream: `#[derive(Inbox)]`, `#[subscriber]` and
//! `#[ruststream::app]`, which will turn a table description into a checked queue
//! description and reject descriptions that break a rule at compile time.
//!
//! No macro is written yet; the crate holds its place in the workspace.

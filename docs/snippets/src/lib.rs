//! The README's and the user's guide's Rust blocks as doctests: each page is the doc comment
//! of a module, so `cargo test -p ruststream-guide --doc` compiles every ```` ```rust ```` block
//! of them, and runs those that need no database server (the others are `no_run`).
//!
//! The guide itself is the mdBook under `docs/` (`mdbook build docs`).

#[doc = include_str!("../../../README.md")]
pub mod readme {}

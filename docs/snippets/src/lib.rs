//! The README's and the user's guide's Rust blocks as doctests: each page is the doc comment
//! of a module, so `cargo test -p ruststream-guide --doc` compiles every ```` ```rust ```` block
//! of them, and runs those that need no database server (the others are `no_run`).
//!
//! The guide itself is the mdBook under `docs/` (`mdbook build docs`).

#[doc = include_str!("../../../README.md")]
pub mod readme {}

#[doc = include_str!("../../src/introduction.md")]
pub mod introduction {}

#[doc = include_str!("../../src/getting-started.md")]
pub mod getting_started {}

#[doc = include_str!("../../src/forms.md")]
pub mod forms {}

#[doc = include_str!("../../src/keys.md")]
pub mod keys {}

#[doc = include_str!("../../src/publishing.md")]
pub mod publishing {}

#[doc = include_str!("../../src/failures.md")]
pub mod failures {}

#[doc = include_str!("../../src/shutdown.md")]
pub mod shutdown {}

#[doc = include_str!("../../src/testing.md")]
pub mod testing {}

#[doc = include_str!("../../src/operating.md")]
pub mod operating {}

#[doc = include_str!("../../src/adapters.md")]
pub mod adapters {}

#[doc = include_str!("../../src/executors.md")]
pub mod executors {}

#[doc = include_str!("../../src/performance.md")]
pub mod performance {}

#[doc = include_str!("../../src/guarantees.md")]
pub mod guarantees {}

#[doc = include_str!("../../src/glossary.md")]
pub mod glossary {}

#[cfg(test)]
mod tests {
    /// Every page the book's summary lists is a module here, so a page added to the guide
    /// has its snippets compiled too.
    #[test]
    fn every_page_of_the_summary_is_included() {
        let summary = include_str!("../../src/SUMMARY.md");
        let this = include_str!("lib.rs");
        let pages: Vec<&str> = summary
            .split("](")
            .skip(1)
            .filter_map(|rest| rest.split(')').next())
            .collect();
        assert!(pages.len() >= 12, "the summary lists {pages:?}");
        for page in pages {
            let include = format!("include_str!(\"../../src/{page}\")");
            assert!(
                this.contains(&include),
                "docs/src/{page} is in SUMMARY.md but not included in docs/snippets/src/lib.rs"
            );
        }
    }
}

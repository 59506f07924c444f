//! The ruststream conformance suite: one set of scenarios that every adapter runs against a
//! real database, in each form (spec `forms.md`, `advisory.md`, `lock.md`, `shutdown.md`),
//! crash tests included.
//!
//! Each scenario is a `pub async fn` in [`scenarios`], generic over a [`Harness`]: the adapter's
//! side of the suite, which makes a broker for a scenario, runs SQL on a connection of its own
//! for setup and assertions, names its dialect and states its [`Capabilities`]. A scenario that
//! cannot apply on a harness answers [`NotApplicable`] with the reason; the generated test
//! prints one line, `not applicable on <harness>: <reason>`, and passes. Nothing is skipped
//! silently.
//!
//! An adapter's `tests/conformance.rs` is a few lines:
//!
//! ```text
//! ruststream_conformance::conformance_tests!(
//!     ruststream_conformance::rusqlite::RusqliteHarness::new()
//! );
//! ```
//!
//! [`conformance_tests!`] expands into one `#[test]` per scenario and form: a module per
//! scenario that runs in several forms (`claim_order::lease`, `claim_order::advisory`, ...), a
//! function for a scenario of one form (`custom_lock_answers`). Filter them as usual:
//! `cargo test --test conformance claim_order`.
//!
//! # Tables
//!
//! Every scenario and form has a table of its own (`cf_<scenario>_<form>`, [`rows`]), created
//! by the scenario with DDL the suite renders per dialect ([`schema`]) and dropped first, so
//! the scenarios run in parallel on one server database. The row types implement
//! `InboxTable`, `PayloadRow` and `AttemptRow` by hand and decode with serde, with
//! `sqlx::FromRow` (feature `sqlx`) and with mysql_async's `FromRow` (feature `mysql-async`).
//!
//! # Harnesses
//!
//! | feature | harness | database |
//! |---|---|---|
//! | `rusqlite` | [`rusqlite::RusqliteHarness`] | SQLite, a file per scenario |
//! | `tokio-postgres` | [`tokio_postgres::TokioPostgresHarness`] | PostgreSQL at `RUSTSTREAM_PG_URL`, a schema per scenario |
//! | `sqlx` | [`sqlx::SqlxPostgresHarness`] | PostgreSQL at `RUSTSTREAM_PG_URL`, in the database `<database>_cf_sqlx`, a schema per scenario |
//! | `sqlx` | [`sqlx::SqlxMySqlHarness`] | MariaDB at `RUSTSTREAM_MYSQL_URL`, a database per scenario |
//! | `sqlx` | [`sqlx::SqlxSqliteHarness`] | SQLite, a file per scenario |
//! | `mysql-async` | [`mysql_async::MySqlAsyncHarness`] | MariaDB at `RUSTSTREAM_MYSQL_URL`, a database per scenario |
//!
//! A scenario's advisory keys are fixed (`<table>-<k>`): the harnesses of one server keep
//! them apart by database (a PostgreSQL advisory lock and a MariaDB lock name belong to a
//! database), so the suites run at once on one server.
//!
//! # The forms
//!
//! [`Form::Lease`], [`Form::Advisory`] and [`Form::Custom`] (the advisory lock form with the
//! service's own `Lock` and `Unlock` of a `held_keys` table, `lock.md`) run on every database.
//! [`Form::RowLock`] runs where the harness's [`Harness::RowLock`] is [`RowLocks`]; SQLite's is
//! [`NoRowLocks`]: a row lock table on SQLite does not compile.
//!
//! # Adding an adapter
//!
//! Add a feature to this crate with a harness (see [`rusqlite`]) and the adapter's `Lock` and
//! `Unlock` of the suite's custom-lock rows (see `rows.rs`), enable it in the adapter's
//! dev-dependency on this crate, and invoke [`conformance_tests!`] in its `tests/conformance.rs`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod harness;
pub mod rows;
pub mod scenarios;
pub mod schema;
mod support;

#[cfg(feature = "mysql-async")]
pub mod mysql_async;
#[cfg(feature = "rusqlite")]
pub mod rusqlite;
#[cfg(feature = "sqlx")]
pub mod sqlx;
#[cfg(feature = "tokio-postgres")]
pub mod tokio_postgres;
#[cfg(any(feature = "sqlx", feature = "mysql-async"))]
mod urls;

use std::fmt;
use std::future::Future;

pub use harness::{
    Capabilities, Harness, HarnessFuture, HarnessResult, HeldKey, NoRowLocks, RowLockSupport,
    RowLocks, Support,
};
pub use rows::{Body, RowLockAdapter, SuiteAdapter, SuiteRow, Tables};
pub use support::Cx;

/// The environment variable that tells a child process of the suite to play the worker of a
/// crash test; its value names the scenario's database.
pub const CHILD_ENV: &str = "RUSTSTREAM_CONFORMANCE_CHILD";

/// The form a scenario runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Form {
    /// The row lock form: `FOR UPDATE SKIP LOCKED` in a transaction held while the handler
    /// runs. Not on SQLite.
    RowLock,
    /// The lease form: `locked_until` written into the row.
    Lease,
    /// The advisory lock form with the database's locks (on SQLite, the process's registry).
    Advisory,
    /// The advisory lock form with the service's own `Lock` and `Unlock` of a `held_keys`
    /// table (lock.md).
    Custom,
}

impl Form {
    /// The form's name in table and test names: `row_lock`, `lease`, `advisory`, `custom`.
    pub const fn name(self) -> &'static str {
        match self {
            Form::RowLock => "row_lock",
            Form::Lease => "lease",
            Form::Advisory => "advisory",
            Form::Custom => "custom",
        }
    }
}

impl fmt::Display for Form {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a scenario does not apply on a harness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotApplicable {
    /// The harness's name.
    pub harness: &'static str,
    /// Why, such as "SQLite has no row locks".
    pub reason: String,
}

impl fmt::Display for NotApplicable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not applicable on {}: {}", self.harness, self.reason)
    }
}

/// What a scenario answers: it ran and every assertion held (a failed assertion panics), or it
/// does not apply.
pub type Verdict = Result<(), NotApplicable>;

/// The name libtest gives a generated test, which a crash test passes to the child process it
/// starts (`--exact`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestName(String);

impl TestName {
    /// The name of the test function `function` in the module `module_path` (as
    /// `module_path!()` gives it, the crate's name first): the path without the crate.
    pub fn new(module_path: &str, function: &str) -> Self {
        match module_path.split_once("::") {
            Some((_, inner)) => Self(format!("{inner}::{function}")),
            None => Self(function.to_owned()),
        }
    }

    /// The name as libtest matches it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TestName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Runs one generated test: builds a multi-threaded tokio runtime, runs the scenario, and
/// prints `not applicable on <harness>: <reason>` when it does not apply. A failed assertion
/// panics, and fails the test.
pub fn run_test<F, Fut>(module_path: &str, function: &str, scenario: F)
where
    F: FnOnce(TestName) -> Fut,
    Fut: Future<Output = Verdict>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime for the scenario");
    let test = TestName::new(module_path, function);
    if let Err(not_applicable) = runtime.block_on(scenario(test)) {
        println!("{not_applicable}");
    }
}

/// Expands into one `#[test]` per scenario and form of the suite, each running the scenario
/// on the harness the expression builds (evaluated anew in each test, inside its runtime).
///
/// Invoke it once per module, in an adapter's `tests/conformance.rs`:
///
/// ```text
/// ruststream_conformance::conformance_tests!(
///     ruststream_conformance::rusqlite::RusqliteHarness::new()
/// );
/// ```
///
/// A scenario of several forms becomes a module of one test per form (`claim_order::lease`,
/// `claim_order::advisory`, `claim_order::custom`, `claim_order::row_lock`); a scenario of one
/// form becomes one test (`custom_lock_answers`).
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr $(,)?) => {
        /// The harness every generated test runs on.
        #[allow(dead_code)]
        fn __conformance_harness() -> impl $crate::Harness {
            $harness
        }

        $crate::conformance_tests!(@forms claim_order: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms ack_deletes: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms ack_marks_processed: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms reject_settles_without_retry: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms retry_counts_the_attempt: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms undecodable_payload_rejected: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms key_one_at_a_time: advisory Advisory, custom Custom);
        $crate::conformance_tests!(@forms key_held_elsewhere: advisory Advisory, custom Custom);
        $crate::conformance_tests!(@forms dropped_delivery_returns: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms claims_ahead: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms workers: advisory Advisory, custom Custom);
        $crate::conformance_tests!(@forms shutdown_releases_locks: advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms shutdown_counts_locks_released: advisory Advisory, custom Custom);
        $crate::conformance_tests!(@forms sigkill_worker: lease Lease, advisory Advisory, row_lock RowLock);
        $crate::conformance_tests!(@forms killed_connection: advisory Advisory);
        $crate::conformance_tests!(@forms killed_while_claimed_ahead: advisory Advisory);
        $crate::conformance_tests!(@one custom_lock_answers);
        $crate::conformance_tests!(@one lease_extended_while_in_work);
        $crate::conformance_tests!(@one lease_acks_together);
        $crate::conformance_tests!(@one lease_marks_together);
        $crate::conformance_tests!(@one lease_kept_past_shutdown);
        $crate::conformance_tests!(@one publisher_closed_after_shutdown);
        $crate::conformance_tests!(@one publish_all_writes_every_row);
    };
    (@forms $scenario:ident: $($test:ident $form:ident),+) => {
        #[doc = concat!("The scenario `", stringify!($scenario), "`, one test per form.")]
        mod $scenario {
            $(
                #[test]
                fn $test() {
                    $crate::run_test(module_path!(), stringify!($test), |test| async move {
                        let harness = super::__conformance_harness();
                        $crate::scenarios::$scenario(&harness, $crate::Form::$form, &test).await
                    });
                }
            )+
        }
    };
    (@one $scenario:ident) => {
        #[test]
        fn $scenario() {
            $crate::run_test(module_path!(), stringify!($scenario), |test| async move {
                let harness = __conformance_harness();
                $crate::scenarios::$scenario(&harness, &test).await
            });
        }
    };
}

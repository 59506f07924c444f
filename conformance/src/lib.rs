//! The ruststream conformance suite: one set of scenarios that every adapter runs against a
//! real database, in each form ([the forms](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md), [the advisory form](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#the-advisory-form), [custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)), crash tests and
//! [shutdown](https://github.com/ruststream/ruststream/blob/main/docs/src/shutdown.md) included.
//!
//! The suite depends on no adapter and no driver (its `tests/deps.rs` checks it): it holds the
//! scenarios, the harness trait, the schema and the macros; each adapter's tests hold the
//! adapter's side. Each scenario is a `pub async fn` in [`scenarios`], generic over the suite's
//! rows ([`Rows`]) and a [`Harness`]: the adapter's side of the suite, which makes a broker for
//! a scenario, runs SQL on a connection of its own for setup and assertions, names its dialect
//! and states its [`Capabilities`]. A scenario that cannot apply on a harness answers
//! [`NotApplicable`] with the reason; the generated test prints one line, `not applicable on
//! <harness>: <reason>`, and passes. Nothing is skipped silently.
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
//! `InboxTable`, `PayloadRow` and `AttemptRow` by hand; [`suite_rows!`] defines them in an
//! adapter's tests, where they derive the trait the adapter decodes rows with and implement
//! its custom lock.
//!
//! # Harnesses
//!
//! Each adapter's `tests/conformance/` holds its harnesses, its custom lock and the suite's
//! rows as it decodes them, and runs the suite in one test target per harness:
//!
//! | adapter | test target (root file in `tests/conformance/`) | harness | database |
//! |---|---|---|---|
//! | `ruststream-rusqlite` | `conformance` (`main.rs`) | `RusqliteHarness` | SQLite, a file per scenario |
//! | `ruststream-tokio-postgres` | `conformance` (`main.rs`) | `TokioPostgresHarness` | PostgreSQL at `RUSTSTREAM_PG_URL`, a schema per scenario |
//! | `ruststream-tokio-postgres` | `conformance_simple` (`simple.rs`) | `TokioPostgresHarness`, simple query protocol | PostgreSQL at `RUSTSTREAM_PG_URL`, a schema per scenario |
//! | `ruststream-sqlx` | `conformance_postgres` (`postgres.rs`) | `SqlxPostgresHarness` | PostgreSQL at `RUSTSTREAM_PG_URL`, in the database `<database>_cf_sqlx`, a schema per scenario |
//! | `ruststream-sqlx` | `conformance_mariadb` (`mariadb.rs`) | `SqlxMySqlHarness` | MariaDB at `RUSTSTREAM_MYSQL_URL`, a database per scenario |
//! | `ruststream-sqlx` | `conformance_sqlite` (`sqlite.rs`) | `SqlxSqliteHarness` | SQLite, a file per scenario |
//! | `ruststream-mysql-async` | `conformance` (`main.rs`) | `MySqlAsyncHarness` | MariaDB at `RUSTSTREAM_MYSQL_URL`, a database per scenario |
//!
//! A scenario's advisory keys are fixed (`<table>-<k>`): the harnesses of one server keep
//! them apart by database (a PostgreSQL advisory lock and a MariaDB lock name belong to a
//! database), so the suites run at once on one server. Two harnesses that share a database
//! (tokio-postgres's two protocols) run in test targets of their own, which cargo runs one
//! after the other.
//!
//! What the harnesses share beside the trait is here, free of any driver: the servers'
//! URLs and the locators made from them ([`urls`]), the files of a SQLite harness
//! ([`SqliteFiles`]), and the statements of the custom lock ([`schema::lock_statements`]).
//!
//! # The forms
//!
//! [`Form::Lease`], [`Form::Advisory`] and [`Form::Custom`] (the advisory lock form with the
//! service's own `Lock` and `Unlock` of a `held_keys` table, [custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)) run on every database.
//! [`Form::RowLock`] runs where the harness's [`Harness::RowLock`] is [`RowLocks`]; SQLite's is
//! [`NoRowLocks`]: a row lock table on SQLite does not compile.
//!
//! # Adding an adapter
//!
//! The adapter dev-depends on this crate (no feature) and gets a test directory
//! `tests/conformance/` that holds:
//!
//! - `harness.rs`: a type that implements [`Harness`] for the adapter's broker: `prepare`
//!   gives each scenario a database (or schema, or file) of its own, `execute` and
//!   `query_i64s` run the scenario's SQL on a connection of the harness's own,
//!   [`Capabilities`] says which of `hold_key`, `kill_key_holder` and killing a worker process
//!   it supports, and [`Harness::RowLock`] whether the adapter takes the row lock form.
//! - `lock.rs`: the suite's custom lock on the adapter's connection type, which runs the
//!   statements of [`schema::lock_statements`] on the scenario's `held_keys` table.
//! - `rows.rs`: the suite's rows, [`suite_rows!`], with the derive the adapter's `TakesRows`
//!   needs (`serde::Deserialize`, `sqlx::FromRow`, ...) and a callback macro that implements
//!   the adapter's `Lock` and `Unlock` for a custom-lock row with `lock.rs`'s lock.
//! - `main.rs`: the root of the test target `conformance`, which declares the modules above
//!   and invokes [`conformance_tests!`] with the rows and the harness.
//!
//! An adapter of several harnesses that must not share a process gives each a root file of
//! its own, declared as a `[[test]]` in its `Cargo.toml`: tokio-postgres's `simple.rs` beside
//! `main.rs`; sqlx's `postgres.rs`, `mariadb.rs` and `sqlite.rs`, each holding its harness, all
//! sharing `lock.rs`, `rows.rs` and `common.rs`. Where the adapter does not take a row type of
//! the suite (a decoding it lacks, a custom lock it does not implement, a row lock table on a
//! harness whose `RowLock` is [`RowLocks`] but whose database has none), the invocation of
//! [`conformance_tests!`] does not compile: [`Runs`] fails for the scenario's tables.
//!
//! A driver's code lives only there: this crate takes no adapter, so no dependency circle
//! joins the adapter and its suite.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod files;
mod harness;
pub mod rows;
pub mod scenarios;
pub mod schema;
pub mod servers;
pub mod session;
mod support;
pub mod urls;

use std::fmt;
use std::future::Future;

pub use files::SqliteFiles;
pub use harness::{
    Capabilities, ClaimFuture, Harness, HarnessFuture, HarnessResult, HeldKey, NoRowLocks,
    RowLockSupport, RowLockTable, RowLocks, Runs, Support, TxEnd, abort_in_transaction,
};
pub use rows::{Body, Rows, SuiteRow, Tables};
pub use support::Cx;

/// What the macros' expansions name in an adapter's tests.
#[doc(hidden)]
pub mod __private {
    pub use ruststream;
}

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
    /// table ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)).
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
/// on the suite's rows (`rows:`, the `Rows` of [`suite_rows!`]) and the harness the
/// expression builds (`harness:`, evaluated anew in each test, inside its runtime).
///
/// Invoke it once per module, usually at the root of an adapter's test target, so the tests
/// get the suite's names (`claim_order::lease`, ...). A crash test re-runs the test binary with
/// its test's full name, so it finds itself wherever the tests are generated.
///
/// ```text
/// mod harness;
/// mod lock;
/// mod rows;
///
/// ruststream_conformance::conformance_tests! {
///     rows: rows::Rows,
///     harness: harness::RusqliteHarness::new(),
/// }
/// ```
///
/// A scenario of several forms becomes a module of one test per form (`claim_order::lease`,
/// `claim_order::advisory`, `claim_order::custom`, `claim_order::row_lock`); a scenario of one
/// form becomes one test (`custom_lock_answers`). The rows and the harness are named as at the
/// invocation: each module of tests sees its parent's items.
#[macro_export]
macro_rules! conformance_tests {
    (rows: $rows:ty, harness: $harness:expr $(,)?) => {
        /// The suite's rows every generated test runs on.
        type __ConformanceRows = $rows;

        $crate::conformance_tests!(@forms [$harness] claim_order: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] ack_deletes: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] ack_marks_processed: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] retry_counts_the_attempt: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] reject_keeps_the_row_failed: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] undecodable_rows_fail: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] delayed_retry_waits: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] failing_row_waits_its_delay: advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] max_attempts_fails_the_row: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] crashing_worker_fails_its_row: lease Lease, advisory Advisory, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] panics_and_timeouts_retry: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] failed_rows_redriven_or_deleted: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] key_one_at_a_time: advisory Advisory, custom Custom);
        $crate::conformance_tests!(@forms [$harness] key_held_elsewhere: advisory Advisory, custom Custom);
        $crate::conformance_tests!(@forms [$harness] panicking_handler_returns_the_row: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] claims_ahead: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] workers: advisory Advisory, custom Custom);
        $crate::conformance_tests!(@forms [$harness] shutdown_releases_locks: advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] shutdown_counts_locks_released: advisory Advisory, custom Custom);
        $crate::conformance_tests!(@forms [$harness] sigkill_worker: lease Lease, advisory Advisory, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] killed_connection: advisory Advisory);
        $crate::conformance_tests!(@forms [$harness] killed_while_claimed_ahead: advisory Advisory);
        $crate::conformance_tests!(@forms [$harness] two_brokers_share_keys: advisory Advisory);
        $crate::conformance_tests!(@forms [$harness] free_keys_flow_past_a_held_key: advisory Advisory);
        $crate::conformance_tests!(@forms [$harness] hot_key_long_handler: advisory Advisory);
        $crate::conformance_tests!(@forms [$harness] brokers_count_each_take_once: lease Lease, advisory Advisory, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] claim_commits_with_the_ack: lease Lease, advisory Advisory, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] service_records_its_metrics: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] brokers_add_their_gauges: lease Lease, advisory Advisory, row_lock RowLock);
        $crate::conformance_tests!(@forms [$harness] missing_table_fails_the_start: lease Lease, advisory Advisory, custom Custom, row_lock RowLock);
        $crate::conformance_tests!(@one [$harness] custom_lock_answers);
        $crate::conformance_tests!(@one [$harness] lease_extended_while_in_work);
        $crate::conformance_tests!(@one [$harness] lease_acks_together);
        $crate::conformance_tests!(@one [$harness] lease_marks_together);
        $crate::conformance_tests!(@one [$harness] lease_kept_past_shutdown);
        $crate::conformance_tests!(@one [$harness] publisher_closed_after_shutdown);
        $crate::conformance_tests!(@one [$harness] publish_all_writes_every_row);
        $crate::conformance_tests!(@one [$harness] outbox_commits_with_the_transaction);
        $crate::conformance_tests!(@one [$harness] outbox_skips_rows_already_there);
        $crate::conformance_tests!(@one [$harness] role_fields_checked_at_start);
        $crate::conformance_tests!(@one [$harness] statements_lease_form);
        $crate::conformance_tests!(@one [$harness] statements_lease_claim_reads_back_the_expiry_it_wrote);
        $crate::conformance_tests!(@one [$harness] statements_lease_settlements_in_one_statement);
        $crate::conformance_tests!(@one [$harness] statements_lease_claims_skip_held_rows);
        $crate::conformance_tests!(@one [$harness] statements_advisory_form);
        $crate::conformance_tests!(@one [$harness] statements_row_lock_form);
        $crate::conformance_tests!(@one [$harness] statements_row_lock_counts_the_attempt_before_it_locks);
        $crate::conformance_tests!(@one [$harness] statements_advisory_take_reads_only_claimable_rows);
    };
    (@forms [$harness:expr] $scenario:ident: $($test:ident $form:ident),+) => {
        #[doc = concat!("The scenario `", stringify!($scenario), "`, one test per form.")]
        mod $scenario {
            use super::*;

            $(
                #[test]
                fn $test() {
                    $crate::run_test(module_path!(), stringify!($test), |test| async move {
                        let harness = $harness;
                        $crate::scenarios::$scenario::<__ConformanceRows, _>(
                            &harness,
                            $crate::Form::$form,
                            &test,
                        )
                        .await
                    });
                }
            )+
        }
    };
    (@one [$harness:expr] $scenario:ident) => {
        #[test]
        fn $scenario() {
            $crate::run_test(module_path!(), stringify!($scenario), |test| async move {
                let harness = $harness;
                $crate::scenarios::$scenario::<__ConformanceRows, _>(&harness, &test).await
            });
        }
    };
}

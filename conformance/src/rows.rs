//! The suite's message, the traits of its row types, and
//! [`suite_rows!`](crate::suite_rows): the macro that defines the row types (one per scenario
//! and form, each on a table of its own) in an adapter's tests.
//!
//! The row types live in the adapter's tests, not here: each adapter decodes rows with a
//! trait of its driver (`sqlx::FromRow`, mysql_async's `FromRow`, serde's `Deserialize`) and
//! takes a custom lock through its own `Lock` and `Unlock`, and the orphan rules let only the
//! crate that defines a type implement a driver's trait for it.
//! [`suite_rows!`](crate::suite_rows) expands there into the same types for every adapter,
//! with the adapter's derives and its custom lock, and into the [`Rows`] that the scenarios
//! are generic over.
//!
//! A row holds the id, the attempt and the payload; the description also names `k` (the key's
//! column), `locked_until` and `processed_at`, which need no Rust field: rows need no time
//! types. The DDL ([`schema`]) makes every field decodable on every database: `id` and
//! `attempt` are `BIGINT` (SQLite `INTEGER`), read as `i64`; `payload` is binary, read as
//! `Vec<u8>`.
//!
//! [`schema`]: crate::schema
//!
//! The custom-lock rows ([`Form::Custom`]) take the adapter's `Lock` and `Unlock` on the table
//! `<table>_held_keys` of [custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks) ([`schema::lock_statements`](crate::schema::lock_statements)):
//! one per scenario table, so scenarios run in parallel on one server.

use futures::future::LocalBoxFuture;
use ruststream::adapter::TakesRows;
use ruststream::{AttemptRow, InboxTable, PayloadRow};
use serde::{Deserialize, Serialize};

use crate::Form;
use crate::harness::Harness;
use crate::support::Cx;

/// The suite's message: a number, which the scenarios give each row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// The message's number.
    pub n: i64,
}

/// A row type of the suite: its table's name, form and settlement.
pub trait SuiteRow:
    InboxTable<Id = i64>
    + PayloadRow
    + AttemptRow<Attempt = i64>
    + ruststream::DecodesAs<Job>
    + Send
    + Sync
    + 'static
{
    /// The form its description selects.
    const FORM: Form;
    /// Its table's name.
    const NAME: &'static str;
    /// Whether a settlement marks `processed_at` instead of deleting the row.
    const PROCESSED: bool;
    /// Whether the table keeps failed rows: it has `due_at`, `failed_at`, `error` and `errors`.
    const FAILING: bool;
}

/// A scenario's body, generic over the row type of the form it runs in.
pub trait Body {
    /// Runs the body on `T`'s table.
    fn run<'a, H: Harness, T: SuiteRow>(self, cx: &'a Cx<'a, H>) -> LocalBoxFuture<'a, ()>
    where
        H::Adapter: TakesRows<T>;
}

/// A scenario's tables: its row type in each form, all with the same settlement.
pub trait Tables: 'static {
    /// The lease form's row.
    type Lease: SuiteRow;
    /// The advisory lock form's row.
    type Advisory: SuiteRow;
    /// The custom lock form's row, with the adapter's `Lock` and `Unlock`.
    type Custom: SuiteRow;
    /// The row lock form's row.
    type RowLock: SuiteRow;

    /// Whether a settlement marks `processed_at` instead of deleting the row.
    const PROCESSED: bool = <Self::Lease as SuiteRow>::PROCESSED;
    /// Whether the tables keep failed rows.
    const FAILING: bool = <Self::Lease as SuiteRow>::FAILING;

    /// The table of `form`.
    fn table(form: Form) -> &'static str {
        match form {
            Form::Lease => <Self::Lease as SuiteRow>::NAME,
            Form::Advisory => <Self::Advisory as SuiteRow>::NAME,
            Form::Custom => <Self::Custom as SuiteRow>::NAME,
            Form::RowLock => <Self::RowLock as SuiteRow>::NAME,
        }
    }
}

/// The list of the suite's tables: each scenario's module, its type in [`Rows`], and its
/// settlement (`delete`, or `processed` for a table with `processed_at`). Expands into
/// `$crate::__rows!($mode [$($args)*] [<the list>])`.
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_tables {
    ($mode:ident [$($args:tt)*]) => {
        $crate::__rows! { $mode [$($args)*] [
            claim_order ClaimOrder delete;
            ack_deletes AckDeletes delete;
            ack_marks_processed AckMarksProcessed processed;
            retry_counts_the_attempt RetryCountsTheAttempt processed;
            reject_keeps_the_row_failed RejectKeepsTheRowFailed failing;
            undecodable_rows_fail UndecodableRowsFail failing;
            delayed_retry_waits DelayedRetryWaits failing;
            failing_row_waits_its_delay FailingRowWaitsItsDelay delete;
            max_attempts_fails_the_row MaxAttemptsFailsTheRow failing;
            crashing_worker_fails_its_row CrashingWorkerFailsItsRow failing;
            panics_and_timeouts_retry PanicsAndTimeoutsRetry failing;
            failed_rows_redriven_or_deleted FailedRowsRedrivenOrDeleted failing;
            key_one_at_a_time KeyOneAtATime delete;
            key_held_elsewhere KeyHeldElsewhere delete;
            panicking_handler_returns_the_row PanickingHandlerReturnsTheRow processed;
            custom_lock_answers CustomLockAnswers delete;
            workers Workers delete;
            shutdown_releases_locks ShutdownReleasesLocks delete;
            shutdown_counts_locks_released ShutdownCountsLocksReleased delete;
            lease_kept_past_shutdown LeaseKeptPastShutdown delete;
            lease_extended_while_in_work LeaseExtendedWhileInWork delete;
            lease_acks_together LeaseAcksTogether delete;
            lease_marks_together LeaseMarksTogether processed;
            claims_ahead ClaimsAhead delete;
            publisher_closed_after_shutdown PublisherClosedAfterShutdown delete;
            publish_all_writes_every_row PublishAllWritesEveryRow delete;
            outbox_commits_with_the_transaction OutboxCommitsWithTheTransaction delete;
            sigkill_worker SigkillWorker delete;
            killed_connection KilledConnection delete;
            killed_while_claimed_ahead KilledWhileClaimedAhead delete;
            two_brokers_share_keys TwoBrokersShareKeys delete;
            free_keys_flow_past_a_held_key FreeKeysFlowPastAHeldKey delete;
            hot_key_long_handler HotKeyLongHandler delete;
            brokers_count_each_take_once BrokersCountEachTakeOnce failing;
            claim_commits_with_the_ack ClaimCommitsWithTheAck delete;
            service_records_its_metrics ServiceRecordsItsMetrics failing;
            brokers_add_their_gauges BrokersAddTheirGauges delete;
            missing_table_fails_the_start MissingTableFailsTheStart delete;
        ] }
    };
}

/// What [`__suite_tables!`] lists becomes, by its mode: the trait [`Rows`] (`trait`, in this
/// crate) or the row types of [`suite_rows!`](crate::suite_rows) (`rows`, in an adapter's tests).
#[doc(hidden)]
#[macro_export]
macro_rules! __rows {
    (trait [] [$($module:ident $tables:ident $settle:ident;)+]) => {
        /// The suite's row types: the tables of each scenario, which the scenarios are generic
        /// over. [`suite_rows!`](crate::suite_rows)(crate::suite_rows) implements it, in an adapter's tests, for
        /// the rows as that adapter decodes them.
        pub trait Rows: 'static {
            $(
                #[doc = concat!(
                    "The tables of the scenario [`", stringify!($module),
                    "`](crate::scenarios::", stringify!($module), ")."
                )]
                type $tables: Tables;
            )+
            /// The lease table of the scenario
            /// [`role_fields_checked_at_start`](crate::scenarios::role_fields_checked_at_start),
            /// with `#[derive(Inbox)]` and a field `locked_until: Option<i64>`: right on
            /// SQLite, where the column is an integer, and a type no server's time column
            /// decodes into.
            type RoleFieldAsInteger: SuiteRow;
            /// The same table with `#[derive(Inbox)]` naming `locked_until` in `#[inbox(..)]`,
            /// without a field.
            type RoleColumnOnly: SuiteRow;
            /// The lease table of the scenario
            /// [`outbox_skips_rows_already_there`](crate::scenarios::outbox_skips_rows_already_there),
            /// whose description names the unique column `order_id`.
            type Receipt: SuiteRow;
        }
    };

    (rows [$attrs:tt $lock:ident] [$($module:ident $tables:ident $settle:ident;)+]) => {
        $(
            #[doc = concat!("The tables of the scenario `", stringify!($module), "`, one per form.")]
            pub mod $module {
                $crate::__row!($attrs $lock, Lease, Lease, $settle, concat!("cf_", stringify!($module), "_lease"));
                $crate::__row!($attrs $lock, Advisory, Advisory, $settle, concat!("cf_", stringify!($module), "_advisory"));
                $crate::__row!($attrs $lock, Custom, Custom, $settle, concat!("cf_", stringify!($module), "_custom"));
                $crate::__row!($attrs $lock, RowLock, RowLock, $settle, concat!("cf_", stringify!($module), "_row_lock"));

                /// The scenario's tables.
                #[derive(Clone, Copy, Debug)]
                pub struct Family;

                impl $crate::Tables for Family {
                    type Lease = Lease;
                    type Advisory = Advisory;
                    type Custom = Custom;
                    type RowLock = RowLock;
                }
            }
        )+

        $crate::__derived_rows!($attrs);

        /// The suite's rows, as this crate's adapter decodes them.
        #[derive(Clone, Copy, Debug)]
        pub struct Rows;

        impl $crate::Rows for Rows {
            $(type $tables = $module::Family;)+
            type RoleFieldAsInteger = role_fields::AsInteger;
            type RoleColumnOnly = role_fields::ColumnOnly;
            type Receipt = receipts::Receipt;
        }
    };
}

/// The row types of [`suite_rows!`](crate::suite_rows) written with `#[derive(Inbox)]`.
#[doc(hidden)]
#[macro_export]
macro_rules! __derived_rows {
    ([$($attr:tt)*]) => {
        /// Rows written with `#[derive(Inbox)]` for the start check of role fields.
        pub mod role_fields {
            /// The table's name.
            pub const TABLE: &str = "cf_role_fields_lease";

            /// `locked_until` as an integer field.
            $($attr)*
            #[derive(Debug, ::ruststream::Inbox)]
            #[inbox(table = "cf_role_fields_lease")]
            pub struct AsInteger {
                /// The id.
                #[field(id, generated)]
                pub id: i64,
                /// The takes so far.
                #[field(attempt, generated)]
                pub attempt: i64,
                /// The encoded message.
                #[field(payload)]
                pub payload: Vec<u8>,
                /// The lease, as an integer.
                #[field(locked_until)]
                pub locked_until: Option<i64>,
            }

            /// `locked_until` named in `#[inbox(..)]`, without a field.
            $($attr)*
            #[derive(Debug, ::ruststream::Inbox)]
            #[inbox(table = "cf_role_fields_lease", locked_until = "locked_until")]
            pub struct ColumnOnly {
                /// The id.
                #[field(id, generated)]
                pub id: i64,
                /// The takes so far.
                #[field(attempt, generated)]
                pub attempt: i64,
                /// The encoded message.
                #[field(payload)]
                pub payload: Vec<u8>,
            }

            impl $crate::SuiteRow for AsInteger {
                const FORM: $crate::Form = $crate::Form::Lease;
                const NAME: &'static str = TABLE;
                const PROCESSED: bool = false;
                const FAILING: bool = false;
            }

            impl $crate::SuiteRow for ColumnOnly {
                const FORM: $crate::Form = $crate::Form::Lease;
                const NAME: &'static str = TABLE;
                const PROCESSED: bool = false;
                const FAILING: bool = false;
            }
        }

        /// A table that deduplicates its publishes by a unique column.
        pub mod receipts {
            /// A receipt's job, one per order: `order_id` holds a unique index.
            $($attr)*
            #[derive(Debug, ::ruststream::Inbox)]
            #[inbox(table = "cf_receipts_lease", locked_until = "locked_until", unique = "order_id")]
            pub struct Receipt {
                /// The id.
                #[field(id, generated)]
                pub id: i64,
                /// The order, once per table.
                pub order_id: i64,
                /// The takes so far.
                #[field(attempt, generated)]
                pub attempt: i64,
                /// The encoded message.
                #[field(payload)]
                pub payload: Vec<u8>,
            }

            impl $crate::SuiteRow for Receipt {
                const FORM: $crate::Form = $crate::Form::Lease;
                const NAME: &'static str = "cf_receipts_lease";
                const PROCESSED: bool = false;
                const FAILING: bool = false;
            }
        }
    };
}

/// One row type of [`suite_rows!`](crate::suite_rows).
#[doc(hidden)]
#[macro_export]
macro_rules! __row {
    ([$($attr:tt)*] $lock:ident, $ty:ident, $form:ident, $settle:ident, $name:expr) => {
        #[doc = concat!("A row of `", $name, "`.")]
        $($attr)*
        #[derive(Debug)]
        pub struct $ty {
            /// The id.
            pub id: i64,
            /// The takes so far.
            pub attempt: i64,
            /// The encoded message.
            pub payload: Vec<u8>,
        }

        impl $crate::__private::ruststream::InboxTable for $ty {
            type Id = i64;
            type Table = $crate::__row!(@type $form $settle);
            const TABLE: Self::Table = $crate::__row!(@spec $form $settle $name);

            fn id(&self) -> &i64 {
                &self.id
            }
        }

        impl $crate::__private::ruststream::PayloadRow for $ty {
            type Column = Vec<u8>;

            fn payload(&self) -> &[u8] {
                &self.payload
            }
        }

        impl $crate::__private::ruststream::AttemptRow for $ty {
            type Attempt = i64;

            fn attempt(&self) -> &i64 {
                &self.attempt
            }
        }

        impl $crate::SuiteRow for $ty {
            const FORM: $crate::Form = $crate::Form::$form;
            const NAME: &'static str = $name;
            const PROCESSED: bool = $crate::__row!(@processed $settle);
            const FAILING: bool = $crate::__row!(@failing $settle);
        }

        $crate::__row!(@lock $lock $form $ty);
    };

    (@processed delete) => { false };
    (@processed processed) => { true };
    (@processed failing) => { false };
    (@failing failing) => { true };
    (@failing $settle:ident) => { false };

    (@type Lease delete) => { $crate::__row!(@spec_type $crate::__private::ruststream::Lease, $crate::__private::ruststream::Attempt, $crate::__private::ruststream::Payload) };
    (@type Lease processed) => { $crate::__row!(@spec_type $crate::__private::ruststream::Lease, $crate::__private::ruststream::Attempt, $crate::__private::ruststream::Payload, $crate::__private::ruststream::Processed) };
    (@type Advisory delete) => { $crate::__row!(@spec_type $crate::__private::ruststream::Advisory, $crate::__private::ruststream::Attempt, $crate::__private::ruststream::Payload) };
    (@type Advisory processed) => { $crate::__row!(@spec_type $crate::__private::ruststream::Advisory, $crate::__private::ruststream::Attempt, $crate::__private::ruststream::Payload, $crate::__private::ruststream::Processed) };
    (@type Custom delete) => { $crate::__row!(@spec_type $crate::__private::ruststream::Advisory, $crate::__private::ruststream::Attempt, $crate::__private::ruststream::Payload, $crate::__private::ruststream::own::Lock, $crate::__private::ruststream::own::Unlock) };
    (@type Custom processed) => { $crate::__row!(@spec_type $crate::__private::ruststream::Advisory, $crate::__private::ruststream::Attempt, $crate::__private::ruststream::Payload, $crate::__private::ruststream::Processed, $crate::__private::ruststream::own::Lock, $crate::__private::ruststream::own::Unlock) };
    (@type RowLock delete) => { $crate::__row!(@spec_type $crate::__private::ruststream::Attempt, $crate::__private::ruststream::Payload) };
    (@type RowLock processed) => { $crate::__row!(@spec_type $crate::__private::ruststream::Attempt, $crate::__private::ruststream::Payload, $crate::__private::ruststream::Processed) };
    (@type Lease failing) => { $crate::__row!(@spec_type $crate::__private::ruststream::Lease, $crate::__private::ruststream::Attempt, $crate::__private::ruststream::Payload, $crate::__private::ruststream::Due, $crate::__private::ruststream::Failed, $crate::__private::ruststream::ErrorText) };
    (@type Advisory failing) => { $crate::__row!(@spec_type $crate::__private::ruststream::Advisory, $crate::__private::ruststream::Attempt, $crate::__private::ruststream::Payload, $crate::__private::ruststream::Due, $crate::__private::ruststream::Failed, $crate::__private::ruststream::ErrorText) };
    (@type Custom failing) => { $crate::__row!(@spec_type $crate::__private::ruststream::Advisory, $crate::__private::ruststream::Attempt, $crate::__private::ruststream::Payload, $crate::__private::ruststream::Due, $crate::__private::ruststream::Failed, $crate::__private::ruststream::ErrorText, $crate::__private::ruststream::own::Lock, $crate::__private::ruststream::own::Unlock) };
    (@type RowLock failing) => { $crate::__row!(@spec_type $crate::__private::ruststream::Attempt, $crate::__private::ruststream::Payload, $crate::__private::ruststream::Due, $crate::__private::ruststream::Failed, $crate::__private::ruststream::ErrorText) };
    (@spec_type $($feature:ty),+) => { $crate::__private::ruststream::InboxSpec<($($feature,)+)> };

    (@base $name:expr) => {
        $crate::__private::ruststream::InboxSpec::new(
            $name,
            $crate::__private::ruststream::Column::new("id").generated(),
        )
    };
    (@key $name:expr) => {
        &[
            $crate::__private::ruststream::KeyPart::Literal(concat!($name, "-")),
            $crate::__private::ruststream::KeyPart::Column("k"),
        ]
    };
    (@common $spec:expr) => {
        $spec
            .attempt($crate::__private::ruststream::Column::new("attempt").generated())
            .payload($crate::__private::ruststream::Column::new("payload"))
    };
    (@processed_at $spec:expr) => {
        $spec.processed_at($crate::__private::ruststream::Column::new("processed_at"))
    };
    (@failing $spec:expr) => {
        $spec
            .due($crate::__private::ruststream::Column::new("due_at"))
            .failed($crate::__private::ruststream::Column::new("failed_at"))
            .error($crate::__private::ruststream::Column::new("error"))
            .errors($crate::__private::ruststream::Column::new("errors"))
    };
    (@spec Lease delete $name:expr) => {
        $crate::__row!(@common $crate::__row!(@base $name)
            .lease($crate::__private::ruststream::Column::new("locked_until")))
    };
    (@spec Lease processed $name:expr) => {
        $crate::__row!(@processed_at $crate::__row!(@spec Lease delete $name))
    };
    (@spec Advisory delete $name:expr) => {
        $crate::__row!(@common $crate::__row!(@base $name).advisory($crate::__row!(@key $name)))
    };
    (@spec Advisory processed $name:expr) => {
        $crate::__row!(@processed_at $crate::__row!(@spec Advisory delete $name))
    };
    (@spec Lease failing $name:expr) => {
        $crate::__row!(@failing $crate::__row!(@spec Lease delete $name))
    };
    (@spec Advisory failing $name:expr) => {
        $crate::__row!(@failing $crate::__row!(@spec Advisory delete $name))
    };
    (@spec Custom failing $name:expr) => {
        $crate::__row!(@spec Advisory failing $name)
            .own::<$crate::__private::ruststream::own::Lock>()
            .own::<$crate::__private::ruststream::own::Unlock>()
    };
    (@spec RowLock failing $name:expr) => {
        $crate::__row!(@failing $crate::__row!(@spec RowLock delete $name))
    };
    (@spec Custom delete $name:expr) => {
        $crate::__row!(@spec Advisory delete $name)
            .own::<$crate::__private::ruststream::own::Lock>()
            .own::<$crate::__private::ruststream::own::Unlock>()
    };
    (@spec Custom processed $name:expr) => {
        $crate::__row!(@spec Advisory processed $name)
            .own::<$crate::__private::ruststream::own::Lock>()
            .own::<$crate::__private::ruststream::own::Unlock>()
    };
    (@spec RowLock delete $name:expr) => {
        $crate::__row!(@common $crate::__row!(@base $name))
    };
    (@spec RowLock processed $name:expr) => {
        $crate::__row!(@processed_at $crate::__row!(@spec RowLock delete $name))
    };

    (@lock $lock:ident Custom $ty:ident) => {
        $lock!($ty);
    };
    (@lock $lock:ident $form:ident $ty:ident) => {};
}

crate::__suite_tables!(trait []);

/// Defines the suite's row types in an adapter's tests, with the adapter's decoding and its
/// custom lock, and [`Rows`] over them: the rows a harness of the adapter runs the scenarios
/// on ([`conformance_tests!`](crate::conformance_tests)).
///
/// It takes the attributes every row type gets (the derive of the trait the adapter decodes
/// rows with) and, after `custom_lock:`, the name of a macro of the adapter's tests that
/// implements the adapter's `Lock` and `Unlock` for the row type it is given (an identifier in
/// the module of the row). The callback is expanded once for each custom-lock row; `<Self as
/// SuiteRow>::NAME` is its table, whose `held_keys` the lock works on
/// ([`schema::lock_statements`](crate::schema::lock_statements)).
///
/// ```text
/// macro_rules! custom_lock {
///     ($row:ident) => {
///         impl ruststream_rusqlite::Lock for $row {
///             fn lock(conn: &Connection, key: &str) -> rusqlite::Result<bool> {
///                 crate::lock::lock(conn, <Self as SuiteRow>::NAME, key)
///             }
///         }
///         // ... and `Unlock`
///     };
/// }
///
/// ruststream_conformance::suite_rows! {
///     #[derive(serde::Deserialize)]
///     custom_lock: custom_lock
/// }
/// ```
///
/// It expands where it is invoked into a module per scenario (`claim_order`, ...) holding the
/// scenario's row type of each form (`Lease`, `Advisory`, `Custom`, `RowLock`, on the tables
/// `cf_<scenario>_<form>`) and its [`Tables`] (`Family`), and the unit struct `Rows`, which
/// implements [`Rows`]. Invoke it in a module of its own.
#[macro_export]
macro_rules! suite_rows {
    ($(#[$attr:meta])* custom_lock: $lock:ident $(,)?) => {
        $crate::__suite_tables!(rows [[$(#[$attr])*] $lock]);
    };
}

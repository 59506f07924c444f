//! The suite's message, its row types (one per scenario and form, each on a table of its own),
//! and the dispatch of a scenario's body to the row type of its form.
//!
//! The row types implement `InboxTable`, `PayloadRow` and `AttemptRow` by hand. A row holds
//! the id, the attempt and the payload; the description also names `k` (the key's column),
//! `locked_until` and `processed_at`, which need no Rust field: rows need no time types. Rows
//! decode with serde (rusqlite, tokio-postgres); the `sqlx` feature derives `sqlx::FromRow`
//! beside it, and the `mysql-async` feature mysql_async's `FromRow`. The DDL ([`schema`])
//! makes every field decodable on every database: `id` and `attempt` are `BIGINT` (SQLite
//! `INTEGER`), read as `i64`; `payload` is binary, read as `Vec<u8>`.
//!
//! [`schema`]: crate::schema
//!
//! The custom-lock rows ([`Form::Custom`]) implement each adapter's `Lock` and `Unlock` behind
//! that adapter's feature, on the table `<table>_held_keys` of lock.md: one per scenario table,
//! so scenarios run in parallel on one server.

use futures::future::LocalBoxFuture;
use ruststream::adapter::{Adapter, TakesRows};
use ruststream::{AttemptRow, InboxTable, PayloadRow};
use serde::{Deserialize, Serialize};

use crate::harness::{Harness, RowLockSupport};
use crate::support::Cx;
use crate::{Form, NotApplicable};

/// The suite's message: a number, which the scenarios give each row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// The message's number.
    pub n: i64,
}

/// A row type of the suite: its table's name, form and settlement.
pub trait SuiteRow:
    InboxTable<Id = i64> + PayloadRow + AttemptRow<Attempt = i64> + Send + Sync + 'static
{
    /// The form its description selects.
    const FORM: Form;
    /// Its table's name.
    const NAME: &'static str;
    /// Whether a settlement marks `processed_at` instead of deleting the row.
    const PROCESSED: bool;
}

/// A scenario's body, generic over the row type of the form it runs in.
pub trait Body {
    /// Runs the body on `T`'s table.
    fn run<'a, H: Harness, T: SuiteRow>(self, cx: &'a Cx<'a, H>) -> LocalBoxFuture<'a, ()>
    where
        H::Adapter: TakesRows<T>;
}

/// A scenario's tables, one per form: picks the row type of a form for a [`Body`].
pub trait Tables {
    /// Whether a settlement marks `processed_at` instead of deleting the row.
    const PROCESSED: bool;

    /// The table of `form`.
    fn table(form: Form) -> &'static str;

    /// Runs `body` on the table of `form`, or answers why the form does not apply.
    fn run<'a, H: Harness, B: Body>(
        form: Form,
        body: B,
        cx: &'a Cx<'a, H>,
    ) -> Result<LocalBoxFuture<'a, ()>, NotApplicable>;

    /// Runs `body` on the row lock table, where the adapter takes it.
    fn row_lock<'a, H: Harness, B: Body>(body: B, cx: &'a Cx<'a, H>) -> LocalBoxFuture<'a, ()>
    where
        H::Adapter: RowLockAdapter;
}

/// One row type.
macro_rules! row {
    ($ty:ident, $form:ident, $settle:ident, $name:expr) => {
        #[doc = concat!("A row of `", $name, "`.")]
        #[derive(Debug, Deserialize)]
        #[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
        #[cfg_attr(feature = "mysql-async", derive(mysql_async::prelude::FromRow))]
        pub struct $ty {
            /// The id.
            pub id: i64,
            /// The takes so far.
            pub attempt: i64,
            /// The encoded message.
            pub payload: Vec<u8>,
        }

        impl InboxTable for $ty {
            type Id = i64;
            type Table = row!(@type $form $settle);
            const TABLE: Self::Table = row!(@spec $form $settle $name);

            fn id(&self) -> &i64 {
                &self.id
            }
        }

        impl PayloadRow for $ty {
            type Column = Vec<u8>;

            fn payload(&self) -> &[u8] {
                &self.payload
            }
        }

        impl AttemptRow for $ty {
            type Attempt = i64;

            fn attempt(&self) -> &i64 {
                &self.attempt
            }
        }

        impl SuiteRow for $ty {
            const FORM: Form = Form::$form;
            const NAME: &'static str = $name;
            const PROCESSED: bool = row!(@processed $settle);
        }

        row!(@lock $form $ty);
    };

    (@processed delete) => { false };
    (@processed processed) => { true };

    (@type Lease delete) => { ::ruststream::InboxSpec<(::ruststream::Lease, ::ruststream::Attempt, ::ruststream::Payload)> };
    (@type Lease processed) => { ::ruststream::InboxSpec<(::ruststream::Lease, ::ruststream::Attempt, ::ruststream::Payload, ::ruststream::Processed)> };
    (@type Advisory delete) => { ::ruststream::InboxSpec<(::ruststream::Advisory, ::ruststream::Attempt, ::ruststream::Payload)> };
    (@type Advisory processed) => { ::ruststream::InboxSpec<(::ruststream::Advisory, ::ruststream::Attempt, ::ruststream::Payload, ::ruststream::Processed)> };
    (@type Custom delete) => { ::ruststream::InboxSpec<(::ruststream::Advisory, ::ruststream::Attempt, ::ruststream::Payload, ::ruststream::own::Lock, ::ruststream::own::Unlock)> };
    (@type Custom processed) => { ::ruststream::InboxSpec<(::ruststream::Advisory, ::ruststream::Attempt, ::ruststream::Payload, ::ruststream::Processed, ::ruststream::own::Lock, ::ruststream::own::Unlock)> };
    (@type RowLock delete) => { ::ruststream::InboxSpec<(::ruststream::Attempt, ::ruststream::Payload)> };
    (@type RowLock processed) => { ::ruststream::InboxSpec<(::ruststream::Attempt, ::ruststream::Payload, ::ruststream::Processed)> };

    (@base $name:expr) => {
        ::ruststream::InboxSpec::new($name, ::ruststream::Column::new("id").generated())
    };
    (@key $name:expr) => {
        &[
            ::ruststream::KeyPart::Literal(concat!($name, "-")),
            ::ruststream::KeyPart::Column("k"),
        ]
    };
    (@common $spec:expr) => {
        $spec
            .attempt(::ruststream::Column::new("attempt").generated())
            .payload(::ruststream::Column::new("payload"))
    };
    (@spec Lease delete $name:expr) => {
        row!(@common row!(@base $name).lease(::ruststream::Column::new("locked_until")))
    };
    (@spec Lease processed $name:expr) => {
        row!(@spec Lease delete $name).processed_at(::ruststream::Column::new("processed_at"))
    };
    (@spec Advisory delete $name:expr) => {
        row!(@common row!(@base $name).advisory(row!(@key $name)))
    };
    (@spec Advisory processed $name:expr) => {
        row!(@spec Advisory delete $name).processed_at(::ruststream::Column::new("processed_at"))
    };
    (@spec Custom delete $name:expr) => {
        row!(@spec Advisory delete $name)
            .own::<::ruststream::own::Lock>()
            .own::<::ruststream::own::Unlock>()
    };
    (@spec Custom processed $name:expr) => {
        row!(@spec Advisory processed $name)
            .own::<::ruststream::own::Lock>()
            .own::<::ruststream::own::Unlock>()
    };
    (@spec RowLock delete $name:expr) => {
        row!(@common row!(@base $name))
    };
    (@spec RowLock processed $name:expr) => {
        row!(@spec RowLock delete $name).processed_at(::ruststream::Column::new("processed_at"))
    };

    (@lock Custom $ty:ident) => {
        #[cfg(feature = "rusqlite")]
        impl ::ruststream_rusqlite::Lock for $ty {
            fn lock(
                conn: &::ruststream_rusqlite::rusqlite::Connection,
                key: &str,
            ) -> ::ruststream_rusqlite::rusqlite::Result<bool> {
                crate::rusqlite::lock(conn, <Self as SuiteRow>::NAME, key)
            }
        }

        #[cfg(feature = "rusqlite")]
        impl ::ruststream_rusqlite::Unlock for $ty {
            fn unlock(
                conn: &::ruststream_rusqlite::rusqlite::Connection,
                key: &str,
            ) -> ::ruststream_rusqlite::rusqlite::Result<bool> {
                crate::rusqlite::unlock(conn, <Self as SuiteRow>::NAME, key)
            }
        }

        #[cfg(feature = "tokio-postgres")]
        impl ::ruststream_tokio_postgres::Lock for $ty {
            async fn lock(
                client: &::ruststream_tokio_postgres::tokio_postgres::Client,
                key: &str,
            ) -> Result<bool, ::ruststream_tokio_postgres::tokio_postgres::Error> {
                crate::tokio_postgres::lock(client, <Self as SuiteRow>::NAME, key).await
            }
        }

        #[cfg(feature = "tokio-postgres")]
        impl ::ruststream_tokio_postgres::Unlock for $ty {
            async fn unlock(
                client: &::ruststream_tokio_postgres::tokio_postgres::Client,
                key: &str,
            ) -> Result<bool, ::ruststream_tokio_postgres::tokio_postgres::Error> {
                crate::tokio_postgres::unlock(client, <Self as SuiteRow>::NAME, key).await
            }
        }

        #[cfg(feature = "sqlx")]
        impl ::ruststream_sqlx::Lock<::sqlx::Postgres> for $ty {
            async fn lock(
                conn: &mut ::sqlx::PgConnection,
                key: &str,
            ) -> Result<bool, ::sqlx::Error> {
                crate::sqlx::pg_lock(conn, <Self as SuiteRow>::NAME, key).await
            }
        }

        #[cfg(feature = "sqlx")]
        impl ::ruststream_sqlx::Unlock<::sqlx::Postgres> for $ty {
            async fn unlock(
                conn: &mut ::sqlx::PgConnection,
                key: &str,
            ) -> Result<bool, ::sqlx::Error> {
                crate::sqlx::pg_unlock(conn, <Self as SuiteRow>::NAME, key).await
            }
        }

        #[cfg(feature = "sqlx")]
        impl ::ruststream_sqlx::Lock<::sqlx::MySql> for $ty {
            async fn lock(
                conn: &mut ::sqlx::MySqlConnection,
                key: &str,
            ) -> Result<bool, ::sqlx::Error> {
                crate::sqlx::mysql_lock(conn, <Self as SuiteRow>::NAME, key).await
            }
        }

        #[cfg(feature = "sqlx")]
        impl ::ruststream_sqlx::Unlock<::sqlx::MySql> for $ty {
            async fn unlock(
                conn: &mut ::sqlx::MySqlConnection,
                key: &str,
            ) -> Result<bool, ::sqlx::Error> {
                crate::sqlx::mysql_unlock(conn, <Self as SuiteRow>::NAME, key).await
            }
        }

        #[cfg(feature = "sqlx")]
        impl ::ruststream_sqlx::Lock<::sqlx::Sqlite> for $ty {
            async fn lock(
                conn: &mut ::sqlx::SqliteConnection,
                key: &str,
            ) -> Result<bool, ::sqlx::Error> {
                crate::sqlx::sqlite_lock(conn, <Self as SuiteRow>::NAME, key).await
            }
        }

        #[cfg(feature = "sqlx")]
        impl ::ruststream_sqlx::Unlock<::sqlx::Sqlite> for $ty {
            async fn unlock(
                conn: &mut ::sqlx::SqliteConnection,
                key: &str,
            ) -> Result<bool, ::sqlx::Error> {
                crate::sqlx::sqlite_unlock(conn, <Self as SuiteRow>::NAME, key).await
            }
        }

        #[cfg(feature = "mysql-async")]
        impl ::ruststream_mysql_async::Lock for $ty {
            async fn lock(
                conn: &mut ::mysql_async::Conn,
                key: &str,
            ) -> Result<bool, ::mysql_async::Error> {
                crate::mysql_async::lock(conn, <Self as SuiteRow>::NAME, key).await
            }
        }

        #[cfg(feature = "mysql-async")]
        impl ::ruststream_mysql_async::Unlock for $ty {
            async fn unlock(
                conn: &mut ::mysql_async::Conn,
                key: &str,
            ) -> Result<bool, ::mysql_async::Error> {
                crate::mysql_async::unlock(conn, <Self as SuiteRow>::NAME, key).await
            }
        }
    };
    (@lock $form:ident $ty:ident) => {};
}

/// The tables of every scenario, and the adapter traits that list them.
macro_rules! tables {
    ($($module:ident: $settle:ident;)+) => {
        $(
            #[doc = concat!("The tables of the scenario [`", stringify!($module), "`](crate::scenarios::", stringify!($module), "), one per form.")]
            pub mod $module {
                use super::*;

                row!(Lease, Lease, $settle, concat!("cf_", stringify!($module), "_lease"));
                row!(Advisory, Advisory, $settle, concat!("cf_", stringify!($module), "_advisory"));
                row!(Custom, Custom, $settle, concat!("cf_", stringify!($module), "_custom"));
                row!(RowLock, RowLock, $settle, concat!("cf_", stringify!($module), "_row_lock"));

                /// The scenario's tables.
                #[derive(Clone, Copy, Debug)]
                pub struct Family;

                impl Tables for Family {
                    const PROCESSED: bool = row!(@processed $settle);

                    fn table(form: Form) -> &'static str {
                        match form {
                            Form::Lease => <Lease as SuiteRow>::NAME,
                            Form::Advisory => <Advisory as SuiteRow>::NAME,
                            Form::Custom => <Custom as SuiteRow>::NAME,
                            Form::RowLock => <RowLock as SuiteRow>::NAME,
                        }
                    }

                    fn run<'a, H: Harness, B: Body>(
                        form: Form,
                        body: B,
                        cx: &'a Cx<'a, H>,
                    ) -> Result<LocalBoxFuture<'a, ()>, NotApplicable> {
                        match form {
                            Form::Lease => Ok(body.run::<H, Lease>(cx)),
                            Form::Advisory => Ok(body.run::<H, Advisory>(cx)),
                            Form::Custom => Ok(body.run::<H, Custom>(cx)),
                            Form::RowLock => {
                                <H::RowLock as RowLockSupport<H>>::row_lock::<Self, B>(body, cx)
                            }
                        }
                    }

                    fn row_lock<'a, H: Harness, B: Body>(
                        body: B,
                        cx: &'a Cx<'a, H>,
                    ) -> LocalBoxFuture<'a, ()>
                    where
                        H::Adapter: RowLockAdapter,
                    {
                        body.run::<H, RowLock>(cx)
                    }
                }
            }
        )+

        /// An adapter that takes every row type of the suite but the row lock form's: every
        /// adapter, with its `Lock` and `Unlock` of the custom-lock rows behind its feature.
        pub trait SuiteAdapter:
            Adapter
            $(
                + TakesRows<$module::Lease>
                + TakesRows<$module::Advisory>
                + TakesRows<$module::Custom>
            )+
        {
        }

        impl<A> SuiteAdapter for A where
            A: Adapter
            $(
                + TakesRows<$module::Lease>
                + TakesRows<$module::Advisory>
                + TakesRows<$module::Custom>
            )+
        {
        }

        /// An adapter that also takes the suite's row lock tables: every adapter but SQLite's.
        pub trait RowLockAdapter: SuiteAdapter $(+ TakesRows<$module::RowLock>)+ {}

        impl<A> RowLockAdapter for A where A: SuiteAdapter $(+ TakesRows<$module::RowLock>)+ {}
    };
}

tables! {
    claim_order: delete;
    ack_deletes: delete;
    ack_marks_processed: processed;
    reject_settles_without_retry: processed;
    retry_counts_the_attempt: processed;
    undecodable_payload_rejected: processed;
    key_one_at_a_time: delete;
    key_held_elsewhere: delete;
    dropped_delivery_returns: processed;
    custom_lock_answers: delete;
    workers: delete;
    shutdown_releases_locks: delete;
    shutdown_counts_locks_released: delete;
    lease_kept_past_shutdown: delete;
    lease_extended_while_in_work: delete;
    lease_acks_together: delete;
    lease_marks_together: processed;
    claims_ahead: delete;
    publisher_closed_after_shutdown: delete;
    publish_all_writes_every_row: delete;
    sigkill_worker: delete;
    killed_connection: delete;
    killed_while_claimed_ahead: delete;
}

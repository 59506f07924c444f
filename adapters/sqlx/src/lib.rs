//! The ruststream adapter for [sqlx]: [`SqlxBroker`] on PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! It runs the statements the core (`ruststream-core`) renders on connections of a sqlx pool
//! (through [`sqlx::AssertSqlSafe`]: the SQL is the core's, and every value is a bind), maps
//! rows and driver errors into the core's types, and runs a table's own [`Lock`] and
//! [`Unlock`]. It holds no queue logic.
//!
//! # Dependencies
//!
//! A service depends on this crate, on `ruststream` (the derive macro `Inbox` and the
//! attributes `#[subscriber]` and `#[ruststream::app]` write paths `::ruststream::..`), on
//! `sqlx` 0.9 with its database's feature (for `#[derive(sqlx::FromRow)]`, its pool options
//! and its connections), on `serde` for its messages, and on tokio: the adapter enables sqlx's
//! `runtime-tokio` and runs inside a tokio runtime.
//!
//! ```toml
//! [dependencies]
//! ruststream = "0.1"
//! ruststream-sqlx = "0.1"
//! sqlx = { version = "0.9", default-features = false, features = ["postgres", "derive"] }
//! serde = { version = "1", features = ["derive"] }
//! tokio = { version = "1", features = ["rt-multi-thread", "macros"] }
//! ```
//!
//! # Features
//!
//! Each database is a feature, which enables sqlx's driver of it; all three are on by
//! default. A service on one database builds only that driver:
//!
//! ```toml
//! ruststream-sqlx = { version = "0.1", default-features = false, features = ["postgres"] }
//! ```
//!
//! | feature | default | brings |
//! |---|---|---|
//! | `postgres` | on | `SqlxBroker<Postgres>`, and the `LISTEN` session that hears of other processes' publishes |
//! | `mysql` | on | `SqlxBroker<MySql>`, for MySQL and MariaDB |
//! | `sqlite` | on | `SqlxBroker<Sqlite>`, on the bundled SQLite (sqlx's `sqlite-bundled`) |
//! | `tls-rustls` | off | TLS through rustls (sqlx's `tls-rustls`) |
//! | `tls-native-tls` | off | TLS through the platform's library (sqlx's `tls-native-tls`) |
//!
//! At least one database feature must be on. The TLS features pass through to sqlx (enabling
//! sqlx's own `tls-*` feature in the service's `sqlx` dependency does the same); the URL or
//! the connect options then ask for TLS (`sslmode=require` on PostgreSQL, `ssl-mode=REQUIRED`
//! on MySQL).
//!
//! # A service
//!
//! Four workers issue invoices on PostgreSQL, each holding its row's lock and a connection
//! until its acknowledgement commits ([the row lock form](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#the-row-lock-form)):
//!
//! ```no_run
//! use ruststream_sqlx::prelude::*;
//! use sqlx::Connection;
//! use sqlx::postgres::PgPoolOptions;
//!
//! const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS invoice_jobs (
//!     id BIGSERIAL PRIMARY KEY,
//!     payload BYTEA NOT NULL
//! )";
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Invoice {
//!     number: u64,
//! }
//!
//! /// One row of `invoice_jobs`. No `locked_until` and no `advisory_lock`: the row lock form.
//! #[derive(Inbox, sqlx::FromRow)]
//! #[inbox(table = "invoice_jobs")]
//! struct IssueInvoice {
//!     #[field(id, generated)]
//!     id: i64,
//!     #[field(payload)]
//!     payload: Vec<u8>,
//! }
//!
//! #[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
//! async fn issue(invoice: &Invoice) -> HandlerOutcome {
//!     println!("issuing invoice {}", invoice.number);
//!     HandlerOutcome::ack()
//! }
//!
//! fn service(options: PgConnectOptions) -> RustStream {
//!     let schema = options.clone();
//!     // Nothing connects here: the broker builds its pool when the service starts.
//!     let broker = SqlxBroker::from_connect_options(options, PgPoolOptions::new());
//!     RustStream::new(AppInfo::new("billing", "0.1.0"))
//!         .on_startup(async move |()| {
//!             let mut conn = PgConnection::connect_with(&schema).await?;
//!             sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
//!             conn.close().await
//!         })
//!         .with_broker(broker.route::<IssueInvoice>("invoices"), |b| {
//!             b.include(issue.workers(nonzero!(4)));
//!         })
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let options: PgConnectOptions = "postgres://postgres@127.0.0.1/app".parse()?;
//!     service(options).run().await?;
//!     Ok(())
//! }
//! ```
//!
//! A row type derives [`sqlx::FromRow`]: the claim's row decodes into it with
//! `T::from_row(&row)`, and the message from its payload (JSON by default).
//!
//! # Broker, route and handle
//!
//! - [`SqlxBroker::from_url`] and [`SqlxBroker::from_connect_options`] describe a pool the
//!   broker builds when the service starts and closes at shutdown: it lends no new connection,
//!   idle connections close, and a connection a delivery still holds closes when it comes
//!   back.
//! - [`SqlxBroker::new`] runs on the service's own pool, which stays open at shutdown.
//! - `with_broker` takes the broker itself, a route ([`SqlxBroker::route`], which also gives a
//!   publisher into its row type's table), or its handle ([`SqlxBroker::handle`], from which
//!   [`SqlxPublisher::new`] takes publishers before the service starts).
//! - A tool drives the broker by hand with [`SqlxBroker::start`]; the
//!   [`RunningSqlxBroker::shutdown`] answers a [`ClosedSqlxBroker`].
//!
//! A publisher answers [`SqlxBrokerError::Closed`] until the broker starts and from its
//! shutdown on, and never writes a row then ([shutdown](https://github.com/ruststream/ruststream/blob/main/docs/src/shutdown.md)).
//!
//! # Databases
//!
//! | database | `DB` | dialect | forms |
//! |---|---|---|---|
//! | PostgreSQL 9.5+ | [`sqlx::Postgres`] | PostgreSQL | row lock, lease, advisory (64-bit hash) |
//! | MySQL 8.0.1+, MariaDB 10.6+ | [`sqlx::MySql`] | MariaDB when `SELECT VERSION()` names it, else MySQL | row lock, lease, advisory (`GET_LOCK`) |
//! | SQLite 3.35+ | [`sqlx::Sqlite`] | SQLite | lease, advisory (the process keeps the keys) |
//!
//! On PostgreSQL the row lock form needs the isolation level read committed: a subscription
//! whose sessions run at a stricter `default_transaction_isolation` fails its check at the
//! start, with a message that names the setting.
//!
//! # Poolers
//!
//! On PostgreSQL sqlx prepares every statement with values once per connection, names it
//! (`sqlx_s_1`, ..) and keeps it in the server session. Behind PgBouncer in transaction pooling
//! (`pool_mode = transaction`), which hands each transaction to any server session, a
//! statement meets another client's of the same name, and the start fails at once naming
//! transaction pooling (sqlx's `statement_cache_capacity(0)` still names each statement, and
//! does not help). [`SqlxBroker::simple_query`] sends every statement whole instead, with its
//! values written into its text; with the listening session on a direct connection
//! ([`SqlxBroker::listen_on`]) or off ([`SqlxBroker::without_listener`]), the lease form, the
//! row lock form without an attempt column and publishing ([`SqlxOutbox::simple_query`] for
//! an outbox) then work through transaction pooling. The advisory lock form and the row lock
//! form with an attempt column hold session locks: the start refuses transaction pooling for
//! them, naming it ([poolers](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#poolers-and-postgresql-sessions)).
//!
//! ```no_run
//! use ruststream_sqlx::prelude::*;
//! use sqlx::postgres::PgPoolOptions;
//!
//! # fn broker() -> Result<SqlxBroker<Postgres>, sqlx::Error> {
//! // The queue's statements through PgBouncer, whole; the listening session direct.
//! let broker = SqlxBroker::<Postgres>::from_url(
//!     "postgres://app@pgbouncer.internal:6432/app",
//!     PgPoolOptions::new(),
//! )
//! .simple_query(true)
//! .listen_on("postgres://app@db.internal:5432/app".parse()?);
//! # Ok(broker)
//! # }
//! ```
//!
//! The SQLite of this crate is the bundled one of `libsqlite3-sys`, the same one
//! `ruststream-rusqlite` links: both adapters build in one dependency graph.
//!
//! # Connections
//!
//! Each connection the core names holds a connection of the pool from its acquire to its
//! release or close, and runs its commands in the order the core gave them. A release gives
//! the connection back, rolling back a transaction left open; a close ends its session (and
//! so its locks and its transaction), cutting short a command still running on it: the
//! command answers at once, and its connection is shut without a goodbye. The server notices
//! the session is gone when the statement next reads or writes (a statement that waits, such
//! as `pg_sleep` or a lock wait, runs to its end first; PostgreSQL 14 and later notice sooner
//! with `client_connection_check_interval`).
//!
//! Size the pool (sqlx's default is ten connections) for the forms that hold a connection per
//! message in work, row lock and advisory: each subscription's workers and rows claimed
//! ahead (`prefetch`), plus one for its claims and one for publishes.
//!
//! On PostgreSQL a broker with subscriptions also keeps one connection outside the pool, with
//! the pool's connect options unless [`SqlxBroker::listen_on`] names others (none after
//! [`SqlxBroker::without_listener`]), that runs `LISTEN ruststream` (a
//! [`sqlx::postgres::PgListener`]):
//! every publish notifies that channel with its table's name, so a row another process
//! publishes wakes this broker's subscriptions of the table at once instead of at their next
//! poll. When the connection is lost another opens and every subscription looks once; the
//! broker's close ends it. On MySQL, MariaDB and SQLite only the publishing broker's own
//! subscriptions wake; rows of other processes wait for the poll.
//!
//! Driver errors map to the core's kinds: I/O, TLS and protocol errors are
//! [`ErrorKind::ConnectionLost`]; a closed or exhausted pool is [`ErrorKind::PoolClosed`]; a
//! server's own error maps by its code, as the core reads it: the SQLSTATE on PostgreSQL
//! ([`sqlstate_kind`]), the error number on MySQL and MariaDB ([`mysql_error_kind`]), the
//! result code and message on SQLite ([`sqlite_error_kind`]). The server's version picks the
//! dialect, and a server too old for the queue fails the start ([`dialect_of`]).
//!
//! [`ErrorKind::ConnectionLost`]: ruststream_core::ErrorKind::ConnectionLost
//! [`ErrorKind::PoolClosed`]: ruststream_core::ErrorKind::PoolClosed
//! [`sqlstate_kind`]: ruststream_core::server::sqlstate_kind
//! [`mysql_error_kind`]: ruststream_core::server::mysql_error_kind
//! [`sqlite_error_kind`]: ruststream_core::server::sqlite_error_kind
//! [`dialect_of`]: ruststream_core::server::dialect_of
//!
//! # Rules the compiler checks
//!
//! A table that names no form takes the row lock form, which SQLite lacks: a subscription to
//! it on a SQLite broker does not compile.
//!
//! ```compile_fail,E0277
//! # use ruststream_sqlx::prelude::*;
//! #[derive(sqlx::FromRow)]
//! struct Invoice { id: i64, payload: Vec<u8> }
//! impl InboxTable for Invoice {
//!     type Id = i64;
//!     type Table = InboxSpec<(Payload,)>;
//!     const TABLE: Self::Table =
//!         InboxSpec::new("invoices", Column::new("id")).payload(Column::new("payload"));
//!     fn id(&self) -> &i64 { &self.id }
//! }
//! fn takes<T>() where SqlxBroker<Sqlite>: ruststream::adapter::TakesRows<T> {}
//! takes::<Invoice>(); // rule: SQLite has no row locks
//! ```
//!
//! The same table on PostgreSQL compiles:
//!
//! ```
//! # use ruststream_sqlx::prelude::*;
//! # #[derive(sqlx::FromRow)]
//! # struct Invoice { id: i64, payload: Vec<u8> }
//! # impl InboxTable for Invoice {
//! #     type Id = i64;
//! #     type Table = InboxSpec<(Payload,)>;
//! #     const TABLE: Self::Table =
//! #         InboxSpec::new("invoices", Column::new("id")).payload(Column::new("payload"));
//! #     fn id(&self) -> &i64 { &self.id }
//! # }
//! fn takes<T>() where SqlxBroker<Postgres>: ruststream::adapter::TakesRows<T> {}
//! takes::<Invoice>();
//! ```
//!
//! A table whose description names `own::Lock` and `own::Unlock` must implement [`Lock`] and
//! [`Unlock`] for the broker's database; one without them needs neither.
//!
//! ```compile_fail,E0277
//! # use ruststream_sqlx::prelude::*;
//! #[derive(sqlx::FromRow)]
//! struct Payout { id: i64, payload: Vec<u8> }
//! impl InboxTable for Payout {
//!     type Id = i64;
//!     type Table = InboxSpec<(Advisory, Payload, own::Lock, own::Unlock)>;
//!     const TABLE: Self::Table = InboxSpec::new("payouts", Column::new("id").generated())
//!         .advisory(&[KeyPart::Literal("accounts-"), KeyPart::Column("account_id")])
//!         .payload(Column::new("payload"))
//!         .own::<own::Lock>()
//!         .own::<own::Unlock>();
//!     fn id(&self) -> &i64 { &self.id }
//! }
//! fn takes<T>() where SqlxBroker<Sqlite>: ruststream::adapter::TakesRows<T> {}
//! takes::<Payout>(); // `Payout` does not implement `ruststream_sqlx::Lock<Sqlite>`
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
compile_error!(
    "ruststream-sqlx runs on no database: enable at least one of its features `postgres`, `mysql`, `sqlite`"
);

mod broker;
mod claim;
mod conn;
mod db;
mod listen;
mod lock;
mod outbox;
#[cfg(feature = "postgres")]
pub mod testing;

pub use broker::{
    ClosedSqlxBroker, ConnectOptionsOf, RunningSqlxBroker, SqlxBroker, SqlxBrokerError,
    SqlxPublisher, SqlxRoute,
};
pub use claim::SqlxClaim;
pub use db::SqlxDatabase;
pub use lock::{CustomLock, Lock, LockFn, PickLock, Unlock, custom_lock};
pub use outbox::{OnConnection, SqlxOutbox};
/// The sqlx crate this adapter runs on.
pub use sqlx;

/// What a service on sqlx needs in scope: the runtime's items, this adapter's, and sqlx's
/// databases, connections and connect options: everything the guide's examples name
/// unqualified.
pub mod prelude {
    pub use crate::{
        ClosedSqlxBroker, Lock, RunningSqlxBroker, SqlxBroker, SqlxBrokerError, SqlxClaim,
        SqlxOutbox, SqlxPublisher, SqlxRoute, Unlock,
    };
    pub use ruststream::prelude::*;
    #[cfg(feature = "mysql")]
    pub use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlConnection};
    #[cfg(feature = "postgres")]
    pub use sqlx::postgres::{PgConnectOptions, PgConnection, Postgres};
    #[cfg(feature = "sqlite")]
    pub use sqlx::sqlite::{Sqlite, SqliteConnectOptions, SqliteConnection};
}

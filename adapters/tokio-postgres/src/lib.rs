//! The ruststream adapter for PostgreSQL on [tokio-postgres](tokio_postgres), with a
//! [deadpool-postgres](deadpool_postgres) pool: [`TokioPostgresBroker`].
//!
//! It runs the statements the core (`ruststream-core`) renders on pooled tokio-postgres
//! connections, in all three forms ([the forms](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md)): the row lock form (the default), the lease form
//! (`.lease(..)`, `#[field(locked_until)]`) and the advisory lock form (`.advisory(..)`,
//! `advisory_lock = ".."`), where PostgreSQL locks a 64-bit hash of each key in the session
//! of the delivery's connection, or the service's own [`Lock`] and [`Unlock`] decide
//! ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)). The adapter holds no queue logic: it lends connections, runs commands, maps rows
//! and errors, and runs a table's own lock.
//!
//! # A service
//!
//! ```no_run
//! use std::future::ready;
//!
//! use ruststream_tokio_postgres::deadpool_postgres::PoolConfig;
//! use ruststream_tokio_postgres::prelude::*;
//!
//! /// One row of `invoice_jobs`. No lease and no advisory lock: the row lock form.
//! #[derive(serde::Deserialize)]
//! struct IssueInvoice {
//!     id: i64,
//!     payload: Vec<u8>,
//! }
//!
//! impl InboxTable for IssueInvoice {
//!     type Id = i64;
//!     type Table = InboxSpec<(Payload,)>;
//!     const TABLE: Self::Table = InboxSpec::new("invoice_jobs", Column::new("id").generated())
//!         .payload(Column::new("payload"));
//!
//!     fn id(&self) -> &i64 {
//!         &self.id
//!     }
//! }
//!
//! impl PayloadRow for IssueInvoice {
//!     type Column = Vec<u8>;
//!
//!     fn payload(&self) -> &[u8] {
//!         &self.payload
//!     }
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Invoice {
//!     number: u64,
//! }
//!
//! struct Issue;
//!
//! impl Handle<Invoice> for Issue {
//!     fn handle(
//!         &self,
//!         _invoice: &Invoice,
//!         _outs: &(),
//!         _ctx: &mut Context<'_>,
//!     ) -> impl Future<Output = Result<(), HandlerOutcome>> {
//!         ready(Ok(()))
//!     }
//! }
//!
//! # async fn service() -> Result<(), Box<dyn std::error::Error>> {
//! // Nothing connects here: the broker builds its pool when the service starts, and closes it
//! // when the service stops. The route gives publishers into the table.
//! let invoices = TokioPostgresBroker::from_url(
//!     "postgres://postgres@127.0.0.1:5432/app",
//!     PoolConfig::new(8),
//! )
//! .route::<IssueInvoice>("invoices");
//! let publisher = invoices.publisher();
//! let service = RustStream::new(AppInfo::new("billing", "0.1.0")).with_broker(invoices, |b| {
//!     let issue = subscriber("invoices", Issue)
//!         .map_source(|_| InboxQueue::<IssueInvoice>::new("invoices"))
//!         .workers(nonzero!(4));
//!     b.include(issue.build());
//! });
//! let run = service.run();
//! # let _ = (run, publisher);
//! # Ok(())
//! # }
//! ```
//!
//! # Rows
//!
//! A row type is `#[derive(serde::Deserialize)]`: the claim's row decodes into it by column
//! name ([`PgRow::decode`]), as rusqlite's rows do, and under both protocols alike; columns it
//! does not name are ignored. An integer column reads into any integer field that holds its
//! value (an `integer` attempt into an `i64`), `bytea` into `Vec<u8>`, text, `json`, `jsonb`
//! and `uuid` into `String`. The driver's row stays reachable ([`PgRow::as_row`]) for a
//! service that reads a column of another type by hand.
//!
//! # Broker, route and handle
//!
//! - [`TokioPostgresBroker::from_url`] describes a pool the broker builds when the service
//!   starts and closes at shutdown: it lends no new connection, idle connections close, and a
//!   connection a delivery still holds closes when it comes back.
//! - [`TokioPostgresBroker::new`] runs on the service's own `deadpool_postgres::Pool`, which
//!   stays open at shutdown.
//! - `with_broker` takes the broker itself, a route ([`TokioPostgresBroker::route`], which
//!   also gives a publisher into its row type's table), or its handle
//!   ([`TokioPostgresBroker::handle`], from which [`TokioPostgresPublisher::new`] takes
//!   publishers before the service starts).
//! - A tool drives the broker by hand with [`TokioPostgresBroker::start`]; the
//!   [`RunningTokioPostgresBroker::shutdown`] answers a [`ClosedTokioPostgresBroker`].
//!
//! A publisher answers [`TokioPostgresBrokerError::Closed`] until the broker starts and from
//! its shutdown on, and never writes a row then ([shutdown](https://github.com/ruststream/ruststream/blob/main/docs/src/shutdown.md)).
//!
//! # TLS
//!
//! [`TokioPostgresBroker::from_url`] connects without TLS.
//! [`TokioPostgresBroker::from_url_tls`] takes any tokio-postgres TLS connector and uses it
//! for the pool's connections, the listening session and the cancel requests alike; the URL's
//! `sslmode` (`require`, `prefer`, `disable`) says whether TLS is required. Two features bring
//! a connector, neither on by default:
//!
//! | feature | connector | shortcut |
//! |---|---|---|
//! | `native-tls` | `postgres_native_tls::MakeTlsConnector` (the platform's library) | `TokioPostgresBroker::from_url_native_tls` |
//! | `rustls` | `tokio_postgres_rustls::MakeRustlsConnect` (rustls, with `ring`) | `TokioPostgresBroker::from_url_rustls` (webpki roots) |
//!
//! ```toml
//! [dependencies]
//! ruststream-tokio-postgres = { version = "0.1", features = ["rustls"] }
//! ```
//!
//! A service on its own pool ([`TokioPostgresBroker::new`]) builds the pool with its
//! connector, and gives the same connector to [`TokioPostgresBroker::cancel_tls`] and
//! [`TokioPostgresBroker::listen_on`].
//!
//! # Protocols
//!
//! By default every statement runs under the extended query protocol: prepared once per
//! connection (deadpool-postgres's statement cache) and bound at the types the server inferred
//! for its placeholders, so an integer goes to an `integer` column as an `INT4`. A value whose
//! type the adapter does not bind in binary (a `uuid` id, a `numeric`) goes as text, which the
//! server parses. [`TokioPostgresBroker::simple_query`] runs every statement under the simple
//! query protocol instead, with its binds written into its text as literals, for a proxy that
//! takes no prepared statements: behind PgBouncer in transaction pooling, with the listening
//! session on a direct connection ([`TokioPostgresBroker::listen_on`]) or off
//! ([`TokioPostgresBroker::without_listener`]), the lease form, the row lock form without an
//! attempt column and publishing then work. Under the extended protocol the start refuses
//! transaction pooling in every form, naming it and the setting.
//!
//! # Connections
//!
//! Each connection the core names holds a connection of the pool from its acquire to its
//! release or close, and runs its commands in the order the core gave them, each on the task
//! that polls its future, inside the broker's tokio runtime. A release gives the connection
//! back, rolling back a transaction left open (the runtime tracks `BEGIN`, `COMMIT` and
//! `ROLLBACK`); a close ends the session: it cuts short the command in flight, which answers
//! at once, and ends a statement still running on the server with a cancel request, sent
//! again until the session answers (over [`TokioPostgresBroker::cancel_tls`] where the server
//! takes no plain connection); on a session in a known state it rolls back and unlocks what
//! the session holds while it still answers; then it takes the connection out of the pool. Size the pool for the forms that hold a
//! connection per message in work (row lock, advisory): each subscription's workers and rows
//! claimed ahead (`prefetch`), plus one for its claims and one for publishes.
//!
//! A broker with subscriptions also keeps one connection outside the pool that runs `LISTEN
//! ruststream` ([`TokioPostgresBroker::listen_on`]; on the URL of
//! [`TokioPostgresBroker::from_url`] unless told otherwise, nowhere for the service's own pool
//! unless told): every publish notifies that channel with its table's name, so a row another
//! process publishes wakes this broker's subscriptions of the table at once instead of at
//! their next poll. When the connection is lost another opens and every subscription looks
//! once; the broker's close waits until it has ended.
//!
//! On PostgreSQL the row lock form needs the isolation level read committed: a subscription
//! whose sessions run at a stricter `default_transaction_isolation` fails its check at the
//! start, with a message that names the setting. The advisory lock form, and the row lock
//! form with an attempt column (its counts mark rows with session locks), need a session per
//! connection: a direct connection, or PgBouncer in session pooling; the start refuses
//! transaction pooling, naming it.
//!
//! Driver errors map to the core's kinds: a server's error by its SQLSTATE
//! ([`sqlstate_kind`]); a closed connection and I/O errors are [`ErrorKind::ConnectionLost`]; a
//! closed pool, or one that gave no connection in time, is [`ErrorKind::PoolClosed`]. A server
//! before PostgreSQL 9.5 fails the start ([`dialect_of`]).
//!
//! [`ErrorKind::ConnectionLost`]: ruststream_core::ErrorKind::ConnectionLost
//! [`ErrorKind::PoolClosed`]: ruststream_core::ErrorKind::PoolClosed
//! [`sqlstate_kind`]: ruststream_core::server::sqlstate_kind
//! [`dialect_of`]: ruststream_core::server::dialect_of
//!
//! # Rules the compiler checks
//!
//! A table whose description names `own::Lock` and `own::Unlock` must implement [`Lock`] and
//! [`Unlock`]; one without them needs neither.
//!
//! ```compile_fail
//! # use ruststream_tokio_postgres::prelude::*;
//! # #[derive(serde::Deserialize)]
//! # struct Payout { id: i64, payload: Vec<u8> }
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
//! fn takes<T>() where TokioPostgresBroker: ruststream::adapter::TakesRows<T> {}
//! takes::<Payout>(); // `Payout` does not implement `ruststream_tokio_postgres::Lock`
//! ```
//!
//! A row type decodes with serde: one that is not `Deserialize` is refused.
//!
//! ```compile_fail
//! # use ruststream_tokio_postgres::prelude::*;
//! struct Invoice { id: i64, payload: Vec<u8> }
//! impl InboxTable for Invoice {
//!     type Id = i64;
//!     type Table = InboxSpec<(Payload,)>;
//!     const TABLE: Self::Table =
//!         InboxSpec::new("invoices", Column::new("id")).payload(Column::new("payload"));
//!     fn id(&self) -> &i64 { &self.id }
//! }
//! fn takes<T>() where TokioPostgresBroker: ruststream::adapter::TakesRows<T> {}
//! takes::<Invoice>(); // `Invoice` does not implement `serde::Deserialize`
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod broker;
mod claim;
mod conns;
mod error;
mod listen;
mod lock;
mod outbox;
mod row;
mod run;

pub use broker::{
    ClosedTokioPostgresBroker, DEFAULT_CREATE_TIMEOUT, DEFAULT_RECYCLE_TIMEOUT,
    DEFAULT_WAIT_TIMEOUT, RunningTokioPostgresBroker, TokioPostgresBroker,
    TokioPostgresBrokerError, TokioPostgresPublisher, TokioPostgresRoute,
};
pub use claim::TokioPostgresClaim;
/// The deadpool-postgres crate of the broker's pool, for [`TokioPostgresBroker::new`] and
/// [`TokioPostgresBroker::from_url`]'s `PoolConfig`.
pub use deadpool_postgres;
pub use lock::{CustomLock, Lock, LockFn, PickLock, Unlock, custom_lock};
/// The platform's TLS library, for the connector of
/// [`TokioPostgresBroker::from_url_tls`] (the feature `native-tls`).
#[cfg(feature = "native-tls")]
pub use native_tls;
pub use outbox::TokioPostgresOutbox;
/// TLS for tokio-postgres over [`native_tls`] (the feature `native-tls`).
#[cfg(feature = "native-tls")]
pub use postgres_native_tls;
pub use row::PgRow;
/// rustls, for the `ClientConfig` of a connector (the feature `rustls`).
#[cfg(feature = "rustls")]
pub use rustls;
pub use ruststream::de::DecodeError;
/// The tokio-postgres crate this adapter runs on, for [`Lock`] and [`Unlock`]
/// implementations.
pub use tokio_postgres;
/// TLS for tokio-postgres over [`rustls`] (the feature `rustls`).
#[cfg(feature = "rustls")]
pub use tokio_postgres_rustls;

/// What a PostgreSQL service needs in scope: the runtime's items and this adapter's.
pub mod prelude {
    pub use crate::{
        ClosedTokioPostgresBroker, Lock, PgRow, RunningTokioPostgresBroker, TokioPostgresBroker,
        TokioPostgresBrokerError, TokioPostgresOutbox, TokioPostgresPublisher, TokioPostgresRoute,
        Unlock,
    };
    pub use ruststream::prelude::*;
}

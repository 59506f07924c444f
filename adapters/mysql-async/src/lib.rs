//! The ruststream adapter for MySQL and MariaDB on [mysql_async]: [`MySqlAsyncBroker`].
//!
//! It runs the statements the core (`ruststream-core`) renders on connections of a
//! mysql_async [`Pool`](mysql_async::Pool) (every value is a bind), maps rows and driver
//! errors into the core's types, and runs a table's own [`Lock`] and [`Unlock`]. It holds no
//! queue logic. MySQL 8.0.1 and later and MariaDB 10.6 and later take all three forms (row
//! lock, lease, advisory lock with `GET_LOCK`); the dialect comes from `SELECT VERSION()`.
//!
//! # Dependencies
//!
//! A service depends on this crate, on `ruststream` (the derive macro `Inbox` and the
//! attributes `#[subscriber]` and `#[ruststream::app]` write paths `::ruststream::..`), on
//! `mysql_async` 0.37 (for `#[derive(FromRow)]`, its pool and its connections), on `serde` for
//! its messages, and on tokio: mysql_async runs inside a tokio runtime, and so does the
//! broker.
//!
//! ```toml
//! [dependencies]
//! ruststream = "0.1"
//! ruststream-mysql-async = "0.1"
//! mysql_async = "0.37"
//! serde = { version = "1", features = ["derive"] }
//! tokio = { version = "1", features = ["rt-multi-thread", "macros"] }
//! ```
//!
//! TLS is mysql_async's, through one of this crate's features (neither is on by default, and
//! mysql_async builds with one TLS library at most), which enable mysql_async's own:
//!
//! | feature | TLS library | mysql_async features |
//! |---|---|---|
//! | `native-tls-tls` | the platform's (OpenSSL, Secure Transport, SChannel) | `native-tls-tls` |
//! | `rustls-tls` | rustls, its `ring` provider, the webpki roots | `rustls-tls`, `ring`, `tls12` |
//!
//! The connection then asks for TLS through its URL (`mysql://..?require_ssl=true`, with
//! `verify_ca` and `verify_identity`) or [`OptsBuilder::ssl_opts`](mysql_async::OptsBuilder::ssl_opts).
//!
//! # A service
//!
//! Four workers issue invoices on MariaDB, each holding its row's lock and a connection until
//! its acknowledgement commits ([the row lock form](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#the-row-lock-form)):
//!
//! ```no_run
//! use ruststream_mysql_async::prelude::*;
//!
//! const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS invoice_jobs (
//!     id BIGINT AUTO_INCREMENT PRIMARY KEY,
//!     payload LONGBLOB NOT NULL
//! )";
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Invoice {
//!     number: u64,
//! }
//!
//! /// One row of `invoice_jobs`. No `locked_until` and no `advisory_lock`: the row lock form.
//! #[derive(Inbox, FromRow)]
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
//! fn service(url: &str) -> RustStream {
//!     let schema_url = url.to_owned();
//!     // Nothing connects here: the broker builds its pool when the service starts.
//!     let broker = MySqlAsyncBroker::from_url(url);
//!     RustStream::new(AppInfo::new("billing", "0.1.0"))
//!         .on_startup(async move |()| {
//!             let mut conn = Conn::from_url(&schema_url).await?;
//!             conn.query_drop(SCHEMA).await?;
//!             conn.disconnect().await
//!         })
//!         .with_broker(broker.route::<IssueInvoice>("invoices"), |b| {
//!             b.include(issue.workers(nonzero!(4)));
//!         })
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     service("mysql://root@127.0.0.1:3306/app").run().await?;
//!     Ok(())
//! }
//! ```
//!
//! A row type derives mysql_async's [`FromRow`](mysql_async::prelude::FromRow): the claim's
//! row decodes into it with `T::from_row_opt(row)`, and the message from its payload (JSON by
//! default). The claim's row is the table's whole row (`SELECT *`): a derived `FromRow` reads
//! the columns its fields name and leaves the others.
//!
//! On InnoDB a claim locks every row it reads: give each queue table an index that serves the
//! claim order (`(due_at, id)` for the default order with a due column; the primary key
//! without one), or a claim locks every claimable row and the others find nothing to take.
//!
//! # Broker, route and handle
//!
//! - [`MySqlAsyncBroker::from_url`] and [`MySqlAsyncBroker::from_opts`] describe a pool the
//!   broker builds when the service starts and closes at shutdown: it lends no new
//!   connection, idle connections close, and a connection a delivery still holds closes when
//!   it comes back.
//! - [`MySqlAsyncBroker::new`] runs on the service's own pool, which stays open at shutdown.
//! - `with_broker` takes the broker itself, a route ([`MySqlAsyncBroker::route`], which also
//!   gives a publisher into its row type's table), or its handle
//!   ([`MySqlAsyncBroker::handle`], from which [`MySqlAsyncPublisher::new`] takes publishers
//!   before the service starts).
//! - A tool drives the broker by hand with [`MySqlAsyncBroker::start`]; the
//!   [`RunningMySqlAsyncBroker::shutdown`] answers a [`ClosedMySqlAsyncBroker`].
//!
//! A publisher answers [`MySqlAsyncBrokerError::Closed`] until the broker starts and from its
//! shutdown on, and never writes a row then ([shutdown](https://github.com/ruststream/ruststream/blob/main/docs/src/shutdown.md)).
//!
//! # Connections
//!
//! Each connection the core names holds a connection of the pool from its acquire to its
//! release or close, and runs its commands in the order the core gave them, each on the task
//! that polls its future, inside the broker's tokio runtime. A release gives the connection
//! back, rolling back a transaction left open; a close ends its session (`COM_QUIT`), and so
//! its locks and its transaction: it cuts short the command in flight, which answers at once,
//! and ends a statement still running on the server with `KILL QUERY` from a connection of its
//! own. A connection dropped without its release or close (the broker dropped, or a command's
//! future dropped midway) closes rather than going back to the pool. Size the pool
//! (`pool_max` in the URL, 100 by default) for the forms that hold a connection per message in
//! work (row lock, advisory): each subscription's workers and rows claimed ahead (`prefetch`),
//! plus one for its claims and one for publishes. An acquire waits up to
//! [`MySqlAsyncBroker::acquire_timeout`].
//! Keep `pool_min` (10 by default) at or above that number too: with mysql_async's default
//! `inactive_connection_ttl` of zero, the pool keeps at most `pool_min` idle connections and
//! closes every other connection given back, so a smaller `pool_min` opens a new connection
//! for most claims.
//!
//! Statements with binds run through the binary protocol, prepared once per connection;
//! statements without binds (`START TRANSACTION`, `COMMIT`, ...) through the text protocol.
//! The core's fenced updates count the rows they found: a pool the broker builds sets
//! `client_found_rows`, and on the service's pool without it the broker reads the rows found
//! from the server's info line (`Rows matched: N`). A connection the broker gives back holds no
//! transaction and no lock of the broker's, so it is not reset by the pool (its prepared
//! statements stay cached), unless the table's own lock ran on it.
//!
//! Driver errors map to the core's kinds: a server's error by its number, and its SQLSTATE
//! where the number has no kind of its own ([`mysql_error_kind`]); I/O errors and a closed
//! connection are [`ErrorKind::ConnectionLost`]; a disconnected pool or no connection in time
//! is [`ErrorKind::PoolClosed`]. The server's version picks the dialect, and MySQL before 8.0.1
//! or MariaDB before 10.6 fails the start ([`dialect_of`]).
//!
//! [`ErrorKind::ConnectionLost`]: ruststream_core::ErrorKind::ConnectionLost
//! [`ErrorKind::PoolClosed`]: ruststream_core::ErrorKind::PoolClosed
//! [`mysql_error_kind`]: ruststream_core::server::mysql_error_kind
//! [`dialect_of`]: ruststream_core::server::dialect_of
//!
//! # Rules the compiler checks
//!
//! MySQL and MariaDB have row locks: a table that names no form takes the row lock form, and
//! compiles.
//!
//! ```
//! # use ruststream_mysql_async::prelude::*;
//! #[derive(FromRow)]
//! struct Invoice { id: i64, payload: Vec<u8> }
//! impl InboxTable for Invoice {
//!     type Id = i64;
//!     type Table = InboxSpec<(Payload,)>;
//!     const TABLE: Self::Table =
//!         InboxSpec::new("invoices", Column::new("id")).payload(Column::new("payload"));
//!     fn id(&self) -> &i64 { &self.id }
//! }
//! # impl PayloadRow for Invoice {
//! #     type Column = Vec<u8>;
//! #     fn payload(&self) -> &[u8] { &self.payload }
//! # }
//! fn takes<T>() where MySqlAsyncBroker: ruststream::adapter::TakesRows<T> {}
//! takes::<Invoice>();
//! ```
//!
//! A table whose description names `own::Lock` and `own::Unlock` must implement [`Lock`] and
//! [`Unlock`]; one without them needs neither.
//!
//! ```compile_fail
//! # use ruststream_mysql_async::prelude::*;
//! #[derive(FromRow)]
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
//! fn takes<T>() where MySqlAsyncBroker: ruststream::adapter::TakesRows<T> {}
//! takes::<Payout>(); // `Payout` does not implement `ruststream_mysql_async::Lock`
//! ```
//!
//! A row type must implement mysql_async's `FromRow`:
//!
//! ```compile_fail
//! # use ruststream_mysql_async::prelude::*;
//! struct Invoice { id: i64, payload: Vec<u8> }
//! impl InboxTable for Invoice {
//!     type Id = i64;
//!     type Table = InboxSpec<(Payload,)>;
//!     const TABLE: Self::Table =
//!         InboxSpec::new("invoices", Column::new("id")).payload(Column::new("payload"));
//!     fn id(&self) -> &i64 { &self.id }
//! }
//! fn takes<T>() where MySqlAsyncBroker: ruststream::adapter::TakesRows<T> {}
//! takes::<Invoice>(); // `Invoice` does not implement `FromRow`
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod broker;
mod claim;
mod conn;
mod lock;
mod outbox;
mod value;

pub use broker::{
    ClosedMySqlAsyncBroker, MySqlAsyncBroker, MySqlAsyncBrokerError, MySqlAsyncPublisher,
    MySqlAsyncRoute, RunningMySqlAsyncBroker,
};
pub use claim::MySqlAsyncClaim;
pub use lock::{CustomLock, Lock, LockFn, LockFuture, PickLock, Unlock, custom_lock};
/// The mysql_async crate this adapter runs on, for row types and [`Lock`] and [`Unlock`]
/// implementations.
pub use mysql_async;
pub use outbox::MySqlAsyncOutbox;

/// What a service on mysql_async needs in scope: the runtime's items, this adapter's, and
/// mysql_async's pool, connection, options, `FromRow` (the trait and its derive) and
/// `Queryable`.
pub mod prelude {
    pub use crate::{
        ClosedMySqlAsyncBroker, Lock, MySqlAsyncBroker, MySqlAsyncBrokerError, MySqlAsyncOutbox,
        MySqlAsyncPublisher, MySqlAsyncRoute, RunningMySqlAsyncBroker, Unlock,
    };
    pub use mysql_async::prelude::{FromRow, Queryable};
    pub use mysql_async::{Conn, Opts, OptsBuilder, Pool};
    pub use ruststream::prelude::*;
}

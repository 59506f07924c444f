//! The ruststream adapter for SQLite on [rusqlite]: [`RusqliteBroker`].
//!
//! It runs the statements the core (`ruststream-core`) renders on blocking rusqlite
//! connections, each owned by a thread of its own, and answers through futures oneshot
//! channels: the broker runs on tokio, smol or any executor, and no blocking call ever
//! runs on an executor's thread. The task that sent a statement looks for its answer for up
//! to 300 µs, letting the executor's other tasks run between looks, before it waits to be
//! woken ([`RusqliteBroker::look_for_answer`]). The adapter holds no queue logic: it opens and lends
//! connections, runs commands, maps rows and errors, and runs a table's own [`Lock`] and
//! [`Unlock`].
//!
//! SQLite takes two of the three forms ([the forms](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md)): the lease form (`.lease(..)`) and the
//! advisory lock form (`.advisory(..)`), where the process keeps the keys in work, or the
//! service's own [`Lock`] and [`Unlock`] decide. A table that names neither does not
//! compile: SQLite has no row locks.
//!
//! # A service
//!
//! ```no_run
//! use std::future::ready;
//!
//! use ruststream_rusqlite::prelude::*;
//!
//! /// One row of `video_jobs`, held by the key of its channel while it is in work.
//! #[derive(serde::Deserialize)]
//! struct Transcode {
//!     id: i64,
//!     payload: Vec<u8>,
//! }
//!
//! impl InboxTable for Transcode {
//!     type Id = i64;
//!     type Table = InboxSpec<(Advisory, Payload)>;
//!     const TABLE: Self::Table = InboxSpec::new("video_jobs", Column::new("id").generated())
//!         .advisory(&[KeyPart::Literal("video_jobs-"), KeyPart::Column("channel")])
//!         .payload(Column::new("payload"));
//!
//!     fn id(&self) -> &i64 {
//!         &self.id
//!     }
//! }
//!
//! impl PayloadRow for Transcode {
//!     type Column = Vec<u8>;
//!
//!     fn payload(&self) -> &[u8] {
//!         &self.payload
//!     }
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Video {
//!     name: String,
//! }
//!
//! struct Encode;
//!
//! impl Handle<Video> for Encode {
//!     fn handle(
//!         &self,
//!         _video: &Video,
//!         _outs: &(),
//!         _ctx: &mut Context<'_>,
//!     ) -> impl Future<Output = Result<(), HandlerOutcome>> {
//!         ready(Ok(()))
//!     }
//! }
//!
//! # async fn service() -> Result<(), Box<dyn std::error::Error>> {
//! // Nothing opens here: the broker opens its connections when the service starts.
//! // `handle()` gives the broker as the service holds it; publishers come from it.
//! let broker = RusqliteBroker::open("videos.db").handle();
//! let publisher = broker.publisher::<Transcode>();
//! let service = RustStream::new(AppInfo::new("transcoder", "0.1.0")).with_broker(
//!     broker.clone(),
//!     |b| {
//!         let encode = subscriber("videos", Encode)
//!             .map_source(|_| InboxQueue::<Transcode>::new("videos"));
//!         b.include(encode.build());
//!     },
//! );
//! let run = service.run();
//! # let _ = (run, publisher);
//! # Ok(())
//! # }
//! ```
//!
//! A row type is `#[derive(serde::Deserialize)]`: the row decodes into it by column name
//! ([`RusqliteRow::decode`]).
//!
//! # Broker and handle
//!
//! [`RusqliteBroker::open`] describes the pool; nothing opens until the service starts. The
//! service holds a broker as a [`BrokerHandle`](ruststream::BrokerHandle):
//! [`RusqliteBroker::handle`] (or [`IntoBroker::into_broker`](ruststream::IntoBroker)) wraps
//! it, and [`RusqliteBroker::route`] gives it as a [`RusqliteRoute`] of one queue, with a
//! publisher into its row type's table. Pass the broker itself to `with_broker` when nothing
//! else needs it; take the handle (or a route) first when publishers are wanted (they come
//! from the handle, and answer [`RusqliteBrokerError::Closed`] until the service starts and
//! from its shutdown on), and pass a clone of that same handle to `with_broker`.
//! `RusqliteBroker` is not `Clone`, so one pool never gets two handles by mistake. A tool
//! drives the broker by hand with [`RusqliteBroker::start_on`] (or
//! [`RusqliteBroker::start`] inside a tokio runtime, or with ruststream's `smol` or `async-std`
//! feature); the [`RunningRusqliteBroker`]'s shutdown answers a [`ClosedRusqliteBroker`].
//!
//! # The pool
//!
//! The broker builds its own pool: up to [`RusqliteBroker::max_connections`] connections
//! (10 by default), each owned by a thread of its own that runs its commands in order, and one
//! thread that lends them. A connection opens when the core asks for one and none is idle.
//! Each has a busy timeout (5 s by default), so concurrent writers wait for each other instead
//! of failing; the first connection puts a database file into WAL mode, so readers run beside
//! the writer. An acquire waits for a connection up to
//! [`RusqliteBroker::acquire_timeout`] (30 s). When the core closes a connection (to end a
//! lock, or after an error), a fresh one takes its place when next needed.
//!
//! At shutdown the pool closes: it lends no new connection (an acquire fails with
//! [`ErrorKind::PoolClosed`](ruststream_core::ErrorKind::PoolClosed)), idle connections close
//! at once, and a connection still lent closes when it comes back.
//!
//! One process serves a database file in the advisory lock form: SQLite has no locks a session
//! holds, so the process keeps the keys in work ([the advisory form](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#the-advisory-form)).
//!
//! # Rules the compiler checks
//!
//! A table that names no form takes the row lock form, which SQLite lacks: a subscription to
//! it on this broker does not compile.
//!
//! ```compile_fail
//! # use ruststream_rusqlite::prelude::*;
//! # #[derive(serde::Deserialize)]
//! # struct Invoice { id: i64, payload: Vec<u8> }
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
//! fn takes<T>() where RusqliteBroker: ruststream::adapter::TakesRows<T> {}
//! takes::<Invoice>(); // rule: SQLite has no row locks
//! ```
//!
//! A table whose description names `own::Lock` and `own::Unlock` must implement [`Lock`] and
//! [`Unlock`]; one without them needs neither.
//!
//! ```compile_fail
//! # use ruststream_rusqlite::prelude::*;
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
//! fn takes<T>() where RusqliteBroker: ruststream::adapter::TakesRows<T> {}
//! takes::<Payout>(); // `Payout` does not implement `ruststream_rusqlite::Lock`
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod claim;
mod driver;
mod lock;
mod outbox;
mod row;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ruststream::InboxTable;
use ruststream::adapter::{Adapter, AdapterError, Pooled, TakesRows};
use ruststream::exec::BoxFuture;
use ruststream_core::spec::{Described, Features, Sqlite, ValidOn};
use ruststream_core::{Command, Dialect, Reply};
use serde::de::DeserializeOwned;

pub mod testing;

pub use claim::RusqliteClaim;
pub use driver::{RusqliteDriver, Synchronous};
pub use lock::{CustomLock, Lock, LockFn, PickLock, Unlock, custom_lock};
pub use outbox::RusqliteOutbox;
pub use row::RusqliteRow;
/// The rusqlite crate this adapter runs on, for [`Lock`] and [`Unlock`] implementations.
pub use rusqlite;
pub use ruststream::de::DecodeError;

use driver::{Config, Source};

/// What a SQLite service needs in scope: the runtime's items and this adapter's.
pub mod prelude {
    pub use crate::{
        ClosedRusqliteBroker, Lock, RunningRusqliteBroker, RusqliteBroker, RusqliteBrokerError,
        RusqliteOutbox, RusqlitePublisher, RusqliteRoute, RusqliteRow, Unlock,
    };
    pub use ruststream::prelude::*;
}

/// The SQLite broker on rusqlite: a pool of blocking connections, each on a thread of its own,
/// which any executor can wait on. Build it with [`RusqliteBroker::open`] and hand it to a
/// service ([rusqlite](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#rusqlite)).
pub struct RusqliteBroker {
    inner: Arc<Pooled<Source>>,
}

impl std::fmt::Debug for RusqliteBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let config = self.config();
        f.debug_struct("RusqliteBroker")
            .field("path", &config.path)
            .field("max_connections", &config.max_connections)
            .field("busy_timeout", &config.busy_timeout)
            .field("acquire_timeout", &config.acquire_timeout)
            .field("look_for_answer", &config.look_for_answer)
            .field("open_connections", &self.open_connections())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl RusqliteBroker {
    /// A broker of the SQLite database at `path` (a file name, or a `file:` URI). Nothing
    /// opens here: the start opens it, and refuses a private in-memory database (`:memory:`,
    /// or an empty path), since each connection of the pool would open its own.
    pub fn open(path: impl AsRef<Path>) -> Self {
        let config = Config {
            path: path.as_ref().to_path_buf(),
            max_connections: 10,
            busy_timeout: Duration::from_secs(5),
            acquire_timeout: Duration::from_secs(30),
            statement_cache: 64,
            look_for_answer: driver::LOOK_FOR_ANSWER,
            synchronous: None,
        };
        Self {
            inner: Arc::new(Pooled::new(Source { config })),
        }
    }

    fn config(&self) -> &Config {
        &self.inner.source().config
    }

    /// The settings, to change before the broker is shared.
    fn config_mut(&mut self) -> &mut Config {
        &mut Arc::get_mut(&mut self.inner)
            .expect(
                "a broker is shared only once it is wrapped in its handle, which takes it by value",
            )
            .source_mut()
            .config
    }

    /// At most this many connections open at once (default 10; at least 1). In the advisory
    /// lock form each message in work holds one, beside the claim's and the publishes'.
    pub fn max_connections(mut self, max: usize) -> Self {
        self.config_mut().max_connections = max.max(1);
        self
    }

    /// How long a statement waits for another connection's write lock before it fails as a
    /// timeout (default 5 s): SQLite's `busy_timeout`.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.config_mut().busy_timeout = timeout;
        self
    }

    /// How long an acquire waits for a connection when all are in use (default 30 s).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.config_mut().acquire_timeout = timeout;
        self
    }

    /// How long the task that sent a statement looks for its answer before it waits to be
    /// woken by the connection's thread (default 300 µs): the look spends the executor thread's
    /// time, so set it to zero where an idle executor must not spin.
    // While it looks, a poll that finds no answer wakes the task again at once, so it comes
    // back after the executor's other ready tasks have run and the executor's thread does not
    // go to sleep: a statement of SQLite usually answers within that time, and a sleeping
    // thread woken by another starts again tens of microseconds later.
    pub fn look_for_answer(mut self, look: Duration) -> Self {
        self.config_mut().look_for_answer = look;
        self
    }

    /// How a commit waits for the disk on each connection (SQLite's `PRAGMA synchronous`;
    /// unset: SQLite's default, `FULL`). In WAL mode, which the broker sets, [`Synchronous::Normal`]
    /// spares each commit its wait: a process crash loses nothing, a power loss may undo the last commits.
    pub fn synchronous(mut self, mode: Synchronous) -> Self {
        self.config_mut().synchronous = Some(mode);
        self
    }

    /// The database's path or URI.
    pub fn path(&self) -> &Path {
        &self.config().path
    }

    /// How many connections of the pool are open now.
    pub fn open_connections(&self) -> usize {
        self.inner.pool().map_or(0, |pool| pool.open_connections())
    }

    /// Whether the pool is closed: it lends no connection any more.
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }
}

impl Adapter for RusqliteBroker {
    type Row = RusqliteRow;
    type Lock = CustomLock;

    /// Opens the pool's first connection on a thread of its own (putting a file into WAL
    /// mode). Answers [`Dialect::Sqlite`].
    fn start(&self) -> BoxFuture<Result<Dialect, AdapterError>> {
        self.inner.start()
    }

    /// Runs the command on the connection it names, on that connection's thread, after the
    /// commands given before it on that connection.
    fn execute(&self, command: Command, lock: Option<CustomLock>) -> BoxFuture<Reply<RusqliteRow>> {
        self.inner.execute(command, lock)
    }

    /// Lends the connection of a delivery's transaction to its handler
    /// ([`RusqliteClaim`]).
    fn lend(
        &self,
        conn: ruststream_core::ConnId,
    ) -> Option<BoxFuture<Option<Box<dyn std::any::Any + Send>>>> {
        Some(self.inner.lend(conn))
    }

    /// Closes the pool: it lends no new connection, its idle connections close, and a
    /// connection still held closes when it comes back.
    fn close(&self) -> BoxFuture<()> {
        self.inner.close()
    }
}

impl<T> TakesRows<T> for RusqliteBroker
where
    T: InboxTable + DeserializeOwned,
    T::Table: ValidOn<Sqlite>,
    <<T::Table as Described>::Features as Features>::Lock: PickLock<T>,
{
    fn decode(row: RusqliteRow) -> Result<T, String> {
        row.decode().map_err(|e| e.to_string())
    }

    fn custom_lock() -> Option<CustomLock> {
        <<<T::Table as Described>::Features as Features>::Lock as PickLock<T>>::pick()
    }
}

ruststream::broker_methods!(impl RusqliteBroker);

/// A route of a [`RusqliteBroker`]: the broker with the name of a queue whose subscriptions
/// take `T`'s rows, and a publisher into `T`'s table ([`RusqliteBroker::route`]).
pub type RusqliteRoute<T> = ruststream::Route<T, RusqliteBroker>;

/// A [`RusqliteBroker`] started by hand ([`RusqliteBroker::start`] or
/// [`RusqliteBroker::start_on`]), running until its [`shutdown`](ruststream::RunningBroker::shutdown).
pub type RunningRusqliteBroker = ruststream::RunningBroker<RusqliteBroker>;

/// What the shutdown of a [`RusqliteBroker`] started by hand did to the advisory locks of the
/// deliveries in work: `locks_released`, the locks an unlock released, and
/// `connections_closed`, the connections closed to end their locks.
pub type ClosedRusqliteBroker = ruststream::ClosedCounts;

/// Publishes jobs into `T`'s table through a [`RusqliteBroker`]; until the broker starts and
/// after its shutdown it writes nothing and answers [`RusqliteBrokerError::Closed`].
pub type RusqlitePublisher<T> = ruststream::Publisher<T, RusqliteBroker>;

/// Why a publish, or a start by hand, of a [`RusqliteBroker`] did not happen: `Closed`,
/// `Encode`, `Invalid`, `Db`, `Start` ([`ruststream::Error`], which
/// [`PublishError`](ruststream::PublishError) also names).
pub type RusqliteBrokerError = ruststream::Error;

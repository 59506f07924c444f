//! `SqlxBroker`: the pool it builds or is given, the adapter the runtime drives, routes, and a
//! broker started by hand.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use ruststream::InboxTable;
use ruststream::adapter::{
    Adapter, AdapterError, ConnFuture, Notifications, PoolSource, Pooled, TakesRows, redact_url,
};
use ruststream::exec::BoxFuture;
use ruststream_core::spec::{Described, Features, ValidOn};
use ruststream_core::{Command, DbError, Dialect, ErrorKind, Reply};
use sqlx::pool::PoolOptions;
use sqlx::{ConnectOptions, Connection, Pool};

use crate::conn::SqlxPool;
use crate::db::SqlxDatabase;
use crate::listen::Listener;
use crate::lock::{CustomLock, PickLock};

/// The options `DB`'s connections open with: `PgConnectOptions`, `MySqlConnectOptions`,
/// `SqliteConnectOptions`.
pub type ConnectOptionsOf<DB> = <<DB as sqlx::Database>::Connection as Connection>::Options;

/// Where the broker's pool comes from.
enum Origin<DB: SqlxDatabase> {
    /// Built at the start from a URL; the broker closes it.
    Url(String, PoolOptions<DB>),
    /// Built at the start from connect options; the broker closes it.
    Options(Box<ConnectOptionsOf<DB>>, PoolOptions<DB>),
    /// The service's own pool; it stays open.
    Pool(Pool<DB>),
}

/// Where the session that hears of other processes' publishes connects (PostgreSQL).
enum Listen<DB: SqlxDatabase> {
    /// With the pool's connect options: the default.
    Pool,
    /// With these options ([`SqlxBroker::listen_on`]).
    On(Box<ConnectOptionsOf<DB>>),
    /// Nowhere ([`SqlxBroker::without_listener`]).
    Off,
}

/// The broker's pool as [`Pooled`] runs it, and the session that listens for publishes.
struct Source<DB: SqlxDatabase> {
    from: Origin<DB>,
    /// Every statement runs under PostgreSQL's simple query protocol
    /// ([`SqlxBroker::simple_query`]).
    simple: bool,
    /// Where the listening session connects.
    listen: Listen<DB>,
    /// The sessions that hear of other processes' publishes, once the runtime asked for one.
    listener: Mutex<Option<Listener>>,
}

impl<DB: SqlxDatabase> Source<DB> {
    fn listener(&self) -> MutexGuard<'_, Option<Listener>> {
        // The lock guards a plain option that no code panics while holding.
        self.listener.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<DB: SqlxDatabase> PoolSource for Source<DB> {
    type Pool = Pool<DB>;
    type Lender = SqlxPool<DB>;

    fn name(&self) -> &'static str {
        DB::NAME
    }

    fn target(&self) -> String {
        match &self.from {
            Origin::Url(url, _) => redact_url(url),
            Origin::Options(options, _) => redact_url(options.to_url_lossy().as_str()),
            Origin::Pool(pool) => redact_url(pool.connect_options().to_url_lossy().as_str()),
        }
    }

    fn given(&self) -> Option<&Pool<DB>> {
        match &self.from {
            Origin::Pool(pool) => Some(pool),
            Origin::Url(..) | Origin::Options(..) => None,
        }
    }

    fn build(&self) -> ConnFuture<'_, Result<Pool<DB>, AdapterError>> {
        Box::pin(async move {
            let target = self.target();
            let (options, pool_options) = match &self.from {
                Origin::Url(url, pool_options) => {
                    let options: ConnectOptionsOf<DB> = url.parse().map_err(|e| {
                        AdapterError::new(format!(
                            "{} URL `{target}` does not parse: {e}",
                            DB::NAME
                        ))
                    })?;
                    (options, pool_options)
                }
                Origin::Options(options, pool_options) => ((**options).clone(), pool_options),
                Origin::Pool(pool) => return Ok(pool.clone()),
            };
            pool_options
                .clone()
                .connect_with(options)
                .await
                .map_err(|e| {
                    AdapterError::of(
                        start_kind::<DB>(&e),
                        format!("cannot connect to {} at {target}: {e}", DB::NAME),
                    )
                })
        })
    }

    /// The server's dialect: PostgreSQL; MariaDB when `SELECT VERSION()` names it, MySQL
    /// otherwise; SQLite.
    fn open(
        &self,
        pool: &Pool<DB>,
    ) -> ConnFuture<'_, Result<(SqlxPool<DB>, Dialect), AdapterError>> {
        let pool = pool.clone();
        Box::pin(async move {
            let target = self.target();
            let mut conn = pool.acquire().await.map_err(|e| {
                AdapterError::of(
                    start_kind::<DB>(&e),
                    format!(
                        "cannot take a connection of the {} pool of {target}: {e}",
                        DB::NAME
                    ),
                )
            })?;
            let dialect = DB::dialect(&mut conn)
                .await
                .map_err(|e| AdapterError::new(format!("{} at {target}: {e}", DB::NAME)));
            // Back in the pool before the start answers, as a release gives it back.
            let returned = conn.return_to_pool();
            drop(conn);
            returned.await;
            let simple = self.simple;
            Ok((SqlxPool { pool, simple }, dialect?))
        })
    }

    /// The idle connections close now; then the pool is marked closed without waiting for
    /// connections still lent, each of which closes when it comes back.
    // The broker's own releases complete before they answer, so none is on its way back now.
    fn close(&self, pool: Pool<DB>, _: Option<Self::Lender>, _: usize) -> ConnFuture<'_, ()> {
        Box::pin(async move {
            while let Some(conn) = pool.try_acquire() {
                if let Err(error) = conn.close().await {
                    tracing::debug!("closing an idle connection failed: {error}");
                }
            }
            let _closing = pool.close();
        })
    }
}

/// The broker on a sqlx pool of PostgreSQL, MySQL or MariaDB, or SQLite: build it from a URL
/// or options (it builds and closes its pool) or on the service's own pool (which stays
/// open), then hand it to a service ([sqlx](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#sqlx)).
// Not `Clone`, so one broker never gets two handles by mistake: take the handle (or a route)
// first and clone that.
pub struct SqlxBroker<DB: SqlxDatabase> {
    inner: Arc<Pooled<Source<DB>>>,
}

impl<DB: SqlxDatabase> fmt::Debug for SqlxBroker<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxBroker")
            .field("database", &DB::NAME)
            .field("target", &self.inner.source().target())
            .field("owns_pool", &self.inner.owns_pool())
            .field("simple_query", &self.inner.source().simple)
            .field("state", &self.inner.phase())
            .field("connections_held", &self.inner.held())
            .finish()
    }
}

impl<DB: SqlxDatabase> SqlxBroker<DB> {
    fn with_source(from: Origin<DB>) -> Self {
        Self {
            inner: Arc::new(Pooled::new(Source {
                from,
                simple: false,
                listen: Listen::Pool,
                listener: Mutex::new(None),
            })),
        }
    }

    /// Where the pool comes from and how it runs, to change before the broker is shared.
    fn source_mut(&mut self) -> &mut Source<DB> {
        Arc::get_mut(&mut self.inner)
            .expect(
                "a broker is shared only once it is wrapped in its handle, which takes it by value",
            )
            .source_mut()
    }

    /// A broker of the database `url` names (`postgres://..`, `mysql://..`, `sqlite:..`), with
    /// a pool of these options. Nothing connects here: the pool is built when the service
    /// starts (a bad URL fails the start, naming it) and closed at shutdown.
    pub fn from_url(url: impl Into<String>, pool_options: PoolOptions<DB>) -> Self {
        Self::with_source(Origin::Url(url.into(), pool_options))
    }

    /// A broker of the database `options` reach, with a pool of these options. Like
    /// [`SqlxBroker::from_url`]: the pool is built when the service starts and closed at
    /// shutdown.
    pub fn from_connect_options(
        options: ConnectOptionsOf<DB>,
        pool_options: PoolOptions<DB>,
    ) -> Self {
        Self::with_source(Origin::Options(Box::new(options), pool_options))
    }

    /// A broker on the service's own pool. The pool stays open at shutdown: the broker lends
    /// no connection of it any more, and the service closes the pool after `run` returns.
    pub fn new(pool: Pool<DB>) -> Self {
        Self::with_source(Origin::Pool(pool))
    }

    /// The pool, once the broker has started (and after it closed): the one it built, or the
    /// service's own.
    pub fn pool(&self) -> Option<Pool<DB>> {
        self.inner.pool()
    }

    /// Whether the broker builds its pool (and so closes it at shutdown): `from_url` and
    /// `from_connect_options`, not `new`.
    pub fn owns_pool(&self) -> bool {
        self.inner.owns_pool()
    }

    /// Whether the broker is closed: it lends no connection any more.
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// How many connections the core holds now (claims, deliveries in work, publishes).
    pub fn connections_held(&self) -> usize {
        self.inner.held()
    }
}

/// PostgreSQL behind a pooler in transaction pooling: statements that survive it, and where
/// the listening session connects.
#[cfg(feature = "postgres")]
impl SqlxBroker<sqlx::Postgres> {
    /// Sends every statement whole under PostgreSQL's simple query protocol (`true`) instead
    /// of as sqlx's prepared statements (`false`, the default), for a pooler in transaction
    /// pooling such as PgBouncer ([Poolers](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#poolers-and-postgresql-sessions)).
    pub fn simple_query(mut self, simple: bool) -> Self {
        self.source_mut().simple = simple;
        self
    }

    /// Whether statements run under the simple query protocol
    /// ([`SqlxBroker::simple_query`]).
    pub fn is_simple_query(&self) -> bool {
        self.inner.source().simple
    }

    /// Opens the session that hears of other processes' publishes with these options, not
    /// the pool's: give it a direct connection to PostgreSQL when the pool goes through a
    /// pooler in transaction pooling ([Poolers](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#poolers-and-postgresql-sessions)).
    pub fn listen_on(mut self, options: sqlx::postgres::PgConnectOptions) -> Self {
        self.source_mut().listen = Listen::On(Box::new(options));
        self
    }

    /// Hears of no other process's publish: their rows wait for the subscriptions' next
    /// poll. This broker's own publishes still wake its subscriptions.
    pub fn without_listener(mut self) -> Self {
        self.source_mut().listen = Listen::Off;
        self
    }
}

impl<DB: SqlxDatabase> Adapter for SqlxBroker<DB> {
    type Row = DB::Row;
    type Lock = CustomLock<DB>;

    /// On PostgreSQL: a session on a connection of its own, outside the pool's size, that runs
    /// `LISTEN ruststream` (with the pool's connect options unless [`SqlxBroker::listen_on`]
    /// names others; none after [`SqlxBroker::without_listener`]).
    fn listen(&self) -> Option<BoxFuture<Result<Notifications, DbError>>> {
        let pool = self.inner.lender()?.pool;
        let source = self.inner.source();
        let mut listener = source.listener();
        if listener.is_none() {
            let options = match &source.listen {
                Listen::Pool => (*pool.connect_options()).clone(),
                Listen::On(options) => (**options).clone(),
                Listen::Off => return None,
            };
            *listener = Some(DB::listener(options)?);
        }
        listener.as_ref().map(Listener::open)
    }

    /// sqlx prepares every statement with binds and keeps it per connection, unless
    /// statements run under the simple query protocol ([`SqlxBroker::simple_query`]).
    fn prepares_statements(&self) -> bool {
        !self.inner.source().simple
    }

    /// Lends the connection of a row lock claim's open transaction to its handler
    /// ([`SqlxClaim`](crate::SqlxClaim)).
    fn lend(
        &self,
        conn: ruststream_core::ConnId,
    ) -> Option<BoxFuture<Option<Box<dyn std::any::Any + Send>>>> {
        Some(self.inner.lend(conn))
    }

    /// Builds the pool where the broker builds it, and answers the server's dialect:
    /// PostgreSQL; MariaDB when `SELECT VERSION()` names it, MySQL otherwise; SQLite.
    fn start(&self) -> BoxFuture<Result<Dialect, AdapterError>> {
        self.inner.start()
    }

    /// Runs the command on the connection it names, after the commands given before it on
    /// that connection.
    fn execute(&self, command: Command, lock: Option<CustomLock<DB>>) -> BoxFuture<Reply<DB::Row>> {
        self.inner.execute(command, lock)
    }

    /// Closes the broker: it lends no new connection. A pool it built closes: idle
    /// connections close at once, and a connection still held closes when it comes back. The
    /// service's own pool stays open. The listening connection closes, whatever the pool.
    fn close(&self) -> BoxFuture<()> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let listener = inner.source().listener().take();
            if let Some(listener) = listener {
                listener.close().await;
            }
            inner.close().await;
        })
    }
}

/// Rows of `T` decode with `T`'s [`sqlx::FromRow`]; `T`'s custom lock is its
/// [`Lock<DB>`](crate::Lock) and [`Unlock<DB>`](crate::Unlock). A description that breaks a
/// rule on `DB` does not compile here (on SQLite, a table that names no form).
impl<T, DB> TakesRows<T> for SqlxBroker<DB>
where
    DB: SqlxDatabase,
    T: InboxTable + for<'r> sqlx::FromRow<'r, DB::Row>,
    T::Table: ValidOn<DB::Family>,
    <<T::Table as Described>::Features as Features>::Lock: PickLock<T, DB>,
{
    fn decode(row: DB::Row) -> Result<T, String> {
        T::from_row(&row).map_err(|e| e.to_string())
    }

    fn custom_lock() -> Option<CustomLock<DB>> {
        <<<T::Table as Described>::Features as Features>::Lock as PickLock<T, DB>>::pick()
    }
}

ruststream::broker_methods!(impl<DB: SqlxDatabase> SqlxBroker<DB>);

/// A route of a [`SqlxBroker`]: the broker with the name of a queue whose subscriptions take
/// `T`'s rows, and a publisher into `T`'s table ([`SqlxBroker::route`]).
pub type SqlxRoute<T, DB> = ruststream::Route<T, SqlxBroker<DB>>;

/// A [`SqlxBroker`] started by hand ([`SqlxBroker::start`]), driven in the background until
/// its [`shutdown`](ruststream::RunningBroker::shutdown), which answers a [`ClosedSqlxBroker`].
pub type RunningSqlxBroker<DB> = ruststream::RunningBroker<SqlxBroker<DB>>;

/// What the shutdown of a [`SqlxBroker`] started by hand did to the advisory locks of the
/// deliveries in work: `locks_released`, the locks an unlock released, and
/// `connections_closed`, the connections closed to end their locks.
pub type ClosedSqlxBroker = ruststream::ClosedCounts;

/// Publishes jobs into `T`'s table through a [`SqlxBroker`]; until the broker starts and
/// after its shutdown it writes nothing and answers [`SqlxBrokerError::Closed`].
pub type SqlxPublisher<T, DB> = ruststream::Publisher<T, SqlxBroker<DB>>;

/// Why a publish, or a start by hand, of a [`SqlxBroker`] did not happen: `Closed`, `Encode`,
/// `Invalid`, `Db`, `Start` ([`ruststream::Error`]).
pub type SqlxBrokerError = ruststream::Error;

/// The kind of a start's failure: as the driver's error maps, but a SQLite file that cannot
/// open stays so (there is no server to come up).
fn start_kind<DB: SqlxDatabase>(error: &sqlx::Error) -> ErrorKind {
    match DB::error_kind(error) {
        ErrorKind::ConnectionLost if DB::PUBLISH_DIALECT == Dialect::Sqlite => ErrorKind::Config,
        kind => kind,
    }
}

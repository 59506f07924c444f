//! `MySqlAsyncBroker`: the pool it builds or is given, the adapter the runtime drives, routes,
//! and a broker started by hand.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::{FromRow, Queryable};
use mysql_async::{Opts, OptsBuilder, Pool};
use ruststream::InboxTable;
use ruststream::adapter::{
    Adapter, AdapterError, ConnFuture, PoolSource, Pooled, TakesRows, redact_url,
};
use ruststream::exec::BoxFuture;
use ruststream_core::server::{self, Server};
use ruststream_core::spec::{Described, Features, MySql, ValidOn};
use ruststream_core::{Command, Dialect, ErrorKind, Reply};
use tokio::runtime::Handle;

use crate::conn::Lender;
use crate::lock::{CustomLock, PickLock};

/// How long a close waits for the pool it built to close its connections.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Where the broker's pool comes from.
enum Origin {
    /// Built at the start from a URL; the broker closes it.
    Url(String),
    /// Built at the start from options; the broker closes it.
    Opts(Box<Opts>),
    /// The service's own pool; it stays open.
    Pool(Pool),
}

/// The broker's pool as [`Pooled`] runs it.
struct Source {
    origin: Origin,
    acquire_timeout: Duration,
}

impl PoolSource for Source {
    type Pool = Pool;
    type Lender = Lender;

    fn name(&self) -> &'static str {
        "MySQL"
    }

    fn target(&self) -> String {
        match &self.origin {
            Origin::Url(url) => redact_url(url),
            Origin::Opts(opts) => describe(opts),
            Origin::Pool(_) => "the service's mysql_async pool".to_owned(),
        }
    }

    fn given(&self) -> Option<&Pool> {
        match &self.origin {
            Origin::Pool(pool) => Some(pool),
            Origin::Url(_) | Origin::Opts(_) => None,
        }
    }

    fn build(&self) -> ConnFuture<'_, Result<Pool, AdapterError>> {
        let built = match &self.origin {
            Origin::Pool(pool) => Ok(pool.clone()),
            Origin::Url(url) => Opts::from_url(url).map(build_pool).map_err(|e| {
                AdapterError::new(format!(
                    "the MySQL URL `{}` does not parse: {e}",
                    self.target()
                ))
            }),
            Origin::Opts(opts) => Ok(build_pool((**opts).clone())),
        };
        Box::pin(std::future::ready(built))
    }

    /// A connection answers `SELECT VERSION()` within the acquire timeout, with a version the
    /// queue serves; the broker runs on the tokio runtime it starts in, where mysql_async's
    /// connections run.
    fn open(&self, pool: &Pool) -> ConnFuture<'_, Result<(Lender, Dialect), AdapterError>> {
        let pool = pool.clone();
        Box::pin(async move {
            let target = self.target();
            let runtime = Handle::try_current().map_err(|_| {
                AdapterError::new(format!(
                    "the MySQL broker of {target} runs mysql_async, which needs a tokio runtime: start the service inside one"
                ))
            })?;
            let probed = runtime
                .spawn(probe(pool.clone(), target.clone(), self.acquire_timeout))
                .await
                .unwrap_or_else(|e| {
                    Err(AdapterError::new(format!(
                        "MySQL/MariaDB at {target}: the probe failed: {e}"
                    )))
                });
            let dialect = probed?;
            let lender = Lender {
                pool,
                runtime,
                acquire_timeout: self.acquire_timeout,
            };
            Ok((lender, dialect))
        })
    }

    /// Disconnects the pool on the broker's runtime, waiting up to [`CLOSE_WAIT`] when no
    /// connection is still lent; a connection lent closes when it comes back.
    fn close(&self, pool: Pool, lender: Option<Lender>, held: usize) -> ConnFuture<'_, ()> {
        Box::pin(async move {
            let Some(runtime) = lender
                .map(|lender| lender.runtime)
                .or_else(|| Handle::try_current().ok())
            else {
                return;
            };
            let disconnect = runtime.spawn(async move {
                match tokio::time::timeout(CLOSE_WAIT, pool.disconnect()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => tracing::debug!("disconnecting the MySQL pool failed: {error}"),
                    Err(_) => tracing::debug!(
                        "the MySQL pool still has connections lent after {CLOSE_WAIT:?}; they close when they come back"
                    ),
                }
            });
            if held == 0 {
                let _ = disconnect.await;
            }
        })
    }
}

/// Options as a URL without the password, for messages.
fn describe(opts: &Opts) -> String {
    let user = opts.user().map(|u| format!("{u}@")).unwrap_or_default();
    let db = opts.db_name().unwrap_or_default();
    format!(
        "mysql://{user}{}:{}/{db}",
        opts.ip_or_hostname(),
        opts.tcp_port()
    )
}

/// The broker on MySQL 8.0.1+ or MariaDB 10.6+ through mysql_async: build it from a URL or
/// options (it builds and closes its pool) or on the service's own pool (which stays open),
/// then hand it to a service ([mysql_async](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#mysql_async)).
// Not `Clone`, so one broker never gets two handles by mistake: take the handle (or a route)
// first and clone that.
pub struct MySqlAsyncBroker {
    inner: Arc<Pooled<Source>>,
}

impl fmt::Debug for MySqlAsyncBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlAsyncBroker")
            .field("target", &self.inner.source().target())
            .field("owns_pool", &self.inner.owns_pool())
            .field("state", &self.inner.phase())
            .field("dialect", &self.inner.dialect())
            .field("connections_held", &self.inner.held())
            .finish()
    }
}

impl MySqlAsyncBroker {
    fn with_source(origin: Origin) -> Self {
        Self {
            inner: Arc::new(Pooled::new(Source {
                origin,
                acquire_timeout: Duration::from_secs(30),
            })),
        }
    }

    /// A broker of the database `url` names (`mysql://user:password@host:3306/db`, with
    /// mysql_async's URL parameters such as `pool_max`). Nothing connects here: the pool is
    /// built when the service starts and closed at shutdown.
    // The pool's connections set `client_found_rows`, so an `UPDATE` counts the rows it found.
    pub fn from_url(url: impl Into<String>) -> Self {
        Self::with_source(Origin::Url(url.into()))
    }

    /// A broker of the database `opts` reach (an [`Opts`] or an [`OptsBuilder`]). Like
    /// [`MySqlAsyncBroker::from_url`]: the pool is built when the service starts, with
    /// `client_found_rows` set, and closed at shutdown.
    pub fn from_opts(opts: impl Into<Opts>) -> Self {
        Self::with_source(Origin::Opts(Box::new(opts.into())))
    }

    /// A broker on the service's own pool, which stays open at shutdown for the service to
    /// disconnect.
    // Its connections may or may not set `client_found_rows`: the broker reads the rows an
    // `UPDATE` found from the server's info line where the option is off.
    pub fn new(pool: Pool) -> Self {
        Self::with_source(Origin::Pool(pool))
    }

    /// How long a command waits for a connection when all are lent (default 30 s); past it,
    /// the command fails as [`PoolClosed`](ruststream_core::ErrorKind::PoolClosed) and the core tries again later.
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        Arc::get_mut(&mut self.inner)
            .expect(
                "a broker is shared only once it is wrapped in its handle, which takes it by value",
            )
            .source_mut()
            .acquire_timeout = timeout;
        self
    }

    /// The pool, once the broker has started (and after it closed): the one it built, or the
    /// service's own.
    pub fn pool(&self) -> Option<Pool> {
        self.inner.pool()
    }

    /// The server's dialect, once the broker has started: MariaDB where `SELECT VERSION()`
    /// names it, MySQL otherwise.
    pub fn dialect(&self) -> Option<Dialect> {
        self.inner.dialect()
    }

    /// Whether the broker builds its pool (and so closes it at shutdown): `from_url` and
    /// `from_opts`, not `new`.
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

/// The pool a broker builds: the options, with `client_found_rows` set.
fn build_pool(opts: Opts) -> Pool {
    Pool::new(OptsBuilder::from_opts(opts).client_found_rows(true))
}

/// Takes a connection and reads the server's version: the dialect, or why not.
async fn probe(pool: Pool, target: String, timeout: Duration) -> Result<Dialect, AdapterError> {
    let failed = |error: &mysql_async::Error, what: String| {
        AdapterError::of(crate::value::db_error(error).kind, what)
    };
    let mut conn = match tokio::time::timeout(timeout, pool.get_conn()).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(error)) => {
            let what = format!("cannot connect to MySQL/MariaDB at {target}: {error}");
            return Err(failed(&error, what));
        }
        Err(_) => {
            return Err(AdapterError::of(
                ErrorKind::ConnectionLost,
                format!("MySQL/MariaDB at {target} gave no connection within {timeout:?}"),
            ));
        }
    };
    let version: Option<String> = conn.query_first("SELECT VERSION()").await.map_err(|e| {
        let what = format!("MySQL/MariaDB at {target}: SELECT VERSION() failed: {e}");
        failed(&e, what)
    })?;
    let version = version.ok_or_else(|| {
        AdapterError::new(format!(
            "MySQL/MariaDB at {target}: SELECT VERSION() answered no row"
        ))
    })?;
    server::dialect_of(Server::MySql, &version)
        .map_err(|e| AdapterError::new(format!("MySQL/MariaDB at {target}: {e}")))
}

impl Adapter for MySqlAsyncBroker {
    type Row = mysql_async::Row;
    type Lock = CustomLock;

    /// Lends the connection of a row lock claim's open transaction to its handler.
    fn lend(
        &self,
        conn: ruststream_core::ConnId,
    ) -> Option<BoxFuture<Option<Box<dyn std::any::Any + Send>>>> {
        Some(self.inner.lend(conn))
    }

    /// Builds the pool where the broker builds it and answers the server's dialect (MariaDB
    /// when `SELECT VERSION()` names it, MySQL otherwise). Fails outside a tokio runtime, and
    /// on MySQL before 8.0.1 or MariaDB before 10.6.
    fn start(&self) -> BoxFuture<Result<Dialect, AdapterError>> {
        self.inner.start()
    }

    /// Runs the command on the connection it names, after the commands given before it on
    /// that connection; a close cuts short a statement still running (`KILL QUERY`).
    fn execute(
        &self,
        command: Command,
        lock: Option<CustomLock>,
    ) -> BoxFuture<Reply<mysql_async::Row>> {
        self.inner.execute(command, lock)
    }

    /// Closes the broker: it lends no new connection. A pool it built disconnects: idle
    /// connections close at once, and a connection still held closes when it comes back. The
    /// service's own pool stays open.
    fn close(&self) -> BoxFuture<()> {
        self.inner.close()
    }
}

/// Rows of `T` decode with `T`'s [`FromRow`] (mysql_async's own, derived with
/// `#[derive(FromRow)]`); `T`'s custom lock is its [`Lock`](crate::Lock) and
/// [`Unlock`](crate::Unlock) where its description names `own::Lock` and `own::Unlock`.
impl<T> TakesRows<T> for MySqlAsyncBroker
where
    T: InboxTable + FromRow,
    T::Table: ValidOn<MySql>,
    <<T::Table as Described>::Features as Features>::Lock: PickLock<T>,
{
    fn decode(row: mysql_async::Row) -> Result<T, String> {
        let columns: Vec<String> = row
            .columns_ref()
            .iter()
            .map(|c| c.name_str().into_owned())
            .collect();
        T::from_row_opt(row).map_err(|_| {
            format!(
                "the row (columns {}) does not convert into `{}` with its FromRow",
                columns.join(", "),
                std::any::type_name::<T>()
            )
        })
    }

    fn custom_lock() -> Option<CustomLock> {
        <<<T::Table as Described>::Features as Features>::Lock as PickLock<T>>::pick()
    }
}

ruststream::broker_methods!(impl MySqlAsyncBroker);

/// A route of a [`MySqlAsyncBroker`]: the broker with the name of a queue whose subscriptions
/// take `T`'s rows, and a publisher into `T`'s table ([`MySqlAsyncBroker::route`]).
pub type MySqlAsyncRoute<T> = ruststream::Route<T, MySqlAsyncBroker>;

/// A [`MySqlAsyncBroker`] started by hand ([`MySqlAsyncBroker::start`]), driven in the
/// background until its [`shutdown`](ruststream::RunningBroker::shutdown), which answers a
/// [`ClosedMySqlAsyncBroker`].
pub type RunningMySqlAsyncBroker = ruststream::RunningBroker<MySqlAsyncBroker>;

/// What the shutdown of a [`MySqlAsyncBroker`] started by hand did to the advisory locks of the
/// deliveries in work: `locks_released`, the locks an unlock released, and
/// `connections_closed`, the connections closed to end their locks.
pub type ClosedMySqlAsyncBroker = ruststream::ClosedCounts;

/// Publishes jobs into `T`'s table through a [`MySqlAsyncBroker`]; until the broker starts
/// and after its shutdown it writes nothing and answers [`MySqlAsyncBrokerError::Closed`].
pub type MySqlAsyncPublisher<T> = ruststream::Publisher<T, MySqlAsyncBroker>;

/// Why a publish, or a start by hand, of a [`MySqlAsyncBroker`] did not happen: `Closed`,
/// `Encode`, `Invalid`, `Db`, `Start` ([`ruststream::Error`]).
pub type MySqlAsyncBrokerError = ruststream::Error;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_options_without_password() {
        let opts = Opts::from_url("mysql://app:secret@db.example:3307/queue").unwrap();
        assert_eq!(describe(&opts), "mysql://app@db.example:3307/queue");
    }
}

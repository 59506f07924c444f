//! `TokioPostgresBroker`: the pool it builds or is given, the adapter the runtime drives,
//! routes, and a broker started by hand.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolConfig, RecyclingMethod, Runtime};
use ruststream::InboxTable;
use ruststream::adapter::{
    Adapter, AdapterError, ConnFuture, Notifications, PoolSource, Pooled, TakesRows, redact_url,
};
use ruststream::exec::BoxFuture;
use ruststream_core::server::{self, Server};
use ruststream_core::spec::{Described, Features, Postgres, ValidOn};
use ruststream_core::{Command, DbError, Dialect, Reply};
use serde::de::DeserializeOwned;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{CancelToken, Config, NoTls, Socket};

use crate::conns::{Lender, Settings, no_tls_canceller};
use crate::listen::{self, Connector, Sessions};
use crate::lock::{CustomLock, PickLock};
use crate::row::PgRow;

/// How long an acquire of a pool the broker builds waits for a connection, unless its
/// [`PoolConfig`] says otherwise.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a pool the broker builds waits for a new connection to open, unless its
/// [`PoolConfig`] says otherwise.
pub const DEFAULT_CREATE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a pool the broker builds may take to check an idle connection before it lends it,
/// unless its [`PoolConfig`] says otherwise.
pub const DEFAULT_RECYCLE_TIMEOUT: Duration = Duration::from_secs(5);

/// How the connections of a pool the broker builds, and its listening session, reach the
/// server: without TLS ([`NoTls`]) or over the connector given to
/// [`TokioPostgresBroker::from_url_tls`].
#[derive(Clone)]
struct Tls {
    /// The pool's manager of a config, its connections over this TLS.
    manager: Arc<dyn Fn(Config, ManagerConfig) -> Manager + Send + Sync>,
    /// The listening session's connector of a config, over this TLS.
    listener: Arc<dyn Fn(Config) -> Connector + Send + Sync>,
}

impl Tls {
    fn new<T>(tls: T) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Sync + Send,
        T::TlsConnect: Sync + Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let listen = tls.clone();
        Self {
            manager: Arc::new(move |config, manager| {
                Manager::from_config(config, tls.clone(), manager)
            }),
            listener: Arc::new(move |config| listen::connector(config, listen.clone())),
        }
    }
}

/// Where the broker's pool comes from.
enum Origin {
    /// Built at the start from a URL, its connections over this TLS; the broker closes it.
    Url(String, PoolConfig, Tls),
    /// The service's own pool; it stays open.
    Pool(Pool),
}

/// Where the session that hears of other processes' publishes connects.
enum Listen {
    /// Where the URL of `from_url` points, over its TLS; nowhere for the service's own pool.
    Url,
    /// Where the service said.
    On(Connector),
    /// Nowhere.
    Off,
}

/// The broker's pool as [`Pooled`] runs it, how its connections run statements, and where
/// it listens.
struct Source {
    origin: Origin,
    settings: Arc<Settings>,
    listen: Listen,
    /// The listening sessions opened, for the close to wait for.
    sessions: Arc<Sessions>,
}

impl PoolSource for Source {
    type Pool = Pool;
    type Lender = Lender;

    fn name(&self) -> &'static str {
        "tokio-postgres"
    }

    fn target(&self) -> String {
        match &self.origin {
            Origin::Url(url, ..) => redact_url(url),
            Origin::Pool(_) => "the service's own pool".to_owned(),
        }
    }

    fn given(&self) -> Option<&Pool> {
        match &self.origin {
            Origin::Pool(pool) => Some(pool),
            Origin::Url(..) => None,
        }
    }

    fn build(&self) -> ConnFuture<'_, Result<Pool, AdapterError>> {
        let built = match &self.origin {
            Origin::Pool(pool) => Ok(pool.clone()),
            Origin::Url(url, config, tls) => build_pool(url, config, tls, &self.target()),
        };
        Box::pin(std::future::ready(built))
    }

    /// The server answers `SHOW server_version_num` with a version the queue serves; the
    /// broker runs on the tokio runtime it starts in.
    fn open(&self, pool: &Pool) -> ConnFuture<'_, Result<(Lender, Dialect), AdapterError>> {
        let pool = pool.clone();
        Box::pin(async move {
            let target = self.target();
            let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
                AdapterError::new(format!(
                    "the tokio-postgres broker of {target} runs on tokio: start it inside a tokio runtime"
                ))
            })?;
            check_server(&pool, &target).await?;
            let lender = Lender {
                pool,
                runtime,
                settings: self.settings.clone(),
            };
            Ok((lender, Dialect::Postgres))
        })
    }

    fn close(&self, pool: Pool, _: Option<Self::Lender>, _: usize) -> ConnFuture<'_, ()> {
        pool.close();
        Box::pin(std::future::ready(()))
    }
}

/// The broker on PostgreSQL over tokio-postgres, with a deadpool-postgres pool: build it from
/// a URL (it builds and closes its pool) or on the service's own pool (which stays open), then
/// hand it to a service ([tokio-postgres](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#tokio-postgres)).
// Not `Clone`, so one broker never gets two handles by mistake: take the handle (or a route)
// first and clone that.
pub struct TokioPostgresBroker {
    inner: Arc<Pooled<Source>>,
}

impl fmt::Debug for TokioPostgresBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = self.inner.source();
        f.debug_struct("TokioPostgresBroker")
            .field("target", &source.target())
            .field("owns_pool", &self.inner.owns_pool())
            .field("simple_query", &source.settings.simple)
            .field(
                "listens",
                &match source.listen {
                    Listen::Url => self.inner.owns_pool(),
                    Listen::On(_) => true,
                    Listen::Off => false,
                },
            )
            .field("state", &self.inner.phase())
            .field("connections_held", &self.inner.held())
            .finish()
    }
}

impl TokioPostgresBroker {
    fn with_source(origin: Origin) -> Self {
        Self {
            inner: Arc::new(Pooled::new(Source {
                origin,
                settings: Arc::new(Settings {
                    simple: false,
                    canceller: no_tls_canceller(),
                }),
                listen: Listen::Url,
                sessions: Arc::new(Sessions::default()),
            })),
        }
    }

    /// The source, to change before the broker is shared.
    fn source_mut(&mut self) -> &mut Source {
        Arc::get_mut(&mut self.inner)
            .expect(
                "a broker is shared only once it is wrapped in its handle, which takes it by value",
            )
            .source_mut()
    }

    /// The settings, to change before the broker is shared.
    fn settings_mut(&mut self) -> &mut Settings {
        Arc::make_mut(&mut self.source_mut().settings)
    }

    /// A broker of the database `url` names (a URL or a `key=value` string), with a pool of
    /// this size (`PoolConfig::new(16)`), without TLS. Nothing connects here: the pool is
    /// built when the service starts and closed at shutdown.
    // A timeout the config leaves unset is `DEFAULT_WAIT_TIMEOUT`, `DEFAULT_CREATE_TIMEOUT`
    // and `DEFAULT_RECYCLE_TIMEOUT`; the pool checks that an idle connection is still open
    // before it lends it (`RecyclingMethod::Fast`).
    pub fn from_url(url: impl Into<String>, pool: PoolConfig) -> Self {
        Self::with_source(Origin::Url(url.into(), pool, Tls::new(NoTls)))
    }

    /// [`TokioPostgresBroker::from_url`] over TLS through `tls`, any tokio-postgres connector:
    /// the pool, the listening session and cancel requests all use it, and the URL's `sslmode`
    /// decides whether TLS is required ([TLS](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#tokio-postgres)).
    ///
    /// ```no_run
    /// # #[cfg(feature = "native-tls")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use ruststream_tokio_postgres::TokioPostgresBroker;
    /// use ruststream_tokio_postgres::deadpool_postgres::PoolConfig;
    /// use ruststream_tokio_postgres::{native_tls, postgres_native_tls};
    ///
    /// let connector = native_tls::TlsConnector::builder().build()?;
    /// let broker = TokioPostgresBroker::from_url_tls(
    ///     "postgres://app@db.example.com:5432/app?sslmode=require",
    ///     PoolConfig::new(8),
    ///     postgres_native_tls::MakeTlsConnector::new(connector),
    /// );
    /// # let _ = broker;
    /// # Ok(())
    /// # }
    /// # #[cfg(not(feature = "native-tls"))]
    /// # fn main() {}
    /// ```
    pub fn from_url_tls<T>(url: impl Into<String>, pool: PoolConfig, tls: T) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Sync + Send,
        T::TlsConnect: Sync + Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        Self::with_source(Origin::Url(url.into(), pool, Tls::new(tls.clone()))).cancel_tls(tls)
    }

    /// [`TokioPostgresBroker::from_url_tls`] over the platform's TLS library with its default
    /// settings (the system's root certificates). The feature `native-tls`.
    #[cfg(feature = "native-tls")]
    pub fn from_url_native_tls(
        url: impl Into<String>,
        pool: PoolConfig,
    ) -> Result<Self, native_tls::Error> {
        let connector = native_tls::TlsConnector::new()?;
        Ok(Self::from_url_tls(
            url,
            pool,
            postgres_native_tls::MakeTlsConnector::new(connector),
        ))
    }

    /// [`TokioPostgresBroker::from_url_tls`] over rustls with the webpki roots (feature
    /// `rustls`). It uses rustls's installed crypto provider, else `ring`; with a second
    /// provider enabled, install one first or rustls panics ([TLS](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#tokio-postgres)).
    #[cfg(feature = "rustls")]
    pub fn from_url_rustls(url: impl Into<String>, pool: PoolConfig) -> Self {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Self::from_url_tls(
            url,
            pool,
            tokio_postgres_rustls::MakeRustlsConnect::new(config),
        )
    }

    /// A broker on the service's own pool, which stays open at shutdown for the service to
    /// close. Connections go back with no transaction open; one whose session must end is
    /// taken out of the pool.
    pub fn new(pool: Pool) -> Self {
        Self::with_source(Origin::Pool(pool))
    }

    /// Runs every statement under the simple query protocol (`true`), binds written as
    /// literals, instead of the extended one (`false`, the default): for a proxy that takes no
    /// prepared statements ([Poolers](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#poolers-and-postgresql-sessions)).
    // Literals are safe under either setting of `standard_conforming_strings`: text quoted
    // (an escape string `E'..'` when it holds a backslash), bytes as `'\x..'::bytea`, integers
    // as digits. Rows come back as text, which `PgRow::decode` parses as the row type's fields
    // ask. The payload column must then be `bytea`, and an id column of a text type must not
    // hold values that read as plain integers.
    pub fn simple_query(mut self, simple: bool) -> Self {
        self.settings_mut().simple = simple;
        self
    }

    /// Sends the cancel requests of closed connections (a close cuts short a statement still
    /// running) over `tls`, for a server that takes no unencrypted connection. The default is
    /// [`NoTls`].
    pub fn cancel_tls<T>(mut self, tls: T) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        self.settings_mut().canceller = Arc::new(move |token: CancelToken| {
            let tls = tls.clone();
            Box::pin(async move { token.cancel_query(tls).await })
        });
        self
    }

    /// Opens the session that hears of other processes' publishes on `config` over `tls`: a
    /// direct connection or PgBouncer in session pooling. A broker on the service's own pool
    /// listens only where this says ([Poolers](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#poolers-and-postgresql-sessions)).
    pub fn listen_on<T>(mut self, config: Config, tls: T) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        self.source_mut().listen = Listen::On(listen::connector(config, tls));
        self
    }

    /// Hears of no other process's publish: their rows wait for the subscriptions' next
    /// poll. This broker's own publishes still wake its subscriptions.
    pub fn without_listener(mut self) -> Self {
        self.source_mut().listen = Listen::Off;
        self
    }

    /// Whether statements run under the simple query protocol
    /// ([`TokioPostgresBroker::simple_query`]).
    pub fn is_simple_query(&self) -> bool {
        self.inner.source().settings.simple
    }

    /// The pool, once the broker has started (and after it closed): the one it built, or the
    /// service's own.
    pub fn pool(&self) -> Option<Pool> {
        self.inner.pool()
    }

    /// Whether the broker builds its pool (and so closes it at shutdown): `from_url`, not
    /// `new`.
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

/// Builds the pool of `from_url` (and `from_url_tls`).
fn build_pool(
    url: &str,
    config: &PoolConfig,
    tls: &Tls,
    target: &str,
) -> Result<Pool, AdapterError> {
    let pg: tokio_postgres::Config = url.parse().map_err(|e| {
        AdapterError::new(format!("the PostgreSQL URL `{target}` does not parse: {e}"))
    })?;
    let manager = (tls.manager)(
        pg,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let mut config = *config;
    let timeouts = &mut config.timeouts;
    timeouts.wait.get_or_insert(DEFAULT_WAIT_TIMEOUT);
    timeouts.create.get_or_insert(DEFAULT_CREATE_TIMEOUT);
    timeouts.recycle.get_or_insert(DEFAULT_RECYCLE_TIMEOUT);
    Pool::builder(manager)
        .config(config)
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| {
            AdapterError::new(format!(
                "the pool of PostgreSQL at {target} does not build: {e}"
            ))
        })
}

/// Takes a connection of the pool and checks that the server takes the forms.
async fn check_server(pool: &Pool, target: &str) -> Result<(), AdapterError> {
    let client = pool.get().await.map_err(|e| {
        // The pool's error alone says "db error": name the server's refusal, or the TLS
        // or I/O failure, as the core's errors do.
        let error = crate::error::pool_error(&e);
        AdapterError::of(
            error.kind,
            format!(
                "cannot connect to PostgreSQL at {target}: {}",
                error.message
            ),
        )
    })?;
    let messages = client
        .simple_query("SHOW server_version_num")
        .await
        .map_err(|e| {
            let error = crate::error::db_error(&e);
            AdapterError::of(
                error.kind,
                format!("PostgreSQL at {target} does not answer: {e}"),
            )
        })?;
    let version = messages.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0),
        _ => None,
    });
    match version {
        Some(version) => server::dialect_of(Server::Postgres, version)
            .map(drop)
            .map_err(|e| AdapterError::new(format!("PostgreSQL at {target}: {e}"))),
        None => Ok(()),
    }
}

impl Adapter for TokioPostgresBroker {
    type Row = PgRow;
    type Lock = CustomLock;

    /// Under the extended query protocol (the default) every statement is prepared once per
    /// connection and kept; under [`TokioPostgresBroker::simple_query`] nothing is.
    fn prepares_statements(&self) -> bool {
        !self.inner.source().settings.simple
    }

    /// A session on a connection of its own ([`TokioPostgresBroker::listen_on`]), its task on
    /// the broker's tokio runtime, that runs `LISTEN ruststream`.
    fn listen(&self) -> Option<BoxFuture<Result<Notifications, DbError>>> {
        let runtime = self.inner.lender()?.runtime;
        let source = self.inner.source();
        let connect = match (&source.listen, &source.origin) {
            (Listen::Off, _) | (Listen::Url, Origin::Pool(_)) => return None,
            (Listen::On(connect), _) => connect.clone(),
            (Listen::Url, Origin::Url(url, _, tls)) => {
                // The start parsed the URL already.
                let config: Config = url.parse().ok()?;
                (tls.listener)(config)
            }
        };
        Some(listen::open(connect, runtime, source.sessions.clone()))
    }

    /// Lends the connection of a row lock claim's open transaction to its handler.
    fn lend(
        &self,
        conn: ruststream_core::ConnId,
    ) -> Option<BoxFuture<Option<Box<dyn std::any::Any + Send>>>> {
        Some(self.inner.lend(conn))
    }

    /// Builds the pool where the broker builds it, takes a connection to check the server
    /// (PostgreSQL 9.5 or later), and answers [`Dialect::Postgres`]. It runs in a tokio
    /// runtime, where the connections' tasks then run.
    fn start(&self) -> BoxFuture<Result<Dialect, AdapterError>> {
        self.inner.start()
    }

    /// Runs the command on the connection it names, after the commands given before it on
    /// that connection.
    fn execute(&self, command: Command, lock: Option<CustomLock>) -> BoxFuture<Reply<PgRow>> {
        self.inner.execute(command, lock)
    }

    /// Closes the broker: a pool it built closes, the service's own stays open, and every
    /// listening session's connection has ended when it completes.
    fn close(&self) -> BoxFuture<()> {
        let inner = self.inner.clone();
        Box::pin(async move {
            inner.source().sessions.close().await;
            inner.close().await;
        })
    }
}

/// Rows of `T` decode with serde ([`PgRow::decode`]): `T` is `#[derive(serde::Deserialize)]`.
/// `T`'s custom lock is its [`Lock`](crate::Lock) and [`Unlock`](crate::Unlock) where its
/// description names `own::Lock` and `own::Unlock`.
impl<T> TakesRows<T> for TokioPostgresBroker
where
    T: InboxTable + DeserializeOwned,
    T::Table: ValidOn<Postgres>,
    <<T::Table as Described>::Features as Features>::Lock: PickLock<T>,
{
    fn decode(row: PgRow) -> Result<T, String> {
        row.decode().map_err(|e| e.to_string())
    }

    fn custom_lock() -> Option<CustomLock> {
        <<<T::Table as Described>::Features as Features>::Lock as PickLock<T>>::pick()
    }
}

ruststream::broker_methods!(impl TokioPostgresBroker);

/// A route of a [`TokioPostgresBroker`]: the broker with the name of a queue whose
/// subscriptions take `T`'s rows, and a publisher into `T`'s table
/// ([`TokioPostgresBroker::route`]).
pub type TokioPostgresRoute<T> = ruststream::Route<T, TokioPostgresBroker>;

/// A [`TokioPostgresBroker`] started by hand ([`TokioPostgresBroker::start`]), driven in the
/// background until its [`shutdown`](ruststream::RunningBroker::shutdown), which answers a
/// [`ClosedTokioPostgresBroker`].
pub type RunningTokioPostgresBroker = ruststream::RunningBroker<TokioPostgresBroker>;

/// What the shutdown of a [`TokioPostgresBroker`] started by hand did to the advisory locks of
/// the deliveries in work: `locks_released`, the locks an unlock released, and
/// `connections_closed`, the connections closed to end their locks.
pub type ClosedTokioPostgresBroker = ruststream::ClosedCounts;

/// Publishes jobs into `T`'s table through a [`TokioPostgresBroker`]; until the broker starts
/// and after its shutdown it writes nothing and answers [`TokioPostgresBrokerError::Closed`].
pub type TokioPostgresPublisher<T> = ruststream::Publisher<T, TokioPostgresBroker>;

/// Why a publish, or a start by hand, of a [`TokioPostgresBroker`] did not happen: `Closed`,
/// `Encode`, `Invalid`, `Db`, `Start` ([`ruststream::Error`]).
pub type TokioPostgresBrokerError = ruststream::Error;

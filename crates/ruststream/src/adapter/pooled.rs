//! A broker's pool through its life: not started, running, closed. What every adapter on a
//! pool shares: where the pool comes from (built by the broker or the service's own), the
//! start that opens it and reads the server's dialect, the commands run on its connections
//! while it runs, and the close that ends a pool the broker built.

use std::sync::{Arc, Mutex, MutexGuard};

use ruststream_core::{Command, Dialect, Reply};

use super::{AdapterError, ConnFuture, ConnectionPool, Connections};
use crate::exec::BoxFuture;

/// Where a broker's pool comes from and how it opens and closes: what an adapter on a pool
/// writes so that [`Pooled`] runs its life.
pub trait PoolSource: Send + Sync + 'static {
    /// The driver's pool, as the broker's `pool()` shows it.
    type Pool: Clone + Send + Sync + 'static;
    /// The pool as it lends connections to the core's commands while the broker runs.
    type Lender: ConnectionPool;

    /// The broker, as messages name it (`the {name} broker of {target} ..`): its database
    /// (`PostgreSQL`, `MySQL`, `SQLite`) or its driver (`tokio-postgres`).
    fn name(&self) -> &'static str;

    /// Where the pool connects, for messages: a URL without its password, or a file.
    fn target(&self) -> String;

    /// The service's own pool, which the broker never closes; `None` where the broker builds
    /// its pool at the start ([`PoolSource::build`]) and closes it at the end.
    fn given(&self) -> Option<&Self::Pool>;

    /// Builds the pool, where the broker builds it. An error names the URL or setting at
    /// fault.
    fn build(&self) -> ConnFuture<'_, Result<Self::Pool, AdapterError>>;

    /// Checks the server on the pool (a connection answers, its version is one the queue
    /// serves) and answers the lender of the running broker and the server's dialect.
    fn open(
        &self,
        pool: &Self::Pool,
    ) -> ConnFuture<'_, Result<(Self::Lender, Dialect), AdapterError>>;

    /// Closes a pool the broker built: it lends no new connection, and a connection still lent
    /// closes when it comes back. `lender` is `None` for a pool whose start failed after it
    /// was built; `held` is how many connections the core still holds.
    fn close(
        &self,
        pool: Self::Pool,
        lender: Option<Self::Lender>,
        held: usize,
    ) -> ConnFuture<'_, ()>;
}

enum State<S: PoolSource> {
    /// Not started: nothing connects yet.
    Idle,
    /// Started: the pool lends connections.
    Running {
        pool: S::Pool,
        lender: S::Lender,
        dialect: Dialect,
    },
    /// Closed: no connection is lent any more. The pool and the dialect, where it ran.
    Closed {
        pool: Option<S::Pool>,
        dialect: Option<Dialect>,
    },
}

/// A broker's pool and the connections the core holds on it, through the broker's life: an
/// adapter's `start`, `execute` and `close` hand over to [`Pooled::start`],
/// [`Pooled::execute`] and [`Pooled::close`].
// The start builds the pool where the broker builds it, checks the server and keeps the
// lender; a second start, or one after the close, fails naming the broker. While it runs, a
// command runs on the connections of `Connections`. Before the start and after the close, an
// acquire fails as the pool closed, and the connections still held run their commands on. The
// close lends no new connection; a pool the broker built closes, the service's own stays open.
pub struct Pooled<S: PoolSource> {
    source: S,
    state: Mutex<State<S>>,
    conns: Arc<Connections<S::Lender>>,
}

impl<S: PoolSource> Pooled<S> {
    /// A broker's pool from this source, not started.
    pub fn new(source: S) -> Self {
        Self {
            source,
            state: Mutex::new(State::Idle),
            conns: Arc::new(Connections::new()),
        }
    }

    /// Where the pool comes from.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Where the pool comes from, to change before the start (the broker's builder methods).
    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    fn state(&self) -> MutexGuard<'_, State<S>> {
        // The lock guards a plain enum that no code panics while holding.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn refused(&self, why: &str) -> AdapterError {
        AdapterError::new(format!(
            "the {} broker of {} {why}",
            self.source.name(),
            self.source.target()
        ))
    }

    /// Builds the pool where the broker builds it, checks the server, and answers its dialect.
    pub fn start(self: &Arc<Self>) -> BoxFuture<Result<Dialect, AdapterError>> {
        let this = self.clone();
        Box::pin(async move {
            if !matches!(*this.state(), State::Idle) {
                return Err(this.refused("is already started or closed; build a new broker"));
            }
            let pool = match this.source.given() {
                Some(pool) => pool.clone(),
                None => this.source.build().await?,
            };
            let opened = this.source.open(&pool).await;
            let (lender, dialect) = match opened {
                Ok(opened) => opened,
                Err(error) => {
                    if this.owns_pool() {
                        this.source.close(pool, None, 0).await;
                    }
                    return Err(error);
                }
            };
            let mut state = this.state();
            if !matches!(*state, State::Idle) {
                return Err(this.refused("was closed while it started"));
            }
            *state = State::Running {
                pool,
                lender,
                dialect,
            };
            Ok(dialect)
        })
    }

    /// Runs the command on the connection it names, after the commands given before it on
    /// that connection ([`Connections::execute`]).
    pub fn execute(
        &self,
        command: Command,
        lock: Option<<S::Lender as ConnectionPool>::Lock>,
    ) -> BoxFuture<Reply<<S::Lender as ConnectionPool>::Row>> {
        self.conns.execute(self.lender(), command, lock)
    }

    /// Closes: no new connection is lent. A pool the broker built closes; the service's own
    /// stays open.
    pub fn close(self: &Arc<Self>) -> BoxFuture<()> {
        let this = self.clone();
        Box::pin(async move {
            let ran = {
                let mut state = this.state();
                let (pool, dialect, ran) = match std::mem::replace(
                    &mut *state,
                    State::Closed {
                        pool: None,
                        dialect: None,
                    },
                ) {
                    State::Running {
                        pool,
                        lender,
                        dialect,
                    } => (Some(pool.clone()), Some(dialect), Some((pool, lender))),
                    State::Closed { pool, dialect } => (pool, dialect, None),
                    State::Idle => (this.source.given().cloned(), None, None),
                };
                *state = State::Closed { pool, dialect };
                ran.filter(|_| this.owns_pool())
            };
            if let Some((pool, lender)) = ran {
                this.source
                    .close(pool, Some(lender), this.conns.held())
                    .await;
            }
        })
    }

    /// Lends the connection the core holds under `conn` to a handler ([`Connections::lend`]),
    /// behind `Any`: a [`Lent`](super::Lent) of the lender.
    pub fn lend(
        &self,
        conn: ruststream_core::ConnId,
    ) -> BoxFuture<Option<Box<dyn std::any::Any + Send>>> {
        let lent = self.conns.lend(conn);
        Box::pin(async move {
            lent.await
                .map(|l| Box::new(l) as Box<dyn std::any::Any + Send>)
        })
    }

    /// The lender, while the broker runs.
    pub fn lender(&self) -> Option<S::Lender> {
        match &*self.state() {
            State::Running { lender, .. } => Some(lender.clone()),
            State::Idle | State::Closed { .. } => None,
        }
    }

    /// The pool: the one the broker built once it started (and after it closed), or the
    /// service's own.
    pub fn pool(&self) -> Option<S::Pool> {
        match &*self.state() {
            State::Running { pool, .. } => Some(pool.clone()),
            State::Closed { pool, .. } => pool.clone(),
            State::Idle => self.source.given().cloned(),
        }
    }

    /// The server's dialect, once the broker has started.
    pub fn dialect(&self) -> Option<Dialect> {
        match &*self.state() {
            State::Running { dialect, .. } => Some(*dialect),
            State::Closed { dialect, .. } => *dialect,
            State::Idle => None,
        }
    }

    /// Whether the broker builds its pool, and so closes it.
    pub fn owns_pool(&self) -> bool {
        self.source.given().is_none()
    }

    /// Whether the broker is closed: it lends no connection any more.
    pub fn is_closed(&self) -> bool {
        matches!(*self.state(), State::Closed { .. })
    }

    /// How many connections the core holds now (claims, deliveries in work, publishes).
    pub fn held(&self) -> usize {
        self.conns.held()
    }

    /// `idle`, `running` or `closed`, for a broker's `Debug`.
    pub fn phase(&self) -> &'static str {
        match &*self.state() {
            State::Idle => "idle",
            State::Running { .. } => "running",
            State::Closed { .. } => "closed",
        }
    }
}

impl<S: PoolSource> std::fmt::Debug for Pooled<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pooled")
            .field("name", &self.source.name())
            .field("target", &self.source.target())
            .field("owns_pool", &self.owns_pool())
            .field("state", &self.phase())
            .field("dialect", &self.dialect())
            .field("connections_held", &self.held())
            .finish()
    }
}

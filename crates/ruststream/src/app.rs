//! The service: its startup hooks, its brokers and their subscriptions, and the graceful
//! shutdown on SIGINT and SIGTERM.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::FutureExt;
use futures::channel::oneshot;

use crate::adapter::Adapter;
use crate::error::StartError;
use crate::exec::{BoxFuture, Executor};
use crate::handle::{BrokerHandle, BrokerScope, IntoBroker, RunningBroker};
use crate::start::StopSignal;
use crate::state::States;

/// An error of a startup hook.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The service's name and version, for logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppInfo {
    /// The name.
    pub name: &'static str,
    /// The version.
    pub version: &'static str,
}

impl AppInfo {
    /// A service of this name and version.
    pub const fn new(name: &'static str, version: &'static str) -> Self {
        Self { name, version }
    }
}

/// Why the service stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A startup hook failed.
    #[error("a startup hook failed: {0}")]
    Startup(BoxError),
    /// A broker did not start.
    #[error("a broker did not start: {0}")]
    Start(#[from] StartError),
}

type Hook = Box<dyn FnOnce() -> BoxFuture<Result<(), BoxError>> + Send>;

trait StartBroker: Send {
    fn start(
        self: Box<Self>,
        exec: Arc<dyn Executor>,
        states: States,
        stop: StopSignal,
    ) -> BoxFuture<Result<Box<dyn Running>, StartError>>;
}

trait Running: Send + Sync {
    fn stop(&self);
    fn drained(&self) -> BoxFuture<()>;
    fn shutdown(self: Box<Self>) -> BoxFuture<()>;
}

struct Pending<A: Adapter> {
    handle: BrokerHandle<A>,
    scope: BrokerScope<A>,
}

impl<A: Adapter> StartBroker for Pending<A> {
    fn start(
        self: Box<Self>,
        exec: Arc<dyn Executor>,
        states: States,
        stop: StopSignal,
    ) -> BoxFuture<Result<Box<dyn Running>, StartError>> {
        Box::pin(async move {
            let mut subscriptions = self.scope.subscriptions;
            for subscription in &mut subscriptions {
                subscription.fill_states(&states);
            }
            let running = self.handle.start_until(subscriptions, exec, stop).await?;
            Ok(Box::new(Arc::new(running)) as Box<dyn Running>)
        })
    }
}

impl<A: Adapter> Running for Arc<RunningBroker<A>> {
    fn stop(&self) {
        RunningBroker::stop(self);
    }

    fn drained(&self) -> BoxFuture<()> {
        let me = self.clone();
        // The inherent method: `me.drained()` would resolve to this trait method on the `Arc`
        // again and recurse until the stack overflows.
        Box::pin(async move { RunningBroker::drained(&me).await })
    }

    fn shutdown(self: Box<Self>) -> BoxFuture<()> {
        Box::pin(async move {
            match Arc::try_unwrap(*self) {
                Ok(running) => {
                    let counts = running.shutdown().await;
                    tracing::info!(
                        locks_released = counts.locks_released,
                        connections_closed = counts.connections_closed,
                        "broker shut down"
                    );
                }
                Err(_) => tracing::error!("a broker is still shared at shutdown"),
            }
        })
    }
}

/// A service: startup hooks, brokers and their subscriptions.
pub struct RustStream {
    info: AppInfo,
    hooks: Vec<Hook>,
    started: Vec<Hook>,
    brokers: Vec<Box<dyn StartBroker>>,
    shutdown_timeout: Duration,
    executor: Option<Arc<dyn Executor>>,
    states: States,
}

impl std::fmt::Debug for RustStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RustStream")
            .field("info", &self.info)
            .field("brokers", &self.brokers.len())
            .field("shutdown_timeout", &self.shutdown_timeout)
            .finish()
    }
}

impl RustStream {
    /// A service with no broker yet.
    pub fn new(info: AppInfo) -> Self {
        Self {
            info,
            hooks: Vec::new(),
            started: Vec::new(),
            brokers: Vec::new(),
            shutdown_timeout: Duration::from_secs(30),
            executor: None,
            states: States::new(),
        }
    }

    /// Runs `hook` before any broker starts, such as to create a table: `async || ..` (or
    /// `async |()| ..`). An error stops the service before it starts.
    pub fn on_startup<Args, H: ServiceHook<Args>>(mut self, hook: H) -> Self {
        self.hooks.push(Box::new(move || hook.run()));
        self
    }

    /// Runs `hook` once every broker has started, beside the subscriptions, such as to
    /// publish a first batch: `async || ..` (or `async |()| ..`). An error is logged; the
    /// service goes on.
    pub fn on_started<Args, H: ServiceHook<Args>>(mut self, hook: H) -> Self {
        self.started.push(Box::new(move || hook.run()));
        self
    }

    /// Adds a broker, and its subscriptions as `scope` includes them.
    pub fn with_broker<B: IntoBroker>(
        mut self,
        broker: B,
        scope: impl FnOnce(&mut BrokerScope<B::Adapter>),
    ) -> Self {
        let mut subscriptions = BrokerScope {
            subscriptions: Vec::new(),
        };
        scope(&mut subscriptions);
        self.brokers.push(Box::new(Pending {
            handle: broker.into_broker(),
            scope: subscriptions,
        }));
        self
    }

    /// Gives every subscription's handler `value` (a pool, a client, a configuration), which
    /// it reads by type with [`State`](crate::State). A subscription's own value of the same
    /// type ([`SubscriberBuilder::state`](crate::SubscriberBuilder::state)) wins.
    pub fn with_state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.states.insert(value);
        self
    }

    /// How long the handlers in work may take to finish at shutdown (default 30 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Runs on this executor instead of the calling context's.
    pub fn executor(mut self, executor: Arc<dyn Executor>) -> Self {
        self.executor = Some(executor);
        self
    }

    /// The service's name and version.
    pub fn info(&self) -> AppInfo {
        self.info
    }

    /// Runs until SIGINT or SIGTERM, then shuts down gracefully. A signal that comes while the
    /// service starts (its hooks, a start that still tries again) ends the start, what it
    /// opened closes within the shutdown timeout, and it answers `Ok`.
    pub async fn run(self) -> Result<(), RunError> {
        self.run_with(Some(Box::pin(termination())), termination())
            .await
    }

    /// Runs until `stop` completes, then shuts down gracefully ([Shutdown](https://github.com/ruststream/ruststream/blob/main/docs/src/shutdown.md)).
    /// `stop` is polled once the service has started, so it may publish through the brokers.
    pub async fn run_until(self, stop: impl Future<Output = ()> + Send) -> Result<(), RunError> {
        self.run_with(None, stop).await
    }

    /// [`RustStream::run_until`], whose start `abort` ends where given.
    async fn run_with(
        self,
        abort: Option<BoxFuture<()>>,
        stop: impl Future<Output = ()> + Send,
    ) -> Result<(), RunError> {
        let exec = self.executor.clone().unwrap_or_else(crate::exec::current);
        let info = self.info;
        let timeout = self.shutdown_timeout;
        let starting = (self.hooks, self.brokers);
        let started = Self::start_or_abort(starting, &exec, &self.states, abort, timeout).await?;
        let Some(running) = started else {
            tracing::info!(name = info.name, "service stopped before it started");
            return Ok(());
        };
        tracing::info!(name = info.name, version = info.version, "service started");
        for hook in self.started {
            exec.spawn(Box::pin(async move {
                if let Err(error) = hook().await {
                    tracing::error!("a started hook failed: {error}");
                }
            }));
        }
        stop.await;
        tracing::info!(name = info.name, "service stopping");
        for r in &running {
            r.stop();
        }
        let drained = futures::future::join_all(running.iter().map(|r| r.drained()));
        futures::select! {
            _ = drained.fuse() => {}
            () = exec.sleep(self.shutdown_timeout).fuse() => {
                tracing::warn!(timeout = ?self.shutdown_timeout, "handlers still in work at the shutdown timeout");
            }
        }
        for r in running {
            r.shutdown().await;
        }
        tracing::info!(name = info.name, "service stopped");
        Ok(())
    }

    /// Starts the service, ended where `abort` completes first: what the start opened closes
    /// (within `timeout`), and it answers `None`.
    async fn start_or_abort(
        (hooks, brokers): (Vec<Hook>, Vec<Box<dyn StartBroker>>),
        exec: &Arc<dyn Executor>,
        states: &States,
        abort: Option<BoxFuture<()>>,
        timeout: Duration,
    ) -> Result<Option<Vec<Box<dyn Running>>>, RunError> {
        let Some(abort) = abort else {
            return Self::start_all(hooks, brokers, exec, states, None)
                .await
                .map(Some);
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let signal = Some(stop_rx.shared());
        let starting = Self::start_all(hooks, brokers, exec, states, signal).fuse();
        futures::pin_mut!(starting);
        futures::select_biased! {
            started = starting => return started.map(Some),
            () = abort.fuse() => {}
        }
        // The start ends where it is: what it opened closes.
        let _ = stop_tx.send(());
        futures::select_biased! {
            started = starting => {
                for r in started.into_iter().flatten() {
                    r.shutdown().await;
                }
            }
            () = exec.sleep(timeout).fuse() => {
                tracing::warn!(?timeout, "the start did not end within the shutdown timeout");
            }
        }
        Ok(None)
    }

    /// Runs the startup hooks, then starts each broker; a failure shuts down the brokers
    /// started before it.
    async fn start_all(
        hooks: Vec<Hook>,
        brokers: Vec<Box<dyn StartBroker>>,
        exec: &Arc<dyn Executor>,
        states: &States,
        stop: StopSignal,
    ) -> Result<Vec<Box<dyn Running>>, RunError> {
        for hook in hooks {
            let run = hook().map(|r| r.map_err(RunError::Startup));
            futures::select_biased! {
                () = crate::start::stopped(&stop).fuse() => return Err(StartError::Stopped.into()),
                ran = run.fuse() => ran?,
            }
        }
        let mut running: Vec<Box<dyn Running>> = Vec::new();
        for broker in brokers {
            match broker
                .start(exec.clone(), states.clone(), stop.clone())
                .await
            {
                Ok(r) => running.push(r),
                Err(error) => {
                    for r in running {
                        r.shutdown().await;
                    }
                    return Err(error.into());
                }
            }
        }
        Ok(running)
    }
}

/// A runnable service.
pub trait App {
    /// Runs until SIGINT or SIGTERM.
    fn run(self) -> impl Future<Output = Result<(), RunError>> + Send;
}

impl App for RustStream {
    fn run(self) -> impl Future<Output = Result<(), RunError>> + Send {
        RustStream::run(self)
    }
}

type Waiters = Mutex<(bool, Vec<oneshot::Sender<()>>)>;

fn signals() -> &'static Arc<Waiters> {
    static SIGNALS: OnceLock<Arc<Waiters>> = OnceLock::new();
    SIGNALS.get_or_init(|| {
        let waiters: Arc<Waiters> = Arc::new(Mutex::new((false, Vec::new())));
        let on_signal = waiters.clone();
        let installed = ctrlc::set_handler(move || {
            let mut w = on_signal.lock().expect("the signal list is never poisoned");
            w.0 = true;
            for waiter in w.1.drain(..) {
                let _ = waiter.send(());
            }
        });
        if let Err(error) = installed {
            tracing::warn!("SIGINT and SIGTERM are not handled: {error}");
        }
        waiters
    })
}

/// Completes at the first SIGINT or SIGTERM.
pub fn termination() -> impl Future<Output = ()> + Send {
    let (tx, rx) = oneshot::channel();
    {
        let mut w = signals().lock().expect("the signal list is never poisoned");
        if w.0 {
            let _ = tx.send(());
        } else {
            w.1.push(tx);
        }
    }
    async move {
        let _ = rx.await;
    }
}

/// Runs a service on plain threads, with no async runtime: [`crate::exec::Threads`] runs its
/// tasks and the calling thread waits. Prints the error and exits with 1 if it fails.
pub fn run_blocking(service: RustStream) -> std::process::ExitCode {
    let threads = match crate::exec::Threads::new() {
        Ok(threads) => threads,
        Err(error) => {
            eprintln!("error: could not start the service's threads: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match futures::executor::block_on(service.executor(Arc::new(threads)).run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs an app on a new multi-threaded tokio runtime: what `#[ruststream::app]` generates
/// for `main`. Prints the error and exits with 1 if the app fails.
#[cfg(feature = "tokio")]
pub fn run_app<A: App>(app: A) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: could not start the tokio runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(app.run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A hook of the service ([`RustStream::on_startup`], [`RustStream::on_started`]): an async
/// closure of no argument, `async || ..`, or of the unit, `async |()| ..`, whose error is any
/// that converts into [`BoxError`].
#[diagnostic::on_unimplemented(
    message = "a service hook is `async || -> Result<(), E>` (or `async |()| ..`)",
    label = "not a hook"
)]
pub trait ServiceHook<Args>: Send + 'static {
    /// Runs the hook.
    fn run(self) -> BoxFuture<Result<(), BoxError>>;
}

impl<F, Fut, E> ServiceHook<()> for F
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<BoxError>,
{
    fn run(self) -> BoxFuture<Result<(), BoxError>> {
        let run = self();
        Box::pin(async move { run.await.map_err(Into::into) })
    }
}

impl<F, Fut, E> ServiceHook<((),)> for F
where
    F: FnOnce(()) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<BoxError>,
{
    fn run(self) -> BoxFuture<Result<(), BoxError>> {
        let run = self(());
        Box::pin(async move { run.await.map_err(Into::into) })
    }
}

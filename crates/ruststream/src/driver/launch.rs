//! Starting a broker: the adapter opened, the subscriptions registered in the core, the
//! listening session probed, the driver spawned, and every table's check passed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::channel::{mpsc, oneshot};
use futures::stream::{BoxStream, FuturesUnordered};
use ruststream_core::{Broker, CheckError, ClosedCounts, Dialect};

use super::{Driver, HandleState, Input, Sender, now};
use crate::adapter::Adapter;
use crate::error::StartError;
use crate::exec::Executor;
use crate::listen::{self, Notice};
use crate::metrics::DriverMetrics;
use crate::start::StopSignal;
use crate::subscriber::Subscription;

/// A started broker, driven by its task.
pub(crate) struct Started {
    pub(crate) tx: Sender,
    pub(crate) closed: oneshot::Receiver<ClosedCounts>,
}

/// Starts a broker: opens the adapter, subscribes, spawns the driver, and waits until every
/// subscription's table passed its check.
pub(crate) async fn start<A: Adapter>(
    adapter: Arc<A>,
    subs: Vec<Subscription<A>>,
    exec: Arc<dyn Executor>,
    state: Arc<Mutex<HandleState>>,
    stop: StopSignal,
) -> Result<Started, StartError> {
    {
        let state = state.lock().expect("the handle's state is never poisoned");
        if !matches!(*state, HandleState::Idle) {
            return Err(StartError::AlreadyStarted);
        }
    }
    let tables = crate::start::tables_named(subs.iter().map(|s| s.desc.table));
    let dialect: Dialect = crate::start::open(&*adapter, &tables, &exec, &stop).await?;
    let core = match subscribed(&*adapter, dialect, &subs) {
        Ok(core) => core,
        Err(error) => {
            adapter.close().await;
            return Err(StartError::Description(error));
        }
    };
    let (tx, rx) = mpsc::unbounded();
    let (ready_tx, ready_rx) = oneshot::channel();
    let (closed_tx, closed_rx) = oneshot::channel();
    let not_ready = subs.len();
    // A broker without subscriptions has nothing to wake.
    let notices = if subs.is_empty() {
        None
    } else {
        match listening(&adapter, dialect, &exec, &stop).await {
            Ok(notices) => notices,
            Err(error) => {
                adapter.close().await;
                return Err(error);
            }
        }
    };
    let metrics = DriverMetrics::new(subs.iter().map(|s| (s.desc.table, s.name)));
    let driver = Driver {
        core,
        adapter,
        exec: exec.clone(),
        tx: tx.clone(),
        rx,
        subs,
        publishers: HashMap::new(),
        waiters: BTreeMap::new(),
        changes: BTreeMap::new(),
        reads: BTreeMap::new(),
        lends: BTreeMap::new(),
        drained: Vec::new(),
        ready: (not_ready > 0).then_some(ready_tx),
        not_ready,
        state: state.clone(),
        notices,
        running: FuturesUnordered::new(),
        metrics,
    };
    *state.lock().expect("the handle's state is never poisoned") = HandleState::Running(tx.clone());
    exec.spawn(Box::pin(async move {
        let counts = driver.run().await;
        let _ = closed_tx.send(counts);
    }));
    let started = Started {
        tx,
        closed: closed_rx,
    };
    if not_ready == 0 {
        return Ok(started);
    }
    checked(started, ready_rx, &stop).await
}

/// A broker for `dialect` with every subscription and the tables' maintenance registered.
fn subscribed<A: Adapter>(
    adapter: &A,
    dialect: Dialect,
    subs: &[Subscription<A>],
) -> Result<Broker<A::Row>, ruststream_core::BrokerError> {
    let mut core = Broker::new(dialect);
    core.set_prepared_statements(adapter.prepares_statements());
    let now = now();
    for sub in subs {
        core.subscribe(sub.desc, sub.options, now)?;
    }
    crate::maintenance::register(&mut core, subs, now)?;
    Ok(core)
}

/// Waits until every subscription's table passed its check; on a failed check or a stop
/// meanwhile, the broker shuts down what it opened and the start fails.
async fn checked(
    started: Started,
    ready: oneshot::Receiver<Result<(), CheckError>>,
    stop: &StopSignal,
) -> Result<Started, StartError> {
    let ready = ready.map(Ok::<_, StartError>);
    let error = match crate::start::or_stopped(ready, stop).await {
        Ok(Ok(Ok(()))) => return Ok(started),
        Ok(Ok(Err(error))) => StartError::Check(error),
        Ok(Err(_)) => return Err(StartError::AlreadyStarted),
        // Stopped while the checks run.
        Err(stopped) => stopped,
    };
    let _ = started.tx.unbounded_send(Input::Shutdown);
    let _ = started.closed.await;
    Err(error)
}

/// The notices of other processes' publishes, where the adapter listens and its session
/// heard the start's probe; `None` where it does not listen.
async fn listening<A: Adapter>(
    adapter: &Arc<A>,
    dialect: Dialect,
    exec: &Arc<dyn Executor>,
    stop: &StopSignal,
) -> Result<Option<BoxStream<'static, Notice>>, StartError> {
    let probe = listen::probe(&**adapter, dialect, exec).map(Ok);
    let first = match crate::start::or_stopped(probe, stop).await? {
        listen::Probe::NotListening => return Ok(None),
        listen::Probe::Later => None,
        listen::Probe::Heard(session) => Some(session),
        listen::Probe::Deaf => {
            return Err(StartError::ListenerHearsNothing {
                waited: listen::PROBE_WAIT,
            });
        }
        listen::Probe::Shared(error) => return Err(StartError::ListenerSharesSessions { error }),
    };
    Ok(listen::notices(adapter.clone(), exec.clone(), first))
}

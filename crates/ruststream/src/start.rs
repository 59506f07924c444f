//! A broker's start as a service runs it: the adapter opened, again after each failure that
//! may pass (a refused or lost connection), each failure reported; and a stop (SIGTERM,
//! SIGINT, [`RustStream::run_until`](crate::RustStream::run_until)'s future) that ends the
//! start in any phase.

use std::sync::Arc;

use futures::FutureExt;
use futures::channel::oneshot;
use futures::future::Shared;
use ruststream_core::{Dialect, start_retry_delay};

use crate::adapter::Adapter;
use crate::error::StartError;
use crate::exec::Executor;

/// The service's stop, as its starting brokers wait on it; `None` for a broker started by
/// hand, which its shutdown stops.
pub(crate) type StopSignal = Option<Shared<oneshot::Receiver<()>>>;

/// Completes once the stop comes; never without one.
pub(crate) async fn stopped(stop: &StopSignal) {
    match stop {
        Some(stop) => {
            let _ = stop.clone().await;
        }
        None => futures::future::pending::<()>().await,
    }
}

/// Runs `future` until it completes, or answers [`StartError::Stopped`] once the stop comes.
pub(crate) async fn or_stopped<T>(
    future: impl Future<Output = Result<T, StartError>>,
    stop: &StopSignal,
) -> Result<T, StartError> {
    futures::select_biased! {
        () = stopped(stop).fuse() => Err(StartError::Stopped),
        result = future.fuse() => result,
    }
}

/// Opens the adapter for the subscriptions of `tables`. Under a service, a failure that may
/// pass is reported and tried again after a wait doubling from a second up to a minute; any
/// other failure, or any failure of a broker started by hand, answers at once.
pub(crate) async fn open<A: Adapter>(
    adapter: &A,
    tables: &str,
    exec: &Arc<dyn Executor>,
    stop: &StopSignal,
) -> Result<Dialect, StartError> {
    let mut failures = 0u32;
    loop {
        let error = match or_stopped(adapter.start().map(|r| r.map_err(Into::into)), stop).await {
            Ok(dialect) => return Ok(dialect),
            Err(StartError::Adapter(error)) if !error.kind.is_permanent() && stop.is_some() => {
                error
            }
            Err(error) => return Err(error),
        };
        failures = failures.saturating_add(1);
        let wait = start_retry_delay(failures);
        crate::retry::visible_error(&format!(
            "the broker of {tables} cannot start: {error}; trying again in {wait:?} ({failures} in a row)"
        ));
        let slept = exec.sleep(wait).map(Ok::<(), StartError>);
        or_stopped(slept, stop).await?;
    }
}

/// The tables of a broker's subscriptions, for messages: "table `a`", "tables `a`, `b`".
pub(crate) fn tables_named<'a>(tables: impl Iterator<Item = &'a str>) -> String {
    let tables: Vec<String> = tables.map(|t| format!("`{t}`")).collect();
    match tables.len() {
        0 => "no table".to_owned(),
        1 => format!("table {}", tables[0]),
        _ => format!("tables {}", tables.join(", ")),
    }
}

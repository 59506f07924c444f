//! The executor seam: the only place the runtime reaches an async runtime.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Spawns tasks and sleeps: everything the runtime needs of an executor.
pub trait Executor: Send + Sync + 'static {
    /// Runs `future` to completion in the background.
    fn spawn(&self, future: BoxFuture<()>);
    /// A future that completes after `duration`.
    fn sleep(&self, duration: Duration) -> BoxFuture<()>;
}

/// The tokio executor: the runtime of the calling task.
#[cfg(feature = "tokio")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Tokio;

#[cfg(feature = "tokio")]
impl Executor for Tokio {
    fn spawn(&self, future: BoxFuture<()>) {
        tokio::spawn(future);
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// The async-std executor.
#[cfg(feature = "async-std")]
#[derive(Clone, Copy, Debug, Default)]
pub struct AsyncStd;

#[cfg(feature = "async-std")]
impl Executor for AsyncStd {
    fn spawn(&self, future: BoxFuture<()>) {
        async_std::task::spawn(future);
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<()> {
        Box::pin(async_std::task::sleep(duration))
    }
}

/// The executor of the calling context: tokio inside a tokio runtime, else async-std.
///
/// # Panics
///
/// When no enabled executor is running: enable the `tokio` or `async-std` feature and call
/// from within its runtime, or pass an executor with `RustStream::executor`.
pub fn current() -> Arc<dyn Executor> {
    #[cfg(feature = "tokio")]
    if tokio::runtime::Handle::try_current().is_ok() {
        return Arc::new(Tokio);
    }
    #[cfg(feature = "async-std")]
    {
        return Arc::new(AsyncStd);
    }
    #[allow(unreachable_code)]
    {
        panic!(
            "ruststream: no executor: call from within a tokio runtime (feature `tokio`), enable the `async-std` feature, or pass one with `RustStream::executor`"
        )
    }
}

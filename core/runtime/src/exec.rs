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

/// Plain threads and no async runtime: futures run on a small pool of threads
/// (`futures::executor::ThreadPool`), and one timer thread wakes the sleeps. With
/// [`crate::run_blocking`], a service runs without tokio or async-std.
#[derive(Clone)]
pub struct Threads {
    pool: futures::executor::ThreadPool,
    timer: Arc<Timer>,
}

impl std::fmt::Debug for Threads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Threads").finish_non_exhaustive()
    }
}

impl Threads {
    /// A pool of as many threads as the machine has cores, and a timer thread.
    pub fn new() -> std::io::Result<Self> {
        let pool = futures::executor::ThreadPool::builder()
            .name_prefix("ruststream-")
            .create()?;
        let timer = Arc::new(Timer::default());
        let run = timer.clone();
        std::thread::Builder::new()
            .name("ruststream-timer".into())
            .spawn(move || run.run())?;
        Ok(Self { pool, timer })
    }
}

impl Executor for Threads {
    fn spawn(&self, future: BoxFuture<()>) {
        self.pool.spawn_ok(future);
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<()> {
        Box::pin(Sleep {
            deadline: std::time::Instant::now() + duration,
            timer: self.timer.clone(),
        })
    }
}

/// The timer thread's queue: deadlines and the wakers waiting for them.
#[derive(Default)]
struct Timer {
    queue: std::sync::Mutex<Vec<(std::time::Instant, std::task::Waker)>>,
    changed: std::sync::Condvar,
}

impl Timer {
    fn run(&self) {
        let mut queue = self
            .queue
            .lock()
            .expect("the timer's queue is never poisoned");
        loop {
            let now = std::time::Instant::now();
            queue.retain(|(deadline, waker)| {
                if *deadline <= now {
                    waker.wake_by_ref();
                    false
                } else {
                    true
                }
            });
            queue = match queue.iter().map(|(d, _)| *d).min() {
                Some(next) => {
                    self.changed
                        .wait_timeout(queue, next.saturating_duration_since(now))
                        .expect("the timer's queue is never poisoned")
                        .0
                }
                None => self
                    .changed
                    .wait(queue)
                    .expect("the timer's queue is never poisoned"),
            };
        }
    }
}

struct Sleep {
    deadline: std::time::Instant,
    timer: Arc<Timer>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if std::time::Instant::now() >= self.deadline {
            return std::task::Poll::Ready(());
        }
        let mut queue = self
            .timer
            .queue
            .lock()
            .expect("the timer's queue is never poisoned");
        queue.push((self.deadline, cx.waker().clone()));
        self.timer.changed.notify_one();
        std::task::Poll::Pending
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

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

/// The async-std executor. async-std is discontinued upstream: a new service takes
/// `Smol` (feature `smol`), which runs the same way.
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

/// The smol executor: tasks run on smol's global executor and sleeps are smol timers; run a
/// service with `smol::block_on(service.run_until(..))` and `.executor(Arc::new(Smol))`
/// ([smol](https://github.com/ruststream/ruststream/blob/main/docs/src/executors.md#smol)).
#[cfg(feature = "smol")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Smol;

#[cfg(feature = "smol")]
impl Executor for Smol {
    fn spawn(&self, future: BoxFuture<()>) {
        smol::spawn(future).detach();
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<()> {
        let timer = smol::Timer::after(duration);
        Box::pin(async move {
            timer.await;
        })
    }
}

/// Plain threads and no async runtime: futures run on a small pool of threads
/// (`futures::executor::ThreadPool`), and one timer thread wakes the sleeps. With
/// [`crate::run_blocking`], a service runs without tokio, smol or async-std.
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

/// The executor of the calling context: tokio inside a tokio runtime, else smol (feature
/// `smol`), else async-std (feature `async-std`). Panics when none of them is running
/// ([Executors](https://github.com/ruststream/ruststream/blob/main/docs/src/executors.md)).
pub fn current() -> Arc<dyn Executor> {
    #[cfg(feature = "tokio")]
    if tokio::runtime::Handle::try_current().is_ok() {
        return Arc::new(Tokio);
    }
    #[cfg(feature = "smol")]
    {
        return Arc::new(Smol);
    }
    #[cfg(feature = "async-std")]
    #[allow(unreachable_code)]
    {
        return Arc::new(AsyncStd);
    }
    #[allow(unreachable_code)]
    {
        panic!(
            "ruststream: no executor: call from within a tokio runtime (feature `tokio`), enable the `smol` or `async-std` feature, or pass one with `RustStream::executor`"
        )
    }
}

#[cfg(all(test, feature = "smol"))]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A task spawned on [`Smol`] runs to completion off the calling thread, and its sleep
    /// waits at least as long as it was asked, with no smol runtime entered by the caller.
    #[test]
    fn smol_spawns_and_sleeps() {
        let (tx, rx) = futures::channel::oneshot::channel();
        let exec = Smol;
        let sleep = exec.sleep(Duration::from_millis(20));
        let start = Instant::now();
        exec.spawn(Box::pin(async move {
            sleep.await;
            let _ = tx.send(std::thread::current().id());
        }));
        let ran_on = futures::executor::block_on(rx).expect("the task ran");
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert_ne!(ran_on, std::thread::current().id());
    }

    /// Without a tokio runtime, the calling context's executor is smol's.
    #[test]
    fn current_is_smol_outside_tokio() {
        let exec = current();
        let (tx, rx) = futures::channel::oneshot::channel();
        exec.spawn(Box::pin(async move {
            let _ = tx.send(());
        }));
        smol::block_on(async {
            exec.sleep(Duration::from_millis(1)).await;
            rx.await.expect("the task ran");
        });
    }
}

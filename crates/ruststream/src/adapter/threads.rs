//! Connections of a blocking driver, each on a thread of its own: the pool an adapter on a
//! blocking driver (rusqlite) lends the core's connections from, through [`Connections`]
//! like any async pool, so their order and their close live in one place.
//!
//! - A connection's thread opens it, then runs its jobs one after another until it is told
//!   to close or every handle to it is gone. Between jobs it looks for the next one for a few
//!   tens of microseconds, yielding, before it sleeps: a flow's next statement usually comes
//!   that soon, and waking a sleeping thread costs as long.
//! - A statement's caller waits on a oneshot answer ([`Answer`]), looking for it for the pool's
//!   `look_for_answer` before it waits to be woken: nothing blocks an executor.
//! - The pool opens a connection when an acquire needs one and fewer than its maximum are open;
//!   an acquire past the maximum waits, up to its timeout, for one to come back or to close.
//!
//! [`Connections`]: super::Connections

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak, mpsc};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use futures::future::{self, Either};
use ruststream_core::{DbError, ErrorKind, Reply, Statement, Value};

use super::{ConnFuture, ConnectionPool, Ending};
use crate::exec::BoxFuture;

/// A blocking driver: how it opens a connection and runs a statement or a table's own lock on
/// one. Every call on a connection runs on that connection's own thread.
pub trait BlockingDriver: Send + Sync + 'static {
    /// The adapter's name of the claim a handler takes ([`Claim`](super::Claim) of this
    /// pool), for errors: `RusqliteClaim`.
    const CLAIM: &'static str;
    /// The driver's connection; it never leaves its thread.
    type Connection: 'static;
    /// The driver's row ([`Adapter::Row`](super::Adapter::Row)).
    type Row: Send + 'static;
    /// A table's custom lock and unlock ([`Adapter::Lock`](super::Adapter::Lock)).
    type Lock: Clone + Send + Sync + 'static;
    /// What stops a statement running on a connection, from another thread.
    type Interrupt: Send + Sync + 'static;

    /// Opens a connection, and what interrupts it. `first`: the pool's first connection,
    /// where settings of the database itself (a journal mode) are made.
    fn open(&self, first: bool) -> Result<(Self::Connection, Self::Interrupt), DbError>;

    /// Stops the statement running on the interrupt's connection, if one runs.
    fn interrupt(&self, interrupt: &Self::Interrupt);

    /// Runs a statement of the core with its binds and reads the reply as its
    /// [`output`](Statement::output) says.
    fn execute(
        &self,
        conn: &mut Self::Connection,
        statement: &Statement,
        binds: &[Value],
    ) -> Reply<Self::Row>;

    /// Runs the table's own lock (`take`) or unlock of `key`: whether it took the key, or
    /// whether the session held it.
    fn lock(
        &self,
        conn: &mut Self::Connection,
        lock: &Self::Lock,
        key: &str,
        take: bool,
    ) -> Result<bool, DbError>;

    /// Ends a transaction a connection going back to the pool left open.
    fn reset(&self, conn: &mut Self::Connection);

    /// Closes a connection.
    fn close(&self, conn: Self::Connection);
}

/// How a [`Threads`] pool lends connections.
#[derive(Clone, Debug)]
pub struct ThreadSettings {
    /// The most connections open at once.
    pub max_connections: usize,
    /// How long an acquire waits for a connection when the most are open.
    pub acquire_timeout: Duration,
    /// How long a caller looks for a statement's answer before it waits to be woken
    /// ([`Answer`]).
    pub look_for_answer: Duration,
    /// The name of each connection's thread.
    pub thread_name: String,
}

/// What a connection's thread runs.
enum Job<D: BlockingDriver> {
    Execute {
        statement: Statement,
        binds: Vec<Value>,
        reply: oneshot::Sender<Reply<D::Row>>,
    },
    Lock {
        lock: D::Lock,
        key: String,
        take: bool,
        reply: oneshot::Sender<Result<bool, DbError>>,
    },
    /// The connection goes back to the pool: end a transaction left open.
    Reset { reply: oneshot::Sender<()> },
    /// A handler's own work on the connection, lent to it ([`ThreadConn::call`]).
    Call(Work<D>),
    /// Close the connection; the thread ends.
    Close { reply: Option<oneshot::Sender<()>> },
}

/// A handler's work on a blocking driver's connection, run on its thread.
type Work<D> = Box<dyn FnOnce(&mut <D as BlockingDriver>::Connection) + Send>;

/// A connection of a [`Threads`] pool, as the core holds it: a handle to its thread.
pub struct ThreadConn<D: BlockingDriver> {
    jobs: mpsc::Sender<Job<D>>,
    interrupt: Arc<D::Interrupt>,
}

impl<D: BlockingDriver> ThreadConn<D> {
    /// Runs `work` on the driver's connection, on its thread, after what was sent to it
    /// before, and answers what `work` answers; `None` where the connection's thread ended, or
    /// `work` panicked.
    pub fn call<T, F>(&self, work: F) -> impl Future<Output = Option<T>> + Send + 'static
    where
        F: FnOnce(&mut D::Connection) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let sent = self.jobs.send(Job::Call(Box::new(move |conn| {
            let _ = reply.send(work(conn));
        })));
        async move {
            if sent.is_err() {
                return None;
            }
            answer.await.ok()
        }
    }
}

impl<D: BlockingDriver> std::fmt::Debug for ThreadConn<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadConn").finish_non_exhaustive()
    }
}

type Opened<D> = oneshot::Sender<Result<ThreadConn<D>, DbError>>;

/// Who lends what: the idle connections, the acquires waiting, and how many connections are
/// open or opening.
struct Lending<D: BlockingDriver> {
    idle: Vec<ThreadConn<D>>,
    waiters: VecDeque<Opened<D>>,
    /// Connections open or opening, at most `max_connections`.
    slots: usize,
    closed: bool,
}

struct Shared<D: BlockingDriver> {
    driver: Arc<D>,
    settings: ThreadSettings,
    lending: Mutex<Lending<D>>,
    /// Connections open now.
    open: Arc<AtomicUsize>,
    /// Connections ever opened: the first one is told so.
    opened: AtomicUsize,
}

/// A pool of a blocking driver's connections, each on a thread of its own: the
/// [`ConnectionPool`] of an adapter on a blocking driver. Cheap to clone.
pub struct Threads<D: BlockingDriver> {
    shared: Arc<Shared<D>>,
}

impl<D: BlockingDriver> Clone for Threads<D> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<D: BlockingDriver> std::fmt::Debug for Threads<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Threads")
            .field("settings", &self.shared.settings)
            .field("open_connections", &self.open_connections())
            .finish()
    }
}

fn pool_closed() -> DbError {
    DbError::new(
        ErrorKind::PoolClosed,
        "the pool is closed: it lends no connection",
    )
}

fn thread_ended() -> DbError {
    DbError::new(
        ErrorKind::ConnectionLost,
        "the connection's thread ended before it answered",
    )
}

impl<D: BlockingDriver> Threads<D> {
    /// A pool of `driver`'s connections; none opens until an acquire needs one.
    pub fn new(driver: D, settings: ThreadSettings) -> Self {
        let settings = ThreadSettings {
            max_connections: settings.max_connections.max(1),
            ..settings
        };
        Self {
            shared: Arc::new(Shared {
                driver: Arc::new(driver),
                settings,
                lending: Mutex::new(Lending {
                    idle: Vec::new(),
                    waiters: VecDeque::new(),
                    slots: 0,
                    closed: false,
                }),
                open: Arc::new(AtomicUsize::new(0)),
                opened: AtomicUsize::new(0),
            }),
        }
    }

    /// The driver.
    pub fn driver(&self) -> &D {
        &self.shared.driver
    }

    /// How many connections are open now.
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Closes the pool: acquires fail from now on, the idle connections close (the future
    /// completes once they have), and each connection still lent closes when it comes back.
    pub fn close_all(&self) -> BoxFuture<()> {
        let (idle, waiters) = {
            let mut lending = self.shared.lending();
            lending.closed = true;
            (
                std::mem::take(&mut lending.idle),
                std::mem::take(&mut lending.waiters),
            )
        };
        // Dropped, the waiters' acquires fail as the pool closed.
        drop(waiters);
        let closes: Vec<_> = idle.into_iter().map(close_thread).collect();
        Box::pin(async move {
            future::join_all(closes).await;
        })
    }
}

impl<D: BlockingDriver> Shared<D> {
    fn lending(&self) -> MutexGuard<'_, Lending<D>> {
        // The lock guards plain collections that no code panics while holding.
        self.lending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a connection on a thread of its own for `opened`; its slot is counted already.
    fn spawn(self: &Arc<Self>, opened: Opened<D>) {
        let (jobs, queue) = mpsc::channel();
        let first = self.opened.fetch_add(1, Ordering::SeqCst) == 0;
        let thread = Thread {
            driver: self.driver.clone(),
            open: self.open.clone(),
            pool: Arc::downgrade(self),
        };
        let spawned = std::thread::Builder::new()
            .name(self.settings.thread_name.clone())
            .spawn(move || thread.run(first, jobs, queue, opened));
        if let Err(error) = spawned {
            // The thread's closure, with `opened`, is gone: that acquire fails as canceled.
            tracing::warn!("cannot start a connection's thread: {error}");
            self.slot_freed();
        }
    }

    /// A connection came back, or opened for an acquire that no longer waits: to the first
    /// acquire still waiting, or idle; closed when the pool is.
    fn give_back(&self, mut conn: ThreadConn<D>) -> Option<ThreadConn<D>> {
        let mut lending = self.lending();
        if lending.closed {
            return Some(conn);
        }
        while let Some(waiter) = lending.waiters.pop_front() {
            match waiter.send(Ok(conn)) {
                Ok(()) => return None,
                Err(Ok(back)) => conn = back,
                Err(Err(_)) => unreachable!("a connection was sent"),
            }
        }
        lending.idle.push(conn);
        None
    }

    /// A connection closed (or never opened): its slot opens a connection for the first
    /// acquire still waiting.
    fn slot_freed(self: &Arc<Self>) {
        let waiter = {
            let mut lending = self.lending();
            lending.slots -= 1;
            lending.waiters.retain(|w| !w.is_canceled());
            if lending.closed {
                None
            } else {
                let waiter = lending.waiters.pop_front();
                if waiter.is_some() {
                    lending.slots += 1;
                }
                waiter
            }
        };
        if let Some(waiter) = waiter {
            self.spawn(waiter);
        }
    }
}

/// Closes a connection and waits until its thread has closed it.
fn close_thread<D: BlockingDriver>(conn: ThreadConn<D>) -> impl Future<Output = ()> {
    let (reply, closed) = oneshot::channel();
    let sent = conn.jobs.send(Job::Close { reply: Some(reply) }).is_ok();
    async move {
        if sent {
            let _ = closed.await;
        }
    }
}

/// What a connection's thread does after a job.
enum Next {
    /// Waits for the next job.
    Job,
    /// Closes the connection and ends, then tells whom the close names.
    Close(Option<oneshot::Sender<()>>),
}

/// A connection's thread.
struct Thread<D: BlockingDriver> {
    driver: Arc<D>,
    open: Arc<AtomicUsize>,
    pool: Weak<Shared<D>>,
}

impl<D: BlockingDriver> Thread<D> {
    fn run(
        self,
        first: bool,
        jobs: mpsc::Sender<Job<D>>,
        queue: mpsc::Receiver<Job<D>>,
        opened: Opened<D>,
    ) {
        let (mut conn, interrupt) = match self.driver.open(first) {
            Ok(open) => open,
            Err(error) => {
                // The slot is free before the failure is known.
                self.freed();
                let _ = opened.send(Err(error));
                return;
            }
        };
        self.open.fetch_add(1, Ordering::SeqCst);
        let handle = ThreadConn {
            jobs,
            interrupt: Arc::new(interrupt),
        };
        if let Err(Ok(handle)) = opened.send(Ok(handle)) {
            // The acquire stopped waiting: the connection goes to another, or idle.
            match self.pool.upgrade() {
                Some(pool) => {
                    if let Some(handle) = pool.give_back(handle) {
                        drop(handle);
                    }
                }
                None => drop(handle),
            }
        }
        let mut close_reply = None;
        while let Ok(job) = next_job(&queue) {
            let ran = catch_unwind(AssertUnwindSafe(|| self.job(&mut conn, job)));
            match ran {
                Ok(Next::Job) => {}
                Ok(Next::Close(reply)) => {
                    close_reply = reply;
                    break;
                }
                Err(_) => {
                    tracing::warn!("a statement panicked on a connection's thread; it is closed");
                    break;
                }
            }
        }
        let closed = catch_unwind(AssertUnwindSafe(|| self.driver.close(conn)));
        if closed.is_err() {
            tracing::warn!("closing a connection panicked");
        }
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.freed();
        if let Some(reply) = close_reply {
            let _ = reply.send(());
        }
    }

    /// Runs a job, or answers the close it is.
    fn job(&self, conn: &mut D::Connection, job: Job<D>) -> Next {
        match job {
            Job::Execute {
                statement,
                binds,
                reply,
            } => {
                let _ = reply.send(self.driver.execute(conn, &statement, &binds));
            }
            Job::Lock {
                lock,
                key,
                take,
                reply,
            } => {
                let answer = catch_unwind(AssertUnwindSafe(|| {
                    self.driver.lock(conn, &lock, &key, take)
                }))
                .unwrap_or_else(|_| Err(DbError::new(ErrorKind::Other, "it panicked")));
                let _ = reply.send(answer);
            }
            Job::Reset { reply } => {
                self.driver.reset(conn);
                let _ = reply.send(());
            }
            Job::Call(work) => {
                // A panic in the handler's work reaches it as a closed answer.
                let _ = catch_unwind(AssertUnwindSafe(|| work(conn)));
            }
            Job::Close { reply } => return Next::Close(reply),
        }
        Next::Job
    }

    fn freed(&self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.slot_freed();
        }
    }
}

/// How long a connection's thread looks for its next job before it sleeps until one comes:
/// a flow's next statement usually follows within tens of microseconds, and waking a thread
/// that went to sleep meanwhile costs about as long.
const LOOK_BEFORE_SLEEP: Duration = Duration::from_micros(60);

/// The next job of a connection's thread: one already queued, or one that comes within
/// [`LOOK_BEFORE_SLEEP`] (the thread yields between looks), or else the next one, asleep.
fn next_job<J>(queue: &mpsc::Receiver<J>) -> Result<J, mpsc::RecvError> {
    let since = Instant::now();
    loop {
        match queue.try_recv() {
            Ok(job) => return Ok(job),
            Err(mpsc::TryRecvError::Disconnected) => return Err(mpsc::RecvError),
            Err(mpsc::TryRecvError::Empty) if since.elapsed() < LOOK_BEFORE_SLEEP => {
                std::thread::yield_now();
            }
            Err(mpsc::TryRecvError::Empty) => return queue.recv(),
        }
    }
}

/// A handler's claim ([`Claim`](super::Claim)) of a blocking driver's connection: the handle to
/// its thread, on which [`ThreadConn::call`] runs the handler's work inside the lent
/// transaction.
impl<D: BlockingDriver> super::LendsClaims for Threads<D> {
    type Target = ThreadConn<D>;
    const EXTRACTOR: &'static str = D::CLAIM;

    fn target(conn: &ThreadConn<D>) -> &ThreadConn<D> {
        conn
    }

    fn target_mut(conn: &mut ThreadConn<D>) -> &mut ThreadConn<D> {
        conn
    }
}

impl<D: BlockingDriver> ConnectionPool for Threads<D> {
    type Connection = ThreadConn<D>;
    type Row = D::Row;
    type Lock = D::Lock;

    /// An idle connection, or a new one where fewer than the most are open, or the first to
    /// come back within the acquire timeout.
    fn acquire(&self) -> BoxFuture<Result<ThreadConn<D>, DbError>> {
        let shared = self.shared.clone();
        let waiting = {
            let mut lending = shared.lending();
            if lending.closed {
                return Box::pin(future::ready(Err(pool_closed())));
            }
            if let Some(conn) = lending.idle.pop() {
                return Box::pin(future::ready(Ok(conn)));
            }
            let (opened, waiting) = oneshot::channel();
            if lending.slots < shared.settings.max_connections {
                lending.slots += 1;
                drop(lending);
                shared.spawn(opened);
            } else {
                lending.waiters.push_back(opened);
            }
            waiting
        };
        let timeout = shared.settings.acquire_timeout;
        Box::pin(async move {
            match future::select(waiting, futures_timer::Delay::new(timeout)).await {
                Either::Left((Ok(answer), _)) => answer,
                // The pool closed, or the connection's thread did not start.
                Either::Left((Err(oneshot::Canceled), _)) => Err(pool_closed()),
                Either::Right(_) => Err(DbError::new(
                    ErrorKind::PoolClosed,
                    format!(
                        "no connection of the pool came within {timeout:?} ({} open at most)",
                        shared.settings.max_connections
                    ),
                )),
            }
        })
    }

    fn execute<'c>(
        &'c self,
        conn: &'c mut ThreadConn<D>,
        statement: Statement,
        binds: Vec<Value>,
        _in_transaction: bool,
    ) -> ConnFuture<'c, Reply<D::Row>> {
        let (reply, answer) = oneshot::channel();
        let sent = conn.jobs.send(Job::Execute {
            statement,
            binds,
            reply,
        });
        if sent.is_err() {
            return Box::pin(future::ready(Reply::Failed(thread_ended())));
        }
        let answer = Answer::new(answer, self.shared.settings.look_for_answer);
        Box::pin(async move {
            answer
                .await
                .unwrap_or_else(|_| Reply::Failed(thread_ended()))
        })
    }

    fn lock<'c>(
        &'c self,
        conn: &'c mut ThreadConn<D>,
        lock: &'c D::Lock,
        key: &'c str,
        take: bool,
    ) -> ConnFuture<'c, Result<bool, DbError>> {
        let (reply, answer) = oneshot::channel();
        let sent = conn.jobs.send(Job::Lock {
            lock: lock.clone(),
            key: key.to_owned(),
            take,
            reply,
        });
        if sent.is_err() {
            return Box::pin(future::ready(Err(thread_ended())));
        }
        let answer = Answer::new(answer, self.shared.settings.look_for_answer);
        Box::pin(async move { answer.await.unwrap_or_else(|_| Err(thread_ended())) })
    }

    /// Ends a transaction left open, then gives the connection to the first acquire waiting,
    /// or idle; into a closed pool, it closes.
    fn release(&self, conn: ThreadConn<D>) -> BoxFuture<()> {
        let shared = self.shared.clone();
        let (reply, reset) = oneshot::channel();
        let sent = conn.jobs.send(Job::Reset { reply }).is_ok();
        Box::pin(async move {
            if !sent || reset.await.is_err() {
                // The thread is gone, and its slot with it.
                return;
            }
            if let Some(conn) = shared.give_back(conn) {
                close_thread(conn).await;
            }
        })
    }

    /// A command cut short is interrupted first; then the thread closes the connection.
    fn close(&self, conn: ThreadConn<D>, ending: Ending) -> BoxFuture<()> {
        if ending == Ending::CutShort {
            self.shared.driver.interrupt(&conn.interrupt);
        }
        Box::pin(close_thread(conn))
    }

    fn discard(&self, conn: ThreadConn<D>, ending: Ending) {
        if ending == Ending::CutShort {
            self.shared.driver.interrupt(&conn.interrupt);
        }
        let _ = conn.jobs.send(Job::Close { reply: None });
    }
}

/// The answer to a job of a connection's thread, looked for during `look` before its task
/// waits to be woken: until then a poll that finds nothing wakes the task again at once, so
/// the executor's thread does not sleep and need waking by the connection's thread.
pub struct Answer<T> {
    receiver: oneshot::Receiver<T>,
    look: Duration,
    look_until: Option<Instant>,
}

impl<T> Answer<T> {
    /// The answer `receiver` brings, looked for during `look`.
    pub fn new(receiver: oneshot::Receiver<T>, look: Duration) -> Self {
        Self {
            receiver,
            look,
            look_until: None,
        }
    }
}

impl<T> Future for Answer<T> {
    type Output = Result<T, oneshot::Canceled>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let answer = std::pin::Pin::new(&mut self.receiver).poll(cx);
        if answer.is_pending() && !self.look.is_zero() {
            let now = Instant::now();
            let look = self.look;
            let until = *self.look_until.get_or_insert(now + look);
            if now < until {
                cx.waker().wake_by_ref();
            } else {
                self.look = Duration::ZERO;
            }
        }
        answer
    }
}

#[cfg(test)]
mod tests;

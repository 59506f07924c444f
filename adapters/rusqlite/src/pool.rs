//! The pool: a manager thread that binds connections to the core's `ConnId`s, and one worker
//! thread per connection that owns it and runs its commands in order. Nothing here blocks an
//! executor: callers hand a command to a worker or the manager over a channel and wait on a
//! futures oneshot ([`Answer`]), looking for the answer for the broker's `look_for_answer`
//! (300 µs by default) before they wait to be woken.
//!
//! - The manager owns the pool's state: which connection each `ConnId` is bound to, the idle
//!   connections, the acquires waiting for one (with their deadline), and whether the pool is
//!   closed. It forwards each command to the worker of its connection, in the order the
//!   commands came, so the commands of one `ConnId` run in order.
//! - A worker opens its connection, then runs jobs from its queue until it is told to close
//!   the connection; then it reports itself gone and its thread ends. Between jobs it looks
//!   for the next one for a few tens of microseconds, yielding, before it sleeps: a flow's
//!   next statement usually comes that soon, and waking a sleeping thread costs as long.
//! - A statement (or a custom lock or unlock) of a bound `ConnId` whose commands have all
//!   answered goes to its worker directly, without the manager's hop: nothing of that `ConnId`
//!   is queued anywhere then, so it cannot overtake a command before it. Acquires, releases and
//!   closes, and commands given while another of the `ConnId` is in flight, go through the
//!   manager.
//!
//! Connections open when an acquire needs one and the pool holds fewer than its maximum; a
//! connection closed by the core leaves room for a fresh one, opened by the next acquire that
//! needs it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use ruststream_core::{Action, Command, ConnId, DbError, ErrorKind, Reply};

use crate::lock::CustomLock;
use crate::row::RusqliteRow;

mod manager;
mod worker;

use manager::{Manager, fail_job};

/// How the pool opens and lends connections.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) path: PathBuf,
    pub(crate) max_connections: usize,
    pub(crate) busy_timeout: Duration,
    pub(crate) acquire_timeout: Duration,
    pub(crate) statement_cache: usize,
    /// How long the task that sent a statement looks for its answer before it waits.
    pub(crate) look_for_answer: Duration,
    /// `PRAGMA synchronous` of each connection, where the service sets it.
    pub(crate) synchronous: Option<Synchronous>,
}

/// How a commit waits for the disk: SQLite's `PRAGMA synchronous`, set on each connection the
/// pool opens ([`RusqliteBroker::synchronous`](crate::RusqliteBroker::synchronous)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Synchronous {
    /// `OFF`: no wait for the disk at all. A crash of the operating system or a power loss
    /// may corrupt the database.
    Off,
    /// `NORMAL`: in WAL mode, a commit writes the log without waiting for the disk; the log is
    /// synced at checkpoints. A crash of the process loses nothing; a power loss or a crash of
    /// the operating system may undo the last commits: a settled row comes back (and runs
    /// again), and a published row may be gone.
    Normal,
    /// `FULL`, SQLite's default: each commit waits for the disk.
    Full,
    /// `EXTRA`: as `FULL`, and the directory is synced too.
    Extra,
}

impl Synchronous {
    /// The pragma that sets it.
    pub(crate) fn pragma(self) -> &'static str {
        match self {
            Synchronous::Off => "PRAGMA synchronous = OFF",
            Synchronous::Normal => "PRAGMA synchronous = NORMAL",
            Synchronous::Full => "PRAGMA synchronous = FULL",
            Synchronous::Extra => "PRAGMA synchronous = EXTRA",
        }
    }
}

pub(crate) type ReplyTx = oneshot::Sender<Reply<RusqliteRow>>;
type StartTx = oneshot::Sender<Result<(), String>>;

/// What the manager receives.
enum Msg {
    /// A command of the core.
    Command {
        command: Command,
        lock: Option<CustomLock>,
        reply: ReplyTx,
    },
    /// Opens the first connection: the answer tells whether the database opens.
    Start { reply: StartTx },
    /// A worker opened its connection.
    Opened {
        slot: u64,
        interrupt: rusqlite::InterruptHandle,
    },
    /// A worker closed its connection (or never opened it), and its thread ends.
    Gone { slot: u64 },
    /// Close the pool: idle connections close now, bound ones when they are released.
    Close { done: oneshot::Sender<()> },
    /// The broker was dropped: close everything and stop.
    Dropped,
}

/// What a worker receives.
enum Job {
    /// Run a statement, or the custom lock or unlock.
    Run {
        action: Action,
        lock: Option<CustomLock>,
        reply: ReplyTx,
    },
    /// The connection goes back to the pool: end a transaction left open. `exit` when the pool
    /// is closed: the connection closes then.
    Release { reply: ReplyTx, exit: bool },
    /// Close the connection and end.
    Close { reply: ReplyTx },
    /// The pool is closing: close the idle connection and end.
    Exit,
}

/// Why a worker opens its connection.
enum Opening {
    /// For an acquire, bound to it already.
    Acquire(ReplyTx),
    /// For the broker's start.
    Start(StartTx),
}

enum Phase {
    /// Not started.
    Idle,
    /// Started: commands go to the manager.
    Running(mpsc::Sender<Msg>),
    /// Closed: the manager still runs the commands of connections lent before the close, and
    /// refuses acquires. It ends when the broker is dropped.
    Closed(mpsc::Sender<Msg>),
}

/// The workers of the bound `ConnId`s, which the manager fills at each bind.
type Routes = Arc<Mutex<HashMap<ConnId, mpsc::Sender<Job>>>>;

/// The commands of each `ConnId` given and not yet answered.
type Flight = Arc<Mutex<HashMap<ConnId, usize>>>;

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The locks guard plain maps that no code panics while holding.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The pool as the broker holds it.
pub(crate) struct Pool {
    phase: Mutex<Phase>,
    open: Arc<AtomicUsize>,
    routes: Routes,
    flight: Flight,
}

impl Pool {
    pub(crate) fn new() -> Self {
        Self {
            phase: Mutex::new(Phase::Idle),
            open: Arc::new(AtomicUsize::new(0)),
            routes: Arc::new(Mutex::new(HashMap::new())),
            flight: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        // The lock guards a plain enum that no code panics while holding.
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connections open now.
    pub(crate) fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Whether the pool was closed.
    pub(crate) fn is_closed(&self) -> bool {
        matches!(*self.phase(), Phase::Closed(_))
    }

    /// Starts the manager and opens the first connection; the receiver answers whether it
    /// opened. `None` when the pool runs already.
    pub(crate) fn start(
        &self,
        config: Config,
    ) -> Result<Option<oneshot::Receiver<Result<(), String>>>, String> {
        let mut phase = self.phase();
        match *phase {
            Phase::Running(_) => return Ok(None),
            Phase::Closed(_) => {
                return Err(format!(
                    "the SQLite pool of `{}` is closed; open a new broker",
                    config.path.display()
                ));
            }
            Phase::Idle => {}
        }
        let (tx, rx) = mpsc::channel();
        let manager = Manager::new(
            Arc::new(config),
            (tx.clone(), rx),
            self.routes.clone(),
            self.open.clone(),
        );
        thread::Builder::new()
            .name("ruststream-sqlite-pool".into())
            .spawn(move || manager.run())
            .map_err(|e| format!("cannot start the SQLite pool's thread: {e}"))?;
        let (reply, answer) = oneshot::channel();
        // The manager was just spawned with the receiver: the send cannot fail.
        let _ = tx.send(Msg::Start { reply });
        *phase = Phase::Running(tx);
        Ok(Some(answer))
    }

    /// A start that failed: the manager stops, and a later start begins afresh.
    pub(crate) fn abandon_start(&self) {
        let mut phase = self.phase();
        if let Phase::Running(tx) = &*phase {
            let _ = tx.send(Msg::Dropped);
            *phase = Phase::Idle;
        }
    }

    /// Hands a command to its connection's worker, or to the manager. Answers at once when
    /// the pool does not run.
    pub(crate) fn execute(&self, command: Command, lock: Option<CustomLock>) -> CommandReply {
        let (reply, answer) = oneshot::channel();
        let conn = command.conn;
        let phase = self.phase();
        let manager = match &*phase {
            Phase::Running(tx) | Phase::Closed(tx) => tx,
            Phase::Idle => return CommandReply::Ready(pool_closed()),
        };
        let mut flight = locked(&self.flight);
        let idle = !flight.contains_key(&conn);
        let worker = match &command.action {
            Action::Execute { .. } | Action::Lock { .. } | Action::Unlock { .. } if idle => {
                locked(&self.routes).get(&conn).cloned()
            }
            Action::Release | Action::Close => {
                locked(&self.routes).remove(&conn);
                None
            }
            _ => None,
        };
        let sent = match (worker, command.action) {
            (Some(worker), action) => match worker.send(Job::Run {
                action,
                lock,
                reply,
            }) {
                Ok(()) => true,
                Err(mpsc::SendError(job)) => {
                    fail_job(job);
                    true
                }
            },
            (None, action) => manager
                .send(Msg::Command {
                    command: Command { action, ..command },
                    lock,
                    reply,
                })
                .is_ok(),
        };
        if !sent {
            return CommandReply::Ready(pool_closed());
        }
        *flight.entry(conn).or_insert(0) += 1;
        CommandReply::Pending(
            answer,
            Answered {
                conn,
                flight: self.flight.clone(),
            },
        )
    }

    /// Closes the pool; the receiver completes once its idle connections are closed.
    pub(crate) fn close(&self) -> Option<oneshot::Receiver<()>> {
        let mut phase = self.phase();
        match std::mem::replace(&mut *phase, Phase::Idle) {
            Phase::Running(tx) => {
                let (done, closed) = oneshot::channel();
                let sent = tx.send(Msg::Close { done }).is_ok();
                *phase = Phase::Closed(tx);
                sent.then_some(closed)
            }
            // Never started: nothing to close, and nothing starts after.
            Phase::Idle => {
                let (tx, _) = mpsc::channel();
                *phase = Phase::Closed(tx);
                None
            }
            Phase::Closed(tx) => {
                *phase = Phase::Closed(tx);
                None
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Phase::Running(tx) | Phase::Closed(tx) = &*self.phase() {
            let _ = tx.send(Msg::Dropped);
        }
    }
}

/// The answer to a command: now, or from the thread that runs it.
pub(crate) enum CommandReply {
    /// Answered without running.
    Ready(Reply<RusqliteRow>),
    /// Answered by the manager or a worker; [`Answered::done`] once the answer is in.
    Pending(oneshot::Receiver<Reply<RusqliteRow>>, Answered),
}

/// A command in flight, counted until its answer is in.
pub(crate) struct Answered {
    conn: ConnId,
    flight: Flight,
}

impl Answered {
    /// The command answered: nothing of it is queued anywhere now.
    pub(crate) fn done(self) {
        let mut flight = locked(&self.flight);
        if let Some(n) = flight.get_mut(&self.conn) {
            *n -= 1;
            if *n == 0 {
                flight.remove(&self.conn);
            }
        }
    }
}

fn pool_closed() -> Reply<RusqliteRow> {
    Reply::Failed(DbError::new(
        ErrorKind::PoolClosed,
        "the SQLite pool is closed (or not started): it lends no connection",
    ))
}

/// How long the task that sent a statement looks for its answer before it waits to be woken,
/// unless the broker is told otherwise: most statements answer within it.
pub(crate) const LOOK_FOR_ANSWER: Duration = Duration::from_micros(300);

/// The answer to a command. Until `look` has passed since the first poll, a poll that finds no
/// answer wakes its task again at once: the task comes back to look once the executor's other
/// ready tasks have run, and the executor's thread does not go to sleep to be woken by the
/// connection's thread, which costs tens of microseconds. After that it waits to be woken.
pub(crate) struct Answer<T> {
    receiver: oneshot::Receiver<T>,
    look_until: Option<Instant>,
}

impl<T> Answer<T> {
    pub(crate) fn new(receiver: oneshot::Receiver<T>, look: Duration) -> Self {
        let look_until = (!look.is_zero()).then(|| Instant::now() + look);
        Self {
            receiver,
            look_until,
        }
    }
}

impl<T> std::future::Future for Answer<T> {
    type Output = Result<T, oneshot::Canceled>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let answer = std::pin::Pin::new(&mut self.receiver).poll(cx);
        if answer.is_pending() {
            match self.look_until {
                Some(until) if Instant::now() < until => cx.waker().wake_by_ref(),
                _ => self.look_until = None,
            }
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::sync::atomic::AtomicBool;
    use std::task::{Context, Poll, Wake, Waker};

    #[derive(Default)]
    struct Woken(AtomicBool);

    impl Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    impl Woken {
        fn take(&self) -> bool {
            self.0.swap(false, Ordering::SeqCst)
        }
    }

    /// An answer awaited by a task whose wake-ups are recorded, and the sender that answers it.
    struct Probe {
        woken: Arc<Woken>,
        waker: Waker,
        tx: Option<oneshot::Sender<u32>>,
        answer: Answer<u32>,
    }

    impl Probe {
        fn new(look: Duration) -> Self {
            let woken = Arc::new(Woken::default());
            let (tx, rx) = oneshot::channel();
            Self {
                waker: Waker::from(woken.clone()),
                woken,
                tx: Some(tx),
                answer: Answer::new(rx, look),
            }
        }

        fn poll(&mut self) -> Poll<Result<u32, oneshot::Canceled>> {
            std::pin::Pin::new(&mut self.answer).poll(&mut Context::from_waker(&self.waker))
        }

        fn woken(&self) -> bool {
            self.woken.take()
        }

        fn answer(&mut self, n: u32) {
            let tx = self.tx.take().expect("answered once");
            tx.send(n).expect("the answer is awaited");
        }
    }

    #[test]
    fn while_it_looks_a_poll_without_the_answer_wakes_its_task_again() {
        let mut probe = Probe::new(Duration::from_secs(60));
        assert!(probe.poll().is_pending());
        assert!(probe.woken(), "the task is woken at once, to look again");
        assert!(probe.poll().is_pending());
        assert!(probe.woken());
        probe.answer(7);
        assert_eq!(probe.poll(), Poll::Ready(Ok(7)));
    }

    #[test]
    fn after_the_look_the_task_waits_for_the_connections_thread_to_wake_it() {
        let mut probe = Probe::new(Duration::from_micros(200));
        thread::sleep(Duration::from_micros(300));
        assert!(probe.poll().is_pending());
        assert!(
            !probe.woken(),
            "past the look, a poll does not wake its task"
        );
        assert!(probe.poll().is_pending());
        assert!(!probe.woken());
        probe.answer(3);
        assert!(probe.woken(), "the answer wakes the task");
        assert_eq!(probe.poll(), Poll::Ready(Ok(3)));
    }

    #[test]
    fn a_zero_look_never_wakes_its_own_task() {
        let mut probe = Probe::new(Duration::ZERO);
        assert!(probe.poll().is_pending());
        assert!(!probe.woken());
        drop(probe.tx.take());
        assert!(
            probe.woken(),
            "a thread that ends without answering wakes the task"
        );
        assert_eq!(probe.poll(), Poll::Ready(Err(oneshot::Canceled)));
    }
}

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

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use rusqlite::Connection;
use rusqlite::types::Value as SqlValue;
use ruststream_core::{
    Action, Command, ConnId, DbError, ErrorKind, Output, Reply, Row, Statement, Value,
};

use crate::lock::CustomLock;
use crate::row::{RusqliteRow, column_index, db_error, from_sql, to_sql};

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
        let manager = Manager {
            config: Arc::new(config),
            tx: tx.clone(),
            rx,
            slots: HashMap::new(),
            bound: HashMap::new(),
            routes: self.routes.clone(),
            idle: Vec::new(),
            waiters: VecDeque::new(),
            next_slot: 0,
            closed: false,
            close_waiters: Vec::new(),
            open: self.open.clone(),
        };
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    /// Opening for the start; idle once open.
    Opening,
    /// Lent to this `ConnId`.
    Bound(ConnId),
    /// In the pool.
    Idle,
    /// Closing: its worker reports gone when done.
    Leaving,
}

struct Slot {
    jobs: mpsc::Sender<Job>,
    interrupt: Option<rusqlite::InterruptHandle>,
    state: SlotState,
}

struct Waiter {
    conn: ConnId,
    reply: ReplyTx,
    deadline: Instant,
}

struct Manager {
    config: Arc<Config>,
    /// The manager's own channel, for its workers' reports.
    tx: mpsc::Sender<Msg>,
    rx: mpsc::Receiver<Msg>,
    slots: HashMap<u64, Slot>,
    bound: HashMap<ConnId, u64>,
    /// The workers of `bound`, for the commands that go to them directly.
    routes: Routes,
    /// Idle connections, the most recently used last.
    idle: Vec<u64>,
    waiters: VecDeque<Waiter>,
    next_slot: u64,
    closed: bool,
    close_waiters: Vec<oneshot::Sender<()>>,
    open: Arc<AtomicUsize>,
}

impl Manager {
    fn run(mut self) {
        loop {
            let msg = match self.waiters.front().map(|w| w.deadline) {
                Some(deadline) => {
                    let wait = deadline.saturating_duration_since(Instant::now());
                    match self.rx.recv_timeout(wait) {
                        Ok(msg) => msg,
                        Err(RecvTimeoutError::Timeout) => {
                            self.expire_waiters();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
                None => match self.rx.recv() {
                    Ok(msg) => msg,
                    Err(_) => return,
                },
            };
            match msg {
                Msg::Command {
                    command,
                    lock,
                    reply,
                } => self.command(command, lock, reply),
                Msg::Start { reply } => {
                    if let Err(opening) =
                        self.spawn_worker(SlotState::Opening, Opening::Start(reply))
                    {
                        opening.fail();
                    }
                }
                Msg::Opened { slot, interrupt } => {
                    if let Some(s) = self.slots.get_mut(&slot) {
                        s.interrupt = Some(interrupt);
                        if s.state == SlotState::Opening {
                            self.give_back(slot);
                        }
                    }
                }
                Msg::Gone { slot } => self.gone(slot),
                Msg::Close { done } => self.close(done),
                Msg::Dropped => {
                    self.closed = true;
                    for waiter in self.waiters.drain(..) {
                        let _ = waiter.reply.send(pool_closed());
                    }
                    for slot in self.slots.values() {
                        let _ = slot.jobs.send(Job::Exit);
                    }
                    return;
                }
            }
        }
    }

    fn command(&mut self, command: Command, lock: Option<CustomLock>, reply: ReplyTx) {
        let conn = command.conn;
        match command.action {
            Action::Acquire => self.acquire(conn, reply),
            Action::Release => match self.bound.remove(&conn) {
                Some(slot) => {
                    let exit = self.closed;
                    self.send(slot, Job::Release { reply, exit });
                    if exit {
                        self.set_state(slot, SlotState::Leaving);
                    } else {
                        self.give_back(slot);
                    }
                }
                // Nothing is held under this id: nothing to give back.
                None => {
                    let _ = reply.send(Reply::Done);
                }
            },
            Action::Close => match self.bound.remove(&conn) {
                Some(slot) => {
                    self.set_state(slot, SlotState::Leaving);
                    if let Some(interrupt) =
                        self.slots.get(&slot).and_then(|s| s.interrupt.as_ref())
                    {
                        // Cuts short a statement still running on the connection; a no-op
                        // when none runs.
                        interrupt.interrupt();
                    }
                    self.send(slot, Job::Close { reply });
                }
                None => {
                    let _ = reply.send(Reply::Done);
                }
            },
            action @ (Action::Execute { .. } | Action::Lock { .. } | Action::Unlock { .. }) => {
                match self.bound.get(&conn) {
                    Some(&slot) => self.send(
                        slot,
                        Job::Run {
                            action,
                            lock,
                            reply,
                        },
                    ),
                    None => {
                        let _ = reply.send(Reply::Failed(DbError::new(
                            ErrorKind::ConnectionLost,
                            format!("{conn} holds no connection of the SQLite pool"),
                        )));
                    }
                }
            }
        }
    }

    fn acquire(&mut self, conn: ConnId, reply: ReplyTx) {
        if self.closed {
            let _ = reply.send(pool_closed());
            return;
        }
        if self.bound.contains_key(&conn) {
            let _ = reply.send(Reply::Failed(DbError::new(
                ErrorKind::Other,
                format!("{conn} holds a connection already"),
            )));
            return;
        }
        if let Some(slot) = self.idle.pop() {
            self.bind(slot, conn);
            let _ = reply.send(Reply::Done);
            return;
        }
        if self.slots.len() < self.config.max_connections {
            if let Err(opening) = self.spawn_worker(SlotState::Bound(conn), Opening::Acquire(reply))
            {
                opening.fail();
            }
            return;
        }
        self.waiters.push_back(Waiter {
            conn,
            reply,
            deadline: Instant::now() + self.config.acquire_timeout,
        });
    }

    fn expire_waiters(&mut self) {
        let now = Instant::now();
        let timeout = self.config.acquire_timeout;
        let max = self.config.max_connections;
        while self.waiters.front().is_some_and(|w| w.deadline <= now) {
            let waiter = self.waiters.pop_front().expect("a waiter at the front");
            let _ = waiter.reply.send(Reply::Failed(DbError::new(
                ErrorKind::PoolClosed,
                format!(
                    "the SQLite pool gave no connection within {timeout:?}: all {max} are in use"
                ),
            )));
        }
    }

    fn bind(&mut self, slot: u64, conn: ConnId) {
        self.set_state(slot, SlotState::Bound(conn));
        self.bound.insert(conn, slot);
        self.route(conn, slot);
    }

    /// Lets the commands of `conn` go to the worker of `slot` directly.
    fn route(&self, conn: ConnId, slot: u64) {
        if let Some(s) = self.slots.get(&slot) {
            locked(&self.routes).insert(conn, s.jobs.clone());
        }
    }

    /// An open connection is free: to the first waiter, else to the pool.
    fn give_back(&mut self, slot: u64) {
        if self.closed {
            self.set_state(slot, SlotState::Leaving);
            self.send(slot, Job::Exit);
            return;
        }
        match self.waiters.pop_front() {
            Some(waiter) => {
                self.bind(slot, waiter.conn);
                let _ = waiter.reply.send(Reply::Done);
            }
            None => {
                self.set_state(slot, SlotState::Idle);
                self.idle.push(slot);
            }
        }
    }

    fn gone(&mut self, slot: u64) {
        self.slots.remove(&slot);
        self.idle.retain(|s| *s != slot);
        self.bound.retain(|_, s| *s != slot);
        let bound = &self.bound;
        locked(&self.routes).retain(|conn, _| bound.contains_key(conn));
        if !self.closed
            && !self.waiters.is_empty()
            && self.slots.len() < self.config.max_connections
        {
            // A fresh connection in place of the one that went, for the first waiter.
            let waiter = self.waiters.pop_front().expect("a waiter");
            if let Err(opening) = self.spawn_worker(
                SlotState::Bound(waiter.conn),
                Opening::Acquire(waiter.reply),
            ) {
                opening.fail();
            }
        }
        self.check_closed();
    }

    fn close(&mut self, done: oneshot::Sender<()>) {
        self.closed = true;
        for waiter in self.waiters.drain(..) {
            let _ = waiter.reply.send(pool_closed());
        }
        for slot in std::mem::take(&mut self.idle) {
            self.set_state(slot, SlotState::Leaving);
            self.send(slot, Job::Exit);
        }
        self.close_waiters.push(done);
        self.check_closed();
    }

    /// The close is done once no idle connection is left open: the ones still bound close
    /// when they are released.
    fn check_closed(&mut self) {
        if self.closed
            && !self
                .slots
                .values()
                .any(|s| matches!(s.state, SlotState::Idle | SlotState::Leaving))
        {
            self.finish_close();
        }
    }

    fn finish_close(&mut self) {
        for done in self.close_waiters.drain(..) {
            let _ = done.send(());
        }
    }

    fn set_state(&mut self, slot: u64, state: SlotState) {
        if let Some(s) = self.slots.get_mut(&slot) {
            s.state = state;
        }
    }

    /// Sends a job to a slot's worker; a worker that is gone answers its reply as lost.
    fn send(&mut self, slot: u64, job: Job) {
        let Some(s) = self.slots.get(&slot) else {
            fail_job(job);
            return;
        };
        if let Err(mpsc::SendError(job)) = s.jobs.send(job) {
            fail_job(job);
        }
    }

    /// Starts a worker that opens a connection. Gives the opening back when no thread starts.
    fn spawn_worker(&mut self, state: SlotState, opening: Opening) -> Result<(), OpeningReply> {
        let slot = self.next_slot;
        self.next_slot += 1;
        let (jobs, queue) = mpsc::channel();
        let worker = Worker {
            config: self.config.clone(),
            slot,
            manager: self.tx.clone(),
            open: self.open.clone(),
        };
        // The opening goes to the thread through a cell, so it can be given back if the thread
        // does not start.
        let cell = Arc::new(Mutex::new(Some(opening)));
        let theirs = cell.clone();
        let spawned = thread::Builder::new()
            .name(format!("ruststream-sqlite-{slot}"))
            .spawn(move || {
                let opening = theirs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .expect("the opening is handed to the thread once");
                worker.run(opening, queue);
            });
        match spawned {
            Ok(_) => {
                self.slots.insert(
                    slot,
                    Slot {
                        jobs,
                        interrupt: None,
                        state,
                    },
                );
                if let SlotState::Bound(conn) = state {
                    self.bound.insert(conn, slot);
                    self.route(conn, slot);
                }
                Ok(())
            }
            Err(_) => {
                let opening = cell
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .expect("a thread that did not start took nothing");
                Err(match opening {
                    Opening::Acquire(reply) => OpeningReply::Acquire(reply),
                    Opening::Start(reply) => OpeningReply::Start(reply),
                })
            }
        }
    }
}

/// An opening given back because its thread did not start.
enum OpeningReply {
    Acquire(ReplyTx),
    Start(StartTx),
}

impl OpeningReply {
    /// Answers that no connection thread started.
    fn fail(self) {
        let message = "cannot start a thread for a SQLite connection";
        match self {
            OpeningReply::Acquire(tx) => {
                let _ = tx.send(Reply::Failed(DbError::new(ErrorKind::PoolClosed, message)));
            }
            OpeningReply::Start(tx) => {
                let _ = tx.send(Err(message.into()));
            }
        }
    }
}

/// Answers a job that found no worker.
fn fail_job(job: Job) {
    let lost = || {
        Reply::Failed(DbError::new(
            ErrorKind::ConnectionLost,
            "the connection's thread has ended",
        ))
    };
    match job {
        Job::Run { reply, .. } => {
            let _ = reply.send(lost());
        }
        // The connection is gone already: released, or closed.
        Job::Release { reply, .. } | Job::Close { reply } => {
            let _ = reply.send(Reply::Done);
        }
        Job::Exit => {}
    }
}

/// One connection's thread.
struct Worker {
    config: Arc<Config>,
    slot: u64,
    manager: mpsc::Sender<Msg>,
    open: Arc<AtomicUsize>,
}

/// Reports the worker gone when its thread ends, however it ends.
struct GoneGuard {
    manager: mpsc::Sender<Msg>,
    slot: u64,
}

impl Drop for GoneGuard {
    fn drop(&mut self) {
        let _ = self.manager.send(Msg::Gone { slot: self.slot });
    }
}

/// An open connection, counted in the pool's open connections until it closes.
struct Live {
    conn: Option<Connection>,
    open: Arc<AtomicUsize>,
}

impl Live {
    fn conn(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("the connection is open until the worker ends")
    }

    fn close(&mut self) {
        if let Some(conn) = self.conn.take() {
            if let Err((_, error)) = conn.close() {
                tracing::warn!("closing a SQLite connection failed: {error}");
            }
            self.open.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.close();
    }
}

impl Worker {
    fn run(self, opening: Opening, queue: mpsc::Receiver<Job>) {
        let guard = GoneGuard {
            manager: self.manager.clone(),
            slot: self.slot,
        };
        let start = matches!(opening, Opening::Start(_));
        let conn = match open(&self.config, start) {
            Ok(conn) => conn,
            Err(error) => {
                // Gone first, so the slot is free before the failure is known.
                drop(guard);
                match opening {
                    Opening::Acquire(reply) => {
                        let _ = reply.send(Reply::Failed(error));
                    }
                    Opening::Start(reply) => {
                        let _ = reply.send(Err(error.message));
                    }
                }
                return;
            }
        };
        self.open.fetch_add(1, Ordering::SeqCst);
        let interrupt = conn.get_interrupt_handle();
        let mut live = Live {
            conn: Some(conn),
            open: self.open.clone(),
        };
        // The manager learns of the connection before the core does, so a command after the
        // acquire's answer finds it.
        let _ = self.manager.send(Msg::Opened {
            slot: self.slot,
            interrupt,
        });
        match opening {
            Opening::Acquire(reply) => {
                let _ = reply.send(Reply::Done);
            }
            Opening::Start(reply) => {
                let _ = reply.send(Ok(()));
            }
        }
        while let Ok(job) = next_job(&queue) {
            match job {
                Job::Run {
                    action,
                    lock,
                    reply,
                } => {
                    let answer = run(live.conn(), action, lock);
                    let _ = reply.send(answer);
                }
                Job::Release { reply, exit } => {
                    reset(live.conn());
                    if exit {
                        live.close();
                        drop(guard);
                        let _ = reply.send(Reply::Done);
                        return;
                    }
                    let _ = reply.send(Reply::Done);
                }
                Job::Close { reply } => {
                    live.close();
                    drop(guard);
                    let _ = reply.send(Reply::Done);
                    return;
                }
                Job::Exit => break,
            }
        }
        live.close();
        drop(guard);
    }
}

/// How long a connection's thread looks for its next job before it sleeps until one comes.
/// A flow's next statement follows the answer of its last within tens of microseconds (the
/// broker handles the answer and sends the next); a thread that went to sleep meanwhile must
/// be woken, which on a loaded machine costs as long again.
const LOOK_BEFORE_SLEEP: Duration = Duration::from_micros(60);

/// The next job of a connection's thread: one already queued, or one that comes within
/// [`LOOK_BEFORE_SLEEP`] (the thread yields between looks), or else the next one, asleep.
fn next_job(queue: &mpsc::Receiver<Job>) -> Result<Job, mpsc::RecvError> {
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

/// Opens a connection: the busy timeout, the statement cache, and on the start, WAL mode.
fn open(config: &Config, start: bool) -> Result<Connection, DbError> {
    let path = config.path.display();
    let failed = |e: rusqlite::Error| {
        let mut error = db_error(&e);
        error.message = format!(
            "cannot open the SQLite database `{path}`: {}",
            error.message
        );
        if error.kind == ErrorKind::Other {
            error.kind = ErrorKind::ConnectionLost;
        }
        error
    };
    let conn = Connection::open(&config.path).map_err(failed)?;
    conn.busy_timeout(config.busy_timeout).map_err(failed)?;
    conn.set_prepared_statement_cache_capacity(config.statement_cache);
    if start {
        // WAL lets readers run beside the writer; an in-memory database answers `memory`.
        // The mode is the file's, so the first connection sets it for all.
        let _mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(failed)?;
    }
    Ok(conn)
}

/// Ends a transaction that a released connection left open, as a pool does.
fn reset(conn: &Connection) {
    if !conn.is_autocommit()
        && let Err(error) = conn.execute_batch("ROLLBACK")
    {
        tracing::warn!("rolling back a released SQLite connection failed: {error}");
    }
}

/// Runs a statement or a custom lock on `conn`.
fn run(conn: &Connection, action: Action, lock: Option<CustomLock>) -> Reply<RusqliteRow> {
    match action {
        Action::Execute { statement, binds } => match execute(conn, &statement, &binds) {
            Ok(reply) => reply,
            Err(error) => Reply::Failed(error),
        },
        Action::Lock { key, .. } => custom(conn, lock, &key, true),
        Action::Unlock { key, .. } => custom(conn, lock, &key, false),
        Action::Acquire | Action::Release | Action::Close => Reply::Failed(DbError::new(
            ErrorKind::Other,
            "the pool handles acquire, release and close itself",
        )),
    }
}

fn custom(
    conn: &Connection,
    lock: Option<CustomLock>,
    key: &str,
    take: bool,
) -> Reply<RusqliteRow> {
    let Some(lock) = lock else {
        return Reply::Failed(DbError::new(
            ErrorKind::Other,
            "the table has no custom lock (its description names no `own::Lock` and `own::Unlock`)",
        ));
    };
    let which = if take { "lock" } else { "unlock" };
    let answer = catch_unwind(AssertUnwindSafe(|| {
        if take {
            lock.lock(conn, key)
        } else {
            lock.unlock(conn, key)
        }
    }));
    match answer {
        Ok(Ok(b)) => Reply::Bool(b),
        Ok(Err(error)) => {
            let mut error = db_error(&error);
            error.message = format!(
                "the custom {which} of key `{key}` failed: {}",
                error.message
            );
            Reply::Failed(error)
        }
        Err(_) => Reply::Failed(DbError::new(
            ErrorKind::Other,
            format!("the custom {which} of key `{key}` panicked"),
        )),
    }
}

/// Runs a statement with its binds and reads the reply as its output says.
fn execute(
    conn: &Connection,
    statement: &Statement,
    binds: &[Value],
) -> Result<Reply<RusqliteRow>, DbError> {
    let sql_error = |e: rusqlite::Error| db_error(&e);
    let mut stmt = conn.prepare_cached(&statement.sql).map_err(sql_error)?;
    if stmt.parameter_count() != binds.len() {
        return Err(DbError::new(
            ErrorKind::Other,
            format!(
                "the statement has {} placeholders but {} binds: {}",
                stmt.parameter_count(),
                binds.len(),
                statement.sql
            ),
        ));
    }
    for (i, value) in binds.iter().enumerate() {
        stmt.raw_bind_parameter(i + 1, to_sql(value))
            .map_err(sql_error)?;
    }
    match &statement.output {
        Output::Nothing => {
            stmt.raw_execute().map_err(sql_error)?;
            Ok(Reply::Done)
        }
        Output::Affected => {
            let n = stmt.raw_execute().map_err(sql_error)?;
            Ok(Reply::Affected(n as u64))
        }
        Output::Rows { columns, raw } => {
            let names: Arc<[String]> = stmt
                .column_names()
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>()
                .into();
            let wanted = columns
                .iter()
                .map(|c| {
                    column_index(&names, c.name).ok_or_else(|| {
                        DbError::new(
                            ErrorKind::UndefinedColumn,
                            format!(
                                "the statement's rows have no column `{}`: {}",
                                c.name, statement.sql
                            ),
                        )
                    })
                })
                .collect::<Result<Vec<usize>, DbError>>()?;
            let mut out = Vec::new();
            let mut rows = stmt.raw_query();
            while let Some(row) = rows.next().map_err(sql_error)? {
                let values = (0..names.len())
                    .map(|i| row.get::<_, SqlValue>(i))
                    .collect::<rusqlite::Result<Vec<SqlValue>>>()
                    .map_err(sql_error)?;
                let read = wanted
                    .iter()
                    .zip(columns.iter())
                    .map(|(&i, c)| {
                        c.ty.read(from_sql(&values[i])).map_err(|e| {
                            DbError::new(
                                ErrorKind::Other,
                                format!(
                                    "column `{}` does not read as {}: {e}: {}",
                                    c.name,
                                    c.ty.name(),
                                    statement.sql
                                ),
                            )
                        })
                    })
                    .collect::<Result<Vec<Value>, DbError>>()?;
                out.push(Row {
                    values: read,
                    raw: raw.then(|| RusqliteRow::from_parts(names.clone(), values)),
                });
            }
            Ok(Reply::Rows(out))
        }
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

//! The pool's manager thread: which connection each `ConnId` is bound to, the idle
//! connections, the acquires waiting for one (with their deadline), and whether the pool is
//! closed. It forwards each command to the worker of its connection, in the order the commands
//! came.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

use futures::channel::oneshot;
use ruststream_core::{Action, Command, ConnId, DbError, ErrorKind, Reply};

use super::worker::Worker;
use super::{Config, Job, Msg, Opening, ReplyTx, Routes, StartTx, locked, pool_closed};
use crate::lock::CustomLock;

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

pub(super) struct Manager {
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
    /// The manager of a pool of these settings: `channel` is its own, for commands and its
    /// workers' reports; `routes` and `open` are shared with the pool's handle.
    pub(super) fn new(
        config: Arc<Config>,
        channel: (mpsc::Sender<Msg>, mpsc::Receiver<Msg>),
        routes: Routes,
        open: Arc<AtomicUsize>,
    ) -> Self {
        let (tx, rx) = channel;
        Self {
            config,
            tx,
            rx,
            slots: HashMap::new(),
            bound: HashMap::new(),
            routes,
            idle: Vec::new(),
            waiters: VecDeque::new(),
            next_slot: 0,
            closed: false,
            close_waiters: Vec::new(),
            open,
        }
    }

    pub(super) fn run(mut self) {
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
pub(super) fn fail_job(job: Job) {
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

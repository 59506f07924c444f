//! The connections the core names, for an adapter whose commands run on connections of an
//! async pool: each `ConnId` holds a connection of the pool from its acquire until its release
//! or close, and runs its commands one after another, in the order the core gave them.
//!
//! The runtime polls the commands' futures side by side, so the order is fixed when a command
//! is issued, not when its future first runs: each command takes a turn behind the one before
//! it on the same `ConnId` ([`Turns`]) and waits for it. A close does not wait for the command
//! in flight: it cuts it short (that command answers [`Reply::Failed`] with
//! [`ErrorKind::ConnectionLost`] at once), the commands queued behind it fail, and then the
//! connection closes, told that a command was cut short ([`Ending::CutShort`]) so the adapter
//! ends a statement that may still run on the server. A connection whose command panicked, or
//! whose command's future was dropped midway, never goes back to the pool: it is discarded
//! ([`ConnectionPool::discard`]), and so is one still held when the map is dropped.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::FutureExt;
use futures::channel::oneshot;
use futures::future::{self, Either, Shared};
use ruststream_core::{Action, Command, ConnId, DbError, ErrorKind, Reply, Statement, Value};

use super::{Turn, Turns};
use crate::exec::BoxFuture;

/// A boxed future that borrows what it runs on: what a statement or a lock on a connection
/// answers, or a pool source's build, open or close ([`PoolSource`](super::PoolSource)).
pub type ConnFuture<'c, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'c>>;

/// How a connection ends, as [`ConnectionPool::close`] and [`ConnectionPool::discard`] are told.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ending {
    /// The session is in a known state: end it gracefully.
    Clean {
        /// A transaction is open on it (the statements run on it opened one and ended none,
        /// or the driver says so: [`ConnectionPool::in_transaction`]).
        in_transaction: bool,
    },
    /// A command on it failed as lost ([`DbError::closes_connection`]): its session is gone,
    /// or in no state to reuse. End it without a goodbye.
    Lost,
    /// A command on it was cut short by a close, panicked, or had its future dropped midway:
    /// its protocol state is unknown, and a statement may still run on the server. End that
    /// statement where the driver can (a cancel request, `KILL QUERY`), then the connection.
    CutShort,
}

/// A pool an adapter lends connections from, and what runs on one of its connections, so
/// that [`Connections`] holds the core's connections for it. Cheap to clone: each connection
/// runs its commands, release and close through the clone it was acquired with.
pub trait ConnectionPool: Clone + Send + Sync + 'static {
    /// The driver's connection, as the pool lends it.
    type Connection: Send + 'static;
    /// The driver's row ([`Adapter::Row`](crate::adapter::Adapter::Row)).
    type Row: Send + 'static;
    /// A table's custom lock and unlock ([`Adapter::Lock`](crate::adapter::Adapter::Lock)).
    type Lock: Clone + Send + Sync + 'static;

    /// Takes a connection of the pool. An error names why none came: a closed pool or one that
    /// gave none in time is [`ErrorKind::PoolClosed`], a connection that did not open
    /// [`ErrorKind::ConnectionLost`].
    fn acquire(&self) -> BoxFuture<Result<Self::Connection, DbError>>;

    /// Runs a statement of the core with its binds and reads the reply as its
    /// [`output`](Statement::output) says. `in_transaction`: a transaction is open on the
    /// connection, where a failed statement cannot be retried.
    fn execute<'c>(
        &'c self,
        conn: &'c mut Self::Connection,
        statement: Statement,
        binds: Vec<Value>,
        in_transaction: bool,
    ) -> ConnFuture<'c, Reply<Self::Row>>;

    /// Runs the table's own lock (`take`) or unlock of `key`: whether it took the key, or
    /// whether the session held it.
    fn lock<'c>(
        &'c self,
        conn: &'c mut Self::Connection,
        lock: &'c Self::Lock,
        key: &'c str,
        take: bool,
    ) -> ConnFuture<'c, Result<bool, DbError>>;

    /// Gives a connection back to the pool. It holds no transaction, and no command on it
    /// failed as lost; into a closed pool, it closes.
    fn release(&self, conn: Self::Connection) -> BoxFuture<()>;

    /// Closes a connection, ending its session, its locks and its transaction, as `ending`
    /// says; it completes once the session has ended on the server, as far as the driver can
    /// tell.
    fn close(&self, conn: Self::Connection, ending: Ending) -> BoxFuture<()>;

    /// Closes a connection that is dropped rather than released or closed (its command
    /// panicked, its command's future was dropped midway, or the map was dropped): it must not
    /// go back to the pool. It cannot wait: a close that needs one runs on a task of its own.
    fn discard(&self, conn: Self::Connection, ending: Ending);

    /// Whether the driver sees a transaction open on the connection, beside what the core's
    /// statements tell ([`StatementKind::transaction_after`](ruststream_core::StatementKind::transaction_after)). The default sees none.
    fn in_transaction(&self, conn: &Self::Connection) -> bool {
        let _ = conn;
        false
    }

    /// A command's future as it must be polled: inside the driver's runtime, for a driver
    /// whose connections need it entered. The default polls it as it is.
    fn enter<T: Send + 'static>(&self, future: BoxFuture<T>) -> BoxFuture<T> {
        future
    }
}

/// Locks a mutex that guards plain data no code panics while holding.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What is known of a connection's session.
#[derive(Clone, Copy, Debug, Default)]
struct Session {
    /// A transaction is open: a `BEGIN` ran, and no `COMMIT` or `ROLLBACK` since.
    in_transaction: bool,
    /// A command failed as lost.
    lost: bool,
    /// A command was cut short by a close.
    cut: bool,
}

impl Session {
    fn ending(self, in_transaction: bool) -> Ending {
        if self.cut {
            Ending::CutShort
        } else if self.lost {
            Ending::Lost
        } else {
            Ending::Clean { in_transaction }
        }
    }
}

/// A connection between its commands, and what is known of its session.
struct Held<C> {
    conn: Option<C>,
    session: Session,
}

/// One `ConnId`: its connection, the order of its commands, and its close.
struct Slot<P: ConnectionPool> {
    pool: P,
    /// The connection, once acquired; taken out while a command runs on it.
    held: Mutex<Held<P::Connection>>,
    /// The turn of the last command queued: the next one waits for it.
    turns: Mutex<Turns>,
    /// Fired by a close: the command in flight stops, the ones queued fail.
    cancel_tx: Mutex<Option<oneshot::Sender<()>>>,
    cancel: Shared<oneshot::Receiver<()>>,
    /// A close came: set with `cancel` fired.
    closing: AtomicBool,
    /// A release or a close took the slot out of the map: a connection lent meanwhile does
    /// not come back to it.
    ended: AtomicBool,
}

impl<P: ConnectionPool> Slot<P> {
    fn new(pool: P) -> Self {
        let (cancel_tx, cancel) = oneshot::channel();
        Self {
            pool,
            held: Mutex::new(Held {
                conn: None,
                session: Session::default(),
            }),
            turns: Mutex::new(Turns::new()),
            cancel_tx: Mutex::new(Some(cancel_tx)),
            cancel: cancel.shared(),
            closing: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        }
    }

    /// Queues a command: its turn, behind the command before it.
    fn turn(&self) -> Turn {
        lock(&self.turns).take()
    }

    fn closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    fn fire_cancel(&self) {
        self.closing.store(true, Ordering::SeqCst);
        if let Some(tx) = lock(&self.cancel_tx).take() {
            let _ = tx.send(());
        }
    }

    /// The connection and what is known of its session, taken out.
    fn take(&self) -> Option<(P::Connection, Session)> {
        let mut held = lock(&self.held);
        let session = held.session;
        held.conn.take().map(|conn| (conn, session))
    }

    fn put(&self, conn: P::Connection) {
        lock(&self.held).conn = Some(conn);
    }

    /// How the connection ends, by what is known of its session.
    fn ending(&self, conn: &P::Connection, session: Session) -> Ending {
        session.ending(session.in_transaction || self.pool.in_transaction(conn))
    }

    /// Runs `work` unless a close cuts it short first.
    async fn guarded<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        let work = std::pin::pin!(work);
        match future::select(work, self.cancel.clone()).await {
            Either::Left((done, _)) => Some(done),
            Either::Right(_) => None,
        }
    }
}

impl<P: ConnectionPool> Drop for Slot<P> {
    fn drop(&mut self) {
        let held = self.held.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(conn) = held.conn.take() {
            let session = held.session;
            let ending = session.ending(session.in_transaction || self.pool.in_transaction(&conn));
            self.pool.discard(conn, ending);
        }
    }
}

/// A connection taken out of its slot for a command: back in the slot when the command ends,
/// discarded when it is dropped midway.
struct InFlight<'s, P: ConnectionPool> {
    slot: &'s Slot<P>,
    conn: Option<P::Connection>,
}

impl<P: ConnectionPool> InFlight<'_, P> {
    fn conn(&mut self) -> &mut P::Connection {
        self.conn
            .as_mut()
            .expect("the connection is in flight until it goes back")
    }

    /// Back in its slot, with what the command taught of its session.
    fn back(mut self, learn: impl FnOnce(&mut Session)) {
        let conn = self.conn.take();
        let mut held = lock(&self.slot.held);
        held.conn = conn;
        learn(&mut held.session);
    }
}

impl<P: ConnectionPool> Drop for InFlight<'_, P> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.slot.pool.discard(conn, Ending::CutShort);
        }
    }
}

/// A connection lent to a handler ([`Connections::lend`]): the driver's connection, by
/// `Deref`. Dropped, it goes back to its `ConnId`, or closes where a release or a close of the
/// `ConnId` came meanwhile (ending its transaction).
pub struct Lent<P: ConnectionPool> {
    slot: Arc<Slot<P>>,
    conn: Option<P::Connection>,
}

impl<P: ConnectionPool> std::fmt::Debug for Lent<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lent").finish_non_exhaustive()
    }
}

impl<P: ConnectionPool> std::ops::Deref for Lent<P> {
    type Target = P::Connection;

    fn deref(&self) -> &P::Connection {
        self.conn.as_ref().expect("lent until dropped")
    }
}

impl<P: ConnectionPool> std::ops::DerefMut for Lent<P> {
    fn deref_mut(&mut self) -> &mut P::Connection {
        self.conn.as_mut().expect("lent until dropped")
    }
}

impl<P: ConnectionPool> Drop for Lent<P> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if self.slot.closing() || self.slot.ended.load(Ordering::SeqCst) {
            self.slot.pool.discard(conn, Ending::CutShort);
        } else {
            self.slot.put(conn);
        }
    }
}

/// What runs on a connection in its turn.
enum Job<L> {
    /// A statement of the core.
    Execute {
        statement: Statement,
        binds: Vec<Value>,
    },
    /// The table's own lock (`take`) or unlock of `key`.
    Lock { lock: L, key: Arc<str>, take: bool },
}

/// Runs a job; answers the reply and, where a statement opens or ends a transaction, whether
/// one is open after it.
async fn run_job<P: ConnectionPool>(
    pool: &P,
    conn: &mut P::Connection,
    job: Job<P::Lock>,
    in_transaction: bool,
) -> (Reply<P::Row>, Option<bool>) {
    match job {
        Job::Execute { statement, binds } => {
            let kind = statement.kind;
            let reply = pool.execute(conn, statement, binds, in_transaction).await;
            let after = kind.transaction_after(!matches!(reply, Reply::Failed(_)));
            (reply, after)
        }
        Job::Lock { lock, key, take } => {
            let which = if take { "lock" } else { "unlock" };
            let reply = match pool.lock(conn, &lock, &key, take).await {
                Ok(answer) => Reply::Bool(answer),
                Err(mut error) => {
                    error.message = format!(
                        "the custom {which} of key `{key}` failed: {}",
                        error.message
                    );
                    Reply::Failed(error)
                }
            };
            (reply, None)
        }
    }
}

fn cut_short(conn: ConnId) -> DbError {
    DbError::new(
        ErrorKind::ConnectionLost,
        format!("{conn} was closed: the command was cut short"),
    )
}

fn no_connection(conn: ConnId) -> DbError {
    DbError::new(
        ErrorKind::ConnectionLost,
        format!("{conn} holds no connection of the pool"),
    )
}

fn pool_closed() -> DbError {
    DbError::new(
        ErrorKind::PoolClosed,
        "the broker is closed (or not started): it lends no connection",
    )
}

fn ready<R: Send + 'static>(reply: Reply<R>) -> BoxFuture<Reply<R>> {
    Box::pin(future::ready(reply))
}

/// The connections the core holds, by `ConnId`, on connections of the pool `P`: an async
/// adapter's [`Adapter::execute`](crate::adapter::Adapter::execute) hands every command to
/// [`Connections::execute`].
pub struct Connections<P: ConnectionPool> {
    slots: Mutex<HashMap<ConnId, Arc<Slot<P>>>>,
}

impl<P: ConnectionPool> Default for Connections<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: ConnectionPool> std::fmt::Debug for Connections<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("held", &self.held())
            .finish()
    }
}

impl<P: ConnectionPool> Connections<P> {
    /// No connection held.
    pub fn new() -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// How many `ConnId`s hold (or are acquiring) a connection.
    pub fn held(&self) -> usize {
        lock(&self.slots).len()
    }

    fn get(&self, conn: ConnId) -> Option<Arc<Slot<P>>> {
        lock(&self.slots).get(&conn).cloned()
    }

    fn remove(&self, conn: ConnId) -> Option<Arc<Slot<P>>> {
        lock(&self.slots).remove(&conn)
    }

    /// Removes `conn` if it is still `slot` (an acquire that failed).
    fn forget(&self, conn: ConnId, slot: &Arc<Slot<P>>) {
        let mut slots = lock(&self.slots);
        if slots.get(&conn).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            slots.remove(&conn);
        }
    }

    /// Answers `command`, in its connection's order, fixed now. `pool` is `None` once the
    /// broker is closed (or before it starts): an acquire then fails as
    /// [`ErrorKind::PoolClosed`], while connections still held run their commands on.
    // An acquire takes a connection of the pool; a statement, a lock or an unlock runs on the
    // connection (`lock` is the table's custom lock); a release gives it back (a connection
    // with a transaction open or lost by a failure closes instead); a close cuts short the
    // command in flight and fails the ones queued, then closes the connection (`Ending`).
    pub fn execute(
        self: &Arc<Self>,
        pool: Option<P>,
        command: Command,
        lock: Option<P::Lock>,
    ) -> BoxFuture<Reply<P::Row>> {
        let id = command.conn;
        match command.action {
            Action::Acquire => match pool {
                Some(pool) => self.acquire(pool, id),
                None => ready(Reply::Failed(pool_closed())),
            },
            Action::Execute { statement, binds } => self.run(id, Job::Execute { statement, binds }),
            Action::Lock { key, .. } => self.custom(id, lock, key, true),
            Action::Unlock { key, .. } => self.custom(id, lock, key, false),
            Action::Release => self.release(id),
            Action::Close => self.close(id),
        }
    }

    /// Lends `id`'s connection to a handler once the commands given before it have run;
    /// meanwhile a command on `id` fails as lost, and a release or close waits for it to come
    /// back. `None` where `id` holds no connection.
    pub fn lend(&self, id: ConnId) -> BoxFuture<Option<Lent<P>>> {
        let Some(slot) = self.get(id) else {
            return Box::pin(future::ready(None));
        };
        let mut turn = slot.turn();
        let pool = slot.pool.clone();
        pool.enter(Box::pin(async move {
            turn.wait().await;
            if slot.closing() {
                return None;
            }
            let (conn, _) = slot.take()?;
            Some(Lent {
                slot,
                conn: Some(conn),
            })
        }))
    }

    fn acquire(self: &Arc<Self>, pool: P, id: ConnId) -> BoxFuture<Reply<P::Row>> {
        let slot = Arc::new(Slot::new(pool.clone()));
        {
            let mut slots = lock(&self.slots);
            if slots.contains_key(&id) {
                return ready(Reply::Failed(DbError::new(
                    ErrorKind::Other,
                    format!("{id} holds a connection already"),
                )));
            }
            slots.insert(id, slot.clone());
        }
        let mut turn = slot.turn();
        let conns = self.clone();
        pool.enter(Box::pin(async move {
            turn.wait().await;
            match slot.guarded(slot.pool.acquire()).await {
                Some(Ok(conn)) => {
                    slot.put(conn);
                    Reply::Done
                }
                Some(Err(error)) => {
                    // The core sends nothing more on an id whose acquire failed.
                    conns.forget(id, &slot);
                    Reply::Failed(error)
                }
                None => Reply::Failed(cut_short(id)),
            }
        }))
    }

    fn custom(
        &self,
        id: ConnId,
        lock: Option<P::Lock>,
        key: Arc<str>,
        take: bool,
    ) -> BoxFuture<Reply<P::Row>> {
        match lock {
            Some(lock) => self.run(id, Job::Lock { lock, key, take }),
            None => ready(Reply::Failed(DbError::new(
                ErrorKind::Other,
                "the table has no custom lock (its description names no `own::Lock` and `own::Unlock`)",
            ))),
        }
    }

    /// Runs `job` on `id`'s connection in its turn.
    fn run(&self, id: ConnId, job: Job<P::Lock>) -> BoxFuture<Reply<P::Row>> {
        let Some(slot) = self.get(id) else {
            return ready(Reply::Failed(no_connection(id)));
        };
        let mut turn = slot.turn();
        let pool = slot.pool.clone();
        pool.enter(Box::pin(async move {
            turn.wait().await;
            if slot.closing() {
                return Reply::Failed(cut_short(id));
            }
            let Some((conn, session)) = slot.take() else {
                // The acquire failed, or a command before this one panicked or was dropped.
                return Reply::Failed(no_connection(id));
            };
            let mut flight = InFlight {
                slot: &slot,
                conn: Some(conn),
            };
            let done = {
                let work = run_job(&slot.pool, flight.conn(), job, session.in_transaction);
                slot.guarded(AssertUnwindSafe(work).catch_unwind()).await
            };
            match done {
                None => {
                    flight.back(|session| session.cut = true);
                    Reply::Failed(cut_short(id))
                }
                Some(Err(_)) => {
                    drop(flight);
                    Reply::Failed(DbError::new(
                        ErrorKind::ConnectionLost,
                        format!("the command on {id} panicked; its connection is closed"),
                    ))
                }
                Some(Ok((reply, after))) => {
                    let lost = matches!(&reply, Reply::Failed(error) if error.closes_connection());
                    flight.back(|session| {
                        if let Some(open) = after {
                            session.in_transaction = open;
                        }
                        session.lost |= lost;
                    });
                    reply
                }
            }
        }))
    }

    fn release(&self, id: ConnId) -> BoxFuture<Reply<P::Row>> {
        let Some(slot) = self.remove(id) else {
            // Nothing is held under this id: nothing to give back.
            return ready(Reply::Done);
        };
        slot.ended.store(true, Ordering::SeqCst);
        let mut turn = slot.turn();
        let pool = slot.pool.clone();
        pool.enter(Box::pin(async move {
            turn.wait().await;
            if let Some((conn, session)) = slot.take() {
                // The core rolls a transaction back before it gives a connection back, and
                // closes one a failure lost; one that still holds either closes here rather
                // than going back to the pool.
                match slot.ending(&conn, session) {
                    Ending::Clean {
                        in_transaction: false,
                    } => slot.pool.release(conn).await,
                    ending => slot.pool.close(conn, ending).await,
                }
            }
            Reply::Done
        }))
    }

    fn close(&self, id: ConnId) -> BoxFuture<Reply<P::Row>> {
        let Some(slot) = self.remove(id) else {
            return ready(Reply::Done);
        };
        slot.ended.store(true, Ordering::SeqCst);
        // The command running now is cut short; the ones waiting behind it fail.
        slot.fire_cancel();
        let mut turn = slot.turn();
        let pool = slot.pool.clone();
        pool.enter(Box::pin(async move {
            turn.wait().await;
            if let Some((conn, session)) = slot.take() {
                let ending = slot.ending(&conn, session);
                slot.pool.close(conn, ending).await;
            }
            Reply::Done
        }))
    }
}

#[cfg(test)]
mod tests;

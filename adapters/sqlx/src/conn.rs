//! The connections the core names: each `ConnId` holds a connection of the pool from its
//! acquire until its release or close, and runs its commands one after another, in the order
//! the core gave them.
//!
//! The runtime runs each command's future on its own, side by side with the others, so the
//! order is fixed when a command arrives, not when its future first runs: each command takes a
//! turn behind the one before it on the same connection ([`Turns`]) and waits for it. A close
//! does not wait for the statement in flight: it cuts it short (the statement's future is dropped, and the
//! connection is closed hard, since its protocol state is unknown), and the commands queued
//! behind it fail.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::FutureExt;
use futures::channel::oneshot;
use futures::future::{self, BoxFuture, Either, Shared};
use ruststream::adapter::{Turn, Turns};
use ruststream_core::{Action, Command, ConnId, DbError, ErrorKind, Reply, Statement, Value};
use sqlx::pool::PoolConnection;
use sqlx::{Connection, Pool};

use crate::db::{SqlxDatabase, db_error};
use crate::lock::CustomLock;

/// Locks a mutex that guards plain data no code panics while holding.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// One `ConnId`'s connection and the order of its commands.
struct Slot<DB: SqlxDatabase> {
    /// The connection, once acquired; taken out while a command runs on it.
    conn: Mutex<Option<PoolConnection<DB>>>,
    /// The turn of the last command queued: the next one waits for it.
    turns: Mutex<Turns>,
    /// Fired by a close: the command in flight stops, the ones queued fail.
    cancel_tx: Mutex<Option<oneshot::Sender<()>>>,
    cancel: Shared<oneshot::Receiver<()>>,
    /// A close came: set with `cancel` fired.
    closing: AtomicBool,
    /// A command was cut short: the connection's protocol state is unknown.
    cut: AtomicBool,
    /// The connection failed as lost: it is closed rather than given back.
    broken: AtomicBool,
    /// A transaction is open (a `BEGIN` ran, and no `COMMIT` or `ROLLBACK` since).
    in_tx: AtomicBool,
}

impl<DB: SqlxDatabase> Slot<DB> {
    fn new() -> Self {
        let (cancel_tx, cancel) = oneshot::channel();
        Self {
            conn: Mutex::new(None),
            turns: Mutex::new(Turns::new()),
            cancel_tx: Mutex::new(Some(cancel_tx)),
            cancel: cancel.shared(),
            closing: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            in_tx: AtomicBool::new(false),
        }
    }

    /// Queues a command: its turn, behind the command before it.
    fn turn(&self) -> Turn {
        lock(&self.turns).take()
    }

    fn cancelled(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    fn fire_cancel(&self) {
        self.closing.store(true, Ordering::SeqCst);
        if let Some(tx) = lock(&self.cancel_tx).take() {
            let _ = tx.send(());
        }
    }

    fn take(&self) -> Option<PoolConnection<DB>> {
        lock(&self.conn).take()
    }

    fn put(&self, conn: PoolConnection<DB>) {
        *lock(&self.conn) = Some(conn);
    }

    /// Runs `work` unless a close cuts it short first.
    async fn guarded<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        let work = std::pin::pin!(work);
        match future::select(work, self.cancel.clone()).await {
            Either::Left((done, _)) => Some(done),
            Either::Right(_) => {
                self.cut.store(true, Ordering::SeqCst);
                None
            }
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

pub(crate) fn pool_closed() -> DbError {
    DbError::new(
        ErrorKind::PoolClosed,
        "the broker is closed (or not started): it lends no connection",
    )
}

/// The connections the core holds, by id.
pub(crate) struct Conns<DB: SqlxDatabase> {
    slots: Mutex<HashMap<ConnId, Arc<Slot<DB>>>>,
}

impl<DB: SqlxDatabase> Conns<DB> {
    pub(crate) fn new() -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// How many ids hold (or are acquiring) a connection.
    pub(crate) fn held(&self) -> usize {
        lock(&self.slots).len()
    }

    fn get(&self, conn: ConnId) -> Option<Arc<Slot<DB>>> {
        lock(&self.slots).get(&conn).cloned()
    }

    fn remove(&self, conn: ConnId) -> Option<Arc<Slot<DB>>> {
        lock(&self.slots).remove(&conn)
    }

    /// Removes `conn` if it is still `slot` (an acquire that failed).
    fn forget(&self, conn: ConnId, slot: &Arc<Slot<DB>>) {
        let mut slots = lock(&self.slots);
        if slots.get(&conn).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            slots.remove(&conn);
        }
    }

    /// Answers `command`. The command takes its place in its connection's order now; the
    /// future runs it in that order. `pool` is `None` once the broker is closed (or before it
    /// starts): an acquire then fails.
    pub(crate) fn execute(
        self: &Arc<Self>,
        pool: Option<Pool<DB>>,
        command: Command,
        custom: Option<CustomLock<DB>>,
    ) -> BoxFuture<'static, Reply<DB::Row>> {
        let id = command.conn;
        match command.action {
            Action::Acquire => {
                let Some(pool) = pool else {
                    return ready(Reply::Failed(pool_closed()));
                };
                let slot = Arc::new(Slot::new());
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
                Box::pin(async move {
                    turn.wait().await;
                    match slot.guarded(pool.acquire()).await {
                        Some(Ok(conn)) => {
                            slot.put(conn);
                            Reply::Done
                        }
                        Some(Err(error)) => {
                            conns.forget(id, &slot);
                            Reply::Failed(db_error::<DB>(&error))
                        }
                        None => Reply::Failed(cut_short(id)),
                    }
                })
            }
            Action::Execute { statement, binds } => self.run(id, Job::Execute { statement, binds }),
            Action::Lock { key, .. } => self.custom(id, custom, key, true),
            Action::Unlock { key, .. } => self.custom(id, custom, key, false),
            Action::Release => {
                let Some(slot) = self.remove(id) else {
                    // Nothing is held under this id: nothing to give back.
                    return ready(Reply::Done);
                };
                let mut turn = slot.turn();
                Box::pin(async move {
                    turn.wait().await;
                    if let Some(conn) = slot.take() {
                        release(&slot, conn).await;
                    }
                    Reply::Done
                })
            }
            Action::Close => {
                let Some(slot) = self.remove(id) else {
                    return ready(Reply::Done);
                };
                slot.fire_cancel();
                let mut turn = slot.turn();
                Box::pin(async move {
                    turn.wait().await;
                    if let Some(conn) = slot.take() {
                        close(&slot, conn).await;
                    }
                    Reply::Done
                })
            }
        }
    }

    /// Runs the table's own lock (`take`) or unlock of `key` on `id`'s connection.
    fn custom(
        &self,
        id: ConnId,
        custom: Option<CustomLock<DB>>,
        key: Arc<str>,
        take: bool,
    ) -> BoxFuture<'static, Reply<DB::Row>> {
        match custom {
            Some(custom) => self.run(id, Job::Custom { custom, key, take }),
            None => ready(Reply::Failed(DbError::new(
                ErrorKind::Other,
                "the table has no custom lock (its description names no `own::Lock` and `own::Unlock`)",
            ))),
        }
    }

    /// Runs `job` on `id`'s connection in its turn.
    fn run(&self, id: ConnId, job: Job<DB>) -> BoxFuture<'static, Reply<DB::Row>> {
        let Some(slot) = self.get(id) else {
            return ready(Reply::Failed(no_connection(id)));
        };
        let mut turn = slot.turn();
        Box::pin(async move {
            turn.wait().await;
            if slot.cancelled() {
                return Reply::Failed(cut_short(id));
            }
            let Some(mut conn) = slot.take() else {
                return Reply::Failed(no_connection(id));
            };
            // A panic in the service's own lock (or the driver) answers as a failure, and the
            // connection, in a state nobody knows, is closed rather than given back.
            let work = AssertUnwindSafe(job.run(&mut conn)).catch_unwind();
            let done = slot.guarded(work).await;
            slot.put(conn);
            match done {
                Some(Err(_)) => {
                    slot.broken.store(true, Ordering::SeqCst);
                    Reply::Failed(DbError::new(
                        ErrorKind::Other,
                        format!("the command on {id} panicked"),
                    ))
                }
                Some(Ok((reply, in_tx))) => {
                    if let Some(in_tx) = in_tx {
                        slot.in_tx.store(in_tx, Ordering::SeqCst);
                    }
                    if let Reply::Failed(error) = &reply
                        && error.closes_connection()
                    {
                        slot.broken.store(true, Ordering::SeqCst);
                    }
                    reply
                }
                None => Reply::Failed(cut_short(id)),
            }
        })
    }
}

/// What runs on a connection in its turn.
enum Job<DB: SqlxDatabase> {
    /// A statement of the core.
    Execute {
        statement: Statement,
        binds: Vec<Value>,
    },
    /// The table's own lock (`take`) or unlock of `key`.
    Custom {
        custom: CustomLock<DB>,
        key: Arc<str>,
        take: bool,
    },
}

impl<DB: SqlxDatabase> Job<DB> {
    /// Runs the job; answers the reply and, where a statement opens or ends a transaction,
    /// whether one is open after it.
    async fn run(self, conn: &mut DB::Connection) -> (Reply<DB::Row>, Option<bool>) {
        match self {
            Job::Execute { statement, binds } => execute::<DB>(conn, statement, binds).await,
            Job::Custom { custom, key, take } => {
                let which = if take { "lock" } else { "unlock" };
                let answer = if take {
                    custom.lock(conn, &key).await
                } else {
                    custom.unlock(conn, &key).await
                };
                match answer {
                    Ok(b) => (Reply::Bool(b), None),
                    Err(error) => {
                        let mut failed = db_error::<DB>(&error);
                        failed.message = format!(
                            "the custom {which} of key `{key}` failed: {}",
                            failed.message
                        );
                        (Reply::Failed(failed), None)
                    }
                }
            }
        }
    }
}

fn ready<R: Send + 'static>(reply: Reply<R>) -> BoxFuture<'static, Reply<R>> {
    Box::pin(future::ready(reply))
}

/// Runs a statement; answers the reply and whether a transaction is open after it, where the
/// statement opens or ends one.
async fn execute<DB: SqlxDatabase>(
    conn: &mut DB::Connection,
    statement: Statement,
    binds: Vec<Value>,
) -> (Reply<DB::Row>, Option<bool>) {
    let reply = match DB::run(conn, &statement, binds).await {
        Ok(reply) => reply,
        Err(error) => Reply::Failed(error),
    };
    let in_tx = statement
        .kind
        .transaction_after(!matches!(reply, Reply::Failed(_)));
    (reply, in_tx)
}

/// Gives a connection back to the pool: a transaction left open is rolled back first; a
/// connection that was lost, cut short or does not roll back is closed instead. Into a closed
/// pool, the connection closes.
async fn release<DB: SqlxDatabase>(slot: &Slot<DB>, mut conn: PoolConnection<DB>) {
    if slot.broken.load(Ordering::SeqCst) || slot.cut.load(Ordering::SeqCst) {
        close_hard(conn).await;
        return;
    }
    if slot.in_tx.load(Ordering::SeqCst)
        && let Err(error) = DB::rollback(&mut conn).await
    {
        tracing::warn!("rolling back a released connection failed: {error}; it is closed");
        close_hard(conn).await;
        return;
    }
    // sqlx's own return, run now rather than in a task its drop would spawn: the connection is
    // tested and idle in the pool (or closed, when the pool is closed) before the release
    // answers, so a close of the pool that follows finds it there.
    let returned = conn.return_to_pool();
    drop(conn);
    returned.await;
}

/// Closes a connection, ending its session: gracefully when its protocol state is known, hard
/// (the socket shut) after a command was cut short or the connection was lost.
async fn close<DB: SqlxDatabase>(slot: &Slot<DB>, conn: PoolConnection<DB>) {
    if slot.broken.load(Ordering::SeqCst) || slot.cut.load(Ordering::SeqCst) {
        close_hard(conn).await;
    } else if let Err(error) = conn.close().await {
        tracing::debug!("closing a connection failed: {error}");
    }
}

async fn close_hard<DB: SqlxDatabase>(conn: PoolConnection<DB>) {
    if let Err(error) = conn.detach().close_hard().await {
        tracing::debug!("closing a connection failed: {error}");
    }
}

//! The connections the core names: each `ConnId` holds one pooled client from its acquire to
//! its release or close, and runs that connection's commands one after another, in the order
//! the core gave them.
//!
//! Each command's future runs the command itself, on the task that polls it (the broker's),
//! with no task of its own between: the order is fixed when `execute` is called, not when the
//! future is first polled, since each command takes a turn behind the one before it on the
//! same `ConnId` ([`Turns`]). An acquire takes a client of the pool; a
//! release gives it back, rolling back a transaction left open (or drops it from the pool when
//! it is broken or the rollback fails); a close ends the session: it cuts short a statement
//! still running (a cancel request, sent again until the statement ends, for up to
//! [`CANCEL_GRACE`]), rolls back and unlocks what the session holds while it still answers, and
//! takes the client out of the pool, which closes it. A connection dropped otherwise goes back
//! to the pool only when it holds nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use futures::future::BoxFuture;
use ruststream::adapter::Turns;
use ruststream_core::{Action, Command, ConnId, DbError, ErrorKind, Reply, StatementKind};
use tokio::sync::watch;
use tokio_postgres::CancelToken;

use crate::error::pool_error;
use crate::lock::CustomLock;
use crate::row::PgRow;
use crate::run;

/// How long a close waits for a statement it cut short to end, sending the cancel again,
/// before it drops the connection with the statement still running.
pub(crate) const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// How often a close sends the cancel again while the statement runs on.
const CANCEL_EVERY: Duration = Duration::from_millis(250);

/// How long the rollback of a release, or the cleanup of a close, may take before the
/// connection is dropped instead.
const RESET_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends a cancel request for the statement running on a session.
pub(crate) type Canceller =
    Arc<dyn Fn(CancelToken) -> BoxFuture<'static, Result<(), tokio_postgres::Error>> + Send + Sync>;

/// The settings every connection runs with.
#[derive(Clone)]
pub(crate) struct Settings {
    /// Run statements under the simple query protocol.
    pub(crate) simple: bool,
    /// Sends cancel requests.
    pub(crate) canceller: Canceller,
}

/// What a connection needs from a running broker: its pool, the runtime its tasks run on,
/// and the settings.
#[derive(Clone)]
pub(crate) struct Lender {
    pub(crate) pool: Pool,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) settings: Arc<Settings>,
}

/// One `ConnId`'s connection and the order of its commands.
struct Slot {
    /// The connection, once acquired; taken out while a command runs on it.
    conn: Arc<Mutex<Option<Connection>>>,
    /// The order of its commands.
    turns: Turns,
    /// Set by a close: the statement running is cut short, and the ones queued fail.
    closing: watch::Sender<bool>,
    /// The runtime the connection's futures need (its timers).
    runtime: tokio::runtime::Handle,
}

/// The connections the core holds, by `ConnId`.
#[derive(Default)]
pub(crate) struct Conns {
    slots: Mutex<HashMap<ConnId, Slot>>,
}

fn lost(message: impl Into<String>) -> Reply<PgRow> {
    Reply::Failed(DbError::new(ErrorKind::ConnectionLost, message))
}

fn ready(reply: Reply<PgRow>) -> BoxFuture<'static, Reply<PgRow>> {
    Box::pin(std::future::ready(reply))
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The locks guard plain data that no code panics while holding.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls a future inside a runtime's context, whatever executor polls it.
fn in_runtime<F>(runtime: tokio::runtime::Handle, future: F) -> BoxFuture<'static, F::Output>
where
    F: std::future::Future + Send + 'static,
{
    let mut future = Box::pin(future);
    Box::pin(std::future::poll_fn(move |cx| {
        let _entered = runtime.enter();
        future.as_mut().poll(cx)
    }))
}

impl Conns {
    fn slots(&self) -> MutexGuard<'_, HashMap<ConnId, Slot>> {
        locked(&self.slots)
    }

    /// How many connections the core holds now.
    pub(crate) fn held(&self) -> usize {
        self.slots().len()
    }

    /// Queues a command on its connection (or, for an acquire, binds a connection to its id)
    /// and answers the future that runs it. The order of a `ConnId`'s commands is fixed here,
    /// when `execute` is called, not when the future is first polled. `lender` is `None` when
    /// the broker does not run: an acquire then fails as a closed pool.
    pub(crate) fn execute(
        self: &Arc<Self>,
        lender: Option<Lender>,
        command: Command,
        lock: Option<CustomLock>,
    ) -> BoxFuture<'static, Reply<PgRow>> {
        let conn = command.conn;
        match command.action {
            Action::Acquire => self.acquire(lender, conn),
            Action::Release => {
                let Some(mut slot) = self.slots().remove(&conn) else {
                    return ready(Reply::Done);
                };
                let mut turn = slot.turns.take();
                in_runtime(slot.runtime, async move {
                    turn.wait().await;
                    let connection = locked(&slot.conn).take();
                    if let Some(connection) = connection {
                        connection.release().await;
                    }
                    drop(turn);
                    Reply::Done
                })
            }
            Action::Close => {
                let Some(mut slot) = self.slots().remove(&conn) else {
                    return ready(Reply::Done);
                };
                // Cuts short a statement still running; the close itself runs after it.
                slot.closing.send_replace(true);
                let mut turn = slot.turns.take();
                in_runtime(slot.runtime, async move {
                    turn.wait().await;
                    let connection = locked(&slot.conn).take();
                    if let Some(connection) = connection {
                        connection.close().await;
                    }
                    drop(turn);
                    Reply::Done
                })
            }
            action @ (Action::Execute { .. } | Action::Lock { .. } | Action::Unlock { .. }) => {
                let mut slots = self.slots();
                let Some(slot) = slots.get_mut(&conn) else {
                    return ready(lost(format!("{conn} holds no connection of the pool")));
                };
                let mut turn = slot.turns.take();
                let cell = slot.conn.clone();
                let mut closing = slot.closing.subscribe();
                let runtime = slot.runtime.clone();
                drop(slots);
                in_runtime(runtime, async move {
                    turn.wait().await;
                    if *closing.borrow() {
                        return lost("the connection was closed before the command ran");
                    }
                    let Some(mut connection) = locked(&cell).take() else {
                        return lost("the connection's client is gone");
                    };
                    let reply = connection.run(action, lock, &mut closing).await;
                    *locked(&cell) = Some(connection);
                    drop(turn);
                    reply
                })
            }
        }
    }

    fn acquire(
        self: &Arc<Self>,
        lender: Option<Lender>,
        conn: ConnId,
    ) -> BoxFuture<'static, Reply<PgRow>> {
        let Some(lender) = lender else {
            return ready(Reply::Failed(DbError::new(
                ErrorKind::PoolClosed,
                "the broker is closed (or not started): it lends no connection",
            )));
        };
        let (closing, _) = watch::channel(false);
        let cell = Arc::new(Mutex::new(None));
        let mut turns = Turns::new();
        let turn = turns.take();
        {
            let mut slots = self.slots();
            if slots.contains_key(&conn) {
                return ready(Reply::Failed(DbError::new(
                    ErrorKind::Other,
                    format!("{conn} holds a connection already"),
                )));
            }
            slots.insert(
                conn,
                Slot {
                    conn: cell.clone(),
                    turns,
                    closing,
                    runtime: lender.runtime.clone(),
                },
            );
        }
        let conns = Arc::downgrade(self);
        in_runtime(lender.runtime.clone(), async move {
            let reply = match lender.pool.get().await {
                Ok(object) => {
                    *locked(&cell) = Some(Connection {
                        object: Some(object),
                        settings: lender.settings,
                        in_tx: false,
                        locked: false,
                        broken: false,
                        running: false,
                    });
                    Reply::Done
                }
                Err(error) => {
                    // The commands queued behind find no client, and fail as lost.
                    if let Some(conns) = conns.upgrade() {
                        conns.slots().remove(&conn);
                    }
                    Reply::Failed(pool_error(&error))
                }
            };
            drop(turn);
            reply
        })
    }
}

/// One pooled client held for a `ConnId`.
struct Connection {
    object: Option<Object>,
    settings: Arc<Settings>,
    /// A transaction is open (a `BEGIN` ran, and no `COMMIT` or `ROLLBACK` since).
    in_tx: bool,
    /// The session may hold an advisory lock: a lock ran on it.
    locked: bool,
    /// The connection must not go back to the pool.
    broken: bool,
    /// A statement runs on it now.
    running: bool,
}

impl Drop for Connection {
    /// A connection dropped without its release or close (the broker went, or a command's
    /// future was dropped midway) goes back to the pool only when it holds nothing: otherwise
    /// it leaves the pool and closes, which ends its session, its transaction and its locks.
    fn drop(&mut self) {
        if let Some(object) = self.object.take()
            && (self.in_tx || self.locked || self.broken || self.running)
        {
            drop(Object::take(object));
        }
    }
}

/// Completes once the connection is to close; never when its slot went without a close (a
/// release).
async fn closed(closing: &mut watch::Receiver<bool>) {
    if closing.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl Connection {
    fn object(&self) -> &Object {
        self.object
            .as_ref()
            .expect("the connection holds its client until it ends")
    }

    async fn run(
        &mut self,
        action: Action,
        lock: Option<CustomLock>,
        closing: &mut watch::Receiver<bool>,
    ) -> Reply<PgRow> {
        let kind = match &action {
            Action::Execute { statement, .. } => Some(statement.kind),
            _ => None,
        };
        if matches!(kind, Some(StatementKind::TryLock)) || matches!(action, Action::Lock { .. }) {
            self.locked = true;
        }
        let object = self
            .object
            .as_ref()
            .expect("the connection holds its client until it ends");
        self.running = true;
        let run = run::run(object, &action, lock, self.settings.simple, self.in_tx);
        tokio::pin!(run);
        let cut = tokio::select! {
            biased;
            reply = &mut run => Ok(reply),
            () = closed(closing) => Err(()),
        };
        let reply = match cut {
            Ok(reply) => reply,
            Err(()) => {
                // Closed while the statement runs: cancel it, again until it ends.
                let token = object.cancel_token();
                let deadline = tokio::time::Instant::now() + CANCEL_GRACE;
                let mut ended = false;
                while tokio::time::Instant::now() < deadline {
                    let cancel = (self.settings.canceller)(token.clone());
                    if let Err(error) = tokio::time::timeout(CANCEL_EVERY, cancel)
                        .await
                        .unwrap_or(Ok(()))
                    {
                        tracing::debug!("a cancel request failed: {error}");
                    }
                    if tokio::time::timeout(CANCEL_EVERY, &mut run).await.is_ok() {
                        ended = true;
                        break;
                    }
                }
                if !ended {
                    tracing::warn!(
                        "a statement cut short by a close did not end within {CANCEL_GRACE:?}; its connection is dropped"
                    );
                }
                self.running = false;
                self.broken = true;
                return lost("the statement was cut short: its connection was closed");
            }
        };
        self.running = false;
        if let Some(in_tx) =
            kind.and_then(|k| k.transaction_after(!matches!(reply, Reply::Failed(_))))
        {
            self.in_tx = in_tx;
        }
        if let Reply::Failed(error) = &reply
            && (error.closes_connection() || self.object().is_closed())
        {
            self.broken = true;
        }
        reply
    }

    /// Gives the client back to the pool, with no transaction open; drops it when it cannot.
    async fn release(mut self) {
        let object = self.object.take().expect("the connection holds its client");
        if self.broken || object.is_closed() {
            drop(Object::take(object));
            return;
        }
        if self.in_tx {
            let rollback =
                tokio::time::timeout(RESET_TIMEOUT, object.batch_execute("ROLLBACK")).await;
            if !matches!(rollback, Ok(Ok(()))) {
                tracing::warn!(
                    "the rollback of a released connection failed; the connection is closed"
                );
                drop(Object::take(object));
                return;
            }
        }
        // Back to the pool; a closed pool drops it.
        drop(object);
    }

    /// Ends the session: what it holds is rolled back and unlocked while it still answers,
    /// then the client leaves the pool and closes.
    async fn close(mut self) {
        let object = self.object.take().expect("the connection holds its client");
        if !self.broken && !object.is_closed() && (self.in_tx || self.locked) {
            let cleanup = async {
                if self.in_tx {
                    object.batch_execute("ROLLBACK").await?;
                }
                if self.locked {
                    object
                        .batch_execute("SELECT pg_advisory_unlock_all()")
                        .await?;
                }
                Ok::<(), tokio_postgres::Error>(())
            };
            if let Ok(Err(error)) = tokio::time::timeout(RESET_TIMEOUT, cleanup).await {
                tracing::debug!("the cleanup of a closed connection failed: {error}");
            }
        }
        // Out of the pool: dropping the client ends its connection and its session.
        drop(Object::take(object));
    }
}

/// The default [`Canceller`]: a cancel request over an unencrypted connection.
pub(crate) fn no_tls_canceller() -> Canceller {
    Arc::new(|token: CancelToken| {
        Box::pin(async move { token.cancel_query(tokio_postgres::NoTls).await })
    })
}

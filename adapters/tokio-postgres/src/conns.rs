//! The connections the core names: each `ConnId` is a task that holds one pooled client from
//! its acquire to its release or close, and runs that connection's commands in the order the
//! core gave them.
//!
//! A command is handed to its connection's task when `execute` is called, not when its future
//! is first polled, so the commands of one `ConnId` run in order whatever order the runtime
//! polls their futures in. An acquire takes a client of the pool; a release gives it back,
//! rolling back a transaction left open (or drops it from the pool when it is broken or the
//! rollback fails); a close ends the session: it cuts short a statement still running (a
//! cancel request, sent again until the statement ends, for up to [`CANCEL_GRACE`]), rolls
//! back and unlocks what the session holds while it still answers, and takes the client out of
//! the pool, which closes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use futures::channel::oneshot;
use futures::future::BoxFuture;
use ruststream_core::{Action, Command, ConnId, DbError, ErrorKind, Reply, StatementKind};
use tokio::sync::{mpsc, watch};
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

type ReplyTx = oneshot::Sender<Reply<PgRow>>;

enum Job {
    Run {
        action: Action,
        lock: Option<CustomLock>,
        reply: ReplyTx,
    },
    Release {
        reply: ReplyTx,
    },
    Close {
        reply: ReplyTx,
    },
}

impl Job {
    /// Answers a job whose connection is gone.
    fn answer_gone(self, error: &DbError) {
        match self {
            Job::Run { reply, .. } => {
                let _ = reply.send(Reply::Failed(error.clone()));
            }
            Job::Release { reply } | Job::Close { reply } => {
                let _ = reply.send(Reply::Done);
            }
        }
    }
}

struct Slot {
    jobs: mpsc::UnboundedSender<Job>,
    closing: watch::Sender<bool>,
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

fn answer(rx: oneshot::Receiver<Reply<PgRow>>) -> BoxFuture<'static, Reply<PgRow>> {
    Box::pin(async move {
        rx.await
            .unwrap_or_else(|_| lost("the connection's task ended before it answered"))
    })
}

impl Conns {
    fn slots(&self) -> MutexGuard<'_, HashMap<ConnId, Slot>> {
        // The lock guards a plain map that no code panics while holding.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many connections the core holds now.
    pub(crate) fn held(&self) -> usize {
        self.slots().len()
    }

    /// Hands a command to its connection's task (or, for an acquire, starts the task). `lender`
    /// is `None` when the broker does not run: an acquire then fails as a closed pool.
    pub(crate) fn execute(
        self: &Arc<Self>,
        lender: Option<Lender>,
        command: Command,
        lock: Option<CustomLock>,
    ) -> BoxFuture<'static, Reply<PgRow>> {
        let conn = command.conn;
        let (reply, rx) = oneshot::channel();
        let job = match command.action {
            Action::Acquire => return self.acquire(lender, conn),
            Action::Release => {
                let Some(slot) = self.slots().remove(&conn) else {
                    return ready(Reply::Done);
                };
                (slot, Job::Release { reply })
            }
            Action::Close => {
                let Some(slot) = self.slots().remove(&conn) else {
                    return ready(Reply::Done);
                };
                // Cuts short a statement still running; the close itself runs after it.
                let _ = slot.closing.send(true);
                (slot, Job::Close { reply })
            }
            action @ (Action::Execute { .. } | Action::Lock { .. } | Action::Unlock { .. }) => {
                let slots = self.slots();
                let Some(slot) = slots.get(&conn) else {
                    return ready(lost(format!("{conn} holds no connection of the pool")));
                };
                let job = Job::Run {
                    action,
                    lock,
                    reply,
                };
                if let Err(mpsc::error::SendError(job)) = slot.jobs.send(job) {
                    job.answer_gone(&DbError::new(
                        ErrorKind::ConnectionLost,
                        "the connection's task has ended",
                    ));
                }
                return answer(rx);
            }
        };
        let (slot, job) = job;
        if let Err(mpsc::error::SendError(job)) = slot.jobs.send(job) {
            job.answer_gone(&DbError::new(
                ErrorKind::ConnectionLost,
                "the connection's task has ended",
            ));
        }
        answer(rx)
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
        let (jobs, queue) = mpsc::unbounded_channel();
        let (closing, closing_rx) = watch::channel(false);
        {
            let mut slots = self.slots();
            if slots.contains_key(&conn) {
                return ready(Reply::Failed(DbError::new(
                    ErrorKind::Other,
                    format!("{conn} holds a connection already"),
                )));
            }
            slots.insert(conn, Slot { jobs, closing });
        }
        let (reply, rx) = oneshot::channel();
        let conns = Arc::downgrade(self);
        let runtime = lender.runtime.clone();
        runtime.spawn(async move {
            let object = match lender.pool.get().await {
                Ok(object) => object,
                Err(error) => {
                    let error = pool_error(&error);
                    if let Some(conns) = conns.upgrade() {
                        conns.slots().remove(&conn);
                    }
                    let _ = reply.send(Reply::Failed(error.clone()));
                    let mut queue = queue;
                    queue.close();
                    while let Some(job) = queue.recv().await {
                        job.answer_gone(&error);
                    }
                    return;
                }
            };
            let _ = reply.send(Reply::Done);
            Connection {
                object: Some(object),
                settings: lender.settings,
                in_tx: false,
                locked: false,
                broken: false,
            }
            .serve(queue, closing_rx)
            .await;
        });
        answer(rx)
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

    async fn serve(
        mut self,
        mut queue: mpsc::UnboundedReceiver<Job>,
        mut closing: watch::Receiver<bool>,
    ) {
        while let Some(job) = queue.recv().await {
            match job {
                Job::Run {
                    action,
                    lock,
                    reply,
                } => {
                    let answer = if *closing.borrow() {
                        lost("the connection was closed before the command ran")
                    } else {
                        self.run(action, lock, &mut closing).await
                    };
                    let _ = reply.send(answer);
                }
                Job::Release { reply } => {
                    self.release().await;
                    let _ = reply.send(Reply::Done);
                    return;
                }
                Job::Close { reply } => {
                    self.close().await;
                    let _ = reply.send(Reply::Done);
                    return;
                }
            }
        }
        // The broker went without releasing the connection: it closes if it holds anything.
        if self.in_tx || self.locked || self.broken {
            self.close().await;
        }
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
                self.broken = true;
                return lost("the statement was cut short: its connection was closed");
            }
        };
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

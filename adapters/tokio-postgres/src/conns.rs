//! A deadpool-postgres pool as the runtime's connection map runs it ([`ConnectionPool`]): the
//! map holds the core's connections, their order, their close and the transactions left open;
//! this file says how a pooled client is taken, runs a statement or the table's own lock, goes
//! back, and ends.
//!
//! A close ends the session: after a statement cut short, a cancel request, sent again until
//! the statement has ended on the server, for up to [`CANCEL_GRACE`]; on a clean session, a
//! rollback and an unlock of what it holds while it still answers. Then the client leaves the
//! pool, which closes it.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use futures::future::BoxFuture;
use ruststream::adapter::{ConnectionPool, Ending};
use ruststream_core::{DbError, Reply, Statement, StatementKind, Value};
use tokio_postgres::CancelToken;

use crate::error::{db_error, pool_error};
use crate::lock::CustomLock;
use crate::row::PgRow;
use crate::run;

/// How long a close waits for a statement it cut short to end, sending the cancel again,
/// before it drops the connection with the statement still running.
pub(crate) const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// How often a close sends the cancel again while the statement runs on.
const CANCEL_EVERY: Duration = Duration::from_millis(250);

/// How long the cleanup of a close may take before the connection is dropped instead.
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

/// What a connection needs from a running broker: its pool, the runtime its futures run in,
/// and the settings.
#[derive(Clone)]
pub struct Lender {
    pub(crate) pool: Pool,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) settings: Arc<Settings>,
}

/// One pooled client held for a `ConnId`.
pub struct PgConn {
    pub(crate) object: Object,
    /// The session may hold an advisory lock: a lock ran on it.
    locked: bool,
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

impl ConnectionPool for Lender {
    type Connection = PgConn;
    type Row = PgRow;
    type Lock = CustomLock;

    fn acquire(&self) -> BoxFuture<'static, Result<PgConn, DbError>> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let object = pool.get().await.map_err(|e| pool_error(&e))?;
            Ok(PgConn {
                object,
                locked: false,
            })
        })
    }

    fn execute<'c>(
        &'c self,
        conn: &'c mut PgConn,
        statement: Statement,
        binds: Vec<Value>,
        in_transaction: bool,
    ) -> BoxFuture<'c, Reply<PgRow>> {
        if statement.kind == StatementKind::TryLock {
            conn.locked = true;
        }
        let simple = self.settings.simple;
        Box::pin(async move {
            run::statement(&conn.object, &statement, &binds, simple, in_transaction).await
        })
    }

    fn lock<'c>(
        &'c self,
        conn: &'c mut PgConn,
        lock: &'c CustomLock,
        key: &'c str,
        take: bool,
    ) -> BoxFuture<'c, Result<bool, DbError>> {
        if take {
            conn.locked = true;
        }
        Box::pin(async move {
            let answer = if take {
                (lock.lock())(&conn.object, key).await
            } else {
                (lock.unlock())(&conn.object, key).await
            };
            answer.map_err(|e| db_error(&e))
        })
    }

    /// Back to the pool; a client whose connection is closed leaves it instead, and a closed
    /// pool drops it.
    fn release(&self, conn: PgConn) -> BoxFuture<'static, ()> {
        if conn.object.is_closed() {
            drop(Object::take(conn.object));
        } else {
            drop(conn.object);
        }
        Box::pin(std::future::ready(()))
    }

    fn close(&self, conn: PgConn, ending: Ending) -> BoxFuture<'static, ()> {
        let canceller = self.settings.canceller.clone();
        Box::pin(async move {
            let PgConn { object, locked } = conn;
            match ending {
                Ending::Clean { in_transaction } => {
                    clean_up(&object, in_transaction, locked).await;
                }
                Ending::CutShort => cancel_until_ended(&object, &canceller).await,
                Ending::Lost => {}
            }
            // Out of the pool: dropping the client ends its connection and its session.
            drop(Object::take(object));
        })
    }

    fn discard(&self, conn: PgConn, _ending: Ending) {
        drop(Object::take(conn.object));
    }

    fn enter<T: Send + 'static>(&self, future: BoxFuture<'static, T>) -> BoxFuture<'static, T> {
        in_runtime(self.runtime.clone(), future)
    }
}

/// What a clean session holds, rolled back and unlocked while it still answers.
async fn clean_up(object: &Object, in_transaction: bool, locked: bool) {
    if object.is_closed() || !(in_transaction || locked) {
        return;
    }
    let cleanup = async {
        if in_transaction {
            object.batch_execute("ROLLBACK").await?;
        }
        if locked {
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

/// Cancels the statement a close cut short, again until the session answers a statement
/// queued behind it, for up to [`CANCEL_GRACE`].
async fn cancel_until_ended(object: &Object, canceller: &Canceller) {
    let token = object.cancel_token();
    let deadline = tokio::time::Instant::now() + CANCEL_GRACE;
    while tokio::time::Instant::now() < deadline {
        let cancel = canceller(token.clone());
        if let Err(error) = tokio::time::timeout(CANCEL_EVERY, cancel)
            .await
            .unwrap_or(Ok(()))
        {
            tracing::debug!("a cancel request failed: {error}");
        }
        // The session answers an empty statement once the one cut short has ended.
        if tokio::time::timeout(CANCEL_EVERY, object.batch_execute(""))
            .await
            .is_ok()
        {
            return;
        }
    }
    tracing::warn!(
        "a statement cut short by a close did not end within {CANCEL_GRACE:?}; its connection is dropped"
    );
}

/// The default [`Canceller`]: a cancel request over an unencrypted connection.
pub(crate) fn no_tls_canceller() -> Canceller {
    Arc::new(|token: CancelToken| {
        Box::pin(async move { token.cancel_query(tokio_postgres::NoTls).await })
    })
}

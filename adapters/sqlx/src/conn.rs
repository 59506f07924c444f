//! A sqlx pool as the runtime's connection map runs it ([`ConnectionPool`]): the map holds the
//! core's connections, their order, their close and the transactions left open; this file
//! says how a connection of a sqlx pool is taken, runs a statement or the table's own lock,
//! goes back, and closes.

use futures::future::BoxFuture;
use ruststream::adapter::{ConnectionPool, Ending};
use ruststream_core::{DbError, Reply, Statement, Value};
use sqlx::pool::PoolConnection;
use sqlx::{Connection, Pool};

use crate::db::{SqlxDatabase, db_error};
use crate::lock::CustomLock;

/// The pool of a running [`SqlxBroker`](crate::SqlxBroker), as the runtime's connection map
/// runs it ([`SqlxClaim`](crate::SqlxClaim) names it).
pub struct SqlxPool<DB: SqlxDatabase> {
    pub(crate) pool: Pool<DB>,
    /// Every statement runs under PostgreSQL's simple query protocol, its binds written in
    /// ([`SqlxBroker::simple_query`](crate::SqlxBroker::simple_query)).
    pub(crate) simple: bool,
}

impl<DB: SqlxDatabase> Clone for SqlxPool<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            simple: self.simple,
        }
    }
}

impl<DB: SqlxDatabase> ConnectionPool for SqlxPool<DB> {
    type Connection = PoolConnection<DB>;
    type Row = DB::Row;
    type Lock = CustomLock<DB>;

    fn acquire(&self) -> BoxFuture<'static, Result<PoolConnection<DB>, DbError>> {
        let pool = self.pool.clone();
        Box::pin(async move { pool.acquire().await.map_err(|e| db_error::<DB>(&e)) })
    }

    fn execute<'c>(
        &'c self,
        conn: &'c mut PoolConnection<DB>,
        statement: Statement,
        binds: Vec<Value>,
        _in_transaction: bool,
    ) -> BoxFuture<'c, Reply<DB::Row>> {
        Box::pin(async move {
            DB::run(&mut **conn, &statement, binds, self.simple)
                .await
                .unwrap_or_else(Reply::Failed)
        })
    }

    fn lock<'c>(
        &'c self,
        conn: &'c mut PoolConnection<DB>,
        lock: &'c CustomLock<DB>,
        key: &'c str,
        take: bool,
    ) -> BoxFuture<'c, Result<bool, DbError>> {
        Box::pin(async move {
            let answer = if take {
                (lock.lock())(&mut **conn, key).await
            } else {
                (lock.unlock())(&mut **conn, key).await
            };
            answer.map_err(|e| db_error::<DB>(&e))
        })
    }

    /// sqlx's own return, run now rather than in a task its drop would spawn: the connection is
    /// tested and idle in the pool (or closed, when the pool is closed) before the release
    /// answers, so a close of the pool that follows finds it there.
    fn release(&self, mut conn: PoolConnection<DB>) -> BoxFuture<'static, ()> {
        let returned = conn.return_to_pool();
        drop(conn);
        Box::pin(returned)
    }

    /// Gracefully when the session's state is known; hard (the socket shut, no goodbye) after
    /// a command was cut short or the connection was lost.
    fn close(&self, conn: PoolConnection<DB>, ending: Ending) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let closed = match ending {
                Ending::Clean { .. } => conn.close().await,
                Ending::Lost | Ending::CutShort => conn.detach().close_hard().await,
            };
            if let Err(error) = closed {
                tracing::debug!("closing a connection failed: {error}");
            }
        })
    }

    /// Out of the pool, its socket dropped.
    fn discard(&self, conn: PoolConnection<DB>, _ending: Ending) {
        drop(conn.detach());
    }
}

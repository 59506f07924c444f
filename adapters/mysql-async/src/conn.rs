//! mysql_async's pool as the runtime's connection map runs it ([`ConnectionPool`]): the map
//! holds the core's connections, their order, their close and the transactions left open; this
//! file says how a connection of the pool is taken, runs a statement or the table's own lock,
//! goes back, and closes.
//!
//! The futures enter the broker's tokio runtime on every poll (mysql_async's IO and timers need
//! it), whatever executor polls them. An acquire waits at most the broker's acquire timeout. A
//! close after a command cut short (or a connection dropped midway) sends the server
//! `KILL QUERY` for the session from a connection of its own, so a statement still running ends,
//! then ends the session (`COM_QUIT`), and with it its transaction and its locks. A connection
//! dropped without its release or close closes on the broker's runtime.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::consts::StatusFlags;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Pool};
use ruststream::adapter::{ConnFuture, ConnectionPool, Ending};
use ruststream::exec::BoxFuture;
use ruststream_core::{ColumnType, DbError, ErrorKind, Output, Reply, Statement, Value, read_rows};
use tokio::runtime::Handle;

use crate::lock::CustomLock;
use crate::value::{db_error, from_mysql, params};

/// How long a close waits for the kill of a statement in flight, and then for the connection
/// to close.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Polls a future inside a runtime's context, whatever executor polls it.
fn in_runtime<F>(runtime: Handle, future: F) -> BoxFuture<F::Output>
where
    F: Future + Send + 'static,
{
    let mut future = Box::pin(future);
    Box::pin(std::future::poll_fn(move |cx| {
        let _entered = runtime.enter();
        future.as_mut().poll(cx)
    }))
}

/// What a pool lends with: the pool, the runtime its connections' futures run in, and how
/// long an acquire may wait.
#[derive(Clone)]
pub struct Lender {
    pub(crate) pool: Pool,
    pub(crate) runtime: Handle,
    pub(crate) acquire_timeout: Duration,
}

/// A connection of the pool held for a `ConnId`, and what is known of it.
pub struct MyConn {
    pub(crate) conn: Conn,
    /// What a kill of a statement in flight needs: the session's id, and options to open a
    /// connection of its own.
    thread: u32,
    opts: Arc<Opts>,
    /// Affected counts are the rows found, not the rows changed (`client_found_rows`).
    found_rows: bool,
    /// The table's own lock or unlock ran on the connection: its session may hold what the
    /// service's code left, so the pool resets it as the pool's options say.
    custom_ran: bool,
}

impl MyConn {
    fn new(conn: Conn) -> Self {
        let opts = conn.opts().clone();
        Self {
            thread: conn.id(),
            found_rows: opts.client_found_rows(),
            opts: Arc::new(opts),
            conn,
            custom_ran: false,
        }
    }
}

impl ConnectionPool for Lender {
    type Connection = MyConn;
    type Row = mysql_async::Row;
    type Lock = CustomLock;

    fn acquire(&self) -> BoxFuture<Result<MyConn, DbError>> {
        let pool = self.pool.clone();
        let timeout = self.acquire_timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, pool.get_conn()).await {
                Ok(Ok(conn)) => Ok(MyConn::new(conn)),
                Err(_) => Err(DbError::new(
                    ErrorKind::PoolClosed,
                    format!("the pool gave no connection within {timeout:?}"),
                )),
                Ok(Err(error)) => {
                    let mut error = db_error(&error);
                    error.message =
                        format!("cannot take a connection of the pool: {}", error.message);
                    if error.kind == ErrorKind::Other {
                        error.kind = ErrorKind::ConnectionLost;
                    }
                    Err(error)
                }
            }
        })
    }

    fn execute<'c>(
        &'c self,
        conn: &'c mut MyConn,
        statement: Statement,
        binds: Vec<Value>,
        _in_transaction: bool,
    ) -> ConnFuture<'c, Reply<mysql_async::Row>> {
        Box::pin(async move {
            let found_rows = conn.found_rows;
            run(&mut conn.conn, &statement, binds, found_rows)
                .await
                .unwrap_or_else(Reply::Failed)
        })
    }

    fn lock<'c>(
        &'c self,
        conn: &'c mut MyConn,
        lock: &'c CustomLock,
        key: &'c str,
        take: bool,
    ) -> ConnFuture<'c, Result<bool, DbError>> {
        conn.custom_ran = true;
        Box::pin(async move {
            let answer = if take {
                (lock.lock())(&mut conn.conn, key).await
            } else {
                (lock.unlock())(&mut conn.conn, key).await
            };
            answer.map_err(|e| db_error(&e))
        })
    }

    /// Back to the pool, which checks it before lending it again, or closes it once closed. A
    /// connection that comes back with no transaction and no lock of the broker's needs no
    /// reset of its session, and its prepared statements stay cached.
    fn release(&self, conn: MyConn) -> BoxFuture<()> {
        let MyConn {
            mut conn,
            custom_ran,
            ..
        } = conn;
        if !custom_ran {
            conn.reset_connection(false);
        }
        drop(conn);
        Box::pin(std::future::ready(()))
    }

    fn close(&self, conn: MyConn, ending: Ending) -> BoxFuture<()> {
        Box::pin(async move {
            if ending == Ending::CutShort {
                kill_query(&conn.opts, conn.thread).await;
            }
            close(conn.conn).await;
        })
    }

    fn discard(&self, conn: MyConn, ending: Ending) {
        drop(self.runtime.spawn(self.close(conn, ending)));
    }

    fn in_transaction(&self, conn: &MyConn) -> bool {
        server_in_tx(&conn.conn)
    }

    fn enter<T: Send + 'static>(&self, future: BoxFuture<T>) -> BoxFuture<T> {
        in_runtime(self.runtime.clone(), future)
    }
}

/// Kills the statement the session `thread` runs, from a connection of its own.
async fn kill_query(opts: &Opts, thread: u32) {
    let kill = async {
        let mut conn = Conn::new(opts.clone()).await?;
        let killed = conn.query_drop(format!("KILL QUERY {thread}")).await;
        let _ = conn.disconnect().await;
        killed
    };
    match tokio::time::timeout(CLOSE_WAIT, kill).await {
        Ok(Ok(())) => {}
        // The session may have ended already: 1094, unknown thread.
        Ok(Err(error)) => tracing::debug!("KILL QUERY {thread} failed: {error}"),
        Err(_) => tracing::warn!("KILL QUERY {thread} did not answer within {CLOSE_WAIT:?}"),
    }
}

/// Whether the server's last answer on `conn` says a transaction is open.
fn server_in_tx(conn: &Conn) -> bool {
    conn.last_ok_packet().is_some_and(|ok| {
        ok.status_flags()
            .contains(StatusFlags::SERVER_STATUS_IN_TRANS)
    })
}

/// Closes a connection, ending its session: `COM_QUIT`, then the socket closes. A connection
/// that does not close in time is dropped, marked disconnected, and the pool discards it.
async fn close(conn: Conn) {
    match tokio::time::timeout(CLOSE_WAIT, conn.disconnect()).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!("closing a MySQL connection failed: {error}"),
        Err(_) => tracing::debug!("closing a MySQL connection took longer than {CLOSE_WAIT:?}"),
    }
}

/// The rows a statement affected: with `client_found_rows`, the server counts the rows it
/// found; without it, the rows it changed, and an `UPDATE`'s info line still tells the rows it
/// matched, which is what the core's fenced updates count.
fn affected(conn: &Conn, found_rows: bool) -> u64 {
    if !found_rows && let Some(matched) = rows_matched(&conn.info()) {
        return matched;
    }
    conn.affected_rows()
}

/// The `N` of an `UPDATE`'s info line, `Rows matched: N  Changed: M  Warnings: W`.
pub(crate) fn rows_matched(info: &str) -> Option<u64> {
    let rest = info.trim_start().strip_prefix("Rows matched:")?;
    rest.split_whitespace().next()?.parse().ok()
}

/// Runs a statement with its binds and reads the reply as its output says. A statement
/// without binds goes through the text protocol (MySQL prepares no `START TRANSACTION`), one
/// with binds through the binary protocol, prepared once per connection and cached.
pub(crate) async fn run(
    conn: &mut Conn,
    statement: &Statement,
    binds: Vec<Value>,
    found_rows: bool,
) -> Result<Reply<mysql_async::Row>, DbError> {
    let failed = |e: mysql_async::Error| db_error(&e);
    if statement.args.len() != binds.len() {
        return Err(DbError::new(
            ErrorKind::Other,
            format!(
                "the statement has {} placeholders but {} binds: {}",
                statement.args.len(),
                binds.len(),
                statement.sql
            ),
        ));
    }
    let sql: &str = &statement.sql;
    match &statement.output {
        Output::Nothing | Output::Affected => {
            if binds.is_empty() {
                conn.query_drop(sql).await.map_err(failed)?;
            } else {
                conn.exec_drop(sql, params(binds)).await.map_err(failed)?;
            }
            Ok(match statement.output {
                Output::Nothing => Reply::Done,
                _ => Reply::Affected(affected(conn, found_rows)),
            })
        }
        Output::Rows { columns, raw } => {
            let rows: Vec<mysql_async::Row> = if binds.is_empty() {
                conn.query_iter(sql)
                    .await
                    .map_err(failed)?
                    .collect_and_drop()
                    .await
                    .map_err(failed)?
            } else {
                conn.exec_iter(sql, params(binds))
                    .await
                    .map_err(failed)?
                    .collect_and_drop()
                    .await
                    .map_err(failed)?
            };
            let names = |row: &mysql_async::Row| {
                let columns = row.columns_ref();
                columns.iter().map(|c| c.name_str().into_owned()).collect()
            };
            let read = |row: &mysql_async::Row, i: usize, ty: ColumnType| match row.as_ref(i) {
                Some(value) => ty.read(from_mysql(value, &row.columns_ref()[i])),
                None => Ok(Value::Null),
            };
            read_rows(rows, columns, *raw, sql, names, read).map(Reply::Rows)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rows_matched;

    #[test]
    fn reads_the_rows_an_update_matched() {
        assert_eq!(
            rows_matched("Rows matched: 2  Changed: 0  Warnings: 0"),
            Some(2)
        );
        assert_eq!(rows_matched("Records: 3  Duplicates: 0  Warnings: 0"), None);
        assert_eq!(rows_matched(""), None);
    }
}

//! The connections the core names: each `ConnId` holds a connection of the pool from its
//! acquire until its release or close, and runs its commands one after another, in the order
//! the core gave them.
//!
//! Each command's future runs the command itself, on the task that polls it, with no task of
//! its own between. The runtime polls the commands' futures side by side, so the order is fixed
//! when `execute` is called, not when a future first runs: each command takes a turn behind the
//! one before it on the same `ConnId` ([`Turns`]) and waits for it. The
//! futures enter the broker's tokio runtime on every poll (mysql_async's IO and timers need
//! it), whatever executor polls them.
//!
//! An acquire takes a connection of the pool, waiting at most the broker's acquire timeout. A
//! release gives it back, rolling back a transaction left open; a connection that was lost, cut
//! short or does not roll back is closed instead. A close does not wait for a statement in
//! flight: it cuts it short. A connection of its own sends the server `KILL QUERY` for the
//! session, the statement fails, and the connection is closed; a command that still has not
//! ended after a short grace (such as a custom lock that waits on something else) is dropped.
//! The commands queued behind a close fail.
//!
//! A connection dropped without its release or close (the broker went away, or a command's
//! future was dropped midway) never goes back to the pool: it closes, which ends its session,
//! its transaction and its locks, after a `KILL QUERY` when a statement was running on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mysql_async::consts::StatusFlags;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Pool};
use ruststream::adapter::Turns;
use ruststream::exec::BoxFuture;
use ruststream_core::{
    Action, Command, ConnId, DbError, ErrorKind, Output, Reply, Row, Statement, Value,
};
use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::lock::CustomLock;
use crate::value::{db_error, from_mysql, params};

/// How long a command cut short by a close may take to end after the server was told to kill
/// it, before it is dropped.
const CUT_GRACE: Duration = Duration::from_secs(2);
/// How long a close waits for the kill of a statement in flight, and then for the connection
/// to close.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Locks a mutex that guards plain data no code panics while holding.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

type MyReply = Reply<mysql_async::Row>;

/// Where a `ConnId`'s connection waits between its commands: empty until the acquire ends,
/// while a command runs on it, and once it has gone.
type Cell = Arc<Mutex<Option<Connection>>>;

/// One `ConnId`: its connection and the order of its commands.
struct Slot {
    /// The connection, once acquired; taken out while a command runs on it.
    conn: Cell,
    /// The order of its commands.
    turns: Turns,
    /// Set by a close: the command in flight is cut short, and the ones queued fail.
    closing: watch::Sender<bool>,
    /// The runtime the connection's futures run in.
    runtime: Handle,
}

/// Completes once a close sets `closing`; never when the slot went without a close (a
/// release, or the broker dropped).
async fn closed(closing: &mut watch::Receiver<bool>) {
    if closing.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

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

/// A command that runs on the connection.
enum Work {
    /// A statement of the core.
    Execute {
        statement: Statement,
        binds: Vec<Value>,
    },
    /// The table's own lock (`take`) or unlock of `key`.
    Custom {
        custom: CustomLock,
        key: Arc<str>,
        take: bool,
    },
}

/// Whether a reply leaves the connection unfit for reuse.
fn done_closes(reply: &MyReply) -> bool {
    matches!(reply, Reply::Failed(error) if error.closes_connection())
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
        "the MySQL broker is closed (or not started): it lends no connection",
    )
}

fn ready(reply: MyReply) -> BoxFuture<MyReply> {
    Box::pin(std::future::ready(reply))
}

/// What a pool lends with: the pool, the runtime its connections' futures run in, and how
/// long an acquire may wait.
pub(crate) struct Lender {
    pub(crate) pool: Pool,
    pub(crate) runtime: Handle,
    pub(crate) acquire_timeout: Duration,
}

/// The connections the core holds, by id.
pub(crate) struct Conns {
    slots: Mutex<HashMap<ConnId, Slot>>,
}

impl Conns {
    pub(crate) fn new() -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<ConnId, Slot>> {
        lock(&self.slots)
    }

    /// How many ids hold (or are acquiring) a connection.
    pub(crate) fn held(&self) -> usize {
        self.slots().len()
    }

    /// Removes `conn` if it is still the slot of `cell` (an acquire that failed).
    fn forget(&self, conn: ConnId, cell: &Cell) {
        let mut slots = self.slots();
        if slots.get(&conn).is_some_and(|s| Arc::ptr_eq(&s.conn, cell)) {
            slots.remove(&conn);
        }
    }

    /// Answers `command`. The command takes its place in its connection's order now; the
    /// future runs it in that order. `lender` is `None` once the broker is closed (or before
    /// it starts): an acquire then fails.
    pub(crate) fn execute(
        self: &Arc<Self>,
        lender: Option<Lender>,
        command: Command,
        custom: Option<CustomLock>,
    ) -> BoxFuture<MyReply> {
        let id = command.conn;
        match command.action {
            Action::Acquire => self.acquire(lender, id),
            Action::Execute { statement, binds } => {
                self.run(id, Work::Execute { statement, binds })
            }
            Action::Lock { ref key, .. } | Action::Unlock { ref key, .. } => {
                let take = matches!(command.action, Action::Lock { .. });
                let Some(custom) = custom else {
                    return ready(Reply::Failed(DbError::new(
                        ErrorKind::Other,
                        "the table has no custom lock (its description names no `own::Lock` and `own::Unlock`)",
                    )));
                };
                let key = key.clone();
                self.run(id, Work::Custom { custom, key, take })
            }
            Action::Release => {
                let Some(mut slot) = self.slots().remove(&id) else {
                    // Nothing is held under this id: nothing to give back.
                    return ready(Reply::Done);
                };
                let mut turn = slot.turns.take();
                let runtime = slot.runtime.clone();
                in_runtime(runtime, async move {
                    turn.wait().await;
                    let connection = lock(&slot.conn).take();
                    if let Some(connection) = connection {
                        connection.release().await;
                    }
                    Reply::Done
                })
            }
            Action::Close => {
                let Some(mut slot) = self.slots().remove(&id) else {
                    return ready(Reply::Done);
                };
                // The command running now is cut short; the ones waiting behind it fail.
                slot.closing.send_replace(true);
                let mut turn = slot.turns.take();
                let runtime = slot.runtime.clone();
                in_runtime(runtime, async move {
                    turn.wait().await;
                    let connection = lock(&slot.conn).take();
                    if let Some(connection) = connection {
                        connection.close().await;
                    }
                    Reply::Done
                })
            }
        }
    }

    /// Binds a connection of the pool to `id`; the commands given after it wait for it.
    fn acquire(self: &Arc<Self>, lender: Option<Lender>, id: ConnId) -> BoxFuture<MyReply> {
        let Some(lender) = lender else {
            return ready(Reply::Failed(pool_closed()));
        };
        let (closing, mut cut) = watch::channel(false);
        let cell: Cell = Arc::new(Mutex::new(None));
        let mut turns = Turns::new();
        let turn = turns.take();
        {
            let mut slots = self.slots();
            if slots.contains_key(&id) {
                return ready(Reply::Failed(DbError::new(
                    ErrorKind::Other,
                    format!("{id} holds a connection already"),
                )));
            }
            slots.insert(
                id,
                Slot {
                    conn: cell.clone(),
                    turns,
                    closing,
                    runtime: lender.runtime.clone(),
                },
            );
        }
        let conns = self.clone();
        let runtime = lender.runtime.clone();
        in_runtime(runtime, async move {
            let _turn = turn;
            let timeout = lender.acquire_timeout;
            let got = tokio::select! {
                biased;
                () = closed(&mut cut) => None,
                got = tokio::time::timeout(timeout, lender.pool.get_conn()) => Some(got),
            };
            let error = match got {
                Some(Ok(Ok(conn))) => {
                    *lock(&cell) = Some(Connection::new(conn, lender.runtime));
                    return Reply::Done;
                }
                None => cut_short(id),
                Some(Err(_)) => DbError::new(
                    ErrorKind::PoolClosed,
                    format!("the pool gave no connection within {timeout:?}"),
                ),
                Some(Ok(Err(error))) => {
                    let mut error = db_error(&error);
                    error.message =
                        format!("cannot take a connection of the pool: {}", error.message);
                    if error.kind == ErrorKind::Other {
                        error.kind = ErrorKind::ConnectionLost;
                    }
                    error
                }
            };
            // The core sends nothing more on an id whose acquire failed; a close that cut the
            // acquire short finds no connection.
            conns.forget(id, &cell);
            Reply::Failed(error)
        })
    }

    /// Runs `work` on `id`'s connection in its turn.
    fn run(&self, id: ConnId, work: Work) -> BoxFuture<MyReply> {
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(&id) else {
            return ready(Reply::Failed(no_connection(id)));
        };
        let mut turn = slot.turns.take();
        let cell = slot.conn.clone();
        let mut closing = slot.closing.subscribe();
        let runtime = slot.runtime.clone();
        drop(slots);
        in_runtime(runtime, async move {
            turn.wait().await;
            if *closing.borrow() {
                return Reply::Failed(cut_short(id));
            }
            let connection = lock(&cell).take();
            let Some(mut connection) = connection else {
                // The acquire failed, or a command before this one was dropped midway.
                return Reply::Failed(no_connection(id));
            };
            let reply = connection.run(id, work, &mut closing).await;
            *lock(&cell) = Some(connection);
            reply
        })
    }
}

/// Kills the statement the session `thread` runs, from a connection of its own.
async fn kill_query(opts: Opts, thread: u32) {
    let kill = async {
        let mut conn = Conn::new(opts).await?;
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

/// A connection of the pool held for a `ConnId`, and what is known of it.
struct Connection {
    /// The driver's connection, until it goes back to the pool or closes.
    conn: Option<Conn>,
    /// The runtime a connection dropped without its release or close closes on.
    runtime: Handle,
    /// What a kill of a statement in flight needs: the session's id, and options to open a
    /// connection of its own.
    thread: u32,
    opts: Opts,
    /// Affected counts are the rows found, not the rows changed (`client_found_rows`).
    found_rows: bool,
    /// The connection was lost, a command on it timed out, or a close cut a command short
    /// (the connection's protocol state is unknown): it is closed, not given back.
    broken: bool,
    /// A transaction is open: a `BEGIN` ran, and no `COMMIT` or `ROLLBACK` since.
    in_tx: bool,
    /// The table's own lock or unlock ran on the connection: its session may hold what the
    /// service's code left, so the pool resets it as the pool's options say.
    custom_ran: bool,
    /// A statement may be running on the connection now: one started and has not ended.
    running: bool,
}

impl Drop for Connection {
    /// A connection dropped without its release or close (the broker went away, or a
    /// command's future was dropped midway) closes, on the broker's runtime, rather than going
    /// back to the pool: its session may hold a transaction, a lock or a half-run statement.
    /// A statement still running is killed first.
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let kill = self.running.then(|| (self.opts.clone(), self.thread));
        drop(self.runtime.spawn(async move {
            if let Some((opts, thread)) = kill {
                kill_query(opts, thread).await;
            }
            close(conn).await;
        }));
    }
}

impl Connection {
    fn new(conn: Conn, runtime: Handle) -> Self {
        let thread = conn.id();
        let opts = conn.opts().clone();
        Self {
            found_rows: opts.client_found_rows(),
            conn: Some(conn),
            runtime,
            thread,
            opts,
            broken: false,
            in_tx: false,
            custom_ran: false,
            running: false,
        }
    }

    /// Runs `work`, unless a close cuts it short: then the server kills the statement from a
    /// connection of its own, and the command gets [`CUT_GRACE`] to end before it is dropped.
    async fn run(
        &mut self,
        id: ConnId,
        work: Work,
        closing: &mut watch::Receiver<bool>,
    ) -> MyReply {
        if matches!(work, Work::Custom { .. }) {
            self.custom_ran = true;
        }
        let Some(conn) = self.conn.as_mut() else {
            return Reply::Failed(no_connection(id));
        };
        self.running = true;
        let (done, cut) = {
            let work = work.run(conn, self.found_rows);
            tokio::pin!(work);
            tokio::select! {
                biased;
                done = &mut work => (Some(done), false),
                () = closed(closing) => {
                    let kill = kill_query(self.opts.clone(), self.thread);
                    let (_, done) = tokio::join!(kill, tokio::time::timeout(CUT_GRACE, &mut work));
                    (done.ok(), true)
                }
            }
        };
        // A command dropped after its grace may have left its statement running.
        self.running = done.is_none();
        let done = done.filter(|_| !cut);
        let reply = match done {
            Some((reply, in_tx)) => {
                if let Some(in_tx) = in_tx {
                    self.in_tx = in_tx;
                }
                reply
            }
            None => Reply::Failed(cut_short(id)),
        };
        if done_closes(&reply) || *closing.borrow() {
            self.broken = true;
        }
        reply
    }

    /// Gives the connection back to the pool: a transaction left open is rolled back first; a
    /// connection that was lost, cut short or does not roll back is closed instead. Into a
    /// closed pool, the connection closes.
    async fn release(mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        if self.broken {
            self.close().await;
            return;
        }
        if self.in_tx || server_in_tx(conn) {
            // Dropped midway, the connection closes rather than going back mid-rollback.
            self.running = true;
            let rolled_back = conn.query_drop("ROLLBACK").await;
            self.running = false;
            if let Err(error) = rolled_back {
                tracing::warn!(
                    "rolling back a released MySQL connection failed: {error}; it is closed"
                );
                self.close().await;
                return;
            }
        }
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if !self.custom_ran {
            // The connection comes back with no transaction and no lock of the broker's: the
            // pool need not reset its session, and its prepared statements stay cached.
            conn.reset_connection(false);
        }
        // Back to the pool, which checks it before lending it again, or closes it once closed.
        drop(conn);
    }

    /// Closes the connection, ending its session.
    async fn close(mut self) {
        if let Some(conn) = self.conn.take() {
            close(conn).await;
        }
    }
}

impl Work {
    /// Runs the work; answers the reply and, where a statement opens or ends a transaction,
    /// whether one is open after it.
    async fn run(self, conn: &mut Conn, found_rows: bool) -> (MyReply, Option<bool>) {
        match self {
            Work::Execute { statement, binds } => {
                let reply = execute(conn, &statement, binds, found_rows).await;
                let in_tx = statement
                    .kind
                    .transaction_after(!matches!(reply, Reply::Failed(_)));
                (reply, in_tx)
            }
            Work::Custom { custom, key, take } => {
                let which = if take { "lock" } else { "unlock" };
                let answer = if take {
                    custom.lock(conn, &key).await
                } else {
                    custom.unlock(conn, &key).await
                };
                let reply = match answer {
                    Ok(b) => Reply::Bool(b),
                    Err(error) => {
                        let mut failed = db_error(&error);
                        failed.message = format!(
                            "the custom {which} of key `{key}` failed: {}",
                            failed.message
                        );
                        Reply::Failed(failed)
                    }
                };
                (reply, None)
            }
        }
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
async fn execute(
    conn: &mut Conn,
    statement: &Statement,
    binds: Vec<Value>,
    found_rows: bool,
) -> Reply<mysql_async::Row> {
    match run(conn, statement, binds, found_rows).await {
        Ok(reply) => reply,
        Err(error) => Reply::Failed(error),
    }
}

async fn run(
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
            let mut wanted: Option<Vec<usize>> = None;
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let names = row.columns_ref();
                let indexes = match &wanted {
                    Some(indexes) => indexes,
                    None => {
                        let found = columns
                            .iter()
                            .map(|c| {
                                column_index(names, c.name).ok_or_else(|| {
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
                        wanted.insert(found)
                    }
                };
                let values = indexes
                    .iter()
                    .zip(columns.iter())
                    .map(|(&i, c)| {
                        let value = match row.as_ref(i) {
                            Some(value) => from_mysql(value, &names[i]),
                            None => Value::Null,
                        };
                        c.ty.read(value).map_err(|e| {
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
                    values,
                    raw: raw.then_some(row),
                });
            }
            Ok(Reply::Rows(out))
        }
    }
}

/// The index of the column `name`: exact first, then ignoring ASCII case (MySQL's own rule
/// for column names).
fn column_index(columns: &[mysql_async::Column], name: &str) -> Option<usize> {
    columns
        .iter()
        .position(|c| c.name_ref() == name.as_bytes())
        .or_else(|| {
            columns
                .iter()
                .position(|c| c.name_str().eq_ignore_ascii_case(name))
        })
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

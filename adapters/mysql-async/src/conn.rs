//! The connections the core names: each `ConnId` holds a connection of the pool from its
//! acquire until its release or close, and runs its commands one after another, in the order
//! the core gave them.
//!
//! The runtime runs each command's future on its own, side by side with the others, so the
//! order is fixed when a command arrives, not when its future first runs: an acquire starts a
//! task of its own on the tokio runtime (the connection's task), and every later command of
//! that `ConnId` is sent to it at once, over a channel, where it waits its turn. The task owns
//! the driver's connection.
//!
//! A close does not wait for a statement in flight: it cuts it short. A connection of its own
//! sends the server `KILL QUERY` for the session, the statement fails, and the connection is
//! closed; a command that still has not ended after a short grace (such as a custom lock that
//! waits on something else) is dropped. The commands queued behind a close fail.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mysql_async::consts::StatusFlags;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Pool};
use ruststream::exec::BoxFuture;
use ruststream_core::{
    Action, Command, ConnId, DbError, ErrorKind, Output, Reply, Row, Statement, StatementKind,
    Value,
};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::lock::CustomLock;
use crate::value::{db_error, from_mysql, name_text, params};

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

type ReplyTx = oneshot::Sender<Reply<mysql_async::Row>>;

/// What a connection's task shares with the broker.
struct Shared {
    /// Set by a close: the command in flight is cut short, and the ones queued fail.
    cut: watch::Sender<bool>,
}

/// One `ConnId`: its task's queue.
struct Slot {
    jobs: mpsc::UnboundedSender<Job>,
    shared: Arc<Shared>,
}

/// What a connection's task runs, in the order it came.
enum Job {
    /// A statement of the core, or the table's own lock or unlock.
    Run { work: Work, reply: ReplyTx },
    /// Give the connection back to the pool.
    Release { reply: ReplyTx },
    /// Close the connection.
    Close { reply: ReplyTx },
}

impl Job {
    /// Answers a job that finds no connection.
    fn fail(self, error: impl FnOnce() -> DbError) {
        match self {
            Job::Run { reply, .. } => {
                let _ = reply.send(Reply::Failed(error()));
            }
            // Nothing is held: nothing to give back or close.
            Job::Release { reply } | Job::Close { reply } => {
                let _ = reply.send(Reply::Done);
            }
        }
    }
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

/// Completes once a close sets the cut (never if the close's sender is gone, which the task's
/// own `Shared` keeps alive).
async fn cut_short_by(cut: &mut watch::Receiver<bool>) {
    if cut.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Whether a reply leaves the connection unfit for reuse.
fn done_closes(reply: &Reply<mysql_async::Row>) -> bool {
    matches!(reply, Reply::Failed(error) if error.closes_connection())
}

/// What the connection's task knows of its connection.
#[derive(Default)]
struct State {
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

fn lost(conn: ConnId) -> DbError {
    DbError::new(
        ErrorKind::ConnectionLost,
        format!("the task of {conn} ended before it answered"),
    )
}

fn ready(reply: Reply<mysql_async::Row>) -> BoxFuture<Reply<mysql_async::Row>> {
    Box::pin(std::future::ready(reply))
}

fn answer(
    conn: ConnId,
    rx: oneshot::Receiver<Reply<mysql_async::Row>>,
) -> BoxFuture<Reply<mysql_async::Row>> {
    Box::pin(async move { rx.await.unwrap_or_else(|_| Reply::Failed(lost(conn))) })
}

/// What a pool lends with: the pool, the runtime its connections' tasks run on, and how long
/// an acquire may wait.
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

    /// How many ids hold (or are acquiring) a connection.
    pub(crate) fn held(&self) -> usize {
        lock(&self.slots).len()
    }

    /// Removes `conn` if it is still the slot of `shared` (an acquire that failed).
    fn forget(&self, conn: ConnId, shared: &Arc<Shared>) {
        let mut slots = lock(&self.slots);
        if slots
            .get(&conn)
            .is_some_and(|s| Arc::ptr_eq(&s.shared, shared))
        {
            slots.remove(&conn);
        }
    }

    /// Answers `command`. The command takes its place in its connection's order now; the
    /// future answers once the connection's task has run it. `lender` is `None` once the
    /// broker is closed (or before it starts): an acquire then fails.
    pub(crate) fn execute(
        self: &Arc<Self>,
        lender: Option<Lender>,
        command: Command,
        custom: Option<CustomLock>,
    ) -> BoxFuture<Reply<mysql_async::Row>> {
        let id = command.conn;
        match command.action {
            Action::Acquire => {
                let Some(lender) = lender else {
                    return ready(Reply::Failed(pool_closed()));
                };
                let (jobs, queue) = mpsc::unbounded_channel();
                let (cut, cut_rx) = watch::channel(false);
                let shared = Arc::new(Shared { cut });
                {
                    let mut slots = lock(&self.slots);
                    if slots.contains_key(&id) {
                        return ready(Reply::Failed(DbError::new(
                            ErrorKind::Other,
                            format!("{id} holds a connection already"),
                        )));
                    }
                    slots.insert(
                        id,
                        Slot {
                            jobs,
                            shared: shared.clone(),
                        },
                    );
                }
                let (reply, rx) = oneshot::channel();
                let task = Task {
                    conns: self.clone(),
                    id,
                    shared,
                    cut: cut_rx,
                    queue,
                };
                let runtime = lender.runtime.clone();
                runtime.spawn(task.run(lender, reply));
                answer(id, rx)
            }
            Action::Execute { statement, binds } => self.send(id, |reply| Job::Run {
                work: Work::Execute { statement, binds },
                reply,
            }),
            Action::Lock { ref key, .. } | Action::Unlock { ref key, .. } => {
                let take = matches!(command.action, Action::Lock { .. });
                let Some(custom) = custom else {
                    return ready(Reply::Failed(DbError::new(
                        ErrorKind::Other,
                        "the table has no custom lock (its description names no `own::Lock` and `own::Unlock`)",
                    )));
                };
                let key = key.clone();
                self.send(id, |reply| Job::Run {
                    work: Work::Custom { custom, key, take },
                    reply,
                })
            }
            Action::Release => {
                let Some(slot) = lock(&self.slots).remove(&id) else {
                    // Nothing is held under this id: nothing to give back.
                    return ready(Reply::Done);
                };
                let (reply, rx) = oneshot::channel();
                if let Err(mpsc::error::SendError(job)) = slot.jobs.send(Job::Release { reply }) {
                    job.fail(|| no_connection(id));
                }
                answer(id, rx)
            }
            Action::Close => {
                let Some(slot) = lock(&self.slots).remove(&id) else {
                    return ready(Reply::Done);
                };
                // The task cuts short what runs now; what waits behind it fails.
                slot.shared.cut.send_replace(true);
                let (reply, rx) = oneshot::channel();
                if let Err(mpsc::error::SendError(job)) = slot.jobs.send(Job::Close { reply }) {
                    job.fail(|| no_connection(id));
                }
                answer(id, rx)
            }
        }
    }

    /// Sends a job to `id`'s task.
    fn send(
        &self,
        id: ConnId,
        job: impl FnOnce(ReplyTx) -> Job,
    ) -> BoxFuture<Reply<mysql_async::Row>> {
        let (reply, rx) = oneshot::channel();
        let job = job(reply);
        let sent = match lock(&self.slots).get(&id) {
            Some(slot) => slot.jobs.send(job).map_err(|e| e.0),
            None => Err(job),
        };
        if let Err(job) = sent {
            job.fail(|| no_connection(id));
        }
        answer(id, rx)
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

/// A connection's task: it acquires the connection, then runs the jobs of its `ConnId` in
/// order until a release or a close.
struct Task {
    conns: Arc<Conns>,
    id: ConnId,
    shared: Arc<Shared>,
    cut: watch::Receiver<bool>,
    queue: mpsc::UnboundedReceiver<Job>,
}

impl Task {
    async fn run(mut self, lender: Lender, acquired: ReplyTx) {
        let id = self.id;
        let timeout = lender.acquire_timeout;
        let got = {
            let mut cut = self.cut.clone();
            tokio::select! {
                biased;
                () = cut_short_by(&mut cut) => None,
                got = tokio::time::timeout(timeout, lender.pool.get_conn()) => Some(got),
            }
        };
        let mut conn = match got {
            Some(Ok(Ok(conn))) => conn,
            failed => {
                let error = match failed {
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
                    Some(Ok(Ok(_))) => unreachable!("matched above"),
                };
                self.conns.forget(id, &self.shared);
                let _ = acquired.send(Reply::Failed(error));
                // The core sends nothing more on an id whose acquire failed; a close that cut
                // the acquire short waits in the queue.
                while let Some(job) = self.queue.recv().await {
                    job.fail(|| no_connection(id));
                }
                return;
            }
        };
        // What a kill of a statement in flight needs: the session's id, and options to open a
        // connection of its own.
        let thread = conn.id();
        let opts = conn.opts().clone();
        let mut state = State {
            found_rows: opts.client_found_rows(),
            ..State::default()
        };
        let mut kill: Option<JoinHandle<()>> = None;
        let _ = acquired.send(Reply::Done);
        while let Some(job) = self.queue.recv().await {
            match job {
                Job::Run { work, reply } => {
                    if *self.cut.borrow() {
                        let _ = reply.send(Reply::Failed(cut_short(id)));
                        continue;
                    }
                    if matches!(work, Work::Custom { .. }) {
                        state.custom_ran = true;
                    }
                    let done = {
                        let work = work.run(&mut conn, &mut state);
                        tokio::pin!(work);
                        let mut cut = self.cut.clone();
                        tokio::select! {
                            biased;
                            done = &mut work => Some(done),
                            () = cut_short_by(&mut cut) => {
                                // A close came while the command runs: the server kills the
                                // statement from a connection of its own, and the command
                                // gets a short grace to end.
                                kill = Some(tokio::spawn(kill_query(opts.clone(), thread)));
                                tokio::time::timeout(CUT_GRACE, &mut work).await.ok()
                            }
                        }
                    };
                    let reply_now = match done {
                        Some(reply) => reply,
                        None => Reply::Failed(cut_short(id)),
                    };
                    if done_closes(&reply_now) || *self.cut.borrow() {
                        state.broken = true;
                    }
                    let _ = reply.send(reply_now);
                }
                Job::Release { reply } => {
                    release(conn, &state).await;
                    let _ = reply.send(Reply::Done);
                    return;
                }
                Job::Close { reply } => {
                    if let Some(kill) = kill.take() {
                        let _ = tokio::time::timeout(CLOSE_WAIT, kill).await;
                    }
                    close(conn).await;
                    let _ = reply.send(Reply::Done);
                    return;
                }
            }
        }
        // Every sender is gone without a release or a close (the broker was dropped): the
        // connection closes, and its session with it.
        close(conn).await;
    }
}

impl Work {
    async fn run(self, conn: &mut Conn, state: &mut State) -> Reply<mysql_async::Row> {
        match self {
            Work::Execute { statement, binds } => {
                let reply = execute(conn, &statement, binds, state.found_rows).await;
                if let Some(in_tx) = statement
                    .kind
                    .transaction_after(!matches!(reply, Reply::Failed(_)))
                {
                    state.in_tx = in_tx;
                }
                reply
            }
            Work::Custom { custom, key, take } => {
                let which = if take { "lock" } else { "unlock" };
                let answer = if take {
                    custom.lock(conn, &key).await
                } else {
                    custom.unlock(conn, &key).await
                };
                match answer {
                    Ok(b) => Reply::Bool(b),
                    Err(error) => {
                        let mut failed = db_error(&error);
                        failed.message = format!(
                            "the custom {which} of key `{key}` failed: {}",
                            failed.message
                        );
                        Reply::Failed(failed)
                    }
                }
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

/// Gives a connection back to the pool: a transaction left open is rolled back first; a
/// connection that was lost, cut short or does not roll back is closed instead. Into a closed
/// pool, the connection closes.
async fn release(mut conn: Conn, state: &State) {
    if state.broken {
        close(conn).await;
        return;
    }
    if (state.in_tx || server_in_tx(&conn))
        && let Err(error) = conn.query_drop("ROLLBACK").await
    {
        tracing::warn!("rolling back a released MySQL connection failed: {error}; it is closed");
        close(conn).await;
        return;
    }
    if !state.custom_ran {
        // The connection comes back with no transaction and no lock of the broker's: the
        // pool need not reset its session, and its prepared statements stay cached.
        conn.reset_connection(false);
    }
    // Back to the pool, which checks it before lending it again, or closes it once closed.
    drop(conn);
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
            // The table's column names, which MySQL 8 may send as binary strings.
            let names_as_text = statement.kind == StatementKind::ListColumns;
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
                                column_index(names, c).ok_or_else(|| {
                                    DbError::new(
                                        ErrorKind::UndefinedColumn,
                                        format!(
                                            "the statement's rows have no column `{c}`: {}",
                                            statement.sql
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
                    .map(|&i| match row.as_ref(i) {
                        Some(value) if names_as_text => name_text(from_mysql(value, &names[i])),
                        Some(value) => from_mysql(value, &names[i]),
                        None => Value::Null,
                    })
                    .collect();
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

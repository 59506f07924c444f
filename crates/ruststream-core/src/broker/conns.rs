//! The connections the flows use: the ids they know them by, the clean ones kept for the next
//! flow ([`CONNECTION_LINGER`](super::CONNECTION_LINGER)), and what a session holds that a
//! release must end first.
//!
//! A flow acquires a connection under an id of its own and releases or closes it when done.
//! An acquire takes a kept connection when there is one (the flow's id is then an alias of
//! the kept one's), and the release of a clean connection keeps it; the broker answers both
//! itself. A connection given back with a transaction open or in doubt is rolled back first,
//! and one whose session a failure lost is closed instead: no adapter tracks transactions.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use crate::dialect::StatementKind;
use crate::types::{Action, Command, CommandId, ConnId, Reply};
use crate::value::Time;

use super::{Broker, State, Step, Sweep};

/// Whether a session's transaction is open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Tx {
    #[default]
    None,
    Open,
    /// A `BEGIN` or a `COMMIT` failed: it may be open.
    InDoubt,
}

/// What a session holds beyond a clean one's.
#[derive(Clone, Copy, Debug, Default)]
struct Session {
    /// Not kept for the next flow: a transaction was begun and is not known to be over, a
    /// command failed on it, or a custom lock ran on it.
    unclean: bool,
    tx: Tx,
    /// A failure lost the connection: it closes rather than goes back to the pool.
    lost: bool,
}

/// What a command's reply tells of its session.
#[derive(Clone, Copy, Debug)]
enum Watch {
    Statement(StatementKind),
    CustomLock,
}

#[derive(Debug)]
pub(super) struct Conns {
    /// Connections the flows hold, acquired and not yet released or closed, by the flows' ids.
    held: BTreeSet<ConnId>,
    /// Connections a flow gave back, kept for the next acquire, with the time each was given
    /// back, the most recent last.
    idle: Vec<(ConnId, Time)>,
    /// How long a connection is kept.
    pub(super) linger: Duration,
    /// A flow's connection that is a kept one: the flow's id, and the id the adapter knows.
    alias: BTreeMap<ConnId, ConnId>,
    /// Sessions (by the adapter's ids) that are not clean.
    sessions: BTreeMap<ConnId, Session>,
    /// Commands whose reply tells of their session.
    watched: BTreeMap<CommandId, (ConnId, Watch)>,
    /// Acquires handed to the adapter and not yet answered: while one waits for the pool, a
    /// connection given back goes to the pool, where that acquire finds it.
    acquiring: BTreeSet<CommandId>,
    /// Acquires and releases the broker answered itself, to answer `Done` in order.
    answered_here: VecDeque<CommandId>,
    next_conn: u64,
}

impl Conns {
    pub(super) fn new(linger: Duration) -> Self {
        Self {
            held: BTreeSet::new(),
            idle: Vec::new(),
            linger,
            alias: BTreeMap::new(),
            sessions: BTreeMap::new(),
            watched: BTreeMap::new(),
            acquiring: BTreeSet::new(),
            answered_here: VecDeque::new(),
            next_conn: 0,
        }
    }

    /// Connections held by flows or kept for the next.
    pub(super) fn count(&self) -> usize {
        self.held.len() + self.idle.len()
    }

    /// Whether no connection is held or kept.
    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty() && self.idle.is_empty()
    }

    /// When the oldest kept connection goes back to the pool.
    pub(super) fn next_expiry(&self) -> Option<Time> {
        self.idle
            .iter()
            .map(|(_, since)| since.plus(self.linger))
            .min()
    }

    /// The id the adapter knows a flow's connection by: the kept connection it is an alias
    /// of, or its own.
    pub(super) fn physical(&self, conn: ConnId) -> ConnId {
        self.alias.get(&conn).copied().unwrap_or(conn)
    }

    /// A flow's acquire failed: it holds nothing under `conn`.
    pub(super) fn forget(&mut self, conn: ConnId) {
        self.held.remove(&conn);
    }

    fn session(&mut self, conn: ConnId) -> &mut Session {
        self.sessions.entry(conn).or_default()
    }

    /// The reply to command `id` came: what it tells of its session.
    fn answered<R>(&mut self, id: CommandId, reply: &Reply<R>) {
        self.acquiring.remove(&id);
        let Some((conn, watch)) = self.watched.remove(&id) else {
            return;
        };
        let failed = match reply {
            Reply::Failed(error) => Some(error.closes_connection()),
            _ => None,
        };
        let session = self.session(conn);
        match watch {
            Watch::CustomLock => session.unclean = true,
            Watch::Statement(kind) => {
                match kind.transaction_after(failed.is_none()) {
                    Some(true) => session.tx = Tx::Open,
                    Some(false) => session.tx = Tx::None,
                    None if failed.is_some()
                        && matches!(kind, StatementKind::Begin | StatementKind::Commit) =>
                    {
                        session.tx = Tx::InDoubt;
                    }
                    None => {}
                }
                if failed.is_none() && kind.transaction_after(true) == Some(false) {
                    session.unclean = false;
                }
            }
        }
        if let Some(lost) = failed {
            session.unclean = true;
            session.lost |= lost;
        }
    }
}

impl<R> Broker<R> {
    pub(super) fn new_conn(&mut self) -> ConnId {
        let conn = ConnId(self.conns.next_conn);
        self.conns.next_conn += 1;
        conn
    }

    /// Sends a flow's command on its connection `conn`. An acquire takes a kept connection
    /// when there is one, and a release of a clean connection keeps it; the broker answers
    /// both itself.
    pub(super) fn send(&mut self, conn: ConnId, action: Action, step: Step) {
        match action {
            Action::Acquire => {
                self.conns.held.insert(conn);
                if self.state == State::Running
                    && let Some((kept, _)) = self.conns.idle.pop()
                {
                    self.conns.alias.insert(conn, kept);
                    self.answer_later(step);
                    return;
                }
                self.send_now(conn, Action::Acquire, step);
            }
            Action::Release | Action::Close => {
                self.conns.held.remove(&conn);
                let physical = self.conns.alias.remove(&conn).unwrap_or(conn);
                let session = self.conns.sessions.remove(&physical).unwrap_or_default();
                let release = matches!(action, Action::Release);
                if release
                    && self.state == State::Running
                    && !self.conns.linger.is_zero()
                    && self.conns.acquiring.is_empty()
                    && !session.unclean
                {
                    self.conns.idle.push((physical, self.now));
                    self.answer_later(step);
                } else if release && session.lost {
                    self.send_now(physical, Action::Close, step);
                } else if release && session.tx != Tx::None {
                    let rollback = self.rollback.clone();
                    let then = Box::new(step);
                    self.send_now(
                        physical,
                        Action::Execute {
                            statement: rollback,
                            binds: Vec::new(),
                        },
                        Step::Rollback {
                            conn: physical,
                            then,
                        },
                    );
                } else {
                    self.send_now(physical, action, step);
                }
            }
            action => {
                let physical = self.conns.alias.get(&conn).copied().unwrap_or(conn);
                self.send_now(physical, action, step);
            }
        }
    }

    /// The `ROLLBACK` before a release answered: the connection goes back to the pool, or
    /// closes when the rollback failed.
    pub(super) fn rolled_back(&mut self, conn: ConnId, then: Step, reply: &Reply<R>) {
        self.conns.sessions.remove(&conn);
        let action = match reply {
            Reply::Failed(_) => Action::Close,
            _ => Action::Release,
        };
        self.send_now(conn, action, then);
    }

    fn answer_later(&mut self, step: Step) {
        let id = self.next_command_id();
        self.pending.insert(id, step);
        self.conns.answered_here.push_back(id);
    }

    /// Answers the acquires and releases the broker took on itself (a kept connection), and
    /// whatever those answers start in turn.
    pub(super) fn answer_here(&mut self) {
        while let Some(id) = self.conns.answered_here.pop_front() {
            if let Some(step) = self.pending.remove(&id) {
                self.dispatch(step, Reply::Done);
            }
        }
    }

    /// Whether answers the broker owes itself wait.
    pub(super) fn owes_answers(&self) -> bool {
        !self.conns.answered_here.is_empty()
    }

    /// Hands a command to the adapter, on the adapter's connection `conn`.
    pub(super) fn send_now(&mut self, conn: ConnId, action: Action, step: Step) {
        let id = self.next_command_id();
        match &action {
            Action::Execute { statement, .. } => {
                if statement.kind == StatementKind::Begin {
                    let session = self.conns.session(conn);
                    session.unclean = true;
                }
                self.conns
                    .watched
                    .insert(id, (conn, Watch::Statement(statement.kind)));
            }
            Action::Lock { .. } | Action::Unlock { .. } => {
                self.conns.watched.insert(id, (conn, Watch::CustomLock));
            }
            Action::Acquire => {
                self.conns.acquiring.insert(id);
            }
            Action::Release | Action::Close => {}
        }
        self.pending.insert(id, step);
        if let Some(command) = self.gate.admit(Command { id, conn, action }) {
            self.commands.push_back(command);
        }
    }

    /// The reply to command `id` came: its session's state, and the commands the gate held
    /// back behind it.
    pub(super) fn command_answered(&mut self, id: CommandId, reply: &Reply<R>) {
        let released = self.gate.answered(id);
        self.commands.extend(released);
        self.conns.answered(id, reply);
    }

    /// Gives kept connections back to the pool: those kept longer than the linger, or all of
    /// them.
    pub(super) fn release_idle(&mut self, which: Sweep) {
        let now = self.now;
        let linger = self.conns.linger;
        let (expired, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.conns.idle)
            .into_iter()
            .partition(|(_, since)| which == Sweep::All || since.plus(linger) <= now);
        self.conns.idle = kept;
        for (conn, _) in expired {
            self.send_now(conn, Action::Release, Step::Orphan);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::rollback;
    use crate::{DbError, Dialect, ErrorKind, Statement, Value};

    fn statement(kind: StatementKind, sql: &str) -> Statement {
        let mut statement = rollback(Dialect::Postgres);
        statement.kind = kind;
        statement.sql = sql.into();
        statement
    }

    fn execute(statement: Statement) -> Action {
        Action::Execute {
            statement,
            binds: Vec::<Value>::new(),
        }
    }

    /// Runs `action` on the flow's connection `conn` and answers every command it hands out
    /// with `reply` (the first) and `Done` (the rest); answers the commands' actions.
    fn run(broker: &mut Broker<()>, conn: ConnId, action: Action, reply: Reply<()>) -> Vec<Action> {
        broker.send(conn, action, Step::Orphan);
        broker.answer_here();
        let mut seen = Vec::new();
        let mut reply = Some(reply);
        while let Some(command) = broker.poll_command() {
            seen.push(command.action.clone());
            let answer = reply.take().unwrap_or(Reply::Done);
            broker.handle_reply(command.id, answer, broker.now);
        }
        seen
    }

    fn begun(linger: Duration) -> (Broker<()>, ConnId) {
        let mut broker = Broker::new(Dialect::Postgres);
        broker.set_connection_linger(linger);
        let conn = broker.new_conn();
        assert_eq!(
            run(&mut broker, conn, Action::Acquire, Reply::Done),
            [Action::Acquire]
        );
        (broker, conn)
    }

    #[test]
    fn a_connection_given_back_inside_a_transaction_is_rolled_back_first() {
        let (mut broker, conn) = begun(CONNECTION_LINGER_FOR_TESTS);
        let begin = execute(statement(StatementKind::Begin, "BEGIN"));
        run(&mut broker, conn, begin, Reply::Done);
        let seen = run(&mut broker, conn, Action::Release, Reply::Done);
        assert_eq!(
            seen,
            [execute(rollback(Dialect::Postgres)), Action::Release],
            "rolled back, then given back to the pool, not kept"
        );
        assert_eq!(broker.held_connections(), 0);
    }

    #[test]
    fn a_connection_whose_rollback_fails_is_closed() {
        let (mut broker, conn) = begun(CONNECTION_LINGER_FOR_TESTS);
        let begin = execute(statement(StatementKind::Begin, "BEGIN"));
        run(&mut broker, conn, begin, Reply::Done);
        broker.send(conn, Action::Release, Step::Orphan);
        let rollback_command = broker.poll_command().expect("the rollback");
        assert_eq!(
            rollback_command.action,
            execute(rollback(Dialect::Postgres))
        );
        let failed = Reply::Failed(DbError::new(ErrorKind::Other, "no"));
        broker.handle_reply(rollback_command.id, failed, broker.now);
        let close = broker.poll_command().expect("the close");
        assert_eq!(close.action, Action::Close);
        assert!(broker.poll_command().is_none());
    }

    #[test]
    fn a_connection_a_failure_lost_is_closed_not_given_back() {
        let (mut broker, conn) = begun(Duration::ZERO);
        let select = execute(statement(StatementKind::Ping, "SELECT 1"));
        let lost = Reply::Failed(DbError::new(ErrorKind::ConnectionLost, "gone"));
        run(&mut broker, conn, select, lost);
        assert_eq!(
            run(&mut broker, conn, Action::Release, Reply::Done),
            [Action::Close]
        );
    }

    #[test]
    fn a_connection_whose_statement_failed_goes_back_to_the_pool_not_kept() {
        let (mut broker, conn) = begun(CONNECTION_LINGER_FOR_TESTS);
        let select = execute(statement(StatementKind::Ping, "SELECT 1"));
        let failed = Reply::Failed(DbError::new(ErrorKind::Other, "syntax"));
        run(&mut broker, conn, select, failed);
        assert_eq!(
            run(&mut broker, conn, Action::Release, Reply::Done),
            [Action::Release]
        );
        assert_eq!(broker.held_connections(), 0);
    }

    #[test]
    fn a_clean_connection_is_kept_and_committed_transactions_are_clean() {
        let (mut broker, conn) = begun(CONNECTION_LINGER_FOR_TESTS);
        for (kind, sql) in [
            (StatementKind::Begin, "BEGIN"),
            (StatementKind::Commit, "COMMIT"),
        ] {
            run(
                &mut broker,
                conn,
                execute(statement(kind, sql)),
                Reply::Done,
            );
        }
        assert!(run(&mut broker, conn, Action::Release, Reply::Done).is_empty());
        assert_eq!(broker.held_connections(), 1, "kept for the next flow");
        // The next acquire takes it without the pool.
        let next = broker.new_conn();
        assert!(run(&mut broker, next, Action::Acquire, Reply::Done).is_empty());
        let ping = execute(statement(StatementKind::Ping, "SELECT 1"));
        broker.send(next, ping, Step::Orphan);
        let command = broker.poll_command().expect("the ping");
        assert_eq!(command.conn, conn, "runs on the kept connection");
    }

    const CONNECTION_LINGER_FOR_TESTS: Duration = Duration::from_millis(5);
}

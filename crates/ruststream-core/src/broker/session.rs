//! The session check on PostgreSQL of the forms that hold session locks: each of the broker's
//! connections must be a server session of its own, since a session lock lives in the session
//! that took it. The advisory lock form holds a key's lock on the delivery's connection; the
//! row lock form with an attempt column holds its counts' marks on the count's connection
//! until the rows are locked. A pooler in transaction pooling (PgBouncer's `pool_mode =
//! transaction`) hands each transaction to whichever server connection is free, so a lock taken
//! through one client connection stays on a server session that other clients then use: the
//! advisory form stalls, and the marked rows are passed over for good.
//!
//! On an adapter whose prepared statements live in the server session
//! ([`Broker::set_prepared_statements`]), every form checks the same on PostgreSQL: through
//! transaction pooling such statements meet the sessions other clients use (a statement of the
//! same name already there, `42P05`; one of this connection's missing, `26000`), so the lease
//! form and the row lock form without an attempt column, which hold no session lock, fail
//! too, with [`CheckError::PreparedStatements`]. There the probe is a help, not a need: where
//! the second connection cannot be had (a pool of one), the start warns and goes on.
//!
//! The check takes a second connection `b` and runs a first statement on it
//! ([`session_ping`](crate::dialect::session_ping): an adapter that prepares its statements
//! prepares it, so a clash with another client's prepared statement fails here, before any lock
//! is taken), then takes a probe key's session lock on its connection `a`, then tries the same
//! key on `b`: directly, or through a pooler in session pooling, `b`
//! is another session and finds the key held; through transaction pooling `b` is handed the
//! server session `a` just gave back (PgBouncer reuses the last one first) and takes the key
//! again, since a session's locks are re-entrant. `a` then releases the key; an unlock that
//! finds no lock tells the same (`a` reached another session). A round that finds neither runs
//! again, [`ROUNDS`] times in all, since a pooler busy with other clients can pass one. Each
//! round also asks both connections their server process id (`pg_backend_pid()`): a
//! connection whose id changes, or two that share one, go through transaction pooling too.
//! Where `b` took the key it
//! releases it again, until the server says no lock is left, and the check fails with
//! [`CheckError::TransactionPooling`] (or [`CheckError::PreparedStatements`]). `b` is taken
//! before `a` locks, so no lock is held while the pool is waited on; where `b`'s try fails
//! (a prepared statement that clashed), `a` releases the key before it closes.

use crate::dialect::{Dialect, FormStatements, KeyLocks, Statement, session_ping, session_probe};
use crate::spec::Form;
use crate::types::{Action, CheckError, ConnId, Event, Reply, SubId};
use crate::value::Value;

use super::check::CheckStage;
use super::rows::{answer, first_int};
use super::{Broker, Step};

/// One of a session check's two connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    A,
    B,
}

/// How often `b` releases the probe key at most: once for its own lock, once for `a`'s where
/// `a`'s unlock reached yet another session.
const CLEANUPS: u8 = 2;

/// How many times the probe runs while it finds no pooler: a pooler serving other clients at
/// the same time may hand `b` another server session and `a` its own back in one round, so a
/// pooler escapes one round now and then, and seldom every one.
const ROUNDS: u8 = 4;

/// The session check of one subscription, while it runs: it owns its state and answers what
/// it decided ([`Do`]); the broker carries that out.
#[derive(Debug)]
pub(super) struct SessionCheck {
    /// The check's connection, and its second one.
    a: ConnId,
    b: ConnId,
    /// The probe key's lock argument, and its lock and unlock.
    probe: Value,
    try_lock: Statement,
    unlock: Statement,
    /// The form holds session locks: it cannot work through transaction pooling. Else the
    /// adapter's prepared statements are what cannot.
    needed: bool,
    /// A second connection reached the first one's session: a pooler in transaction pooling.
    pooled: bool,
    /// Rounds still to run while none has found a pooler yet.
    rounds: u8,
    /// The server process ids the two connections first answered.
    pids: (Option<i64>, Option<i64>),
}

/// What a session check decided, for the broker to carry out in order.
#[derive(Debug)]
pub(super) enum Do {
    /// Sends an action on a connection of the check; its reply comes back at the stage.
    Send(ConnId, Action, CheckStage),
    /// Sends an action whose reply nothing waits for.
    Orphan(ConnId, Action),
    /// A connection that was never had.
    Forget(ConnId),
    /// The check fails with this error.
    Fail(CheckError),
    /// The start warns.
    Warn(String),
    /// The session check is over.
    Ended,
}

impl SessionCheck {
    fn run(&self, conn: ConnId, statement: &Statement, stage: CheckStage) -> Do {
        let binds = statement.binds(|_| self.probe.clone());
        Do::Send(
            conn,
            Action::Execute {
                statement: statement.clone(),
                binds,
            },
            stage,
        )
    }

    fn ping(conn: ConnId, stage: CheckStage) -> Do {
        Do::Send(
            conn,
            Action::Execute {
                statement: session_ping(),
                binds: Vec::new(),
            },
            stage,
        )
    }

    /// A step answered: what the check does next. `table` and `form` name the subscription
    /// in a failure.
    pub(super) fn step<R>(
        &mut self,
        stage: CheckStage,
        reply: Reply<R>,
        table: &'static str,
        form: Form,
    ) -> Vec<Do> {
        let (a, b) = (self.a, self.b);
        let pinged = matches!(stage, CheckStage::SessionPing | CheckStage::SessionPingA);
        let (yes, pid) = if pinged {
            (false, first_int(reply))
        } else {
            (answer(reply), None)
        };
        let next = match stage {
            CheckStage::SessionAcquire => Self::ping(b, CheckStage::SessionPing),
            CheckStage::SessionPing => {
                self.note_pid(Side::B, pid);
                Self::ping(a, CheckStage::SessionPingA)
            }
            CheckStage::SessionPingA => {
                self.note_pid(Side::A, pid);
                self.run(a, &self.try_lock, CheckStage::SessionLock)
            }
            CheckStage::SessionLock if yes => self.run(b, &self.try_lock, CheckStage::SessionTry),
            // Someone holds the probe key: there is nothing to tell by.
            CheckStage::SessionLock => Do::Send(b, Action::Release, CheckStage::SessionRelease),
            CheckStage::SessionTry => {
                self.pooled |= yes;
                self.run(a, &self.unlock, CheckStage::SessionUnlock)
            }
            CheckStage::SessionUnlock => self.round_ended(yes),
            CheckStage::SessionCleanup { left } => self.cleanup(yes, left),
            CheckStage::SessionRelease => return self.released(table, form),
            _ => return Vec::new(),
        };
        vec![next]
    }

    /// `a` released the probe key (`unlocked`): where no pooler showed yet, another round
    /// from `b`'s first statement, else the cleanup of what the rounds left.
    fn round_ended(&mut self, unlocked: bool) -> Do {
        self.pooled |= !unlocked;
        if !self.pooled && self.rounds > 0 {
            self.rounds -= 1;
            return Self::ping(self.b, CheckStage::SessionPing);
        }
        self.cleanup(self.pooled, CLEANUPS)
    }

    /// Where `b` may hold the probe key (`again`) and tries are `left`: `b` releases it once
    /// more; else `b` goes back.
    fn cleanup(&self, again: bool, left: u8) -> Do {
        let b = self.b;
        if again && left > 0 {
            let stage = CheckStage::SessionCleanup { left: left - 1 };
            self.run(b, &self.unlock, stage)
        } else {
            Do::Send(b, Action::Release, CheckStage::SessionRelease)
        }
    }

    /// The second connection went back: the check fails where it found a pooler (the form
    /// `needed` sessions, or the adapter's statements live in them); `a` goes back.
    fn released(&self, table: &'static str, form: Form) -> Vec<Do> {
        let mut decided = vec![Do::Ended];
        if self.pooled {
            decided.push(Do::Fail(if self.needed {
                CheckError::TransactionPooling { table, form }
            } else {
                CheckError::PreparedStatements { table }
            }));
        }
        decided.push(Do::Send(self.a, Action::Release, CheckStage::Release));
        decided
    }

    /// A connection (`side`) answered its server process id: one that changed, or one the
    /// other connection has, is a pooler in transaction pooling.
    fn note_pid(&mut self, side: Side, pid: Option<i64>) {
        let Some(pid) = pid else {
            return;
        };
        let (mine, other) = match side {
            Side::A => (&mut self.pids.0, self.pids.1),
            Side::B => (&mut self.pids.1, self.pids.0),
        };
        let first = *mine.get_or_insert(pid);
        self.pooled |= first != pid || other == Some(pid);
    }

    // A step failed with `error`: the second connection closes (or, not yet taken, is
    // forgotten), and the check ends. Answers what the check's connection `a` does next:
    // [`SessionFailed::Close`] as after any failed step (the error counts, and `a` closes).
    //
    // - `b` could not be had where the form does not need the check: the start warns, and
    //   the check passes, `a` going back.
    // - `b`'s try failed while `a` holds the probe key: `a` releases it, then closes.
    pub(super) fn failed(
        &self,
        stage: CheckStage,
        error: &crate::DbError,
        table: &'static str,
    ) -> (Vec<Do>, SessionFailed) {
        let (a, b) = (self.a, self.b);
        let mut decided = vec![Do::Ended];
        let then = match stage {
            CheckStage::SessionAcquire => {
                decided.push(Do::Forget(b));
                if !self.needed {
                    decided.push(Do::Warn(format!(
                        "table `{table}`: the start could not take a second connection to check for a pooler in transaction pooling (PgBouncer's `pool_mode = transaction`), where the adapter's prepared statements fail; the check is skipped: {error}"
                    )));
                    decided.push(Do::Send(a, Action::Release, CheckStage::Release));
                    return (decided, SessionFailed::Handled);
                }
                SessionFailed::Close
            }
            CheckStage::SessionLock => {
                decided.push(Do::Orphan(b, Action::Release));
                SessionFailed::Close
            }
            CheckStage::SessionTry => {
                decided.push(Do::Orphan(b, Action::Close));
                let binds = self.unlock.binds(|_| self.probe.clone());
                SessionFailed::Then(Action::Execute {
                    statement: self.unlock.clone(),
                    binds,
                })
            }
            CheckStage::SessionPing
            | CheckStage::SessionPingA
            | CheckStage::SessionUnlock
            | CheckStage::SessionCleanup { .. } => {
                decided.push(Do::Orphan(b, Action::Close));
                SessionFailed::Close
            }
            _ => SessionFailed::Close,
        };
        (decided, then)
    }
}

impl<R> Broker<R> {
    // The lock and unlock of the session check, and whether the form needs it, where the
    // subscription has one: on PostgreSQL, the advisory lock form on the database's locks and
    // the row lock form with an attempt column, which need a server session of their own per
    // connection; and every form where the adapter's prepared statements live in the server
    // session.
    fn session_probe(&self, sub: SubId) -> Option<(Statement, Statement, bool)> {
        if self.dialect != Dialect::Postgres {
            return None;
        }
        let needed = match &self.subs[sub.0].statements.form {
            FormStatements::Advisory(st) => match &st.keys {
                KeyLocks::Database { try_lock, unlock } => Some((try_lock.clone(), unlock.clone())),
                KeyLocks::Registry | KeyLocks::Custom => None,
            },
            FormStatements::RowLock(st) => st.session_probe.clone(),
            FormStatements::Lease(_) => None,
        };
        match needed {
            Some((try_lock, unlock)) => Some((try_lock, unlock, true)),
            None if self.prepared_statements => {
                let (try_lock, unlock) = session_probe();
                Some((try_lock, unlock, false))
            }
            None => None,
        }
    }

    /// After the rest of the check on `a`: the session check where the subscription needs it
    /// (its second connection first), or the release of `a`.
    pub(super) fn start_session_check(&mut self, sub: SubId, a: ConnId) {
        let Some((try_lock, unlock, needed)) = self.session_probe(sub) else {
            return self.check_step(sub, a, Action::Release, CheckStage::Release);
        };
        let table = self.subs[sub.0].desc.table;
        let key = format!(
            "ruststream-session-check {table} {}.{}",
            self.now.micros(),
            sub.0
        );
        let probe = self.key_arg(sub, &key);
        let b = self.new_conn();
        self.subs[sub.0].check.session = Some(SessionCheck {
            a,
            b,
            probe,
            try_lock,
            unlock,
            needed,
            pooled: false,
            rounds: ROUNDS - 1,
            pids: (None, None),
        });
        self.check_step(sub, b, Action::Acquire, CheckStage::SessionAcquire);
    }

    /// A step of the session check answered.
    pub(super) fn on_session_check(&mut self, sub: SubId, stage: CheckStage, reply: Reply<R>) {
        let s = &mut self.subs[sub.0];
        let (table, form) = (s.desc.table, s.desc.form());
        let Some(session) = s.check.session.as_mut() else {
            return;
        };
        let decided = session.step(stage, reply, table, form);
        self.carry_out_session(sub, decided);
    }

    /// A step of the session check failed with `error`: what the check's connection `a`
    /// does next ([`SessionFailed`]).
    pub(super) fn session_check_failed(
        &mut self,
        sub: SubId,
        stage: CheckStage,
        error: &crate::DbError,
    ) -> SessionFailed {
        let s = &self.subs[sub.0];
        let Some(session) = s.check.session.as_ref() else {
            return SessionFailed::Close;
        };
        let (decided, then) = session.failed(stage, error, s.desc.table);
        self.carry_out_session(sub, decided);
        then
    }

    /// Carries out what the session check decided, in order.
    fn carry_out_session(&mut self, sub: SubId, decided: Vec<Do>) {
        for step in decided {
            match step {
                Do::Send(conn, action, stage) => self.check_step(sub, conn, action, stage),
                Do::Orphan(conn, action) => self.send(conn, action, Step::Orphan),
                Do::Forget(conn) => self.conns.forget(conn),
                Do::Fail(error) => self.check_failed(sub, error),
                Do::Warn(message) => self.events.push_back(Event::Warning {
                    sub,
                    message: message.into(),
                }),
                Do::Ended => self.subs[sub.0].check.session = None,
            }
        }
    }
}

/// What the check's connection does after a failed step of the session check
/// ([`SessionCheck::failed`]).
pub(super) enum SessionFailed {
    /// The failure is seen to: nothing counts it.
    Handled,
    /// The failure counts, and the check's connection closes.
    Close,
    /// The failure counts, and the check's connection runs this first
    /// ([`CheckStage::SessionAbandon`]), then closes.
    Then(Action),
}

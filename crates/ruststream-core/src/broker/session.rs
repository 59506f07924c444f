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

/// The session check's statements for a subscription, and whether its form needs it.
struct Probe {
    try_lock: Statement,
    unlock: Statement,
    /// The form holds session locks: it cannot work through transaction pooling. Else the
    /// adapter's prepared statements are what cannot.
    needed: bool,
}

impl<R> Broker<R> {
    // The lock and unlock of the session check, where the subscription needs it: on
    // PostgreSQL, the advisory lock form on the database's locks and the row lock form with an
    // attempt column, which need a server session of their own per connection; and every
    // form where the adapter's prepared statements live in the server session.
    fn session_probe(&self, sub: SubId) -> Option<Probe> {
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
            Some((try_lock, unlock)) => Some(Probe {
                try_lock,
                unlock,
                needed: true,
            }),
            None if self.prepared_statements => {
                let (try_lock, unlock) = session_probe();
                Some(Probe {
                    try_lock,
                    unlock,
                    needed: false,
                })
            }
            None => None,
        }
    }

    /// After the rest of the check on `a`: the session check where the subscription needs it
    /// (its second connection first), or the release of `a`.
    pub(super) fn start_session_check(&mut self, sub: SubId, a: ConnId) {
        if self.session_probe(sub).is_none() {
            return self.check_step(sub, a, Action::Release, CheckStage::Release);
        }
        let table = self.subs[sub.0].desc.table;
        let key = format!(
            "ruststream-session-check {table} {}.{}",
            self.now.micros(),
            sub.0
        );
        let probe = self.key_arg(sub, &key);
        let s = &mut self.subs[sub.0];
        s.check.probe = Some(probe);
        s.check.pooled = false;
        s.check.rounds = ROUNDS - 1;
        s.check.pids = (None, None);
        let b = self.new_conn();
        self.check_step(sub, b, Action::Acquire, CheckStage::SessionAcquire { b });
    }

    /// A step of the session check answered.
    pub(super) fn on_session_check(
        &mut self,
        sub: SubId,
        a: ConnId,
        stage: CheckStage,
        reply: Reply<R>,
    ) {
        let Some(Probe {
            try_lock,
            unlock,
            needed,
        }) = self.session_probe(sub)
        else {
            return;
        };
        let probe = self.subs[sub.0].check.probe.clone().unwrap_or(Value::Null);
        let pinged = matches!(
            stage,
            CheckStage::SessionPing { .. } | CheckStage::SessionPingA { .. }
        );
        let (yes, reply) = if pinged {
            (false, Some(reply))
        } else {
            (answer(reply), None)
        };
        let pid_of = |reply: Option<Reply<R>>| reply.and_then(first_int);
        match stage {
            CheckStage::SessionAcquire { b } => {
                let ping = session_ping();
                self.check_execute(sub, b, ping, Vec::new(), CheckStage::SessionPing { b });
            }
            CheckStage::SessionPing { b } => {
                self.note_pid(sub, Side::B, pid_of(reply));
                let ping = session_ping();
                self.check_execute(sub, a, ping, Vec::new(), CheckStage::SessionPingA { b });
            }
            CheckStage::SessionPingA { b } => {
                self.note_pid(sub, Side::A, pid_of(reply));
                let binds = try_lock.binds(|_| probe.clone());
                self.check_execute(sub, a, try_lock, binds, CheckStage::SessionLock { b });
            }
            CheckStage::SessionLock { b } if yes => {
                let binds = try_lock.binds(|_| probe.clone());
                self.check_execute(sub, b, try_lock, binds, CheckStage::SessionTry { b });
            }
            // Someone holds the probe key: there is nothing to tell by.
            CheckStage::SessionLock { b } => {
                self.check_step(sub, b, Action::Release, CheckStage::SessionRelease)
            }
            CheckStage::SessionTry { b } => {
                self.subs[sub.0].check.pooled |= yes;
                let binds = unlock.binds(|_| probe.clone());
                self.check_execute(sub, a, unlock, binds, CheckStage::SessionUnlock { b });
            }
            CheckStage::SessionUnlock { b } => self.session_round_ended(sub, b, unlock, probe, yes),
            CheckStage::SessionCleanup { b, left } => {
                self.session_cleanup(sub, b, unlock, probe, yes, left);
            }
            CheckStage::SessionRelease => self.session_released(sub, a, needed),
            // `a` released the key after `b` failed: it closes, as after any failed step.
            CheckStage::SessionAbandon => {
                self.subs[sub.0].check.probe = None;
                self.check_step(sub, a, Action::Close, CheckStage::Close);
            }
            _ => {}
        }
    }

    /// `a` released the probe key (`unlocked`): where no pooler showed yet, another round
    /// from `b`'s first statement, else the cleanup of what the rounds left.
    fn session_round_ended(
        &mut self,
        sub: SubId,
        b: ConnId,
        unlock: Statement,
        probe: Value,
        unlocked: bool,
    ) {
        let s = &mut self.subs[sub.0];
        s.check.pooled |= !unlocked;
        let pooled = s.check.pooled;
        if !pooled && s.check.rounds > 0 {
            s.check.rounds -= 1;
            let ping = session_ping();
            return self.check_execute(sub, b, ping, Vec::new(), CheckStage::SessionPing { b });
        }
        self.session_cleanup(sub, b, unlock, probe, pooled, CLEANUPS);
    }

    /// The session check's second connection went back: the check fails where it found a
    /// pooler (the form `needed` sessions, or the adapter's statements live in them).
    fn session_released(&mut self, sub: SubId, a: ConnId, needed: bool) {
        let s = &mut self.subs[sub.0];
        s.check.probe = None;
        if std::mem::take(&mut s.check.pooled) {
            let table = s.desc.table;
            let form = s.desc.form();
            let error = if needed {
                CheckError::TransactionPooling { table, form }
            } else {
                CheckError::PreparedStatements { table }
            };
            self.check_failed(sub, error);
        }
        self.check_step(sub, a, Action::Release, CheckStage::Release);
    }

    /// A session check's connection (`side`) answered its server process id: one that
    /// changed, or one the other connection has, is a pooler in transaction pooling.
    fn note_pid(&mut self, sub: SubId, side: Side, pid: Option<i64>) {
        let Some(pid) = pid else {
            return;
        };
        let check = &mut self.subs[sub.0].check;
        let (mine, other) = match side {
            Side::A => (&mut check.pids.0, check.pids.1),
            Side::B => (&mut check.pids.1, check.pids.0),
        };
        let first = *mine.get_or_insert(pid);
        check.pooled |= first != pid || other == Some(pid);
    }

    /// Where `b` may hold the probe key (`again`) and tries are `left`: `b` releases it once
    /// more; else `b` goes back.
    fn session_cleanup(
        &mut self,
        sub: SubId,
        b: ConnId,
        unlock: Statement,
        probe: Value,
        again: bool,
        left: u8,
    ) {
        if again && left > 0 {
            let binds = unlock.binds(|_| probe.clone());
            let stage = CheckStage::SessionCleanup { b, left: left - 1 };
            self.check_execute(sub, b, unlock, binds, stage);
        } else {
            self.check_step(sub, b, Action::Release, CheckStage::SessionRelease);
        }
    }

    // A step of the session check failed with `error`: the second connection closes (or, not
    // yet taken, is forgotten). Answers what the check's connection `a` does next: `None` as
    // after any failed step (the error counts, and `a` closes); `Some(next)` where the
    // session check has seen to it.
    //
    // - `b` could not be had where the form does not need the check: the start warns, and
    //   the check passes, `a` going back.
    // - `b`'s try failed while `a` holds the probe key: `a` releases it, then closes.
    pub(super) fn session_check_failed(
        &mut self,
        sub: SubId,
        a: ConnId,
        stage: CheckStage,
        error: &crate::DbError,
    ) -> SessionFailed {
        match stage {
            CheckStage::SessionAcquire { b } => {
                self.conns.forget(b);
                if self.session_probe(sub).is_some_and(|p| !p.needed) {
                    let s = &mut self.subs[sub.0];
                    s.check.probe = None;
                    let table = s.desc.table;
                    let message = format!(
                        "table `{table}`: the start could not take a second connection to check for a pooler in transaction pooling (PgBouncer's `pool_mode = transaction`), where the adapter's prepared statements fail; the check is skipped: {error}"
                    );
                    self.events.push_back(Event::Warning {
                        sub,
                        message: message.into(),
                    });
                    self.check_step(sub, a, Action::Release, CheckStage::Release);
                    return SessionFailed::Handled;
                }
            }
            CheckStage::SessionLock { b } => self.send(b, Action::Release, Step::Orphan),
            CheckStage::SessionPing { b } | CheckStage::SessionPingA { b } => {
                self.send(b, Action::Close, Step::Orphan)
            }
            CheckStage::SessionTry { b } => {
                self.send(b, Action::Close, Step::Orphan);
                if let Some(Probe { unlock, .. }) = self.session_probe(sub) {
                    let probe = self.subs[sub.0].check.probe.clone().unwrap_or(Value::Null);
                    let binds = unlock.binds(|_| probe.clone());
                    return SessionFailed::Then(Action::Execute {
                        statement: unlock,
                        binds,
                    });
                }
            }
            CheckStage::SessionUnlock { b } | CheckStage::SessionCleanup { b, .. } => {
                self.send(b, Action::Close, Step::Orphan)
            }
            _ => {}
        }
        self.subs[sub.0].check.probe = None;
        SessionFailed::Close
    }
}

/// What the check's connection does after a failed step of the session check
/// ([`Broker::session_check_failed`]).
pub(super) enum SessionFailed {
    /// The failure is seen to: nothing counts it.
    Handled,
    /// The failure counts, and the check's connection closes.
    Close,
    /// The failure counts, and the check's connection runs this first
    /// ([`CheckStage::SessionAbandon`]), then closes.
    Then(Action),
}

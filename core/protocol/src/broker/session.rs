//! The session check on PostgreSQL of the forms that hold session locks: each of the broker's
//! connections must be a server session of its own, since a session lock lives in the session
//! that took it. The advisory lock form holds a key's lock on the delivery's connection; the
//! row lock form with an attempt column holds its counts' marks on the count's connection
//! until the rows are locked. A pooler in transaction pooling (PgBouncer's `pool_mode =
//! transaction`) hands each transaction to whichever server connection is free, so a lock taken
//! through one client connection stays on a server session that other clients then use: the
//! advisory form stalls, and the marked rows are passed over for good.
//!
//! The check takes a probe key's session lock on its connection `a`, then tries the same key on
//! a second connection `b`: directly, or through a pooler in session pooling, `b` is another
//! session and finds the key held; through transaction pooling `b` is handed the server session
//! `a` just gave back (PgBouncer reuses the last one first) and takes the key again, since a
//! session's locks are re-entrant. `a` then releases the key; an unlock that finds no lock
//! tells the same (`a` reached another session). Where `b` took the key it releases it again,
//! until the server says no lock is left, and the check fails with
//! [`CheckError::TransactionPooling`].

use crate::dialect::{Dialect, FormStatements, KeyLocks, Statement};
use crate::types::{Action, CheckError, ConnId, Reply, SubId};
use crate::value::Value;

use super::check::CheckStage;
use super::rows::answer;
use super::{Broker, Step};

/// How often `b` releases the probe key at most: once for its own lock, once for `a`'s where
/// `a`'s unlock reached yet another session.
const CLEANUPS: u8 = 2;

impl<R> Broker<R> {
    /// The lock and unlock of the database's locks, where the subscription's form needs a
    /// server session of its own per connection: on PostgreSQL, the advisory lock form on the
    /// database's locks and the row lock form with an attempt column.
    fn session_locks(&self, sub: SubId) -> Option<(Statement, Statement)> {
        if self.dialect != Dialect::Postgres {
            return None;
        }
        match &self.subs[sub.0].statements.form {
            FormStatements::Advisory(st) => match &st.keys {
                KeyLocks::Database { try_lock, unlock } => Some((try_lock.clone(), unlock.clone())),
                KeyLocks::Registry | KeyLocks::Custom => None,
            },
            FormStatements::RowLock(st) => st.session_probe.clone(),
            FormStatements::Lease(_) => None,
        }
    }

    /// After the rest of the check on `a`: the session check where the form needs it, or the
    /// release of `a`.
    pub(super) fn start_session_check(&mut self, sub: SubId, a: ConnId) {
        let Some((try_lock, _)) = self.session_locks(sub) else {
            return self.check_step(sub, a, Action::Release, CheckStage::Release);
        };
        let table = self.subs[sub.0].desc.table;
        let key = format!(
            "ruststream-session-check {table} {}.{}",
            self.now.micros(),
            sub.0
        );
        let probe = self.key_arg(sub, &key);
        let s = &mut self.subs[sub.0];
        s.check.probe = Some(probe.clone());
        s.check.pooled = false;
        let binds = try_lock.binds(|_| probe.clone());
        self.check_execute(sub, a, try_lock, binds, CheckStage::SessionLock);
    }

    /// A step of the session check answered.
    pub(super) fn on_session_check(
        &mut self,
        sub: SubId,
        a: ConnId,
        stage: CheckStage,
        reply: Reply<R>,
    ) {
        let Some((try_lock, unlock)) = self.session_locks(sub) else {
            return;
        };
        let probe = self.subs[sub.0].check.probe.clone().unwrap_or(Value::Null);
        let yes = answer(reply);
        match stage {
            CheckStage::SessionLock if yes => {
                let b = self.new_conn();
                self.check_step(sub, b, Action::Acquire, CheckStage::SessionAcquire { b });
            }
            // Someone holds the probe key: there is nothing to tell by.
            CheckStage::SessionLock => {
                self.check_step(sub, a, Action::Release, CheckStage::Release)
            }
            CheckStage::SessionAcquire { b } => {
                let binds = try_lock.binds(|_| probe.clone());
                self.check_execute(sub, b, try_lock, binds, CheckStage::SessionTry { b });
            }
            CheckStage::SessionTry { b } => {
                self.subs[sub.0].check.pooled = yes;
                let binds = unlock.binds(|_| probe.clone());
                self.check_execute(sub, a, unlock, binds, CheckStage::SessionUnlock { b });
            }
            CheckStage::SessionUnlock { b } => {
                let s = &mut self.subs[sub.0];
                s.check.pooled |= !yes;
                let pooled = s.check.pooled;
                self.session_cleanup(sub, b, unlock, probe, pooled, CLEANUPS);
            }
            CheckStage::SessionCleanup { b, left } => {
                self.session_cleanup(sub, b, unlock, probe, yes, left);
            }
            CheckStage::SessionRelease => {
                let s = &mut self.subs[sub.0];
                s.check.probe = None;
                if std::mem::take(&mut s.check.pooled) {
                    let table = s.desc.table;
                    let form = s.desc.form();
                    self.check_failed(sub, CheckError::TransactionPooling { table, form });
                }
                self.check_step(sub, a, Action::Release, CheckStage::Release);
            }
            _ => {}
        }
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

    /// A step of the session check failed: the second connection closes (or, not yet taken,
    /// is forgotten); the check's connection is handled as after any failed step.
    pub(super) fn session_check_failed(&mut self, stage: CheckStage) {
        match stage {
            CheckStage::SessionAcquire { b } => self.conns.forget(b),
            CheckStage::SessionTry { b }
            | CheckStage::SessionUnlock { b }
            | CheckStage::SessionCleanup { b, .. } => self.send(b, Action::Close, Step::Orphan),
            _ => {}
        }
    }
}

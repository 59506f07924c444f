//! The check of a subscription's table before it claims: the table and every described column
//! exist, the database's name for lock names (MySQL, MariaDB), PostgreSQL's isolation level
//! for the row lock form, and, on PostgreSQL, that each connection is a server session of its
//! own ([`super::session`]): for the advisory lock form and the row lock form with an attempt
//! column, and for every form on an adapter whose prepared statements live in the server
//! session.
//!
//! The session check runs last, after the catalog's answers (columns, indexes, the database,
//! the isolation level): those are read-only and the same on any server session, so a pooler
//! cannot confuse them; where the adapter's prepared statements clash with another client's on
//! the way, the start fails at once naming transaction pooling ([`CheckError::Refused`]).

use crate::dialect::{Arg, Ddl, FormStatements, Statement};
use crate::types::{Action, CheckError, ConnId, Event, Reply, SubId};
use crate::value::{ErrorKind, Value};

use super::rows::first_text;
use super::session::SessionFailed;
use super::sub::SubState;
use super::{Broker, State, Step};

mod catalog;

use catalog::{Columns, Indexes};

/// Where a check is.
#[derive(Clone, Copy, Debug)]
pub(super) enum CheckStage {
    Acquire,
    Columns,
    /// `ensure_schema`: the schema's statements, `next` the index of the one that runs.
    Schema {
        next: usize,
    },
    Indexes,
    /// `ensure_schema`: the claim index created on a table that lacked it.
    CreateIndex,
    Database,
    Isolation,
    /// The session check ([`super::session`]): its second connection, `b`, acquired.
    SessionAcquire,
    /// The first statement on `b`, before any lock is taken.
    SessionPing,
    /// The same first statement on the check's connection: its server session's process id.
    SessionPingA,
    /// The probe key's lock on the check's connection.
    SessionLock,
    /// The probe key's lock tried on `b`.
    SessionTry,
    /// The probe key's unlock on the check's connection.
    SessionUnlock,
    /// The probe key's unlock on `b`, where `b` took it; `left` more tries.
    SessionCleanup {
        left: u8,
    },
    /// `b` goes back.
    SessionRelease,
    /// The probe key's unlock on the check's connection after a step on `b` failed; then the
    /// check's connection closes.
    SessionAbandon,
    Release,
    Close,
}

impl<R> Broker<R> {
    pub(super) fn start_check(&mut self, sub: SubId) {
        let conn = self.new_conn();
        let s = &mut self.subs[sub.0];
        s.check.conn = Some(conn);
        s.check.again_at = None;
        self.check_step(sub, conn, Action::Acquire, CheckStage::Acquire);
    }

    pub(super) fn check_step(
        &mut self,
        sub: SubId,
        conn: ConnId,
        action: Action,
        stage: CheckStage,
    ) {
        self.send(conn, action, Step::Check { sub, stage });
    }

    pub(super) fn check_execute(
        &mut self,
        sub: SubId,
        conn: ConnId,
        statement: Statement,
        binds: Vec<Value>,
        stage: CheckStage,
    ) {
        self.check_step(sub, conn, Action::Execute { statement, binds }, stage);
    }

    pub(super) fn on_check(&mut self, sub: SubId, stage: CheckStage, reply: Reply<R>) {
        let Some(conn) = self.subs[sub.0].check.conn else {
            return;
        };
        let table = self.subs[sub.0].desc.table;
        if let Reply::Failed(error) = reply {
            self.on_check_failed(sub, conn, stage, error);
            return;
        }
        match stage {
            CheckStage::Acquire => {
                let statement = self.subs[sub.0].statements.list_columns.clone();
                self.check_catalog(sub, conn, statement, CheckStage::Columns);
            }
            CheckStage::Schema { next } => self.schema_step(sub, conn, next),
            CheckStage::Indexes => self.on_indexes(sub, conn, reply),
            CheckStage::CreateIndex => self.check_next(sub, conn, CheckStage::Columns),
            CheckStage::Columns => self.on_columns(sub, conn, reply),
            CheckStage::Database => {
                self.subs[sub.0].check.database = first_text(reply);
                self.check_next(sub, conn, CheckStage::Database);
            }
            CheckStage::Isolation => {
                let level = first_text(reply).unwrap_or_default();
                if !level.eq_ignore_ascii_case("read committed")
                    && !level.eq_ignore_ascii_case("read uncommitted")
                {
                    self.check_failed(sub, CheckError::Isolation { table, level });
                    self.check_step(sub, conn, Action::Release, CheckStage::Release);
                    return;
                }
                self.check_next(sub, conn, CheckStage::Isolation);
            }
            CheckStage::SessionLock
            | CheckStage::SessionAcquire
            | CheckStage::SessionPing
            | CheckStage::SessionPingA
            | CheckStage::SessionTry
            | CheckStage::SessionUnlock
            | CheckStage::SessionCleanup { .. }
            | CheckStage::SessionRelease => self.on_session_check(sub, stage, reply),
            // `a` released the probe key after `b` failed: it closes, as after any failed step.
            CheckStage::SessionAbandon => {
                self.check_step(sub, conn, Action::Close, CheckStage::Close);
            }
            CheckStage::Release | CheckStage::Close => self.on_check_done(sub),
        }
    }

    fn on_check_failed(
        &mut self,
        sub: SubId,
        conn: ConnId,
        stage: CheckStage,
        error: crate::DbError,
    ) {
        if matches!(stage, CheckStage::Release | CheckStage::Close) {
            self.on_check_done(sub);
            return;
        }
        if matches!(stage, CheckStage::SessionAbandon) {
            // The failure that led here counted already.
            self.check_step(sub, conn, Action::Close, CheckStage::Close);
            return;
        }
        let then = match self.session_check_failed(sub, stage, &error) {
            SessionFailed::Handled => return,
            SessionFailed::Close => None,
            SessionFailed::Then(action) => Some(action),
        };
        let table = self.subs[sub.0].desc.table;
        if error.kind == ErrorKind::UndefinedTable {
            self.check_failed(sub, CheckError::MissingTable { table });
        } else if error.kind.is_permanent() {
            self.check_failed(sub, CheckError::Refused { table, error });
        } else {
            // A passing failure: the check runs again, later after each failure in a row.
            let s = &mut self.subs[sub.0];
            s.check.failures = s.check.failures.saturating_add(1);
            let again_in = start_retry_delay(s.check.failures);
            s.check.again_at = Some(self.now.plus(again_in));
            let failures = s.check.failures;
            self.events.push_back(Event::StartRetry {
                sub,
                error,
                failures,
                again_in,
            });
        }
        if matches!(stage, CheckStage::Acquire) {
            self.conns.forget(conn);
            self.subs[sub.0].check.conn = None;
        } else if let Some(action) = then {
            self.check_step(sub, conn, action, CheckStage::SessionAbandon);
        } else {
            self.check_step(sub, conn, Action::Close, CheckStage::Close);
        }
    }

    /// `ensure_schema`: runs the schema's statement `next`, or, after the last, lists the
    /// columns again.
    fn schema_step(&mut self, sub: SubId, conn: ConnId, next: usize) {
        let s = &self.subs[sub.0];
        let statements = Ddl::new(self.dialect, &s.desc).schema_statements();
        match statements.into_iter().nth(next) {
            Some(statement) => self.check_execute(
                sub,
                conn,
                statement,
                Vec::new(),
                CheckStage::Schema { next: next + 1 },
            ),
            None => {
                let statement = s.statements.list_columns.clone();
                self.check_catalog(sub, conn, statement, CheckStage::Columns);
            }
        }
    }

    /// The table's columns and their types, judged ([`catalog::columns`]): the schema created
    /// (`ensure_schema`), a failure, the indexes listed, or the next step.
    fn on_columns(&mut self, sub: SubId, conn: ConnId, reply: Reply<R>) {
        let s = &self.subs[sub.0];
        let verdict =
            catalog::columns(self.dialect, &s.desc, &s.options, s.check.schema_ran, reply);
        match verdict {
            Columns::CreateSchema => {
                self.subs[sub.0].check.schema_ran = true;
                self.schema_step(sub, conn, 0);
            }
            Columns::Fail(error) => {
                self.check_failed(sub, error);
                self.check_step(sub, conn, Action::Release, CheckStage::Release);
            }
            Columns::ListIndexes => {
                let statement = s.statements.list_indexes.clone();
                self.check_catalog(sub, conn, statement, CheckStage::Indexes);
            }
            Columns::Pass => self.check_next(sub, conn, CheckStage::Columns),
        }
    }

    /// The table's indexes, judged ([`catalog::indexes`]): the claim index created
    /// (`ensure_schema`), a failure, or a warning, and the next step.
    fn on_indexes(&mut self, sub: SubId, conn: ConnId, reply: Reply<R>) {
        let s = &self.subs[sub.0];
        match catalog::indexes(self.dialect, &s.desc, &s.options, reply) {
            Indexes::Create(create) => {
                self.check_execute(sub, conn, create, Vec::new(), CheckStage::CreateIndex);
            }
            Indexes::Fail(error) => {
                self.check_failed(sub, error);
                self.check_step(sub, conn, Action::Release, CheckStage::Release);
            }
            Indexes::Warn(message) => {
                self.events.push_back(Event::Warning {
                    sub,
                    message: message.into(),
                });
                self.check_next(sub, conn, CheckStage::Columns);
            }
            Indexes::Pass => self.check_next(sub, conn, CheckStage::Columns),
        }
    }

    /// Runs a statement of the catalog about the table (its columns, its indexes), bound to
    /// the table's name and schema.
    fn check_catalog(&mut self, sub: SubId, conn: ConnId, statement: Statement, next: CheckStage) {
        let table = self.subs[sub.0].desc.table;
        let (schema, name) = table.rsplit_once('.').unwrap_or(("", table));
        let binds = statement.binds(|arg| match arg {
            Arg::Schema => Value::Text(schema.to_owned()),
            _ => Value::Text(name.to_owned()),
        });
        self.check_execute(sub, conn, statement, binds, next);
    }

    pub(super) fn check_failed(&mut self, sub: SubId, error: CheckError) {
        self.subs[sub.0].state = SubState::Failed;
        self.events.push_back(Event::CheckFailed { sub, error });
    }

    /// The check's step after `after`: the database's name, the isolation level, then done.
    fn check_next(&mut self, sub: SubId, conn: ConnId, after: CheckStage) {
        let s = &self.subs[sub.0];
        let isolation = match &s.statements.form {
            FormStatements::RowLock(f) => f.isolation.clone(),
            FormStatements::Lease(_) | FormStatements::Advisory(_) => None,
        };
        let next = match (after, &s.statements.current_database, isolation) {
            (CheckStage::Columns, Some(database), _) => {
                Some((database.clone(), CheckStage::Database))
            }
            (CheckStage::Columns | CheckStage::Database, _, Some(isolation)) => {
                Some((isolation, CheckStage::Isolation))
            }
            _ => None,
        };
        match next {
            Some((statement, stage)) => self.check_execute(sub, conn, statement, Vec::new(), stage),
            None => self.start_session_check(sub, conn),
        }
    }

    fn on_check_done(&mut self, sub: SubId) {
        let now = self.now;
        let running = self.state == State::Running;
        let s = &mut self.subs[sub.0];
        s.check.conn = None;
        if s.state == SubState::Checking && s.check.again_at.is_none() && running {
            s.state = SubState::Ready;
            s.check.failures = 0;
            if !s.stopped {
                s.next_claim_at = Some(now);
            }
            if s.desc.failed_at.is_none() {
                let table = s.desc.table;
                let message = format!(
                    "table `{table}` keeps no failed rows: rows that fail are retried forever; add a failed_at column (`#[field(failed_at)]`, `.failed(..)`) to keep them"
                );
                self.events.push_back(Event::Warning {
                    sub,
                    message: message.into(),
                });
            }
            self.events.push_back(Event::Ready { sub });
        }
    }
}

/// The first wait of a check that failed on a passing error; each failure in a row doubles it,
/// up to [`START_RETRY_MAX`].
pub(super) const START_RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest wait between two tries of a check.
pub(super) const START_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a start waits after its `failures`th failure in a row on an error that may pass:
/// a second, doubling up to a minute.
pub fn start_retry_delay(failures: u32) -> std::time::Duration {
    let doublings = failures.saturating_sub(1).min(16);
    START_RETRY_FIRST
        .saturating_mul(1 << doublings)
        .min(START_RETRY_MAX)
}

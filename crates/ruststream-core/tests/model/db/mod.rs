//! An in-memory database that executes the core's statements by their kind and binds: rows,
//! row locks held by transactions, advisory locks held by sessions, a pool of sessions per
//! process, and sessions that die.

use std::collections::{BTreeMap, HashMap};

mod advisory;
mod failed;
mod lease;
mod row_lock;
mod schema;
mod settle;
mod tx;

use ruststream_core::keys::{mysql_lock_name, postgres_key_hash};
use ruststream_core::{
    Arg, DbError, Dialect, ErrorKind, KeyPart, Output, Reply, Row, Statement, StatementKind,
    TableDesc, Value,
};

pub type SessId = u64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DbRow {
    pub attempt: i64,
    pub locked_until: Option<i64>,
    pub processed_at: Option<i64>,
    pub due: i64,
    pub channel: i64,
    pub failed_at: Option<i64>,
    pub error: Option<String>,
}

#[derive(Debug, Default)]
pub struct Session {
    pub process: usize,
    pub alive: bool,
    pub idle: bool,
    pub in_tx: bool,
    undo: Vec<(i64, Option<DbRow>)>,
    /// What handlers wrote in this session's open transaction: the rows they handled.
    effects: Vec<i64>,
}

#[derive(Debug, Default)]
pub struct Db {
    pub rows: BTreeMap<i64, DbRow>,
    pub sessions: BTreeMap<SessId, Session>,
    /// Row locks: the row and the session whose transaction holds it.
    pub row_locks: BTreeMap<i64, SessId>,
    /// Advisory locks by the database's lock argument: the session and how many times it took it.
    pub advisory: BTreeMap<Value, (SessId, u32)>,
    /// The service's own locks, by key text, held by a session.
    pub custom: BTreeMap<String, SessId>,
    /// Row lock form: locks by id that found their row at another attempt than their count
    /// wrote (another count counted it between the count and the lock).
    pub superseded: u64,
    /// Row lock form: the marks of counted rows, by row, and the session that holds each
    /// (PostgreSQL's session advisory locks, MySQL's `GET_LOCK`).
    pub marks: BTreeMap<i64, SessId>,
    /// Locks of a counted row that found it held by another transaction.
    pub skipped_counted: u64,

    pub next_id: i64,
    next_session: SessId,
    /// Violations the database saw: a statement that would have waited for a lock.
    pub violations: Vec<String>,
    /// Statements run on a live session, per kind.
    pub executed: HashMap<StatementKind, usize>,
    /// The isolation level the server answers; read committed when `None`.
    pub isolation: Option<String>,
    /// Columns the table lacks: listing its columns leaves them out.
    pub missing_columns: Vec<&'static str>,
    /// The table does not exist: listing its columns finds none.
    pub missing_table: bool,
    /// The table has no index but its primary key: listing its indexes finds that one.
    pub missing_claim_index: bool,
    /// Column types the server answers instead of the dialect's usual ones.
    pub column_types: BTreeMap<&'static str, String>,
    /// Rows deleted by a statement whose transaction committed (or that ran alone).
    pub deleted: std::collections::BTreeSet<i64>,
    /// How often the effect a handler wrote for a row in a lent transaction committed.
    pub effects: BTreeMap<i64, u32>,
    /// The database's clock, in microseconds since the Unix epoch: every time a statement
    /// writes or compares is read from it, never from a bind.
    pub clock: i64,
    /// The leases extensions moved: from an expiry to the one that replaced it.
    pub moved: BTreeMap<(i64, i64), i64>,
}

pub fn key_text(channel: i64) -> String {
    format!("jobs-{channel}")
}

/// The `channel` of a row whose key column is `NULL`.
pub const NULL_CHANNEL: i64 = i64::MIN;

/// The key a row renders from the description's parts, as the database computes it to
/// compare keys: the literals, the row's id and its `channel` (a `NULL` one as empty text).
pub fn render_key(desc: &TableDesc, id: i64, row: &DbRow) -> String {
    let mut key = String::new();
    for part in desc.advisory().unwrap_or(&[]) {
        match part {
            KeyPart::Literal(text) => key.push_str(text),
            KeyPart::Column(column) if *column == desc.id.name => key.push_str(&id.to_string()),
            KeyPart::Column("channel") if row.channel == NULL_CHANNEL => {}
            KeyPart::Column("channel") => key.push_str(&row.channel.to_string()),
            KeyPart::Column(column) => panic!("the model has no key column `{column}`"),
        }
    }
    key
}

/// The key a candidate's row answers: `NULL` where a key column is.
fn candidate_key(desc: &TableDesc, id: i64, row: &DbRow) -> Value {
    let null = row.channel == NULL_CHANNEL
        && desc
            .advisory()
            .unwrap_or(&[])
            .contains(&KeyPart::Column("channel"));
    if null {
        Value::Null
    } else {
        Value::Text(render_key(desc, id, row))
    }
}

pub fn lock_arg(dialect: Dialect, key: &str) -> Value {
    match dialect {
        Dialect::Postgres => Value::Int(postgres_key_hash(key)),
        _ => Value::Text(mysql_lock_name("test", key)),
    }
}

impl Db {
    pub fn insert(&mut self, channel: i64, due: i64) -> i64 {
        self.next_id += 1;
        let id = self.next_id;
        self.rows.insert(
            id,
            DbRow {
                attempt: 0,
                locked_until: None,
                processed_at: None,
                due,
                failed_at: None,
                error: None,
                channel,
            },
        );
        id
    }

    /// A session for `process`: an idle one of its pool, or a new one.
    pub fn acquire(&mut self, process: usize) -> SessId {
        if let Some((&id, s)) = self
            .sessions
            .iter_mut()
            .find(|(_, s)| s.alive && s.idle && s.process == process)
        {
            s.idle = false;
            return id;
        }
        self.next_session += 1;
        let id = self.next_session;
        self.sessions.insert(
            id,
            Session {
                process,
                alive: true,
                idle: false,
                in_tx: false,
                undo: Vec::new(),
                effects: Vec::new(),
            },
        );
        id
    }

    pub fn release(&mut self, sess: SessId) {
        if let Some((row, _)) = self.marks.iter().find(|(_, holder)| **holder == sess) {
            self.violations.push(format!(
                "session {sess} went back to the pool holding the mark of row {row}"
            ));
        }
        let s = self.sessions.get_mut(&sess).expect("known session");
        if s.in_tx {
            self.violations.push(format!(
                "session {sess} went back to the pool inside a transaction"
            ));
        }
        s.idle = true;
    }

    /// The session ends: its transaction rolls back, its locks are released.
    pub fn kill(&mut self, sess: SessId) {
        let Some(s) = self.sessions.get(&sess) else {
            return;
        };
        if !s.alive {
            return;
        }
        self.rollback(sess);
        let s = self.sessions.get_mut(&sess).expect("known session");
        s.alive = false;
        self.advisory.retain(|_, (holder, _)| *holder != sess);
        self.custom.retain(|_, holder| *holder != sess);
        self.marks.retain(|_, holder| *holder != sess);
    }

    /// The mark of row `id` as the dialect's count reads it: PostgreSQL's second key (the
    /// model's hash of an id is the id), MySQL's lock name.
    pub fn mark_value(dialect: Dialect, id: i64) -> Value {
        if matches!(dialect, Dialect::MySql | Dialect::MariaDb) {
            Value::Text(format!("mark-{id}"))
        } else {
            Value::Int(id)
        }
    }

    fn mark_row(value: &Value) -> i64 {
        match value {
            Value::Int(id) => *id,
            Value::Text(name) => name
                .strip_prefix("mark-")
                .and_then(|id| id.parse().ok())
                .unwrap_or_else(|| panic!("not a mark: {name}")),
            other => panic!("not a mark: {other:?}"),
        }
    }

    /// Takes the mark of row `id` for `sess` without waiting; answers whether it did.
    fn try_mark(&mut self, sess: SessId, id: i64) -> bool {
        match self.marks.get(&id) {
            Some(holder) if *holder == sess => {
                self.violations
                    .push(format!("session {sess} marks row {id} a second time"));
                false
            }
            Some(_) => false,
            None => {
                self.marks.insert(id, sess);
                true
            }
        }
    }

    pub fn kill_process(&mut self, process: usize) {
        let ids: Vec<SessId> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.process == process && s.alive)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.kill(id);
        }
    }

    fn rollback(&mut self, sess: SessId) {
        let s = self.sessions.get_mut(&sess).expect("known session");
        let undo = std::mem::take(&mut s.undo);
        s.effects.clear();
        s.in_tx = false;
        for (id, before) in undo.into_iter().rev() {
            match before {
                Some(row) => {
                    self.deleted.remove(&id);
                    self.rows.insert(id, row);
                }
                None => {
                    self.rows.remove(&id);
                }
            }
        }
        self.row_locks.retain(|_, holder| *holder != sess);
    }

    fn commit(&mut self, sess: SessId) {
        let s = self.sessions.get_mut(&sess).expect("known session");
        s.undo.clear();
        s.in_tx = false;
        for row in std::mem::take(&mut s.effects) {
            *self.effects.entry(row).or_default() += 1;
        }
        self.row_locks.retain(|_, holder| *holder != sess);
    }

    /// A handler writes its effect for `row` in the transaction lent to it on `sess`: it
    /// commits with that transaction, and goes with a rollback or the session's end.
    pub fn write_effect(&mut self, sess: SessId, row: i64) {
        let s = self.sessions.get_mut(&sess).expect("known session");
        if !s.in_tx {
            self.violations.push(format!(
                "the connection lent for row {row} (session {sess}) is in no transaction"
            ));
        }
        s.effects.push(row);
    }

    fn claimable(&self, desc: &TableDesc, row: &DbRow, now: i64) -> bool {
        (desc.processed_at.is_none() || row.processed_at.is_none())
            && (desc.failed_at.is_none() || row.failed_at.is_none())
            && (desc.due.is_none() || row.due <= now)
            && (desc.locked_until().is_none() || row.locked_until.is_none_or(|t| t <= now))
    }

    /// Claimable rows in claim order, but those `passed` over: due, then id.
    fn ordered(&self, desc: &TableDesc, now: i64, passed: &[i64]) -> Vec<i64> {
        let mut ids: Vec<(i64, i64)> = self
            .rows
            .iter()
            .filter(|(id, r)| self.claimable(desc, r, now) && !passed.contains(id))
            .map(|(id, r)| (if desc.due.is_some() { r.due } else { 0 }, *id))
            .collect();
        ids.sort();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    fn locked_by_other(&self, id: i64, sess: SessId) -> bool {
        self.row_locks.get(&id).is_some_and(|h| *h != sess)
    }

    /// Changes a row inside the session's transaction, if one is open; a row another
    /// transaction holds would make the statement wait: that is a violation.
    fn write(&mut self, sess: SessId, id: i64, change: impl FnOnce(&mut Option<DbRow>)) {
        if self.locked_by_other(id, sess) {
            self.violations.push(format!(
                "session {sess} wrote row {id}, which session {} holds: the statement would wait",
                self.row_locks[&id]
            ));
        }
        let before = self.rows.get(&id).cloned();
        let mut after = before.clone();
        change(&mut after);
        let s = self.sessions.get_mut(&sess).expect("known session");
        if s.in_tx {
            s.undo.push((id, before));
        }
        match after {
            Some(row) => {
                self.rows.insert(id, row);
            }
            None => {
                if self.rows.remove(&id).is_some() {
                    self.deleted.insert(id);
                }
            }
        }
    }

    fn row_reply(&self, desc: &TableDesc, id: i64, output: &Output) -> Row<i64> {
        let row = &self.rows[&id];
        let columns = match output {
            Output::Rows { columns, .. } => columns.clone(),
            _ => unreachable!("a row statement reads rows"),
        };
        let values = columns
            .iter()
            .map(|c| {
                if c.name == desc.id.name {
                    Value::Int(id)
                } else if Some(c.name) == desc.attempt.map(|a| a.name) {
                    Value::Int(row.attempt)
                } else if c.name == ruststream_core::dialect::UNTIL {
                    row.locked_until.map_or(Value::Null, Value::Int)
                } else {
                    panic!("the model has no column `{}`", c.name)
                }
            })
            .collect();
        Row {
            values,
            raw: Some(id),
            unread: None,
        }
    }

    /// Runs a statement on a session.
    pub fn execute(
        &mut self,
        dialect: Dialect,
        desc: &TableDesc,
        sess: SessId,
        statement: &Statement,
        binds: &[Value],
    ) -> Reply<i64> {
        if !self.sessions.get(&sess).is_some_and(|s| s.alive) {
            return Reply::Failed(DbError::new(ErrorKind::ConnectionLost, "session is gone"));
        }
        assert_eq!(
            statement.args.len(),
            binds.len(),
            "{:?}: one bind per placeholder",
            statement.kind
        );
        let call = Call {
            dialect,
            desc,
            sess,
            statement,
            binds,
            // Every time is the database's own.
            clock: self.clock,
            in_tx: self.sessions[&sess].in_tx,
        };
        *self.executed.entry(statement.kind).or_default() += 1;
        self.dispatch(&call)
    }

    /// One function per statement kind.
    fn dispatch(&mut self, c: &Call<'_>) -> Reply<i64> {
        use StatementKind as K;
        match c.statement.kind {
            K::Begin => self.begin(c),
            K::Commit => self.commit_statement(c),
            K::Rollback => self.rollback_statement(c),
            K::ListIndexes => self.list_indexes(c),
            K::CreateSchema => self.create_schema(c),
            K::ListColumns => self.list_columns(c),
            K::CurrentDatabase => self.current_database(c),
            K::Isolation => self.isolation(c),
            K::LockRow => self.lock_row(c),
            K::CountRow | K::SelectRowId => self.count_rows(c),
            K::LockRowById | K::LockRowByIdUnmarking => self.lock_row_by_id(c),
            K::MarkRows(n) => self.mark_rows(c, n),
            K::UnmarkRows(n) => self.unmark_rows(c, n),
            K::CountAttempt => self.count_attempt(c),
            K::ClaimLease => self.claim_lease(c),
            K::SelectLease => self.select_lease(c),
            K::MarkLease(n) => self.mark_lease(c, n),
            K::ExtendLease | K::ReleaseLease => self.extend_or_release_lease(c),
            K::SettleLeases(rows) => self.settle_leases(c, rows),
            K::Candidates => self.candidates(c),
            K::TryLock => self.try_lock(c),
            K::Unlock => self.unlock(c),
            K::Take | K::TakeCount => self.take(c),
            K::ReadRow => self.read_row(c),
            K::Delete { fenced } | K::MarkProcessed { fenced } => self.settle_done(c, fenced),
            K::Fail { fenced } | K::RetryLater { fenced } => self.settle_failed(c, fenced),
            K::Stats => self.stats(c),
            K::ListFailed => self.list_failed(c),
            K::Redrive(_) | K::DeleteFailed(_) => self.redrive_or_delete_failed(c),
            K::Maintenance(kind) => panic!("the model runs no {kind:?}"),
            // The server session's process id.
            K::Ping => Reply::Rows(vec![Row::values(vec![Value::Int(c.sess as i64)])]),
            K::Notify | K::Savepoint | K::ReadCommitted => Reply::Done,
            K::RollbackToSavepoint => self.rollback_to_savepoint(c),
            K::Publish => self.publish(c),
        }
    }

    /// The service's own lock: a key held by a session, released when the session ends.
    pub fn custom_lock(&mut self, sess: SessId, key: &str) -> Reply<i64> {
        if !self.sessions.get(&sess).is_some_and(|s| s.alive) {
            return Reply::Failed(DbError::new(ErrorKind::ConnectionLost, "session is gone"));
        }
        match self.custom.get(key) {
            Some(_) => Reply::Bool(false),
            None => {
                self.custom.insert(key.to_owned(), sess);
                Reply::Bool(true)
            }
        }
    }

    /// The service's own unlock: whether the session held the key.
    pub fn custom_unlock(&mut self, sess: SessId, key: &str) -> Reply<i64> {
        if !self.sessions.get(&sess).is_some_and(|s| s.alive) {
            return Reply::Failed(DbError::new(ErrorKind::ConnectionLost, "session is gone"));
        }
        if self.custom.get(key) == Some(&sess) {
            self.custom.remove(key);
            Reply::Bool(true)
        } else {
            Reply::Bool(false)
        }
    }

    /// What a process still holds on the server: open transactions, row locks, advisory and
    /// custom locks.
    pub fn held_by(&self, process: usize) -> Vec<String> {
        let mine =
            |sess: &SessId| self.sessions[sess].process == process && self.sessions[sess].alive;
        let mut out = Vec::new();
        for (id, s) in &self.sessions {
            if s.process == process && s.alive && s.in_tx {
                out.push(format!("session {id} has an open transaction"));
            }
        }
        for (row, sess) in &self.row_locks {
            if mine(sess) {
                out.push(format!("session {sess} holds row {row}"));
            }
        }
        for (key, (sess, _)) in &self.advisory {
            if mine(sess) {
                out.push(format!("session {sess} holds advisory lock {key}"));
            }
        }
        for (key, sess) in &self.custom {
            if mine(sess) {
                out.push(format!("session {sess} holds custom lock {key}"));
            }
        }
        out
    }
}

/// A statement to run, with its binds, on a session: what each kind's function reads.
#[derive(Clone, Copy)]
struct Call<'a> {
    dialect: Dialect,
    desc: &'a TableDesc,
    sess: SessId,
    statement: &'a Statement,
    binds: &'a [Value],
    /// The database's clock when the statement runs.
    clock: i64,
    /// The session was in a transaction when the statement came.
    in_tx: bool,
}

impl Call<'_> {
    /// The value bound for `a`.
    fn arg(&self, a: Arg) -> Value {
        self.statement
            .args
            .iter()
            .position(|x| *x == a)
            .map(|i| self.binds[i].clone())
            .unwrap_or_else(|| panic!("{:?} has no argument {a:?}", self.statement.kind))
    }

    fn int(&self, a: Arg) -> i64 {
        self.arg(a).as_int().expect("an integer bind")
    }

    /// A claim from an id on: `id >= floor`.
    fn floor(&self) -> i64 {
        if self.statement.args.contains(&Arg::Floor) {
            self.int(Arg::Floor)
        } else {
            i64::MIN
        }
    }

    /// The rows a claim passes over: they wait their delay in the claiming process.
    fn passed(&self) -> Vec<i64> {
        self.statement
            .args
            .iter()
            .zip(self.binds)
            .filter(|(a, _)| matches!(a, Arg::ExcludedId(_)))
            .filter_map(|(_, v)| v.as_int())
            .collect()
    }
}

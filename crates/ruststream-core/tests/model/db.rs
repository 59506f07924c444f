//! An in-memory database that executes the core's statements by their kind and binds: rows,
//! row locks held by transactions, advisory locks held by sessions, a pool of sessions per
//! process, and sessions that die.

use std::collections::{BTreeMap, HashMap};

use ruststream_core::keys::{mysql_lock_name, postgres_key_hash};
use ruststream_core::{
    Arg, DbError, Dialect, ErrorKind, FailedRows, KeyPart, Output, Reply, Row, Statement,
    StatementKind, TableDesc, Value,
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

/// The type a server names a column of `desc` by, as the usual schema declares it: a time
/// role's time type, an integer otherwise.
fn default_type(dialect: Dialect, desc: &TableDesc, column: &str) -> &'static str {
    let time = [
        desc.locked_until,
        desc.due,
        desc.processed_at,
        desc.failed_at,
    ]
    .into_iter()
    .flatten()
    .any(|c| c.name == column);
    let payload = desc.payload.is_some_and(|c| c.name == column);
    let error = desc.error.is_some_and(|c| c.name == column);
    match (dialect, time, payload, error) {
        (Dialect::Sqlite, _, true, _) => "BLOB",
        (Dialect::Sqlite, _, _, true) => "TEXT",
        (Dialect::Sqlite, ..) => "INTEGER",
        (Dialect::Postgres, true, ..) => "timestamp with time zone",
        (Dialect::MySql | Dialect::MariaDb, true, ..) => "datetime(6)",
        (Dialect::Postgres, _, true, _) => "bytea",
        (Dialect::MySql | Dialect::MariaDb, _, true, _) => "longblob",
        (_, _, _, true) => "text",
        _ => "bigint",
    }
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
    for part in desc.advisory.unwrap_or(&[]) {
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
            .advisory
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
            && (desc.locked_until.is_none() || row.locked_until.is_none_or(|t| t <= now))
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
        let arg = |a: Arg| -> Value {
            statement
                .args
                .iter()
                .position(|x| *x == a)
                .map(|i| binds[i].clone())
                .unwrap_or_else(|| panic!("{:?} has no argument {a:?}", statement.kind))
        };
        let int = |a: Arg| arg(a).as_int().expect("an integer bind");
        // A claim from an id on: `id >= floor`.
        let floor = || {
            if statement.args.contains(&Arg::Floor) {
                int(Arg::Floor)
            } else {
                i64::MIN
            }
        };
        // Every time is the database's own.
        let clock = self.clock;
        // The rows a claim passes over: they wait their delay in the claiming process.
        let passed: Vec<i64> = statement
            .args
            .iter()
            .zip(binds)
            .filter(|(a, _)| matches!(a, Arg::ExcludedId(_)))
            .filter_map(|(_, v)| v.as_int())
            .collect();
        let in_tx = self.sessions[&sess].in_tx;
        *self.executed.entry(statement.kind).or_default() += 1;
        match statement.kind {
            StatementKind::Begin => {
                assert!(!in_tx, "BEGIN inside a transaction");
                self.sessions.get_mut(&sess).expect("session").in_tx = true;
                Reply::Done
            }
            StatementKind::Commit => {
                self.commit(sess);
                Reply::Done
            }
            StatementKind::Rollback => {
                self.rollback(sess);
                Reply::Done
            }
            StatementKind::ListIndexes => {
                let mut rows = vec![Row::values(vec![
                    Value::Text("pkey".into()),
                    Value::Text(desc.id.name.into()),
                ])];
                if !self.missing_claim_index {
                    let mut columns: Vec<&str> = desc.order.iter().map(|o| o.column).collect();
                    if columns.is_empty() {
                        columns.extend(desc.due.map(|c| c.name));
                    }
                    columns.push(desc.id.name);
                    rows.push(Row::values(vec![
                        Value::Text("claim".into()),
                        Value::Text(columns.join(",")),
                    ]));
                }
                Reply::Rows(rows)
            }
            StatementKind::CreateSchema => {
                self.missing_table = false;
                self.missing_claim_index = false;
                Reply::Done
            }
            StatementKind::ListColumns if self.missing_table => Reply::Rows(Vec::new()),
            StatementKind::ListColumns => Reply::Rows(
                desc.columns()
                    .into_iter()
                    .filter(|c| !self.missing_columns.contains(c))
                    .map(|c| {
                        let ty = self
                            .column_types
                            .get(c)
                            .cloned()
                            .unwrap_or_else(|| default_type(dialect, desc, c).to_owned());
                        Row::values(vec![Value::Text(c.to_owned()), Value::Text(ty)])
                    })
                    .collect(),
            ),
            StatementKind::CurrentDatabase => {
                Reply::Rows(vec![Row::values(vec![Value::Text("test".into())])])
            }
            StatementKind::Isolation => Reply::Rows(vec![Row::values(vec![Value::Text(
                self.isolation
                    .clone()
                    .unwrap_or_else(|| "read committed".into()),
            )])]),
            StatementKind::LockRow => {
                assert!(in_tx, "FOR UPDATE outside a transaction");
                let now = clock;
                let id = self
                    .ordered(desc, now, &passed)
                    .into_iter()
                    .find(|id| !self.locked_by_other(*id, sess));
                match id {
                    Some(id) => {
                        self.row_locks.insert(id, sess);
                        Reply::Rows(vec![self.row_reply(desc, id, &statement.output)])
                    }
                    None => Reply::Rows(Vec::new()),
                }
            }
            StatementKind::CountRow | StatementKind::SelectRowId => {
                let now = clock;
                let limit = usize::try_from(int(Arg::Limit)).expect("a limit");
                assert!(limit >= 1, "a count of no rows");
                let floor = floor();
                // MySQL's select leaves out the rows another count marked (`IS_FREE_LOCK`)
                // before its LIMIT; PostgreSQL's CTE locks them and passes them over after.
                let select = statement.kind == StatementKind::SelectRowId;
                let ids: Vec<i64> = self
                    .ordered(desc, now, &passed)
                    .into_iter()
                    .filter(|id| *id >= floor && !self.locked_by_other(*id, sess))
                    .filter(|id| !select || !self.marks.contains_key(id))
                    .take(limit)
                    .collect();
                let mut rows = Vec::new();
                let mut counted = 0;
                for id in ids {
                    let mut attempt = Value::Int(self.rows[&id].attempt);
                    if statement.kind == StatementKind::CountRow {
                        assert!(!in_tx, "the count commits on its own");
                        // The count's CTE locks the rows, then counts the first `take` of
                        // them whose marks it takes; the others come back uncounted.
                        let take = usize::try_from(int(Arg::Take)).expect("a take");
                        if counted < take && self.try_mark(sess, id) {
                            counted += 1;
                            self.write(sess, id, |r| r.as_mut().expect("row").attempt += 1);
                            attempt = Value::Int(self.rows[&id].attempt);
                        } else {
                            attempt = Value::Null;
                        }
                    } else {
                        assert!(in_tx, "FOR UPDATE outside a transaction");
                        self.row_locks.insert(id, sess);
                    }
                    rows.push(Row::values(vec![
                        Value::Int(id),
                        attempt,
                        Self::mark_value(dialect, id),
                    ]));
                }
                Reply::Rows(rows)
            }
            StatementKind::LockRowById | StatementKind::LockRowByIdUnmarking => {
                assert!(in_tx, "FOR UPDATE outside a transaction");
                let id = int(Arg::Id);
                let now = clock;
                let attempt = int(Arg::Attempt);
                // `SKIP LOCKED`: a row another transaction holds (a count that looks at it) is
                // passed over, and the claim tries again.
                if self.locked_by_other(id, sess) {
                    self.skipped_counted += 1;
                    return Reply::Rows(Vec::new());
                }
                let lockable = self
                    .rows
                    .get(&id)
                    .is_some_and(|r| self.claimable(desc, r, now) && r.attempt == attempt);
                if !lockable {
                    if self.rows.get(&id).is_some_and(|r| r.attempt != attempt) {
                        self.superseded += 1;
                    }
                    return Reply::Rows(Vec::new());
                }
                self.row_locks.insert(id, sess);
                if statement.kind == StatementKind::LockRowByIdUnmarking {
                    // The lock took the row: the select list releases the count's mark.
                    let marked = Self::mark_row(&arg(Arg::MarkAt(0)));
                    if self.marks.get(&marked) == Some(&sess) {
                        self.marks.remove(&marked);
                    } else {
                        self.violations.push(format!(
                            "session {sess} releases the mark of row {marked} it does not hold"
                        ));
                    }
                }
                Reply::Rows(vec![self.row_reply(desc, id, &statement.output)])
            }
            StatementKind::MarkRows(n) => {
                let rows = (0..n)
                    .map(|i| {
                        let id = Self::mark_row(&arg(Arg::MarkAt(i)));
                        let taken = self.try_mark(sess, id);
                        Row::values(vec![Value::Int(i as i64), Value::Bool(taken)])
                    })
                    .collect();
                Reply::Rows(rows)
            }
            StatementKind::UnmarkRows(n) => {
                for i in 0..n {
                    let id = Self::mark_row(&arg(Arg::MarkAt(i)));
                    if self.marks.get(&id) == Some(&sess) {
                        self.marks.remove(&id);
                    } else {
                        self.violations.push(format!(
                            "session {sess} releases the mark of row {id} it does not hold"
                        ));
                    }
                }
                Reply::Done
            }
            StatementKind::CountAttempt => {
                let mut affected = 0;
                let ids = statement
                    .args
                    .iter()
                    .filter(|a| matches!(a, Arg::IdAt(_)))
                    .count();
                for i in 0..ids {
                    let id = int(Arg::IdAt(i));
                    if self.rows.contains_key(&id) {
                        self.write(sess, id, |r| r.as_mut().expect("row").attempt += 1);
                        affected += 1;
                    }
                }
                Reply::Affected(affected)
            }
            StatementKind::ClaimLease => {
                let now = clock;
                let until = clock + int(Arg::LeaseFor);
                let limit = usize::try_from(int(Arg::Limit)).expect("a limit");
                let floor = floor();
                let ids: Vec<i64> = self
                    .ordered(desc, now, &passed)
                    .into_iter()
                    .filter(|id| *id >= floor && !self.locked_by_other(*id, sess))
                    .take(limit)
                    .collect();
                let mut rows = Vec::new();
                for id in ids {
                    let counts = desc.attempt.is_some();
                    self.write(sess, id, |r| {
                        let r = r.as_mut().expect("row");
                        r.locked_until = Some(until);
                        if counts {
                            r.attempt += 1;
                        }
                    });
                    rows.push(self.row_reply(desc, id, &statement.output));
                }
                Reply::Rows(rows)
            }
            StatementKind::SelectLease => {
                assert!(in_tx, "FOR UPDATE outside a transaction");
                let now = clock;
                let limit = usize::try_from(int(Arg::Limit)).expect("a limit");
                let ids: Vec<i64> = self
                    .ordered(desc, now, &passed)
                    .into_iter()
                    .filter(|id| !self.locked_by_other(*id, sess))
                    .take(limit)
                    .collect();
                let mut rows = Vec::new();
                // The expiry the leases get, read with the rows.
                let until = clock + int(Arg::LeaseFor);
                for id in ids {
                    self.row_locks.insert(id, sess);
                    let mut row = self.row_reply(desc, id, &statement.output);
                    if let Some(last) = row.values.last_mut() {
                        *last = Value::Int(until);
                    }
                    rows.push(row);
                }
                Reply::Rows(rows)
            }
            StatementKind::MarkLease(n) => {
                let until = int(Arg::Fence);
                let mut affected = 0;
                for i in 0..n {
                    let id = int(Arg::IdAt(i));
                    if self.rows.contains_key(&id) {
                        let counts = desc.attempt.is_some();
                        self.write(sess, id, |r| {
                            let r = r.as_mut().expect("row");
                            r.locked_until = Some(until);
                            if counts {
                                r.attempt += 1;
                            }
                        });
                        affected += 1;
                    }
                }
                Reply::Affected(affected)
            }
            StatementKind::ExtendLease | StatementKind::ReleaseLease => {
                let id = int(Arg::Id);
                let fence = int(Arg::Fence);
                let holds = self
                    .rows
                    .get(&id)
                    .is_some_and(|r| r.locked_until == Some(fence));
                if !holds || self.locked_by_other(id, sess) {
                    return Reply::Affected(0);
                }
                let until = if statement.kind == StatementKind::ExtendLease {
                    let until = fence + int(Arg::Extend);
                    self.moved.insert((id, fence), until);
                    Some(until)
                } else {
                    None
                };
                self.write(sess, id, |r| r.as_mut().expect("row").locked_until = until);
                Reply::Affected(1)
            }
            StatementKind::Candidates => {
                let now = clock;
                let limit = usize::try_from(int(Arg::Limit)).expect("a limit");
                // The keys the claim passes over: none of their rows is a candidate.
                let excluded: Vec<&Value> = statement
                    .args
                    .iter()
                    .zip(binds)
                    .filter(|(a, _)| matches!(a, Arg::ExcludedKey(_)))
                    .map(|(_, v)| v)
                    .collect();
                Reply::Rows(
                    self.ordered(desc, now, &passed)
                        .into_iter()
                        .filter(|id| {
                            let key = Value::Text(render_key(desc, *id, &self.rows[id]));
                            *id >= floor() && !excluded.contains(&&key)
                        })
                        .take(limit)
                        .map(|id| {
                            Row::values(vec![
                                Value::Int(id),
                                candidate_key(desc, id, &self.rows[&id]),
                            ])
                        })
                        .collect(),
                )
            }
            StatementKind::TryLock => {
                let key = arg(Arg::Key);
                let taken = match self.advisory.get_mut(&key) {
                    Some((holder, n)) if *holder == sess => {
                        *n += 1;
                        true
                    }
                    Some(_) => false,
                    None => {
                        self.advisory.insert(key, (sess, 1));
                        true
                    }
                };
                let _ = dialect;
                Reply::Rows(vec![Row::values(vec![Value::Bool(taken)])])
            }
            StatementKind::Unlock => {
                let key = arg(Arg::Key);
                let released = match self.advisory.get_mut(&key) {
                    Some((holder, n)) if *holder == sess => {
                        *n -= 1;
                        if *n == 0 {
                            self.advisory.remove(&key);
                        }
                        true
                    }
                    _ => false,
                };
                Reply::Rows(vec![Row::values(vec![Value::Bool(released)])])
            }
            StatementKind::Take | StatementKind::TakeCount => {
                let id = int(Arg::Id);
                let now = clock;
                let claimable = self
                    .rows
                    .get(&id)
                    .is_some_and(|r| self.claimable(desc, r, now));
                if !claimable {
                    return if statement.kind == StatementKind::Take {
                        Reply::Rows(Vec::new())
                    } else {
                        Reply::Affected(0)
                    };
                }
                if desc.attempt.is_some() {
                    self.write(sess, id, |r| r.as_mut().expect("row").attempt += 1);
                }
                if statement.kind == StatementKind::Take {
                    Reply::Rows(vec![self.row_reply(desc, id, &statement.output)])
                } else {
                    Reply::Affected(1)
                }
            }
            StatementKind::ReadRow => {
                let id = int(Arg::Id);
                if self.rows.contains_key(&id) {
                    Reply::Rows(vec![self.row_reply(desc, id, &statement.output)])
                } else {
                    Reply::Rows(Vec::new())
                }
            }
            StatementKind::Delete { fenced } | StatementKind::MarkProcessed { fenced } => {
                let id = int(Arg::Id);
                let Some(row) = self.rows.get(&id) else {
                    return Reply::Affected(0);
                };
                if fenced && row.locked_until != Some(int(Arg::Fence)) {
                    return Reply::Affected(0);
                }
                if fenced && self.locked_by_other(id, sess) {
                    return Reply::Affected(0);
                }
                if matches!(statement.kind, StatementKind::Delete { .. }) {
                    self.write(sess, id, |r| *r = None);
                } else {
                    let now = clock;
                    let lease = desc.locked_until.is_some();
                    self.write(sess, id, |r| {
                        let r = r.as_mut().expect("row");
                        r.processed_at = Some(now);
                        if lease {
                            r.locked_until = None;
                        }
                    });
                }
                Reply::Affected(1)
            }
            StatementKind::Fail { fenced } | StatementKind::RetryLater { fenced } => {
                let id = int(Arg::Id);
                let Some(row) = self.rows.get(&id) else {
                    return Reply::Affected(0);
                };
                if fenced && row.locked_until != Some(int(Arg::Fence)) {
                    return Reply::Affected(0);
                }
                if fenced && self.locked_by_other(id, sess) {
                    return Reply::Affected(0);
                }
                let error = statement
                    .args
                    .contains(&Arg::Error)
                    .then(|| match arg(Arg::Error) {
                        Value::Text(t) => Some(t),
                        _ => None,
                    })
                    .flatten();
                let fail = matches!(statement.kind, StatementKind::Fail { .. });
                let now = clock;
                let retry_at = (!fail && (desc.due.is_some() || desc.locked_until.is_some()))
                    .then(|| clock + int(Arg::RetryIn));
                let (due, lease) = (desc.due.is_some(), desc.locked_until.is_some());
                self.write(sess, id, |r| {
                    let r = r.as_mut().expect("row");
                    if let Some(error) = error {
                        r.error = Some(error);
                    }
                    if fail {
                        r.failed_at = Some(now);
                        r.locked_until = None;
                    } else if let Some(at) = retry_at {
                        if due {
                            r.due = at;
                            r.locked_until = None;
                        } else if lease {
                            r.locked_until = Some(at);
                        }
                    }
                });
                Reply::Affected(1)
            }
            StatementKind::Stats => {
                let now = clock;
                let open = |r: &DbRow| {
                    (desc.processed_at.is_none() || r.processed_at.is_none())
                        && (desc.failed_at.is_none() || r.failed_at.is_none())
                };
                let leased = |r: &DbRow| r.locked_until.is_some_and(|t| t > now);
                let due_now = |r: &DbRow| desc.due.is_none() || r.due <= now;
                let count = |f: &dyn Fn(&DbRow) -> bool| {
                    Value::Int(self.rows.values().filter(|r| f(r)).count() as i64)
                };
                let or_null = |present: bool, v: Value| if present { v } else { Value::Null };
                let oldest = self
                    .rows
                    .values()
                    .filter(|r| open(r) && due_now(r) && !leased(r))
                    .map(|r| r.due)
                    .min();
                Reply::Rows(vec![Row::values(vec![
                    count(&|r| open(r) && due_now(r) && !leased(r)),
                    if desc.due.is_some() {
                        count(&|r| open(r) && !due_now(r))
                    } else {
                        Value::Int(0)
                    },
                    or_null(
                        desc.locked_until.is_some(),
                        count(&|r| open(r) && leased(r)),
                    ),
                    or_null(desc.failed_at.is_some(), count(&|r| r.failed_at.is_some())),
                    or_null(
                        desc.processed_at.is_some(),
                        count(&|r| r.processed_at.is_some()),
                    ),
                    match (desc.due, oldest) {
                        (Some(_), Some(t)) => Value::Int(t),
                        _ => Value::Null,
                    },
                    Value::Int(clock),
                ])])
            }
            StatementKind::ListFailed => {
                let floor = statement
                    .args
                    .iter()
                    .position(|x| *x == Arg::Floor)
                    .and_then(|i| binds[i].as_int());
                let only = statement
                    .args
                    .iter()
                    .position(|x| *x == Arg::Id)
                    .and_then(|i| binds[i].as_int());
                let limit = statement
                    .args
                    .iter()
                    .position(|x| *x == Arg::Limit)
                    .and_then(|i| binds[i].as_int())
                    .unwrap_or(i64::MAX);
                Reply::Rows(
                    self.rows
                        .iter()
                        .filter(|(id, r)| {
                            r.failed_at.is_some()
                                && floor.is_none_or(|f| **id > f)
                                && only.is_none_or(|o| **id == o)
                        })
                        .take(usize::try_from(limit).unwrap_or(usize::MAX))
                        .map(|(id, r)| {
                            Row::values(vec![
                                Value::Int(*id),
                                Value::Int(r.attempt),
                                r.error.clone().map_or(Value::Null, Value::Text),
                                r.failed_at.map_or(Value::Null, Value::Int),
                                Value::Bytes(format!("{{\"row\":{id}}}").into_bytes()),
                            ])
                        })
                        .collect(),
                )
            }
            StatementKind::Redrive(_) | StatementKind::DeleteFailed(_) => {
                let which = match statement.kind {
                    StatementKind::Redrive(w) | StatementKind::DeleteFailed(w) => w,
                    _ => unreachable!(),
                };
                let picked: Option<Vec<i64>> = match which {
                    FailedRows::Ids(n) => Some((0..n).map(|i| int(Arg::IdAt(i))).collect()),
                    _ => None,
                };
                let contains: Option<String> = match which {
                    FailedRows::ErrorContains => match arg(Arg::ErrorLike) {
                        Value::Text(t) => Some(
                            t.trim_matches('%')
                                .replace("!%", "%")
                                .replace("!_", "_")
                                .replace("!!", "!"),
                        ),
                        _ => None,
                    },
                    _ => None,
                };
                let ids: Vec<i64> = self
                    .rows
                    .iter()
                    .filter(|(_, r)| r.failed_at.is_some())
                    .filter(|(id, _)| picked.as_ref().is_none_or(|p| p.contains(id)))
                    .filter(|(_, r)| {
                        contains.as_ref().is_none_or(|c| {
                            r.error.as_deref().is_some_and(|e| e.contains(c.as_str()))
                        })
                    })
                    .map(|(id, _)| *id)
                    .collect();
                let redrive = matches!(statement.kind, StatementKind::Redrive(_));
                let now = if redrive && desc.due.is_some() {
                    clock
                } else {
                    0
                };
                for &id in &ids {
                    self.write(sess, id, |r| {
                        if redrive {
                            let r = r.as_mut().expect("row");
                            r.failed_at = None;
                            r.error = None;
                            r.attempt = 0;
                            r.locked_until = None;
                            r.due = now;
                        } else {
                            *r = None;
                        }
                    });
                }
                Reply::Affected(ids.len() as u64)
            }
            StatementKind::SettleLeases(rows) => {
                let mut settled = Vec::new();
                for i in 0..rows {
                    let id = int(Arg::IdAt(i));
                    let holds = self
                        .rows
                        .get(&id)
                        .is_some_and(|row| row.locked_until == Some(int(Arg::FenceAt(i))));
                    if !holds || self.locked_by_other(id, sess) {
                        continue;
                    }
                    if desc.processed_at.is_none() {
                        self.write(sess, id, |r| *r = None);
                    } else {
                        let now = clock;
                        self.write(sess, id, |r| {
                            let r = r.as_mut().expect("row");
                            r.processed_at = Some(now);
                            r.locked_until = None;
                        });
                    }
                    settled.push(Row::values(vec![Value::Int(id)]));
                }
                Reply::Rows(settled)
            }
            StatementKind::Maintenance(kind) => panic!("the model runs no {kind:?}"),
            // The server session's process id.
            StatementKind::Ping => Reply::Rows(vec![Row::values(vec![Value::Int(sess as i64)])]),
            StatementKind::Notify | StatementKind::Savepoint | StatementKind::ReadCommitted => {
                Reply::Done
            }
            StatementKind::RollbackToSavepoint => {
                // The savepoint is marked just before the transaction is lent: what the
                // handler wrote goes.
                self.sessions
                    .get_mut(&sess)
                    .expect("session")
                    .effects
                    .clear();
                Reply::Done
            }
            StatementKind::Publish => {
                // One row per run of the row's arguments: a batch repeats them.
                let per_row = statement
                    .args
                    .iter()
                    .skip(1)
                    .position(|x| Some(x) == statement.args.first())
                    .map_or(statement.args.len(), |i| i + 1)
                    .max(1);
                let rows = (binds.len() / per_row).max(1);
                for row in 0..rows {
                    let args = &statement.args[row * per_row..(row + 1) * per_row];
                    let binds = &binds[row * per_row..(row + 1) * per_row];
                    let of = |a: Arg| args.iter().position(|x| *x == a).map(|i| &binds[i]);
                    let channel = of(Arg::Column("channel"))
                        .and_then(Value::as_int)
                        .unwrap_or(0);
                    // A row published without a due time is due at the database's time.
                    let due = if desc.due.is_some() {
                        of(Arg::Due).and_then(Value::as_int).unwrap_or(clock)
                    } else {
                        0
                    };
                    let id = self.insert(channel, due);
                    if in_tx {
                        self.sessions
                            .get_mut(&sess)
                            .expect("session")
                            .undo
                            .push((id, None));
                    }
                }
                Reply::Affected(rows as u64)
            }
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

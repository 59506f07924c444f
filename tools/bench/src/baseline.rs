//! The raw SQL baseline: the statements the core renders (`Statements::render`), run directly
//! on the driver by W tasks, each holding one connection and doing claim → take → settle in a
//! loop, with no framework.
//!
//! Each task claims one row at a time. What it runs, per form and dialect:
//!
//! - row lock, PostgreSQL: `count_row` (counts and commits the attempt under the row's mark),
//!   `BEGIN`, `lock_row_by_id_unmarking` (the lock, which releases the mark), the handler,
//!   `settle`, `COMMIT`. MySQL/MariaDB: `SET TRANSACTION ISOLATION LEVEL READ COMMITTED`,
//!   `START TRANSACTION`, `select_row_id`, `mark_rows`, `count_attempt`, `COMMIT`, `START
//!   TRANSACTION`, `lock_row_by_id_unmarking`, the handler, `settle`, `COMMIT`. A lock that took
//!   no row releases the mark with `unmark_rows`. The count and the lock run under a mutex
//!   shared by the tasks: one claim of one row at a time.
//! - lease, PostgreSQL and SQLite: `claim_lease` (limit 1), the handler, `settle` (fenced by
//!   the lease this task wrote). MySQL/MariaDB: `START TRANSACTION`, `select_lease`,
//!   `mark_lease`, `COMMIT`, the handler, `settle`.
//! - advisory, PostgreSQL and MySQL/MariaDB: `candidates` (limit 2 W), passing over the keys
//!   the tasks have in work (the core's `candidates_excluding`, the keys' text bound in its
//!   `NOT IN`), then for each candidate until one is taken: put its key in the tasks' set of
//!   keys in work (a key already there is passed over: no two tasks try one key's lock, as in
//!   the core), lock the key (`try_lock`), `take`
//!   (MySQL/MariaDB: `take_count` then `read_row`), the handler, `settle`, `unlock`. A key found
//!   held (by another task, or by a session elsewhere) is passed over with every later
//!   candidate of it, so no row overtakes an earlier row of its key; when the look found only
//!   such rows and as many as it asked for, the task looks again at once, passing over those
//!   keys too, up to 8 more looks (the core's look past held keys: with a key held for the
//!   whole run its rows gather at the head of the table, and a claim that reads the first rows
//!   alone would find nothing else). SQLite: one task at a time, as the core's
//!   registry claims nothing while a row is in work (a claim there reads the first due
//!   rows alone and takes nothing while they are in work, so a subscription has one delivery
//!   in work at a time: [the advisory form](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#the-advisory-form)): under a mutex the tasks share, `candidates` (limit 1: the
//!   first due row alone), its key put into a set of keys in the process, `take`, the
//!   handler, `settle`, the key out of the set; the next task's claim starts as the mutex is
//!   released.
//!
//! Every form: a handler works `--handler-ms`, or `--hot-ms` for a row of a hot key. Advisory
//! form: each handler's start and end go into the run's order log (tools/bench/src/order.rs),
//! which fails the run if a key's rows start out of id order or two are in work at once.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream::core::dialect::{AdvisoryTake, FormStatements, KeyLocks, LeaseClaim, RowLockClaim};
use ruststream::core::keys::{mysql_lock_name, postgres_key_hash};
use ruststream::core::{Arg, Dialect, Form, Statement, Statements, TableDesc, Value};

use crate::stats::Stats;
use crate::{BoxError, Work};

/// A connection the baseline runs statements on.
pub(crate) trait RawConn: Send + 'static {
    /// Runs a statement that answers rows; reads `columns` of each, by name.
    fn query(
        &mut self,
        sql: &str,
        binds: Vec<Value>,
        columns: &'static [&'static str],
    ) -> impl Future<Output = Result<Vec<Vec<Value>>, BoxError>> + Send;

    /// Runs a statement; answers the rows it affected.
    fn execute(
        &mut self,
        sql: &str,
        binds: Vec<Value>,
    ) -> impl Future<Output = Result<u64, BoxError>> + Send;
}

/// How a column the baseline reads decodes.
pub(crate) enum ColumnKind {
    /// An integer.
    Int,
    /// Bytes.
    Bytes,
    /// Text.
    Text,
    /// A boolean (PostgreSQL) or an integer 0/1 (MySQL).
    Truth,
    /// A row lock count's mark: an `integer` (PostgreSQL) or a lock's name (MySQL).
    Mark,
}

/// The kind of a column the baseline reads, by its name.
pub(crate) fn column_kind(name: &str) -> ColumnKind {
    match name {
        "payload" => ColumnKind::Bytes,
        // `QUERY PLAN`, `ANALYZE` and `detail`: the plans of PostgreSQL, MariaDB and SQLite.
        "rs_key" | "db" | "QUERY PLAN" | "ANALYZE" | "EXPLAIN" | "detail" => ColumnKind::Text,
        "locked" | "unlocked" => ColumnKind::Truth,
        "rs_mark" => ColumnKind::Mark,
        _ => ColumnKind::Int,
    }
}

const ROW: &[&str] = &["id", "attempt", "payload"];

/// A leased row: the row and the expiry its claim wrote.
const LEASED: &[&str] = &["id", "attempt", "payload", "rs_until"];

/// What the tasks of one baseline run share.
pub(crate) struct Shared {
    /// The limit loop: the row lock and lease forms' claims batched ([`crate::limit`]); the
    /// advisory form's as the same statements.
    pub(crate) limit: bool,
    /// The limit loop's batched claims and settlements.
    pub(crate) batch: crate::limit::Batch,
    pub(crate) statements: Statements,
    pub(crate) stats: Arc<Stats>,
    /// The table, for the candidates that pass over keys.
    pub(crate) desc: TableDesc,
    /// The rows the run settles (the held keys' rows left out).
    pub(crate) jobs: u64,
    /// The tasks.
    pub(crate) workers: usize,
    /// How long each handler works.
    pub(crate) work: Work,
    /// MySQL/MariaDB: the database's name, for lock names.
    pub(crate) database: String,
    /// Row lock form: one count-and-lock at a time. SQLite advisory form: one claim and its
    /// delivery at a time, as the core's registry has (the next claim starts when the key is
    /// released, and none runs meanwhile).
    pub(crate) claim: tokio::sync::Mutex<()>,
    /// Advisory form: the keys the tasks have in work.
    pub(crate) keys: Mutex<HashSet<String>>,
    /// Advisory form: the candidates that pass over `n` keys, rendered once per size.
    pub(crate) excluding: Mutex<HashMap<usize, Statement>>,
}

impl Shared {
    fn candidates_excluding(&self, n: usize) -> Result<Statement, BoxError> {
        let mut cache = self.excluding.lock().expect("not poisoned");
        if let Some(statement) = cache.get(&n) {
            return Ok(statement.clone());
        }
        let statement = Statements::candidates_excluding(self.statements.dialect, &self.desc, n)
            .ok_or("the core rendered no candidates for the advisory form")?;
        cache.insert(n, statement.clone());
        Ok(statement)
    }
}

#[derive(Default)]
struct Binds {
    now: i64,
    until: i64,
    limit: i64,
    id: Option<Value>,
    attempt: i64,
    key: Option<Value>,
    /// The keys a look passes over, as text.
    excluded: Vec<String>,
    /// The row lock count's marks.
    marks: Vec<Value>,
}

fn bind(statement: &Statement, b: &Binds) -> Vec<Value> {
    statement.binds(|arg| match arg {
        Arg::Id | Arg::IdAt(_) => b.id.clone().unwrap_or(Value::Null),
        Arg::Attempt => Value::Int(b.attempt),
        Arg::Fence => Value::Int(b.until),
        Arg::LeaseFor => Value::Int(LEASE_US),
        Arg::Limit | Arg::Take => Value::Int(b.limit),
        Arg::MarkAt(i) => b.marks.get(i).cloned().unwrap_or(Value::Null),
        Arg::Key => b.key.clone().unwrap_or(Value::Null),
        Arg::Due => Value::Int(b.now),
        // Padded with the last key: the statement is rendered for a power of two.
        Arg::ExcludedKey(i) => b
            .excluded
            .get(i)
            .or(b.excluded.last())
            .map_or(Value::Null, |k| Value::Text(k.clone())),
        _ => Value::Null,
    })
}

fn wrong_form(want: &str) -> BoxError {
    format!("the baseline of the {want} form ran on another form's statements").into()
}

/// The lease the baseline writes: the core's default, 30 s.
const LEASE_US: i64 = 30_000_000;

/// One task: claim → take → settle until every job is settled.
pub(crate) async fn worker<C: RawConn>(mut conn: C, shared: Arc<Shared>) -> Result<(), BoxError> {
    let mut idle_since = Instant::now();
    while shared.stats.settled() < shared.jobs {
        let took = match shared.statements.form() {
            Form::RowLock if shared.limit => {
                crate::limit::row_lock_once(&mut conn, &shared).await?
            }
            Form::Lease if shared.limit => crate::limit::lease_once(&mut conn, &shared).await?,
            Form::RowLock => row_lock_once(&mut conn, &shared).await?,
            Form::Lease => lease_once(&mut conn, &shared).await?,
            Form::Advisory => advisory_once(&mut conn, &shared).await?,
        };
        if took {
            idle_since = Instant::now();
        } else {
            if idle_since.elapsed() > Duration::from_secs(60) {
                return Err("the baseline found nothing to take for 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    Ok(())
}

/// The handler: records the pickup latency and works `ms`. Answers when it ended.
pub(crate) async fn handle(shared: &Shared, row: &[Value], ms: u64) -> Instant {
    if let Some(Value::Bytes(payload)) = row.get(2) {
        shared.stats.handler_start(payload);
    }
    crate::work(ms).await;
    Instant::now()
}

pub(crate) fn settled(shared: &Shared, ended: Instant) {
    shared.stats.settle_latency(ended.elapsed());
    shared.stats.settled_one();
}

async fn run<C: RawConn>(
    conn: &mut C,
    shared: &Shared,
    statement: &Statement,
    b: &Binds,
) -> Result<u64, BoxError> {
    let kind = format!("{:?}", statement.kind);
    shared.stats.count(&kind);
    let issued = Instant::now();
    let mut tries = 0;
    let affected = loop {
        match conn.execute(&statement.sql, bind(statement, b)).await {
            Err(error) if busy(&*error) && tries < BUSY_TRIES => {
                tries += 1;
                shared.stats.count("busy retry");
            }
            other => break other,
        }
    };
    shared.stats.timed(&kind, issued.elapsed());
    affected
}

/// How often a SQLite statement that answered `database is locked` (after its 5 s busy
/// timeout) runs again.
const BUSY_TRIES: u32 = 10;

/// Whether an error is SQLite's `SQLITE_BUSY`: four writers in tight loops can starve one
/// past its busy timeout. The statement changed nothing, so it runs again.
fn busy(error: &(dyn std::error::Error + 'static)) -> bool {
    error.to_string().contains("database is locked")
}

async fn rows<C: RawConn>(
    conn: &mut C,
    shared: &Shared,
    statement: &Statement,
    b: &Binds,
    columns: &'static [&'static str],
) -> Result<Vec<Vec<Value>>, BoxError> {
    let kind = format!("{:?}", statement.kind);
    shared.stats.count(&kind);
    let issued = Instant::now();
    let mut tries = 0;
    let rows = loop {
        match conn
            .query(&statement.sql, bind(statement, b), columns)
            .await
        {
            Err(error) if busy(&*error) && tries < BUSY_TRIES => {
                tries += 1;
                shared.stats.count("busy retry");
            }
            other => break other,
        }
    };
    shared.stats.timed(&kind, issued.elapsed());
    rows
}

async fn row_lock_once<C: RawConn>(conn: &mut C, shared: &Shared) -> Result<bool, BoxError> {
    let st = &shared.statements;
    let FormStatements::RowLock(f) = &st.form else {
        return Err(wrong_form("row lock"));
    };
    let claim = shared.claim.lock().await;
    let now = crate::stats::now_us();
    let mut b = Binds {
        now,
        limit: 1,
        ..Binds::default()
    };
    let (id, attempt, lock, unmark) = match &f.claim {
        RowLockClaim::Count {
            count_row,
            lock_row_by_id_unmarking,
            unmark_rows,
            ..
        } => {
            let found = rows(conn, shared, count_row, &b, &["id", "attempt", "rs_mark"]).await?;
            let Some(row) = found.into_iter().find(|r| !matches!(r[1], Value::Null)) else {
                return Ok(false);
            };
            b.marks = vec![row[2].clone()];
            let unmark = unmark_rows.first().ok_or("the core rendered no unmark")?;
            (
                row[0].clone(),
                row[1].as_int().unwrap_or(0),
                lock_row_by_id_unmarking,
                unmark,
            )
        }
        RowLockClaim::SelectCount {
            read_committed,
            select_row_id,
            mark_rows,
            count_attempts,
            lock_row_by_id_unmarking,
            unmark_rows,
            ..
        } => {
            let (Some(count_attempt), Some(mark), Some(unmark)) = (
                count_attempts.first(),
                mark_rows.first(),
                unmark_rows.first(),
            ) else {
                return Err(wrong_form("row lock with an attempt column"));
            };
            run(conn, shared, read_committed, &b).await?;
            run(conn, shared, &st.begin, &b).await?;
            let found = rows(
                conn,
                shared,
                select_row_id,
                &b,
                &["id", "attempt", "rs_mark"],
            )
            .await?;
            let Some(row) = found.into_iter().next() else {
                run(conn, shared, &st.rollback, &b).await?;
                return Ok(false);
            };
            b.marks = vec![row[2].clone()];
            let marked = rows(conn, shared, mark, &b, &["rs_at", "rs_marked"]).await?;
            if !marked
                .first()
                .is_some_and(|m| m[1].as_bool().unwrap_or(false))
            {
                run(conn, shared, &st.rollback, &b).await?;
                return Ok(true);
            }
            b.id = Some(row[0].clone());
            run(conn, shared, count_attempt, &b).await?;
            run(conn, shared, &st.commit, &b).await?;
            (
                row[0].clone(),
                row[1].as_int().unwrap_or(0) + 1,
                lock_row_by_id_unmarking,
                unmark,
            )
        }
        RowLockClaim::Lock { .. } => {
            return Err("the bench's row lock table counts attempts".into());
        }
    };
    b.id = Some(id);
    b.attempt = attempt;
    run(conn, shared, &st.begin, &b).await?;
    let locked = rows(conn, shared, lock, &b, ROW).await?;
    if locked.is_empty() {
        // The lock took no row, so it released no mark.
        run(conn, shared, unmark, &b).await?;
    }
    drop(claim);
    let Some(row) = locked.into_iter().next() else {
        run(conn, shared, &st.rollback, &b).await?;
        return Ok(true);
    };
    let ended = handle(shared, &row, shared.work.handler_ms).await;
    run(conn, shared, &f.settle, &b).await?;
    run(conn, shared, &st.commit, &b).await?;
    settled(shared, ended);
    Ok(true)
}

async fn lease_once<C: RawConn>(conn: &mut C, shared: &Shared) -> Result<bool, BoxError> {
    let st = &shared.statements;
    let FormStatements::Lease(f) = &st.form else {
        return Err(wrong_form("lease"));
    };
    let mut b = Binds {
        limit: 1,
        ..Binds::default()
    };
    // The claim reads back the expiry it wrote, by the database's clock: the fence.
    let row = match &f.claim {
        LeaseClaim::Returning { claim } => rows(conn, shared, claim, &b, LEASED)
            .await?
            .into_iter()
            .next(),
        LeaseClaim::Locking { select, mark } => {
            run(conn, shared, &st.begin, &b).await?;
            let found = rows(conn, shared, select, &b, LEASED).await?;
            match found.into_iter().next() {
                Some(row) => {
                    b.id = Some(row[0].clone());
                    b.until = row[3].as_int().unwrap_or_default();
                    let mark = mark.first().ok_or("the core rendered no lease mark")?;
                    run(conn, shared, mark, &b).await?;
                    run(conn, shared, &st.commit, &b).await?;
                    Some(row)
                }
                None => {
                    run(conn, shared, &st.commit, &b).await?;
                    None
                }
            }
        }
    };
    let Some(row) = row else {
        return Ok(false);
    };
    b.id = Some(row[0].clone());
    b.until = row[3].as_int().unwrap_or_default();
    let ended = handle(shared, &row, shared.work.handler_ms).await;
    run(conn, shared, &f.settle, &b).await?;
    settled(shared, ended);
    Ok(true)
}

/// The most looks past held keys one claim takes after its first, as the core's claim.
const MORE_LOOKS: usize = 8;

/// The most keys one look passes over in its statement, as the core's claim: past them the
/// look reads more rows instead.
const EXCLUDE_MAX: usize = 256;

async fn advisory_once<C: RawConn>(conn: &mut C, shared: &Shared) -> Result<bool, BoxError> {
    let st = &shared.statements;
    let FormStatements::Advisory(f) = &st.form else {
        return Err(wrong_form("advisory lock"));
    };
    let sqlite = st.dialect == Dialect::Sqlite;
    let database = matches!(f.keys, KeyLocks::Database { .. });
    // SQLite: no claim while a row is in work; the next one runs when its key is released.
    let _turn = if sqlite {
        Some(shared.claim.lock().await)
    } else {
        None
    };
    // Keys this claim found held, here or elsewhere: their later candidates are passed over.
    let mut passed: HashSet<String> = HashSet::new();
    let mut looks = 0;
    loop {
        let mut limit = if sqlite { 1 } else { 2 * shared.workers };
        let mut excluded: Vec<String> = if database {
            let in_work = shared.keys.lock().expect("not poisoned");
            in_work.union(&passed).cloned().collect()
        } else {
            Vec::new()
        };
        if excluded.len() > EXCLUDE_MAX {
            limit += excluded.len() - EXCLUDE_MAX;
            excluded.truncate(EXCLUDE_MAX);
        }
        let statement = if excluded.is_empty() {
            f.candidates.clone()
        } else {
            shared.candidates_excluding(excluded.len().next_power_of_two())?
        };
        let mut b = Binds {
            now: crate::stats::now_us(),
            limit: limit as i64,
            excluded,
            ..Binds::default()
        };
        let found = rows(conn, shared, &statement, &b, &["rs_id", "rs_key"]).await?;
        let full = found.len() >= limit;
        for candidate in found {
            let key = match &candidate[1] {
                Value::Text(t) => t.clone(),
                other => other.to_string(),
            };
            // On the database's locks a key counts as in work from its lock on (checked and
            // put in the set at once), so no two tasks try one key's lock.
            if database
                && (passed.contains(&key)
                    || !shared
                        .keys
                        .lock()
                        .expect("not poisoned")
                        .insert(key.clone()))
            {
                passed.insert(key);
                continue;
            }
            b.id = Some(candidate[0].clone());
            b.key = Some(match st.dialect {
                Dialect::Postgres => Value::Int(postgres_key_hash(&key)),
                Dialect::Sqlite => Value::Text(key.clone()),
                Dialect::MySql | Dialect::MariaDb => {
                    Value::Text(mysql_lock_name(&shared.database, &key))
                }
            });
            // Lock the key.
            if let KeyLocks::Database { try_lock, .. } = &f.keys {
                let locked = rows(conn, shared, try_lock, &b, &["locked"]).await?;
                let locked = locked
                    .first()
                    .and_then(|r| r.first())
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                if !locked {
                    shared.keys.lock().expect("not poisoned").remove(&key);
                    passed.insert(key);
                    continue;
                }
            } else if !shared
                .keys
                .lock()
                .expect("not poisoned")
                .insert(key.clone())
            {
                // The first due row is in work: this claim takes nothing.
                return Ok(false);
            }
            // Take the row.
            let row = match &f.take {
                AdvisoryTake::CountThenRead {
                    take_count,
                    read_row,
                } => {
                    if run(conn, shared, take_count, &b).await? > 0 {
                        rows(conn, shared, read_row, &b, ROW)
                            .await?
                            .into_iter()
                            .next()
                    } else {
                        None
                    }
                }
                AdvisoryTake::Returning { take } => {
                    rows(conn, shared, take, &b, ROW).await?.into_iter().next()
                }
            };
            let took = row.is_some();
            if let Some(row) = row {
                let id = row[0].as_int().unwrap_or(-1);
                shared.stats.order.start(&key, id);
                let ended = handle(shared, &row, shared.work.ms(Some(&key))).await;
                shared.stats.order.end(&key, id);
                run(conn, shared, &f.settle, &b).await?;
                settled(shared, ended);
            }
            // Unlock the key.
            if let KeyLocks::Database { unlock, .. } = &f.keys {
                rows(conn, shared, unlock, &b, &["unlocked"]).await?;
            }
            shared.keys.lock().expect("not poisoned").remove(&key);
            if took {
                return Ok(true);
            }
        }
        // The look found rows of held keys only, and more may wait past them: look again,
        // passing over those keys too.
        if !(database && full && looks < MORE_LOOKS) {
            return Ok(false);
        }
        looks += 1;
    }
}

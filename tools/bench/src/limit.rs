//! The limit loop of the row lock and lease forms: the fewest round trips and commits a job
//! needs while the form keeps its guarantees, with the claims of the tasks waiting for rows
//! batched into one statement, as nothing in either form keeps them apart.
//!
//! - row lock, PostgreSQL: one task at a time counts the attempts of as many rows as there are
//!   tasks without one (`count_row` with that limit: one statement, committed, which marks each
//!   row it counts on its session so that no count of another process counts it again before
//!   its lock); each task then takes a counted row and, on its own connection, `BEGIN`,
//!   `lock_row_by_id` (the row while its attempt is the one counted), the handler, `settle`,
//!   `COMMIT`. The counting task releases the marks (`unmark_rows`, one statement) once every
//!   row of its count is locked. MySQL/MariaDB: the count is `SET TRANSACTION ISOLATION LEVEL
//!   READ COMMITTED`, `START TRANSACTION`, `select_row_id` with that limit (rows no other count
//!   marked), `mark_rows` of those rows, one `count_attempts` of the rows marked, `COMMIT`. Per job: 4 statements and 1 commit, plus a share of the count and of the
//!   release of its marks.
//! - lease, PostgreSQL and SQLite: one task at a time claims as many rows as there are tasks
//!   without one (`claim_lease` with that limit); each task takes a claimed row, runs the
//!   handler, and puts its settlement on a list; the first task to reach the list's turn settles
//!   every settlement on it in one statement fenced row by row (`settle_leases`, which returns
//!   the ids it settled), and the others find theirs done. MySQL/MariaDB: the claim is `START
//!   TRANSACTION`, `select_lease`, one `mark_lease` of all the rows, `COMMIT`; each settlement
//!   runs on its own (MySQL returns no ids, so a lost lease among a batch could not be told).
//!
//! What the loop leaves out that the queue does: the extension of leases (the handlers here are
//! shorter than a lease), retries, failures, shutdown and notifications.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use ruststream::core::dialect::{FormStatements, LeaseClaim, RowLockClaim};
use ruststream::core::{Arg, Statement, Statements, Value};

use crate::BoxError;
use crate::baseline::{RawConn, Shared};

/// What the tasks of a batched limit loop share.
#[derive(Default)]
pub(crate) struct Batch {
    /// Rows counted (row lock: id and attempt) or claimed (lease: the row) and not yet taken;
    /// the lock is the claim's turn: one task at a time takes a row or claims.
    ready: tokio::sync::Mutex<VecDeque<Vec<Value>>>,
    /// Tasks holding a row.
    holding: AtomicUsize,
    /// Row lock: tasks between taking a counted row and the answer of its lock. The next count
    /// waits for them, and the count's marks are released once none is left.
    locking: AtomicUsize,
    /// Row lock: a lock answered.
    locked: tokio::sync::Notify,
    /// Lease: settlements waiting for a statement.
    settles: Mutex<Settles>,
    /// Lease: the settlement's turn.
    settling: tokio::sync::Mutex<()>,
    /// Lease: the settlement of `n` rows in one statement, rendered once per size.
    batches: Mutex<HashMap<usize, Statement>>,
}

#[derive(Default)]
struct Settles {
    /// Id, fence, and when its handler ended.
    waiting: Vec<(Value, i64, Instant)>,
    /// How many lists were taken to a statement.
    taken: u64,
}

impl Batch {
    /// A row for this task: one waiting, or the first of a claim this task runs for `n` rows,
    /// one per task that holds none (`claim` answers the rows). `None`: the claim found
    /// nothing. `counted`: the rows are counted, not locked (row lock), so the claim waits
    /// for the locks of the rows taken before. The second answer is every row of the claim
    /// where this task ran it, else none.
    async fn row<F, Fut>(
        &self,
        workers: usize,
        counted: bool,
        claim: F,
    ) -> Result<(Option<Vec<Value>>, Vec<Vec<Value>>), BoxError>
    where
        F: FnOnce(usize) -> Fut,
        Fut: Future<Output = Result<Vec<Vec<Value>>, BoxError>>,
    {
        let mut ready = self.ready.lock().await;
        if let Some(row) = ready.pop_front() {
            if counted {
                self.locking.fetch_add(1, Ordering::SeqCst);
            }
            return Ok((Some(row), Vec::new()));
        }
        if counted {
            self.wait_locks(None).await;
        }
        let n = workers
            .saturating_sub(self.holding.load(Ordering::SeqCst))
            .max(1);
        let claimed = claim(n).await?;
        let mut rows = claimed.clone().into_iter();
        let first = rows.next();
        if counted && first.is_some() {
            self.locking.fetch_add(1, Ordering::SeqCst);
        }
        ready.extend(rows);
        Ok((first, claimed))
    }

    /// Waits until no counted row waits for its lock: none is between its take and its lock's
    /// answer, and (with `ready`, the claim's queue, given) none is left to take.
    async fn wait_locks(&self, ready: Option<&tokio::sync::Mutex<VecDeque<Vec<Value>>>>) {
        loop {
            let answered = self.locked.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            let taken = match ready {
                Some(ready) => ready.lock().await.is_empty(),
                None => true,
            };
            if taken && self.locking.load(Ordering::SeqCst) == 0 {
                return;
            }
            answered.await;
        }
    }

    /// A counted row's lock answered.
    fn lock_answered(&self) {
        self.locking.fetch_sub(1, Ordering::SeqCst);
        self.locked.notify_waiters();
    }
}

/// What a statement of the loop binds.
#[derive(Default)]
struct B<'a> {
    ids: &'a [Value],
    marks: &'a [Value],
    fences: &'a [i64],
    attempt: i64,
    until: i64,
    limit: usize,
}

fn binds(statement: &Statement, b: B<'_>) -> Vec<Value> {
    let now = crate::stats::now_us();
    statement.binds(|arg| match arg {
        Arg::Id => b.ids.first().cloned().unwrap_or(Value::Null),
        Arg::IdAt(i) => b.ids.get(i).cloned().unwrap_or(Value::Null),
        Arg::FenceAt(i) => Value::Int(b.fences.get(i).copied().unwrap_or_default()),
        Arg::Fence => Value::Int(b.until),
        Arg::LeaseFor => Value::Int(LEASE_US),
        Arg::Attempt => Value::Int(b.attempt),
        Arg::Limit | Arg::Take => Value::Int(b.limit as i64),
        Arg::MarkAt(i) => b.marks.get(i).cloned().unwrap_or(Value::Null),
        _ => Value::Int(now),
    })
}

async fn rows<C: RawConn>(
    conn: &mut C,
    shared: &Shared,
    statement: &Statement,
    binds: Vec<Value>,
    columns: &'static [&'static str],
) -> Result<Vec<Vec<Value>>, BoxError> {
    let kind = format!("{:?}", statement.kind);
    shared.stats.count(&kind);
    let issued = Instant::now();
    let rows = conn.query(&statement.sql, binds, columns).await;
    shared.stats.timed(&kind, issued.elapsed());
    rows
}

/// Whether a statement failed on a deadlock, which rolled it back (and, on MySQL and MariaDB,
/// its transaction): a statement that commits on its own runs again, as the core's do.
fn deadlock(error: &BoxError) -> bool {
    let message = error.to_string();
    message.contains("Deadlock found") || message.contains("deadlock detected")
}

/// How often a statement that commits on its own runs again after a deadlock, as the core's.
const DEADLOCK_RERUNS: usize = 3;

/// [`run`] of a statement that commits on its own, run again after a deadlock.
async fn run_alone<C: RawConn>(
    conn: &mut C,
    shared: &Shared,
    statement: &Statement,
    binds: Vec<Value>,
) -> Result<u64, BoxError> {
    let mut reruns = 0;
    loop {
        match run(conn, shared, statement, binds.clone()).await {
            Err(error) if deadlock(&error) && reruns < DEADLOCK_RERUNS => {
                reruns += 1;
                shared.stats.count("deadlock rerun");
            }
            other => return other,
        }
    }
}

/// A claim's transaction that a deadlock rolled back claimed nothing: the next claim runs.
async fn or_rolled_back<C: RawConn>(
    conn: &mut C,
    shared: &Shared,
    claimed: Result<Vec<Vec<Value>>, BoxError>,
) -> Result<Vec<Vec<Value>>, BoxError> {
    match claimed {
        Err(error) if deadlock(&error) => {
            shared.stats.count("deadlock rerun");
            run(conn, shared, &shared.statements.rollback, Vec::new()).await?;
            Ok(Vec::new())
        }
        other => other,
    }
}

/// [`rows`] of a statement that commits on its own, run again after a deadlock.
async fn rows_alone<C: RawConn>(
    conn: &mut C,
    shared: &Shared,
    statement: &Statement,
    binds: Vec<Value>,
    columns: &'static [&'static str],
) -> Result<Vec<Vec<Value>>, BoxError> {
    let mut reruns = 0;
    loop {
        match rows(conn, shared, statement, binds.clone(), columns).await {
            Err(error) if deadlock(&error) && reruns < DEADLOCK_RERUNS => {
                reruns += 1;
                shared.stats.count("deadlock rerun");
            }
            other => return other,
        }
    }
}

async fn run<C: RawConn>(
    conn: &mut C,
    shared: &Shared,
    statement: &Statement,
    binds: Vec<Value>,
) -> Result<u64, BoxError> {
    let kind = format!("{:?}", statement.kind);
    shared.stats.count(&kind);
    let issued = Instant::now();
    let affected = conn.execute(&statement.sql, binds).await;
    shared.stats.timed(&kind, issued.elapsed());
    affected
}

const ROW: &[&str] = &["id", "attempt", "payload"];

/// A leased row: the row and the expiry its claim wrote, by the database's clock.
const LEASED: &[&str] = &["id", "attempt", "payload", "rs_until"];

/// One job of the row lock form's batched limit loop. `false`: nothing to take.
pub(crate) async fn row_lock_once<C: RawConn>(
    conn: &mut C,
    shared: &Shared,
) -> Result<bool, BoxError> {
    let st = &shared.statements;
    let FormStatements::RowLock(f) = &st.form else {
        return Err("the row lock form's limit loop ran on another form".into());
    };
    let batch = &shared.batch;
    let lock = match &f.claim {
        RowLockClaim::Count { lock_row_by_id, .. }
        | RowLockClaim::SelectCount { lock_row_by_id, .. } => lock_row_by_id,
        RowLockClaim::Lock { .. } => {
            return Err("the bench's row lock table counts attempts".into());
        }
    };
    let claim_conn = &mut *conn;
    let (counted, claimed) = batch
        .row(shared.workers, true, |n| async move {
            let conn = claim_conn;
            match &f.claim {
                RowLockClaim::Count { count_row, .. } => {
                    let b = binds(
                        count_row,
                        B {
                            limit: n,
                            ..B::default()
                        },
                    );
                    let looked =
                        rows_alone(conn, shared, count_row, b, &["id", "attempt", "rs_mark"])
                            .await?;
                    // A row marked by another process's count is not counted here.
                    Ok(looked
                        .into_iter()
                        .filter(|r| !matches!(r[1], Value::Null))
                        .collect())
                }
                RowLockClaim::SelectCount {
                    read_committed,
                    select_row_id,
                    mark_rows,
                    count_attempts,
                    ..
                } => {
                    let claimed = async {
                        run(conn, shared, read_committed, Vec::new()).await?;
                        run(conn, shared, &st.begin, Vec::new()).await?;
                        let b = binds(
                            select_row_id,
                            B {
                                limit: n,
                                ..B::default()
                            },
                        );
                        let found = rows(
                            conn,
                            shared,
                            select_row_id,
                            b,
                            &["id", "attempt", "rs_mark"],
                        )
                        .await?;
                        let mut counted = Vec::new();
                        if let Some(mark) =
                            found.len().checked_sub(1).and_then(|i| mark_rows.get(i))
                        {
                            let marks: Vec<Value> = found.iter().map(|r| r[2].clone()).collect();
                            let b = binds(
                                mark,
                                B {
                                    marks: &marks,
                                    ..B::default()
                                },
                            );
                            let taken =
                                rows(conn, shared, mark, b, &["rs_at", "rs_marked"]).await?;
                            for t in taken {
                                if t[1].as_bool() == Some(true)
                                    && let Some(row) = t[0]
                                        .as_int()
                                        .and_then(|at| found.get(usize::try_from(at).ok()?))
                                {
                                    counted.push(row.clone());
                                }
                            }
                        }
                        if let Some(count) = counted
                            .len()
                            .checked_sub(1)
                            .and_then(|i| count_attempts.get(i))
                        {
                            let ids: Vec<Value> = counted.iter().map(|r| r[0].clone()).collect();
                            run(
                                conn,
                                shared,
                                count,
                                binds(
                                    count,
                                    B {
                                        ids: &ids,
                                        ..B::default()
                                    },
                                ),
                            )
                            .await?;
                        }
                        run(conn, shared, &st.commit, Vec::new()).await?;
                        Ok(counted
                            .into_iter()
                            .map(|r| {
                                vec![
                                    r[0].clone(),
                                    Value::Int(r[1].as_int().unwrap_or(0) + 1),
                                    r[2].clone(),
                                ]
                            })
                            .collect())
                    }
                    .await;
                    or_rolled_back(conn, shared, claimed).await
                }
                RowLockClaim::Lock { .. } => Ok(Vec::new()),
            }
        })
        .await?;
    let Some(counted) = counted else {
        return Ok(false);
    };
    batch.holding.fetch_add(1, Ordering::SeqCst);
    let attempt = counted[1].as_int().unwrap_or(0);
    let ids = [counted[0].clone()];
    let locked = async {
        run(conn, shared, &st.begin, Vec::new()).await?;
        rows(
            conn,
            shared,
            lock,
            binds(
                lock,
                B {
                    ids: &ids,
                    attempt,
                    ..B::default()
                },
            ),
            ROW,
        )
        .await
    }
    .await;
    batch.lock_answered();
    let locked = locked?;
    // The counting task releases the marks after its count's locks, and the wait gathers the
    // tasks for the next count: measured here, a count of one row whose lock releases its
    // mark (the core's) ran fewer jobs a second in this loop, its counts being of one row.
    if !claimed.is_empty() {
        // The counting task releases its count's marks once every row of it is locked.
        batch.wait_locks(Some(&batch.ready)).await;
        let marks: Vec<Value> = claimed.iter().map(|r| r[2].clone()).collect();
        let unmark = match &f.claim {
            RowLockClaim::Count { unmark_rows, .. }
            | RowLockClaim::SelectCount { unmark_rows, .. } => unmark_rows.get(marks.len() - 1),
            RowLockClaim::Lock { .. } => None,
        }
        .ok_or("the core rendered no release of that many marks")?;
        let b = binds(
            unmark,
            B {
                marks: &marks,
                ..B::default()
            },
        );
        run(conn, shared, unmark, b).await?;
    }
    let Some(row) = locked.into_iter().next() else {
        run(conn, shared, &st.rollback, Vec::new()).await?;
        batch.holding.fetch_sub(1, Ordering::SeqCst);
        return Ok(true);
    };
    let ended = crate::baseline::handle(shared, &row, shared.work.handler_ms).await;
    run(
        conn,
        shared,
        &f.settle,
        binds(
            &f.settle,
            B {
                ids: &ids,
                ..B::default()
            },
        ),
    )
    .await?;
    run(conn, shared, &st.commit, Vec::new()).await?;
    batch.holding.fetch_sub(1, Ordering::SeqCst);
    crate::baseline::settled(shared, ended);
    Ok(true)
}

/// The lease the loop writes: the core's default, 30 s.
const LEASE_US: i64 = 30_000_000;

/// One job of the lease form's batched limit loop. `false`: nothing to take.
pub(crate) async fn lease_once<C: RawConn>(
    conn: &mut C,
    shared: &Shared,
) -> Result<bool, BoxError> {
    let st = &shared.statements;
    let FormStatements::Lease(f) = &st.form else {
        return Err("the lease form's limit loop ran on another form".into());
    };
    let batch = &shared.batch;
    let claim_conn = &mut *conn;
    let (row, _) = batch
        .row(shared.workers, false, |n| async move {
            let conn = claim_conn;
            // Each row carries the lease its claim wrote, read back: its fence.
            match &f.claim {
                LeaseClaim::Returning { claim } => {
                    let b = binds(
                        claim,
                        B {
                            limit: n,
                            ..B::default()
                        },
                    );
                    rows_alone(conn, shared, claim, b, LEASED).await
                }
                LeaseClaim::Locking { select, .. } => {
                    let claimed = async {
                        run(conn, shared, &st.begin, Vec::new()).await?;
                        let found = rows(
                            conn,
                            shared,
                            select,
                            binds(
                                select,
                                B {
                                    limit: n,
                                    ..B::default()
                                },
                            ),
                            LEASED,
                        )
                        .await?;
                        if let Some(mark) = f.claim.mark(found.len()) {
                            let ids: Vec<Value> = found.iter().map(|r| r[0].clone()).collect();
                            let until = found[0][3].as_int().unwrap_or_default();
                            run(
                                conn,
                                shared,
                                mark,
                                binds(
                                    mark,
                                    B {
                                        ids: &ids,
                                        until,
                                        ..B::default()
                                    },
                                ),
                            )
                            .await?;
                        }
                        run(conn, shared, &st.commit, Vec::new()).await?;
                        Ok(found)
                    }
                    .await;
                    or_rolled_back(conn, shared, claimed).await
                }
            }
        })
        .await?;
    let Some(row) = row else {
        return Ok(false);
    };
    batch.holding.fetch_add(1, Ordering::SeqCst);
    let ended = crate::baseline::handle(shared, &row, shared.work.handler_ms).await;
    let id = row[0].clone();
    let until = row.get(3).and_then(Value::as_int).unwrap_or_default();
    if !f.settles_together {
        run_alone(
            conn,
            shared,
            &f.settle,
            binds(
                &f.settle,
                B {
                    ids: &[id],
                    until,
                    ..B::default()
                },
            ),
        )
        .await?;
        batch.holding.fetch_sub(1, Ordering::SeqCst);
        crate::baseline::settled(shared, ended);
        return Ok(true);
    }
    let generation = {
        let mut settles = batch.settles.lock().expect("not poisoned");
        settles.waiting.push((id, until, ended));
        settles.taken
    };
    batch.holding.fetch_sub(1, Ordering::SeqCst);
    let _turn = batch.settling.lock().await;
    let waiting = {
        let mut settles = batch.settles.lock().expect("not poisoned");
        if settles.taken > generation {
            // A settlement that ran while this task waited for the turn took this one.
            return Ok(true);
        }
        settles.taken += 1;
        std::mem::take(&mut settles.waiting)
    };
    for chunk in waiting.chunks(ruststream::core::SETTLE_BATCH) {
        let statement = {
            let mut cache = batch.batches.lock().expect("not poisoned");
            match cache.get(&chunk.len()) {
                Some(statement) => statement.clone(),
                None => {
                    let statement =
                        Statements::settle_leases(st.dialect, &shared.desc, chunk.len())
                            .ok_or("the core renders no settlement of several leases here")?;
                    cache.insert(chunk.len(), statement.clone());
                    statement
                }
            }
        };
        let ids: Vec<Value> = chunk.iter().map(|(id, _, _)| id.clone()).collect();
        let fences: Vec<i64> = chunk.iter().map(|(_, fence, _)| *fence).collect();
        let settled = rows_alone(
            conn,
            shared,
            &statement,
            binds(
                &statement,
                B {
                    ids: &ids,
                    fences: &fences,
                    ..B::default()
                },
            ),
            &["id"],
        )
        .await?;
        if settled.len() != chunk.len() {
            return Err(format!(
                "the limit loop's settlement of {} leases settled {}",
                chunk.len(),
                settled.len()
            )
            .into());
        }
        for (_, _, ended) in chunk {
            crate::baseline::settled(shared, *ended);
        }
    }
    Ok(true)
}

//! The row lock form's count before the lock, on the core's rendered statements: a claim
//! counts a row's attempt and marks it (a server lock its session holds) before it locks the
//! row, so another claim neither counts it again nor locks it meanwhile.

use ruststream_core::spec::{Column, InboxSpec};
use ruststream_core::{Arg, Dialect, StatementKind, Statements, Value};

use super::statements_keys::{finish, start};
use crate::harness::Harness;
use crate::rows::Rows;
use crate::session::{Sql, SqlRow, assert_db_time, binds, get, ids};
use crate::{NotApplicable, TestName, Verdict};

/// A row lock claim counts the attempt before it locks: PostgreSQL counts and marks in one
/// statement that commits on its own; MySQL and MariaDB select, mark and count in a
/// transaction. Either way the lock takes the row only at its count. Not on SQLite.
pub async fn statements_row_lock_counts_the_attempt_before_it_locks<R: Rows, H: Harness>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    let postgres = match harness.dialect() {
        Dialect::Postgres => true,
        Dialect::MySql | Dialect::MariaDb => false,
        Dialect::Sqlite => {
            return Err(NotApplicable {
                harness: harness.name(),
                reason: "SQLite has no row locks".to_owned(),
            });
        }
    };
    let (db, table) = start(harness, "cf_sql_row_lock_count", test).await;
    let mut a = Sql::open(harness, &db).await;
    a.create(table).await;
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .processed_at(Column::new("processed_at"))
        .desc();
    let s = Statements::render(harness.dialect(), &desc, 2);
    // PostgreSQL's third count needs a third row; MySQL's counts look at two.
    let payloads: &[&[u8]] = if postgres {
        &[b"a", b"b", b"c"]
    } else {
        &[b"a", b"b"]
    };
    for payload in payloads {
        a.publish(&s, payload, None, Value::Text("x".to_owned()))
            .await;
    }
    let b = Sql::open(harness, &db).await;
    let c = Sql::open(harness, &db).await;
    let mut sessions = Sessions { a, b, c, table };
    if postgres {
        sessions.postgres(&s).await;
    } else {
        sessions.mysql(&s).await;
    }
    finish(harness, &mut sessions.a, &db, table).await
}

/// The three sessions of the scenario, and its table.
struct Sessions {
    a: Sql,
    b: Sql,
    c: Sql,
    table: &'static str,
}

/// What PostgreSQL's count reads back of a row: its id, the attempt it wrote (none where it
/// did not count the row) and its mark, which the count's session holds until the row's lock.
type Counted = (i64, Option<i64>, i64);

async fn count(sql: &mut Sql, s: &Statements, look: i64, take: i64) -> Vec<Counted> {
    let count_row = get(s, StatementKind::CountRow);
    let values = [
        (Arg::Limit, Value::Int(look)),
        (Arg::Take, Value::Int(take)),
    ];
    let rows = sql.query(count_row, &binds(count_row, &values)).await;
    rows.iter()
        .map(|r| (r.int("id"), r.opt_int("attempt"), r.int("rs_mark")))
        .collect()
}

/// Locks the row `id` in the open transaction, while it still holds the count `attempt`.
async fn lock(sql: &mut Sql, s: &Statements, id: i64, attempt: i64) -> Vec<SqlRow> {
    let lock_by_id = get(s, StatementKind::LockRowById);
    let values = [
        (Arg::Id, Value::Int(id)),
        (Arg::Attempt, Value::Int(attempt)),
    ];
    sql.query(lock_by_id, &binds(lock_by_id, &values)).await
}

/// Releases the marks `names` (PostgreSQL: one mark, its number).
async fn unmark(sql: &mut Sql, s: &Statements, names: &[Value]) {
    let statement = get(s, StatementKind::UnmarkRows(names.len()));
    let values: Vec<(Arg, Value)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (Arg::MarkAt(i), n.clone()))
        .collect();
    sql.execute(statement, &binds(statement, &values)).await;
}

/// The advisory locks the session holds: its marks.
async fn pg_marks(sql: &mut Sql) -> i64 {
    let held = "SELECT COUNT(*) AS v FROM pg_locks \
                WHERE locktype = 'advisory' AND pid = pg_backend_pid()";
    sql.scalar(held).await.expect("a count")
}

impl Sessions {
    async fn attempt_of(&mut self, id: i64) -> i64 {
        let sql = format!("SELECT attempt AS v FROM {} WHERE id = {id}", self.table);
        self.c.scalar(&sql).await.expect("an attempt")
    }

    /// PostgreSQL: A counts and marks; B's count passes A's row over; A locks at its count.
    async fn postgres(&mut self, s: &Statements) {
        let first = count(&mut self.a, s, 1, 1).await;
        assert_eq!(first.len(), 1, "the count reads back one row");
        let (first_id, first_attempt, first_mark) = first[0];
        assert_eq!(first_attempt, Some(1), "the first take counts attempt 1");
        assert_eq!(
            pg_marks(&mut self.a).await,
            1,
            "A's session holds the row's mark"
        );
        // Before A locks it, B's count looks at two rows: it passes A's over and counts the next.
        let seen = count(&mut self.b, s, 2, 1).await;
        assert_eq!(seen.len(), 2, "B looked at two rows: {seen:?}");
        assert!(
            seen.contains(&(first_id, None, first_mark)),
            "B does not count A's: {seen:?}"
        );
        let &(second_id, second_attempt, second_mark) = seen
            .iter()
            .find(|r| r.0 != first_id)
            .expect("B counted another row");
        assert_eq!(second_attempt, Some(1));
        assert_eq!(self.attempt_of(first_id).await, 1, "A's row counted once");
        // A locks its row at its count (not at another), then releases the mark.
        self.a.execute(&s.begin, &[]).await;
        assert!(
            lock(&mut self.a, s, first_id, 0).await.is_empty(),
            "another count takes nothing"
        );
        let locked = lock(&mut self.a, s, first_id, 1).await;
        assert_eq!(ids(&locked), vec![first_id]);
        assert_eq!(locked[0].int("attempt"), 1);
        unmark(&mut self.a, s, &[Value::Int(first_mark)]).await;
        assert_eq!(pg_marks(&mut self.a).await, 0, "A released the mark");
        // A third count passes A's locked row and B's marked one over, and counts the last.
        let third = count(&mut self.c, s, 3, 1).await;
        assert!(
            third.iter().all(|r| r.0 != first_id),
            "a locked row is skipped: {third:?}"
        );
        assert!(
            third.contains(&(second_id, None, second_mark)),
            "B's row: {third:?}"
        );
        assert_eq!(
            third.iter().filter(|r| r.1 == Some(1)).count(),
            1,
            "{third:?}"
        );
        assert_eq!(self.attempt_of(second_id).await, 1, "B's row counted once");
        self.settle_marked(s, first_id).await;
        unmark(&mut self.b, s, &[Value::Int(second_mark)]).await;
        assert_eq!(pg_marks(&mut self.b).await, 0, "B released its mark");
    }

    /// A settles its locked row by marking it at the database's time; a marked row is not
    /// locked again.
    async fn settle_marked(&mut self, s: &Statements, id: i64) {
        let settle = s.settle();
        let before = self.c.now().await;
        let settled = self
            .a
            .execute(settle, &binds(settle, &[(Arg::Id, Value::Int(id))]))
            .await;
        assert_eq!(settled, 1);
        let after = self.c.now().await;
        self.a.execute(&s.commit, &[]).await;
        let marked = self.c.stored(self.table, "processed_at", id).await;
        assert_db_time(
            marked.expect("the row is marked"),
            before,
            after,
            0,
            "processed_at",
        );
        self.a.execute(&s.begin, &[]).await;
        assert!(
            lock(&mut self.a, s, id, 1).await.is_empty(),
            "a processed row is not locked"
        );
        self.a.execute(&s.rollback, &[]).await;
    }
}

/// MySQL's select of the rows to count, up to `limit`: each row's id, attempt and mark name.
async fn select(sql: &mut Sql, s: &Statements, limit: i64) -> Vec<SqlRow> {
    let select_id = get(s, StatementKind::SelectRowId);
    sql.query(
        select_id,
        &binds(select_id, &[(Arg::Limit, Value::Int(limit))]),
    )
    .await
}

/// The mark names of `rows`.
fn mark_names(rows: &[SqlRow]) -> Vec<Value> {
    rows.iter()
        .map(|r| Value::Text(r.text("rs_mark")))
        .collect()
}

/// Takes the marks `names` (MySQL's `GET_LOCK`): whether each was taken, in order.
async fn mark(sql: &mut Sql, s: &Statements, names: &[Value]) -> Vec<bool> {
    let statement = get(s, StatementKind::MarkRows(names.len()));
    let values: Vec<(Arg, Value)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (Arg::MarkAt(i), n.clone()))
        .collect();
    let mut rows = sql.query(statement, &binds(statement, &values)).await;
    rows.sort_by_key(|r| r.int("rs_at"));
    rows.iter().map(|r| r.int("rs_marked") == 1).collect()
}

impl Sessions {
    /// MySQL and MariaDB: A selects, marks and counts its row in a transaction; B's count at
    /// read committed leaves the marked row out and holds no lock on it.
    async fn mysql(&mut self, s: &Statements) {
        let (a, b) = (&mut self.a, &mut self.b);
        a.execute(&s.begin, &[]).await;
        let first = select(a, s, 1).await;
        let (first_id, before) = (first[0].int("id"), first[0].int("attempt"));
        assert_eq!(before, 0, "the select reads the attempt before the count");
        let first_mark = mark_names(&first);
        let name = first[0].text("rs_mark");
        assert_eq!(
            name.len(),
            64,
            "a mark's name is a SHA-256 in hex, the longest GET_LOCK takes"
        );
        b.execute(&s.begin, &[]).await;
        assert_ne!(
            select(b, s, 1).await[0].int("id"),
            first_id,
            "B skips the row A holds"
        );
        b.execute(&s.rollback, &[]).await;
        assert_eq!(mark(a, s, &first_mark).await, [true]);
        let count = get(s, StatementKind::CountAttempt);
        assert_eq!(a.execute(count, &[Value::Int(first_id)]).await, 1);
        a.execute(&s.commit, &[]).await;
        // Before A locks it, B's count leaves A's marked row out, though no row lock holds it.
        let read_committed = get(s, StatementKind::ReadCommitted);
        b.execute(read_committed, &[]).await;
        b.execute(&s.begin, &[]).await;
        let found = select(b, s, 2).await;
        assert_eq!(
            ids(&found).len(),
            1,
            "B's count leaves the marked row out: {found:?}"
        );
        assert_ne!(ids(&found)[0], first_id, "B skips the row A marked");
        let both = [first_mark[0].clone(), mark_names(&found)[0].clone()];
        assert_eq!(
            mark(b, s, &both).await,
            [false, true],
            "a mark A holds is not B's"
        );
        b.execute(&s.rollback, &[]).await;
        unmark(b, s, &mark_names(&found)).await;
        // B's open count holds no lock on A's row: A's lock by id takes it meanwhile.
        b.execute(read_committed, &[]).await;
        b.execute(&s.begin, &[]).await;
        assert_eq!(select(b, s, 2).await.len(), 1);
        a.execute(&s.begin, &[]).await;
        assert!(
            lock(a, s, first_id, before).await.is_empty(),
            "the count before takes nothing"
        );
        let locked = lock(a, s, first_id, before + 1).await;
        assert_eq!(
            ids(&locked),
            vec![first_id],
            "B's open count does not hold A's row"
        );
        assert_eq!(locked[0].int("attempt"), 1);
        b.execute(&s.rollback, &[]).await;
        unmark(a, s, &first_mark).await;
        let free = a
            .scalar(&format!("SELECT IS_FREE_LOCK('{name}') AS v"))
            .await;
        assert_eq!(free, Some(1), "the mark is released");
        b.execute(&s.begin, &[]).await;
        let next = select(b, s, 2).await;
        assert!(
            ids(&next).iter().all(|id| *id != first_id),
            "a locked row is skipped"
        );
        b.execute(&s.rollback, &[]).await;
        assert_eq!(a.execute(s.settle(), &[Value::Int(first_id)]).await, 1);
        a.execute(&s.commit, &[]).await;
    }
}

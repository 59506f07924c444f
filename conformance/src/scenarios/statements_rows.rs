//! The core's rendered row lock statements, run on sessions of the harness's own with binds
//! built from each statement's args: a locked row is skipped by another transaction, a
//! settlement commits with it, a rollback counts nothing. Servers only: SQLite has no row
//! locks.

use ruststream_core::spec::{Column, InboxSpec, OrderBy};
use ruststream_core::{Arg, Dialect, StatementKind, Statements, Value};

use super::statements_keys::{finish, start};
use crate::harness::Harness;
use crate::rows::Rows;
use crate::session::{Sql, binds, get, ids};
use crate::{NotApplicable, TestName, Verdict};

/// The row lock form's statements: A's lock passes B by, in B's own open transaction; A's
/// settlement deletes the row with its commit; B's rollback counts nothing; a custom order
/// locks the highest priority first.
pub async fn statements_row_lock_form<R: Rows, H: Harness>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    if !harness.dialect().has_row_locks() {
        return Err(NotApplicable {
            harness: harness.name(),
            reason: format!("{} has no row locks", harness.dialect().name()),
        });
    }
    let (db, table) = start(harness, "cf_sql_row_lock", test).await;
    let mut a = Sql::open(harness, &db).await;
    let mut b = Sql::open(harness, &db).await;
    a.create(table).await;
    let s = Statements::render(
        harness.dialect(),
        InboxSpec::new(table, Column::new("id").generated())
            .payload(Column::new("payload"))
            .attempt(Column::new("attempt").generated())
            .desc(),
        2,
    );
    if harness.dialect() == Dialect::Postgres {
        postgres_catalog(&mut a, &s, table).await;
    }
    for payload in [b"a", b"b", b"c"] {
        a.publish(&s, payload, None, Value::Text("x".to_owned()))
            .await;
    }
    let all: Vec<i64> = a
        .ids_by_payload(table)
        .await
        .iter()
        .map(|(id, _)| *id)
        .collect();
    // A table whose description names no attempt column locks in one statement; with one,
    // the claim counts first.
    let plain = Statements::render(
        harness.dialect(),
        InboxSpec::new(table, Column::new("id").generated())
            .payload(Column::new("payload"))
            .desc(),
        2,
    );
    let lock_row = get(&plain, StatementKind::LockRow);
    assert_eq!(a.execute(&s.begin, &[]).await, 0);
    let locked = a.query(lock_row, &binds(lock_row, &[])).await;
    assert_eq!(ids(&locked), vec![all[0]]);
    assert_eq!(locked[0].bytes("payload"), b"a");
    if let Some(count) = s.of_kind(StatementKind::CountAttempt) {
        assert_eq!(a.execute(count, &[Value::Int(all[0])]).await, 1);
    }
    b.execute(&s.begin, &[]).await;
    let skipped = b.query(lock_row, &binds(lock_row, &[])).await;
    assert_eq!(ids(&skipped), vec![all[1]], "B skips A's row");
    b.execute(&s.rollback, &[]).await;

    let settle = s.settle();
    let settled = a
        .execute(settle, &binds(settle, &[(Arg::Id, Value::Int(all[0]))]))
        .await;
    assert_eq!(settled, 1);
    a.execute(&s.commit, &[]).await;
    let read = &s.read_row;
    let gone = b
        .query(read, &binds(read, &[(Arg::Id, Value::Int(all[0]))]))
        .await;
    assert!(gone.is_empty(), "the settled row is deleted");
    let second = b
        .query(read, &binds(read, &[(Arg::Id, Value::Int(all[1]))]))
        .await;
    assert_eq!(second[0].int("attempt"), 0, "B's rollback counted nothing");

    locks_by_priority(&mut a, harness.dialect(), table, all[2]).await;
    finish(harness, &mut a, &db, table).await
}

/// A custom order locks the highest priority first: the row `id`, given the highest.
async fn locks_by_priority(a: &mut Sql, dialect: Dialect, table: &'static str, id: i64) {
    a.run(&format!("UPDATE {table} SET priority = 5 WHERE id = {id}"))
        .await;
    const ORDER: &[OrderBy] = &[OrderBy::desc("priority")];
    let ordered = Statements::render(
        dialect,
        InboxSpec::new(table, Column::new("id").generated())
            .payload(Column::new("payload"))
            .order(ORDER)
            .desc(),
        1,
    );
    a.execute(&ordered.begin, &[]).await;
    let first = a.query(get(&ordered, StatementKind::LockRow), &[]).await;
    assert_eq!(ids(&first), vec![id]);
    a.execute(&ordered.rollback, &[]).await;
}

/// PostgreSQL's catalog as the core reads it: the table's columns in the session's schema,
/// and the session's isolation, read committed.
async fn postgres_catalog(sql: &mut Sql, s: &Statements, table: &str) {
    let list = &s.list_columns;
    let values = [
        (Arg::Schema, Value::Text(String::new())),
        (Arg::TableName, Value::Text(table.to_owned())),
    ];
    let rows = sql.query(list, &binds(list, &values)).await;
    let mut names: Vec<String> = rows.iter().map(|r| r.text("column_name")).collect();
    names.sort();
    let want = [
        "attempt",
        "channel",
        "due_at",
        "id",
        "locked_until",
        "payload",
        "priority",
        "processed_at",
    ];
    assert_eq!(names, want);
    let isolation = sql.query(get(s, StatementKind::Isolation), &[]).await;
    assert_eq!(isolation[0].text("isolation"), "read committed");
}

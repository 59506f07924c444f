//! The core's rendered lease statements, run on a session of the harness's own with binds
//! built from each statement's args: claims, extensions, releases and settlements under the
//! fence, by the database's clock.

use ruststream_core::dialect::{FormStatements, UNTIL};
use ruststream_core::spec::{Column, InboxSpec};
use ruststream_core::{
    Arg, Dialect, Output, Statement, StatementKind, Statements, TableDesc, Value,
};

use super::statements_keys::{finish, start};
use crate::harness::Harness;
use crate::rows::Rows;
use crate::session::{Sql, SqlRow, assert_db_time, binds, get, ids};
use crate::{TestName, Verdict};

/// The lease table's description: every column the lease form names.
fn lease_desc(table: &'static str) -> TableDesc {
    *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"))
        .processed_at(Column::new("processed_at"))
        .due(Column::new("due_at"))
        .desc()
}

/// The statement that reads the claimed rows and their expiry: the claim itself, or on MySQL
/// and MariaDB its locking read, which a mark of the rows follows.
fn claim_read(s: &Statements) -> &Statement {
    s.of_kind(StatementKind::ClaimLease)
        .or_else(|| s.of_kind(StatementKind::SelectLease))
        .expect("a lease claim is rendered")
}

/// Claims up to `limit` rows for `lease` microseconds and answers them, each with its id and
/// its expiry ([`UNTIL`]): one statement, or on MySQL and MariaDB the locking read and the
/// mark of the rows in one transaction.
async fn claim(sql: &mut Sql, s: &Statements, lease: i64, limit: i64) -> Vec<SqlRow> {
    let read = claim_read(s);
    let values = [
        (Arg::LeaseFor, Value::Int(lease)),
        (Arg::Limit, Value::Int(limit)),
    ];
    if read.kind == StatementKind::ClaimLease {
        return sql.query(read, &binds(read, &values)).await;
    }
    sql.execute(&s.begin, &[]).await;
    let rows = sql.query(read, &binds(read, &values)).await;
    if let Some(first) = rows.first() {
        let held = ids(&rows);
        let until = first.int(UNTIL);
        assert!(
            rows.iter().all(|r| r.int(UNTIL) == until),
            "one read of the clock for the claim's rows"
        );
        let mark = get(s, StatementKind::MarkLease(held.len()));
        let mut marks = vec![(Arg::Fence, Value::Int(until))];
        marks.extend(
            held.iter()
                .enumerate()
                .map(|(i, id)| (Arg::IdAt(i), Value::Int(*id))),
        );
        let marked = sql.execute(mark, &binds(mark, &marks)).await;
        assert_eq!(
            marked,
            held.len() as u64,
            "the mark writes each row's expiry"
        );
    }
    sql.execute(&s.commit, &[]).await;
    rows
}

/// The attempt of the row `id`, read by the core's `read_row`.
async fn attempt_of(sql: &mut Sql, s: &Statements, id: i64) -> i64 {
    let rows = sql.query(&s.read_row, &[Value::Int(id)]).await;
    rows[0].int("attempt")
}

/// The lease form's statements: a claim writes the database's time plus the lease and reads
/// the expiry back, a fence one microsecond off holds nothing, an extension moves the expiry,
/// a release gives the row back, a settlement marks it; expired and due rows are claimed.
pub async fn statements_lease_form<R: Rows, H: Harness>(harness: &H, test: &TestName) -> Verdict {
    let (db, table) = start(harness, "cf_sql_lease", test).await;
    let mut a = Sql::open(harness, &db).await;
    let mut b = Sql::open(harness, &db).await;
    a.create(table).await;
    let desc = lease_desc(table);
    let s = Statements::render(harness.dialect(), &desc, 4);
    if !a.is_mysql() {
        assert!(
            s.of_kind(StatementKind::SelectLease).is_none()
                && s.of_kind(StatementKind::MarkLease(1)).is_none(),
            "one statement claims"
        );
    }
    let (late, early, future) = publish_three(&mut a, &s, table).await;
    let lease = 30_000_000;
    // The first claim in a transaction of its own (SQLite: BEGIN IMMEDIATE) runs as well.
    let wrap = !a.is_mysql();
    if wrap {
        a.execute(&s.begin, &[]).await;
    }
    let before = a.now().await;
    let claimed = claim(&mut a, &s, lease, 1).await;
    let after = a.now().await;
    if wrap {
        a.execute(&s.commit, &[]).await;
    }
    assert_eq!(ids(&claimed), vec![early], "the first due row first");
    let until_early = claimed[0].int(UNTIL);
    assert_db_time(until_early, before, after, lease, "the lease of early");
    assert_eq!(
        a.stored(table, "locked_until", early).await,
        Some(until_early)
    );
    let before = b.now().await;
    let claimed = claim(&mut b, &s, lease, 10).await;
    let after = b.now().await;
    assert_eq!(
        ids(&claimed),
        vec![late],
        "a held lease and a future row are skipped"
    );
    let until = claimed[0].int(UNTIL);
    assert_db_time(until, before, after, lease, "the lease of late");
    assert_eq!(
        a.stored(table, "locked_until", late).await,
        Some(until),
        "the expiry read back is the one written"
    );
    for id in [early, late] {
        assert_eq!(
            attempt_of(&mut a, &s, id).await,
            1,
            "the claim counts the attempt"
        );
    }
    assert!(claim(&mut a, &s, lease, 10).await.is_empty());
    let until2 = extend_under_fence(&mut a, &s, table, (late, until), (early, until_early)).await;

    // `early`'s lease runs out by the database's clock: a claim takes it again, counting again.
    a.set_from_now(table, "locked_until", early, -1_000).await;
    let before = b.now().await;
    let again = claim(&mut b, &s, lease, 10).await;
    let after = b.now().await;
    assert_eq!(ids(&again), vec![early]);
    assert_eq!(attempt_of(&mut a, &s, early).await, 2);
    let fence_early = again[0].int(UNTIL);
    assert_db_time(fence_early, before, after, lease, "the new lease of early");
    release_under_fence(&mut a, &s, table, early, fence_early).await;
    let back = claim(&mut a, &s, lease, 10).await;
    assert_eq!(ids(&back), vec![early], "released, the row is claimable");
    settle_under_fence(&mut a, &s, table, late, (until, until2)).await;
    assert!(
        claim(&mut a, &s, lease, 10).await.is_empty(),
        "a held lease, a processed row and a future one"
    );

    claim_once_expired(&mut a, &s, table, (late, early, future)).await;
    finish(harness, &mut a, &db, table).await
}

/// Publishes `late`, `early` and `future`, due in claim order `early`, `late` (the second
/// published is due first) and `future` not due yet, by the database's clock; answers their ids.
async fn publish_three(a: &mut Sql, s: &Statements, table: &str) -> (i64, i64, i64) {
    let now = a.now().await;
    a.publish(s, b"late", Some(now - 1_000_000), channel())
        .await;
    a.publish(s, b"early", Some(now - 2_000_000), channel())
        .await;
    a.publish(s, b"future", Some(now + 3_600_000_000), channel())
        .await;
    let all = a.ids_by_payload(table).await;
    let id_of = |payload: &[u8]| all.iter().find(|(_, p)| p == payload).expect("a row").0;
    let (late, early, future) = (id_of(b"late"), id_of(b"early"), id_of(b"future"));
    assert_eq!(
        a.stored(table, "due_at", early).await,
        Some(now - 2_000_000),
        "a published due time keeps its microseconds"
    );
    (late, early, future)
}

/// Every lease runs out and the future row falls due, by the database's clock: a claim takes
/// `early` and `future`, never the processed `late`.
async fn claim_once_expired(a: &mut Sql, s: &Statements, table: &str, rows: (i64, i64, i64)) {
    let (late, early, future) = rows;
    let lease = 30_000_000;
    a.set_from_now(table, "locked_until", early, -1_000).await;
    a.set_from_now(table, "due_at", future, -1_000).await;
    let mut last = ids(&claim(a, s, lease, 10).await);
    last.sort_unstable();
    assert!(!last.contains(&late), "a processed row stays settled");
    assert_eq!(
        last,
        [early, future],
        "the released row and the future one, now due"
    );
}

/// The channel the lease rows are published with.
fn channel() -> Value {
    Value::Text("x".to_owned())
}

/// Extends `held`'s lease under its fence, then under the stale one; a fence one microsecond
/// off `other`'s holds nothing. Answers `held`'s new expiry.
async fn extend_under_fence(
    sql: &mut Sql,
    s: &Statements,
    table: &str,
    (held, until): (i64, i64),
    (other, other_until): (i64, i64),
) -> i64 {
    let extend = get(s, StatementKind::ExtendLease);
    let more = 10_000_000;
    let extend_binds = |id: i64, fence: i64| {
        let values = [
            (Arg::Extend, Value::Int(more)),
            (Arg::Id, Value::Int(id)),
            (Arg::Fence, Value::Int(fence)),
        ];
        binds(extend, &values)
    };
    assert_eq!(sql.execute(extend, &extend_binds(held, until)).await, 1);
    assert_eq!(
        sql.stored(table, "locked_until", held).await,
        Some(until + more)
    );
    assert_eq!(
        sql.execute(extend, &extend_binds(held, until)).await,
        0,
        "the old fence no longer holds the row"
    );
    for off in [other_until + 1, other_until - 1] {
        assert_eq!(
            sql.execute(extend, &extend_binds(other, off)).await,
            0,
            "a fence one microsecond off holds nothing"
        );
    }
    assert_eq!(
        sql.stored(table, "locked_until", other).await,
        Some(other_until)
    );
    until + more
}

/// Releases the row `id` under a fence off its own, then under its own: the lease is gone.
async fn release_under_fence(sql: &mut Sql, s: &Statements, table: &str, id: i64, fence: i64) {
    let release = get(s, StatementKind::ReleaseLease);
    let release_binds = |fence: i64| {
        binds(
            release,
            &[(Arg::Id, Value::Int(id)), (Arg::Fence, Value::Int(fence))],
        )
    };
    for off in [fence + 5, fence - 1] {
        assert_eq!(sql.execute(release, &release_binds(off)).await, 0);
    }
    assert_eq!(sql.execute(release, &release_binds(fence)).await, 1);
    assert_eq!(sql.stored(table, "locked_until", id).await, None);
}

/// Settles the row `id` under its stale fence (nothing), then under its own: `processed_at`
/// is the database's time and the lease is cleared.
async fn settle_under_fence(
    sql: &mut Sql,
    s: &Statements,
    table: &str,
    id: i64,
    (stale, fence): (i64, i64),
) {
    let settle = s.settle();
    let settle_binds = |fence: i64| {
        binds(
            settle,
            &[(Arg::Id, Value::Int(id)), (Arg::Fence, Value::Int(fence))],
        )
    };
    assert_eq!(sql.execute(settle, &settle_binds(stale)).await, 0);
    let before = sql.now().await;
    assert_eq!(sql.execute(settle, &settle_binds(fence)).await, 1);
    let after = sql.now().await;
    let marked = sql
        .stored(table, "processed_at", id)
        .await
        .expect("the row is marked");
    assert_db_time(marked, before, after, 0, "processed_at");
    assert_eq!(sql.stored(table, "locked_until", id).await, None);
}

/// A lease claim reads back the expiry the database wrote, to the microsecond the row holds:
/// a fence one microsecond off holds nothing; an extension moves the expiry by exactly its
/// length; a retry makes the row due the delay after the database's time.
pub async fn statements_lease_claim_reads_back_the_expiry_it_wrote<R: Rows, H: Harness>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    let (db, table) = start(harness, "cf_sql_lease_until", test).await;
    let mut sql = Sql::open(harness, &db).await;
    sql.create(table).await;
    let desc = lease_desc(table);
    let s = Statements::render(harness.dialect(), &desc, 1);
    let FormStatements::Lease(f) = &s.form else {
        panic!("the lease form");
    };
    sql.publish(&s, b"x", None, channel()).await;
    let Output::Rows { columns, .. } = &claim_read(&s).output else {
        panic!("the claim answers rows");
    };
    assert_eq!(
        columns.last().map(|c| c.name),
        Some(UNTIL),
        "the expiry is the claim's last column"
    );
    let lease = 20_000_000;
    let before = sql.now().await;
    let claimed = claim(&mut sql, &s, lease, 1).await;
    let after = sql.now().await;
    assert_eq!(claimed.len(), 1);
    let id = claimed[0].int("id");
    let until = claimed[0].int(UNTIL);
    assert_eq!(
        sql.stored(table, "locked_until", id).await,
        Some(until),
        "the expiry read back is the one the row holds"
    );
    assert_db_time(until, before, after, lease, "the claim's expiry");

    let extend = &f.extend;
    let more = 7_654_321;
    let extend_by = |fence: i64| {
        let values = [
            (Arg::Extend, Value::Int(more)),
            (Arg::Id, Value::Int(id)),
            (Arg::Fence, Value::Int(fence)),
        ];
        binds(extend, &values)
    };
    for off in [until + 1, until - 1] {
        assert_eq!(
            sql.execute(extend, &extend_by(off)).await,
            0,
            "a fence a microsecond off holds nothing"
        );
    }
    assert_eq!(sql.stored(table, "locked_until", id).await, Some(until));
    assert_eq!(sql.execute(extend, &extend_by(until)).await, 1);
    assert_eq!(
        sql.stored(table, "locked_until", id).await,
        Some(until + more),
        "the extension moves the expiry by exactly its length"
    );
    assert_eq!(
        sql.execute(extend, &extend_by(until)).await,
        0,
        "the old expiry fences nothing"
    );
    retry_under_fence(&mut sql, &f.retry, table, id, until + more).await;
    assert!(
        claim(&mut sql, &s, lease, 1).await.is_empty(),
        "the retried row is not due yet"
    );
    finish(harness, &mut sql, &db, table).await
}

/// A retry of the row `id` under a fence off its own (nothing), then under its own: due the
/// delay after the database's time, the lease cleared.
async fn retry_under_fence(sql: &mut Sql, retry: &Statement, table: &str, id: i64, fence: i64) {
    let retry_in = 3_600_000_000;
    let retry_binds = |fence: i64| {
        let values = [
            (Arg::RetryIn, Value::Int(retry_in)),
            (Arg::Id, Value::Int(id)),
            (Arg::Fence, Value::Int(fence)),
            (Arg::Error, Value::Null),
        ];
        binds(retry, &values)
    };
    assert_eq!(sql.execute(retry, &retry_binds(fence - 1)).await, 0);
    let before = sql.now().await;
    assert_eq!(sql.execute(retry, &retry_binds(fence)).await, 1);
    let after = sql.now().await;
    let due = sql.stored(table, "due_at", id).await.expect("a due time");
    assert_db_time(due, before, after, retry_in, "the retried row's due time");
    assert_eq!(sql.stored(table, "locked_until", id).await, None);
}

/// Several lease settlements in one statement: each row only under its own fence; the ids it
/// settled come back, so a lost lease among them is told apart. MySQL renders none, nor
/// MariaDB for a table that marks its rows (an `UPDATE` there returns no rows).
pub async fn statements_lease_settlements_in_one_statement<R: Rows, H: Harness>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    let (db, table) = start(harness, "cf_sql_settle_leases", test).await;
    let mut sql = Sql::open(harness, &db).await;
    for marks in [false, true] {
        sql.create(table).await;
        let spec = InboxSpec::new(table, Column::new("id").generated())
            .payload(Column::new("payload"))
            .lease(Column::new("locked_until"));
        let desc = if marks {
            *spec.processed_at(Column::new("processed_at")).desc()
        } else {
            *spec.desc()
        };
        if sql.is_mysql() {
            assert!(Statements::settle_leases(Dialect::MySql, &desc, 3).is_none());
        }
        let Some(settle) = Statements::settle_leases(harness.dialect(), &desc, 3) else {
            assert!(
                sql.is_mysql() && marks,
                "marks {marks}: settlements in one statement"
            );
            continue;
        };
        settle_leases(&mut sql, &desc, &settle, table, marks).await;
    }
    finish(harness, &mut sql, &db, table).await
}

/// Claims three rows, settles them in `settle` with the third's fence one microsecond off,
/// and checks that only the first two settled.
async fn settle_leases(
    sql: &mut Sql,
    desc: &TableDesc,
    settle: &Statement,
    table: &str,
    marks: bool,
) {
    let s = Statements::render(sql.dialect(), desc, 3);
    for payload in [b"a", b"b", b"c"] {
        sql.publish(&s, payload, None, channel()).await;
    }
    let claimed = claim(sql, &s, 30_000_000, 3).await;
    let held = ids(&claimed);
    assert_eq!(held.len(), 3);
    // Each row's fence is the expiry its claim read back; the third's is one microsecond off.
    let fences: Vec<i64> = claimed
        .iter()
        .enumerate()
        .map(|(i, row)| row.int(UNTIL) + i64::from(i == 2))
        .collect();
    let values = settle.binds(|arg| match arg {
        Arg::IdAt(i) => Value::Int(held[i]),
        Arg::FenceAt(i) => Value::Int(fences[i]),
        other => panic!("no value for {other:?} in {}", settle.sql),
    });
    let before = sql.now().await;
    let mut settled = ids(&sql.query(settle, &values).await);
    let after = sql.now().await;
    settled.sort_unstable();
    assert_eq!(
        settled,
        held[..2],
        "marks {marks}: the third's fence is off"
    );
    let open = sql.ids_where(table, "processed_at IS NULL").await;
    assert_eq!(open, [held[2]], "marks {marks}: only the third is left");
    if marks {
        let cleared = sql
            .ids_where(table, "processed_at IS NOT NULL AND locked_until IS NULL")
            .await;
        assert_eq!(cleared.len(), 2);
        for id in &held[..2] {
            let marked = sql
                .stored(table, "processed_at", *id)
                .await
                .expect("the row is marked");
            assert_db_time(marked, before, after, 0, "processed_at");
        }
    }
}

/// Two lease claims in open transactions: the second skips the rows the first holds, in
/// claim order; on MySQL and MariaDB the locking read and a mark for each batch size up to
/// the workers'. SQLite takes one writer at a time: not applicable there.
pub async fn statements_lease_claims_skip_held_rows<R: Rows, H: Harness>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    if harness.dialect() == Dialect::Sqlite {
        return Err(crate::NotApplicable {
            harness: harness.name(),
            reason: "SQLite takes one writer at a time".to_owned(),
        });
    }
    let (db, table) = start(harness, "cf_sql_lease_skip", test).await;
    let mut a = Sql::open(harness, &db).await;
    let mut b = Sql::open(harness, &db).await;
    a.create(table).await;
    let workers = 3;
    let s = Statements::render(harness.dialect(), &lease_desc(table), workers);
    let now = a.now().await;
    for (payload, due) in [
        (&b"late"[..], -1_000_000),
        (b"early", -2_000_000),
        (b"third", -500_000),
    ] {
        a.publish(&s, payload, Some(now + due), channel()).await;
    }
    a.publish(&s, b"future", Some(now + 3_600_000_000), channel())
        .await;
    let all = a.ids_by_payload(table).await;
    let id_of = |payload: &[u8]| all.iter().find(|(_, p)| p == payload).expect("a row").0;
    let read = claim_read(&s);
    let lease = 30_000_000;
    let read_for = |limit: i64| {
        binds(
            read,
            &[
                (Arg::LeaseFor, Value::Int(lease)),
                (Arg::Limit, Value::Int(limit)),
            ],
        )
    };
    a.execute(&s.begin, &[]).await;
    let mine = a.query(read, &read_for(1)).await;
    assert_eq!(ids(&mine), vec![id_of(b"early")]);
    b.execute(&s.begin, &[]).await;
    let before = b.now().await;
    let theirs = b.query(read, &read_for(10)).await;
    let after = b.now().await;
    assert_eq!(
        ids(&theirs),
        vec![id_of(b"late"), id_of(b"third")],
        "B skips A's held row and the future one, in claim order"
    );
    let until = theirs[0].int(UNTIL);
    assert!(
        theirs.iter().all(|r| r.int(UNTIL) == until),
        "one read of the clock"
    );
    assert_db_time(until, before, after, lease, "B's expiry");
    b.execute(&s.rollback, &[]).await;
    a.execute(&s.rollback, &[]).await;
    if a.is_mysql() {
        let marks = (1..=workers + 1).filter(|&n| s.of_kind(StatementKind::MarkLease(n)).is_some());
        assert_eq!(
            marks.count(),
            workers,
            "a mark for each batch size up to the workers'"
        );
        assert!(s.of_kind(StatementKind::MarkLease(workers + 1)).is_none());
    }
    finish(harness, &mut a, &db, table).await
}

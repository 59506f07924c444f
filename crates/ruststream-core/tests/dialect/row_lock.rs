//! The exact text of the row lock form per dialect.

use super::*;

#[test]
fn postgres_row_lock_statements() {
    let s = render(Dialect::Postgres, &ROW_LOCK);
    assert_eq!(s.form, Form::RowLock);
    assert_eq!(&*s.begin.sql, "BEGIN");
    assert_eq!(&*s.commit.sql, "COMMIT");
    assert_eq!(&*s.rollback.sql, "ROLLBACK");
    assert!(
        s.lock_row.is_none() && s.count_attempt.is_none(),
        "with an attempt column the claim counts in one statement, then locks the counted row"
    );
    assert_eq!(
        sql(&render(Dialect::Postgres, &ROW_LOCK_PLAIN).lock_row),
        r#"SELECT * FROM "jobs" ORDER BY "id" ASC LIMIT 1 FOR UPDATE SKIP LOCKED"#
    );
    assert_eq!(
        sql(&s.count_row),
        r#"WITH rs_claim AS (SELECT "id" FROM "jobs" ORDER BY "id" ASC LIMIT $1 FOR UPDATE SKIP LOCKED), rs_marked AS (SELECT "id" FROM rs_claim WHERE pg_try_advisory_lock(hashtext('jobs'), hashtext("id"::text)) LIMIT $2), rs_counted AS (UPDATE "jobs" SET "attempt" = COALESCE("jobs"."attempt", 0) + 1 FROM rs_marked WHERE "jobs"."id" = rs_marked."id" RETURNING "jobs"."id", "jobs"."attempt") SELECT rs_claim."id", rs_counted."attempt", hashtext(rs_claim."id"::text) AS rs_mark FROM rs_claim LEFT JOIN rs_counted ON rs_counted."id" = rs_claim."id""#
    );
    // A count of one row: the lock releases its mark once it took the row, in the CTE's outer
    // select, which runs only on a row the CTE locked.
    let FormStatements::RowLock(f) =
        &Statements::render(Dialect::Postgres, ROW_LOCK.desc(), 2).form
    else {
        panic!("the row lock form");
    };
    let RowLockClaim::Count {
        lock_row_by_id_unmarking,
        ..
    } = &f.claim
    else {
        panic!("PostgreSQL counts in one statement");
    };
    assert_eq!(
        &*lock_row_by_id_unmarking.sql,
        r#"WITH rs_locked AS (SELECT * FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 FOR UPDATE SKIP LOCKED) SELECT rs_locked.*, pg_advisory_unlock(hashtext('jobs'), CAST($3 AS INTEGER)) AS rs_unmarked FROM rs_locked"#
    );
    // The marks the count took are released, by their second keys, once the counted rows'
    // locks have answered.
    assert_eq!(
        sql(&s.unmark_rows),
        "SELECT pg_advisory_unlock(hashtext('jobs'), CAST($1 AS INTEGER)), pg_advisory_unlock(hashtext('jobs'), CAST($2 AS INTEGER))"
    );
    assert_eq!(
        s.unmark_rows.as_ref().map(|u| u.args.to_vec()),
        Some(vec![Arg::MarkAt(0), Arg::MarkAt(1)])
    );
    assert_eq!(
        sql(&s.lock_row_by_id),
        r#"SELECT * FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 FOR UPDATE SKIP LOCKED"#
    );
    assert!(
        s.select_row_id.is_none(),
        "PostgreSQL counts in one statement"
    );
    assert_eq!(
        sql(&s.isolation),
        "SELECT current_setting('transaction_isolation') AS isolation"
    );
    assert_eq!(&*s.settle.sql, r#"DELETE FROM "jobs" WHERE "id" = $1"#);
    assert_eq!(
        s.settle.kind,
        StatementKind::Delete { fenced: false },
        "the row lock form settles without a fence"
    );
    assert_eq!(
        &*s.publish.sql,
        r#"WITH rs_published AS (INSERT INTO "jobs" ("payload") VALUES ($1) RETURNING 1) SELECT pg_notify('ruststream', 'jobs') FROM rs_published"#
    );
    assert_eq!(s.publish.output, Output::Affected);
    assert_eq!(
        &*s.list_columns.sql,
        "SELECT CAST(column_name AS TEXT) AS column_name, CAST(data_type AS TEXT) AS data_type FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name = $1"
    );
    assert_eq!(&*s.list_columns.args, &[Arg::TableName]);
    assert!(s.current_database.is_none());
    assert!(s.claim_lease.is_none() && s.candidates.is_none() && s.try_lock.is_none());
}

#[test]
fn mysql_row_lock_statements() {
    for dialect in [Dialect::MySql, Dialect::MariaDb] {
        let s = render(dialect, &ROW_LOCK);
        assert_eq!(&*s.begin.sql, "START TRANSACTION");
        assert!(
            s.lock_row.is_none(),
            "with an attempt column the claim counts first"
        );
        assert_eq!(
            sql(&render(dialect, &ROW_LOCK_PLAIN).lock_row),
            "SELECT * FROM `jobs` ORDER BY `id` ASC LIMIT 1 FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            sql(&s.count_attempt),
            "UPDATE `jobs` SET `attempt` = COALESCE(`attempt`, 0) + 1 WHERE `id` IN (?)"
        );
        assert_eq!(
            sql(&s.select_row_id),
            "SELECT `id`, COALESCE(`attempt`, 0) AS `attempt`, SHA2(CONCAT('ruststream mark ', COALESCE(DATABASE(), ''), '.', 'jobs', ' ', `id`), 256) AS rs_mark FROM `jobs` WHERE IS_FREE_LOCK(SHA2(CONCAT('ruststream mark ', COALESCE(DATABASE(), ''), '.', 'jobs', ' ', `id`), 256)) = 1 ORDER BY `id` ASC LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        let FormStatements::RowLock(f) = &Statements::render(dialect, ROW_LOCK.desc(), 2).form
        else {
            panic!("the row lock form");
        };
        let RowLockClaim::SelectCount {
            lock_row_by_id_unmarking,
            ..
        } = &f.claim
        else {
            panic!("{dialect:?} counts after a select");
        };
        assert_eq!(
            &*lock_row_by_id_unmarking.sql,
            "SELECT `jobs`.*, RELEASE_LOCK(?) AS rs_unmarked FROM `jobs` WHERE `id` = ? AND `attempt` = ? FOR UPDATE SKIP LOCKED"
        );
        // Each mark is taken once, without waiting, before the count; released after the
        // locks.
        assert_eq!(
            sql(&s.mark_rows),
            "SELECT 0 AS rs_at, GET_LOCK(?, 0) AS rs_marked UNION ALL SELECT 1 AS rs_at, GET_LOCK(?, 0) AS rs_marked"
        );
        assert_eq!(
            sql(&s.unmark_rows),
            "SELECT RELEASE_LOCK(?), RELEASE_LOCK(?)"
        );
        // One count statement per number of rows a count takes, up to the batch.
        let FormStatements::RowLock(f) = &Statements::render(dialect, ROW_LOCK.desc(), 3).form
        else {
            panic!("the row lock form");
        };
        let RowLockClaim::SelectCount { count_attempts, .. } = &f.claim else {
            panic!("{dialect:?} counts after a select");
        };
        assert_eq!(
            count_attempts.iter().map(|s| &*s.sql).collect::<Vec<_>>(),
            [
                "UPDATE `jobs` SET `attempt` = COALESCE(`attempt`, 0) + 1 WHERE `id` IN (?)",
                "UPDATE `jobs` SET `attempt` = COALESCE(`attempt`, 0) + 1 WHERE `id` IN (?, ?)",
                "UPDATE `jobs` SET `attempt` = COALESCE(`attempt`, 0) + 1 WHERE `id` IN (?, ?, ?)",
            ]
        );
        assert_eq!(
            sql(&s.lock_row_by_id),
            "SELECT * FROM `jobs` WHERE `id` = ? AND `attempt` = ? FOR UPDATE SKIP LOCKED"
        );
        assert!(
            s.count_row.is_none(),
            "{dialect:?} has no UPDATE .. RETURNING"
        );
        assert_eq!(sql(&s.current_database), "SELECT DATABASE() AS db");
        assert!(s.isolation.is_none(), "{dialect:?} has no isolation check");
        assert_eq!(
            &*s.list_columns.sql,
            "SELECT column_name AS column_name, column_type AS data_type FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = ?"
        );
    }
}

#[test]
fn sqlite_refuses_the_row_lock_form() {
    let mut broker: Broker<()> = Broker::new(Dialect::Sqlite);
    let refused = broker.subscribe(*ROW_LOCK.desc(), SubscribeOptions::default(), Time(0));
    assert!(
        matches!(
            refused,
            Err(ruststream_core::BrokerError::Desc(
                ruststream_core::DescError::NoRowLocks { .. }
            ))
        ),
        "SQLite has no row locks: {refused:?}"
    );
    assert!(
        broker.poll_command().is_none(),
        "nothing runs for a refused table"
    );
    let s = render(Dialect::Sqlite, &LEASE);
    assert!(s.isolation.is_none());
    assert!(s.current_database.is_none());
    assert_eq!(&*s.begin.sql, "BEGIN IMMEDIATE");
    for statement in s.all() {
        assert!(
            !statement.sql.contains("FOR UPDATE"),
            "SQLite statement {:?} locks rows: {}",
            statement.kind,
            statement.sql
        );
    }
}

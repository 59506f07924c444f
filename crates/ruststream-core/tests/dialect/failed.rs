//! Failed rows and delayed retries, the history of errors, redrive and deletion.

use super::*;

/// The statements of failed rows and delayed retries, per form, in PostgreSQL and MySQL: the
/// failed mark is the database's time, a retry's due time the database's time plus a delay.
#[test]
fn failed_rows_and_delayed_retries() {
    row_lock_fail_and_retry();
    lease_fail_and_retry();
    advisory_fail_without_retry();
}

/// The row lock form fails and retries by id; its claim passes over failed rows.
fn row_lock_fail_and_retry() {
    let row_lock = |d| Statements::render(d, FAILING_ROW_LOCK.desc(), 1);
    let FormStatements::RowLock(f) = row_lock(Dialect::Postgres).form else {
        panic!("row lock");
    };
    assert_eq!(
        &*f.fail.as_ref().unwrap().sql,
        format!(
            r#"UPDATE "jobs" SET "failed_at" = {PG_NOW}, "error" = COALESCE($1, "error") WHERE "id" = $2"#
        )
    );
    assert_eq!(&*f.fail.as_ref().unwrap().args, &[Arg::Error, Arg::Id]);
    assert_eq!(
        &*f.retry.as_ref().unwrap().sql,
        format!(
            r#"UPDATE "jobs" SET "due_at" = {}, "error" = COALESCE($2, "error") WHERE "id" = $3"#,
            pg_plus(PG_NOW, 1)
        )
    );
    assert_eq!(
        &*f.retry.as_ref().unwrap().args,
        &[Arg::RetryIn, Arg::Error, Arg::Id]
    );
    // The claim passes over failed rows.
    let RowLockClaim::Count { count_row, .. } = &f.claim else {
        panic!("counts");
    };
    assert!(
        count_row
            .sql
            .contains(&format!(r#""failed_at" IS NULL AND "due_at" <= {PG_NOW} "#)),
        "{}",
        count_row.sql
    );
    let FormStatements::RowLock(f) = row_lock(Dialect::MySql).form else {
        panic!("row lock");
    };
    assert_eq!(
        &*f.fail.as_ref().unwrap().sql,
        format!(
            "UPDATE `jobs` SET `failed_at` = {MY_NOW}, `error` = COALESCE(?, `error`) WHERE `id` = ?"
        )
    );
    assert_eq!(&*f.fail.as_ref().unwrap().args, &[Arg::Error, Arg::Id]);
    assert_eq!(
        &*f.retry.as_ref().unwrap().sql,
        format!(
            "UPDATE `jobs` SET `due_at` = TIMESTAMPADD(MICROSECOND, ?, {MY_NOW}), `error` = COALESCE(?, `error`) WHERE `id` = ?"
        )
    );
    assert_eq!(
        &*f.retry.as_ref().unwrap().args,
        &[Arg::RetryIn, Arg::Error, Arg::Id]
    );
}

/// The lease form: fenced; a retry without a due column writes the lease's expiry.
fn lease_fail_and_retry() {
    let FormStatements::Lease(f) =
        Statements::render(Dialect::Postgres, FAILING_LEASE.desc(), 1).form
    else {
        panic!("lease");
    };
    assert_eq!(
        &*f.fail.as_ref().unwrap().sql,
        format!(
            r#"UPDATE "jobs" SET "failed_at" = {PG_NOW}, "error" = COALESCE($1, "error"), "locked_until" = NULL WHERE "id" = $2 AND "locked_until" = {}"#,
            pg_time(3)
        )
    );
    assert_eq!(
        &*f.fail.as_ref().unwrap().args,
        &[Arg::Error, Arg::Id, Arg::Fence]
    );
    assert_eq!(
        &*f.retry.sql,
        format!(
            r#"UPDATE "jobs" SET "locked_until" = {}, "error" = COALESCE($2, "error") WHERE "id" = $3 AND "locked_until" = {}"#,
            pg_plus(PG_NOW, 1),
            pg_time(4)
        )
    );
    assert_eq!(
        &*f.retry.args,
        &[Arg::RetryIn, Arg::Error, Arg::Id, Arg::Fence]
    );
    // With a due column: the due time, and the lease cleared.
    let FormStatements::Lease(f) = Statements::render(Dialect::Sqlite, LEASE.desc(), 1).form else {
        panic!("lease");
    };
    assert_eq!(
        &*f.retry.sql,
        format!(
            r#"UPDATE "jobs" SET "due_at" = ({LITE_NOW} + ?1), "locked_until" = NULL WHERE "id" = ?2 AND "locked_until" = ?3"#
        )
    );
    assert_eq!(&*f.retry.args, &[Arg::RetryIn, Arg::Id, Arg::Fence]);
    assert!(f.fail.is_none(), "no failed_at, no failed mark");
}

/// The advisory form without a due or an error column writes no retry.
fn advisory_fail_without_retry() {
    let FormStatements::Advisory(f) =
        Statements::render(Dialect::MariaDb, FAILING_ADVISORY.desc(), 1).form
    else {
        panic!("advisory");
    };
    assert!(f.retry.is_none());
    assert_eq!(
        &*f.fail.as_ref().unwrap().sql,
        format!("UPDATE `video_jobs` SET `failed_at` = {MY_NOW} WHERE `id` = ?")
    );
    assert_eq!(&*f.fail.as_ref().unwrap().args, &[Arg::Id]);
    assert!(
        f.candidates.sql.contains("`failed_at` IS NULL"),
        "{}",
        f.candidates.sql
    );
}

const HISTORY: InboxSpec<(Payload, Attempt, Due, Failed, ErrorText)> =
    FAILING_ROW_LOCK.errors(Column::new("errors"));

const HISTORY_ONLY: InboxSpec<(Advisory, Attempt, Payload, Failed)> =
    FAILING_ADVISORY.errors(Column::new("errors"));

/// A history of errors: each failed or retried attempt with an error appends its attempt, the
/// database's time and the error, drops the oldest past `ERRORS_KEPT` (ten), and starts a new
/// array where the cell holds none; without an error the cell stays.
#[test]
fn a_history_of_errors_appends_each_attempts_error() {
    assert_eq!(ruststream_core::ERRORS_KEPT, 10);
    history_in_the_row_lock_form();
    history_alone_in_the_advisory_form();
    // The schema writes the column as JSON where the database has the type.
    for (dialect, ty) in [
        (Dialect::Postgres, r#""errors" JSONB NULL"#),
        (Dialect::MariaDb, "`errors` JSON NULL"),
        (Dialect::Sqlite, r#""errors" TEXT NULL"#),
    ] {
        let ddl = HISTORY.ddl(dialect).to_string();
        assert!(ddl.contains(ty), "{dialect:?}: {ddl}");
    }
}

/// The row lock form appends to the history on PostgreSQL and MySQL.
fn history_in_the_row_lock_form() {
    let FormStatements::RowLock(f) = Statements::render(Dialect::Postgres, HISTORY.desc(), 1).form
    else {
        panic!("row lock");
    };
    let pg_history =
        r#"CASE WHEN jsonb_typeof("errors") = 'array' THEN "errors" ELSE '[]'::jsonb END"#;
    let pg_errors = format!(
        r#""errors" = CASE WHEN CAST($1 AS TEXT) IS NULL THEN "errors" ELSE (CASE WHEN jsonb_array_length({pg_history}) >= 10 THEN {pg_history} - 0 ELSE {pg_history} END) || jsonb_build_array(jsonb_build_object('attempt', "attempt", 'at', CAST(EXTRACT(EPOCH FROM {PG_NOW}) * 1000000 AS BIGINT), 'error', CAST($1 AS TEXT))) END"#
    );
    assert_eq!(
        &*f.fail.as_ref().unwrap().sql,
        format!(
            r#"UPDATE "jobs" SET "failed_at" = {PG_NOW}, "error" = COALESCE($1, "error"), {pg_errors} WHERE "id" = $2"#
        )
    );
    assert_eq!(&*f.fail.as_ref().unwrap().args, &[Arg::Error, Arg::Id]);
    assert!(
        f.retry
            .as_ref()
            .unwrap()
            .sql
            .contains(&pg_errors.replace("$1", "$2")),
        "{}",
        f.retry.as_ref().unwrap().sql
    );

    let FormStatements::RowLock(f) = Statements::render(Dialect::MySql, HISTORY.desc(), 1).form
    else {
        panic!("row lock");
    };
    let my_history = "CASE WHEN JSON_VALID(`errors`) THEN CASE WHEN JSON_TYPE(`errors`) = 'ARRAY' THEN `errors` ELSE JSON_ARRAY() END ELSE JSON_ARRAY() END";
    assert_eq!(
        &*f.fail.as_ref().unwrap().sql,
        format!(
            "UPDATE `jobs` SET `failed_at` = {MY_NOW}, `error` = COALESCE(?, `error`), `errors` = CASE WHEN ? IS NULL THEN `errors` ELSE JSON_ARRAY_APPEND(CASE WHEN JSON_LENGTH({my_history}) >= 10 THEN JSON_REMOVE({my_history}, '$[0]') ELSE {my_history} END, '$', JSON_OBJECT('attempt', `attempt`, 'at', TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', {MY_NOW}), 'error', CONVERT(? USING utf8mb4))) END WHERE `id` = ?"
        )
    );
    assert_eq!(
        &*f.fail.as_ref().unwrap().args,
        &[Arg::Error, Arg::Error, Arg::Error, Arg::Id]
    );
}

/// No error column, no due column: the history alone makes a retry's statement, and its
/// argument's first use is typed on PostgreSQL.
fn history_alone_in_the_advisory_form() {
    let FormStatements::Advisory(f) =
        Statements::render(Dialect::Postgres, HISTORY_ONLY.desc(), 1).form
    else {
        panic!("advisory");
    };
    let retry = f.retry.as_ref().expect("the history is written on a retry");
    assert!(
        retry.sql.starts_with(
            r#"UPDATE "video_jobs" SET "errors" = CASE WHEN CAST($1 AS TEXT) IS NULL"#
        ),
        "{}",
        retry.sql
    );
    assert_eq!(&*retry.args, &[Arg::Error, Arg::Id]);

    let FormStatements::Advisory(f) =
        Statements::render(Dialect::Sqlite, HISTORY_ONLY.desc(), 1).form
    else {
        panic!("advisory");
    };
    let lite_history = r#"CASE WHEN json_valid("errors") THEN CASE WHEN json_type("errors") = 'array' THEN "errors" ELSE '[]' END ELSE '[]' END"#;
    assert_eq!(
        &*f.fail.as_ref().unwrap().sql,
        format!(
            r#"UPDATE "video_jobs" SET "failed_at" = {LITE_NOW}, "errors" = CASE WHEN ?1 IS NULL THEN "errors" ELSE json_insert(CASE WHEN json_array_length({lite_history}) >= 10 THEN json_remove({lite_history}, '$[0]') ELSE {lite_history} END, '$[#]', json_object('attempt', "attempt", 'at', {LITE_NOW}, 'error', ?1)) END WHERE "id" = ?2"#
        )
    );
}

/// Redrive and the deletion of failed rows: all, by id, by the error's text.
#[test]
fn redrive_and_delete_of_failed_rows() {
    let desc = FAILING_ROW_LOCK.desc();
    let all = Statements::redrive(Dialect::Postgres, desc, FailedRows::All).unwrap();
    assert_eq!(
        &*all.sql,
        format!(
            r#"UPDATE "jobs" SET "failed_at" = NULL, "error" = NULL, "attempt" = 0, "due_at" = {PG_NOW} WHERE "failed_at" IS NOT NULL"#
        )
    );
    assert!(
        all.args.is_empty(),
        "due at the database's time: {:?}",
        all.args
    );
    let ids = Statements::redrive(Dialect::Sqlite, desc, FailedRows::Ids(2)).unwrap();
    assert_eq!(
        &*ids.sql,
        format!(
            r#"UPDATE "jobs" SET "failed_at" = NULL, "error" = NULL, "attempt" = 0, "due_at" = {LITE_NOW} WHERE "failed_at" IS NOT NULL AND "id" IN (?1, ?2)"#
        )
    );
    assert_eq!(&*ids.args, &[Arg::IdAt(0), Arg::IdAt(1)]);
    let ids = Statements::delete_failed(Dialect::MySql, desc, FailedRows::Ids(2)).unwrap();
    assert_eq!(
        &*ids.sql,
        "DELETE FROM `jobs` WHERE `failed_at` IS NOT NULL AND `id` IN (?, ?)"
    );
    assert_eq!(&*ids.args, &[Arg::IdAt(0), Arg::IdAt(1)]);
    let like = Statements::delete_failed(Dialect::Sqlite, desc, FailedRows::ErrorContains).unwrap();
    assert_eq!(
        &*like.sql,
        r#"DELETE FROM "jobs" WHERE "failed_at" IS NOT NULL AND "error" LIKE ?1 ESCAPE '!'"#
    );
    assert_eq!(
        ruststream_core::error_like("50% of a_b!"),
        "%50!% of a!_b!!%"
    );
    let lease =
        Statements::redrive(Dialect::MariaDb, FAILING_LEASE.desc(), FailedRows::All).unwrap();
    assert_eq!(
        &*lease.sql,
        "UPDATE `jobs` SET `failed_at` = NULL, `error` = NULL, `attempt` = 0, `locked_until` = NULL WHERE `failed_at` IS NOT NULL"
    );
    assert!(Statements::redrive(Dialect::Postgres, ROW_LOCK.desc(), FailedRows::All).is_none());
}

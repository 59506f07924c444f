//! The statement text of every dialect: exact SQL for a representative set of statements, and
//! properties that hold for every statement of every description in every dialect (quoting,
//! placeholders against `args`, `FOR UPDATE SKIP LOCKED` only where the form calls for it).
//! Then the broker: it renders a subscription's statements once and hands out that text.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ruststream_core::dialect::{
    AdvisoryTake, FormStatements, KeyLocks, LeaseClaim, RowLockClaim, UNTIL,
};
use ruststream_core::spec::{
    Advisory, Attempt, Column, Due, ErrorText, Failed, InboxSpec, KeyPart, Lease, OrderBy, Payload,
    Processed, own,
};
use ruststream_core::{
    Action, Arg, Broker, ColumnType, Dialect, Event, FailedRows, Form, NOTIFY_CHANNEL, OutColumn,
    Output, Publish, Reply, Row, Statement, StatementKind, Statements, SubscribeOptions, TableDesc,
    Time, Value, notification_names,
};

const DIALECTS: [Dialect; 4] = [
    Dialect::Postgres,
    Dialect::MySql,
    Dialect::MariaDb,
    Dialect::Sqlite,
];

/// The database's clock, as each dialect reads it: every time a statement writes into a row
/// or compares with one.
const PG_NOW: &str = "statement_timestamp()";
const MY_NOW: &str = "UTC_TIMESTAMP(6)";
const LITE_NOW: &str =
    "(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)";

/// A PostgreSQL time as microseconds since the Unix epoch.
fn pg_micros(expr: &str) -> String {
    format!("CAST(EXTRACT(EPOCH FROM {expr}) * 1000000 AS BIGINT)")
}

/// A MySQL or MariaDB time as microseconds since the Unix epoch.
fn my_micros(expr: &str) -> String {
    format!("TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', {expr})")
}

/// A bound time (microseconds since the Unix epoch) as a PostgreSQL `timestamptz`: `$n`.
fn pg_time(n: u32) -> String {
    format!("(TIMESTAMPTZ 'epoch' + CAST(${n} AS BIGINT) * INTERVAL '1 microsecond')")
}

/// The PostgreSQL time `base` plus bound microseconds `$n`.
fn pg_plus(base: &str, n: u32) -> String {
    format!("({base} + CAST(${n} AS BIGINT) * INTERVAL '1 microsecond')")
}

/// A bound time as a MySQL or MariaDB `DATETIME(6)`.
const MY_TIME: &str = "TIMESTAMPADD(MICROSECOND, ?, TIMESTAMP'1970-01-01 00:00:00')";

const ROW_LOCK: InboxSpec<(Payload, Attempt)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated());

const ROW_LOCK_PLAIN: InboxSpec<(Payload,)> =
    InboxSpec::new("jobs", Column::new("id").generated()).payload(Column::new("payload"));

const LEASE: InboxSpec<(Payload, Attempt, Lease, Processed, Due)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"))
        .processed_at(Column::new("processed_at"))
        .due(Column::new("due_at"));

const LEASE_PLAIN: InboxSpec<(Payload, Lease)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .lease(Column::new("locked_until"));

const VIDEO_KEY: &[KeyPart] = &[KeyPart::Literal("video_jobs-"), KeyPart::Column("channel")];

const ADVISORY: InboxSpec<(Advisory, Attempt, Payload)> =
    InboxSpec::new("video_jobs", Column::new("id").generated())
        .advisory(VIDEO_KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"));

const ADVISORY_PLAIN: InboxSpec<(Advisory, Payload, Processed, Due)> =
    InboxSpec::new("video_jobs", Column::new("id").generated())
        .advisory(VIDEO_KEY)
        .payload(Column::new("payload"))
        .processed_at(Column::new("processed_at"))
        .due(Column::new("due_at"));

const CUSTOM: InboxSpec<(Advisory, Payload, own::Lock, own::Unlock)> =
    InboxSpec::new("payouts", Column::new("id").generated())
        .advisory(&[KeyPart::Literal("accounts-"), KeyPart::Column("account_id")])
        .payload(Column::new("payload"))
        .own::<own::Lock>()
        .own::<own::Unlock>();

/// A key on the row's generated id: publishing must not write the id.
const ADVISORY_ON_ID: InboxSpec<(Advisory, Payload)> =
    InboxSpec::new("single_jobs", Column::new("id").generated())
        .advisory(&[KeyPart::Literal("single-"), KeyPart::Column("id")])
        .payload(Column::new("payload"));

const SCHEMA: InboxSpec<(Payload,)> =
    InboxSpec::new("app.jobs", Column::new("id")).payload(Column::new("payload"));

const ORDER: InboxSpec<(Payload, Due)> = InboxSpec::new("jobs", Column::new("id").generated())
    .payload(Column::new("payload"))
    .due(Column::new("due_at"))
    .order(&[OrderBy::desc("priority"), OrderBy::asc("due_at")]);

/// Names that hold both quote characters.
const QUOTED: InboxSpec<(Payload, Attempt, Lease)> =
    InboxSpec::new("odd\"na`me", Column::new("i\"d").generated())
        .payload(Column::new("pay`load"))
        .attempt(Column::new("att\"empt"))
        .lease(Column::new("lock`ed"));

const QUOTED_ADVISORY: InboxSpec<(Advisory,)> =
    InboxSpec::new("odd\"na`me", Column::new("i\"d").generated())
        .advisory(&[KeyPart::Literal("it's-\\"), KeyPart::Column("ch`an\"nel")]);

fn descs() -> Vec<(&'static str, TableDesc)> {
    vec![
        ("row lock", *ROW_LOCK.desc()),
        ("lease", *LEASE.desc()),
        ("plain lease", *LEASE_PLAIN.desc()),
        ("advisory", *ADVISORY.desc()),
        ("plain advisory", *ADVISORY_PLAIN.desc()),
        ("custom lock", *CUSTOM.desc()),
        ("advisory on id", *ADVISORY_ON_ID.desc()),
        ("schema.table", *SCHEMA.desc()),
        ("order", *ORDER.desc()),
        ("quoted", *QUOTED.desc()),
        ("quoted advisory", *QUOTED_ADVISORY.desc()),
        ("failing row lock", *FAILING_ROW_LOCK.desc()),
        ("failing lease", *FAILING_LEASE.desc()),
        ("failing advisory", *FAILING_ADVISORY.desc()),
    ]
}

const FAILING_ROW_LOCK: InboxSpec<(Payload, Attempt, Due, Failed, ErrorText)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .due(Column::new("due_at"))
        .failed(Column::new("failed_at"))
        .error(Column::new("error"));

const FAILING_LEASE: InboxSpec<(Payload, Attempt, Lease, Failed, ErrorText)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"))
        .failed(Column::new("failed_at"))
        .error(Column::new("error"));

const FAILING_ADVISORY: InboxSpec<(Advisory, Attempt, Payload, Failed)> =
    InboxSpec::new("video_jobs", Column::new("id").generated())
        .advisory(VIDEO_KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .failed(Column::new("failed_at"));

/// The statements of failed rows and delayed retries, per form, in PostgreSQL and MySQL: the
/// failed mark is the database's time, a retry's due time the database's time plus a delay.
#[test]
fn failed_rows_and_delayed_retries() {
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
    // The lease form: fenced; a retry without a due column writes the lease's expiry.
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
    // The advisory form without a due or an error column writes no retry.
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

    // No error column, no due column: the history alone makes a retry's statement, and its
    // argument's first use is typed on PostgreSQL.
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

fn render(dialect: Dialect, desc: &InboxSpec<impl Sized>) -> Flat {
    Flat::of(Statements::render(dialect, desc.desc(), 2))
}

/// Every statement of a rendering by its role, the form's own as options: the texts are
/// asserted by name whatever form rendered them.
struct Flat {
    statements: Statements,
    dialect: Dialect,
    form: Form,
    begin: Statement,
    commit: Statement,
    rollback: Statement,
    list_columns: Statement,
    current_database: Option<Statement>,
    publish: Statement,
    isolation: Option<Statement>,
    lock_row: Option<Statement>,
    count_row: Option<Statement>,
    select_row_id: Option<Statement>,
    count_attempt: Option<Statement>,
    lock_row_by_id: Option<Statement>,
    mark_rows: Option<Statement>,
    unmark_rows: Option<Statement>,
    claim_lease: Option<Statement>,
    select_lease: Option<Statement>,
    mark_lease: Vec<Statement>,
    extend_lease: Option<Statement>,
    release_lease: Option<Statement>,
    candidates: Option<Statement>,
    try_lock: Option<Statement>,
    unlock: Option<Statement>,
    take: Option<Statement>,
    take_count: Option<Statement>,
    read_row: Option<Statement>,
    settle: Statement,
    ping: Option<Statement>,
}

impl Flat {
    fn of(statements: Statements) -> Self {
        let none = || None::<Statement>;
        let mut flat = Flat {
            dialect: statements.dialect,
            form: statements.form(),
            begin: statements.begin.clone(),
            commit: statements.commit.clone(),
            rollback: statements.rollback.clone(),
            list_columns: statements.list_columns.clone(),
            current_database: statements.current_database.clone(),
            publish: statements.publish.clone(),
            isolation: none(),
            lock_row: none(),
            count_row: none(),
            select_row_id: none(),
            count_attempt: none(),
            lock_row_by_id: none(),
            mark_rows: none(),
            unmark_rows: none(),
            claim_lease: none(),
            select_lease: none(),
            mark_lease: Vec::new(),
            extend_lease: none(),
            release_lease: none(),
            candidates: none(),
            try_lock: none(),
            unlock: none(),
            take: none(),
            take_count: none(),
            read_row: none(),
            settle: statements.publish.clone(),
            ping: none(),
            statements: statements.clone(),
        };
        match &statements.form {
            FormStatements::RowLock(f) => {
                flat.isolation = f.isolation.clone();
                match &f.claim {
                    RowLockClaim::Lock { lock_row } => flat.lock_row = Some(lock_row.clone()),
                    RowLockClaim::Count {
                        count_row,
                        lock_row_by_id,
                        unmark_rows,
                        ..
                    } => {
                        flat.count_row = Some(count_row.clone());
                        flat.lock_row_by_id = Some(lock_row_by_id.clone());
                        flat.unmark_rows = unmark_rows.get(1).cloned();
                    }
                    RowLockClaim::SelectCount {
                        select_row_id,
                        mark_rows,
                        count_attempts,
                        lock_row_by_id,
                        unmark_rows,
                        ..
                    } => {
                        flat.select_row_id = Some(select_row_id.clone());
                        flat.mark_rows = mark_rows.get(1).cloned();
                        flat.count_attempt = count_attempts.first().cloned();
                        flat.lock_row_by_id = Some(lock_row_by_id.clone());
                        flat.unmark_rows = unmark_rows.get(1).cloned();
                    }
                }
                flat.settle = f.settle.clone();
                flat.ping = Some(f.ping.clone());
            }
            FormStatements::Lease(f) => {
                match &f.claim {
                    LeaseClaim::Returning { claim } => flat.claim_lease = Some(claim.clone()),
                    LeaseClaim::Locking { select, mark } => {
                        flat.select_lease = Some(select.clone());
                        flat.mark_lease = mark.clone();
                    }
                }
                flat.extend_lease = Some(f.extend.clone());
                flat.release_lease = Some(f.release.clone());
                flat.settle = f.settle.clone();
            }
            FormStatements::Advisory(f) => {
                flat.candidates = Some(f.candidates.clone());
                if let KeyLocks::Database { try_lock, unlock } = &f.keys {
                    flat.try_lock = Some(try_lock.clone());
                    flat.unlock = Some(unlock.clone());
                }
                match &f.take {
                    AdvisoryTake::Returning { take } => flat.take = Some(take.clone()),
                    AdvisoryTake::CountThenRead {
                        take_count,
                        read_row,
                    } => {
                        flat.take_count = Some(take_count.clone());
                        flat.read_row = Some(read_row.clone());
                    }
                }
                flat.settle = f.settle.clone();
                flat.ping = f.ping.clone();
            }
        }
        flat
    }

    fn mark_lease(&self, n: usize) -> Option<&Statement> {
        match &self.statements.form {
            FormStatements::Lease(f) => f.claim.mark(n),
            _ => None,
        }
    }

    fn all(&self) -> Vec<&Statement> {
        self.statements.all()
    }
}

fn sql(statement: &Option<Statement>) -> &str {
    &statement.as_ref().expect("the statement is rendered").sql
}

// ----- exact text -----

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

/// The rows a lease claim reads: the id, the attempt, then the expiry its lease got by the
/// database's clock.
fn claimed_columns(attempt: bool) -> Output {
    let mut columns = vec![OutColumn::new("id", ColumnType::Id)];
    if attempt {
        columns.push(OutColumn::new("attempt", ColumnType::Int));
    }
    columns.push(OutColumn::new("rs_until", ColumnType::Int));
    Output::Rows {
        columns: columns.into(),
        raw: true,
    }
}

#[test]
fn postgres_lease_statements() {
    assert_eq!(UNTIL, "rs_until");
    let s = render(Dialect::Postgres, &LEASE);
    // The lease is the database's time plus a bound duration, and its expiry is read back.
    assert_eq!(
        sql(&s.claim_lease),
        format!(
            r#"WITH rs_claim AS (SELECT "id" FROM "jobs" WHERE "processed_at" IS NULL AND "due_at" <= {PG_NOW} AND ("locked_until" IS NULL OR "locked_until" <= {PG_NOW}) ORDER BY "due_at" ASC, "id" ASC LIMIT $1 FOR UPDATE SKIP LOCKED) UPDATE "jobs" SET "locked_until" = {}, "attempt" = COALESCE("attempt", 0) + 1 FROM rs_claim WHERE "jobs"."id" = rs_claim."id" RETURNING "jobs".*, {} AS rs_until"#,
            pg_plus(PG_NOW, 2),
            pg_micros(r#""jobs"."locked_until""#)
        )
    );
    assert_eq!(
        &*s.claim_lease.as_ref().unwrap().args,
        &[Arg::Limit, Arg::LeaseFor]
    );
    assert_eq!(
        s.claim_lease.as_ref().unwrap().output,
        claimed_columns(true)
    );
    // An extension moves the expiry the row holds, fenced by it.
    assert_eq!(
        sql(&s.extend_lease),
        format!(
            r#"UPDATE "jobs" SET "locked_until" = {} WHERE "id" = $2 AND "locked_until" = {}"#,
            pg_plus(r#""locked_until""#, 1),
            pg_time(3)
        )
    );
    assert_eq!(
        &*s.extend_lease.as_ref().unwrap().args,
        &[Arg::Extend, Arg::Id, Arg::Fence]
    );
    assert_eq!(
        sql(&s.release_lease),
        format!(
            r#"UPDATE "jobs" SET "locked_until" = NULL WHERE "id" = $1 AND "locked_until" = {}"#,
            pg_time(2)
        )
    );
    assert_eq!(
        &*s.release_lease.as_ref().unwrap().args,
        &[Arg::Id, Arg::Fence]
    );
    assert_eq!(
        &*s.settle.sql,
        format!(
            r#"UPDATE "jobs" SET "processed_at" = {PG_NOW}, "locked_until" = NULL WHERE "id" = $1 AND "locked_until" = {}"#,
            pg_time(2)
        )
    );
    assert_eq!(s.settle.kind, StatementKind::MarkProcessed { fenced: true });
    assert_eq!(&*s.settle.args, &[Arg::Id, Arg::Fence]);
    // A row published without a due time is due at the database's time.
    assert_eq!(
        &*s.publish.sql,
        format!(
            r#"WITH rs_published AS (INSERT INTO "jobs" ("payload", "due_at") VALUES ($1, COALESCE({}, {PG_NOW})) RETURNING 1) SELECT pg_notify('ruststream', 'jobs') FROM rs_published"#,
            pg_time(2)
        )
    );
    assert_eq!(&*s.publish.args, &[Arg::Payload, Arg::Due]);
    assert!(s.select_lease.is_none() && s.mark_lease.is_empty());
    assert!(
        s.isolation.is_none(),
        "only the row lock form checks isolation"
    );
}

#[test]
fn mysql_lease_statements() {
    let t = MY_TIME;
    for dialect in [Dialect::MySql, Dialect::MariaDb] {
        let s = render(dialect, &LEASE);
        assert!(
            s.claim_lease.is_none(),
            "{dialect:?} has no UPDATE .. RETURNING"
        );
        // The locking read reads the expiry the database's clock gives the lease; the mark
        // writes that expiry, bound back as the fence.
        assert_eq!(
            sql(&s.select_lease),
            format!(
                "SELECT `jobs`.*, {} AS rs_until FROM `jobs` WHERE `processed_at` IS NULL AND `due_at` <= {MY_NOW} AND (`locked_until` IS NULL OR `locked_until` <= {MY_NOW}) ORDER BY `due_at` ASC, `id` ASC LIMIT ? FOR UPDATE SKIP LOCKED",
                my_micros(&format!("TIMESTAMPADD(MICROSECOND, ?, {MY_NOW})"))
            )
        );
        assert_eq!(
            &*s.select_lease.as_ref().unwrap().args,
            &[Arg::LeaseFor, Arg::Limit]
        );
        assert_eq!(
            s.select_lease.as_ref().unwrap().output,
            claimed_columns(true)
        );
        assert_eq!(
            &*s.mark_lease(2).unwrap().sql,
            format!(
                "UPDATE `jobs` SET `locked_until` = {t}, `attempt` = COALESCE(`attempt`, 0) + 1 WHERE `id` IN (?, ?)"
            )
        );
        assert_eq!(
            &*s.mark_lease(2).unwrap().args,
            &[Arg::Fence, Arg::IdAt(0), Arg::IdAt(1)]
        );
        assert_eq!(
            sql(&s.extend_lease),
            format!(
                "UPDATE `jobs` SET `locked_until` = TIMESTAMPADD(MICROSECOND, ?, `locked_until`) WHERE `id` = ? AND `locked_until` = {t}"
            )
        );
        assert_eq!(
            &*s.extend_lease.as_ref().unwrap().args,
            &[Arg::Extend, Arg::Id, Arg::Fence]
        );
        assert_eq!(
            &*s.settle.sql,
            format!(
                "UPDATE `jobs` SET `processed_at` = {MY_NOW}, `locked_until` = NULL WHERE `id` = ? AND `locked_until` = {t}"
            )
        );
        assert_eq!(&*s.settle.args, &[Arg::Id, Arg::Fence]);
        assert_eq!(
            &*s.publish.sql,
            format!("INSERT INTO `jobs` (`payload`, `due_at`) VALUES (?, COALESCE({t}, {MY_NOW}))")
        );
        assert_eq!(&*s.publish.args, &[Arg::Payload, Arg::Due]);
    }
}

#[test]
fn sqlite_lease_statements() {
    let s = render(Dialect::Sqlite, &LEASE);
    assert_eq!(
        sql(&s.claim_lease),
        format!(
            r#"UPDATE "jobs" SET "locked_until" = ({LITE_NOW} + ?1), "attempt" = COALESCE("attempt", 0) + 1 WHERE "id" IN (SELECT "id" FROM "jobs" WHERE "processed_at" IS NULL AND "due_at" <= {LITE_NOW} AND ("locked_until" IS NULL OR "locked_until" <= {LITE_NOW}) ORDER BY "due_at" ASC, "id" ASC LIMIT ?2) RETURNING *, "locked_until" AS rs_until"#
        )
    );
    assert_eq!(
        &*s.claim_lease.as_ref().unwrap().args,
        &[Arg::LeaseFor, Arg::Limit]
    );
    assert_eq!(
        s.claim_lease.as_ref().unwrap().output,
        claimed_columns(true)
    );
    assert_eq!(
        sql(&s.extend_lease),
        r#"UPDATE "jobs" SET "locked_until" = ("locked_until" + ?1) WHERE "id" = ?2 AND "locked_until" = ?3"#
    );
    assert_eq!(
        &*s.extend_lease.as_ref().unwrap().args,
        &[Arg::Extend, Arg::Id, Arg::Fence]
    );
    assert_eq!(
        sql(&s.release_lease),
        r#"UPDATE "jobs" SET "locked_until" = NULL WHERE "id" = ?1 AND "locked_until" = ?2"#
    );
    assert_eq!(
        &*s.settle.sql,
        format!(
            r#"UPDATE "jobs" SET "processed_at" = {LITE_NOW}, "locked_until" = NULL WHERE "id" = ?1 AND "locked_until" = ?2"#
        )
    );
    assert_eq!(&*s.settle.args, &[Arg::Id, Arg::Fence]);
    assert_eq!(
        &*s.publish.sql,
        format!(
            r#"INSERT INTO "jobs" ("payload", "due_at") VALUES (?1, COALESCE(?2, {LITE_NOW}))"#
        )
    );
    let plain = render(Dialect::Sqlite, &LEASE_PLAIN);
    assert_eq!(
        &*plain.settle.sql,
        r#"DELETE FROM "jobs" WHERE "id" = ?1 AND "locked_until" = ?2"#
    );
    assert_eq!(plain.settle.kind, StatementKind::Delete { fenced: true });
    assert_eq!(
        sql(&plain.claim_lease),
        format!(
            r#"UPDATE "jobs" SET "locked_until" = ({LITE_NOW} + ?1) WHERE "id" IN (SELECT "id" FROM "jobs" WHERE ("locked_until" IS NULL OR "locked_until" <= {LITE_NOW}) ORDER BY "id" ASC LIMIT ?2) RETURNING *, "locked_until" AS rs_until"#
        )
    );
    assert_eq!(
        &*plain.claim_lease.as_ref().unwrap().args,
        &[Arg::LeaseFor, Arg::Limit]
    );
    assert_eq!(
        plain.claim_lease.as_ref().unwrap().output,
        claimed_columns(false)
    );
}

#[test]
fn postgres_advisory_statements() {
    let s = render(Dialect::Postgres, &ADVISORY);
    assert_eq!(
        sql(&s.candidates),
        r#"SELECT "id" AS rs_id, ('video_jobs-' || CAST("channel" AS TEXT)) AS rs_key FROM "video_jobs" ORDER BY "id" ASC LIMIT $1"#
    );
    assert_eq!(
        s.candidates.as_ref().unwrap().output,
        Output::Rows {
            columns: vec![
                OutColumn::new("rs_id", ColumnType::Id),
                OutColumn::new("rs_key", ColumnType::Text)
            ]
            .into(),
            raw: false
        }
    );
    assert_eq!(
        sql(&s.try_lock),
        "SELECT pg_try_advisory_lock($1) AS locked"
    );
    assert_eq!(&*s.try_lock.as_ref().unwrap().args, &[Arg::Key]);
    assert_eq!(sql(&s.unlock), "SELECT pg_advisory_unlock($1) AS unlocked");
    assert_eq!(
        sql(&s.take),
        r#"UPDATE "video_jobs" SET "attempt" = COALESCE("attempt", 0) + 1 WHERE "id" = $1 RETURNING *"#
    );
    assert!(s.take_count.is_none());
    assert_eq!(
        &*s.publish.sql,
        r#"WITH rs_published AS (INSERT INTO "video_jobs" ("payload", "channel") VALUES ($1, $2) RETURNING 1) SELECT pg_notify('ruststream', 'video_jobs') FROM rs_published"#
    );
    assert_eq!(&*s.publish.args, &[Arg::Payload, Arg::Column("channel")]);
    assert!(s.lock_row.is_none() && s.isolation.is_none() && s.claim_lease.is_none());

    let plain = render(Dialect::Postgres, &ADVISORY_PLAIN);
    assert_eq!(
        sql(&plain.candidates),
        format!(
            r#"SELECT "id" AS rs_id, ('video_jobs-' || CAST("channel" AS TEXT)) AS rs_key FROM "video_jobs" WHERE "processed_at" IS NULL AND "due_at" <= {PG_NOW} ORDER BY "due_at" ASC, "id" ASC LIMIT $1"#
        )
    );
    assert_eq!(&*plain.candidates.as_ref().unwrap().args, &[Arg::Limit]);
    assert_eq!(
        sql(&plain.take),
        format!(
            r#"SELECT * FROM "video_jobs" WHERE "id" = $1 AND "processed_at" IS NULL AND "due_at" <= {PG_NOW}"#
        ),
        "without an attempt column the take reads the row while it is claimable"
    );
    assert_eq!(&*plain.take.as_ref().unwrap().args, &[Arg::Id]);
}

#[test]
fn mysql_advisory_statements() {
    for dialect in [Dialect::MySql, Dialect::MariaDb] {
        let s = render(dialect, &ADVISORY);
        assert_eq!(
            sql(&s.candidates),
            "SELECT `id` AS rs_id, CONCAT('video_jobs-', CAST(`channel` AS CHAR)) AS rs_key FROM `video_jobs` ORDER BY `id` ASC LIMIT ?"
        );
        assert_eq!(sql(&s.try_lock), "SELECT GET_LOCK(?, 0) AS locked");
        assert_eq!(sql(&s.unlock), "SELECT RELEASE_LOCK(?) AS unlocked");
        assert!(s.take.is_none(), "{dialect:?} counts, then reads");
        assert_eq!(
            sql(&s.take_count),
            "UPDATE `video_jobs` SET `attempt` = COALESCE(`attempt`, 0) + 1 WHERE `id` = ?"
        );
        assert_eq!(
            sql(&s.read_row),
            "SELECT * FROM `video_jobs` WHERE `id` = ?"
        );
        let plain = render(dialect, &ADVISORY_PLAIN);
        assert_eq!(
            sql(&plain.take),
            format!(
                "SELECT * FROM `video_jobs` WHERE `id` = ? AND `processed_at` IS NULL AND `due_at` <= {MY_NOW}"
            )
        );
        assert_eq!(&*plain.take.as_ref().unwrap().args, &[Arg::Id]);
        assert!(plain.take_count.is_none());
    }
}

#[test]
fn sqlite_advisory_statements() {
    let s = render(Dialect::Sqlite, &ADVISORY);
    assert_eq!(
        sql(&s.candidates),
        r#"SELECT "id" AS rs_id, ('video_jobs-' || CAST("channel" AS TEXT)) AS rs_key FROM "video_jobs" ORDER BY "id" ASC LIMIT ?1"#
    );
    assert!(s.try_lock.is_none(), "SQLite has no session locks");
    assert!(s.unlock.is_none(), "SQLite has no session locks");
    assert_eq!(
        sql(&s.take),
        r#"UPDATE "video_jobs" SET "attempt" = COALESCE("attempt", 0) + 1 WHERE "id" = ?1 RETURNING *"#
    );
}

#[test]
fn custom_lock_keeps_the_dialect_claim() {
    let s = render(Dialect::Sqlite, &CUSTOM);
    assert_eq!(s.form, Form::Advisory);
    assert_eq!(
        sql(&s.candidates),
        r#"SELECT "id" AS rs_id, ('accounts-' || CAST("account_id" AS TEXT)) AS rs_key FROM "payouts" ORDER BY "id" ASC LIMIT ?1"#
    );
    assert_eq!(sql(&s.take), r#"SELECT * FROM "payouts" WHERE "id" = ?1"#);
    let s = render(Dialect::MariaDb, &CUSTOM);
    assert_eq!(
        sql(&s.candidates),
        "SELECT `id` AS rs_id, CONCAT('accounts-', CAST(`account_id` AS CHAR)) AS rs_key FROM `payouts` ORDER BY `id` ASC LIMIT ?"
    );
}

#[test]
fn a_key_on_the_generated_id_is_not_published() {
    for dialect in DIALECTS {
        let s = render(dialect, &ADVISORY_ON_ID);
        assert_eq!(
            &*s.publish.args,
            &[Arg::Payload],
            "{dialect:?}: {}",
            s.publish.sql
        );
        assert!(
            !s.publish.sql.contains(&dialect.quote("id")),
            "{dialect:?} writes the generated id: {}",
            s.publish.sql
        );
        let key = sql(&s.candidates);
        assert!(
            key.contains(&format!("CAST({} AS", dialect.quote("id"))),
            "{key}"
        );
    }
}

#[test]
fn schema_qualified_names() {
    let pg = render(Dialect::Postgres, &SCHEMA);
    assert_eq!(
        &*pg.list_columns.sql,
        "SELECT CAST(column_name AS TEXT) AS column_name, CAST(data_type AS TEXT) AS data_type FROM information_schema.columns \
         WHERE table_schema = $1 AND table_name = $2"
    );
    assert_eq!(&*pg.list_columns.args, &[Arg::Schema, Arg::TableName]);
    assert_eq!(
        sql(&pg.lock_row),
        r#"SELECT * FROM "app"."jobs" ORDER BY "id" ASC LIMIT 1 FOR UPDATE SKIP LOCKED"#
    );
    assert_eq!(
        &*pg.publish.sql,
        r#"WITH rs_published AS (INSERT INTO "app"."jobs" ("id", "payload") VALUES ($1, $2) RETURNING 1) SELECT pg_notify('ruststream', 'app.jobs') FROM rs_published"#,
        "an id the service writes is published"
    );
    let my = render(Dialect::MySql, &SCHEMA);
    assert_eq!(
        &*my.list_columns.sql,
        "SELECT column_name AS column_name, column_type AS data_type FROM information_schema.columns \
         WHERE table_schema = ? AND table_name = ?"
    );
    assert_eq!(&*my.settle.sql, "DELETE FROM `app`.`jobs` WHERE `id` = ?");
    let lite = render(Dialect::Sqlite, &SCHEMA);
    assert_eq!(
        &*lite.list_columns.sql,
        "SELECT name AS column_name, type AS data_type FROM pragma_table_info(?1, ?2)"
    );
    assert_eq!(&*lite.list_columns.args, &[Arg::TableName, Arg::Schema]);
    assert_eq!(
        sql(&lite.lock_row),
        r#"SELECT * FROM "app"."jobs" ORDER BY "id" ASC LIMIT 1 FOR UPDATE SKIP LOCKED"#
    );
}

#[test]
fn custom_order() {
    let pg = render(Dialect::Postgres, &ORDER);
    assert_eq!(
        sql(&pg.lock_row),
        format!(
            r#"SELECT * FROM "jobs" WHERE "due_at" <= {PG_NOW} ORDER BY "priority" DESC, "due_at" ASC, "id" ASC LIMIT 1 FOR UPDATE SKIP LOCKED"#
        )
    );
    assert!(pg.lock_row.as_ref().unwrap().args.is_empty());
    let maria = render(Dialect::MariaDb, &ORDER);
    assert_eq!(
        sql(&maria.lock_row),
        format!(
            "SELECT * FROM `jobs` WHERE `due_at` <= {MY_NOW} ORDER BY `priority` DESC, `due_at` ASC, `id` ASC LIMIT 1 FOR UPDATE SKIP LOCKED"
        )
    );
    assert!(maria.lock_row.as_ref().unwrap().args.is_empty());
    const BY_ID_DESC: InboxSpec<(Payload, Lease)> =
        InboxSpec::new("jobs", Column::new("id").generated())
            .payload(Column::new("payload"))
            .lease(Column::new("locked_until"))
            .order(&[OrderBy::desc("id")]);
    let s = render(Dialect::Sqlite, &BY_ID_DESC);
    assert!(
        sql(&s.claim_lease).contains(r#"ORDER BY "id" DESC LIMIT ?2) RETURNING"#),
        "an order that names the id is not extended: {}",
        sql(&s.claim_lease)
    );
}

#[test]
fn postgres_publish_notifies_and_the_others_do_not() {
    assert_eq!(NOTIFY_CHANNEL, "ruststream");
    assert_eq!(
        Dialect::Postgres.listen_statement(),
        Some("LISTEN ruststream"),
        "the unquoted channel folds to the lower case pg_notify names"
    );
    assert_eq!(
        Dialect::Postgres.notify_statement("app.jobs").as_deref(),
        Some("SELECT pg_notify('ruststream', 'app.jobs')")
    );
    for dialect in [Dialect::MySql, Dialect::MariaDb, Dialect::Sqlite] {
        assert_eq!(dialect.listen_statement(), None, "{dialect:?}");
        assert_eq!(dialect.notify_statement("jobs"), None, "{dialect:?}");
        for (name, desc) in descs() {
            let s = Flat::of(Statements::render(dialect, &desc, 2));
            assert!(
                s.publish.sql.starts_with("INSERT INTO ") && !s.publish.sql.contains("notify"),
                "{name}, {dialect:?}: {}",
                s.publish.sql
            );
        }
    }
    for (name, desc) in descs() {
        let s = Flat::of(Statements::render(Dialect::Postgres, &desc, 2));
        let tail = format!(
            " RETURNING 1) SELECT pg_notify('ruststream', '{}') FROM rs_published",
            desc.table.replace('\'', "''")
        );
        assert!(
            s.publish
                .sql
                .starts_with("WITH rs_published AS (INSERT INTO ")
                && s.publish.sql.ends_with(&tail),
            "{name}: {}",
            s.publish.sql
        );
        assert_eq!(s.publish.output, Output::Affected, "{name}");
    }
    const ALL_GENERATED: InboxSpec<()> = InboxSpec::new("it's", Column::new("id").generated());
    assert_eq!(
        &*render(Dialect::Postgres, &ALL_GENERATED).publish.sql,
        r#"WITH rs_published AS (INSERT INTO "it's" DEFAULT VALUES RETURNING 1) SELECT pg_notify('ruststream', 'it''s') FROM rs_published"#,
        "a quote in the table's name is doubled in the payload"
    );
}

#[test]
fn a_notification_names_its_table_with_or_without_schema() {
    assert!(notification_names("jobs", "jobs"));
    assert!(notification_names("app.jobs", "app.jobs"));
    assert!(notification_names("jobs", "app.jobs"));
    assert!(notification_names("app.jobs", "jobs"));
    assert!(!notification_names("jobs", "jobs_archive"));
    assert!(!notification_names("app.jobs", "app.other"));
}

#[test]
fn names_with_quote_characters_are_escaped() {
    let pg = render(Dialect::Postgres, &QUOTED);
    assert_eq!(
        sql(&pg.claim_lease),
        format!(
            r#"WITH rs_claim AS (SELECT "i""d" FROM "odd""na`me" WHERE ("lock`ed" IS NULL OR "lock`ed" <= {PG_NOW}) ORDER BY "i""d" ASC LIMIT $1 FOR UPDATE SKIP LOCKED) UPDATE "odd""na`me" SET "lock`ed" = {}, "att""empt" = COALESCE("att""empt", 0) + 1 FROM rs_claim WHERE "odd""na`me"."i""d" = rs_claim."i""d" RETURNING "odd""na`me".*, {} AS rs_until"#,
            pg_plus(PG_NOW, 2),
            pg_micros(r#""odd""na`me"."lock`ed""#)
        )
    );
    let my = render(Dialect::MariaDb, &QUOTED);
    assert_eq!(
        sql(&my.select_lease),
        format!(
            "SELECT `odd\"na``me`.*, {} AS rs_until FROM `odd\"na``me` WHERE (`lock``ed` IS NULL OR `lock``ed` <= {MY_NOW}) ORDER BY `i\"d` ASC LIMIT ? FOR UPDATE SKIP LOCKED",
            my_micros(&format!("TIMESTAMPADD(MICROSECOND, ?, {MY_NOW})"))
        )
    );
    assert_eq!(
        sql(&my.extend_lease),
        format!(
            "UPDATE `odd\"na``me` SET `lock``ed` = TIMESTAMPADD(MICROSECOND, ?, `lock``ed`) WHERE `i\"d` = ? AND `lock``ed` = {MY_TIME}"
        )
    );
    let my = render(Dialect::MySql, &QUOTED);
    assert_eq!(
        &*my.publish.sql,
        "INSERT INTO `odd\"na``me` (`pay``load`) VALUES (?)"
    );
    let my = render(Dialect::MariaDb, &QUOTED_ADVISORY);
    assert_eq!(
        sql(&my.candidates),
        "SELECT `i\"d` AS rs_id, CONCAT('it''s-\\\\', CAST(`ch``an\"nel` AS CHAR)) AS rs_key FROM `odd\"na``me` ORDER BY `i\"d` ASC LIMIT ?",
        "MySQL escapes a quote and a backslash in a key literal"
    );
    let lite = render(Dialect::Sqlite, &QUOTED_ADVISORY);
    assert_eq!(
        sql(&lite.candidates),
        r#"SELECT "i""d" AS rs_id, ('it''s-\' || CAST("ch`an""nel" AS TEXT)) AS rs_key FROM "odd""na`me" ORDER BY "i""d" ASC LIMIT ?1"#
    );
    assert_eq!(Dialect::Postgres.quote("a.b\"c"), r#""a"."b""c""#);
    assert_eq!(Dialect::MySql.quote("a.b`c"), "`a`.`b``c`");
}

#[test]
fn a_dotted_column_is_one_identifier() {
    const DOTTED: InboxSpec<(Advisory, Payload)> =
        InboxSpec::new("app.jobs", Column::new("id").generated())
            .advisory(&[KeyPart::Column("meta.channel")])
            .payload(Column::new("body.bytes"));
    let pg = render(Dialect::Postgres, &DOTTED);
    assert_eq!(
        sql(&pg.candidates),
        r#"SELECT "id" AS rs_id, CAST("meta.channel" AS TEXT) AS rs_key FROM "app"."jobs" ORDER BY "id" ASC LIMIT $1"#
    );
    assert_eq!(
        &*pg.publish.sql,
        r#"WITH rs_published AS (INSERT INTO "app"."jobs" ("body.bytes", "meta.channel") VALUES ($1, $2) RETURNING 1) SELECT pg_notify('ruststream', 'app.jobs') FROM rs_published"#
    );
    let my = render(Dialect::MySql, &DOTTED);
    assert_eq!(
        &*my.publish.sql,
        "INSERT INTO `app`.`jobs` (`body.bytes`, `meta.channel`) VALUES (?, ?)"
    );
}

// ----- properties over every description and dialect -----

/// A placeholder found outside quoted text: `$n`, `?n` or a bare `?`.
#[derive(Debug, PartialEq, Eq)]
enum Mark {
    Dollar(usize),
    Numbered(usize),
    Bare,
}

/// The placeholders of `sql`, skipping string literals and quoted identifiers (a doubled
/// quote inside them is an escaped quote; on MySQL a backslash escapes inside a string).
fn placeholders(dialect: Dialect, sql: &str) -> Vec<Mark> {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let number = |i: &mut usize| {
        let start = *i;
        while *i < chars.len() && chars[*i].is_ascii_digit() {
            *i += 1;
        }
        chars[start..*i]
            .iter()
            .collect::<String>()
            .parse::<usize>()
            .ok()
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\'' | '"' | '`' => {
                i += 1;
                loop {
                    assert!(i < chars.len(), "unterminated {c} in {sql}");
                    if c == '\'' && chars[i] == '\\' && dialect_is_mysql(dialect) {
                        i += 2;
                        continue;
                    }
                    if chars[i] == c {
                        if chars.get(i + 1) == Some(&c) {
                            i += 2;
                            continue;
                        }
                        i += 1;
                        break;
                    }
                    i += 1;
                }
            }
            '$' => {
                i += 1;
                let n = number(&mut i).unwrap_or_else(|| panic!("a bare `$` in {sql}"));
                out.push(Mark::Dollar(n));
            }
            '?' => {
                i += 1;
                match number(&mut i) {
                    Some(n) => out.push(Mark::Numbered(n)),
                    None => out.push(Mark::Bare),
                }
            }
            _ => i += 1,
        }
    }
    out
}

fn dialect_is_mysql(dialect: Dialect) -> bool {
    matches!(dialect, Dialect::MySql | Dialect::MariaDb)
}

#[test]
fn placeholders_match_args_in_every_statement() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            let s = Flat::of(Statements::render(dialect, &desc, 3));
            for st in s.all() {
                let marks = placeholders(dialect, &st.sql);
                let what = format!("{name}, {dialect:?}, {:?}: {}", st.kind, st.sql);
                match dialect {
                    Dialect::MySql | Dialect::MariaDb => {
                        assert!(marks.iter().all(|m| *m == Mark::Bare), "{what}");
                        assert_eq!(marks.len(), st.args.len(), "one arg per `?`: {what}");
                    }
                    Dialect::Postgres | Dialect::Sqlite => {
                        let numbers: Vec<usize> = marks
                            .iter()
                            .map(|m| match (dialect, m) {
                                (Dialect::Postgres, Mark::Dollar(n)) => *n,
                                (Dialect::Sqlite, Mark::Numbered(n)) => *n,
                                _ => panic!("wrong placeholder {m:?}: {what}"),
                            })
                            .collect();
                        let mut used: Vec<usize> = numbers.clone();
                        used.sort_unstable();
                        used.dedup();
                        let expected: Vec<usize> = (1..=st.args.len()).collect();
                        assert_eq!(used, expected, "every arg used, none past the last: {what}");
                        for (i, a) in st.args.iter().enumerate() {
                            assert!(
                                !st.args[..i].contains(a),
                                "{a:?} listed twice instead of its number reused: {what}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn args_are_the_ones_each_statement_needs() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            let s = Flat::of(Statements::render(dialect, &desc, 2));
            for st in s.all() {
                let what = format!("{name}, {dialect:?}, {:?}: {}", st.kind, st.sql);
                for arg in st.args.iter() {
                    let allowed = match st.kind {
                        StatementKind::Begin
                        | StatementKind::Commit
                        | StatementKind::Rollback
                        | StatementKind::CurrentDatabase
                        | StatementKind::Notify
                        | StatementKind::Ping
                        | StatementKind::Savepoint
                        | StatementKind::RollbackToSavepoint
                        | StatementKind::ReadCommitted
                        | StatementKind::Isolation
                        | StatementKind::Maintenance(_) => false,
                        StatementKind::ListColumns => {
                            matches!(arg, Arg::TableName | Arg::Schema)
                        }
                        // The claims compare with the database's clock: they bind no time.
                        StatementKind::LockRow => false,
                        StatementKind::Candidates => matches!(arg, Arg::Limit | Arg::Floor),
                        StatementKind::ClaimLease => {
                            matches!(arg, Arg::Limit | Arg::LeaseFor | Arg::Floor)
                        }
                        StatementKind::SelectLease => matches!(arg, Arg::Limit | Arg::LeaseFor),
                        // MySQL and MariaDB write the expiry their locking read read.
                        StatementKind::MarkLease(n) => {
                            matches!(arg, Arg::Fence) || matches!(arg, Arg::IdAt(i) if *i < n)
                        }
                        StatementKind::ExtendLease => {
                            matches!(arg, Arg::Extend | Arg::Id | Arg::Fence)
                        }
                        StatementKind::ReleaseLease => matches!(arg, Arg::Id | Arg::Fence),
                        StatementKind::TryLock | StatementKind::Unlock => *arg == Arg::Key,
                        StatementKind::ReadRow => *arg == Arg::Id,
                        StatementKind::CountAttempt => matches!(arg, Arg::IdAt(_)),
                        StatementKind::CountRow => {
                            matches!(arg, Arg::Limit | Arg::Take | Arg::Floor)
                        }
                        StatementKind::SelectRowId => *arg == Arg::Limit,
                        StatementKind::MarkRows(n) | StatementKind::UnmarkRows(n) => {
                            matches!(arg, Arg::MarkAt(i) if *i < n)
                        }
                        StatementKind::LockRowById => matches!(arg, Arg::Id | Arg::Attempt),
                        StatementKind::LockRowByIdUnmarking => {
                            matches!(arg, Arg::Id | Arg::Attempt | Arg::MarkAt(0))
                        }
                        StatementKind::Take | StatementKind::TakeCount => *arg == Arg::Id,
                        StatementKind::Delete { fenced }
                        | StatementKind::MarkProcessed { fenced } => {
                            *arg == Arg::Id || fenced && *arg == Arg::Fence
                        }
                        StatementKind::Publish => {
                            matches!(arg, Arg::Id | Arg::Payload | Arg::Due | Arg::Column(_))
                        }
                        StatementKind::SettleLeases(n) => {
                            matches!(arg, Arg::IdAt(i) | Arg::FenceAt(i) if *i < n)
                        }
                        StatementKind::Fail { fenced } => {
                            matches!(arg, Arg::Id | Arg::Error) || fenced && *arg == Arg::Fence
                        }
                        StatementKind::RetryLater { fenced } => {
                            matches!(arg, Arg::Id | Arg::RetryIn | Arg::Error)
                                || fenced && *arg == Arg::Fence
                        }
                        StatementKind::Redrive(_) | StatementKind::DeleteFailed(_) => {
                            matches!(arg, Arg::IdAt(_) | Arg::ErrorLike)
                        }
                        StatementKind::Stats => false,
                        StatementKind::ListFailed => {
                            matches!(arg, Arg::Id | Arg::Floor | Arg::Limit)
                        }
                        StatementKind::ListIndexes => {
                            matches!(arg, Arg::TableName | Arg::Schema)
                        }
                        StatementKind::CreateSchema => false,
                    };
                    assert!(allowed, "unexpected {arg:?}: {what}");
                }
                if matches!(
                    st.kind,
                    StatementKind::Delete { .. }
                        | StatementKind::MarkProcessed { .. }
                        | StatementKind::ReadRow
                        | StatementKind::Take
                        | StatementKind::TakeCount
                        | StatementKind::ExtendLease
                        | StatementKind::ReleaseLease
                ) {
                    assert!(st.args.contains(&Arg::Id), "names its row: {what}");
                }
                if st.kind == StatementKind::CountAttempt {
                    assert!(st.args.contains(&Arg::IdAt(0)), "names its rows: {what}");
                }
                if matches!(
                    st.kind,
                    StatementKind::Delete { fenced: true }
                        | StatementKind::MarkProcessed { fenced: true }
                        | StatementKind::ExtendLease
                        | StatementKind::ReleaseLease
                ) {
                    assert!(st.args.contains(&Arg::Fence), "fenced: {what}");
                }
                // Each duration is bound where the database's time is moved by it.
                let duration = match st.kind {
                    StatementKind::ClaimLease | StatementKind::SelectLease => Some(Arg::LeaseFor),
                    StatementKind::ExtendLease => Some(Arg::Extend),
                    // Without a due column or a lease a retry writes only the error.
                    StatementKind::RetryLater { .. }
                        if desc.due.is_some() || desc.locked_until().is_some() =>
                    {
                        Some(Arg::RetryIn)
                    }
                    _ => None,
                };
                if let Some(duration) = duration {
                    assert_eq!(
                        st.args.iter().filter(|a| **a == duration).count(),
                        1,
                        "binds {duration:?} once: {what}"
                    );
                }
                if st.kind == StatementKind::MarkLease(1) {
                    assert!(
                        st.args.contains(&Arg::Fence),
                        "writes the expiry read: {what}"
                    );
                }
            }
        }
    }
}

/// Every claim decides whether a row is due and whether its lease ran out by the database's
/// clock; no statement binds a time of the process, only the times a row holds (a fence) or a
/// user gave (a due time).
#[test]
fn times_are_the_database_clock() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            let s = Flat::of(Statements::render(dialect, &desc, 2));
            let now = match dialect {
                Dialect::Postgres => PG_NOW,
                Dialect::MySql | Dialect::MariaDb => MY_NOW,
                Dialect::Sqlite => LITE_NOW,
            };
            for st in s.all() {
                let what = format!("{name}, {dialect:?}, {:?}: {}", st.kind, st.sql);
                let claims = matches!(
                    st.kind,
                    StatementKind::LockRow
                        | StatementKind::CountRow
                        | StatementKind::SelectRowId
                        | StatementKind::LockRowById
                        | StatementKind::LockRowByIdUnmarking
                        | StatementKind::ClaimLease
                        | StatementKind::SelectLease
                        | StatementKind::Candidates
                        | StatementKind::Take
                        | StatementKind::TakeCount
                );
                if claims {
                    if let Some(due) = desc.due {
                        let due = dialect.quote(due.name);
                        assert!(
                            st.sql.contains(&format!("{due} <= {now}")),
                            "due by the database's clock: {what}"
                        );
                    }
                    if let Some(lease) = desc.locked_until() {
                        let lease = dialect.quote(lease.name);
                        assert!(
                            st.sql
                                .contains(&format!("({lease} IS NULL OR {lease} <= {now})")),
                            "a lease run out by the database's clock: {what}"
                        );
                    }
                }
                // A bound time is converted once per placeholder: count the conversions.
                let times = st
                    .args
                    .iter()
                    .filter(|a| matches!(a, Arg::Fence | Arg::FenceAt(_) | Arg::Due | Arg::Tick))
                    .count();
                let conversions = match dialect {
                    Dialect::Postgres => Some(st.sql.matches("(TIMESTAMPTZ 'epoch' + ").count()),
                    Dialect::MySql | Dialect::MariaDb => Some(st.sql.matches(MY_TIME).count()),
                    Dialect::Sqlite => None,
                };
                if let Some(conversions) = conversions {
                    assert_eq!(
                        conversions, times,
                        "only fences and due times bound: {what}"
                    );
                }
                let (marks, writes_now) = match st.kind {
                    StatementKind::MarkProcessed { .. } => (desc.processed_at, true),
                    StatementKind::Fail { .. } => (desc.failed_at, true),
                    _ => (None, false),
                };
                if writes_now {
                    let mark = dialect.quote(marks.expect("the mark's column").name);
                    assert!(
                        st.sql.contains(&format!(" SET {mark} = {now}")),
                        "marked at the database's time: {what}"
                    );
                }
            }
        }
    }
}

#[test]
fn identifiers_are_quoted_per_dialect() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            let s = Flat::of(Statements::render(dialect, &desc, 2));
            let table = dialect.quote(desc.table);
            let (open, other) = if dialect_is_mysql(dialect) {
                ('`', '"')
            } else {
                ('"', '`')
            };
            assert!(table.starts_with(open) && table.ends_with(open), "{table}");
            for st in s.all() {
                let what = format!("{name}, {dialect:?}, {:?}: {}", st.kind, st.sql);
                let touches_table = !matches!(
                    st.kind,
                    StatementKind::Begin
                        | StatementKind::Commit
                        | StatementKind::Rollback
                        | StatementKind::ListColumns
                        | StatementKind::ListIndexes
                        | StatementKind::CurrentDatabase
                        | StatementKind::Isolation
                        | StatementKind::TryLock
                        | StatementKind::Unlock
                        | StatementKind::MarkRows(_)
                        | StatementKind::UnmarkRows(_)
                        | StatementKind::ReadCommitted
                        | StatementKind::Ping
                        | StatementKind::Savepoint
                        | StatementKind::RollbackToSavepoint
                );
                if touches_table {
                    assert!(st.sql.contains(&table), "quotes the table: {what}");
                    if st.kind != StatementKind::Publish {
                        assert!(
                            st.sql.contains(&dialect.quote(desc.id.name)),
                            "quotes the id: {what}"
                        );
                    }
                }
                // The other dialect's identifier quote appears only inside a quoted name.
                if !desc.table.contains(other) && !desc.columns().iter().any(|c| c.contains(other))
                {
                    assert!(!st.sql.contains(other), "foreign quote: {what}");
                }
            }
            // Every described column is written, quoted, in some statement.
            if desc.form() == Form::RowLock && dialect == Dialect::Sqlite {
                continue;
            }
            for column in desc.columns() {
                let quoted = dialect.quote(column);
                assert!(
                    s.all().iter().any(|st| st.sql.contains(&quoted)),
                    "{name}, {dialect:?}: column {column} is never written as {quoted}"
                );
            }
        }
    }
}

#[test]
fn skip_locked_only_where_the_form_and_dialect_call_for_it() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            if desc.form() == Form::RowLock && dialect == Dialect::Sqlite {
                // Refused before anything renders: SQLite has no row locks.
                continue;
            }
            let s = Flat::of(Statements::render(dialect, &desc, 2));
            for st in s.all() {
                let expected = match (st.kind, dialect) {
                    (_, Dialect::Sqlite) => false,
                    (
                        StatementKind::LockRow
                        | StatementKind::LockRowById
                        | StatementKind::LockRowByIdUnmarking
                        | StatementKind::CountRow
                        | StatementKind::SelectRowId,
                        _,
                    ) => true,
                    (StatementKind::SelectLease, Dialect::MySql | Dialect::MariaDb) => true,
                    (StatementKind::ClaimLease, Dialect::Postgres) => true,
                    _ => false,
                };
                let n = st.sql.matches("FOR UPDATE SKIP LOCKED").count();
                assert_eq!(
                    n,
                    usize::from(expected),
                    "{name}, {dialect:?}, {:?}: {}",
                    st.kind,
                    st.sql
                );
                assert_eq!(
                    st.sql.matches("FOR UPDATE").count(),
                    n,
                    "FOR UPDATE without SKIP LOCKED would wait: {}",
                    st.sql
                );
            }
            let claim = match (desc.form(), dialect) {
                (Form::RowLock, _) => s
                    .lock_row
                    .as_ref()
                    .or(s.count_row.as_ref())
                    .or(s.select_row_id.as_ref()),
                (Form::Lease, Dialect::Postgres | Dialect::Sqlite) => s.claim_lease.as_ref(),
                (Form::Lease, _) => s.select_lease.as_ref(),
                (Form::Advisory, _) => s.candidates.as_ref(),
            };
            assert!(claim.is_some(), "{name}, {dialect:?}: a claim statement");
        }
    }
}

#[test]
fn statements_match_the_form() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            if desc.form() == Form::RowLock && dialect == Dialect::Sqlite {
                // Refused before anything renders: SQLite has no row locks.
                continue;
            }
            let s = Flat::of(Statements::render(dialect, &desc, 2));
            let form = desc.form();
            let what = format!("{name}, {dialect:?}");
            assert_eq!(s.form, form, "{what}");
            assert_eq!(s.dialect, dialect, "{what}");
            let mysql = dialect_is_mysql(dialect);
            assert_eq!(s.current_database.is_some(), mysql, "{what}");
            assert_eq!(
                s.isolation.is_some(),
                dialect == Dialect::Postgres && form == Form::RowLock,
                "{what}"
            );
            assert_eq!(
                s.lock_row.is_some(),
                form == Form::RowLock && desc.attempt.is_none(),
                "{what}"
            );
            let counted_row_lock =
                form == Form::RowLock && dialect != Dialect::Sqlite && desc.attempt.is_some();
            assert_eq!(
                s.count_row.is_some(),
                counted_row_lock && dialect == Dialect::Postgres,
                "{what}"
            );
            assert_eq!(
                s.select_row_id.is_some(),
                counted_row_lock && mysql,
                "{what}"
            );
            assert_eq!(s.lock_row_by_id.is_some(), counted_row_lock, "{what}");
            assert_eq!(
                s.count_attempt.is_some(),
                counted_row_lock && mysql,
                "{what}"
            );
            assert_eq!(
                s.claim_lease.is_some(),
                form == Form::Lease && !mysql,
                "{what}"
            );
            assert_eq!(
                s.select_lease.is_some(),
                form == Form::Lease && mysql,
                "{what}"
            );
            assert_eq!(s.extend_lease.is_some(), form == Form::Lease, "{what}");
            assert_eq!(s.release_lease.is_some(), form == Form::Lease, "{what}");
            assert_eq!(s.candidates.is_some(), form == Form::Advisory, "{what}");
            assert_eq!(
                s.try_lock.is_some(),
                form == Form::Advisory && dialect != Dialect::Sqlite && !desc.custom_lock(),
                "{what}"
            );
            assert_eq!(s.unlock.is_some(), s.try_lock.is_some(), "{what}");
            assert_eq!(
                s.take.is_some() || s.take_count.is_some(),
                form == Form::Advisory,
                "{what}"
            );
            assert_eq!(s.read_row.is_some(), s.take_count.is_some(), "{what}");
            assert!(!(s.take.is_some() && s.take_count.is_some()), "{what}");
            assert_eq!(
                s.settle.kind,
                match (desc.processed_at.is_some(), form == Form::Lease) {
                    (true, fenced) => StatementKind::MarkProcessed { fenced },
                    (false, fenced) => StatementKind::Delete { fenced },
                },
                "{what}"
            );
            // Each statement sits in the field of its kind.
            let pairs: [(&Option<Statement>, StatementKind); 4] = [
                (&s.lock_row, StatementKind::LockRow),
                (&s.claim_lease, StatementKind::ClaimLease),
                (&s.candidates, StatementKind::Candidates),
                (&s.try_lock, StatementKind::TryLock),
            ];
            for (statement, kind) in pairs {
                if let Some(statement) = statement {
                    assert_eq!(statement.kind, kind, "{what}");
                }
            }
            if let Some(read_row) = &s.read_row {
                assert_eq!(read_row.kind, StatementKind::ReadRow);
            }
            assert_eq!(s.publish.kind, StatementKind::Publish);
            assert_eq!(s.list_columns.kind, StatementKind::ListColumns);
            // Rows of taken rows carry the id, then the attempt, and the driver's row.
            let row_columns: Vec<OutColumn> =
                std::iter::once(OutColumn::new(desc.id.name, ColumnType::Id))
                    .chain(
                        desc.attempt
                            .map(|a| OutColumn::new(a.name, ColumnType::Int)),
                    )
                    .collect();
            for (statement, kind) in [
                (&s.count_row, StatementKind::CountRow),
                (&s.select_row_id, StatementKind::SelectRowId),
                (&s.lock_row_by_id, StatementKind::LockRowById),
            ] {
                if let Some(statement) = statement {
                    assert_eq!(statement.kind, kind, "{what}");
                }
            }
            // The count reads back the row's id and the attempt it wrote, which the lock then
            // checks, and the row's mark, which keeps other counts off it until the lock.
            let counted = |mark: ColumnType| -> Vec<OutColumn> {
                std::iter::once(OutColumn::new(desc.id.name, ColumnType::Id))
                    .chain(
                        desc.attempt
                            .map(|a| OutColumn::new(a.name, ColumnType::Int)),
                    )
                    .chain([OutColumn::new("rs_mark", mark)])
                    .collect()
            };
            for (statement, mark) in [
                (&s.count_row, ColumnType::Int),
                (&s.select_row_id, ColumnType::Text),
            ] {
                let Some(statement) = statement else {
                    continue;
                };
                assert_eq!(
                    statement.output,
                    Output::Rows {
                        columns: counted(mark).into(),
                        raw: false
                    },
                    "{what}"
                );
            }
            if let Some(lock) = &s.lock_row_by_id {
                assert_eq!(&lock.args[..2], &[Arg::Id, Arg::Attempt], "{what}");
            }
            for st in [&s.lock_row, &s.lock_row_by_id, &s.take, &s.read_row]
                .into_iter()
                .flatten()
            {
                assert_eq!(
                    st.output,
                    Output::Rows {
                        columns: row_columns.clone().into(),
                        raw: true
                    },
                    "{what}, {:?}",
                    st.kind
                );
            }
            // A lease claim reads the expiry it gave each row, by the database's clock, last.
            let claimed: Vec<OutColumn> = row_columns
                .iter()
                .copied()
                .chain([OutColumn::new(UNTIL, ColumnType::Int)])
                .collect();
            for st in [&s.claim_lease, &s.select_lease].into_iter().flatten() {
                assert_eq!(
                    st.output,
                    Output::Rows {
                        columns: claimed.clone().into(),
                        raw: true
                    },
                    "{what}, {:?}",
                    st.kind
                );
            }
        }
    }
}

#[test]
fn mark_lease_for_each_batch_size_on_mysql_and_mariadb_only() {
    for workers in 1..=6 {
        for dialect in DIALECTS {
            for desc in [LEASE.desc(), LEASE_PLAIN.desc(), QUOTED.desc()] {
                let s = Flat::of(Statements::render(dialect, desc, workers));
                if !dialect_is_mysql(dialect) {
                    assert!(s.mark_lease.is_empty(), "{dialect:?}");
                    assert!(s.mark_lease(1).is_none());
                    continue;
                }
                assert_eq!(s.mark_lease.len(), workers, "{dialect:?}");
                assert!(s.mark_lease(0).is_none());
                assert!(s.mark_lease(workers + 1).is_none());
                for n in 1..=workers {
                    let st = s.mark_lease(n).expect("a statement for every batch size");
                    assert_eq!(st.kind, StatementKind::MarkLease(n));
                    assert_eq!(st.output, Output::Affected);
                    let mut args = vec![Arg::Fence];
                    args.extend((0..n).map(Arg::IdAt));
                    assert_eq!(&*st.args, &args[..], "{}", st.sql);
                    let list = vec!["?"; n].join(", ");
                    assert!(
                        st.sql.ends_with(&format!(" IN ({list})")),
                        "{n} ids: {}",
                        st.sql
                    );
                    assert!(s.all().contains(&st), "listed in all()");
                }
            }
        }
    }
    // A batch of zero workers still renders the one-row statement.
    let s = Flat::of(Statements::render(Dialect::MySql, LEASE.desc(), 0));
    assert_eq!(s.mark_lease.len(), 1);
}

#[test]
fn render_is_deterministic() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            let a = Statements::render(dialect, &desc, 4);
            let b = Statements::render(dialect, &desc, 4);
            assert_eq!(a, b, "{name}, {dialect:?}");
            let text = |s: &Statements| {
                s.all()
                    .iter()
                    .map(|st| format!("{:?} {} {:?}", st.kind, st.sql, st.args))
                    .collect::<Vec<_>>()
            };
            assert_eq!(text(&a), text(&b), "{name}, {dialect:?}");
            assert!(
                !Arc::ptr_eq(&a.publish.sql, &b.publish.sql),
                "two renders are two allocations; the broker keeps one"
            );
        }
    }
}

// ----- the broker renders once per subscription -----

/// Answers a command as a table with every described column and no claimable row would.
fn answer(desc: &TableDesc, action: &Action) -> Reply<()> {
    match action {
        Action::Execute { statement, .. } => match statement.kind {
            StatementKind::ListColumns => Reply::Rows(
                desc.columns()
                    .into_iter()
                    .map(|c| Row::values(vec![Value::Text(c.to_owned())]))
                    .collect(),
            ),
            StatementKind::CurrentDatabase => {
                Reply::Rows(vec![Row::values(vec![Value::Text("test".into())])])
            }
            StatementKind::Isolation => Reply::Rows(vec![Row::values(vec![Value::Text(
                "read committed".into(),
            )])]),
            _ => match statement.output {
                Output::Nothing => Reply::Done,
                Output::Affected => Reply::Affected(1),
                Output::Rows { .. } => Reply::Rows(Vec::new()),
            },
        },
        Action::Lock { .. } | Action::Unlock { .. } => Reply::Bool(true),
        Action::Acquire | Action::Release | Action::Close => Reply::Done,
    }
}

#[test]
fn broker_renders_statements_once_per_subscription() {
    let cases = [
        ("row lock", *ROW_LOCK.desc()),
        ("lease", *LEASE.desc()),
        ("advisory", *ADVISORY.desc()),
        ("custom lock", *CUSTOM.desc()),
    ];
    for (name, desc) in cases {
        for dialect in DIALECTS {
            if desc.form() == Form::RowLock && dialect == Dialect::Sqlite {
                continue;
            }
            let mut broker: Broker<()> = Broker::new(dialect);
            let options = SubscribeOptions {
                workers: 2,
                poll_interval: Duration::from_secs(1),
                ..SubscribeOptions::default()
            };
            let sub = broker
                .subscribe(desc, options, Time(1_000_000))
                .expect("the description is valid");
            let publisher = broker.publisher(desc).expect("a publisher");
            let mut seen: BTreeMap<String, Vec<Arc<str>>> = BTreeMap::new();
            let mut now = Time(1_000_000);
            for round in 0..4 {
                while let Some(command) = broker.poll_command() {
                    if let Action::Execute { statement, binds } = &command.action {
                        assert_eq!(binds.len(), statement.args.len(), "{}", statement.sql);
                        seen.entry(format!("{:?}", statement.kind))
                            .or_default()
                            .push(statement.sql.clone());
                    }
                    let reply = answer(&desc, &command.action);
                    broker.handle_reply(command.id, reply, now);
                }
                while let Some(event) = broker.poll_event() {
                    if let Event::CheckFailed { error, .. } = event {
                        panic!("{name}, {dialect:?}: the check failed: {error}");
                    }
                }
                if round < 2 {
                    let row = Publish {
                        payload: b"x".to_vec(),
                        columns: desc
                            .key_columns()
                            .into_iter()
                            .map(|c| (c, Value::Int(7)))
                            .collect(),
                        ..Publish::default()
                    };
                    broker.publish(publisher, row, now).expect("a publish");
                }
                now = now.plus(Duration::from_secs(1));
                broker.handle_timeout(now);
            }
            let statements = Flat::of(
                broker
                    .statements(sub)
                    .expect("the subscription's statements")
                    .clone(),
            );
            let claim = match (desc.form(), dialect) {
                // With an attempt column the row lock claim counts the attempt first.
                (Form::RowLock, _) => statements
                    .count_row
                    .clone()
                    .or_else(|| statements.select_row_id.clone())
                    .or_else(|| statements.lock_row.clone()),
                (Form::Lease, Dialect::MySql | Dialect::MariaDb) => statements.select_lease.clone(),
                (Form::Lease, _) => statements.claim_lease.clone(),
                (Form::Advisory, _) => statements.candidates.clone(),
            }
            .expect("a claim statement");
            let claims = seen
                .get(&format!("{:?}", claim.kind))
                .unwrap_or_else(|| panic!("{name}, {dialect:?}: {:?} never ran", claim.kind));
            assert!(
                claims.len() >= 2,
                "{name}, {dialect:?}: the claim ran {} times",
                claims.len()
            );
            let publishes = &seen["Publish"];
            assert_eq!(publishes.len(), 2, "{name}, {dialect:?}");
            assert!(
                Arc::ptr_eq(&publishes[0], &publishes[1]),
                "{name}, {dialect:?}: a publisher renders its statement once"
            );
            for (kind, texts) in &seen {
                if kind == "Publish" {
                    continue;
                }
                // The start's session check (PostgreSQL) pings its second connection with a
                // statement of its own, rendered once for the process.
                let (session, texts): (Vec<&Arc<str>>, Vec<&Arc<str>>) = texts
                    .iter()
                    .partition(|t| t.starts_with("SELECT pg_backend_pid()"));
                assert!(
                    session.windows(2).all(|w| Arc::ptr_eq(w[0], w[1])),
                    "{name}, {dialect:?}: the session check's ping was rendered again"
                );
                if texts.is_empty() {
                    continue;
                }
                let rendered = statements
                    .all()
                    .into_iter()
                    .find(|st| format!("{:?}", st.kind) == *kind)
                    .unwrap_or_else(|| panic!("{kind} is among the subscription's statements"));
                for text in texts {
                    assert!(
                        Arc::ptr_eq(text, &rendered.sql),
                        "{name}, {dialect:?}: {kind} was rendered again"
                    );
                }
            }
            assert!(!broker.is_closed());
        }
    }
}

/// What each statement leaves of the session's transaction, as the adapters track it to roll
/// back a connection given back with a transaction open.
#[test]
fn transaction_after_each_kind_of_statement() {
    use ruststream_core::StatementKind as K;
    assert_eq!(K::Begin.transaction_after(true), Some(true));
    assert_eq!(K::Begin.transaction_after(false), None);
    assert_eq!(K::Commit.transaction_after(true), Some(false));
    assert_eq!(K::Commit.transaction_after(false), None, "in doubt");
    assert_eq!(K::Rollback.transaction_after(true), Some(false));
    assert_eq!(K::Rollback.transaction_after(false), Some(false));
    for kind in [
        K::CountRow,
        K::LockRowById,
        K::ClaimLease,
        K::TryLock,
        K::Candidates,
    ] {
        assert_eq!(kind.transaction_after(true), None, "{kind:?}");
        assert_eq!(kind.transaction_after(false), None, "{kind:?}");
    }
}

/// A batch insert binds every row's values to placeholders of their own, in row order.
#[test]
fn publish_rows_binds_each_row_on_its_own_placeholders() {
    use ruststream_core::{Column, InboxSpec, KeyPart};
    const KEY: &[KeyPart] = &[KeyPart::Literal("jobs-"), KeyPart::Column("channel")];
    let desc = *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .due(Column::new("due_at"))
        .advisory(KEY)
        .desc();
    for dialect in [
        Dialect::Postgres,
        Dialect::MySql,
        Dialect::MariaDb,
        Dialect::Sqlite,
    ] {
        let one = Statements::render(dialect, &desc, 1).publish;
        let three = Statements::publish_rows(dialect, &desc, 3).expect("columns to write");
        assert_eq!(three.kind, StatementKind::Publish);
        assert_eq!(three.args.len(), 3 * one.args.len(), "{dialect:?}");
        assert_eq!(&three.args[..one.args.len()], &one.args[..], "{dialect:?}");
        assert_eq!(
            three.sql.matches("), (").count(),
            2,
            "{dialect:?}: {}",
            three.sql
        );
        match dialect {
            Dialect::Postgres => {
                let last = format!("${}", three.args.len());
                assert!(three.sql.contains(&last), "{}", three.sql);
                assert!(three.sql.starts_with("WITH rs_published AS (INSERT INTO "));
            }
            Dialect::Sqlite => {
                let last = format!("?{}", three.args.len());
                assert!(three.sql.contains(&last), "{}", three.sql);
            }
            _ => assert_eq!(three.sql.matches('?').count(), three.args.len()),
        }
    }
    let empty = *InboxSpec::new("signals", Column::new("id").generated()).desc();
    assert!(
        Statements::publish_rows(Dialect::Postgres, &empty, 3).is_none(),
        "DEFAULT VALUES writes one row"
    );
}

/// Several lease settlements in one statement: each row fenced by its own lease, the ids
/// settled returned, where the database returns what a `DELETE` or `UPDATE` wrote.
#[test]
fn settle_leases_fences_each_row_and_returns_the_ids_settled() {
    let plain = *LEASE_PLAIN.desc();
    let marked = *LEASE.desc();
    let three = |dialect, desc| Statements::settle_leases(dialect, desc, 3);
    assert_eq!(
        three(Dialect::Postgres, &plain)
            .expect("PostgreSQL")
            .sql
            .as_ref(),
        "DELETE FROM \"jobs\" WHERE (\"id\" = $1 AND \"locked_until\" = \
         (TIMESTAMPTZ 'epoch' + CAST($2 AS BIGINT) * INTERVAL '1 microsecond')) OR (\"id\" = $3 \
         AND \"locked_until\" = (TIMESTAMPTZ 'epoch' + CAST($4 AS BIGINT) * INTERVAL '1 \
         microsecond')) OR (\"id\" = $5 AND \"locked_until\" = (TIMESTAMPTZ 'epoch' + CAST($6 \
         AS BIGINT) * INTERVAL '1 microsecond')) RETURNING \"id\""
    );
    assert_eq!(
        three(Dialect::Sqlite, &plain).expect("SQLite").sql.as_ref(),
        "DELETE FROM \"jobs\" WHERE (\"id\" = ?1 AND \"locked_until\" = ?2) OR \
         (\"id\" = ?3 AND \"locked_until\" = ?4) OR (\"id\" = ?5 AND \"locked_until\" = ?6) \
         RETURNING \"id\""
    );
    let mariadb = three(Dialect::MariaDb, &plain).expect("MariaDB deletes with RETURNING");
    assert!(
        mariadb
            .sql
            .starts_with("DELETE FROM `jobs` WHERE (`id` = ? AND `locked_until` = "),
        "{}",
        mariadb.sql
    );
    assert!(mariadb.sql.ends_with(" RETURNING `id`"), "{}", mariadb.sql);
    assert_eq!(mariadb.sql.matches('?').count(), 6);
    let st = three(Dialect::Postgres, &plain).expect("PostgreSQL");
    assert_eq!(
        st.args.as_ref(),
        [
            Arg::IdAt(0),
            Arg::FenceAt(0),
            Arg::IdAt(1),
            Arg::FenceAt(1),
            Arg::IdAt(2),
            Arg::FenceAt(2)
        ]
    );
    assert_eq!(st.kind, StatementKind::SettleLeases(3));
    assert_eq!(
        st.output,
        Output::Rows {
            columns: [OutColumn::new("id", ColumnType::Id)].as_slice().into(),
            raw: false
        }
    );
    // The processed_at mark clears the lease too.
    let pg = three(Dialect::Postgres, &marked).expect("PostgreSQL");
    assert_eq!(
        &*pg.sql,
        format!(
            r#"UPDATE "jobs" SET "processed_at" = {PG_NOW}, "locked_until" = NULL WHERE ("id" = $1 AND "locked_until" = {}) OR ("id" = $3 AND "locked_until" = {}) OR ("id" = $5 AND "locked_until" = {}) RETURNING "id""#,
            pg_time(2),
            pg_time(4),
            pg_time(6)
        )
    );
    assert_eq!(
        pg.args, st.args,
        "the mark is the database's time: no time bound"
    );
    let lite = three(Dialect::Sqlite, &marked).expect("SQLite");
    assert_eq!(
        &*lite.sql,
        format!(
            r#"UPDATE "jobs" SET "processed_at" = {LITE_NOW}, "locked_until" = NULL WHERE ("id" = ?1 AND "locked_until" = ?2) OR ("id" = ?3 AND "locked_until" = ?4) OR ("id" = ?5 AND "locked_until" = ?6) RETURNING "id""#
        )
    );
    assert_eq!(lite.args, st.args);
    // Neither MySQL nor MariaDB's UPDATE returns the rows it wrote; MySQL's DELETE neither.
    assert!(three(Dialect::MySql, &plain).is_none());
    assert!(three(Dialect::MySql, &marked).is_none());
    assert!(three(Dialect::MariaDb, &marked).is_none());
    assert!(Statements::settles_leases_together(
        Dialect::MariaDb,
        &plain
    ));
    assert!(!Statements::settles_leases_together(
        Dialect::MariaDb,
        &marked
    ));
    // No lease, no batch.
    assert!(Statements::settle_leases(Dialect::Postgres, ROW_LOCK.desc(), 3).is_none());
}

/// The ping of a row claimed ahead: `SELECT 1`, no binds, nothing read, where a session holds
/// the row (the row lock and advisory lock forms on a server); none in the lease form, whose
/// fence decides, nor on SQLite, where no claim takes rows ahead in those forms.
#[test]
fn ping_where_a_session_holds_the_row() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            if desc.form() == Form::RowLock && dialect == Dialect::Sqlite {
                // Refused before anything renders: SQLite has no row locks.
                continue;
            }
            let s = Flat::of(Statements::render(dialect, &desc, 2));
            let holds = desc.form() != Form::Lease && dialect != Dialect::Sqlite;
            match &s.ping {
                Some(ping) => {
                    assert!(holds, "{name}, {dialect:?}: no ping wanted");
                    assert_eq!(&*ping.sql, "SELECT 1", "{name}, {dialect:?}");
                    assert_eq!(ping.kind, StatementKind::Ping);
                    assert!(ping.args.is_empty());
                    assert_eq!(ping.output, Output::Nothing);
                }
                None => assert!(!holds, "{name}, {dialect:?}: a ping wanted"),
            }
        }
    }
}

#[test]
fn columns_read_as_their_declared_types() {
    use ColumnType::{Bool, Id, Int, Text};
    let read = |ty: ColumnType, v: Value| ty.read(v);
    // Booleans: a lock's answer, as PostgreSQL (bool) and MySQL (1, 0) give it.
    assert_eq!(read(Bool, Value::Bool(true)), Ok(Value::Bool(true)));
    assert_eq!(read(Bool, Value::Int(1)), Ok(Value::Bool(true)));
    assert_eq!(read(Bool, Value::Int(0)), Ok(Value::Bool(false)));
    assert!(read(Bool, Value::Int(2)).is_err());
    assert!(read(Bool, Value::Bytes(vec![1])).is_err());
    // Integers: an attempt.
    assert_eq!(read(Int, Value::Int(-4)), Ok(Value::Int(-4)));
    assert_eq!(read(Int, Value::Text("12".into())), Ok(Value::Int(12)));
    assert!(read(Int, Value::Text("twelve".into())).is_err());
    // Text: names, keys and settings, which MySQL 8 may send as binary strings.
    assert_eq!(
        read(Text, Value::Bytes(b"id".to_vec())),
        Ok(Value::Text("id".into()))
    );
    assert_eq!(read(Text, Value::Int(7)), Ok(Value::Text("7".into())));
    assert_eq!(
        read(Text, Value::Bytes(vec![b'k', 0xff])),
        Ok(Value::Text("k\u{fffd}".into()))
    );
    // The id keeps the column's own type.
    for v in [
        Value::Int(3),
        Value::Text("a".into()),
        Value::Bytes(vec![0, 1]),
    ] {
        assert_eq!(read(Id, v.clone()), Ok(v));
    }
    // NULL stays NULL whatever the type.
    for ty in [Bool, Int, Text, Id] {
        assert_eq!(read(ty, Value::Null), Ok(Value::Null));
    }
    // Text cells of a driver that tells no types.
    assert_eq!(Bool.read_text("t"), Ok(Value::Bool(true)));
    assert_eq!(Bool.read_text("false"), Ok(Value::Bool(false)));
    assert!(Bool.read_text("yes").is_err());
    assert_eq!(Int.read_text("5"), Ok(Value::Int(5)));
    assert_eq!(Id.read_text("42"), Ok(Value::Int(42)));
    assert_eq!(Id.read_text("042"), Ok(Value::Text("042".into())));
    assert_eq!(Text.read_text("42"), Ok(Value::Text("42".into())));
}

#[test]
fn candidates_pass_over_excluded_keys() {
    let pg = Statements::candidates_excluding(Dialect::Postgres, ADVISORY.desc(), 2)
        .expect("the advisory form");
    assert_eq!(
        &*pg.sql,
        r#"SELECT "id" AS rs_id, ('video_jobs-' || CAST("channel" AS TEXT)) AS rs_key FROM "video_jobs" WHERE ('video_jobs-' || COALESCE(CAST("channel" AS TEXT), '')) NOT IN ($1, $2) ORDER BY "id" ASC LIMIT $3"#
    );
    assert_eq!(
        &*pg.args,
        &[Arg::ExcludedKey(0), Arg::ExcludedKey(1), Arg::Limit]
    );
    assert_eq!(pg.kind, StatementKind::Candidates);
    let my = Statements::candidates_excluding(Dialect::MariaDb, ADVISORY.desc(), 1)
        .expect("the advisory form");
    assert_eq!(
        &*my.sql,
        "SELECT `id` AS rs_id, CONCAT('video_jobs-', CAST(`channel` AS CHAR)) AS rs_key FROM `video_jobs` WHERE CONCAT('video_jobs-', COALESCE(CAST(`channel` AS CHAR), '')) NOT IN (?) ORDER BY `id` ASC LIMIT ?"
    );
    // From an id on, on PostgreSQL, in a table claimed in id order without a due column.
    let from = Statements::candidates_from(Dialect::Postgres, ADVISORY.desc(), 1)
        .expect("claimed in id order");
    assert_eq!(
        &*from.sql,
        r#"SELECT "id" AS rs_id, ('video_jobs-' || CAST("channel" AS TEXT)) AS rs_key FROM "video_jobs" WHERE "id" >= $1 AND ('video_jobs-' || COALESCE(CAST("channel" AS TEXT), '')) NOT IN ($2) ORDER BY "id" ASC LIMIT $3"#
    );
    assert_eq!(&*from.args, &[Arg::Floor, Arg::ExcludedKey(0), Arg::Limit]);
    let plain = Statements::render(Dialect::Postgres, ADVISORY.desc(), 1);
    let FormStatements::Advisory(f) = &plain.form else {
        panic!("the advisory form")
    };
    assert_eq!(
        f.candidates_from.as_ref().map(|s| &*s.args),
        Some(&[Arg::Floor, Arg::Limit][..])
    );
    for dialect in [Dialect::MySql, Dialect::MariaDb, Dialect::Sqlite] {
        assert!(Statements::candidates_from(dialect, ADVISORY.desc(), 1).is_none());
    }
    // Not where a row below the start may become due later.
    assert!(Statements::candidates_from(Dialect::Postgres, ADVISORY_PLAIN.desc(), 1).is_none());
    // After the claimable conditions, with `AND`.
    let due = Statements::candidates_excluding(Dialect::Postgres, ADVISORY_PLAIN.desc(), 1)
        .expect("the advisory form");
    assert_eq!(due.sql.matches(" WHERE ").count(), 1, "{}", due.sql);
    assert_eq!(
        &*due.sql,
        format!(
            r#"SELECT "id" AS rs_id, ('video_jobs-' || CAST("channel" AS TEXT)) AS rs_key FROM "video_jobs" WHERE "processed_at" IS NULL AND "due_at" <= {PG_NOW} AND ('video_jobs-' || COALESCE(CAST("channel" AS TEXT), '')) NOT IN ($1) ORDER BY "due_at" ASC, "id" ASC LIMIT $2"#
        )
    );
    assert_eq!(&*due.args, &[Arg::ExcludedKey(0), Arg::Limit]);
    // Without keys to pass over, the plain candidates.
    for dialect in DIALECTS {
        let s = Flat::of(Statements::render(dialect, ADVISORY.desc(), 2));
        assert_eq!(
            Statements::candidates_excluding(dialect, ADVISORY.desc(), 0).as_ref(),
            s.candidates.as_ref()
        );
    }
    assert!(Statements::candidates_excluding(Dialect::Postgres, LEASE.desc(), 1).is_none());
}

/// A table claimed in id order gets claims that start at an id, past the rows settled before
/// it; a table claimed in due order (or on MySQL and MariaDB, or in the advisory form) does
/// not.
#[test]
fn claims_in_id_order_can_start_at_an_id() {
    let lease_from = |dialect, desc: &TableDesc| match Statements::render(dialect, desc, 2).form {
        FormStatements::Lease(f) => f.claim_from.clone(),
        _ => panic!("the lease form"),
    };
    let lease_of = |dialect, desc: &TableDesc| lease_from(dialect, desc).map(|s| s.sql.to_string());
    let row_lock_of = |dialect, desc: &TableDesc| match Statements::render(dialect, desc, 2).form {
        FormStatements::RowLock(f) => f.count_row_from.as_ref().map(|s| s.sql.to_string()),
        _ => panic!("the row lock form"),
    };
    let pg = lease_from(Dialect::Postgres, LEASE_PLAIN.desc()).expect("claimed in id order");
    assert_eq!(
        &*pg.sql,
        format!(
            r#"WITH rs_claim AS (SELECT "id" FROM "jobs" WHERE ("locked_until" IS NULL OR "locked_until" <= {PG_NOW}) AND "id" >= $1 ORDER BY "id" ASC LIMIT $2 FOR UPDATE SKIP LOCKED) UPDATE "jobs" SET "locked_until" = {} FROM rs_claim WHERE "jobs"."id" = rs_claim."id" RETURNING "jobs".*, {} AS rs_until"#,
            pg_plus(PG_NOW, 3),
            pg_micros(r#""jobs"."locked_until""#)
        )
    );
    assert_eq!(&*pg.args, &[Arg::Floor, Arg::Limit, Arg::LeaseFor]);
    assert_eq!(pg.kind, StatementKind::ClaimLease);
    assert_eq!(pg.output, claimed_columns(false));
    let lite = lease_from(Dialect::Sqlite, LEASE_PLAIN.desc()).expect("claimed in id order");
    assert_eq!(
        &*lite.sql,
        format!(
            r#"UPDATE "jobs" SET "locked_until" = ({LITE_NOW} + ?1) WHERE "id" IN (SELECT "id" FROM "jobs" WHERE ("locked_until" IS NULL OR "locked_until" <= {LITE_NOW}) AND "id" >= ?2 ORDER BY "id" ASC LIMIT ?3) RETURNING *, "locked_until" AS rs_until"#
        )
    );
    assert_eq!(&*lite.args, &[Arg::LeaseFor, Arg::Floor, Arg::Limit]);
    assert_eq!(lease_of(Dialect::MariaDb, LEASE_PLAIN.desc()), None);
    assert_eq!(
        lease_of(Dialect::Postgres, LEASE.desc()),
        None,
        "claimed in due order"
    );
    assert_eq!(
        row_lock_of(Dialect::Postgres, ROW_LOCK.desc()).as_deref(),
        Some(
            r#"WITH rs_claim AS (SELECT "id" FROM "jobs" WHERE "id" >= $1 ORDER BY "id" ASC LIMIT $2 FOR UPDATE SKIP LOCKED), rs_marked AS (SELECT "id" FROM rs_claim WHERE pg_try_advisory_lock(hashtext('jobs'), hashtext("id"::text)) LIMIT $3), rs_counted AS (UPDATE "jobs" SET "attempt" = COALESCE("jobs"."attempt", 0) + 1 FROM rs_marked WHERE "jobs"."id" = rs_marked."id" RETURNING "jobs"."id", "jobs"."attempt") SELECT rs_claim."id", rs_counted."attempt", hashtext(rs_claim."id"::text) AS rs_mark FROM rs_claim LEFT JOIN rs_counted ON rs_counted."id" = rs_claim."id""#
        )
    );
    assert_eq!(row_lock_of(Dialect::MySql, ROW_LOCK.desc()), None);
    assert_eq!(
        row_lock_of(Dialect::Postgres, ORDER.desc()),
        None,
        "a custom order"
    );
}

/// MySQL and MariaDB write rows with the same statements: an outbox that knows only that the
/// server is one of the two renders them right for either.
#[test]
fn mysql_and_mariadb_publish_alike() {
    for (name, desc) in descs() {
        for rows in [1, 2, 100] {
            assert_eq!(
                Statements::publish_rows(Dialect::MySql, &desc, rows),
                Statements::publish_rows(Dialect::MariaDb, &desc, rows),
                "{name}, {rows} rows"
            );
        }
        assert_eq!(
            Statements::render(Dialect::MySql, &desc, 1).publish,
            Statements::render(Dialect::MariaDb, &desc, 1).publish,
            "{name}"
        );
    }
}

/// The outbox's inserts: each row's values bound in order, up to `PUBLISH_BATCH` rows per
/// statement, on PostgreSQL notifying in the same statement (so in the caller's transaction);
/// a row that names a column the insert does not write, or lacks one it needs, is refused
/// naming the table and the column.
#[test]
fn outbox_inserts_bind_each_row_and_refuse_unknown_columns() {
    use ruststream_core::{BrokerError, Inserts, PUBLISH_BATCH};
    let row = |k: &str| Publish {
        id: None,
        payload: b"{}".to_vec(),
        columns: vec![("channel", Value::Text(k.into()))],
        due: None,
    };
    let mut inserts = Inserts::new(Dialect::Postgres, *ADVISORY.desc());
    let one = inserts.statements(&[row("a")]).expect("one row");
    assert_eq!(one.len(), 1);
    let (statement, binds) = &one[0];
    assert!(statement.sql.contains("pg_notify"), "{}", statement.sql);
    assert!(binds.contains(&Value::Text("a".into())), "{binds:?}");
    let many: Vec<Publish> = (0..PUBLISH_BATCH + 1).map(|_| row("b")).collect();
    let statements = inserts.statements(&many).expect("many rows");
    assert_eq!(statements.len(), 2, "{} rows a statement", PUBLISH_BATCH);
    let misspelt = Publish {
        columns: vec![("chanel", Value::Text("a".into()))],
        ..row("a")
    };
    match inserts.statements(&[misspelt]) {
        Err(BrokerError::UnknownColumn {
            table,
            column,
            writes,
        }) => {
            assert_eq!((table, column), ("video_jobs", "chanel"));
            assert_eq!(writes, "channel");
        }
        other => panic!("a misspelt column is refused: {other:?}"),
    }
    let missing = Publish {
        columns: Vec::new(),
        ..row("a")
    };
    assert!(matches!(
        inserts.statements(&[missing]),
        Err(BrokerError::MissingValue {
            table: "video_jobs",
            column: "channel"
        })
    ));
    // A row without a due time binds NULL, and the statement makes it due at the database's
    // time; a row with one binds it.
    let mut inserts = Inserts::new(Dialect::Postgres, *LEASE.desc());
    let later = Publish {
        due: Some(Time(5_000_000)),
        ..Publish::default()
    };
    let rows = inserts
        .statements(&[Publish::default(), later])
        .expect("two rows");
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (statement, binds) = &rows[0];
    assert!(
        statement.sql.contains(&format!(
            "VALUES ($1, COALESCE({}, {PG_NOW})), ($3, COALESCE({}, {PG_NOW}))",
            pg_time(2),
            pg_time(4)
        )),
        "{}",
        statement.sql
    );
    assert_eq!(
        &*statement.args,
        &[Arg::Payload, Arg::Due, Arg::Payload, Arg::Due]
    );
    assert_eq!(
        binds,
        &[
            Value::Bytes(Vec::new()),
            Value::Null,
            Value::Bytes(Vec::new()),
            Value::Int(5_000_000)
        ]
    );
}

/// A table that deduplicates its publishes: the insert writes the unique columns and passes
/// over a row already there (`ON CONFLICT DO NOTHING` on PostgreSQL, inside the notifying
/// statement, and on SQLite; `INSERT IGNORE` on MySQL and MariaDB), one row per statement so
/// that each row's count of rows written tells whether it was there; a unique column the queue
/// or the database writes is refused.
#[test]
fn deduplicated_publishes() {
    use ruststream_core::{DescError, Inserts};
    const ORDERS: InboxSpec<(Payload, Lease)> =
        InboxSpec::new("receipts", Column::new("id").generated())
            .payload(Column::new("payload"))
            .lease(Column::new("locked_until"))
            .unique(&["order_id"]);
    let desc = *ORDERS.desc();
    desc.validate().expect("a valid description");
    let publish = |dialect| Statements::render(dialect, &desc, 1).publish;
    let pg = publish(Dialect::Postgres);
    assert_eq!(
        &*pg.sql,
        "WITH rs_published AS (INSERT INTO \"receipts\" (\"payload\", \"order_id\") VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1) SELECT pg_notify('ruststream', 'receipts') FROM rs_published"
    );
    assert_eq!(&*pg.args, [Arg::Payload, Arg::Column("order_id")]);
    for dialect in [Dialect::MySql, Dialect::MariaDb] {
        assert_eq!(
            &*publish(dialect).sql,
            "INSERT IGNORE INTO `receipts` (`payload`, `order_id`) VALUES (?, ?)"
        );
    }
    assert_eq!(
        &*publish(Dialect::Sqlite).sql,
        "INSERT INTO \"receipts\" (\"payload\", \"order_id\") VALUES (?1, ?2) ON CONFLICT DO NOTHING"
    );
    let row = |order: i64| Publish {
        payload: b"{}".to_vec(),
        columns: vec![("order_id", Value::Int(order))],
        ..Publish::default()
    };
    let mut inserts = Inserts::new(Dialect::Postgres, desc);
    let statements = inserts
        .statements(&[row(1), row(2), row(1)])
        .expect("three rows");
    assert_eq!(statements.len(), 3, "one statement a row");
    assert_eq!(inserts.published(&[1, 1, 0]).skipped, [2]);
    let plain = Inserts::new(Dialect::Postgres, *LEASE.desc());
    assert!(
        plain.published(&[0]).wrote_all(),
        "a table that does not deduplicate"
    );
    const ON_A_ROLE: InboxSpec<(Payload, Lease)> =
        InboxSpec::new("receipts", Column::new("id").generated())
            .payload(Column::new("payload"))
            .lease(Column::new("locked_until"))
            .unique(&["locked_until"]);
    assert!(matches!(
        ON_A_ROLE.desc().validate(),
        Err(DescError::UniqueRoleColumn {
            column: "locked_until",
            ..
        })
    ));
}

/// One column in two roles is refused, the errors history's among them.
#[test]
fn a_column_in_two_roles_is_refused() {
    let mut desc = *LEASE.desc();
    desc.error = Some(Column::new("error"));
    desc.errors = Some(Column::new("error"));
    assert!(matches!(
        desc.validate(),
        Err(ruststream_core::DescError::SameColumn {
            column: "error",
            first: "error",
            second: "errors",
            ..
        })
    ));
}

/// The claims that pass over rows waiting their delay in the process: the first claimable
/// rows but those ids, one placeholder each, in every claim that picks rows; none in a form
/// that writes the delay into its lease.
#[test]
fn claims_pass_over_the_rows_waiting_their_delay() {
    let plain =
        Statements::row_lock_claim_passing(Dialect::Postgres, ROW_LOCK_PLAIN.desc(), 2, false)
            .expect("a row lock claim");
    assert_eq!(plain.kind, StatementKind::LockRow);
    assert_eq!(
        &*plain.sql,
        "SELECT * FROM \"jobs\" WHERE \"id\" NOT IN ($1, $2) ORDER BY \"id\" ASC LIMIT 1 FOR UPDATE SKIP LOCKED"
    );
    assert_eq!(&*plain.args, &[Arg::ExcludedId(0), Arg::ExcludedId(1)]);
    let count = Statements::row_lock_claim_passing(Dialect::Postgres, ROW_LOCK.desc(), 1, true)
        .expect("a row lock count");
    assert_eq!(count.kind, StatementKind::CountRow);
    assert!(
        count
            .sql
            .contains("FROM \"jobs\" WHERE \"id\" NOT IN ($1) AND \"id\" >= $2 ORDER BY"),
        "{}",
        count.sql
    );
    let my = Statements::row_lock_claim_passing(Dialect::MySql, ROW_LOCK.desc(), 2, false)
        .expect("a MySQL count");
    assert_eq!(my.kind, StatementKind::SelectRowId);
    assert!(
        my.sql
            .contains("WHERE `id` NOT IN (?, ?) AND IS_FREE_LOCK("),
        "{}",
        my.sql
    );
    assert_eq!(&my.args[..2], &[Arg::ExcludedId(0), Arg::ExcludedId(1)]);
    for dialect in DIALECTS {
        let look = Statements::candidates_passing(dialect, ADVISORY.desc(), 1, 2, false)
            .expect("candidates");
        assert_eq!(look.kind, StatementKind::Candidates);
        let ids = look
            .args
            .iter()
            .filter(|a| matches!(a, Arg::ExcludedId(_)))
            .count();
        let keys = look
            .args
            .iter()
            .filter(|a| matches!(a, Arg::ExcludedKey(_)))
            .count();
        assert_eq!((ids, keys), (2, 1), "{dialect:?}: {}", look.sql);
        assert!(look.sql.contains(" NOT IN ("), "{dialect:?}: {}", look.sql);
        assert!(
            Statements::row_lock_claim_passing(dialect, LEASE.desc(), 1, false).is_none(),
            "{dialect:?}: the lease form writes the delay into its lease"
        );
    }
}

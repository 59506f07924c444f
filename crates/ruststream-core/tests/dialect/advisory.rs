//! The exact text of the advisory form, custom locks and keys on the generated id.

use super::*;

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

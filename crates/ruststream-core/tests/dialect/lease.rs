//! The exact text of the lease form per dialect.

use super::*;

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

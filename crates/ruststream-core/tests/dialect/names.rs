//! Schema-qualified, quoted and dotted names, a custom order, and notifications.

use super::*;

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

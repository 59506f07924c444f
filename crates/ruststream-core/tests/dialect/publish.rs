//! Publishing: outbox inserts, deduplication, and descriptions refused.

use super::*;

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

//! Lease settlements, pings, column types and the claims' exclusions and start ids.

use super::*;

/// Several lease settlements in one statement: each row fenced by its own lease, the ids
/// settled returned, where the database returns what a `DELETE` or `UPDATE` wrote.
#[test]
fn settle_leases_fences_each_row_and_returns_the_ids_settled() {
    let plain = *LEASE_PLAIN.desc();
    let marked = *LEASE.desc();
    let st = settling_deletes_return_the_ids(&plain);
    settling_marks_return_the_ids(&marked, &st);
    // Neither MySQL nor MariaDB's UPDATE returns the rows it wrote; MySQL's DELETE neither.
    assert!(settle_three(Dialect::MySql, &plain).is_none());
    assert!(settle_three(Dialect::MySql, &marked).is_none());
    assert!(settle_three(Dialect::MariaDb, &marked).is_none());
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

/// The statement settling three leases at once, if the dialect settles them together.
fn settle_three(dialect: Dialect, desc: &TableDesc) -> Option<Statement> {
    Statements::settle_leases(dialect, desc, 3)
}

/// Without a processed mark the settled rows are deleted, each fenced, the ids returned.
fn settling_deletes_return_the_ids(plain: &TableDesc) -> Statement {
    assert_eq!(
        settle_three(Dialect::Postgres, plain)
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
        settle_three(Dialect::Sqlite, plain)
            .expect("SQLite")
            .sql
            .as_ref(),
        "DELETE FROM \"jobs\" WHERE (\"id\" = ?1 AND \"locked_until\" = ?2) OR \
         (\"id\" = ?3 AND \"locked_until\" = ?4) OR (\"id\" = ?5 AND \"locked_until\" = ?6) \
         RETURNING \"id\""
    );
    let mariadb = settle_three(Dialect::MariaDb, plain).expect("MariaDB deletes with RETURNING");
    assert!(
        mariadb
            .sql
            .starts_with("DELETE FROM `jobs` WHERE (`id` = ? AND `locked_until` = "),
        "{}",
        mariadb.sql
    );
    assert!(mariadb.sql.ends_with(" RETURNING `id`"), "{}", mariadb.sql);
    assert_eq!(mariadb.sql.matches('?').count(), 6);
    let st = settle_three(Dialect::Postgres, plain).expect("PostgreSQL");
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
    st
}

/// The processed_at mark clears the lease too.
fn settling_marks_return_the_ids(marked: &TableDesc, st: &Statement) {
    let pg = settle_three(Dialect::Postgres, marked).expect("PostgreSQL");
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
    let lite = settle_three(Dialect::Sqlite, marked).expect("SQLite");
    assert_eq!(
        &*lite.sql,
        format!(
            r#"UPDATE "jobs" SET "processed_at" = {LITE_NOW}, "locked_until" = NULL WHERE ("id" = ?1 AND "locked_until" = ?2) OR ("id" = ?3 AND "locked_until" = ?4) OR ("id" = ?5 AND "locked_until" = ?6) RETURNING "id""#
        )
    );
    assert_eq!(lite.args, st.args);
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

//! The statements the core renders for SQLite, run on a real database file through rusqlite,
//! with binds built from each statement's `args`: the SQL runs, and it does what the lease and
//! advisory lock forms need. (SQLite has no row locks, and its advisory keys live in the
//! process: it renders neither a row lock claim nor `try_lock`/`unlock`.)

use std::collections::BTreeMap;
use std::path::PathBuf;

use rusqlite::Connection;
use rusqlite::types::Value as SqlValue;
use ruststream_core::spec::{Column, InboxSpec, KeyPart};
use ruststream_core::{Arg, Dialect, Form, Output, Statement, StatementKind, Statements, Value};

/// A database file unique to this test and process, removed when dropped.
struct DbFile {
    path: PathBuf,
}

impl DbFile {
    fn new(test: &str) -> Self {
        let path = std::env::temp_dir().join(format!("rs_{test}_{}.db", std::process::id()));
        let _ = std::fs::remove_file(&path);
        Self { path }
    }

    fn open(&self) -> Connection {
        let conn = Connection::open(&self.path)
            .unwrap_or_else(|e| panic!("cannot open SQLite at {}: {e}", self.path.display()));
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .unwrap();
        conn
    }
}

impl Drop for DbFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A name unique to this test and process.
fn unique(test: &str) -> &'static str {
    Box::leak(format!("rs_{test}_{}", std::process::id()).into_boxed_str())
}

fn param(value: &Value) -> SqlValue {
    match value {
        Value::Null => SqlValue::Null,
        Value::Bool(b) => SqlValue::Integer(i64::from(*b)),
        Value::Int(i) => SqlValue::Integer(*i),
        Value::Text(t) => SqlValue::Text(t.clone()),
        Value::Bytes(b) => SqlValue::Blob(b.clone()),
    }
}

type Row = BTreeMap<String, SqlValue>;

/// Runs `statement` with `binds` (one per `?NNN`) and returns its rows.
fn query(conn: &Connection, statement: &Statement, binds: &[Value]) -> Vec<Row> {
    assert_eq!(binds.len(), statement.args.len(), "{}", statement.sql);
    assert!(matches!(statement.output, Output::Rows { .. }));
    let fail =
        |e: rusqlite::Error| -> ! { panic!("{:?} failed: {e}\n{}", statement.kind, statement.sql) };
    let mut stmt = conn.prepare(&statement.sql).unwrap_or_else(|e| fail(e));
    assert_eq!(stmt.parameter_count(), binds.len(), "{}", statement.sql);
    let names: Vec<String> = stmt.column_names().into_iter().map(String::from).collect();
    let mut rows = stmt
        .query(rusqlite::params_from_iter(binds.iter().map(param)))
        .unwrap_or_else(|e| fail(e));
    let mut out = Vec::new();
    while let Some(row) = rows.next().unwrap_or_else(|e| fail(e)) {
        let mut map = Row::new();
        for (i, name) in names.iter().enumerate() {
            map.insert(name.clone(), row.get::<_, SqlValue>(i).unwrap());
        }
        out.push(map);
    }
    out
}

/// Runs `statement` with `binds` and returns the rows it affected.
fn execute(conn: &Connection, statement: &Statement, binds: &[Value]) -> usize {
    assert_eq!(binds.len(), statement.args.len(), "{}", statement.sql);
    let mut stmt = conn
        .prepare(&statement.sql)
        .unwrap_or_else(|e| panic!("{:?} failed: {e}\n{}", statement.kind, statement.sql));
    assert_eq!(stmt.parameter_count(), binds.len(), "{}", statement.sql);
    stmt.execute(rusqlite::params_from_iter(binds.iter().map(param)))
        .unwrap_or_else(|e| panic!("{:?} failed: {e}\n{}", statement.kind, statement.sql))
}

fn get(statement: Option<&Statement>) -> &Statement {
    statement.expect("the statement is rendered")
}

/// The binds of a statement whose args are all among the given values.
fn binds(statement: &Statement, values: &[(Arg, Value)]) -> Vec<Value> {
    statement.binds(|arg| {
        values
            .iter()
            .find(|(a, _)| *a == arg)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no value for {arg:?} in {}", statement.sql))
    })
}

fn int(row: &Row, column: &str) -> i64 {
    match row.get(column) {
        Some(SqlValue::Integer(i)) => *i,
        other => panic!("{column} is {other:?}, not an integer"),
    }
}

fn text(row: &Row, column: &str) -> String {
    match row.get(column) {
        Some(SqlValue::Text(t)) => t.clone(),
        other => panic!("{column} is {other:?}, not text"),
    }
}

fn ids(rows: &[Row]) -> Vec<i64> {
    rows.iter().map(|r| int(r, "id")).collect()
}

const FULL_TABLE: &str = "id INTEGER PRIMARY KEY AUTOINCREMENT, payload BLOB, \
     attempt INTEGER NOT NULL DEFAULT 0, locked_until INTEGER NULL, processed_at INTEGER NULL, \
     due_at INTEGER NOT NULL DEFAULT 0, channel INTEGER";

fn create(conn: &Connection, table: &str) {
    conn.execute_batch(&format!(
        "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} ({FULL_TABLE})"
    ))
    .expect("create the table");
}

fn drop_table(conn: &Connection, quoted: &str) {
    conn.execute_batch(&format!("DROP TABLE IF EXISTS {quoted}"))
        .expect("drop the table");
}

fn publish(conn: &Connection, s: &Statements, payload: &[u8], due: i64, channel: Value) {
    let publish = &s.publish;
    let values = [
        (Arg::Payload, Value::Bytes(payload.to_vec())),
        (Arg::Due, Value::Int(due)),
        (Arg::Column("channel"), channel),
    ];
    assert_eq!(execute(conn, publish, &binds(publish, &values)), 1);
}

const NOW: i64 = 1_764_470_000_000_000;

#[test]
fn check_statements() {
    let file = DbFile::new("lite_check");
    let other = DbFile::new("lite_check_attached");
    let conn = file.open();
    let table = unique("lite_check");
    create(&conn, table);
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .lease(Column::new("locked_until"))
        .desc();
    let s = Statements::render(Dialect::Sqlite, &desc, 1);
    assert!(s.current_database.is_none() && s.of_kind(StatementKind::Isolation).is_none());
    let list = &s.list_columns;
    let rows = query(
        &conn,
        list,
        &binds(list, &[(Arg::TableName, Value::Text(table.to_owned()))]),
    );
    let mut names: Vec<String> = rows.iter().map(|r| text(r, "column_name")).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "attempt",
            "channel",
            "due_at",
            "id",
            "locked_until",
            "payload",
            "processed_at"
        ]
    );
    // A `schema.table` name reads an attached database.
    conn.execute(
        "ATTACH DATABASE ?1 AS app",
        [other.path.to_str().expect("a UTF-8 path")],
    )
    .unwrap();
    conn.execute_batch(
        "CREATE TABLE app.jobs (id INTEGER PRIMARY KEY, payload BLOB, locked_until INTEGER)",
    )
    .unwrap();
    let desc = *InboxSpec::new("app.jobs", Column::new("id"))
        .payload(Column::new("payload"))
        .lease(Column::new("locked_until"))
        .desc();
    let s = Statements::render(Dialect::Sqlite, &desc, 1);
    let list = &s.list_columns;
    let rows = query(
        &conn,
        list,
        &binds(
            list,
            &[
                (Arg::TableName, Value::Text("jobs".into())),
                (Arg::Schema, Value::Text("app".into())),
            ],
        ),
    );
    assert_eq!(rows.len(), 3);
    let publish = &s.publish;
    let values = [
        (Arg::Id, Value::Int(9)),
        (Arg::Payload, Value::Bytes(b"x".to_vec())),
    ];
    assert_eq!(execute(&conn, publish, &binds(publish, &values)), 1);
    let claim = get(s.of_kind(StatementKind::ClaimLease));
    let claimed = query(
        &conn,
        claim,
        &binds(
            claim,
            &[
                (Arg::Now, Value::Int(NOW)),
                (Arg::Until, Value::Int(NOW + 1)),
                (Arg::Limit, Value::Int(1)),
            ],
        ),
    );
    assert_eq!(ids(&claimed), vec![9]);
    conn.execute_batch("DETACH DATABASE app").unwrap();
    drop_table(&conn, table);

    // No row lock form on SQLite.
    let row_lock = *InboxSpec::new(table, Column::new("id")).desc();
    assert_eq!(row_lock.form(), Form::RowLock);
    let refused = ruststream_core::Broker::<()>::new(Dialect::Sqlite).subscribe(
        row_lock,
        ruststream_core::SubscribeOptions::default(),
        ruststream_core::Time(0),
    );
    assert!(
        matches!(
            refused,
            Err(ruststream_core::BrokerError::Desc(
                ruststream_core::DescError::NoRowLocks { .. }
            ))
        ),
        "{refused:?}"
    );
}

#[test]
fn lease_form() {
    let file = DbFile::new("lite_lease");
    let a = file.open();
    let b = file.open();
    let table = unique("lite_lease");
    create(&a, table);
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"))
        .processed_at(Column::new("processed_at"))
        .due(Column::new("due_at"))
        .desc();
    let s = Statements::render(Dialect::Sqlite, &desc, 4);
    assert!(
        s.of_kind(StatementKind::SelectLease).is_none()
            && s.of_kind(StatementKind::MarkLease(1)).is_none()
    );
    publish(&a, &s, b"late", NOW - 1_000_000, Value::Null);
    publish(&a, &s, b"early", NOW - 2_000_000, Value::Null);
    publish(&a, &s, b"future", NOW + 3_600_000_000, Value::Null);
    let (late, early) = (1, 2);

    let claim = get(s.of_kind(StatementKind::ClaimLease));
    let until = NOW + 30_000_000;
    let claim_at = |now: i64, until: i64, limit: i64| {
        binds(
            claim,
            &[
                (Arg::Now, Value::Int(now)),
                (Arg::Until, Value::Int(until)),
                (Arg::Limit, Value::Int(limit)),
            ],
        )
    };
    // The claim is one statement; a transaction around it (BEGIN IMMEDIATE) runs as well.
    execute(&a, &s.begin, &[]);
    let claimed = query(&a, claim, &claim_at(NOW, until, 1));
    execute(&a, &s.commit, &[]);
    assert_eq!(ids(&claimed), vec![early], "the first due row first");
    let claimed = query(&b, claim, &claim_at(NOW, until, 10));
    assert_eq!(
        ids(&claimed),
        vec![late],
        "another connection skips the held lease and the future row"
    );
    for row in query(&a, &s.read_row, &[Value::Int(early)])
        .iter()
        .chain(&claimed)
    {
        assert_eq!(int(row, "attempt"), 1, "the claim counts the attempt");
        assert_eq!(int(row, "locked_until"), until, "the bound lease");
    }
    assert!(query(&a, claim, &claim_at(NOW, until, 10)).is_empty());

    let extend = get(s.of_kind(StatementKind::ExtendLease));
    let until2 = until + 10_000_000;
    let extend_binds = |id: i64, fence: i64| {
        binds(
            extend,
            &[
                (Arg::Until, Value::Int(until2)),
                (Arg::Id, Value::Int(id)),
                (Arg::Fence, Value::Int(fence)),
            ],
        )
    };
    assert_eq!(execute(&a, extend, &extend_binds(late, until)), 1);
    assert_eq!(execute(&a, extend, &extend_binds(late, until)), 0);
    assert_eq!(execute(&a, extend, &extend_binds(early, until + 1)), 0);

    // `early`'s lease runs out: the next claim takes it again and counts again.
    let after = until + 1;
    let again = query(&b, claim, &claim_at(after, after + 5, 10));
    assert_eq!(ids(&again), vec![early]);
    assert_eq!(int(&again[0], "attempt"), 2);

    let release = get(s.of_kind(StatementKind::ReleaseLease));
    let release_binds = |fence: i64| {
        binds(
            release,
            &[
                (Arg::Id, Value::Int(early)),
                (Arg::Fence, Value::Int(fence)),
            ],
        )
    };
    assert_eq!(execute(&a, release, &release_binds(after + 4)), 0);
    assert_eq!(execute(&a, release, &release_binds(after + 5)), 1);

    let settle = s.settle();
    let settle_binds = |id: i64, fence: i64| {
        binds(
            settle,
            &[
                (Arg::Now, Value::Int(after)),
                (Arg::Id, Value::Int(id)),
                (Arg::Fence, Value::Int(fence)),
            ],
        )
    };
    assert_eq!(execute(&a, settle, &settle_binds(late, until)), 0);
    assert_eq!(execute(&a, settle, &settle_binds(late, until2)), 1);
    let marked = query(&a, &s.read_row, &[Value::Int(late)]);
    assert_eq!(int(&marked[0], "processed_at"), after);
    assert_eq!(marked[0]["locked_until"], SqlValue::Null);
    let far = until2 + 2 * 3_600_000_000;
    let mut rest = ids(&query(&a, claim, &claim_at(far, far + 1, 10)));
    rest.sort_unstable();
    assert_eq!(rest, vec![early, 3], "never the processed row");
    drop_table(&a, table);
}

#[test]
fn lease_form_deletes_under_the_fence() {
    let file = DbFile::new("lite_lease_delete");
    let conn = file.open();
    let table = unique("lite_lease_delete");
    create(&conn, table);
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .lease(Column::new("locked_until"))
        .desc();
    let s = Statements::render(Dialect::Sqlite, &desc, 1);
    publish(&conn, &s, b"x", 0, Value::Null);
    let claim = get(s.of_kind(StatementKind::ClaimLease));
    let claimed = query(
        &conn,
        claim,
        &binds(
            claim,
            &[
                (Arg::Now, Value::Int(NOW)),
                (Arg::Until, Value::Int(NOW + 7)),
                (Arg::Limit, Value::Int(1)),
            ],
        ),
    );
    let id = ids(&claimed)[0];
    let settle = s.settle();
    let fenced = |fence: i64| {
        binds(
            settle,
            &[(Arg::Id, Value::Int(id)), (Arg::Fence, Value::Int(fence))],
        )
    };
    assert_eq!(execute(&conn, settle, &fenced(NOW + 8)), 0);
    assert_eq!(execute(&conn, settle, &fenced(NOW + 7)), 1);
    assert!(query(&conn, &s.read_row, &[Value::Int(id)]).is_empty());
    drop_table(&conn, table);
}

#[test]
fn advisory_form() {
    let file = DbFile::new("lite_advisory");
    let conn = file.open();
    let table = unique("lite_advisory");
    create(&conn, table);
    const KEY: &[KeyPart] = &[KeyPart::Literal("video_jobs-"), KeyPart::Column("channel")];
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .advisory(KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .desc();
    let s = Statements::render(Dialect::Sqlite, &desc, 2);
    assert!(
        s.of_kind(StatementKind::TryLock).is_none() && s.of_kind(StatementKind::Unlock).is_none(),
        "the process keeps SQLite's keys"
    );
    publish(&conn, &s, b"1", 0, Value::Int(7));
    publish(&conn, &s, b"2", 0, Value::Int(8));
    publish(&conn, &s, b"3", 0, Value::Null);
    let candidates = get(s.of_kind(StatementKind::Candidates));
    let rows = query(
        &conn,
        candidates,
        &binds(candidates, &[(Arg::Limit, Value::Int(10))]),
    );
    let keys: Vec<Option<String>> = rows
        .iter()
        .map(|r| match r.get("rs_key") {
            Some(SqlValue::Null) => None,
            _ => Some(text(r, "rs_key")),
        })
        .collect();
    assert_eq!(
        keys,
        [
            Some("video_jobs-7".to_owned()),
            Some("video_jobs-8".to_owned()),
            None
        ],
        "an integer column renders as its digits, a NULL key column makes the key NULL"
    );
    let first = int(&rows[0], "rs_id");
    let take = get(s.of_kind(StatementKind::Take));
    let taken = query(&conn, take, &binds(take, &[(Arg::Id, Value::Int(first))]));
    assert_eq!(ids(&taken), vec![first]);
    assert_eq!(int(&taken[0], "attempt"), 1);
    assert_eq!(taken[0]["payload"], SqlValue::Blob(b"1".to_vec()));
    assert_eq!(execute(&conn, s.settle(), &[Value::Int(first)]), 1);
    assert!(query(&conn, take, &binds(take, &[(Arg::Id, Value::Int(first))])).is_empty());
    drop_table(&conn, table);
}

#[test]
fn advisory_take_reads_only_claimable_rows() {
    let file = DbFile::new("lite_advisory_plain");
    let conn = file.open();
    let table = unique("lite_advisory_plain");
    create(&conn, table);
    const KEY: &[KeyPart] = &[KeyPart::Literal("row-"), KeyPart::Column("id")];
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .advisory(KEY)
        .payload(Column::new("payload"))
        .processed_at(Column::new("processed_at"))
        .due(Column::new("due_at"))
        .desc();
    let s = Statements::render(Dialect::Sqlite, &desc, 2);
    publish(&conn, &s, b"due", NOW - 1, Value::Null);
    publish(&conn, &s, b"later", NOW + 1, Value::Null);
    let candidates = get(s.of_kind(StatementKind::Candidates));
    let rows = query(
        &conn,
        candidates,
        &binds(
            candidates,
            &[(Arg::Limit, Value::Int(10)), (Arg::Now, Value::Int(NOW))],
        ),
    );
    assert_eq!(rows.len(), 1, "the row not yet due is no candidate");
    let id = int(&rows[0], "rs_id");
    assert_eq!(text(&rows[0], "rs_key"), format!("row-{id}"));
    let take = get(s.of_kind(StatementKind::Take));
    let take_binds = binds(
        take,
        &[(Arg::Id, Value::Int(id)), (Arg::Now, Value::Int(NOW))],
    );
    assert_eq!(query(&conn, take, &take_binds).len(), 1);
    let settle = s.settle();
    let settled = binds(
        settle,
        &[(Arg::Id, Value::Int(id)), (Arg::Now, Value::Int(NOW))],
    );
    assert_eq!(execute(&conn, settle, &settled), 1);
    assert!(query(&conn, take, &take_binds).is_empty());
    drop_table(&conn, table);
}

#[test]
fn quoted_names() {
    let file = DbFile::new("lite_quoted");
    let conn = file.open();
    let odd = "odd\"na`me";
    let quoted = Dialect::Sqlite.quote(odd);
    conn.execute_batch(&format!(
        "CREATE TABLE {quoted} (\"i\"\"d\" INTEGER PRIMARY KEY, \"pay`load\" BLOB, \
         \"att\"\"empt\" INTEGER NOT NULL DEFAULT 0, \"lock`ed\" INTEGER, \"ch`an\"\"nel\" TEXT)"
    ))
    .unwrap();
    const KEY: &[KeyPart] = &[KeyPart::Literal("it's-\\"), KeyPart::Column("ch`an\"nel")];
    let desc = *InboxSpec::new(odd, Column::new("i\"d").generated())
        .advisory(KEY)
        .attempt(Column::new("att\"empt").generated())
        .payload(Column::new("pay`load"))
        .desc();
    let s = Statements::render(Dialect::Sqlite, &desc, 1);
    let publish = &s.publish;
    let values = [
        (Arg::Payload, Value::Bytes(b"q".to_vec())),
        (Arg::Column("ch`an\"nel"), Value::Text("z".into())),
    ];
    assert_eq!(execute(&conn, publish, &binds(publish, &values)), 1);
    let rows = query(
        &conn,
        get(s.of_kind(StatementKind::Candidates)),
        &[Value::Int(5)],
    );
    assert_eq!(text(&rows[0], "rs_key"), "it's-\\z");
    let taken = query(
        &conn,
        get(s.of_kind(StatementKind::Take)),
        &[Value::Int(int(&rows[0], "rs_id"))],
    );
    assert_eq!(int(&taken[0], "att\"empt"), 1);
    drop_table(&conn, &quoted);
}

/// Several lease settlements in one statement: each row only under its own fence; the ids it
/// settled come back, so a lost lease among them is told apart.
#[test]
fn lease_settlements_in_one_statement() {
    for marks in [false, true] {
        let name = if marks {
            "lite_settle_leases_marked"
        } else {
            "lite_settle_leases"
        };
        let file = DbFile::new(name);
        let conn = file.open();
        let table = unique(name);
        create(&conn, table);
        let spec = InboxSpec::new(table, Column::new("id").generated())
            .payload(Column::new("payload"))
            .lease(Column::new("locked_until"));
        let desc = if marks {
            *spec.processed_at(Column::new("processed_at")).desc()
        } else {
            *spec.desc()
        };
        let s = Statements::render(Dialect::Sqlite, &desc, 3);
        for payload in [b"a", b"b", b"c"] {
            publish(&conn, &s, payload, 0, Value::Null);
        }
        let claim = get(s.of_kind(StatementKind::ClaimLease));
        let claimed = query(
            &conn,
            claim,
            &binds(
                claim,
                &[
                    (Arg::Now, Value::Int(NOW)),
                    (Arg::Until, Value::Int(NOW + 7)),
                    (Arg::Limit, Value::Int(3)),
                ],
            ),
        );
        let held = ids(&claimed);
        assert_eq!(held.len(), 3);
        let settle = Statements::settle_leases(Dialect::Sqlite, &desc, 3).expect("SQLite");
        let fences = [NOW + 7, NOW + 7, NOW + 8];
        let values = settle.binds(|arg| match arg {
            Arg::IdAt(i) => Value::Int(held[i]),
            Arg::FenceAt(i) => Value::Int(fences[i]),
            _ => Value::Int(NOW),
        });
        let mut settled = ids(&query(&conn, &settle, &values));
        settled.sort_unstable();
        assert_eq!(
            settled,
            held[..2],
            "marks {marks}: the third's fence is off"
        );
        let open: Vec<i64> = conn
            .prepare(&format!(
                "SELECT id FROM {table} WHERE processed_at IS NULL"
            ))
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(open, [held[2]], "marks {marks}: only the third is left");
        if marks {
            let cleared: i64 = conn
                .query_row(
                    &format!(
                        "SELECT count(*) FROM {table} WHERE processed_at IS NOT NULL \
                         AND locked_until IS NULL"
                    ),
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(cleared, 2);
        }
        drop_table(&conn, table);
    }
}

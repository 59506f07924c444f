//! The statements the core renders for SQLite, run on a real database file through rusqlite,
//! with binds built from each statement's `args`: the SQL runs, and it does what the lease and
//! advisory lock forms need. (SQLite has no row locks, and its advisory keys live in the
//! process: it renders neither a row lock claim nor `try_lock`/`unlock`.)

use std::collections::BTreeMap;
use std::path::PathBuf;

use rusqlite::Connection;
use rusqlite::types::Value as SqlValue;
use ruststream_conformance::session::binds;
use ruststream_core::dialect::UNTIL;
use ruststream_core::spec::{Column, InboxSpec, KeyPart};
use ruststream_core::{Arg, Dialect, Form, Output, Statement, StatementKind, Statements, Value};

#[path = "conformance/session.rs"]
#[allow(dead_code, reason = "the suite's session; these tests use its binds")]
mod session;

use session::param;

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

/// Publishes a row due at `due` (microseconds since the epoch), or, for `None`, at the
/// database's time of the publish.
fn publish(conn: &Connection, s: &Statements, payload: &[u8], due: Option<i64>, channel: Value) {
    let publish = &s.publish;
    let values = [
        (Arg::Payload, Value::Bytes(payload.to_vec())),
        (Arg::Due, due.map_or(Value::Null, Value::Int)),
        (Arg::Column("channel"), channel),
    ];
    assert_eq!(execute(conn, publish, &binds(publish, &values)), 1);
}

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
            &[(Arg::LeaseFor, Value::Int(1)), (Arg::Limit, Value::Int(1))],
        ),
    );
    assert_eq!(ids(&claimed), vec![9]);
    assert_eq!(int(&claimed[0], "locked_until"), int(&claimed[0], UNTIL));
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
    publish(&conn, &s, b"x", None, Value::Null);
    let claim = get(s.of_kind(StatementKind::ClaimLease));
    let claimed = query(
        &conn,
        claim,
        &binds(
            claim,
            &[(Arg::LeaseFor, Value::Int(7)), (Arg::Limit, Value::Int(1))],
        ),
    );
    let id = ids(&claimed)[0];
    let until = int(&claimed[0], UNTIL);
    let settle = s.settle();
    let fenced = |fence: i64| {
        binds(
            settle,
            &[(Arg::Id, Value::Int(id)), (Arg::Fence, Value::Int(fence))],
        )
    };
    assert_eq!(execute(&conn, settle, &fenced(until + 1)), 0);
    assert_eq!(execute(&conn, settle, &fenced(until - 1)), 0);
    assert_eq!(execute(&conn, settle, &fenced(until)), 1);
    assert!(query(&conn, &s.read_row, &[Value::Int(id)]).is_empty());
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

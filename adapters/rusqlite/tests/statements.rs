//! The statements the core renders for SQLite, run on a real database file through rusqlite,
//! with binds built from each statement's `args`: the SQL runs, and it does what the lease and
//! advisory lock forms need. (SQLite has no row locks, and its advisory keys live in the
//! process: it renders neither a row lock claim nor `try_lock`/`unlock`.)

use std::collections::BTreeMap;
use std::path::PathBuf;

use rusqlite::Connection;
use rusqlite::types::Value as SqlValue;
use ruststream_core::dialect::UNTIL;
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

/// The database's clock, the one every statement of the queue reads: SQLite's `'now'` of a
/// statement of the test's own, in microseconds since the Unix epoch (SQLite keeps the
/// millisecond).
const DB_NOW: &str = "(CAST(ROUND(unixepoch('subsec') * 1000.0) AS INTEGER) * 1000)";

fn db_now(conn: &Connection) -> i64 {
    conn.query_row(&format!("SELECT {DB_NOW}"), [], |r| r.get(0))
        .expect("the database's clock")
}

/// Asserts that `t` is the database's clock plus `plus`, read by a statement that ran
/// between the test's two reads of the clock, `before` and `after`.
fn assert_db_time(t: i64, before: i64, after: i64, plus: i64, what: &str) {
    assert!(
        before + plus <= t && t <= after + plus,
        "{what}: {t} is not the database's time plus {plus} ({} ..= {})",
        before + plus,
        after + plus
    );
}

/// A time column of the row `id`, read from the table.
fn stored(conn: &Connection, table: &str, column: &str, id: i64) -> Option<i64> {
    conn.query_row(
        &format!("SELECT {column} FROM {table} WHERE id = ?1"),
        [id],
        |r| r.get(0),
    )
    .unwrap_or_else(|e| panic!("read {column} of row {id}: {e}"))
}

/// Moves a time column of the row `id` to `offset` microseconds from the database's clock: a
/// lease that ran out or a row that fell due, as the database sees it.
fn set_from_db_now(conn: &Connection, table: &str, column: &str, id: i64, offset: i64) {
    let sql = format!("UPDATE {table} SET {column} = {DB_NOW} + ?1 WHERE id = ?2");
    let moved = conn
        .execute(&sql, [offset, id])
        .unwrap_or_else(|e| panic!("{sql} failed: {e}"));
    assert_eq!(moved, 1, "{sql}");
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
    let now = db_now(&a);
    publish(&a, &s, b"late", Some(now - 1_000_000), Value::Null);
    publish(&a, &s, b"early", Some(now - 2_000_000), Value::Null);
    publish(&a, &s, b"future", Some(now + 3_600_000_000), Value::Null);
    let (late, early, future) = (1, 2, 3);
    assert_eq!(stored(&a, table, "due_at", early), Some(now - 2_000_000));

    // The claim binds the lease's length; the database writes its own time plus it, and
    // reads the expiry back, as the row holds it.
    let claim = get(s.of_kind(StatementKind::ClaimLease));
    let lease = 30_000_000;
    let claim_for = |limit: i64| {
        binds(
            claim,
            &[
                (Arg::LeaseFor, Value::Int(lease)),
                (Arg::Limit, Value::Int(limit)),
            ],
        )
    };
    // The claim is one statement; a transaction around it (BEGIN IMMEDIATE) runs as well.
    execute(&a, &s.begin, &[]);
    let before = db_now(&a);
    let claimed = query(&a, claim, &claim_for(1));
    let after = db_now(&a);
    execute(&a, &s.commit, &[]);
    assert_eq!(ids(&claimed), vec![early], "the first due row first");
    let until_early = int(&claimed[0], UNTIL);
    assert_db_time(until_early, before, after, lease, "the lease of early");
    let before = db_now(&b);
    let claimed = query(&b, claim, &claim_for(10));
    let after = db_now(&b);
    assert_eq!(
        ids(&claimed),
        vec![late],
        "another connection skips the held lease and the future row"
    );
    let until = int(&claimed[0], UNTIL);
    assert_db_time(until, before, after, lease, "the lease of late");
    for row in query(&a, &s.read_row, &[Value::Int(early)])
        .iter()
        .chain(&claimed)
    {
        assert_eq!(int(row, "attempt"), 1, "the claim counts the attempt");
    }
    assert_eq!(stored(&a, table, "locked_until", early), Some(until_early));
    assert_eq!(int(&claimed[0], "locked_until"), until);
    assert_eq!(stored(&a, table, "locked_until", late), Some(until));
    assert!(query(&a, claim, &claim_for(10)).is_empty());

    // Extend with the right fence, then with a stale one: the expiry moves by the extension.
    let extend = get(s.of_kind(StatementKind::ExtendLease));
    let more = 10_000_000;
    let extend_binds = |id: i64, fence: i64| {
        binds(
            extend,
            &[
                (Arg::Extend, Value::Int(more)),
                (Arg::Id, Value::Int(id)),
                (Arg::Fence, Value::Int(fence)),
            ],
        )
    };
    assert_eq!(execute(&a, extend, &extend_binds(late, until)), 1);
    let until2 = until + more;
    assert_eq!(stored(&a, table, "locked_until", late), Some(until2));
    assert_eq!(execute(&a, extend, &extend_binds(late, until)), 0);
    for off in [until_early + 1, until_early - 1] {
        assert_eq!(
            execute(&a, extend, &extend_binds(early, off)),
            0,
            "a fence one microsecond off holds nothing"
        );
    }
    assert_eq!(stored(&a, table, "locked_until", early), Some(until_early));

    // `early`'s lease runs out by the database's clock: the next claim takes it again and
    // counts again.
    set_from_db_now(&a, table, "locked_until", early, -1_000);
    let before = db_now(&b);
    let again = query(&b, claim, &claim_for(10));
    let after = db_now(&b);
    assert_eq!(ids(&again), vec![early]);
    assert_eq!(int(&again[0], "attempt"), 2);
    let fence_early = int(&again[0], UNTIL);
    assert_db_time(fence_early, before, after, lease, "the new lease of early");

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
    assert_eq!(execute(&a, release, &release_binds(fence_early - 1)), 0);
    assert_eq!(execute(&a, release, &release_binds(fence_early)), 1);

    // Settle marks `processed_at` with the database's time under the fence.
    let settle = s.settle();
    let settle_binds = |id: i64, fence: i64| {
        binds(
            settle,
            &[(Arg::Id, Value::Int(id)), (Arg::Fence, Value::Int(fence))],
        )
    };
    assert_eq!(execute(&a, settle, &settle_binds(late, until)), 0);
    let before = db_now(&a);
    assert_eq!(execute(&a, settle, &settle_binds(late, until2)), 1);
    let after = db_now(&a);
    let marked = query(&a, &s.read_row, &[Value::Int(late)]);
    assert_db_time(
        int(&marked[0], "processed_at"),
        before,
        after,
        0,
        "processed_at",
    );
    assert_eq!(marked[0]["locked_until"], SqlValue::Null);

    // The future row falls due by the database's clock: the released row and it; never the
    // processed row.
    set_from_db_now(&a, table, "due_at", future, -1_000);
    let mut rest = ids(&query(&a, claim, &claim_for(10)));
    rest.sort_unstable();
    assert_eq!(rest, vec![early, future], "never the processed row");
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
    publish(&conn, &s, b"1", None, Value::Int(7));
    publish(&conn, &s, b"2", None, Value::Int(8));
    publish(&conn, &s, b"3", None, Value::Null);
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
    // A row published without a due time is due at the database's time of the publish; one
    // due a minute from the database's time is not due yet.
    let before = db_now(&conn);
    publish(&conn, &s, b"due", None, Value::Null);
    let after = db_now(&conn);
    publish(&conn, &s, b"later", Some(after + 60_000_000), Value::Null);
    let (due, later) = (1, 2);
    let due_at = stored(&conn, table, "due_at", due).expect("a due time");
    assert_db_time(due_at, before, after, 0, "a row published due now");
    let candidates = get(s.of_kind(StatementKind::Candidates));
    let rows = query(
        &conn,
        candidates,
        &binds(candidates, &[(Arg::Limit, Value::Int(10))]),
    );
    assert_eq!(rows.len(), 1, "the row not yet due is no candidate");
    let id = int(&rows[0], "rs_id");
    assert_eq!(id, due);
    assert_eq!(text(&rows[0], "rs_key"), format!("row-{id}"));
    let take = get(s.of_kind(StatementKind::Take));
    let take_binds = |id: i64| binds(take, &[(Arg::Id, Value::Int(id))]);
    assert!(
        query(&conn, take, &take_binds(later)).is_empty(),
        "a row not yet due is not taken"
    );
    assert_eq!(query(&conn, take, &take_binds(id)).len(), 1);
    let settle = s.settle();
    let settled = binds(settle, &[(Arg::Id, Value::Int(id))]);
    let before = db_now(&conn);
    assert_eq!(execute(&conn, settle, &settled), 1);
    let after = db_now(&conn);
    let marked = stored(&conn, table, "processed_at", id).expect("the row is marked");
    assert_db_time(marked, before, after, 0, "processed_at");
    assert!(query(&conn, take, &take_binds(id)).is_empty());
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
            publish(&conn, &s, payload, None, Value::Null);
        }
        let claim = get(s.of_kind(StatementKind::ClaimLease));
        let claimed = query(
            &conn,
            claim,
            &binds(
                claim,
                &[(Arg::LeaseFor, Value::Int(7)), (Arg::Limit, Value::Int(3))],
            ),
        );
        let held = ids(&claimed);
        assert_eq!(held.len(), 3);
        let settle = Statements::settle_leases(Dialect::Sqlite, &desc, 3).expect("SQLite");
        // Each row's fence is the expiry its claim read back; the third's is one
        // microsecond off.
        let fences: Vec<i64> = claimed
            .iter()
            .enumerate()
            .map(|(i, row)| int(row, UNTIL) + i64::from(i == 2))
            .collect();
        let values = settle.binds(|arg| match arg {
            Arg::IdAt(i) => Value::Int(held[i]),
            Arg::FenceAt(i) => Value::Int(fences[i]),
            other => panic!("no value for {other:?} in {}", settle.sql),
        });
        let before = db_now(&conn);
        let mut settled = ids(&query(&conn, &settle, &values));
        let after = db_now(&conn);
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
            for id in &held[..2] {
                let marked = stored(&conn, table, "processed_at", *id).expect("the row is marked");
                assert_db_time(marked, before, after, 0, "processed_at");
            }
        }
        drop_table(&conn, table);
    }
}

/// A lease claim reads back the expiry the database wrote, exactly as the row holds it: a
/// fence taken from it holds the row and one a microsecond off holds nothing; an extension
/// moves the expiry by exactly its length; a retry makes the row due the delay after the
/// database's time.
#[test]
fn lease_claim_reads_back_the_expiry_it_wrote() {
    use ruststream_core::dialect::FormStatements;
    let file = DbFile::new("lite_lease_until");
    let conn = file.open();
    let table = unique("lite_lease_until");
    create(&conn, table);
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"))
        .processed_at(Column::new("processed_at"))
        .due(Column::new("due_at"))
        .desc();
    let s = Statements::render(Dialect::Sqlite, &desc, 1);
    let FormStatements::Lease(f) = &s.form else {
        panic!("the lease form");
    };
    publish(&conn, &s, b"x", None, Value::Null);
    let claim = get(s.of_kind(StatementKind::ClaimLease));
    let Output::Rows { columns, .. } = &claim.output else {
        panic!("the claim answers rows");
    };
    assert_eq!(
        columns.last().map(|c| c.name),
        Some(UNTIL),
        "the expiry is the claim's last column"
    );
    let lease = 20_000_000;
    let claim_binds = binds(
        claim,
        &[
            (Arg::LeaseFor, Value::Int(lease)),
            (Arg::Limit, Value::Int(1)),
        ],
    );
    let before = db_now(&conn);
    let claimed = query(&conn, claim, &claim_binds);
    let after = db_now(&conn);
    assert_eq!(claimed.len(), 1);
    let id = int(&claimed[0], "id");
    let until = int(&claimed[0], UNTIL);
    assert_eq!(
        stored(&conn, table, "locked_until", id),
        Some(until),
        "the expiry read back is the one the row holds"
    );
    assert_db_time(until, before, after, lease, "the claim's expiry");

    let extend = &f.extend;
    let extend_by = |by: i64, fence: i64| {
        binds(
            extend,
            &[
                (Arg::Extend, Value::Int(by)),
                (Arg::Id, Value::Int(id)),
                (Arg::Fence, Value::Int(fence)),
            ],
        )
    };
    let more = 7_654_321;
    for off in [until + 1, until - 1] {
        assert_eq!(
            execute(&conn, extend, &extend_by(more, off)),
            0,
            "a fence a microsecond off holds nothing"
        );
    }
    assert_eq!(stored(&conn, table, "locked_until", id), Some(until));
    assert_eq!(execute(&conn, extend, &extend_by(more, until)), 1);
    assert_eq!(
        stored(&conn, table, "locked_until", id),
        Some(until + more),
        "the extension moves the expiry by exactly its length"
    );
    assert_eq!(
        execute(&conn, extend, &extend_by(more, until)),
        0,
        "the old expiry fences nothing"
    );
    let until = until + more;

    // A retry under the fence: due the delay after the database's time, the lease cleared.
    let retry = &f.retry;
    let retry_in = 3_600_000_000;
    let retry_binds = |fence: i64| {
        binds(
            retry,
            &[
                (Arg::RetryIn, Value::Int(retry_in)),
                (Arg::Id, Value::Int(id)),
                (Arg::Fence, Value::Int(fence)),
                (Arg::Error, Value::Null),
            ],
        )
    };
    assert_eq!(execute(&conn, retry, &retry_binds(until - 1)), 0);
    let before = db_now(&conn);
    assert_eq!(execute(&conn, retry, &retry_binds(until)), 1);
    let after = db_now(&conn);
    let due = stored(&conn, table, "due_at", id).expect("a due time");
    assert_db_time(due, before, after, retry_in, "the retried row's due time");
    assert_eq!(stored(&conn, table, "locked_until", id), None);
    assert!(
        query(&conn, claim, &claim_binds).is_empty(),
        "the retried row is not due yet"
    );
    drop_table(&conn, table);
}

//! The statements the core renders for MariaDB (standing in for MySQL), run on a real server
//! through mysql_async, with binds built from each statement's `args`: the SQL runs, and it
//! does what the forms need.
//!
//! The server is `RUSTSTREAM_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`); a test
//! that cannot reach it fails with a message naming the URL.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Row};
use ruststream_core::dialect::UNTIL;
use ruststream_core::spec::{Column, InboxSpec, KeyPart};
use ruststream_core::{Arg, Dialect, Output, Statement, StatementKind, Statements, Value};

const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/test";

fn url() -> String {
    std::env::var("RUSTSTREAM_MYSQL_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A new session on the test server, in a time zone other than UTC: the queue's times are
/// UTC by the server's clock (`UTC_TIMESTAMP(6)`), never the session's local time.
async fn connect() -> Conn {
    let url = url();
    let mut conn = Conn::from_url(&url).await.unwrap_or_else(|e| {
        panic!("cannot reach MySQL/MariaDB at {url} (set RUSTSTREAM_MYSQL_URL): {e}")
    });
    conn.query_drop("SET time_zone = '+05:45'")
        .await
        .expect("set the session's time zone");
    conn
}

/// A name unique to this test and process, kept for the life of the test.
fn unique(test: &str) -> &'static str {
    Box::leak(format!("rs_{test}_{}", std::process::id()).into_boxed_str())
}

fn params(binds: &[Value]) -> Params {
    if binds.is_empty() {
        return Params::Empty;
    }
    Params::Positional(
        binds
            .iter()
            .map(|v| match v {
                Value::Null => mysql_async::Value::NULL,
                Value::Bool(b) => mysql_async::Value::Int(i64::from(*b)),
                Value::Int(i) => mysql_async::Value::Int(*i),
                Value::Text(t) => mysql_async::Value::Bytes(t.clone().into_bytes()),
                Value::Bytes(b) => mysql_async::Value::Bytes(b.clone()),
            })
            .collect(),
    )
}

/// Runs `statement` with `binds` (one per `?`) as a prepared statement and returns its rows.
async fn query(conn: &mut Conn, statement: &Statement, binds: &[Value]) -> Vec<Row> {
    assert_eq!(binds.len(), statement.args.len(), "{}", statement.sql);
    assert!(matches!(statement.output, Output::Rows { .. }));
    conn.exec::<Row, _, _>(&*statement.sql, params(binds))
        .await
        .unwrap_or_else(|e| panic!("{:?} failed: {e}\n{}", statement.kind, statement.sql))
}

/// Runs `statement` with `binds` and returns the rows it affected.
async fn execute(conn: &mut Conn, statement: &Statement, binds: &[Value]) -> u64 {
    assert_eq!(binds.len(), statement.args.len(), "{}", statement.sql);
    conn.exec_drop(&*statement.sql, params(binds))
        .await
        .unwrap_or_else(|e| panic!("{:?} failed: {e}\n{}", statement.kind, statement.sql));
    conn.affected_rows()
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

fn ids(rows: &[Row]) -> Vec<i64> {
    rows.iter()
        .map(|r| r.get::<i64, _>("id").expect("an id"))
        .collect()
}

fn text(row: &Row, column: &str) -> String {
    row.get::<String, _>(column)
        .unwrap_or_else(|| panic!("text in {column}"))
}

fn int(row: &Row, column: &str) -> i64 {
    row.get::<i64, _>(column)
        .unwrap_or_else(|| panic!("an integer in {column}"))
}

/// The queue table. On InnoDB a claim reads its rows in claim order through an index, so the
/// order's columns are indexed (then the id): without the index the server sorts, locks every
/// claimable row, and another claim finds nothing to skip to.
const FULL_TABLE: &str = "id BIGINT AUTO_INCREMENT PRIMARY KEY, payload LONGBLOB, \
     attempt INT NOT NULL DEFAULT 0, locked_until DATETIME(6) NULL, processed_at DATETIME(6) NULL, \
     due_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), channel VARCHAR(200), \
     INDEX (due_at, id)";

async fn create(conn: &mut Conn, table: &str) {
    conn.query_drop(format!("DROP TABLE IF EXISTS {table}"))
        .await
        .unwrap();
    conn.query_drop(format!("CREATE TABLE {table} ({FULL_TABLE}) ENGINE=InnoDB"))
        .await
        .expect("create the table");
}

async fn drop_table(conn: &mut Conn, quoted: &str) {
    conn.query_drop(format!("DROP TABLE IF EXISTS {quoted}"))
        .await
        .expect("drop the table");
}

/// Publishes a row due at `due` (microseconds since the epoch), or, for `None`, at the
/// server's time of the publish.
async fn publish(conn: &mut Conn, s: &Statements, payload: &[u8], due: Option<i64>, channel: &str) {
    let publish = &s.publish;
    let values = [
        (Arg::Payload, Value::Bytes(payload.to_vec())),
        (Arg::Due, due.map_or(Value::Null, Value::Int)),
        (Arg::Column("channel"), Value::Text(channel.to_owned())),
    ];
    assert_eq!(execute(conn, publish, &binds(publish, &values)).await, 1);
}

#[tokio::test]
async fn check_statements() {
    let table = unique("my_check");
    let mut conn = connect().await;
    create(&mut conn, table).await;
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .desc();
    for dialect in [Dialect::MariaDb, Dialect::MySql] {
        let s = Statements::render(dialect, &desc, 1);
        let db = query(&mut conn, get(s.current_database.as_ref()), &[]).await;
        assert_eq!(db[0].get::<String, _>("db").as_deref(), Some("test"));
        let list = &s.list_columns;
        let rows = query(
            &mut conn,
            list,
            &binds(list, &[(Arg::TableName, Value::Text(table.to_owned()))]),
        )
        .await;
        let mut names: Vec<String> = rows
            .iter()
            .map(|r| r.get::<String, _>("column_name").expect("a name"))
            .collect();
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
        // A `schema.table` name lists the columns of that schema's table.
        let qualified: &'static str = Box::leak(format!("test.{table}").into_boxed_str());
        let desc = *InboxSpec::new(qualified, Column::new("id")).desc();
        let s = Statements::render(dialect, &desc, 1);
        let list = &s.list_columns;
        let rows = query(
            &mut conn,
            list,
            &binds(
                list,
                &[
                    (Arg::Schema, Value::Text("test".into())),
                    (Arg::TableName, Value::Text(table.to_owned())),
                ],
            ),
        )
        .await;
        assert_eq!(rows.len(), 7);
        assert!(
            query(&mut conn, &s.read_row, &[Value::Int(1)])
                .await
                .is_empty()
        );
    }
    drop_table(&mut conn, table).await;
}

#[tokio::test]
async fn row_lock_form() {
    let table = unique("my_row_lock");
    let mut a = connect().await;
    let mut b = connect().await;
    create(&mut a, table).await;
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .desc();
    let s = Statements::render(Dialect::MariaDb, &desc, 2);
    for payload in [b"a", b"b"] {
        publish(&mut a, &s, payload, None, "x").await;
    }
    // A table whose description names no attempt column locks the first row in one
    // statement; with one, the claim counts first (the test below).
    let plain = Statements::render(
        Dialect::MariaDb,
        InboxSpec::new(table, Column::new("id").generated())
            .payload(Column::new("payload"))
            .desc(),
        2,
    );
    let lock_row = get(plain.of_kind(StatementKind::LockRow));
    execute(&mut a, &s.begin, &[]).await;
    let locked = query(&mut a, lock_row, &[]).await;
    assert_eq!(locked.len(), 1);
    let first = ids(&locked)[0];
    assert_eq!(
        locked[0].get::<Vec<u8>, _>("payload").as_deref(),
        Some(&b"a"[..])
    );
    let count = get(s.of_kind(StatementKind::CountAttempt));
    assert_eq!(execute(&mut a, count, &[Value::Int(first)]).await, 1);

    execute(&mut b, &s.begin, &[]).await;
    let skipped = query(&mut b, lock_row, &[]).await;
    assert_eq!(skipped.len(), 1);
    assert_ne!(ids(&skipped)[0], first, "B skips A's row");
    execute(&mut b, &s.rollback, &[]).await;

    assert_eq!(execute(&mut a, s.settle(), &[Value::Int(first)]).await, 1);
    execute(&mut a, &s.commit, &[]).await;
    assert!(
        query(&mut b, &s.read_row, &[Value::Int(first)])
            .await
            .is_empty()
    );
    drop_table(&mut a, table).await;
}

#[tokio::test]
async fn row_lock_form_counts_the_attempt_before_it_locks() {
    let table = unique("my_row_lock_count");
    let mut a = connect().await;
    let mut b = connect().await;
    create(&mut a, table).await;
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .desc();
    let s = Statements::render(Dialect::MariaDb, &desc, 2);
    for payload in [b"a", b"b"] {
        publish(&mut a, &s, payload, None, "x").await;
    }
    let select_id = get(s.of_kind(StatementKind::SelectRowId));
    let count = get(s.of_kind(StatementKind::CountAttempt));
    let lock_by_id = get(s.of_kind(StatementKind::LockRowById));
    let select = |limit: i64| binds(select_id, &[(Arg::Limit, Value::Int(limit))]);
    let mark_names = |rows: &[Row]| -> Vec<Value> {
        rows.iter()
            .map(|r| Value::Text(text(r, "rs_mark")))
            .collect()
    };
    // Takes the marks of `names` on `conn`: whether each was taken, in order.
    async fn mark(conn: &mut Conn, s: &Statements, names: &[Value]) -> Vec<bool> {
        let statement = get(s.of_kind(StatementKind::MarkRows(names.len())));
        let values: Vec<(Arg, Value)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (Arg::MarkAt(i), n.clone()))
            .collect();
        let mut rows = query(conn, statement, &binds(statement, &values)).await;
        rows.sort_by_key(|r| int(r, "rs_at"));
        rows.iter().map(|r| int(r, "rs_marked") == 1).collect()
    }
    async fn unmark(conn: &mut Conn, s: &Statements, names: &[Value]) {
        let statement = get(s.of_kind(StatementKind::UnmarkRows(names.len())));
        let values: Vec<(Arg, Value)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (Arg::MarkAt(i), n.clone()))
            .collect();
        execute(conn, statement, &binds(statement, &values)).await;
    }

    // A locks the first row to count it, reading its attempt and its mark's name.
    execute(&mut a, &s.begin, &[]).await;
    let first = query(&mut a, select_id, &select(1)).await;
    let (first_id, before) = (int(&first[0], "id"), int(&first[0], "attempt"));
    assert_eq!(before, 0, "the select reads the attempt before the count");
    let first_mark = mark_names(&first);
    assert_eq!(
        text(&first[0], "rs_mark").len(),
        64,
        "a mark's name is a SHA-256 in hex, the longest GET_LOCK takes"
    );
    // B, meanwhile, passes over the row A's count holds.
    execute(&mut b, &s.begin, &[]).await;
    let other = query(&mut b, select_id, &select(1)).await;
    assert_ne!(int(&other[0], "id"), first_id, "B skips the row A holds");
    execute(&mut b, &s.rollback, &[]).await;
    // A marks the row, counts it and commits.
    assert_eq!(mark(&mut a, &s, &first_mark).await, [true]);
    assert_eq!(execute(&mut a, count, &[Value::Int(first_id)]).await, 1);
    execute(&mut a, &s.commit, &[]).await;

    // Before A locks it, B's count (at read committed) leaves A's marked row out, though no
    // row lock holds it, and finds the other row, whose mark B takes.
    let read_committed = get(s.of_kind(StatementKind::ReadCommitted));
    execute(&mut b, read_committed, &[]).await;
    execute(&mut b, &s.begin, &[]).await;
    let found = query(&mut b, select_id, &select(2)).await;
    assert_eq!(
        ids(&found).len(),
        1,
        "B's count leaves the marked row out: {:?}",
        ids(&found)
    );
    assert_ne!(ids(&found)[0], first_id, "B skips the row A marked");
    // A mark A holds is not B's to take, row lock or not.
    assert_eq!(
        mark(
            &mut b,
            &s,
            &[first_mark[0].clone(), mark_names(&found)[0].clone()]
        )
        .await,
        [false, true]
    );
    execute(&mut b, &s.rollback, &[]).await;
    unmark(&mut b, &s, &mark_names(&found)).await;
    // And B's count holds no lock on A's row: A's lock by id takes it while B's count is open.
    execute(&mut b, read_committed, &[]).await;
    execute(&mut b, &s.begin, &[]).await;
    let again = query(&mut b, select_id, &select(2)).await;
    assert_eq!(ids(&again).len(), 1);

    // A locks its row at its count (not at another), then releases the mark.
    let lock = |id: i64, attempt: i64| {
        binds(
            lock_by_id,
            &[
                (Arg::Id, Value::Int(id)),
                (Arg::Attempt, Value::Int(attempt)),
            ],
        )
    };
    execute(&mut a, &s.begin, &[]).await;
    assert!(
        query(&mut a, lock_by_id, &lock(first_id, before))
            .await
            .is_empty(),
        "a lock on the count before this take's takes nothing"
    );
    let locked = query(&mut a, lock_by_id, &lock(first_id, before + 1)).await;
    assert_eq!(
        ids(&locked),
        vec![first_id],
        "B's open count does not hold A's row"
    );
    assert_eq!(int(&locked[0], "attempt"), 1);
    execute(&mut b, &s.rollback, &[]).await;
    unmark(&mut a, &s, &first_mark).await;
    let free: Option<i64> = a
        .exec_first("SELECT IS_FREE_LOCK(?)", (text(&first[0], "rs_mark"),))
        .await
        .expect("IS_FREE_LOCK");
    assert_eq!(free, Some(1), "the mark is released");

    // The locked row is passed over by the next count.
    execute(&mut b, &s.begin, &[]).await;
    let next = query(&mut b, select_id, &select(2)).await;
    assert!(
        ids(&next).iter().all(|id| *id != first_id),
        "a locked row is skipped"
    );
    execute(&mut b, &s.rollback, &[]).await;
    assert_eq!(
        execute(&mut a, s.settle(), &[Value::Int(first_id)]).await,
        1
    );
    execute(&mut a, &s.commit, &[]).await;
    drop_table(&mut a, table).await;
}

#[tokio::test]
async fn quoted_names() {
    let odd: &'static str =
        Box::leak(format!("odd\"na`me_{}", std::process::id()).into_boxed_str());
    let quoted = Dialect::MariaDb.quote(odd);
    let mut conn = connect().await;
    conn.query_drop(format!("DROP TABLE IF EXISTS {quoted}"))
        .await
        .unwrap();
    conn.query_drop(format!(
        "CREATE TABLE {quoted} (`i\"d` BIGINT AUTO_INCREMENT PRIMARY KEY, `pay``load` LONGBLOB, \
         `att\"empt` INT NOT NULL DEFAULT 0, `lock``ed` DATETIME(6) NULL, `ch``an\"nel` VARCHAR(50))"
    ))
    .await
    .unwrap();
    let desc = *InboxSpec::new(odd, Column::new("i\"d").generated())
        .payload(Column::new("pay`load"))
        .attempt(Column::new("att\"empt").generated())
        .lease(Column::new("lock`ed"))
        .desc();
    let s = Statements::render(Dialect::MariaDb, &desc, 1);
    let list = &s.list_columns;
    let rows = query(
        &mut conn,
        list,
        &binds(list, &[(Arg::TableName, Value::Text(odd.to_owned()))]),
    )
    .await;
    assert_eq!(rows.len(), 5);
    assert_eq!(
        execute(
            &mut conn,
            &s.publish,
            &binds(&s.publish, &[(Arg::Payload, Value::Bytes(b"q".to_vec()))])
        )
        .await,
        1
    );
    execute(&mut conn, &s.begin, &[]).await;
    let select = get(s.of_kind(StatementKind::SelectLease));
    let rows = query(
        &mut conn,
        select,
        &binds(
            select,
            &[(Arg::LeaseFor, Value::Int(1)), (Arg::Limit, Value::Int(1))],
        ),
    )
    .await;
    assert_eq!(rows.len(), 1);
    let id = int(&rows[0], "i\"d");
    let until = int(&rows[0], UNTIL);
    let mark = s.of_kind(StatementKind::MarkLease(1)).unwrap();
    assert_eq!(
        execute(
            &mut conn,
            mark,
            &binds(
                mark,
                &[
                    (Arg::Fence, Value::Int(until)),
                    (Arg::IdAt(0), Value::Int(id))
                ]
            )
        )
        .await,
        1
    );
    execute(&mut conn, &s.commit, &[]).await;
    let held: Option<i64> = conn
        .query_first(format!(
            "SELECT TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', `lock``ed`) \
             FROM {quoted}"
        ))
        .await
        .unwrap();
    assert_eq!(held, Some(until), "the quoted lease column holds the fence");

    // A key whose literal holds a quote and a backslash, rendered by the server as written.
    const KEY: &[KeyPart] = &[KeyPart::Literal("it's-\\"), KeyPart::Column("ch`an\"nel")];
    let desc = *InboxSpec::new(odd, Column::new("i\"d").generated())
        .advisory(KEY)
        .desc();
    let s = Statements::render(Dialect::MariaDb, &desc, 1);
    let candidates = get(s.of_kind(StatementKind::Candidates));
    conn.query_drop(format!("UPDATE {quoted} SET `ch``an\"nel` = 'z'"))
        .await
        .expect("the key column set");
    let rows = query(&mut conn, candidates, &[Value::Int(5)]).await;
    assert_eq!(
        rows[0].get::<String, _>("rs_key").as_deref(),
        Some("it's-\\z")
    );
    drop_table(&mut conn, &quoted).await;
}

//! The statements the core renders for MariaDB (standing in for MySQL), run on a real server
//! through mysql_async, with binds built from each statement's `args`: the SQL runs, and it
//! does what the forms need.
//!
//! The server is `RUSTSTREAM_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`); a test
//! that cannot reach it fails with a message naming the URL.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Row};
use ruststream_core::dialect::UNTIL;
use ruststream_core::keys::{MYSQL_LOCK_NAME_MAX, mysql_lock_name};
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

/// The server's clock, the one every statement of the queue reads: `UTC_TIMESTAMP(6)` of a
/// statement of the test's own, in microseconds since the Unix epoch.
async fn server_now(conn: &mut Conn) -> i64 {
    conn.query_first::<i64, _>(
        "SELECT TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
    )
    .await
    .expect("the server's clock")
    .expect("a row")
}

/// Asserts that `t` is the server's clock plus `plus`, read by a statement that ran between
/// the test's two reads of the clock, `before` and `after`.
fn assert_server_time(t: i64, before: i64, after: i64, plus: i64, what: &str) {
    assert!(
        before + plus <= t && t <= after + plus,
        "{what}: {t} is not the server's time plus {plus} ({} ..= {})",
        before + plus,
        after + plus
    );
}

/// Moves a time column of the row `id` to `offset` microseconds from the server's clock: a
/// lease that ran out or a row that fell due, as the server sees it.
async fn set_from_server_now(conn: &mut Conn, table: &str, column: &str, id: i64, offset: i64) {
    let sql = format!(
        "UPDATE {table} SET {column} = TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6)) WHERE id = ?"
    );
    conn.exec_drop(&sql, (offset, id))
        .await
        .unwrap_or_else(|e| panic!("{sql} failed: {e}"));
    assert_eq!(conn.affected_rows(), 1, "{sql}");
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

/// A time column in microseconds since the epoch, read back by the server.
async fn micros(conn: &mut Conn, table: &str, column: &str, id: i64) -> Option<i64> {
    conn.exec_first::<Option<i64>, _, _>(
        format!(
            "SELECT TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', {column}) FROM {table} WHERE id = ?"
        ),
        (id,),
    )
    .await
    .unwrap()
    .expect("the row is there")
}

const LEASE_KEY: &[KeyPart] = &[KeyPart::Literal("video_jobs-"), KeyPart::Column("channel")];

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
async fn lease_form() {
    let table = unique("my_lease");
    let mut a = connect().await;
    let mut b = connect().await;
    let mut clock = connect().await;
    create(&mut a, table).await;
    let workers = 3;
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"))
        .processed_at(Column::new("processed_at"))
        .due(Column::new("due_at"))
        .desc();
    let s = Statements::render(Dialect::MariaDb, &desc, workers);
    let now = server_now(&mut clock).await;
    publish(&mut a, &s, b"late", Some(now - 1_000_000), "x").await;
    publish(&mut a, &s, b"early", Some(now - 2_000_000), "x").await;
    publish(&mut a, &s, b"third", Some(now - 500_000), "x").await;
    publish(&mut a, &s, b"future", Some(now + 3_600_000_000), "x").await;
    let all: Vec<(i64, Vec<u8>)> = a
        .query(format!("SELECT id, payload FROM {table} ORDER BY id"))
        .await
        .unwrap();
    let id_of = |payload: &[u8]| all.iter().find(|(_, p)| p == payload).unwrap().0;
    let (late, early, third) = (id_of(b"late"), id_of(b"early"), id_of(b"third"));
    let future = id_of(b"future");
    assert_eq!(
        micros(&mut a, table, "due_at", early).await,
        Some(now - 2_000_000),
        "a published due time keeps its microseconds"
    );

    // The claim's locking read binds the lease's length and reads the expiry by the server's
    // clock; the mark writes that expiry, the rows' fence.
    let select = get(s.of_kind(StatementKind::SelectLease));
    let lease = 30_000_000;
    let select_for = |limit: i64| {
        binds(
            select,
            &[
                (Arg::LeaseFor, Value::Int(lease)),
                (Arg::Limit, Value::Int(limit)),
            ],
        )
    };
    // A's claim locks the first due row; B's claim, in its own transaction, skips it.
    execute(&mut a, &s.begin, &[]).await;
    let before = server_now(&mut clock).await;
    let mine = query(&mut a, select, &select_for(1)).await;
    let after = server_now(&mut clock).await;
    assert_eq!(ids(&mine), vec![early]);
    let until_a = int(&mine[0], UNTIL);
    assert_server_time(until_a, before, after, lease, "A's expiry");
    execute(&mut b, &s.begin, &[]).await;
    let before = server_now(&mut clock).await;
    let theirs = query(&mut b, select, &select_for(10)).await;
    let after = server_now(&mut clock).await;
    assert_eq!(
        ids(&theirs),
        vec![late, third],
        "B skips A's locked row and the future one, in claim order"
    );
    let until = int(&theirs[0], UNTIL);
    assert!(
        theirs.iter().all(|r| int(r, UNTIL) == until),
        "one read of the clock for the claim's rows"
    );
    assert_server_time(until, before, after, lease, "B's expiry");
    let mark = s
        .of_kind(StatementKind::MarkLease(2))
        .expect("a statement for two rows");
    let mark_binds = |fence: i64, ids: &[i64]| {
        let mut values = vec![(Arg::Fence, Value::Int(fence))];
        values.extend(
            ids.iter()
                .enumerate()
                .map(|(i, id)| (Arg::IdAt(i), Value::Int(*id))),
        );
        values
    };
    assert_eq!(
        execute(
            &mut b,
            mark,
            &binds(mark, &mark_binds(until, &[late, third]))
        )
        .await,
        2
    );
    execute(&mut b, &s.commit, &[]).await;
    let mark1 = s
        .of_kind(StatementKind::MarkLease(1))
        .expect("a statement for one row");
    assert_eq!(
        execute(&mut a, mark1, &binds(mark1, &mark_binds(until_a, &[early]))).await,
        1
    );
    execute(&mut a, &s.commit, &[]).await;
    for (id, fence) in [(early, until_a), (late, until), (third, until)] {
        assert_eq!(
            micros(&mut a, table, "locked_until", id).await,
            Some(fence),
            "the row holds the expiry its claim read"
        );
        let row = query(&mut a, &s.read_row, &[Value::Int(id)]).await;
        assert_eq!(int(&row[0], "attempt"), 1, "the claim counts the attempt");
    }
    assert_eq!(
        (1..=workers + 1)
            .filter(|&n| s.of_kind(StatementKind::MarkLease(n)).is_some())
            .count(),
        workers
    );
    assert!(
        s.of_kind(StatementKind::MarkLease(workers)).is_some()
            && s.of_kind(StatementKind::MarkLease(workers + 1)).is_none()
    );

    execute(&mut a, &s.begin, &[]).await;
    assert!(query(&mut a, select, &select_for(10)).await.is_empty());
    execute(&mut a, &s.commit, &[]).await;

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
    assert_eq!(execute(&mut a, extend, &extend_binds(late, until)).await, 1);
    let until2 = until + more;
    assert_eq!(
        micros(&mut a, table, "locked_until", late).await,
        Some(until2)
    );
    assert_eq!(execute(&mut a, extend, &extend_binds(late, until)).await, 0);
    for off in [until_a + 1, until_a - 1] {
        assert_eq!(
            execute(&mut a, extend, &extend_binds(early, off)).await,
            0,
            "a fence one microsecond off holds nothing"
        );
    }
    assert_eq!(
        micros(&mut a, table, "locked_until", early).await,
        Some(until_a)
    );

    // Release, then settle under the fence, marking the row with the server's time.
    let release = get(s.of_kind(StatementKind::ReleaseLease));
    let release_binds = |fence: i64| {
        binds(
            release,
            &[
                (Arg::Id, Value::Int(third)),
                (Arg::Fence, Value::Int(fence)),
            ],
        )
    };
    assert_eq!(execute(&mut a, release, &release_binds(until - 1)).await, 0);
    assert_eq!(execute(&mut a, release, &release_binds(until)).await, 1);
    assert_eq!(micros(&mut a, table, "locked_until", third).await, None);
    let settle = s.settle();
    let settle_binds = |id: i64, fence: i64| {
        binds(
            settle,
            &[(Arg::Id, Value::Int(id)), (Arg::Fence, Value::Int(fence))],
        )
    };
    assert_eq!(execute(&mut a, settle, &settle_binds(late, until)).await, 0);
    let before = server_now(&mut clock).await;
    assert_eq!(
        execute(&mut a, settle, &settle_binds(late, until2)).await,
        1
    );
    let after = server_now(&mut clock).await;
    let marked = micros(&mut a, table, "processed_at", late)
        .await
        .expect("the row is marked");
    assert_server_time(marked, before, after, 0, "processed_at");
    assert_eq!(micros(&mut a, table, "locked_until", late).await, None);

    // Past every lease, by the server's clock: `early`'s runs out and the future row falls
    // due. The released row, the expired one and the now-due one; never `late`.
    set_from_server_now(&mut a, table, "locked_until", early, -1).await;
    set_from_server_now(&mut a, table, "due_at", future, -1).await;
    execute(&mut a, &s.begin, &[]).await;
    let rest = query(&mut a, select, &select_for(10)).await;
    execute(&mut a, &s.rollback, &[]).await;
    let mut rest = ids(&rest);
    rest.sort_unstable();
    let mut want = vec![early, third, future];
    want.sort_unstable();
    assert_eq!(rest, want);
    assert!(!rest.contains(&late));
    drop_table(&mut a, table).await;
}

#[tokio::test]
async fn advisory_form() {
    let table = unique("my_advisory");
    let mut a = connect().await;
    let mut b = connect().await;
    create(&mut a, table).await;
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .advisory(LEASE_KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .desc();
    let s = Statements::render(Dialect::MariaDb, &desc, 2);
    publish(&mut a, &s, b"1", None, "7").await;
    publish(&mut a, &s, b"2", None, "8").await;
    a.query_drop(format!("INSERT INTO {table} (payload) VALUES ('3')"))
        .await
        .unwrap();
    let candidates = get(s.of_kind(StatementKind::Candidates));
    let rows = query(
        &mut a,
        candidates,
        &binds(candidates, &[(Arg::Limit, Value::Int(10))]),
    )
    .await;
    let keys: Vec<Option<String>> = rows
        .iter()
        .map(|r| r.get::<Option<String>, _>("rs_key").expect("a key column"))
        .collect();
    assert_eq!(
        keys,
        [
            Some("video_jobs-7".to_owned()),
            Some("video_jobs-8".to_owned()),
            None
        ],
        "a NULL key column makes the key NULL"
    );
    let first = int(&rows[0], "rs_id");

    let database: String = query(&mut a, get(s.current_database.as_ref()), &[]).await[0]
        .get("db")
        .expect("a database");
    let name = mysql_lock_name(&database, keys[0].as_deref().expect("row 1 has a key"));
    assert_eq!(name, format!("{database}.video_jobs-7"));
    let try_lock = get(s.of_kind(StatementKind::TryLock));
    let unlock = get(s.of_kind(StatementKind::Unlock));
    let answer = |rows: Vec<Row>, column: &str| rows[0].get::<Option<i64>, _>(column).flatten();
    let key = |name: &str| vec![Value::Text(name.to_owned())];
    assert_eq!(
        answer(query(&mut a, try_lock, &key(&name)).await, "locked"),
        Some(1)
    );
    assert_eq!(
        answer(query(&mut b, try_lock, &key(&name)).await, "locked"),
        Some(0),
        "a second connection's GET_LOCK of a held name answers 0"
    );

    // The take counts the attempt, then the row is read.
    let take_count = get(s.of_kind(StatementKind::TakeCount));
    assert!(s.of_kind(StatementKind::Take).is_none());
    assert_eq!(
        execute(
            &mut a,
            take_count,
            &binds(take_count, &[(Arg::Id, Value::Int(first))])
        )
        .await,
        1
    );
    let row = query(&mut a, &s.read_row, &[Value::Int(first)]).await;
    assert_eq!(int(&row[0], "attempt"), 1);
    assert_eq!(execute(&mut a, s.settle(), &[Value::Int(first)]).await, 1);
    assert_eq!(
        execute(
            &mut a,
            take_count,
            &binds(take_count, &[(Arg::Id, Value::Int(first))])
        )
        .await,
        0,
        "a settled row is taken no more"
    );
    assert_eq!(
        answer(query(&mut a, unlock, &key(&name)).await, "unlocked"),
        Some(1)
    );
    assert_eq!(
        answer(query(&mut b, try_lock, &key(&name)).await, "locked"),
        Some(1)
    );
    assert_eq!(
        answer(query(&mut b, unlock, &key(&name)).await, "unlocked"),
        Some(1)
    );
    assert_ne!(
        answer(query(&mut b, unlock, &key(&name)).await, "unlocked"),
        Some(1),
        "an unlock of a key not held does not answer yes"
    );

    // A key past 64 characters is locked by its hash.
    let long_key = format!("video_jobs-{}", "c".repeat(80));
    let long = mysql_lock_name(&database, &long_key);
    assert_eq!(long.chars().count(), MYSQL_LOCK_NAME_MAX);
    assert!(!long.contains('.'), "hashed: {long}");
    assert_eq!(
        answer(query(&mut a, try_lock, &key(&long)).await, "locked"),
        Some(1)
    );
    assert_eq!(
        answer(query(&mut b, try_lock, &key(&long)).await, "locked"),
        Some(0)
    );
    assert_eq!(
        answer(query(&mut a, unlock, &key(&long)).await, "unlocked"),
        Some(1)
    );

    drop_table(&mut a, table).await;
}

#[tokio::test]
async fn advisory_take_reads_only_claimable_rows() {
    let table = unique("my_advisory_plain");
    let mut conn = connect().await;
    create(&mut conn, table).await;
    const KEY: &[KeyPart] = &[KeyPart::Literal("row-"), KeyPart::Column("id")];
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .advisory(KEY)
        .payload(Column::new("payload"))
        .processed_at(Column::new("processed_at"))
        .due(Column::new("due_at"))
        .desc();
    let s = Statements::render(Dialect::MariaDb, &desc, 2);
    // A row published without a due time is due at the server's time of the publish; one
    // due a minute from the server's time is not due yet.
    let before = server_now(&mut conn).await;
    publish(&mut conn, &s, b"due", None, "").await;
    let after = server_now(&mut conn).await;
    publish(&mut conn, &s, b"later", Some(after + 60_000_000), "").await;
    let all: Vec<(i64, Vec<u8>)> = conn
        .query(format!("SELECT id, payload FROM {table} ORDER BY id"))
        .await
        .unwrap();
    let id_of = |payload: &[u8]| all.iter().find(|(_, p)| p == payload).unwrap().0;
    let (due, later) = (id_of(b"due"), id_of(b"later"));
    let due_at = micros(&mut conn, table, "due_at", due)
        .await
        .expect("a due time");
    assert_server_time(due_at, before, after, 0, "a row published due now");
    let candidates = get(s.of_kind(StatementKind::Candidates));
    let rows = query(
        &mut conn,
        candidates,
        &binds(candidates, &[(Arg::Limit, Value::Int(10))]),
    )
    .await;
    assert_eq!(rows.len(), 1, "the row not yet due is no candidate");
    let id = int(&rows[0], "rs_id");
    assert_eq!(id, due);
    assert_eq!(
        rows[0].get::<String, _>("rs_key"),
        Some(format!("row-{id}"))
    );
    let take = get(s.of_kind(StatementKind::Take));
    let take_binds = |id: i64| binds(take, &[(Arg::Id, Value::Int(id))]);
    assert!(
        query(&mut conn, take, &take_binds(later)).await.is_empty(),
        "a row not yet due is not taken"
    );
    assert_eq!(query(&mut conn, take, &take_binds(id)).await.len(), 1);
    let settle = s.settle();
    let settled = binds(settle, &[(Arg::Id, Value::Int(id))]);
    let before = server_now(&mut conn).await;
    assert_eq!(execute(&mut conn, settle, &settled).await, 1);
    let after = server_now(&mut conn).await;
    let marked = micros(&mut conn, table, "processed_at", id)
        .await
        .expect("the row is marked");
    assert_server_time(marked, before, after, 0, "processed_at");
    assert!(query(&mut conn, take, &take_binds(id)).await.is_empty());
    drop_table(&mut conn, table).await;
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

/// MariaDB: several lease settlements in one `DELETE .. RETURNING`: each row only under its
/// own fence; the ids it deleted come back, so a lost lease among them is told apart. The
/// `processed_at` mark, an `UPDATE`, returns no rows on MariaDB and MySQL, and MySQL's
/// `DELETE` neither: there each settlement runs on its own.
#[tokio::test]
async fn lease_settlements_in_one_statement() {
    let table = unique("my_settle_leases");
    let mut conn = connect().await;
    create(&mut conn, table).await;
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .lease(Column::new("locked_until"))
        .desc();
    assert!(Statements::settle_leases(Dialect::MySql, &desc, 3).is_none());
    let s = Statements::render(Dialect::MariaDb, &desc, 3);
    for payload in [b"a", b"b", b"c"] {
        publish(&mut conn, &s, payload, None, "x").await;
    }
    // The three are claimed together: the locking read's expiry is each row's fence.
    execute(&mut conn, &s.begin, &[]).await;
    let select = get(s.of_kind(StatementKind::SelectLease));
    let claimed = query(
        &mut conn,
        select,
        &binds(
            select,
            &[
                (Arg::LeaseFor, Value::Int(30_000_000)),
                (Arg::Limit, Value::Int(3)),
            ],
        ),
    )
    .await;
    let held = ids(&claimed);
    assert_eq!(held.len(), 3);
    let until = int(&claimed[0], UNTIL);
    let mark = get(s.of_kind(StatementKind::MarkLease(3)));
    let mut values = vec![(Arg::Fence, Value::Int(until))];
    values.extend(
        held.iter()
            .enumerate()
            .map(|(i, id)| (Arg::IdAt(i), Value::Int(*id))),
    );
    assert_eq!(execute(&mut conn, mark, &binds(mark, &values)).await, 3);
    execute(&mut conn, &s.commit, &[]).await;
    let settle = Statements::settle_leases(Dialect::MariaDb, &desc, 3).expect("MariaDB");
    // Each row's fence is the expiry its claim read back; the third's is one microsecond off.
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
    let mut settled = ids(&query(&mut conn, &settle, &values).await);
    settled.sort_unstable();
    assert_eq!(settled, held[..2], "the third's fence is off");
    let left: Vec<i64> = conn.query(format!("SELECT id FROM {table}")).await.unwrap();
    assert_eq!(left, [held[2]], "only the third is left");
    drop_table(&mut conn, table).await;
}

/// A lease claim reads the expiry by the server's clock in its locking read, and the mark
/// writes exactly that: the row holds it to the microsecond; a fence taken from it holds the
/// row and one a microsecond off holds nothing; an extension moves the expiry by exactly its
/// length; a retry makes the row due the delay after the server's time.
#[tokio::test]
async fn lease_claim_reads_back_the_expiry_it_wrote() {
    use ruststream_core::dialect::FormStatements;
    let table = unique("my_lease_until");
    let mut conn = connect().await;
    let mut clock = connect().await;
    create(&mut conn, table).await;
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"))
        .processed_at(Column::new("processed_at"))
        .due(Column::new("due_at"))
        .desc();
    let s = Statements::render(Dialect::MariaDb, &desc, 1);
    let FormStatements::Lease(f) = &s.form else {
        panic!("the lease form");
    };
    publish(&mut conn, &s, b"x", None, "x").await;
    let select = get(s.of_kind(StatementKind::SelectLease));
    let Output::Rows { columns, .. } = &select.output else {
        panic!("the claim answers rows");
    };
    assert_eq!(
        columns.last().map(|c| c.name),
        Some(UNTIL),
        "the expiry is the claim's last column"
    );
    let lease = 20_000_000;
    let select_binds = binds(
        select,
        &[
            (Arg::LeaseFor, Value::Int(lease)),
            (Arg::Limit, Value::Int(1)),
        ],
    );
    execute(&mut conn, &s.begin, &[]).await;
    let before = server_now(&mut clock).await;
    let claimed = query(&mut conn, select, &select_binds).await;
    let after = server_now(&mut clock).await;
    assert_eq!(claimed.len(), 1);
    let id = int(&claimed[0], "id");
    let until = int(&claimed[0], UNTIL);
    assert_server_time(until, before, after, lease, "the claim's expiry");
    let mark = get(f.claim.mark(1));
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
    assert_eq!(
        micros(&mut conn, table, "locked_until", id).await,
        Some(until),
        "the expiry read back is the one the row holds"
    );

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
            execute(&mut conn, extend, &extend_by(more, off)).await,
            0,
            "a fence a microsecond off holds nothing"
        );
    }
    assert_eq!(
        micros(&mut conn, table, "locked_until", id).await,
        Some(until)
    );
    assert_eq!(execute(&mut conn, extend, &extend_by(more, until)).await, 1);
    assert_eq!(
        micros(&mut conn, table, "locked_until", id).await,
        Some(until + more),
        "the extension moves the expiry by exactly its length"
    );
    assert_eq!(
        execute(&mut conn, extend, &extend_by(more, until)).await,
        0,
        "the old expiry fences nothing"
    );
    let until = until + more;

    // A retry under the fence: due the delay after the server's time, the lease cleared.
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
    assert_eq!(execute(&mut conn, retry, &retry_binds(until - 1)).await, 0);
    let before = server_now(&mut clock).await;
    assert_eq!(execute(&mut conn, retry, &retry_binds(until)).await, 1);
    let after = server_now(&mut clock).await;
    let due = micros(&mut conn, table, "due_at", id)
        .await
        .expect("a due time");
    assert_server_time(due, before, after, retry_in, "the retried row's due time");
    assert_eq!(micros(&mut conn, table, "locked_until", id).await, None);
    execute(&mut conn, &s.begin, &[]).await;
    assert!(
        query(&mut conn, select, &select_binds).await.is_empty(),
        "the retried row is not due yet"
    );
    execute(&mut conn, &s.rollback, &[]).await;
    drop_table(&mut conn, table).await;
}

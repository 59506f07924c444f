//! The statements the core renders for MariaDB (standing in for MySQL), run on a real server
//! through mysql_async, with binds built from each statement's `args`: the SQL runs, and it
//! does what the forms need.
//!
//! The server is `RUSTSTREAM_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`); a test
//! that cannot reach it fails with a message naming the URL.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use ruststream_conformance::session::binds;
use ruststream_core::dialect::UNTIL;
use ruststream_core::spec::{Column, InboxSpec, KeyPart};
use ruststream_core::{Arg, Dialect, Output, Statement, StatementKind, Statements, Value};

#[path = "conformance/session.rs"]
#[allow(dead_code, reason = "the suite's session; these tests use its binds")]
mod session;

use session::params;

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

//! The adapter driven by hand, command by command, on the real PostgreSQL: a close cuts a
//! statement short, a release rolls back a transaction left open, the simple protocol's
//! literals round-trip any text and bytes, driver errors map to the core's kinds, and rows
//! decode with serde under both protocols.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ruststream::adapter::Adapter;
use ruststream_core::{
    Action, Arg, Command, CommandId, ConnId, ErrorKind, Output, Reply, Statement, StatementKind,
    Value,
};
use ruststream_tokio_postgres::deadpool_postgres::PoolConfig;
use ruststream_tokio_postgres::{PgRow, TokioPostgresBroker};
use serde::Deserialize;

struct Driver {
    broker: TokioPostgresBroker,
    next: u64,
}

impl Driver {
    async fn start(db: &Db, size: usize, simple: bool) -> Self {
        let broker =
            TokioPostgresBroker::from_url(db.url(), PoolConfig::new(size)).simple_query(simple);
        Adapter::start(&broker).await.expect("the adapter starts");
        Self { broker, next: 0 }
    }

    fn command(&mut self, conn: u64, action: Action) -> Command {
        self.next += 1;
        Command {
            id: CommandId(self.next),
            conn: ConnId(conn),
            action,
        }
    }

    async fn run(&mut self, conn: u64, action: Action) -> Reply<PgRow> {
        let command = self.command(conn, action);
        self.broker.execute(command, None).await
    }

    async fn sql(
        &mut self,
        conn: u64,
        sql: &str,
        binds: Vec<Value>,
        output: Output,
    ) -> Reply<PgRow> {
        self.run(conn, execute(StatementKind::ReadRow, sql, binds, output))
            .await
    }
}

fn statement(kind: StatementKind, sql: &str, args: usize, output: Output) -> Statement {
    Statement {
        kind,
        sql: sql.into(),
        args: vec![Arg::Id; args].into(),
        output,
    }
}

fn execute(kind: StatementKind, sql: &str, binds: Vec<Value>, output: Output) -> Action {
    Action::Execute {
        statement: statement(kind, sql, binds.len(), output),
        binds,
    }
}

fn rows(columns: &[&'static str], raw: bool) -> Output {
    Output::Rows {
        // The driver's own reading of each column: the core's id type keeps it.
        columns: columns
            .iter()
            .map(|&name| ruststream_core::OutColumn::new(name, ruststream_core::ColumnType::Id))
            .collect(),
        raw,
    }
}

fn values(reply: Reply<PgRow>) -> Vec<Vec<Value>> {
    match reply {
        Reply::Rows(rows) => rows.into_iter().map(|r| r.values).collect(),
        other => panic!("rows expected: {other:?}"),
    }
}

async fn close_cuts_a_statement_short(test: &str, simple: bool) {
    let db = Db::new(test).await;
    let mut driver = Driver::start(&db, 2, simple).await;
    assert!(matches!(driver.run(1, Action::Acquire).await, Reply::Done));
    let sleep = driver.command(
        1,
        execute(
            StatementKind::ReadRow,
            "SELECT pg_sleep(60)",
            Vec::new(),
            Output::Nothing,
        ),
    );
    // Handed to the connection now, run in the background.
    let sleeping = tokio::spawn(driver.broker.execute(sleep, None));
    let active = format!(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = '{}' \
         AND state = 'active' AND query LIKE 'SELECT pg_sleep%'",
        db.name
    );
    assert_eq!(db.wait_count(&active, 1).await, 1);
    let start = Instant::now();
    assert!(matches!(driver.run(1, Action::Close).await, Reply::Done));
    match sleeping.await.unwrap() {
        Reply::Failed(error) => assert_eq!(error.kind, ErrorKind::ConnectionLost, "{error}"),
        other => panic!("a statement cut short answers Failed: {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "the close cut the statement short: {:?}",
        start.elapsed()
    );
    assert_eq!(
        db.wait_count(&active, 0).await,
        0,
        "the statement ended on the server"
    );
    assert_eq!(driver.broker.connections_held(), 0);
    // The pool lends a fresh connection in place of the closed one.
    assert!(matches!(driver.run(2, Action::Acquire).await, Reply::Done));
    let one = driver
        .sql(
            2,
            "SELECT 1::int8 AS one",
            Vec::new(),
            rows(&["one"], false),
        )
        .await;
    assert_eq!(values(one), vec![vec![Value::Int(1)]]);
    assert!(matches!(driver.run(2, Action::Release).await, Reply::Done));
    driver.broker.close().await;
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_cuts_a_statement_short() {
    close_cuts_a_statement_short("close_cuts", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_cuts_a_statement_short_simple() {
    close_cuts_a_statement_short("close_cuts_simple", true).await;
}

/// The core rolls a transaction back before it releases a connection; one released inside a
/// transaction anyway (by a driver of its own) closes, and its transaction ends with it.
async fn release_inside_a_transaction_closes(test: &str, simple: bool) {
    let db = Db::new(test).await;
    // One connection: the one released is the one acquired next.
    let mut driver = Driver::start(&db, 1, simple).await;
    assert!(matches!(driver.run(1, Action::Acquire).await, Reply::Done));
    let begin = execute(StatementKind::Begin, "BEGIN", Vec::new(), Output::Nothing);
    assert!(matches!(driver.run(1, begin).await, Reply::Done));
    let pid = values(
        driver
            .sql(
                1,
                "SELECT pg_backend_pid()::int8 AS pid",
                Vec::new(),
                rows(&["pid"], false),
            )
            .await,
    );
    let insert = execute(
        StatementKind::Publish,
        "INSERT INTO invoices (payload) VALUES ($1)",
        vec![Value::Bytes(b"{\"n\":1}".to_vec())],
        Output::Affected,
    );
    assert!(matches!(driver.run(1, insert).await, Reply::Affected(1)));
    assert!(matches!(driver.run(1, Action::Release).await, Reply::Done));

    assert!(matches!(driver.run(2, Action::Acquire).await, Reply::Done));
    let again = values(
        driver
            .sql(
                2,
                "SELECT pg_backend_pid()::int8 AS pid",
                Vec::new(),
                rows(&["pid"], false),
            )
            .await,
    );
    assert_ne!(
        again, pid,
        "a connection released inside a transaction closes rather than going back to the pool"
    );
    let state = values(
        driver
            .sql(
                2,
                "SELECT COUNT(*)::int8 AS n FROM invoices",
                Vec::new(),
                rows(&["n"], false),
            )
            .await,
    );
    assert_eq!(
        state,
        vec![vec![Value::Int(0)]],
        "the insert ended with the session"
    );
    // No transaction is open on it: a statement's effect is visible to others at once.
    let insert = execute(
        StatementKind::Publish,
        "INSERT INTO invoices (payload) VALUES ($1)",
        vec![Value::Bytes(b"{\"n\":2}".to_vec())],
        Output::Affected,
    );
    assert!(matches!(driver.run(2, insert).await, Reply::Affected(1)));
    assert_eq!(db.count("SELECT COUNT(*) FROM invoices").await, 1);
    assert!(matches!(driver.run(2, Action::Release).await, Reply::Done));
    driver.broker.close().await;
    assert!(
        db.sessions_gone().await,
        "the closed pool's sessions are gone"
    );
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_inside_a_transaction_closes_the_connection() {
    release_inside_a_transaction_closes("release_rollback", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_inside_a_transaction_closes_the_connection_simple() {
    release_inside_a_transaction_closes("release_rollback_simple", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_literals_round_trip_any_text_and_bytes() {
    let db = Db::new("literals").await;
    let mut driver = Driver::start(&db, 1, true).await;
    let text = "it's \\ a 'test' ☃ $1 -- /* E'x' */ \"q\" \\x00 $$ end\\";
    let bytes: Vec<u8> = (0..=255).collect();
    for conforming in ["on", "off"] {
        assert!(matches!(driver.run(1, Action::Acquire).await, Reply::Done));
        let set = format!("SET standard_conforming_strings = {conforming}");
        assert!(matches!(
            driver.sql(1, &set, Vec::new(), Output::Nothing).await,
            Reply::Done
        ));
        let inserted = values(
            driver
                .sql(
                    1,
                    "INSERT INTO videos (channel, payload, attempt) VALUES ($1, $2, $3) RETURNING id",
                    vec![
                        Value::Text(text.to_owned()),
                        Value::Bytes(bytes.clone()),
                        Value::Int(-7),
                    ],
                    rows(&["id"], false),
                )
                .await,
        );
        let id = inserted[0][0].as_int().expect("an id");
        let client = db.client().await;
        let row = client
            .query_one(
                "SELECT channel, payload, attempt FROM videos WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        assert_eq!(
            row.get::<_, String>(0),
            text,
            "standard_conforming_strings = {conforming}"
        );
        assert_eq!(row.get::<_, Vec<u8>>(1), bytes);
        assert_eq!(row.get::<_, i32>(2), -7);
        // Read back through the adapter: the text row decodes into the row type.
        let reply = driver
            .sql(
                1,
                "SELECT id, channel, attempt, payload FROM videos WHERE id = $1",
                vec![Value::Int(id)],
                rows(&["id", "attempt"], true),
            )
            .await;
        let Reply::Rows(mut read) = reply else {
            panic!("rows expected")
        };
        let row = read.remove(0);
        assert_eq!(row.values, vec![Value::Int(id), Value::Int(-7)]);
        let raw = row.raw.expect("the raw row");
        assert!(raw.as_simple_row().is_some());
        #[derive(Deserialize)]
        struct Back {
            channel: String,
            attempt: i16,
            payload: Vec<u8>,
        }
        let back: Back = raw.decode().unwrap();
        assert_eq!(back.channel, text);
        assert_eq!(back.attempt, -7);
        assert_eq!(back.payload, bytes);
        // A NUL in text is refused before it reaches the server.
        match driver
            .sql(
                1,
                "SELECT $1::text AS t",
                vec![Value::Text("a\0b".into())],
                rows(&["t"], false),
            )
            .await
        {
            Reply::Failed(error) => assert!(error.message.contains("NUL"), "{error}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(driver.run(1, Action::Close).await, Reply::Done));
    }
    driver.broker.close().await;
    db.finish().await;
}

async fn errors_map_to_kinds(test: &str, simple: bool) {
    let db = Db::new(test).await;
    let mut driver = Driver::start(&db, 2, simple).await;
    assert!(matches!(driver.run(1, Action::Acquire).await, Reply::Done));
    let cases = [
        ("SELECT * FROM no_such_table", ErrorKind::UndefinedTable),
        (
            "SELECT no_such_column FROM invoices",
            ErrorKind::UndefinedColumn,
        ),
        ("SELEC 1", ErrorKind::Other),
    ];
    for (sql, kind) in cases {
        match driver.sql(1, sql, Vec::new(), rows(&["x"], false)).await {
            Reply::Failed(error) => assert_eq!(error.kind, kind, "{sql}: {error}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
    // A statement timeout is a timeout.
    let set = driver
        .sql(
            1,
            "SET statement_timeout = '50ms'",
            Vec::new(),
            Output::Nothing,
        )
        .await;
    assert!(matches!(set, Reply::Done), "{set:?}");
    match driver
        .sql(1, "SELECT pg_sleep(5)", Vec::new(), Output::Nothing)
        .await
    {
        Reply::Failed(error) => assert_eq!(error.kind, ErrorKind::Timeout, "{error}"),
        other => panic!("{other:?}"),
    }
    // A session the server ends is a lost connection; the connection is not given back.
    let pid = values(
        driver
            .sql(
                1,
                "SELECT pg_backend_pid()::int8 AS pid",
                Vec::new(),
                rows(&["pid"], false),
            )
            .await,
    )[0][0]
        .as_int()
        .unwrap();
    db.execute(&format!("SELECT pg_terminate_backend({pid})"))
        .await;
    match driver.sql(1, "SELECT 1", Vec::new(), Output::Nothing).await {
        Reply::Failed(error) => assert_eq!(error.kind, ErrorKind::ConnectionLost, "{error}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(driver.run(1, Action::Release).await, Reply::Done));
    // A command on a connection the core does not hold.
    match driver.sql(9, "SELECT 1", Vec::new(), Output::Nothing).await {
        Reply::Failed(error) => assert_eq!(error.kind, ErrorKind::ConnectionLost, "{error}"),
        other => panic!("{other:?}"),
    }
    driver.broker.close().await;
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_errors_map_to_the_cores_kinds() {
    errors_map_to_kinds("errors", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_errors_map_to_the_cores_kinds_simple() {
    errors_map_to_kinds("errors_simple", true).await;
}

#[derive(Debug, Deserialize, PartialEq)]
struct Decoded {
    small: i64,
    mid: u8,
    big: i64,
    flag: bool,
    text: String,
    maybe: Option<String>,
    bytes: Vec<u8>,
    ratio: f64,
    uid: String,
    doc: String,
    kind: Kind,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Kind {
    Invoice,
}

const DECODE_SQL: &str = "SELECT 7::int2 AS small, 8::int4 AS mid, 9::int8 AS big, true AS flag, \
    'x''y' AS text, NULL::text AS maybe, '\\x00ff'::bytea AS bytes, 1.5::float8 AS ratio, \
    '12345678-9abc-def0-0123-456789abcdef'::uuid AS uid, '{\"a\": 1}'::jsonb AS doc, \
    'invoice'::varchar AS kind, now() AS ignored";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_decode_with_serde_under_both_protocols() {
    let client = connect_to(&base_url()).await;
    let expected = Decoded {
        small: 7,
        mid: 8,
        big: 9,
        flag: true,
        text: "x'y".into(),
        maybe: None,
        bytes: vec![0, 255],
        ratio: 1.5,
        uid: "12345678-9abc-def0-0123-456789abcdef".into(),
        doc: "{\"a\": 1}".into(),
        kind: Kind::Invoice,
    };
    let extended = PgRow::from(client.query_one(DECODE_SQL, &[]).await.unwrap());
    assert!(extended.as_row().is_some());
    assert_eq!(extended.decode::<Decoded>().unwrap(), expected);
    let simple = client
        .simple_query(DECODE_SQL)
        .await
        .unwrap()
        .into_iter()
        .find_map(|m| match m {
            ruststream_tokio_postgres::tokio_postgres::SimpleQueryMessage::Row(row) => {
                Some(PgRow::from(row))
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(simple.decode::<Decoded>().unwrap(), expected);
    assert_eq!(simple.columns(), extended.columns());

    // A tuple reads the columns in order.
    let tuple: (i16, i32, u64) = extended.decode().unwrap();
    assert_eq!(tuple, (7, 8, 9));

    // A field of a type the adapter does not read names its column.
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Stamped {
        ignored: String,
    }
    let error = extended.decode::<Stamped>().unwrap_err();
    assert_eq!(error.column(), Some("ignored"), "{error}");
    assert!(error.to_string().contains("timestamptz"), "{error}");
    // Under the simple protocol it is text.
    assert!(simple.decode::<Stamped>().is_ok());
    // A value out of the field's range names its column.
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Narrow {
        big: i64,
        mid: i8,
    }
    let narrow: Narrow = extended.decode().unwrap();
    assert_eq!(narrow.mid, 8);
    let out = PgRow::from(
        client
            .query_one("SELECT 300::int4 AS mid, 1::int8 AS big", &[])
            .await
            .unwrap(),
    );
    let error = out.decode::<Narrow>().unwrap_err();
    assert_eq!(error.column(), Some("mid"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binds_follow_the_types_the_server_inferred() {
    let db = Db::new("binds").await;
    db.execute(
        "CREATE TABLE typed (id UUID PRIMARY KEY, n SMALLINT, m NUMERIC, doc JSONB, t TEXT)",
    )
    .await;
    let mut driver = Driver::start(&db, 1, false).await;
    assert!(matches!(driver.run(1, Action::Acquire).await, Reply::Done));
    let insert = driver
        .sql(
            1,
            "INSERT INTO typed (id, n, m, doc, t) VALUES ($1, $2, $3, $4, $5) RETURNING id, n",
            vec![
                Value::Text("12345678-9abc-def0-0123-456789abcdef".into()),
                Value::Int(12),
                Value::Int(1_000_000_000_000),
                Value::Bytes(b"{\"n\": 3}".to_vec()),
                Value::Int(5),
            ],
            rows(&["id", "n"], false),
        )
        .await;
    assert_eq!(
        values(insert),
        vec![vec![
            Value::Text("12345678-9abc-def0-0123-456789abcdef".into()),
            Value::Int(12)
        ]]
    );
    // A uuid read back binds again.
    let found = driver
        .sql(
            1,
            "SELECT t FROM typed WHERE id = $1 AND n = $2",
            vec![
                Value::Text("12345678-9abc-def0-0123-456789abcdef".into()),
                Value::Int(12),
            ],
            rows(&["t"], false),
        )
        .await;
    assert_eq!(values(found), vec![vec![Value::Text("5".into())]]);
    // A value too wide for the inferred type is refused with a message, not truncated.
    match driver
        .sql(
            1,
            "SELECT n FROM typed WHERE n = $1",
            vec![Value::Int(70_000)],
            rows(&["n"], false),
        )
        .await
    {
        Reply::Failed(error) => assert!(error.message.contains("smallint"), "{error}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(driver.run(1, Action::Release).await, Reply::Done));
    driver.broker.close().await;
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_of_one_connection_run_in_order() {
    let db = Db::new("order").await;
    let driver = Arc::new(tokio::sync::Mutex::new(Driver::start(&db, 2, false).await));
    let mut d = driver.lock().await;
    assert!(matches!(d.run(1, Action::Acquire).await, Reply::Done));
    // Hand many commands at once, then poll their futures side by side, the last first: they
    // run in the order they were handed.
    let futures: Vec<_> = (0..20)
        .map(|i| {
            let command = d.command(
                1,
                execute(
                    StatementKind::Publish,
                    "INSERT INTO invoices (attempt, payload) VALUES ($1, '\\x00')",
                    vec![Value::Int(i)],
                    Output::Affected,
                ),
            );
            d.broker.execute(command, None)
        })
        .collect();
    for reply in futures::future::join_all(futures.into_iter().rev()).await {
        assert!(matches!(reply, Reply::Affected(1)));
    }
    let order = values(
        d.sql(
            1,
            "SELECT COALESCE(string_agg(attempt::text, ',' ORDER BY id), '') AS o FROM invoices",
            Vec::new(),
            rows(&["o"], false),
        )
        .await,
    );
    let want: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    assert_eq!(order, vec![vec![Value::Text(want.join(","))]]);
    assert!(matches!(d.run(1, Action::Release).await, Reply::Done));
    d.broker.close().await;
    drop(d);
    db.finish().await;
}

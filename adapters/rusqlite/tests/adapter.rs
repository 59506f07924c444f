//! The adapter by hand, on plain threads with no executor: commands on named connections,
//! rows and errors, the custom lock, the pool's lending, waiting and closing.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::Db;
use futures::executor::block_on;
use ruststream::adapter::Adapter;
use ruststream_core::{
    Action, Command, CommandId, ConnId, Dialect, ErrorKind, Output, Reply, Statement,
    StatementKind, Value,
};
use ruststream_rusqlite::rusqlite::types::Value as SqlValue;
use ruststream_rusqlite::rusqlite::{self, Connection};
use ruststream_rusqlite::{CustomLock, RusqliteBroker, RusqliteRow};

fn run(broker: &RusqliteBroker, conn: u64, action: Action) -> Reply<RusqliteRow> {
    block_on(broker.execute(command(conn, action), None))
}

fn command(conn: u64, action: Action) -> Command {
    Command {
        id: CommandId(0),
        conn: ConnId(conn),
        action,
    }
}

fn statement(sql: &str, output: Output) -> Statement {
    Statement {
        kind: StatementKind::ReadRow,
        sql: sql.into(),
        args: Arc::from(Vec::new()),
        output,
    }
}

fn exec(sql: &str, output: Output, binds: Vec<Value>) -> Action {
    Action::Execute {
        statement: statement(sql, output),
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

fn failed(reply: Reply<RusqliteRow>) -> ruststream_core::DbError {
    match reply {
        Reply::Failed(error) => error,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn started(db: &Db, broker: RusqliteBroker) -> RusqliteBroker {
    let _ = db;
    assert_eq!(block_on(Adapter::start(&broker)).unwrap(), Dialect::Sqlite);
    broker
}

#[test]
fn commands_run_on_their_connection() {
    let db = Db::new("adapter_commands");
    let broker = started(
        &db,
        RusqliteBroker::open(&db.path).busy_timeout(Duration::from_millis(200)),
    );
    assert_eq!(
        broker.open_connections(),
        1,
        "the start opens the first connection"
    );
    assert_eq!(run(&broker, 1, Action::Acquire), Reply::Done);
    assert_eq!(
        run(
            &broker,
            1,
            exec(
                "CREATE TABLE jobs (id INTEGER PRIMARY KEY, payload BLOB, note TEXT, score REAL, flag INTEGER)",
                Output::Nothing,
                vec![]
            )
        ),
        Reply::Done
    );
    let insert = "INSERT INTO jobs (id, payload, note, score, flag) VALUES (?1, ?2, ?3, 1.5, ?4)";
    assert_eq!(
        run(
            &broker,
            1,
            exec(
                insert,
                Output::Affected,
                vec![
                    Value::Int(1),
                    Value::Bytes(vec![0, 1, 255]),
                    Value::Text("hi".into()),
                    Value::Bool(true)
                ]
            )
        ),
        Reply::Affected(1)
    );
    assert_eq!(
        run(
            &broker,
            1,
            exec(
                insert,
                Output::Affected,
                vec![Value::Int(2), Value::Null, Value::Null, Value::Bool(false)]
            )
        ),
        Reply::Affected(1)
    );
    let Reply::Rows(read) = run(
        &broker,
        1,
        exec(
            "SELECT * FROM jobs ORDER BY id",
            rows(&["ID", "payload", "note", "score", "flag"], true),
            vec![],
        ),
    ) else {
        panic!("rows expected");
    };
    assert_eq!(read.len(), 2);
    assert_eq!(
        read[0].values,
        [
            Value::Int(1),
            Value::Bytes(vec![0, 1, 255]),
            Value::Text("hi".into()),
            Value::Text("1.5".into()),
            Value::Int(1)
        ],
        "the named columns, in the asked order, a REAL as its decimal text"
    );
    assert_eq!(read[1].values[1], Value::Null);
    let raw = read[0].raw.as_ref().expect("the row is kept");
    assert_eq!(raw.columns(), ["id", "payload", "note", "score", "flag"]);
    assert_eq!(raw.get("score"), Some(&SqlValue::Real(1.5)));
    let Reply::Rows(read) = run(
        &broker,
        1,
        exec("SELECT id FROM jobs", rows(&["id"], false), vec![]),
    ) else {
        panic!("rows expected");
    };
    assert!(
        read.iter().all(|r| r.raw.is_none()),
        "no raw row unless asked"
    );

    // Errors, mapped.
    let error = failed(run(
        &broker,
        1,
        exec("SELECT * FROM nope", rows(&["id"], false), vec![]),
    ));
    assert_eq!(error.kind, ErrorKind::UndefinedTable, "{error}");
    let error = failed(run(
        &broker,
        1,
        exec("SELECT nope FROM jobs", rows(&["nope"], false), vec![]),
    ));
    assert_eq!(error.kind, ErrorKind::UndefinedColumn, "{error}");
    let error = failed(run(
        &broker,
        1,
        exec("SELECT id FROM jobs", rows(&["other"], false), vec![]),
    ));
    assert_eq!(error.kind, ErrorKind::UndefinedColumn, "{error}");
    let error = failed(run(
        &broker,
        1,
        exec("SELECT ?1", rows(&["x"], false), vec![]),
    ));
    assert_eq!(error.kind, ErrorKind::Other, "{error}");

    // A transaction on one connection makes another's write wait, then time out.
    assert_eq!(
        run(&broker, 1, exec("BEGIN IMMEDIATE", Output::Nothing, vec![])),
        Reply::Done
    );
    assert_eq!(run(&broker, 2, Action::Acquire), Reply::Done);
    let error = failed(run(
        &broker,
        2,
        exec("DELETE FROM jobs", Output::Affected, vec![]),
    ));
    assert_eq!(error.kind, ErrorKind::Timeout, "busy is a timeout: {error}");
    assert!(error.closes_connection());
    // A release ends the transaction left open: the other connection writes then.
    assert_eq!(run(&broker, 1, Action::Release), Reply::Done);
    assert_eq!(
        run(
            &broker,
            2,
            exec("DELETE FROM jobs", Output::Affected, vec![])
        ),
        Reply::Affected(2)
    );

    // A released id holds nothing.
    let error = failed(run(
        &broker,
        1,
        exec("SELECT 1 AS x", rows(&["x"], false), vec![]),
    ));
    assert_eq!(error.kind, ErrorKind::ConnectionLost, "{error}");
    // The connection whose statement timed out closes rather than going back, as a connection
    // a failure may have lost does on every adapter; the other stays idle in the pool.
    assert_eq!(run(&broker, 2, Action::Release), Reply::Done);
    assert_eq!(broker.open_connections(), 1);

    block_on(broker.close());
    assert!(broker.is_closed());
    assert_eq!(broker.open_connections(), 0);
    let error = failed(run(&broker, 3, Action::Acquire));
    assert_eq!(error.kind, ErrorKind::PoolClosed, "{error}");
}

fn take(conn: &Connection, key: &str) -> rusqlite::Result<bool> {
    Ok(conn.execute("INSERT OR IGNORE INTO held (key) VALUES (?1)", [key])? == 1)
}

fn give(conn: &Connection, key: &str) -> rusqlite::Result<bool> {
    if key == "panic" {
        panic!("a lock that panics");
    }
    Ok(conn.execute("DELETE FROM held WHERE key = ?1", [key])? == 1)
}

#[test]
fn custom_locks_run_on_the_connection() {
    let db = Db::new("adapter_lock");
    db.execute("CREATE TABLE held (key TEXT PRIMARY KEY)");
    let broker = started(&db, RusqliteBroker::open(&db.path));
    let lock = CustomLock::new(take, give);
    let sub = ruststream_core::SubId(0);
    let run_lock = |conn: u64, key: &str, lock_it: bool, with: Option<CustomLock>| {
        let key: Arc<str> = key.into();
        let action = if lock_it {
            Action::Lock { sub, key }
        } else {
            Action::Unlock { sub, key }
        };
        block_on(broker.execute(command(conn, action), with))
    };
    assert_eq!(run(&broker, 1, Action::Acquire), Reply::Done);
    assert_eq!(run_lock(1, "a", true, Some(lock)), Reply::Bool(true));
    assert_eq!(run_lock(1, "a", true, Some(lock)), Reply::Bool(false));
    assert_eq!(run_lock(1, "a", false, Some(lock)), Reply::Bool(true));
    assert_eq!(run_lock(1, "a", false, Some(lock)), Reply::Bool(false));
    let error = failed(run_lock(1, "panic", false, Some(lock)));
    assert!(error.message.contains("panicked"), "{error}");
    let error = failed(run_lock(1, "a", true, None));
    assert!(error.message.contains("no custom lock"), "{error}");
    let error = failed(run_lock(9, "a", true, Some(lock)));
    assert_eq!(error.kind, ErrorKind::ConnectionLost, "{error}");
    db.execute("DROP TABLE held");
    let error = failed(run_lock(1, "a", true, Some(lock)));
    assert_eq!(error.kind, ErrorKind::UndefinedTable, "{error}");
    assert_eq!(run(&broker, 1, Action::Release), Reply::Done);
    block_on(broker.close());
}

#[test]
fn an_acquire_waits_for_a_free_connection() {
    let db = Db::new("adapter_wait");
    let broker = Arc::new(started(
        &db,
        RusqliteBroker::open(&db.path)
            .max_connections(1)
            .acquire_timeout(Duration::from_millis(300)),
    ));
    assert_eq!(run(&broker, 1, Action::Acquire), Reply::Done);
    // None is free: the acquire waits, then gives up.
    let start = Instant::now();
    let error = failed(run(&broker, 2, Action::Acquire));
    assert_eq!(error.kind, ErrorKind::PoolClosed, "{error}");
    assert!(start.elapsed() >= Duration::from_millis(250), "it waited");
    // A release hands the connection to the next waiting acquire.
    let waiting = broker.execute(command(3, Action::Acquire), None);
    let releaser = {
        let broker = broker.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            assert_eq!(run(&broker, 1, Action::Release), Reply::Done);
        })
    };
    assert_eq!(block_on(waiting), Reply::Done);
    releaser.join().unwrap();
    // A close makes room for a fresh connection.
    assert_eq!(run(&broker, 3, Action::Close), Reply::Done);
    assert_eq!(broker.open_connections(), 0);
    assert_eq!(run(&broker, 4, Action::Acquire), Reply::Done);
    assert_eq!(broker.open_connections(), 1);
    assert_eq!(
        run(
            &broker,
            4,
            exec("SELECT 1 AS x", rows(&["x"], false), vec![])
        ),
        Reply::Rows(vec![ruststream_core::Row::values(vec![Value::Int(1)])])
    );
    // A close fails the acquires still waiting.
    let waiting = broker.execute(command(5, Action::Acquire), None);
    thread::sleep(Duration::from_millis(50));
    block_on(broker.close());
    assert_eq!(failed(block_on(waiting)).kind, ErrorKind::PoolClosed);
    // The connection still lent closes when it comes back, and runs its commands until then.
    assert_eq!(broker.open_connections(), 1);
    assert_eq!(
        run(
            &broker,
            4,
            exec("SELECT 2 AS x", rows(&["x"], false), vec![])
        ),
        Reply::Rows(vec![ruststream_core::Row::values(vec![Value::Int(2)])])
    );
    assert_eq!(run(&broker, 4, Action::Release), Reply::Done);
    assert_eq!(broker.open_connections(), 0);
}

#[test]
fn a_close_cuts_short_a_running_statement() {
    let db = Db::new("adapter_interrupt");
    let broker = started(&db, RusqliteBroker::open(&db.path));
    assert_eq!(run(&broker, 1, Action::Acquire), Reply::Done);
    let endless = exec(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 300000000) \
         SELECT COUNT(*) AS n FROM c",
        rows(&["n"], false),
        vec![],
    );
    // The runtime polls the commands in flight side by side: the statement runs on its own.
    let running = thread::spawn({
        let running = broker.execute(command(1, endless), None);
        move || block_on(running)
    });
    thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    assert_eq!(run(&broker, 1, Action::Close), Reply::Done);
    let error = failed(running.join().expect("the statement's thread"));
    assert_eq!(error.kind, ErrorKind::ConnectionLost, "{error}");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(broker.open_connections(), 0);
    block_on(broker.close());
}

#[test]
fn a_start_names_what_does_not_open() {
    let missing = RusqliteBroker::open("/nonexistent-dir/ruststream/x.db");
    let error = block_on(Adapter::start(&missing)).unwrap_err();
    assert!(
        error.message.contains("/nonexistent-dir/ruststream/x.db"),
        "{error}"
    );
    assert!(!missing.is_closed());
    assert_eq!(missing.open_connections(), 0);
    let error = block_on(Adapter::start(&RusqliteBroker::open(":memory:"))).unwrap_err();
    assert!(error.message.contains("in-memory"), "{error}");
    // Not started: it lends nothing.
    let idle = RusqliteBroker::open("unused.db");
    assert_eq!(
        failed(run(&idle, 1, Action::Acquire)).kind,
        ErrorKind::PoolClosed
    );
    block_on(idle.close());
    assert!(
        block_on(Adapter::start(&idle)).is_err(),
        "a closed broker does not start again"
    );
}

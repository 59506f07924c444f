//! The adapter by hand, on the real server at `RUSTSTREAM_MYSQL_URL`: commands on named
//! connections and their order, values and errors, affected counts with and without
//! `client_found_rows`, the release's rollback, the close that cuts a statement short, the
//! connection of a command dropped midway or of a dropped broker, which leaves the pool, the
//! commands polled by another executor, the custom lock, the start's messages, and the pools'
//! closing.

mod common;

use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use common::*;
use mysql_async::prelude::Queryable;
use ruststream::adapter::Adapter;
use ruststream_core::{
    Action, Arg, Command, CommandId, ConnId, DbError, Dialect, ErrorKind, Output, Reply, Statement,
    StatementKind, Value,
};
use ruststream_mysql_async::{CustomLock, LockFuture, MySqlAsyncBroker, mysql_async};

type MyReply = Reply<mysql_async::Row>;

fn command(conn: u64, action: Action) -> Command {
    Command {
        id: CommandId(0),
        conn: ConnId(conn),
        action,
    }
}

async fn run(broker: &MySqlAsyncBroker, conn: u64, action: Action) -> MyReply {
    broker.execute(command(conn, action), None).await
}

fn statement(kind: StatementKind, sql: &str, args: usize, output: Output) -> Statement {
    Statement {
        kind,
        sql: sql.into(),
        args: vec![Arg::Id; args].into(),
        output,
    }
}

fn exec(sql: &str, output: Output, binds: Vec<Value>) -> Action {
    Action::Execute {
        statement: statement(StatementKind::ReadRow, sql, binds.len(), output),
        binds,
    }
}

fn fixed(kind: StatementKind, sql: &str) -> Action {
    Action::Execute {
        statement: statement(kind, sql, 0, Output::Nothing),
        binds: Vec::new(),
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

fn failed(reply: MyReply) -> DbError {
    match reply {
        Reply::Failed(error) => error,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn values(reply: MyReply) -> Vec<Vec<Value>> {
    match reply {
        Reply::Rows(rows) => rows.into_iter().map(|r| r.values).collect(),
        other => panic!("expected rows, got {other:?}"),
    }
}

/// Polls the futures side by side, each time in the order given, until every one has
/// answered; answers their outputs in that order.
async fn side_by_side<F: Future + Unpin>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Option<F>> = futures.into_iter().map(Some).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (future, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if let Some(polled) = future
                && let Poll::Ready(done) = Pin::new(polled).poll(cx)
            {
                *output = Some(done);
                *future = None;
            }
        }
        if pending.iter().all(Option::is_none) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|output| output.expect("every future answered"))
        .collect()
}

async fn started(broker: MySqlAsyncBroker) -> MySqlAsyncBroker {
    let dialect = Adapter::start(&broker).await.expect("the broker starts");
    assert_eq!(dialect, Dialect::MariaDb, "the test server is MariaDB");
    assert_eq!(broker.dialect(), Some(Dialect::MariaDb));
    broker
}

const ITEMS: &str = "CREATE TABLE items (
    id BIGINT PRIMARY KEY,
    payload LONGBLOB NULL,
    note VARCHAR(50) NULL,
    n INT NOT NULL DEFAULT 0,
    at DATETIME(6) NULL
) ENGINE=InnoDB";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_run_in_order_on_their_connection() {
    let db = TestDb::new("adapter_order", &[ITEMS]).await;
    let broker = started(MySqlAsyncBroker::from_url(&db.url)).await;
    assert_eq!(run(&broker, 1, Action::Acquire).await, Reply::Done);
    assert_eq!(broker.connections_held(), 1);

    // Fifty inserts, given at once and their futures polled side by side, the last first,
    // run in the order given: each reads the count the one before it left.
    let insert = "INSERT INTO items (id, n) SELECT ?, COUNT(*) FROM items";
    let replies: Vec<_> = (0..50)
        .map(|i| {
            broker.execute(
                command(1, exec(insert, Output::Affected, vec![Value::Int(i)])),
                None,
            )
        })
        .collect();
    for reply in side_by_side(replies.into_iter().rev()).await {
        assert_eq!(reply, Reply::Affected(1));
    }
    let ordered = db.count("SELECT COUNT(*) FROM items WHERE n = id").await;
    assert_eq!(ordered, 50, "every insert saw the ones before it");

    // Values by type, through the binary protocol (binds) and the text protocol (none).
    db.exec("UPDATE items SET payload = X'00FF10', note = 'é-note', at = '2024-02-29 13:05:09.000120' WHERE id = 3")
        .await;
    let select = "SELECT id, payload, note, n, at, NULL AS nothing FROM items WHERE id = 3";
    let columns = ["id", "payload", "note", "n", "at", "nothing"];
    let expected = vec![vec![
        Value::Int(3),
        Value::Bytes(vec![0, 255, 16]),
        Value::Text("é-note".into()),
        Value::Int(3),
        Value::Text("2024-02-29 13:05:09.000120".into()),
        Value::Null,
    ]];
    let text = run(&broker, 1, exec(select, rows(&columns, false), vec![])).await;
    assert_eq!(values(text), expected, "the text protocol");
    let binary = run(
        &broker,
        1,
        exec(
            "SELECT id, payload, note, n, at, NULL AS nothing FROM items WHERE id = ?",
            rows(&columns, true),
            vec![Value::Int(3)],
        ),
    )
    .await;
    let Reply::Rows(binary) = binary else {
        panic!("rows")
    };
    assert_eq!(binary[0].values, expected[0], "the binary protocol");
    let raw = binary[0].raw.clone().expect("the driver's row, when asked");
    assert_eq!(raw.get::<Vec<u8>, _>("payload"), Some(vec![0, 255, 16]));
    // Names come back as text from information_schema.
    let names = run(
        &broker,
        1,
        exec(
            "SELECT column_name AS column_name FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = ? ORDER BY ordinal_position",
            rows(&["column_name"], false),
            vec![Value::Text("items".into())],
        ),
    )
    .await;
    assert_eq!(
        values(names),
        ["id", "payload", "note", "n", "at"]
            .map(|c| vec![Value::Text(c.into())])
            .to_vec()
    );
    // Columns are found by name, ignoring case; a missing one fails the statement.
    let upper = run(
        &broker,
        1,
        exec("SELECT 5 AS Rs_Id", rows(&["rs_id"], false), vec![]),
    )
    .await;
    assert_eq!(values(upper), vec![vec![Value::Int(5)]]);
    let missing = failed(
        run(
            &broker,
            1,
            exec("SELECT 1 AS a", rows(&["b"], false), vec![]),
        )
        .await,
    );
    assert_eq!(missing.kind, ErrorKind::UndefinedColumn, "{missing}");

    // Errors map to the core's kinds, and the connection goes on.
    let no_table = failed(
        run(
            &broker,
            1,
            exec("SELECT * FROM nope", rows(&["id"], false), vec![]),
        )
        .await,
    );
    assert_eq!(no_table.kind, ErrorKind::UndefinedTable, "{no_table}");
    let no_column = failed(
        run(
            &broker,
            1,
            exec(
                "UPDATE items SET nope = 1 WHERE id = ?",
                Output::Affected,
                vec![Value::Int(1)],
            ),
        )
        .await,
    );
    assert_eq!(no_column.kind, ErrorKind::UndefinedColumn, "{no_column}");
    let syntax = failed(run(&broker, 1, exec("SELEC 1", Output::Nothing, vec![])).await);
    assert_eq!(syntax.kind, ErrorKind::Other, "{syntax}");
    let mismatch = failed(
        run(
            &broker,
            1,
            Action::Execute {
                statement: statement(StatementKind::ReadRow, "SELECT ?", 1, Output::Nothing),
                binds: Vec::new(),
            },
        )
        .await,
    );
    assert!(mismatch.message.contains("placeholders"), "{mismatch}");

    // A command on an id that holds nothing fails; a release or close of it is a no-op.
    let nothing = failed(run(&broker, 9, exec("SELECT 1", Output::Nothing, vec![])).await);
    assert_eq!(nothing.kind, ErrorKind::ConnectionLost);
    assert_eq!(run(&broker, 9, Action::Release).await, Reply::Done);
    assert_eq!(run(&broker, 9, Action::Close).await, Reply::Done);
    // An id holds one connection.
    let twice = failed(run(&broker, 1, Action::Acquire).await);
    assert!(twice.message.contains("already"), "{twice}");

    assert_eq!(run(&broker, 1, Action::Release).await, Reply::Done);
    assert_eq!(broker.connections_held(), 0);
    broker.close().await;
    assert!(broker.is_closed());
    let after = failed(run(&broker, 2, Action::Acquire).await);
    assert_eq!(after.kind, ErrorKind::PoolClosed, "{after}");
    db.cleanup().await;
}

/// An update that sets a row to the values it has: MySQL counts it as changed nowhere, found
/// once.
async fn same_value_update(broker: &MySqlAsyncBroker) -> MyReply {
    run(
        broker,
        1,
        exec(
            "UPDATE items SET n = 7 WHERE id = ?",
            Output::Affected,
            vec![Value::Int(1)],
        ),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_updates_count_the_rows_they_found() {
    let db = TestDb::new("adapter_found", &[ITEMS]).await;
    db.exec("INSERT INTO items (id, n) VALUES (1, 7), (2, 7)")
        .await;

    // The pool the broker builds sets client_found_rows.
    let built = started(MySqlAsyncBroker::from_opts(db.plain_opts())).await;
    assert_eq!(run(&built, 1, Action::Acquire).await, Reply::Done);
    assert_eq!(same_value_update(&built).await, Reply::Affected(1));
    assert_eq!(run(&built, 1, Action::Release).await, Reply::Done);
    built.close().await;

    // The service's own pool without it: the info line tells the rows found.
    let pool = mysql_async::Pool::new(db.plain_opts());
    let service = started(MySqlAsyncBroker::new(pool.clone())).await;
    assert_eq!(run(&service, 1, Action::Acquire).await, Reply::Done);
    assert_eq!(same_value_update(&service).await, Reply::Affected(1));
    let none = run(
        &service,
        1,
        exec(
            "UPDATE items SET n = 7 WHERE id = ?",
            Output::Affected,
            vec![Value::Int(99)],
        ),
    )
    .await;
    assert_eq!(none, Reply::Affected(0));
    let deleted = run(
        &service,
        1,
        exec(
            "DELETE FROM items WHERE id = ?",
            Output::Affected,
            vec![Value::Int(2)],
        ),
    )
    .await;
    assert_eq!(deleted, Reply::Affected(1));
    assert_eq!(run(&service, 1, Action::Release).await, Reply::Done);
    service.close().await;
    // The service's pool stays open.
    let mut conn = pool
        .get_conn()
        .await
        .expect("the service's pool stays open");
    conn.query_drop("SELECT 1").await.unwrap();
    drop(conn);
    pool.disconnect().await.unwrap();
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_inside_a_transaction_ends_it() {
    let db = TestDb::new("adapter_release", &[ITEMS]).await;
    db.exec("INSERT INTO items (id, n) VALUES (1, 0)").await;
    let broker =
        started(MySqlAsyncBroker::from_url(&db.url).acquire_timeout(Duration::from_secs(5))).await;
    assert_eq!(run(&broker, 1, Action::Acquire).await, Reply::Done);
    assert_eq!(
        run(&broker, 1, fixed(StatementKind::Begin, "START TRANSACTION")).await,
        Reply::Done
    );
    let locked = run(
        &broker,
        1,
        exec(
            "SELECT * FROM items WHERE id = ? FOR UPDATE",
            rows(&["id"], true),
            vec![Value::Int(1)],
        ),
    )
    .await;
    assert_eq!(values(locked), vec![vec![Value::Int(1)]]);
    assert_eq!(
        run(
            &broker,
            1,
            exec(
                "UPDATE items SET n = 5 WHERE id = ?",
                Output::Affected,
                vec![Value::Int(1)]
            )
        )
        .await,
        Reply::Affected(1)
    );
    // Another session skips the locked row meanwhile.
    let mut other = db.conn().await;
    other.query_drop("START TRANSACTION").await.unwrap();
    let skipped: Vec<i64> = other
        .query("SELECT id FROM items FOR UPDATE SKIP LOCKED")
        .await
        .unwrap();
    assert!(skipped.is_empty());
    other.query_drop("ROLLBACK").await.unwrap();

    assert_eq!(run(&broker, 1, Action::Release).await, Reply::Done);
    other.query_drop("START TRANSACTION").await.unwrap();
    let free: Vec<(i64, i64)> = other
        .query("SELECT id, n FROM items FOR UPDATE SKIP LOCKED")
        .await
        .unwrap();
    assert_eq!(
        free,
        [(1, 0)],
        "the release ended the transaction: the update is gone and the row free"
    );
    other.query_drop("ROLLBACK").await.unwrap();
    other.disconnect().await.unwrap();

    // The next id takes a connection with no transaction: the one released inside one was
    // closed, not given back.
    assert_eq!(run(&broker, 2, Action::Acquire).await, Reply::Done);
    let in_tx = run(
        &broker,
        2,
        exec("SELECT @@in_transaction AS t", rows(&["t"], false), vec![]),
    )
    .await;
    assert_eq!(values(in_tx), vec![vec![Value::Int(0)]]);
    assert_eq!(run(&broker, 2, Action::Release).await, Reply::Done);
    broker.close().await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_cuts_short_a_statement_in_flight() {
    let db = TestDb::new("adapter_close", &[ITEMS]).await;
    db.exec("INSERT INTO items (id, n) VALUES (1, 0)").await;
    let broker = Arc::new(started(MySqlAsyncBroker::from_url(&db.url)).await);
    // The test holds the row, so the broker's update waits for it.
    let mut holder = db.conn().await;
    holder.query_drop("START TRANSACTION").await.unwrap();
    holder
        .query_drop("SELECT * FROM items WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();

    assert_eq!(run(&broker, 1, Action::Acquire).await, Reply::Done);
    let waiting = tokio::spawn({
        let broker = broker.clone();
        async move {
            run(
                &broker,
                1,
                exec(
                    "UPDATE items SET n = 1 WHERE id = ?",
                    Output::Affected,
                    vec![Value::Int(1)],
                ),
            )
            .await
        }
    });
    let mut watch = connect().await;
    let mut running = None;
    let start = Instant::now();
    while running.is_none() && start.elapsed() < WAIT {
        running = watch
            .exec_first(
                "SELECT id FROM information_schema.processlist WHERE db = ? AND info LIKE 'UPDATE items%'",
                (db.name.as_str(),),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let running = running.expect("the update waits for the row on the server");

    let start = Instant::now();
    assert_eq!(run(&broker, 1, Action::Close).await, Reply::Done);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "the close did not wait for the lock wait: {:?}",
        start.elapsed()
    );
    let cut = failed(waiting.await.unwrap());
    assert_eq!(cut.kind, ErrorKind::ConnectionLost, "{cut}");
    let gone = eventually_async(Duration::from_secs(5), || session_gone(running)).await;
    assert!(gone, "the session of the closed connection ended");
    holder.query_drop("ROLLBACK").await.unwrap();
    holder.disconnect().await.unwrap();
    watch.disconnect().await.unwrap();
    assert_eq!(db.count("SELECT n FROM items WHERE id = 1").await, 0);
    broker.close().await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_wait_timeout_is_a_serialization_failure() {
    let db = TestDb::new("adapter_timeout", &[ITEMS]).await;
    db.exec("INSERT INTO items (id, n) VALUES (1, 0)").await;
    let broker = started(MySqlAsyncBroker::from_url(&db.url)).await;
    let mut holder = db.conn().await;
    holder.query_drop("START TRANSACTION").await.unwrap();
    holder
        .query_drop("SELECT * FROM items WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();
    assert_eq!(run(&broker, 1, Action::Acquire).await, Reply::Done);
    assert_eq!(
        run(
            &broker,
            1,
            exec(
                "SET SESSION innodb_lock_wait_timeout = 1",
                Output::Nothing,
                vec![]
            )
        )
        .await,
        Reply::Done
    );
    let timeout = failed(
        run(
            &broker,
            1,
            exec(
                "UPDATE items SET n = 1 WHERE id = ?",
                Output::Affected,
                vec![Value::Int(1)],
            ),
        )
        .await,
    );
    assert_eq!(timeout.kind, ErrorKind::Serialization, "{timeout}");
    assert_eq!(run(&broker, 1, Action::Close).await, Reply::Done);
    holder.query_drop("ROLLBACK").await.unwrap();
    holder.disconnect().await.unwrap();
    broker.close().await;
    db.cleanup().await;
}

/// Whether the server's session `id` has ended.
async fn session_gone(id: i64) -> bool {
    let mut conn = connect().await;
    let left: Option<i64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.processlist WHERE id = ?",
            (id,),
        )
        .await
        .unwrap();
    conn.disconnect().await.unwrap();
    left == Some(0)
}

fn take<'a>(conn: &'a mut mysql_async::Conn, key: &'a str) -> LockFuture<'a> {
    Box::pin(async move {
        let got: Option<Option<i64>> = conn.exec_first("SELECT GET_LOCK(?, 0)", (key,)).await?;
        Ok(got.flatten() == Some(1))
    })
}

fn give<'a>(conn: &'a mut mysql_async::Conn, key: &'a str) -> LockFuture<'a> {
    Box::pin(async move {
        let released: Option<Option<i64>> =
            conn.exec_first("SELECT RELEASE_LOCK(?)", (key,)).await?;
        Ok(released.flatten() == Some(1))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_locks_run_on_the_connection() {
    let db = TestDb::new("adapter_custom", &[]).await;
    let broker = started(MySqlAsyncBroker::from_url(&db.url)).await;
    let custom = CustomLock::new(take, give);
    let key = db.lock_name("custom-1");
    let lock = |conn: u64, take: bool| {
        let sub = ruststream_core::SubId(0);
        let key: Arc<str> = key.as_str().into();
        let action = if take {
            Action::Lock { sub, key }
        } else {
            Action::Unlock { sub, key }
        };
        broker.execute(command(conn, action), Some(custom))
    };
    assert_eq!(run(&broker, 1, Action::Acquire).await, Reply::Done);
    assert_eq!(run(&broker, 2, Action::Acquire).await, Reply::Done);
    assert_eq!(lock(1, true).await, Reply::Bool(true));
    assert_eq!(
        lock(2, true).await,
        Reply::Bool(false),
        "another session holds it"
    );
    assert!(db.holder("custom-1").await.is_some());
    assert_eq!(
        lock(2, false).await,
        Reply::Bool(false),
        "2 does not hold it"
    );
    assert_eq!(lock(1, false).await, Reply::Bool(true));
    assert_eq!(db.holder("custom-1").await, None);
    // Without a custom lock, the command fails.
    let none = failed(
        broker
            .execute(
                command(
                    1,
                    Action::Lock {
                        sub: ruststream_core::SubId(0),
                        key: "x".into(),
                    },
                ),
                None,
            )
            .await,
    );
    assert!(none.message.contains("no custom lock"), "{none}");
    assert_eq!(run(&broker, 1, Action::Release).await, Reply::Done);
    assert_eq!(run(&broker, 2, Action::Close).await, Reply::Done);
    broker.close().await;
    db.cleanup().await;
}

/// A custom lock that waits on something other than the server, forever.
fn hang<'a>(_conn: &'a mut mysql_async::Conn, _key: &'a str) -> LockFuture<'a> {
    Box::pin(std::future::pending())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_drops_a_custom_lock_that_does_not_end() {
    let db = TestDb::new("adapter_hang", &[]).await;
    let broker = Arc::new(started(MySqlAsyncBroker::from_url(&db.url)).await);
    assert_eq!(run(&broker, 1, Action::Acquire).await, Reply::Done);
    let id = values(
        run(
            &broker,
            1,
            exec("SELECT CONNECTION_ID() AS id", rows(&["id"], false), vec![]),
        )
        .await,
    )[0][0]
        .as_int()
        .expect("the session's id");
    let custom = CustomLock::new(hang, hang);
    let locking = broker.execute(
        command(
            1,
            Action::Lock {
                sub: ruststream_core::SubId(0),
                key: "k".into(),
            },
        ),
        Some(custom),
    );
    // A command queued behind the lock fails once the close comes.
    let queued = broker.execute(command(1, exec("SELECT 1", Output::Nothing, vec![])), None);
    let locking = tokio::spawn(locking);
    let queued = tokio::spawn(queued);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    assert_eq!(run(&broker, 1, Action::Close).await, Reply::Done);
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "the close waits a short grace, not for the lock: {:?}",
        start.elapsed()
    );
    let cut = failed(locking.await.unwrap());
    assert_eq!(cut.kind, ErrorKind::ConnectionLost, "{cut}");
    assert!(cut.message.contains("cut short"), "{cut}");
    let queued = failed(queued.await.unwrap());
    assert_eq!(queued.kind, ErrorKind::ConnectionLost, "{queued}");
    let ended = format!("SELECT COUNT(*) FROM information_schema.processlist WHERE id = {id}");
    let gone = || async { db.count(&ended).await == 0 };
    assert!(
        eventually_async(WAIT, gone).await,
        "the closed connection's session {id} ended"
    );
    broker.close().await;
    assert!(eventually_async(WAIT, || db.sessions_are(0)).await);
    db.cleanup().await;
}

/// The server's id of the session behind `conn`.
async fn session_of(broker: &MySqlAsyncBroker, conn: u64) -> i64 {
    values(
        run(
            broker,
            conn,
            exec("SELECT CONNECTION_ID() AS id", rows(&["id"], false), vec![]),
        )
        .await,
    )[0][0]
        .as_int()
        .expect("the session's id")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_dropped_midway_takes_its_connection_out_of_the_pool() {
    let db = TestDb::new("adapter_dropped", &[ITEMS]).await;
    db.exec("INSERT INTO items (id, n) VALUES (1, 0), (2, 0)")
        .await;
    let broker = started(MySqlAsyncBroker::from_url(&db.url)).await;
    let mut holder = db.conn().await;
    holder.query_drop("START TRANSACTION").await.unwrap();
    holder
        .query_drop("SELECT * FROM items WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();

    assert_eq!(run(&broker, 1, Action::Acquire).await, Reply::Done);
    let session = session_of(&broker, 1).await;
    assert_eq!(
        run(&broker, 1, fixed(StatementKind::Begin, "START TRANSACTION")).await,
        Reply::Done
    );
    let update = |id: i64| {
        exec(
            "UPDATE items SET n = 1 WHERE id = ?",
            Output::Affected,
            vec![Value::Int(id)],
        )
    };
    assert_eq!(run(&broker, 1, update(2)).await, Reply::Affected(1));
    // The update of row 1 waits for the holder's lock; its future is dropped meanwhile.
    let mut waiting = broker.execute(command(1, update(1)), None);
    let mut watch = connect().await;
    let start = Instant::now();
    loop {
        tokio::select! {
            reply = &mut waiting => panic!("the update waits for the row: {reply:?}"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        let running: Option<i64> = watch
            .exec_first(
                "SELECT id FROM information_schema.processlist WHERE id = ? AND info LIKE 'UPDATE items%'",
                (session,),
            )
            .await
            .unwrap();
        if running.is_some() {
            break;
        }
        assert!(start.elapsed() < WAIT, "the update never ran on the server");
    }
    drop(waiting);
    watch.disconnect().await.unwrap();

    // The connection does not go back to the pool: its session ends, and with it its
    // transaction and its row locks.
    assert!(
        eventually_async(WAIT, || session_gone(session)).await,
        "the session {session} of the dropped command ended"
    );
    let mut other = db.conn().await;
    other.query_drop("START TRANSACTION").await.unwrap();
    let free: Vec<(i64, i64)> = other
        .query("SELECT id, n FROM items FOR UPDATE SKIP LOCKED")
        .await
        .unwrap();
    assert_eq!(free, [(2, 0)], "row 2 is free and its update rolled back");
    other.query_drop("ROLLBACK").await.unwrap();
    other.disconnect().await.unwrap();
    holder.query_drop("ROLLBACK").await.unwrap();
    holder.disconnect().await.unwrap();

    // The id holds no connection now: its commands fail, its release is a no-op.
    let after = failed(run(&broker, 1, exec("SELECT 1", Output::Nothing, vec![])).await);
    assert_eq!(after.kind, ErrorKind::ConnectionLost, "{after}");
    assert_eq!(run(&broker, 1, Action::Release).await, Reply::Done);
    assert_eq!(broker.connections_held(), 0);
    // The pool lends a fresh connection.
    assert_eq!(run(&broker, 2, Action::Acquire).await, Reply::Done);
    assert_ne!(session_of(&broker, 2).await, session);
    assert_eq!(run(&broker, 2, Action::Release).await, Reply::Done);
    broker.close().await;
    assert!(eventually_async(WAIT, || db.sessions_are(0)).await);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_broker_closes_the_connections_it_holds() {
    let db = TestDb::new("adapter_broker_dropped", &[ITEMS]).await;
    db.exec("INSERT INTO items (id, n) VALUES (1, 0)").await;
    // The service's own pool, which stays open and does not reset the sessions it gets back.
    let pool = mysql_async::Pool::new(
        db.plain_opts()
            .pool_opts(mysql_async::PoolOpts::default().with_reset_connection(false)),
    );
    let broker = started(MySqlAsyncBroker::new(pool.clone())).await;
    assert_eq!(run(&broker, 1, Action::Acquire).await, Reply::Done);
    let session = session_of(&broker, 1).await;
    assert_eq!(
        run(&broker, 1, fixed(StatementKind::Begin, "START TRANSACTION")).await,
        Reply::Done
    );
    let locked = run(
        &broker,
        1,
        exec(
            "SELECT id FROM items WHERE id = ? FOR UPDATE",
            rows(&["id"], false),
            vec![Value::Int(1)],
        ),
    )
    .await;
    assert_eq!(values(locked), vec![vec![Value::Int(1)]]);
    drop(broker);
    assert!(
        eventually_async(WAIT, || session_gone(session)).await,
        "the session {session} of the dropped broker ended"
    );
    let mut other = db.conn().await;
    other.query_drop("START TRANSACTION").await.unwrap();
    let free: Vec<i64> = other
        .query("SELECT id FROM items FOR UPDATE SKIP LOCKED")
        .await
        .unwrap();
    assert_eq!(free, [1], "the row lock went with the session");
    other.query_drop("ROLLBACK").await.unwrap();
    other.disconnect().await.unwrap();
    // The pool lends a connection with no transaction.
    let mut conn = pool.get_conn().await.unwrap();
    let in_tx: Option<i64> = conn.query_first("SELECT @@in_transaction").await.unwrap();
    assert_eq!(in_tx, Some(0));
    drop(conn);
    pool.disconnect().await.unwrap();
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_run_when_another_executor_polls_them() {
    let db = TestDb::new("adapter_executor", &[]).await;
    let broker = Arc::new(started(MySqlAsyncBroker::from_url(&db.url)).await);
    // A thread outside the tokio runtime polls the commands' futures.
    let replies = std::thread::spawn({
        let broker = broker.clone();
        move || {
            futures_lite_block_on(async {
                let acquired = run(&broker, 1, Action::Acquire).await;
                let one = run(
                    &broker,
                    1,
                    exec("SELECT 1 AS one", rows(&["one"], false), vec![]),
                )
                .await;
                let released = run(&broker, 1, Action::Release).await;
                (acquired, one, released)
            })
        }
    })
    .join()
    .unwrap();
    assert_eq!(replies.0, Reply::Done);
    assert_eq!(values(replies.1), vec![vec![Value::Int(1)]]);
    assert_eq!(replies.2, Reply::Done);
    assert_eq!(broker.connections_held(), 0);
    broker.close().await;
    assert!(eventually_async(WAIT, || db.sessions_are(0)).await);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_names_what_does_not_connect() {
    let unreachable = MySqlAsyncBroker::from_url("mysql://app:secret@127.0.0.1:1/queue");
    let error = Adapter::start(&unreachable)
        .await
        .expect_err("nothing listens there");
    let message = error.to_string();
    assert!(
        message.contains("mysql://app:***@127.0.0.1:1/queue"),
        "the message names the URL: {message}"
    );
    assert!(
        !message.contains("secret"),
        "without its password: {message}"
    );
    assert!(!unreachable.is_closed());

    let garbage = MySqlAsyncBroker::from_url("postgres://nope");
    let error = Adapter::start(&garbage).await.expect_err("not a MySQL URL");
    assert!(error.to_string().contains("postgres://nope"), "{error}");

    // Outside a tokio runtime, the start says why.
    let broker = MySqlAsyncBroker::from_url(base_url());
    let error = std::thread::spawn(move || futures_lite_block_on(Adapter::start(&broker)))
        .join()
        .unwrap()
        .expect_err("no tokio runtime");
    assert!(error.to_string().contains("tokio"), "{error}");
}

/// Polls a future to completion on the calling thread, outside any runtime.
fn futures_lite_block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Thread(std::thread::Thread);
    impl Wake for Thread {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Thread(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(output) => return output,
            Poll::Pending => std::thread::park(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pool_closes_a_connection_when_it_comes_back() {
    let db = TestDb::new("adapter_pool_close", &[]).await;
    let broker = started(MySqlAsyncBroker::from_url(&db.url)).await;
    assert_eq!(run(&broker, 1, Action::Acquire).await, Reply::Done);
    assert_eq!(run(&broker, 2, Action::Acquire).await, Reply::Done);
    assert_eq!(run(&broker, 2, Action::Release).await, Reply::Done);
    assert!(
        eventually_async(WAIT, || db.sessions_are(2)).await,
        "one connection lent, one idle"
    );
    // The close completes without waiting for the connection still lent.
    tokio::time::timeout(Duration::from_secs(5), broker.close())
        .await
        .expect("the close does not wait for a lent connection");
    let refused = failed(run(&broker, 3, Action::Acquire).await);
    assert_eq!(refused.kind, ErrorKind::PoolClosed);
    assert!(
        eventually_async(WAIT, || db.sessions_are(1)).await,
        "the idle connection closed"
    );
    // The lent connection still runs its commands, and closes when it comes back.
    assert_eq!(
        run(
            &broker,
            1,
            exec("SELECT 1 AS one", rows(&["one"], false), vec![])
        )
        .await,
        Reply::Rows(vec![ruststream_core::Row::values(vec![Value::Int(1)])])
    );
    assert_eq!(run(&broker, 1, Action::Release).await, Reply::Done);
    assert!(
        eventually_async(WAIT, || db.sessions_are(0)).await,
        "the connection closed when it came back"
    );
    db.cleanup().await;
}

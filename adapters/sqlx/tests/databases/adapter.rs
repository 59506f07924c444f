//! The adapter by hand: the core's commands on named connections, values and errors per
//! database, the order of one connection's commands, release, close and the pool's close.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ruststream::adapter::Adapter;
use ruststream::core::{
    Action, Command, CommandId, ConnId, DbError, Dialect as CoreDialect, ErrorKind, Output, Reply,
    Statement, StatementKind, Value,
};
use ruststream_sqlx::prelude::*;
use ruststream_sqlx::{CustomLock, SqlxDatabase, sqlx};
use sqlx::sqlite::SqlitePoolOptions;

use crate::common::*;

fn command(conn: u64, action: Action) -> Command {
    Command {
        id: CommandId(0),
        conn: ConnId(conn),
        action,
    }
}

fn statement(kind: StatementKind, sql: &str, output: Output) -> Statement {
    Statement {
        kind,
        sql: sql.into(),
        args: Arc::from(Vec::new()),
        output,
    }
}

fn exec(sql: &str, output: Output, binds: Vec<Value>) -> Action {
    Action::Execute {
        statement: statement(StatementKind::ReadRow, sql, output),
        binds,
    }
}

fn rows(columns: &[&'static str]) -> Output {
    Output::Rows {
        // The driver's own reading of each column: the core's id type keeps it.
        columns: columns
            .iter()
            .map(|&name| ruststream_core::OutColumn::new(name, ruststream_core::ColumnType::Id))
            .collect(),
        raw: false,
    }
}

async fn run<DB: SqlxDatabase>(
    broker: &SqlxBroker<DB>,
    conn: u64,
    action: Action,
) -> Reply<DB::Row> {
    broker.execute(command(conn, action), None).await
}

fn failed<R: std::fmt::Debug>(reply: Reply<R>) -> DbError {
    match reply {
        Reply::Failed(error) => error,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn values<R>(reply: Reply<R>) -> Vec<Vec<Value>> {
    match reply {
        Reply::Rows(rows) => rows.into_iter().map(|r| r.values).collect(),
        Reply::Failed(error) => panic!("expected rows, got the failure {error}"),
        _ => panic!("expected rows"),
    }
}

async fn started<DB: SqlxDatabase>(broker: SqlxBroker<DB>, dialect: CoreDialect) -> SqlxBroker<DB> {
    let answered = Adapter::start(&broker).await.expect("the adapter starts");
    assert_eq!(answered, dialect);
    broker
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_values_and_errors() {
    let db = Pg::new("ad_pg_values").await;
    db.exec("CREATE TABLE t (id BIGSERIAL PRIMARY KEY, name TEXT)")
        .await;
    let broker = started(db.broker(), CoreDialect::Postgres).await;
    assert!(matches!(
        run(&broker, 1, Action::Acquire).await,
        Reply::Done
    ));
    let read = values(
        run(
            &broker,
            1,
            exec(
                "SELECT CAST($1 AS BIGINT) AS i, CAST($2 AS TEXT) AS t, CAST($3 AS BYTEA) AS b, \
                 CAST($4 AS BOOLEAN) AS bo, CAST($5 AS TEXT) AS n, CAST(7 AS SMALLINT) AS s, \
                 CAST(8 AS INT) AS i4, CAST('v' AS VARCHAR(4)) AS v, CAST('c' AS CHAR(2)) AS c, \
                 pg_try_advisory_lock(42) AS locked, pg_advisory_unlock(42) AS unlocked",
                rows(&[
                    "i", "t", "b", "bo", "n", "s", "i4", "v", "c", "locked", "unlocked",
                ]),
                vec![
                    Value::Int(-5),
                    Value::Text("text".into()),
                    Value::Bytes(vec![0, 255]),
                    Value::Bool(true),
                    Value::Null,
                ],
            ),
        )
        .await,
    );
    assert_eq!(
        read,
        vec![vec![
            Value::Int(-5),
            Value::Text("text".into()),
            Value::Bytes(vec![0, 255]),
            Value::Bool(true),
            Value::Null,
            Value::Int(7),
            Value::Int(8),
            Value::Text("v".into()),
            Value::Text("c ".into()),
            Value::Bool(true),
            Value::Bool(true),
        ]]
    );
    // A NULL binds into a column of any type.
    assert!(matches!(
        run(
            &broker,
            1,
            exec(
                "INSERT INTO t (name) VALUES ($1)",
                Output::Affected,
                vec![Value::Null]
            )
        )
        .await,
        Reply::Affected(1)
    ));
    let missing_table = failed(
        run(
            &broker,
            1,
            exec("SELECT * FROM nope", Output::Nothing, vec![Value::Int(1)]),
        )
        .await,
    );
    assert_eq!(
        missing_table.kind,
        ErrorKind::UndefinedTable,
        "{missing_table}"
    );
    let missing_column = failed(
        run(
            &broker,
            1,
            exec("SELECT nope FROM t", Output::Nothing, vec![]),
        )
        .await,
    );
    assert_eq!(
        missing_column.kind,
        ErrorKind::UndefinedColumn,
        "{missing_column}"
    );
    let unread = failed(run(&broker, 1, exec("SELECT 1 AS one", rows(&["two"]), vec![])).await);
    assert_eq!(unread.kind, ErrorKind::UndefinedColumn, "{unread}");
    let other = failed(run(&broker, 1, exec("SELECT 1/0", Output::Nothing, vec![])).await);
    assert_eq!(other.kind, ErrorKind::Other, "{other}");
    assert!(matches!(
        run(&broker, 1, Action::Release).await,
        Reply::Done
    ));
    broker.close().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_values_and_errors() {
    let db = My::new("ad_my_values").await;
    db.exec("CREATE TABLE t (id BIGINT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(10), flag BOOLEAN, big BIGINT UNSIGNED)")
        .await;
    db.exec("INSERT INTO t (name, flag, big) VALUES ('x', TRUE, 18446744073709551615)")
        .await;
    let broker = started(db.broker(), CoreDialect::MariaDb).await;
    assert!(matches!(
        run(&broker, 1, Action::Acquire).await,
        Reply::Done
    ));
    let read = values(
        run(
            &broker,
            1,
            exec(
                "SELECT CAST(? AS SIGNED) AS i, ? AS t, ? AS b, ? AS n, \
                 GET_LOCK('rs_ad_my_values', 0) AS locked, RELEASE_LOCK('rs_ad_my_values') AS unlocked, \
                 RELEASE_LOCK('rs_ad_my_values') AS again, name, flag, big, \
                 (SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 't' ORDER BY ordinal_position LIMIT 1) AS column_name, \
                 DATABASE() AS db FROM t",
                rows(&["i", "t", "b", "n", "locked", "unlocked", "again", "name", "flag", "big", "column_name", "db"]),
                vec![
                    Value::Int(-5),
                    Value::Text("text".into()),
                    Value::Bytes(vec![0, 255]),
                    Value::Null,
                ],
            ),
        )
        .await,
    );
    assert_eq!(
        read,
        vec![vec![
            Value::Int(-5),
            Value::Text("text".into()),
            Value::Bytes(vec![0, 255]),
            Value::Null,
            Value::Int(1),
            Value::Int(1),
            Value::Null,
            Value::Text("x".into()),
            Value::Bool(true),
            Value::Text("18446744073709551615".into()),
            Value::Text("id".into()),
            Value::Text(db.database.clone()),
        ]]
    );
    let missing_table = failed(
        run(
            &broker,
            1,
            exec("SELECT * FROM nope", Output::Nothing, vec![Value::Int(1)]),
        )
        .await,
    );
    assert_eq!(
        missing_table.kind,
        ErrorKind::UndefinedTable,
        "{missing_table}"
    );
    let missing_column = failed(
        run(
            &broker,
            1,
            exec("SELECT nope FROM t", Output::Nothing, vec![Value::Int(1)]),
        )
        .await,
    );
    assert_eq!(
        missing_column.kind,
        ErrorKind::UndefinedColumn,
        "{missing_column}"
    );
    assert!(matches!(
        run(&broker, 1, Action::Release).await,
        Reply::Done
    ));
    broker.close().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_values_and_errors() {
    let db = Lite::new("ad_lite_values").await;
    db.exec("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
        .await;
    let broker = started(db.broker(), CoreDialect::Sqlite).await;
    assert!(matches!(
        run(&broker, 1, Action::Acquire).await,
        Reply::Done
    ));
    let read = values(
        run(
            &broker,
            1,
            exec(
                "SELECT ?1 AS i, ?2 AS t, ?3 AS b, ?4 AS bo, ?5 AS n, 1.5 AS r",
                rows(&["i", "t", "b", "bo", "n", "r"]),
                vec![
                    Value::Int(-5),
                    Value::Text("text".into()),
                    Value::Bytes(vec![0, 255]),
                    Value::Bool(true),
                    Value::Null,
                ],
            ),
        )
        .await,
    );
    assert_eq!(
        read,
        vec![vec![
            Value::Int(-5),
            Value::Text("text".into()),
            Value::Bytes(vec![0, 255]),
            Value::Int(1),
            Value::Null,
            Value::Text("1.5".into()),
        ]]
    );
    let missing_table = failed(
        run(
            &broker,
            1,
            exec("SELECT * FROM nope", Output::Nothing, vec![Value::Int(1)]),
        )
        .await,
    );
    assert_eq!(
        missing_table.kind,
        ErrorKind::UndefinedTable,
        "{missing_table}"
    );
    let missing_column = failed(
        run(
            &broker,
            1,
            exec("SELECT nope FROM t", Output::Nothing, vec![Value::Int(1)]),
        )
        .await,
    );
    assert_eq!(
        missing_column.kind,
        ErrorKind::UndefinedColumn,
        "{missing_column}"
    );
    assert!(matches!(
        run(&broker, 1, Action::Release).await,
        Reply::Done
    ));
    broker.close().await;
    db.drop().await;
}

/// The commands of one connection run in the order they were given, however their futures are
/// polled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connections_commands_run_in_order() {
    let db = Lite::new("ad_order").await;
    db.exec("CREATE TABLE t (seq INTEGER PRIMARY KEY AUTOINCREMENT, n INTEGER)")
        .await;
    let broker = Arc::new(started(db.broker(), CoreDialect::Sqlite).await);
    let acquire = broker.execute(command(1, Action::Acquire), None);
    let inserts: Vec<_> = (0..8)
        .map(|n| {
            broker.execute(
                command(
                    1,
                    exec(
                        "INSERT INTO t (n) VALUES (?1)",
                        Output::Affected,
                        vec![Value::Int(n)],
                    ),
                ),
                None,
            )
        })
        .collect();
    let release = broker.execute(command(1, Action::Release), None);
    // Polled last first.
    let release = tokio::spawn(release);
    let mut tasks = Vec::new();
    for insert in inserts.into_iter().rev() {
        tasks.push(tokio::spawn(insert));
    }
    assert!(matches!(acquire.await, Reply::Done));
    for task in tasks {
        assert!(matches!(task.await.unwrap(), Reply::Affected(1)));
    }
    assert!(matches!(release.await.unwrap(), Reply::Done));
    for n in 0..8 {
        assert_eq!(
            db.scalar(&format!("SELECT n FROM t WHERE seq = {}", n + 1))
                .await,
            n,
            "insert {n} ran in its place"
        );
    }
    broker.close().await;
    db.drop().await;
}

/// A connection released inside a transaction (the core rolls back first; a driver of its own
/// may not) closes, its transaction ends with it, and the pool lends a clean one next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_inside_a_transaction_ends_it() {
    let db = Pg::new("ad_release").await;
    db.exec("CREATE TABLE t (n INT)").await;
    let broker = started(
        db.broker_with(sqlx::postgres::PgPoolOptions::new().max_connections(1)),
        CoreDialect::Postgres,
    )
    .await;
    let begin = Action::Execute {
        statement: statement(StatementKind::Begin, "BEGIN", Output::Nothing),
        binds: vec![],
    };
    assert!(matches!(
        run(&broker, 1, Action::Acquire).await,
        Reply::Done
    ));
    assert!(matches!(run(&broker, 1, begin).await, Reply::Done));
    assert!(matches!(
        run(
            &broker,
            1,
            exec("INSERT INTO t VALUES (1)", Output::Affected, vec![])
        )
        .await,
        Reply::Affected(1)
    ));
    assert!(matches!(
        run(&broker, 1, Action::Release).await,
        Reply::Done
    ));
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM t").await,
        0,
        "the transaction ended with the release"
    );
    // The pool's next connection is outside a transaction.
    assert!(matches!(
        run(&broker, 2, Action::Acquire).await,
        Reply::Done
    ));
    assert_eq!(
        values(
            run(
                &broker,
                2,
                exec(
                    "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM t",
                    rows(&["n"]),
                    vec![]
                )
            )
            .await
        ),
        vec![vec![Value::Int(0)]]
    );
    assert!(matches!(
        run(
            &broker,
            2,
            exec("INSERT INTO t VALUES (2)", Output::Affected, vec![])
        )
        .await,
        Reply::Affected(1)
    ));
    assert!(matches!(
        run(&broker, 2, Action::Release).await,
        Reply::Done
    ));
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM t").await,
        1,
        "autocommit again"
    );
    broker.close().await;
    db.drop().await;
}

/// A close cuts short the statement running on its connection; the commands queued behind it
/// fail, and the session ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_cuts_a_running_statement_short() {
    let db = Pg::new("ad_close").await;
    let broker = Arc::new(started(db.broker(), CoreDialect::Postgres).await);
    assert!(matches!(
        run(&broker, 1, Action::Acquire).await,
        Reply::Done
    ));
    let sleeping = tokio::spawn(broker.execute(
        command(1, exec("SELECT pg_sleep(3)", Output::Nothing, vec![])),
        None,
    ));
    let queued =
        tokio::spawn(broker.execute(command(1, exec("SELECT 1", Output::Nothing, vec![])), None));
    eventually("the statement runs", || async {
        db.sessions("AND state = 'active'").await == 1
    })
    .await;
    let pid = db
        .scalar(&format!(
            "SELECT CAST(pid AS BIGINT) FROM pg_stat_activity WHERE application_name = '{}' AND state = 'active'",
            db.schema
        ))
        .await;
    let started_at = Instant::now();
    assert!(matches!(
        broker.execute(command(1, Action::Close), None).await,
        Reply::Done
    ));
    let cut = failed(sleeping.await.unwrap());
    assert_eq!(cut.kind, ErrorKind::ConnectionLost, "{cut}");
    assert!(
        started_at.elapsed() < Duration::from_secs(2),
        "cut short, not waited for"
    );
    assert_eq!(
        failed(queued.await.unwrap()).kind,
        ErrorKind::ConnectionLost
    );
    assert_eq!(
        failed(run(&broker, 1, exec("SELECT 1", Output::Nothing, vec![])).await).kind,
        ErrorKind::ConnectionLost,
        "the id holds no connection after its close"
    );
    eventually("the session ends", || async {
        db.sessions(&format!("AND pid = {pid}")).await == 0
    })
    .await;
    broker.close().await;
    db.drop().await;
}

/// Closing a pool the broker built does not wait for a connection still lent: that one closes
/// when it comes back, and no acquire succeeds after the close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_does_not_wait_for_a_lent_connection() {
    let db = Pg::new("ad_lent").await;
    let broker = started(db.broker(), CoreDialect::Postgres).await;
    assert!(matches!(
        run(&broker, 1, Action::Acquire).await,
        Reply::Done
    ));
    assert!(matches!(
        run(&broker, 2, Action::Acquire).await,
        Reply::Done
    ));
    assert!(matches!(
        run(&broker, 2, Action::Release).await,
        Reply::Done
    ));
    tokio::time::timeout(Duration::from_secs(5), broker.close())
        .await
        .expect("the close does not wait for the lent connection");
    let pool = broker.pool().expect("started");
    assert!(pool.is_closed());
    assert_eq!(
        failed(run(&broker, 3, Action::Acquire).await).kind,
        ErrorKind::PoolClosed
    );
    eventually("the idle connection closed", || async {
        db.sessions("").await == 1
    })
    .await;
    assert!(
        matches!(
            run(&broker, 1, exec("SELECT 1", Output::Nothing, vec![])).await,
            Reply::Done
        ),
        "the lent connection still runs its commands"
    );
    assert!(matches!(
        run(&broker, 1, Action::Release).await,
        Reply::Done
    ));
    eventually("the lent connection closed when it came back", || async {
        db.sessions("").await == 0
    })
    .await;
    db.drop().await;
}

fn boom<'a>(
    _: &'a mut SqliteConnection,
    _: &'a str,
) -> futures::future::BoxFuture<'a, Result<bool, sqlx::Error>> {
    Box::pin(async { panic!("a lock that panics") })
}

struct HeldKeys;

impl ruststream_sqlx::Lock<Sqlite> for HeldKeys {
    async fn lock(conn: &mut SqliteConnection, key: &str) -> Result<bool, sqlx::Error> {
        let taken = sqlx::query("INSERT OR IGNORE INTO held_keys (key) VALUES (?)")
            .bind(key)
            .execute(conn)
            .await?;
        Ok(taken.rows_affected() == 1)
    }
}

impl ruststream_sqlx::Unlock<Sqlite> for HeldKeys {
    async fn unlock(conn: &mut SqliteConnection, key: &str) -> Result<bool, sqlx::Error> {
        let released = sqlx::query("DELETE FROM held_keys WHERE key = ?")
            .bind(key)
            .execute(conn)
            .await?;
        Ok(released.rows_affected() == 1)
    }
}

/// The custom lock and unlock run on the command's connection and answer as the service's
/// code does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_lock_runs_on_the_commands_connection() {
    let db = Lite::new("ad_custom").await;
    db.exec("CREATE TABLE held_keys (key TEXT PRIMARY KEY)")
        .await;
    let broker = started(
        db.broker_with(SqlitePoolOptions::new().max_connections(2)),
        CoreDialect::Sqlite,
    )
    .await;
    let lock = Some(ruststream_sqlx::custom_lock::<Sqlite, HeldKeys>());
    let key: Arc<str> = "k".into();
    let sub = ruststream::core::SubId(0);
    let take = |conn| {
        command(
            conn,
            Action::Lock {
                sub,
                key: key.clone(),
            },
        )
    };
    let give = |conn| {
        command(
            conn,
            Action::Unlock {
                sub,
                key: key.clone(),
            },
        )
    };
    assert!(matches!(
        run(&broker, 1, Action::Acquire).await,
        Reply::Done
    ));
    assert!(matches!(
        run(&broker, 2, Action::Acquire).await,
        Reply::Done
    ));
    assert!(matches!(
        broker.execute(take(1), lock).await,
        Reply::Bool(true)
    ));
    assert!(matches!(
        broker.execute(take(2), lock).await,
        Reply::Bool(false)
    ));
    assert!(matches!(
        broker.execute(give(1), lock).await,
        Reply::Bool(true)
    ));
    assert!(matches!(
        broker.execute(give(1), lock).await,
        Reply::Bool(false)
    ));
    let none = failed(broker.execute(take(1), None).await);
    assert_eq!(none.kind, ErrorKind::Other);
    db.exec("DROP TABLE held_keys").await;
    let broken = failed(broker.execute(take(1), lock).await);
    assert!(
        broken.message.contains("the custom lock of key `k` failed"),
        "{broken}"
    );
    let panics = Some(CustomLock::<Sqlite>::new(boom, boom));
    let panicked = failed(broker.execute(take(2), panics).await);
    assert!(panicked.message.contains("panicked"), "{panicked}");
    for conn in [1, 2] {
        assert!(matches!(
            run(&broker, conn, Action::Release).await,
            Reply::Done
        ));
    }
    broker.close().await;
    db.drop().await;
}

//! The statements the core renders for PostgreSQL, run on a real server through tokio-postgres,
//! with binds built from each statement's `args`: the SQL runs, and it does what the forms need.
//!
//! The server is `RUSTSTREAM_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`); a
//! test that cannot reach it fails with a message naming the URL.

use std::time::{SystemTime, UNIX_EPOCH};

use ruststream_conformance::session::binds;
use ruststream_core::dialect::UNTIL;
use ruststream_core::keys::{POSTGRES_KEY_HASH_SQL, postgres_key_hash};
use ruststream_core::spec::{Column, InboxSpec, KeyPart};
use ruststream_core::{Arg, Dialect, Statement, StatementKind, Statements, TableDesc, Value};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row};

#[path = "conformance/session.rs"]
#[allow(dead_code, reason = "the suite's session; these tests use its binds")]
mod session;

use session::param;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn url() -> String {
    std::env::var("RUSTSTREAM_PG_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A new session on the test server.
async fn connect() -> Client {
    let url = url();
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!("cannot reach PostgreSQL at {url} (set RUSTSTREAM_PG_URL): {e}")
        });
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A name unique to this test and process, kept for the life of the test.
fn unique(test: &str) -> &'static str {
    Box::leak(format!("rs_{test}_{}", std::process::id()).into_boxed_str())
}

fn micros_of(t: SystemTime) -> i64 {
    i64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_micros()).unwrap()
}

/// The server's clock, the one every statement of the queue reads: `statement_timestamp()` of
/// a statement of the test's own, in microseconds since the Unix epoch.
async fn server_now(client: &Client) -> i64 {
    let row = client
        .query_one("SELECT statement_timestamp() AS t", &[])
        .await
        .expect("the server's clock");
    micros_of(row.get("t"))
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

/// The lease expiry a claim read back for a row, in microseconds since the epoch.
fn until_of(row: &Row) -> i64 {
    row.get::<_, i64>(UNTIL)
}

/// Prepares `statement` and builds its binds at the types the server inferred.
async fn prepare(
    client: &Client,
    statement: &Statement,
    binds: &[Value],
) -> (tokio_postgres::Statement, Vec<Box<dyn ToSql + Sync + Send>>) {
    assert_eq!(binds.len(), statement.args.len(), "{}", statement.sql);
    let prepared = client.prepare(&statement.sql).await.unwrap_or_else(|e| {
        panic!(
            "{:?} does not prepare: {e:?}\n{}",
            statement.kind, statement.sql
        )
    });
    assert_eq!(prepared.params().len(), binds.len(), "{}", statement.sql);
    let params = binds
        .iter()
        .zip(prepared.params())
        .map(|(value, ty)| param(value, ty))
        .collect();
    (prepared, params)
}

/// Runs `statement` with `binds` (one per arg) and returns its rows.
async fn query(client: &Client, statement: &Statement, binds: &[Value]) -> Vec<Row> {
    let (prepared, params) = prepare(client, statement, binds).await;
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| &**p as _).collect();
    client
        .query(&prepared, &refs)
        .await
        .unwrap_or_else(|e| panic!("{:?} failed: {e:?}\n{}", statement.kind, statement.sql))
}

/// Runs `statement` with `binds` and returns the rows it affected.
async fn execute(client: &Client, statement: &Statement, binds: &[Value]) -> u64 {
    let (prepared, params) = prepare(client, statement, binds).await;
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| &**p as _).collect();
    client
        .execute(&prepared, &refs)
        .await
        .unwrap_or_else(|e| panic!("{:?} failed: {e:?}\n{}", statement.kind, statement.sql))
}

fn get(statement: Option<&Statement>) -> &Statement {
    statement.expect("the statement is rendered")
}

fn ids(rows: &[Row]) -> Vec<i64> {
    rows.iter().map(|r| r.get::<_, i64>("id")).collect()
}

const FULL_TABLE: &str = "id BIGSERIAL PRIMARY KEY, payload BYTEA, attempt INT NOT NULL DEFAULT 0, \
     locked_until TIMESTAMPTZ NULL, processed_at TIMESTAMPTZ NULL, \
     due_at TIMESTAMPTZ NOT NULL DEFAULT now(), channel TEXT, priority INT NOT NULL DEFAULT 0";

async fn create(client: &Client, table: &str) {
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} ({FULL_TABLE})"
        ))
        .await
        .expect("create the table");
}

async fn drop_table(client: &Client, quoted: &str) {
    client
        .batch_execute(&format!("DROP TABLE IF EXISTS {quoted}"))
        .await
        .expect("drop the table");
}

/// Publishes a row due at `due` (microseconds since the epoch), or, for `None`, at the
/// server's time of the publish.
async fn publish(client: &Client, s: &Statements, payload: &[u8], due: Option<i64>, channel: &str) {
    let publish = &s.publish;
    let values = [
        (Arg::Payload, Value::Bytes(payload.to_vec())),
        (Arg::Due, due.map_or(Value::Null, Value::Int)),
        (Arg::Column("channel"), Value::Text(channel.to_owned())),
    ];
    assert_eq!(execute(client, publish, &binds(publish, &values)).await, 1);
}

async fn columns_of(client: &Client, s: &Statements, schema: &str, table: &str) -> Vec<String> {
    let list = &s.list_columns;
    let values = [
        (Arg::Schema, Value::Text(schema.to_owned())),
        (Arg::TableName, Value::Text(table.to_owned())),
    ];
    let mut names: Vec<String> = query(client, list, &binds(list, &values))
        .await
        .iter()
        .map(|r| r.get::<_, String>("column_name"))
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn key_hash_matches_the_server() {
    let client = connect().await;
    let expr = POSTGRES_KEY_HASH_SQL.replace("{key}", "$1::text");
    let long = "k".repeat(10_000);
    for key in ["video_jobs-7", "", "clé-☃", "a'b\\c", long.as_str()] {
        let row = client
            .query_one(&format!("SELECT {expr} AS h"), &[&key])
            .await
            .unwrap_or_else(|e| panic!("the documented hash SQL runs: {e:?}"));
        assert_eq!(
            row.get::<_, i64>("h"),
            postgres_key_hash(key),
            "key {key:?}"
        );
    }

    // Another system locks a key through the SQL expression; the rendered try_lock, with the
    // Rust hash, sees it held.
    const KEY: &[KeyPart] = &[KeyPart::Column("channel")];
    let desc = *InboxSpec::new("unused", Column::new("id"))
        .advisory(KEY)
        .desc();
    let s = Statements::render(Dialect::Postgres, &desc, 1);
    let other = connect().await;
    let key = format!("clé-☃-{}", std::process::id());
    let taken: bool = other
        .query_one(&format!("SELECT pg_try_advisory_lock({expr})"), &[&key])
        .await
        .unwrap()
        .get(0);
    assert!(taken);
    let try_lock = get(s.of_kind(StatementKind::TryLock));
    let hash = vec![Value::Int(postgres_key_hash(&key))];
    let rows = query(&client, try_lock, &hash).await;
    assert!(
        !rows[0].get::<_, bool>("locked"),
        "the key is held by the other system"
    );
    let released: bool = other
        .query_one(&format!("SELECT pg_advisory_unlock({expr})"), &[&key])
        .await
        .unwrap()
        .get(0);
    assert!(released);
    let rows = query(&client, try_lock, &hash).await;
    assert!(rows[0].get::<_, bool>("locked"));
    let rows = query(&client, get(s.of_kind(StatementKind::Unlock)), &hash).await;
    assert!(rows[0].get::<_, bool>("unlocked"));
}

#[tokio::test]
async fn schema_and_quoted_names() {
    let schema = unique("pg_schema");
    let client = connect().await;
    let table: &'static str = Box::leak(format!("{schema}.jobs").into_boxed_str());
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; \
             CREATE TABLE {table} (id BIGINT PRIMARY KEY, payload BYTEA)"
        ))
        .await
        .unwrap();
    let desc = *InboxSpec::new(table, Column::new("id"))
        .payload(Column::new("payload"))
        .desc();
    let s = Statements::render(Dialect::Postgres, &desc, 1);
    assert_eq!(
        columns_of(&client, &s, schema, "jobs").await,
        ["id", "payload"]
    );
    let publish = &s.publish;
    let values = [
        (Arg::Id, Value::Int(42)),
        (Arg::Payload, Value::Bytes(b"p".to_vec())),
    ];
    assert_eq!(execute(&client, publish, &binds(publish, &values)).await, 1);
    execute(&client, &s.begin, &[]).await;
    let locked = query(&client, get(s.of_kind(StatementKind::LockRow)), &[]).await;
    assert_eq!(ids(&locked), vec![42]);
    execute(&client, &s.rollback, &[]).await;
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();

    // A table and columns whose names hold both quote characters.
    let odd: &'static str =
        Box::leak(format!("odd\"na`me_{}", std::process::id()).into_boxed_str());
    let quoted = Dialect::Postgres.quote(odd);
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {quoted}; CREATE TABLE {quoted} (\"i\"\"d\" BIGSERIAL PRIMARY KEY, \
             \"pay`load\" BYTEA, \"att\"\"empt\" INT NOT NULL DEFAULT 0, \"lock`ed\" TIMESTAMPTZ, \
             \"du.e\" TIMESTAMPTZ NOT NULL DEFAULT now())"
        ))
        .await
        .unwrap();
    let desc = *InboxSpec::new(odd, Column::new("i\"d").generated())
        .payload(Column::new("pay`load"))
        .attempt(Column::new("att\"empt").generated())
        .lease(Column::new("lock`ed"))
        .due(Column::new("du.e").generated())
        .desc();
    let s = Statements::render(Dialect::Postgres, &desc, 1);
    let names = columns_of(&client, &s, "", odd).await;
    assert_eq!(names.len(), 5, "{names:?}");
    assert!(
        names.contains(&"du.e".to_owned()),
        "a dotted column is one name"
    );
    let publish = &s.publish;
    execute(
        &client,
        publish,
        &binds(publish, &[(Arg::Payload, Value::Bytes(b"q".to_vec()))]),
    )
    .await;
    let claim = get(s.of_kind(StatementKind::ClaimLease));
    let before = server_now(&client).await;
    let rows = query(
        &client,
        claim,
        &binds(
            claim,
            &[(Arg::LeaseFor, Value::Int(1)), (Arg::Limit, Value::Int(1))],
        ),
    )
    .await;
    let after = server_now(&client).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, i32>("att\"empt"), 1);
    let until = until_of(&rows[0]);
    assert_eq!(micros_of(rows[0].get("lock`ed")), until);
    assert_server_time(until, before, after, 1, "the lease of a quoted column");
    drop_table(&client, &quoted).await;
}

#[tokio::test]
async fn times_round_trip_to_the_microsecond() {
    // The fence compares a stored lease with a bound one, read back from a claim: both
    // conversions must be exact, whatever the session's time zone.
    let client = connect().await;
    let desc = *InboxSpec::new("unused", Column::new("id"))
        .lease(Column::new("locked_until"))
        .desc();
    let s = Statements::render(Dialect::Postgres, &desc, 1);
    let to_micros = |e: &str| format!("CAST(EXTRACT(EPOCH FROM {e}) * 1000000 AS BIGINT)");
    let base = server_now(&client).await;
    for zone in ["UTC", "Asia/Kathmandu", "America/St_Johns"] {
        client
            .batch_execute(&format!("SET TIME ZONE '{zone}'"))
            .await
            .unwrap();
        for offset in [
            0_i64,
            1,
            999_999,
            123_456_789,
            -1,
            86_400_000_000 * 365 * 50 + 7,
        ] {
            let t = base + offset;
            let row = client
                .query_one(
                    &format!(
                        "SELECT x AS t, {} AS m FROM (SELECT (TIMESTAMPTZ 'epoch' + \
                         CAST($1 AS BIGINT) * INTERVAL '1 microsecond') AS x) AS v",
                        to_micros("x")
                    ),
                    &[&t],
                )
                .await
                .unwrap();
            assert_eq!(micros_of(row.get("t")), t, "{zone}");
            assert_eq!(row.get::<_, i64>("m"), t, "{zone}: read back");
        }
    }
    let extend = get(s.of_kind(StatementKind::ExtendLease));
    let fence = extend
        .args
        .iter()
        .position(|a| *a == Arg::Fence)
        .expect("the extension is fenced")
        + 1;
    assert!(
        extend.sql.contains(&format!(
            "(TIMESTAMPTZ 'epoch' + CAST(${fence} AS BIGINT) * INTERVAL '1 microsecond')"
        )),
        "the statements use the conversion checked here: {}",
        extend.sql
    );
    let claim = get(s.of_kind(StatementKind::ClaimLease));
    assert!(
        claim.sql.contains(&format!(
            "{} AS {UNTIL}",
            to_micros("\"unused\".\"locked_until\"")
        )),
        "the claim reads the expiry back as checked here: {}",
        claim.sql
    );
}

/// One count takes a row for each of several claims, and a count from an id passes over the
/// rows below it, on PostgreSQL itself.
#[tokio::test]
async fn row_lock_counts_several_rows_at_once_and_from_an_id() {
    use ruststream_core::dialect::FormStatements;
    let table = unique("pg_row_lock_batch");
    let a = connect().await;
    create(&a, table).await;
    let desc: TableDesc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .processed_at(Column::new("processed_at"))
        .desc();
    let s = Statements::render(Dialect::Postgres, &desc, 4);
    for payload in [b"a", b"b", b"c", b"d", b"e"] {
        publish(&a, &s, payload, None, "x").await;
    }
    let FormStatements::RowLock(f) = &s.form else {
        panic!("the row lock form");
    };
    let count_row = get(s.of_kind(StatementKind::CountRow));
    let rows = query(
        &a,
        count_row,
        &binds(
            count_row,
            &[(Arg::Limit, Value::Int(3)), (Arg::Take, Value::Int(3))],
        ),
    )
    .await;
    let mut counted = ids(&rows);
    counted.sort_unstable();
    assert_eq!(counted.len(), 3, "one count, three rows");
    assert!(
        rows.iter()
            .all(|r| r.get::<_, Option<i32>>("attempt") == Some(1)),
        "each counted once"
    );
    let from = f.count_row_from.as_ref().expect("claimed in id order");
    let floor = counted[2] + 1;
    let rest = query(
        &a,
        from,
        &binds(
            from,
            &[
                (Arg::Limit, Value::Int(5)),
                (Arg::Take, Value::Int(5)),
                (Arg::Floor, Value::Int(floor)),
            ],
        ),
    )
    .await;
    let rest = ids(&rest);
    assert_eq!(rest.len(), 2, "the two rows from the floor on: {rest:?}");
    assert!(rest.iter().all(|id| *id >= floor), "{rest:?} below {floor}");
    // The count's session holds a mark for each row it counted until the rows' locks.
    let marks = a
        .query_one(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_locks")
        .get::<_, i64>(0);
    assert_eq!(marks, 5, "a mark for each counted row");
    drop_table(&a, table).await;
}

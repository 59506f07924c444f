//! The statements the core renders for PostgreSQL, run on a real server through tokio-postgres,
//! with binds built from each statement's `args`: the SQL runs, and it does what the forms need.
//!
//! The server is `RUSTSTREAM_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`); a
//! test that cannot reach it fails with a message naming the URL.

use std::time::{SystemTime, UNIX_EPOCH};

use ruststream_core::dialect::UNTIL;
use ruststream_core::keys::{POSTGRES_KEY_HASH_SQL, postgres_key_hash};
use ruststream_core::spec::{Column, InboxSpec, KeyPart, OrderBy};
use ruststream_core::{Arg, Dialect, Statement, StatementKind, Statements, TableDesc, Value};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, Row};

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

/// A time column of the row `id`, read from the table, in microseconds since the epoch.
async fn stored(client: &Client, table: &str, column: &str, id: i64) -> Option<i64> {
    client
        .query_one(
            &format!("SELECT {column} FROM {table} WHERE id = $1"),
            &[&id],
        )
        .await
        .unwrap_or_else(|e| panic!("read {column} of row {id}: {e:?}"))
        .get::<_, Option<SystemTime>>(0)
        .map(micros_of)
}

/// A bind for a parameter of type `ty`: PostgreSQL infers a placeholder's type from where it
/// stands (`"attempt" = $2` takes the column's type), so an integer is bound at the width the
/// server asks for, as an adapter must.
fn param(value: &Value, ty: &Type) -> Box<dyn ToSql + Sync + Send> {
    match value {
        Value::Int(i) if *ty == Type::INT2 => {
            Box::new(i16::try_from(*i).expect("the value fits a SMALLINT"))
        }
        Value::Int(i) if *ty == Type::INT4 => {
            Box::new(i32::try_from(*i).expect("the value fits an INT"))
        }
        Value::Int(i) => Box::new(*i),
        Value::Text(t) => Box::new(t.clone()),
        Value::Bytes(b) => Box::new(b.clone()),
        Value::Bool(b) => Box::new(*b),
        Value::Null => Box::new(None::<i64>),
    }
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

/// The one `bigint` a query of the test's own answers.
async fn query_scalar(client: &Client, sql: &str) -> i64 {
    client
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql} failed: {e:?}"))
        .get::<_, i64>(0)
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
async fn row_lock_form() {
    let table = unique("pg_row_lock");
    let a = connect().await;
    let b = connect().await;
    create(&a, table).await;
    const ORDER: &[OrderBy] = &[OrderBy::desc("priority")];
    let desc: TableDesc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .desc();
    let s = Statements::render(Dialect::Postgres, &desc, 2);

    let mut expected: Vec<String> = [
        "attempt",
        "channel",
        "due_at",
        "id",
        "locked_until",
        "payload",
        "priority",
        "processed_at",
    ]
    .map(String::from)
    .to_vec();
    expected.sort();
    assert_eq!(columns_of(&a, &s, "", table).await, expected);
    let isolation = query(&a, get(s.of_kind(StatementKind::Isolation)), &[]).await;
    assert_eq!(isolation[0].get::<_, String>("isolation"), "read committed");

    for payload in [b"a", b"b", b"c"] {
        publish(&a, &s, payload, None, "x").await;
    }
    let all: Vec<i64> = a
        .query(&format!("SELECT id FROM {table} ORDER BY id"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();

    // A locks the first row; B, in its own open transaction, passes over it. (A table whose
    // description names no attempt column locks in one statement; with one, the claim
    // counts first, as the next test shows.)
    let plain = Statements::render(
        Dialect::Postgres,
        InboxSpec::new(table, Column::new("id").generated())
            .payload(Column::new("payload"))
            .desc(),
        2,
    );
    let lock_row = get(plain.of_kind(StatementKind::LockRow));
    assert_eq!(execute(&a, &s.begin, &[]).await, 0);
    let locked = query(&a, lock_row, &binds(lock_row, &[])).await;
    assert_eq!(ids(&locked), vec![all[0]]);
    assert_eq!(locked[0].get::<_, Vec<u8>>("payload"), b"a");
    execute(&b, &s.begin, &[]).await;
    let skipped = query(&b, lock_row, &binds(lock_row, &[])).await;
    assert_eq!(ids(&skipped), vec![all[1]], "B skips A's row");
    execute(&b, &s.rollback, &[]).await;

    // A settles: the delete commits with the transaction.
    let settle = s.settle();
    assert_eq!(
        execute(&a, settle, &binds(settle, &[(Arg::Id, Value::Int(all[0]))])).await,
        1
    );
    execute(&a, &s.commit, &[]).await;
    let read = &s.read_row;
    assert!(
        query(&b, read, &binds(read, &[(Arg::Id, Value::Int(all[0]))]))
            .await
            .is_empty(),
        "the settled row is deleted"
    );
    let second = query(&b, read, &binds(read, &[(Arg::Id, Value::Int(all[1]))])).await;
    assert_eq!(
        second[0].get::<_, i32>("attempt"),
        0,
        "B's rollback counted nothing"
    );

    // A custom order: the highest priority first.
    a.execute(
        &format!("UPDATE {table} SET priority = 5 WHERE id = $1"),
        &[&all[2]],
    )
    .await
    .unwrap();
    let ordered = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .order(ORDER)
        .desc();
    let o = Statements::render(Dialect::Postgres, &ordered, 1);
    execute(&a, &o.begin, &[]).await;
    let first = query(&a, get(o.of_kind(StatementKind::LockRow)), &[]).await;
    assert_eq!(ids(&first), vec![all[2]]);
    execute(&a, &o.rollback, &[]).await;

    drop_table(&a, table).await;
}

#[tokio::test]
async fn row_lock_form_counts_the_attempt_before_it_locks() {
    let table = unique("pg_row_lock_count");
    let a = connect().await;
    let b = connect().await;
    let c = connect().await;
    create(&a, table).await;
    let desc: TableDesc = *InboxSpec::new(table, Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .processed_at(Column::new("processed_at"))
        .desc();
    let s = Statements::render(Dialect::Postgres, &desc, 2);
    for payload in [b"a", b"b", b"c"] {
        publish(&a, &s, payload, None, "x").await;
    }
    let count_row = get(s.of_kind(StatementKind::CountRow));
    let lock_by_id = get(s.of_kind(StatementKind::LockRowById));
    let unmark_row = get(s.of_kind(StatementKind::UnmarkRows(1)));
    // The count commits on its own and reads back a row for each row it looked at: its id,
    // the attempt it wrote (none where it did not count it) and its mark, which the count's
    // session holds until the row's lock.
    let count = |client, look: i64, take: i64| async move {
        let values = [
            (Arg::Limit, Value::Int(look)),
            (Arg::Take, Value::Int(take)),
        ];
        let rows = query(client, count_row, &binds(count_row, &values)).await;
        rows.iter()
            .map(|r| {
                (
                    r.get::<_, i64>("id"),
                    r.get::<_, Option<i32>>("attempt").map(i64::from),
                    i64::from(r.get::<_, i32>("rs_mark")),
                )
            })
            .collect::<Vec<_>>()
    };
    // The lock takes the row only while it still holds that count.
    let lock = |client, id: i64, attempt: i64| async move {
        let values = [
            (Arg::Id, Value::Int(id)),
            (Arg::Attempt, Value::Int(attempt)),
        ];
        query(client, lock_by_id, &binds(lock_by_id, &values)).await
    };
    let unmark = |client, mark: i64| async move {
        execute(
            client,
            unmark_row,
            &binds(unmark_row, &[(Arg::MarkAt(0), Value::Int(mark))]),
        )
        .await
    };
    let marks = |client| async move {
        query_scalar(
            client,
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
        )
        .await
    };
    let attempt_of = |client, id: i64| {
        let sql = format!("SELECT attempt::bigint FROM {table} WHERE id = {id}");
        async move { query_scalar(client, &sql).await }
    };

    // A counts the first row's attempt, and holds its mark.
    let first = count(&a, 1, 1).await;
    assert_eq!(first.len(), 1, "the count reads back one row");
    let (first_id, first_attempt, first_mark) = first[0];
    assert_eq!(first_attempt, Some(1), "the first take counts attempt 1");
    assert_eq!(marks(&a).await, 1, "A's session holds the row's mark");

    // Before A locks it, B's count looks at the first two rows: it passes over A's row (no
    // second count) and counts the next.
    let seen = count(&b, 2, 1).await;
    assert_eq!(seen.len(), 2, "B looked at two rows: {seen:?}");
    assert!(
        seen.contains(&(first_id, None, first_mark)),
        "B does not count the row A counted: {seen:?}"
    );
    let &(second_id, second_attempt, second_mark) = seen
        .iter()
        .find(|r| r.0 != first_id)
        .expect("B counted another row");
    assert_eq!(second_attempt, Some(1));
    assert_eq!(attempt_of(&c, first_id).await, 1, "A's row counted once");

    // A locks its row at its count (not at another), then releases the mark.
    execute(&a, &s.begin, &[]).await;
    assert!(
        lock(&a, first_id, 0).await.is_empty(),
        "a lock at another count takes nothing"
    );
    let locked = lock(&a, first_id, 1).await;
    assert_eq!(ids(&locked), vec![first_id]);
    assert_eq!(locked[0].get::<_, i32>("attempt"), 1);
    unmark(&a, first_mark).await;
    assert_eq!(marks(&a).await, 0, "A released the mark");

    // A third count passes over A's locked row and B's marked one, and counts the last.
    let third = count(&c, 3, 1).await;
    assert!(
        third.iter().all(|r| r.0 != first_id),
        "a locked row is skipped: {third:?}"
    );
    assert!(
        third.contains(&(second_id, None, second_mark)),
        "B's marked row is not counted again: {third:?}"
    );
    assert_eq!(
        third.iter().filter(|r| r.1 == Some(1)).count(),
        1,
        "{third:?}"
    );
    assert_eq!(attempt_of(&c, second_id).await, 1, "B's row counted once");

    // A settles by marking the row at the server's time; a marked row is no longer
    // claimable.
    let settle = s.settle();
    let values = [(Arg::Id, Value::Int(first_id))];
    let before = server_now(&c).await;
    assert_eq!(execute(&a, settle, &binds(settle, &values)).await, 1);
    let after = server_now(&c).await;
    execute(&a, &s.commit, &[]).await;
    let marked = stored(&c, table, "processed_at", first_id)
        .await
        .expect("the row is marked");
    assert_server_time(marked, before, after, 0, "processed_at");
    execute(&a, &s.begin, &[]).await;
    assert!(
        lock(&a, first_id, 1).await.is_empty(),
        "a processed row is not locked again"
    );
    execute(&a, &s.rollback, &[]).await;
    unmark(&b, second_mark).await;
    assert_eq!(marks(&b).await, 0, "B released its mark");
    drop_table(&a, table).await;
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

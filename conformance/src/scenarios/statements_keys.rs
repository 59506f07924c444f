//! The core's rendered advisory lock statements, run on sessions of the harness's own with
//! binds built from each statement's args: candidates and their keys, takes, settlements, and
//! the server's locks.

use ruststream_core::keys::{MYSQL_LOCK_NAME_MAX, mysql_lock_name, postgres_key_hash};
use ruststream_core::spec::{Column, InboxSpec, KeyPart};
use ruststream_core::{Arg, Dialect, StatementKind, Statements, Value};

use crate::harness::Harness;
use crate::rows::Rows;
use crate::session::{Sql, SqlRow, assert_db_time, binds, get, ids};
use crate::{TestName, Verdict};

/// Prepares the database of the statement scenario whose table is `table`: answers its
/// locator and the table's name.
pub(super) async fn start<H: Harness>(
    harness: &H,
    table: &'static str,
    test: &TestName,
) -> (String, &'static str) {
    let db = harness
        .prepare(table)
        .await
        .unwrap_or_else(|e| panic!("{test}: the harness did not prepare a database: {e}"));
    (db, table)
}

/// Drops the scenario's table and cleans up after a pass.
pub(super) async fn finish<H: Harness>(
    harness: &H,
    sql: &mut Sql,
    db: &str,
    table: &str,
) -> Verdict {
    sql.drop_table(table).await;
    if let Err(error) = harness.cleanup(db).await {
        println!("{}: cleaning up {db} failed: {error}", harness.name());
    }
    Ok(())
}

/// Candidates for up to ten rows: their ids (`rs_id`) and keys (`rs_key`), in claim order.
async fn candidates(sql: &mut Sql, s: &Statements) -> Vec<SqlRow> {
    let candidates = get(s, StatementKind::Candidates);
    sql.query(
        candidates,
        &binds(candidates, &[(Arg::Limit, Value::Int(10))]),
    )
    .await
}

/// Takes the row `id` while it is claimable and answers it: the take, or where the table
/// counts attempts on MySQL and MariaDB, the count and then the core's read of the row.
async fn take(sql: &mut Sql, s: &Statements, id: i64) -> Vec<SqlRow> {
    if let Some(take) = s.of_kind(StatementKind::Take) {
        return sql
            .query(take, &binds(take, &[(Arg::Id, Value::Int(id))]))
            .await;
    }
    let count = get(s, StatementKind::TakeCount);
    match sql
        .execute(count, &binds(count, &[(Arg::Id, Value::Int(id))]))
        .await
    {
        0 => Vec::new(),
        _ => sql.query(&s.read_row, &[Value::Int(id)]).await,
    }
}

/// The channel of a published row: text on a server, an integer on SQLite, whose key renders
/// it as its digits.
fn channel(sql: &Sql, n: i64) -> Value {
    match sql.dialect() {
        Dialect::Sqlite => Value::Int(n),
        _ => Value::Text(n.to_string()),
    }
}

/// The advisory lock form's statements: the database renders each row's key (`NULL` where a
/// key column is), in claim order; a take counts the attempt and reads the row, a settled row
/// is taken no more; on a server, a key one session holds is not another's.
pub async fn statements_advisory_form<R: Rows, H: Harness>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    let (db, table) = start(harness, "cf_sql_advisory", test).await;
    let mut a = Sql::open(harness, &db).await;
    a.create(table).await;
    const KEY: &[KeyPart] = &[KeyPart::Literal("video_jobs-"), KeyPart::Column("channel")];
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .advisory(KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .desc();
    let s = Statements::render(harness.dialect(), &desc, 2);
    for (payload, n) in [(b"1", 7), (b"2", 8), (b"3", 7)] {
        let channel = channel(&a, n);
        a.publish(&s, payload, None, channel).await;
    }
    a.publish(&s, b"4", None, Value::Null).await;
    let found = candidates(&mut a, &s).await;
    let keys: Vec<Option<String>> = found.iter().map(|r| r.opt_text("rs_key")).collect();
    let want = ["video_jobs-7", "video_jobs-8", "video_jobs-7"].map(|k| Some(k.to_owned()));
    assert_eq!(
        keys,
        [&want[..], &[None]].concat(),
        "keys rendered by the database, in claim order; a NULL key column makes the key NULL"
    );
    let found: Vec<i64> = found.iter().map(|r| r.int("rs_id")).collect();
    assert!(
        found.windows(2).all(|w| w[0] < w[1]),
        "claim order: {found:?}"
    );
    let first = found[0];
    let locks = match a.dialect() {
        Dialect::Sqlite => {
            assert!(
                s.of_kind(StatementKind::TryLock).is_none()
                    && s.of_kind(StatementKind::Unlock).is_none(),
                "the process keeps SQLite's keys"
            );
            None
        }
        _ => Some(ServerLocks::new(&mut a, &s).await),
    };
    let mut b = Sql::open(harness, &db).await;
    if let Some(locks) = &locks {
        assert!(locks.try_lock(&mut a, "video_jobs-7").await);
        assert!(
            !locks.try_lock(&mut b, "video_jobs-7").await,
            "another session's try_lock of a held key answers no"
        );
    }
    if a.is_mysql() {
        assert!(
            s.of_kind(StatementKind::Take).is_none(),
            "the take counts, then reads"
        );
    }
    let taken = take(&mut a, &s, first).await;
    assert_eq!(ids(&taken), vec![first]);
    assert_eq!(taken[0].int("attempt"), 1, "the take counts the attempt");
    assert_eq!(taken[0].bytes("payload"), b"1");
    // The settlement deletes the row, then the key is released.
    assert_eq!(a.execute(s.settle(), &[Value::Int(first)]).await, 1);
    assert!(
        take(&mut a, &s, first).await.is_empty(),
        "a settled row is taken no more"
    );
    if let Some(locks) = &locks {
        locks.hand_over(&mut a, &mut b).await;
    }
    finish(harness, &mut a, &db, table).await
}

/// A server's advisory locks, `try_lock` and `unlock` of a key as the database locks it: a
/// PostgreSQL key's hash, a MySQL lock name of the database and the key.
struct ServerLocks {
    try_lock: ruststream_core::Statement,
    unlock: ruststream_core::Statement,
    database: Option<String>,
}

impl ServerLocks {
    async fn new(sql: &mut Sql, s: &Statements) -> Self {
        let database = match sql.dialect() {
            Dialect::Postgres => None,
            _ => {
                let current = s.current_database.as_ref().expect("the current database");
                let rows = sql.query(current, &[]).await;
                Some(rows[0].text("db"))
            }
        };
        Self {
            try_lock: get(s, StatementKind::TryLock).clone(),
            unlock: get(s, StatementKind::Unlock).clone(),
            database,
        }
    }

    /// The bind of the key `key`.
    fn key(&self, key: &str) -> Value {
        match &self.database {
            None => Value::Int(postgres_key_hash(key)),
            Some(database) => Value::Text(mysql_lock_name(database, key)),
        }
    }

    async fn try_lock(&self, sql: &mut Sql, key: &str) -> bool {
        let values = [(Arg::Key, self.key(key))];
        let rows = sql
            .query(&self.try_lock, &binds(&self.try_lock, &values))
            .await;
        rows[0].opt_int("locked") == Some(1)
    }

    async fn unlock(&self, sql: &mut Sql, key: &str) -> bool {
        let values = [(Arg::Key, self.key(key))];
        let rows = sql.query(&self.unlock, &binds(&self.unlock, &values)).await;
        rows[0].opt_int("unlocked") == Some(1)
    }

    /// `a` releases the key it holds, `b` takes and releases it; a key not held does not
    /// unlock; a key past MySQL's 64 characters is locked by its hash.
    async fn hand_over(&self, a: &mut Sql, b: &mut Sql) {
        let key = "video_jobs-7";
        if let Some(database) = &self.database {
            assert_eq!(mysql_lock_name(database, key), format!("{database}.{key}"));
        }
        assert!(self.unlock(a, key).await);
        assert!(self.try_lock(b, key).await);
        assert!(self.unlock(b, key).await);
        assert!(
            !self.unlock(b, key).await,
            "an unlock of a key not held does not answer yes"
        );
        let long = format!("video_jobs-{}", "c".repeat(80));
        if let Some(database) = &self.database {
            let name = mysql_lock_name(database, &long);
            assert_eq!(name.chars().count(), MYSQL_LOCK_NAME_MAX);
            assert!(!name.contains('.'), "hashed: {name}");
        }
        assert!(self.try_lock(a, &long).await);
        assert!(!self.try_lock(b, &long).await);
        assert!(self.unlock(a, &long).await);
    }
}

/// A take reads only claimable rows: a row published with no due time is due at the
/// database's time of the publish, one due later is no candidate and is not taken, and a
/// processed row is taken no more.
pub async fn statements_advisory_take_reads_only_claimable_rows<R: Rows, H: Harness>(
    harness: &H,
    test: &TestName,
) -> Verdict {
    let (db, table) = start(harness, "cf_sql_advisory_plain", test).await;
    let mut sql = Sql::open(harness, &db).await;
    sql.create(table).await;
    const KEY: &[KeyPart] = &[KeyPart::Literal("row-"), KeyPart::Column("id")];
    let desc = *InboxSpec::new(table, Column::new("id").generated())
        .advisory(KEY)
        .payload(Column::new("payload"))
        .processed_at(Column::new("processed_at"))
        .due(Column::new("due_at"))
        .desc();
    let s = Statements::render(harness.dialect(), &desc, 2);
    let before = sql.now().await;
    sql.publish(&s, b"due", None, Value::Null).await;
    let after = sql.now().await;
    sql.publish(&s, b"later", Some(after + 60_000_000), Value::Null)
        .await;
    let all = sql.ids_by_payload(table).await;
    let id_of = |payload: &[u8]| all.iter().find(|(_, p)| p == payload).expect("a row").0;
    let (due, later) = (id_of(b"due"), id_of(b"later"));
    let due_at = sql.stored(table, "due_at", due).await.expect("a due time");
    assert_db_time(due_at, before, after, 0, "a row published due now");
    let rows = candidates(&mut sql, &s).await;
    assert_eq!(rows.len(), 1, "the row not yet due is no candidate");
    let id = rows[0].int("rs_id");
    assert_eq!(id, due);
    assert_eq!(rows[0].text("rs_key"), format!("row-{id}"));
    assert!(
        take(&mut sql, &s, later).await.is_empty(),
        "a row not yet due is not taken"
    );
    assert_eq!(take(&mut sql, &s, id).await.len(), 1);
    let settle = s.settle();
    let before = sql.now().await;
    assert_eq!(
        sql.execute(settle, &binds(settle, &[(Arg::Id, Value::Int(id))]))
            .await,
        1
    );
    let after = sql.now().await;
    let marked = sql
        .stored(table, "processed_at", id)
        .await
        .expect("the row is marked");
    assert_db_time(marked, before, after, 0, "processed_at");
    assert!(
        take(&mut sql, &s, id).await.is_empty(),
        "a processed row is not taken"
    );
    finish(harness, &mut sql, &db, table).await
}

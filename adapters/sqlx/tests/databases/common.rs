//! What the database tests share: a namespace of their own on each server (a PostgreSQL
//! schema, a MariaDB database, a SQLite file, each named by the test and the process id), the
//! tables and row types of each form, a handler that records what it sees and can be held,
//! and waits.
//!
//! An unreachable database fails the test with a message naming its URL: nothing is skipped.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use ruststream::{
    Handle, HandlerOutcome, InboxContext, IntoSubscription, SubscriberBuilder, Subscription,
};
use ruststream_sqlx::prelude::*;
use ruststream_sqlx::{SqlxDatabase, sqlx};
use serde::{Deserialize, Serialize};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::pool::PoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::watch;

/// How long a test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(30);
/// The poll interval of the tests' subscriptions.
pub const POLL: Duration = Duration::from_millis(100);

/// The PostgreSQL server of this test binary where it is not the shared one ([`use_pg_url`]).
static PG_URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Points this test binary's PostgreSQL at `url` (a throwaway server of its own); the first
/// call decides.
pub fn use_pg_url(url: String) {
    let _ = PG_URL.set(url);
}

pub fn pg_url() -> String {
    if let Some(url) = PG_URL.get() {
        return url.clone();
    }
    std::env::var("RUSTSTREAM_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

pub fn mysql_url() -> String {
    std::env::var("RUSTSTREAM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// The name of a test's namespace: its name and the process id.
pub fn namespace(test: &str) -> String {
    format!("rs_sqlx_{test}_{}", std::process::id())
}

/// The message every test publishes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub n: u32,
}

/// Row types of the three forms, in tables named by `$prefix`: `<prefix>_rowlock`,
/// `<prefix>_lease`, `<prefix>_keyed` (advisory, keyed `sqlx-<prefix>-<k>`).
#[macro_export]
macro_rules! tables {
    ($prefix:literal) => {
        use ruststream_sqlx::prelude::*;

        #[allow(dead_code)]
        pub const PREFIX: &str = $prefix;

        /// What the advisory keys of `Keyed` start with: unique to the test, since a key
        /// belongs to the database, not to a schema.
        #[allow(dead_code)]
        pub const KEY_PREFIX: &str = concat!("sqlx-", $prefix, "-");

        /// The row lock form.
        #[allow(dead_code)]
        #[derive(Debug, sqlx::FromRow)]
        pub struct RowLock {
            pub id: i64,
            pub attempt: i32,
            pub payload: Vec<u8>,
        }

        impl InboxTable for RowLock {
            type Id = i64;
            type Table = InboxSpec<(Attempt, Payload)>;
            const TABLE: Self::Table =
                InboxSpec::new(concat!($prefix, "_rowlock"), Column::new("id").generated())
                    .attempt(Column::new("attempt").generated())
                    .payload(Column::new("payload"));

            fn id(&self) -> &i64 {
                &self.id
            }
        }

        /// The lease form.
        #[allow(dead_code)]
        #[derive(Debug, sqlx::FromRow)]
        pub struct Leased {
            pub id: i64,
            pub attempt: i32,
            pub payload: Vec<u8>,
        }

        impl InboxTable for Leased {
            type Id = i64;
            type Table = InboxSpec<(Attempt, Payload, Lease)>;
            const TABLE: Self::Table =
                InboxSpec::new(concat!($prefix, "_lease"), Column::new("id").generated())
                    .attempt(Column::new("attempt").generated())
                    .payload(Column::new("payload"))
                    .lease(Column::new("locked_until"));

            fn id(&self) -> &i64 {
                &self.id
            }
        }

        /// The advisory lock form, keyed by `k`.
        #[allow(dead_code)]
        #[derive(Debug, sqlx::FromRow)]
        pub struct Keyed {
            pub id: i64,
            pub k: String,
            pub attempt: i32,
            pub payload: Vec<u8>,
        }

        impl InboxTable for Keyed {
            type Id = i64;
            type Table = InboxSpec<(Advisory, Attempt, Payload)>;
            const TABLE: Self::Table =
                InboxSpec::new(concat!($prefix, "_keyed"), Column::new("id").generated())
                    .advisory(&[KeyPart::Literal(KEY_PREFIX), KeyPart::Column("k")])
                    .attempt(Column::new("attempt").generated())
                    .payload(Column::new("payload"));

            fn id(&self) -> &i64 {
                &self.id
            }
        }

        $crate::payload_rows!(RowLock, Leased, Keyed);
    };
}

/// `PayloadRow` and `AttemptRow` of row types with `payload` and `attempt` fields.
#[macro_export]
macro_rules! payload_rows {
    ($($t:ty),*) => {$(
        impl PayloadRow for $t {
            type Column = Vec<u8>;

            fn payload(&self) -> &[u8] {
                &self.payload
            }
        }

        impl AttemptRow for $t {
            type Attempt = i32;

            fn attempt(&self) -> &i32 {
                &self.attempt
            }
        }
    )*};
}

/// The tables of `tables!(prefix)`, in a dialect.
pub fn schema(dialect: Dialect, prefix: &str) -> String {
    let (id, bytes, time, text) = match dialect {
        Dialect::Postgres => ("BIGSERIAL PRIMARY KEY", "BYTEA", "TIMESTAMPTZ", "TEXT"),
        Dialect::MariaDb => (
            "BIGINT AUTO_INCREMENT PRIMARY KEY",
            "LONGBLOB",
            "DATETIME(6)",
            "VARCHAR(64)",
        ),
        Dialect::Sqlite => (
            "INTEGER PRIMARY KEY AUTOINCREMENT",
            "BLOB",
            "INTEGER",
            "TEXT",
        ),
    };
    format!(
        "CREATE TABLE {prefix}_rowlock (id {id}, attempt INT NOT NULL DEFAULT 0, payload {bytes} NOT NULL);
         CREATE TABLE {prefix}_lease (id {id}, attempt INT NOT NULL DEFAULT 0, locked_until {time} NULL, payload {bytes} NOT NULL);
         CREATE TABLE {prefix}_keyed (id {id}, k {text} NOT NULL, attempt INT NOT NULL DEFAULT 0, payload {bytes} NOT NULL);"
    )
}

/// The test's three databases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    MariaDb,
    Sqlite,
}

/// A test's namespace on one server: where its broker connects, and SQL of its own to set up
/// and look.
pub trait TestDb: Send + Sync {
    type DB: SqlxDatabase;

    /// The namespace's name: `rs_<test>_<pid>`.
    fn name(&self) -> &str;
    fn dialect(&self) -> Dialect;
    /// A broker that builds its pool of these options.
    fn broker_with(&self, pool: PoolOptions<Self::DB>) -> SqlxBroker<Self::DB>;
    /// Runs SQL (several statements) in the namespace, on a connection of the test's own.
    fn exec<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, ()>;
    /// The integer the query answers.
    fn scalar<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, i64>;

    /// A broker with a pool of ten connections that waits ten seconds for one.
    fn broker(&self) -> SqlxBroker<Self::DB> {
        self.broker_with(
            PoolOptions::new()
                .max_connections(10)
                .acquire_timeout(Duration::from_secs(10)),
        )
    }
}

// ----- PostgreSQL -----

/// A PostgreSQL schema of the test's own. The broker's sessions carry the schema's name as
/// their `application_name`; the test's own sessions carry it with `_t`.
pub struct Pg {
    pub schema: String,
    pub url: String,
    pub options: PgConnectOptions,
    pub admin: sqlx::PgPool,
}

impl Pg {
    pub async fn new(test: &str) -> Pg {
        let url = pg_url();
        let base: PgConnectOptions = url
            .parse()
            .unwrap_or_else(|e| panic!("RUSTSTREAM_PG_URL `{url}` does not parse: {e}"));
        let schema = namespace(test);
        let mut root = PgConnection::connect_with(&base).await.unwrap_or_else(|e| {
            panic!("PostgreSQL at {url} is unreachable (set RUSTSTREAM_PG_URL): {e}")
        });
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
        )))
        .execute(&mut root)
        .await
        .unwrap_or_else(|e| panic!("create schema {schema} at {url}: {e}"));
        root.close().await.ok();
        let options = base
            .clone()
            .options([("search_path", schema.as_str())])
            .application_name(&schema);
        let admin = PgPoolOptions::new()
            .max_connections(3)
            .connect_with(options.clone().application_name(&format!("{schema}_t")))
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {url} is unreachable: {e}"));
        Pg {
            schema,
            url,
            options,
            admin,
        }
    }

    /// The URL of the broker's connections: the test's URL with the schema as the search path
    /// and the application name.
    pub fn broker_url(&self) -> String {
        let join = if self.url.contains('?') { '&' } else { '?' };
        format!(
            "{}{join}options=-c%20search_path%3D{schema}&application_name={schema}",
            self.url,
            schema = self.schema
        )
    }

    /// Sessions of the broker (by `application_name`) in `pg_stat_activity`, with a condition.
    pub async fn sessions(&self, condition: &str) -> i64 {
        self.scalar(&format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = '{}' AND pid <> pg_backend_pid() {condition}",
            self.schema
        ))
        .await
    }

    /// Advisory locks held by the broker's sessions.
    pub async fn advisory_locks(&self) -> i64 {
        self.scalar(&format!(
            "SELECT COUNT(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND a.application_name = '{}'",
            self.schema
        ))
        .await
    }

    pub async fn drop(self) {
        self.admin.close().await;
        let mut root = PgConnection::connect(&self.url).await.expect("reconnect");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            self.schema
        )))
        .execute(&mut root)
        .await
        .expect("drop the schema");
        root.close().await.ok();
    }
}

impl TestDb for Pg {
    type DB = Postgres;

    fn name(&self) -> &str {
        &self.schema
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn broker_with(&self, pool: PgPoolOptions) -> SqlxBroker<Postgres> {
        SqlxBroker::from_connect_options(self.options.clone(), pool)
    }

    fn exec<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&self.admin)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        })
    }

    fn scalar<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, i64> {
        Box::pin(async move {
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_owned()))
                .fetch_one(&self.admin)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        })
    }
}

// ----- MariaDB -----

/// A MariaDB database of the test's own. The test's own statements run on a fresh connection
/// each, closed at once, so the broker's connections are the database's only sessions.
pub struct My {
    pub database: String,
    pub url: String,
    pub options: MySqlConnectOptions,
}

impl My {
    pub async fn new(test: &str) -> My {
        let url = mysql_url();
        let base: MySqlConnectOptions = url
            .parse()
            .unwrap_or_else(|e| panic!("RUSTSTREAM_MYSQL_URL `{url}` does not parse: {e}"));
        let database = namespace(test);
        let mut root = MySqlConnection::connect_with(&base)
            .await
            .unwrap_or_else(|e| {
                panic!("MariaDB at {url} is unreachable (set RUSTSTREAM_MYSQL_URL): {e}")
            });
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {database}; CREATE DATABASE {database};"
        )))
        .execute(&mut root)
        .await
        .unwrap_or_else(|e| panic!("create database {database} at {url}: {e}"));
        root.close().await.ok();
        let options = base.database(&database);
        My {
            database,
            url,
            options,
        }
    }

    async fn conn(&self) -> MySqlConnection {
        MySqlConnection::connect_with(&self.options)
            .await
            .unwrap_or_else(|e| panic!("MariaDB at {} is unreachable: {e}", self.url))
    }

    /// The URL of the broker's connections: the test's database.
    pub fn broker_url(&self) -> String {
        use sqlx::ConnectOptions;
        self.options.to_url_lossy().to_string()
    }

    /// The broker's connections in the process list, with a condition.
    pub async fn sessions(&self, condition: &str) -> i64 {
        self.scalar(&format!(
            "SELECT COUNT(*) FROM information_schema.processlist WHERE db = '{}' AND id <> CONNECTION_ID() {condition}",
            self.database
        ))
        .await
    }

    /// The ids of the broker's connections that hold an open transaction.
    pub async fn in_transaction(&self) -> Vec<i64> {
        let mut conn = self.conn().await;
        let ids: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT CAST(p.id AS SIGNED) FROM information_schema.processlist p
             JOIN information_schema.innodb_trx t ON t.trx_mysql_thread_id = p.id
             WHERE p.db = '{}' AND p.id <> CONNECTION_ID()",
            self.database
        )))
        .fetch_all(&mut conn)
        .await
        .expect("read the transactions");
        conn.close().await.ok();
        ids
    }

    pub async fn drop(self) {
        let base: MySqlConnectOptions = self.url.parse().expect("the URL parsed before");
        let mut root = MySqlConnection::connect_with(&base)
            .await
            .expect("reconnect");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {}",
            self.database
        )))
        .execute(&mut root)
        .await
        .expect("drop the database");
        root.close().await.ok();
    }
}

impl TestDb for My {
    type DB = MySql;

    fn name(&self) -> &str {
        &self.database
    }

    fn dialect(&self) -> Dialect {
        Dialect::MariaDb
    }

    fn broker_with(&self, pool: MySqlPoolOptions) -> SqlxBroker<MySql> {
        SqlxBroker::from_connect_options(self.options.clone(), pool)
    }

    fn exec<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = self.conn().await;
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            conn.close().await.ok();
        })
    }

    fn scalar<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, i64> {
        Box::pin(async move {
            let mut conn = self.conn().await;
            let n = sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_owned()))
                .fetch_one(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            conn.close().await.ok();
            n
        })
    }
}

// ----- SQLite -----

/// A SQLite file of the test's own under the target directory, removed with its WAL files.
pub struct Lite {
    pub name: String,
    pub path: PathBuf,
    pub options: SqliteConnectOptions,
}

impl Lite {
    pub async fn new(test: &str) -> Lite {
        let name = namespace(test);
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.db"));
        remove_sqlite(&path);
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .busy_timeout(Duration::from_secs(10));
        Lite {
            name,
            path,
            options,
        }
    }

    pub fn url(&self) -> String {
        format!("sqlite:{}?mode=rwc", self.path.display())
    }

    async fn conn(&self) -> SqliteConnection {
        SqliteConnection::connect_with(&self.options)
            .await
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.path.display()))
    }

    pub async fn drop(self) {
        remove_sqlite(&self.path);
    }
}

fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut file = path.to_path_buf().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}

impl TestDb for Lite {
    type DB = Sqlite;

    fn name(&self) -> &str {
        &self.name
    }

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn broker_with(&self, pool: SqlitePoolOptions) -> SqlxBroker<Sqlite> {
        SqlxBroker::from_connect_options(self.options.clone(), pool)
    }

    fn exec<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = self.conn().await;
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            conn.close().await.ok();
        })
    }

    fn scalar<'a>(&'a self, sql: &'a str) -> BoxFuture<'a, i64> {
        Box::pin(async move {
            let mut conn = self.conn().await;
            let n = sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_owned()))
                .fetch_one(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            conn.close().await.ok();
            n
        })
    }
}

// ----- handlers -----

/// A gate handlers wait at while it is shut.
#[derive(Clone)]
pub struct Gate {
    tx: Arc<watch::Sender<bool>>,
}

impl Gate {
    pub fn open() -> Self {
        Self {
            tx: Arc::new(watch::channel(true).0),
        }
    }

    pub fn shut() -> Self {
        Self {
            tx: Arc::new(watch::channel(false).0),
        }
    }

    pub fn set_open(&self, open: bool) {
        self.tx.send_replace(open);
    }

    pub async fn pass(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// A message's number, with the attempt it came with.
pub type Sighting = (u32, Option<i64>);

/// What a handler saw: each message's number with the attempt it came with, in order.
#[derive(Clone, Default)]
pub struct Seen {
    seen: Arc<Mutex<Vec<Sighting>>>,
    in_work: Arc<AtomicUsize>,
}

impl Seen {
    pub fn all(&self) -> Vec<Sighting> {
        self.seen.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// How many times each number was handled.
    pub fn counts(&self) -> BTreeMap<u32, usize> {
        let mut out = BTreeMap::new();
        for (n, _) in self.all() {
            *out.entry(n).or_default() += 1;
        }
        out
    }

    pub fn contains(&self, n: u32) -> bool {
        self.all().iter().any(|(m, _)| *m == n)
    }

    pub fn in_work(&self) -> usize {
        self.in_work.load(Ordering::SeqCst)
    }
}

/// Records each message once it passes the gate, and acknowledges it.
#[derive(Clone)]
pub struct Record {
    pub seen: Seen,
    pub gate: Gate,
}

impl Record {
    pub fn new(seen: &Seen, gate: &Gate) -> Self {
        Self {
            seen: seen.clone(),
            gate: gate.clone(),
        }
    }
}

impl Handle<Job, (), (), InboxContext> for Record {
    async fn handle(
        &self,
        job: &Job,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let attempt = ctx.kind().info().attempt;
        self.seen.in_work.fetch_add(1, Ordering::SeqCst);
        self.gate.pass().await;
        self.seen.in_work.fetch_sub(1, Ordering::SeqCst);
        self.seen.seen.lock().unwrap().push((job.n, attempt));
        Ok(())
    }
}

/// The subscription builder of `T`'s rows handled by `record`, with `workers` workers.
pub type Builder<T> = SubscriberBuilder<Record, InboxQueue<T>, Job, (), (), InboxContext>;

/// A subscription of `T`'s rows handled by `record`, with `workers` workers, to include in a
/// service.
pub fn builder<T>(record: Record, workers: usize, lease: Option<Duration>) -> Builder<T> {
    let mut builder = ruststream::subscriber("jobs", record)
        .map_source(|_| InboxQueue::<T>::new("jobs"))
        .workers(std::num::NonZeroUsize::new(workers).expect("workers > 0"))
        .poll_interval(POLL);
    if let Some(lease) = lease {
        builder = builder.lease(lease);
    }
    builder
}

/// The same subscription, to start a broker by hand with.
pub fn subscription<T, DB>(
    record: Record,
    workers: usize,
    lease: Option<Duration>,
) -> Subscription<SqlxBroker<DB>>
where
    DB: SqlxDatabase,
    T: InboxTable + PayloadRow + ruststream::DecodesAs<Job>,
    SqlxBroker<DB>: ruststream::adapter::TakesRows<T>,
{
    builder::<T>(record, workers, lease).into_subscription()
}

/// A message of number `n`, with the key column `k` where the table has one.
pub fn message(n: u32, key: Option<&str>) -> Message {
    let message = Message::json(&Job { n }).expect("a job encodes");
    match key {
        Some(k) => message.column("k", k),
        None => message,
    }
}

/// Waits until `check` answers true, or fails naming `what`.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

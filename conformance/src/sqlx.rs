//! The harnesses of the sqlx adapter (feature `sqlx`), one per database, and the suite's
//! custom lock on each of sqlx's connections:
//!
//! - [`SqlxPostgresHarness`]: PostgreSQL at `RUSTSTREAM_PG_URL` (default
//!   `postgres://postgres@127.0.0.1:5432/test`), in a database of the harness's own beside the
//!   URL's (`<database>_cf_sqlx`, created when missing) and a schema per scenario and process.
//! - [`SqlxMySqlHarness`]: MariaDB (or MySQL) at `RUSTSTREAM_MYSQL_URL` (default
//!   `mysql://root@127.0.0.1:3306/test`), a database per scenario and process.
//! - [`SqlxSqliteHarness`]: SQLite, a new file per scenario.
//!
//! A scenario's table names are fixed, and so are its advisory keys (`<table>-<k>`). A
//! PostgreSQL advisory lock belongs to the database, not to a schema: the harness works in a
//! database of its own, so its keys are not the tokio-postgres suite's, which runs in the
//! URL's database, and both suites run at once on one server. A MariaDB lock name starts with
//! the database's name (`keys::mysql_lock_name`), so a database per scenario keeps the keys
//! apart from every other suite's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ruststream::BrokerHandle;
use ruststream_core::Dialect;
use ruststream_core::keys::{POSTGRES_KEY_HASH_SQL, mysql_lock_name};
use ruststream_sqlx::SqlxBroker;
use sqlx::mysql::{MySql, MySqlConnection, MySqlPoolOptions};
use sqlx::postgres::{PgConnection, PgPoolOptions, Postgres};
use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions,
};
use sqlx::{AssertSqlSafe, ColumnIndex, Connection, Decode, Row, ValueRef};

use crate::harness::{
    Capabilities, Harness, HarnessFuture, HarnessResult, HeldKey, NoRowLocks, RowLocks, Support,
};
use crate::schema;
use crate::urls::{database_of, with_database, with_params};

/// The default PostgreSQL server.
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The default MariaDB server.
pub const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// The most connections a broker's pool opens: the most workers of a scenario, a claim and a
/// publish, and room.
const POOL: u32 = 16;

/// How long a broker's pool waits for a connection.
const ACQUIRE: Duration = Duration::from_secs(10);

/// The first column of each row as an integer; a `NULL` is an error.
fn first_column<R>(rows: &[R], sql: &str) -> HarnessResult<Vec<i64>>
where
    R: Row,
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database>,
{
    rows.iter()
        .map(|row| -> HarnessResult<i64> {
            if row.try_get_raw(0)?.is_null() {
                return Err(format!("`{sql}` answered NULL").into());
            }
            Ok(row.try_get_unchecked::<i64, _>(0)?)
        })
        .collect()
}

// ----- PostgreSQL -----

/// PostgreSQL on sqlx: the database `<database>_cf_sqlx` beside the URL's (created when
/// missing), and in it the schema `<table>_<pid>` per scenario, on the search path of every
/// session the locator opens (the broker's and the harness's own); the schema is dropped once
/// the scenario passed.
#[derive(Clone, Debug)]
pub struct SqlxPostgresHarness {
    url: String,
    database: String,
}

impl Default for SqlxPostgresHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl SqlxPostgresHarness {
    /// The harness on `RUSTSTREAM_PG_URL`.
    pub fn new() -> Self {
        Self::on(std::env::var("RUSTSTREAM_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_owned()))
    }

    /// The harness on the server `url` reaches, in the database `<url's database>_cf_sqlx`.
    pub fn on(url: impl Into<String>) -> Self {
        let url = url.into();
        let database = format!("{}_cf_sqlx", database_of(&url).unwrap_or("postgres"));
        Self { url, database }
    }

    /// The URL of the harness's database.
    fn database_url(&self) -> String {
        with_database(&self.url, &self.database)
    }

    /// Creates the harness's database unless it exists.
    async fn ensure_database(&self) -> HarnessResult<()> {
        let mut conn = pg_connect(&self.url).await?;
        let exists: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM pg_database WHERE datname = $1")
            .bind(&self.database)
            .fetch_one(&mut conn)
            .await?;
        if exists == 0 {
            let created = sqlx::raw_sql(AssertSqlSafe(format!(
                "CREATE DATABASE \"{}\"",
                self.database
            )))
            .execute(&mut conn)
            .await;
            match created {
                Ok(_) => {}
                // Another test created it meanwhile: duplicate database, or the unique index
                // of `pg_database` when both ran at once.
                Err(sqlx::Error::Database(e))
                    if matches!(e.code().as_deref(), Some("42P04" | "23505")) => {}
                Err(e) => {
                    return Err(format!(
                        "cannot create the database {} of the sqlx suite at {}: {e}",
                        self.database, self.url
                    )
                    .into());
                }
            }
        }
        conn.close().await?;
        Ok(())
    }
}

/// A session on `url`, or an error that names it.
async fn pg_connect(url: &str) -> HarnessResult<PgConnection> {
    PgConnection::connect(url).await.map_err(|e| {
        format!("cannot reach PostgreSQL at {url} (set RUSTSTREAM_PG_URL): {e}").into()
    })
}

/// The schema a PostgreSQL locator names.
fn schema_of(db: &str) -> Option<&str> {
    db.split("search_path%3D")
        .nth(1)
        .map(|rest| rest.split('&').next().unwrap_or(rest))
}

/// [`POSTGRES_KEY_HASH_SQL`] of the first bind: the key's lock as the server computes it.
fn pg_key_hash() -> String {
    POSTGRES_KEY_HASH_SQL.replace("{key}", "CAST($1 AS TEXT)")
}

/// A PostgreSQL advisory key held on a session of the harness's own.
struct PgHeld {
    conn: PgConnection,
    key: String,
}

impl HeldKey for PgHeld {
    fn release(self: Box<Self>) -> HarnessFuture<'static, ()> {
        Box::pin(async move {
            let PgHeld { mut conn, key } = *self;
            let released: bool = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT pg_advisory_unlock({})",
                pg_key_hash()
            )))
            .bind(&key)
            .fetch_one(&mut conn)
            .await?;
            conn.close().await?;
            if !released {
                return Err(format!("the harness's session did not hold {key}").into());
            }
            Ok(())
        })
    }
}

impl Harness for SqlxPostgresHarness {
    type Adapter = SqlxBroker<Postgres>;
    type RowLock = RowLocks;

    fn name(&self) -> &'static str {
        "sqlx on PostgreSQL"
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            hold_key: Support::Yes,
            kill_connection: Support::Yes,
            kill_process: Support::Yes,
        }
    }

    fn prepare<'a>(&'a self, table: &'a str) -> HarnessFuture<'a, String> {
        Box::pin(async move {
            self.ensure_database().await?;
            let schema = format!("{table}_{}", std::process::id());
            let url = self.database_url();
            let mut conn = pg_connect(&url).await?;
            sqlx::raw_sql(AssertSqlSafe(format!(
                "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            )))
            .execute(&mut conn)
            .await?;
            conn.close().await?;
            Ok(with_params(
                &url,
                &format!("application_name={schema}&options=-c%20search_path%3D{schema}"),
            ))
        })
    }

    fn broker(&self, db: &str) -> BrokerHandle<SqlxBroker<Postgres>> {
        let pool = PgPoolOptions::new()
            .max_connections(POOL)
            .acquire_timeout(ACQUIRE);
        SqlxBroker::from_url(db, pool).handle()
    }

    fn execute<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = pg_connect(db).await?;
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&mut conn)
                .await?;
            conn.close().await?;
            Ok(())
        })
    }

    fn query_i64s<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, Vec<i64>> {
        Box::pin(async move {
            let mut conn = pg_connect(db).await?;
            let rows = sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .fetch_all(&mut conn)
                .await?;
            conn.close().await?;
            first_column(&rows, sql)
        })
    }

    fn hold_key<'a>(&'a self, db: &'a str, key: &'a str) -> HarnessFuture<'a, Box<dyn HeldKey>> {
        Box::pin(async move {
            let mut conn = pg_connect(db).await?;
            let taken: bool = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT pg_try_advisory_lock({})",
                pg_key_hash()
            )))
            .bind(key)
            .fetch_one(&mut conn)
            .await?;
            if !taken {
                return Err(format!("{key} is held by another session").into());
            }
            Ok(Box::new(PgHeld {
                conn,
                key: key.to_owned(),
            }) as Box<dyn HeldKey>)
        })
    }

    fn kill_key_holder<'a>(&'a self, db: &'a str, key: &'a str) -> HarnessFuture<'a, bool> {
        Box::pin(async move {
            // A 64-bit advisory key is `classid` (its high half) and `objid` (its low half),
            // `objsubid` 1, in the current database.
            let sql = format!(
                "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(l.pid) FROM pg_locks l, \
                 (SELECT {} AS h) k \
                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND l.classid = ((k.h >> 32) & 4294967295)::oid \
                 AND l.objid = (k.h & 4294967295)::oid) t",
                pg_key_hash()
            );
            let mut conn = pg_connect(db).await?;
            let killed: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
                .bind(key)
                .fetch_one(&mut conn)
                .await?;
            conn.close().await?;
            Ok(killed > 0)
        })
    }

    fn cleanup<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, ()> {
        Box::pin(async move {
            if let Some(schema) = schema_of(db) {
                let mut conn = pg_connect(&self.database_url()).await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS {schema} CASCADE"
                )))
                .execute(&mut conn)
                .await?;
                conn.close().await?;
            }
            Ok(())
        })
    }
}

/// The suite's custom lock on PostgreSQL (lock.md's `held_keys`, beside `table`): takes `key`
/// unless it is held, recording the session (its backend's pid) that took it, and logs the
/// take.
pub(crate) async fn pg_lock(
    conn: &mut PgConnection,
    table: &str,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let key_column = schema::key_column(Dialect::Postgres);
    let taken = sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} ({key_column}, session) VALUES ($1, pg_backend_pid()) \
         ON CONFLICT DO NOTHING",
        schema::held_keys(table)
    )))
    .bind(key)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if taken == 1 {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} ({key_column}, session) VALUES ($1, pg_backend_pid())",
            schema::lock_log(table)
        )))
        .bind(key)
        .execute(&mut *conn)
        .await?;
    }
    Ok(taken == 1)
}

/// The suite's custom unlock on PostgreSQL: releases `key`, and answers whether it was held.
pub(crate) async fn pg_unlock(
    conn: &mut PgConnection,
    table: &str,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let released = sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {} WHERE {} = $1",
        schema::held_keys(table),
        schema::key_column(Dialect::Postgres)
    )))
    .bind(key)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(released == 1)
}

// ----- MariaDB -----

/// MariaDB (or MySQL) on sqlx: each scenario gets the database `<table>_q<pid>`, dropped once
/// the scenario passed. The harness's own SQL runs on a session it opens for each call.
#[derive(Clone, Debug)]
pub struct SqlxMySqlHarness {
    url: String,
}

impl Default for SqlxMySqlHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl SqlxMySqlHarness {
    /// The harness on `RUSTSTREAM_MYSQL_URL`.
    pub fn new() -> Self {
        Self::on(
            std::env::var("RUSTSTREAM_MYSQL_URL").unwrap_or_else(|_| DEFAULT_MYSQL_URL.to_owned()),
        )
    }

    /// The harness on the server `url` reaches.
    pub fn on(url: impl Into<String>) -> Self {
        Self { url: url.into() }
    }
}

/// A session on `url`, or an error that names it.
async fn mysql_connect(url: &str) -> HarnessResult<MySqlConnection> {
    MySqlConnection::connect(url).await.map_err(|e| {
        format!("cannot reach MariaDB at {url} (set RUSTSTREAM_MYSQL_URL): {e}").into()
    })
}

/// The lock name of `key` in the database `db` names.
fn mysql_lock_name_of(db: &str, key: &str) -> HarnessResult<String> {
    let database = database_of(db).ok_or_else(|| format!("{db} names no database"))?;
    Ok(mysql_lock_name(database, key))
}

/// A MariaDB lock held on a session of the harness's own.
struct MySqlHeld {
    conn: MySqlConnection,
    name: String,
}

impl HeldKey for MySqlHeld {
    fn release(self: Box<Self>) -> HarnessFuture<'static, ()> {
        Box::pin(async move {
            let MySqlHeld { mut conn, name } = *self;
            let row = sqlx::query("SELECT RELEASE_LOCK(?)")
                .bind(&name)
                .fetch_one(&mut conn)
                .await?;
            let released: Option<i64> = row.try_get_unchecked(0)?;
            conn.close().await?;
            if released != Some(1) {
                return Err(format!("the harness's session did not hold {name}").into());
            }
            Ok(())
        })
    }
}

impl Harness for SqlxMySqlHarness {
    type Adapter = SqlxBroker<MySql>;
    type RowLock = RowLocks;

    fn name(&self) -> &'static str {
        "sqlx on MariaDB"
    }

    fn dialect(&self) -> Dialect {
        Dialect::MariaDb
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            hold_key: Support::Yes,
            kill_connection: Support::Yes,
            kill_process: Support::Yes,
        }
    }

    fn prepare<'a>(&'a self, table: &'a str) -> HarnessFuture<'a, String> {
        Box::pin(async move {
            let database = format!("{table}_q{}", std::process::id());
            let mut conn = mysql_connect(&self.url).await?;
            sqlx::raw_sql(AssertSqlSafe(format!(
                "SET SESSION lock_wait_timeout = 10; DROP DATABASE IF EXISTS {database}; \
                 CREATE DATABASE {database}"
            )))
            .execute(&mut conn)
            .await?;
            conn.close().await?;
            Ok(with_database(&self.url, &database))
        })
    }

    fn broker(&self, db: &str) -> BrokerHandle<SqlxBroker<MySql>> {
        let pool = MySqlPoolOptions::new()
            .max_connections(POOL)
            .acquire_timeout(ACQUIRE);
        SqlxBroker::from_url(db, pool).handle()
    }

    fn execute<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = mysql_connect(db).await?;
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&mut conn)
                .await?;
            conn.close().await?;
            Ok(())
        })
    }

    fn query_i64s<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, Vec<i64>> {
        Box::pin(async move {
            let mut conn = mysql_connect(db).await?;
            let rows = sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .fetch_all(&mut conn)
                .await?;
            conn.close().await?;
            first_column(&rows, sql)
        })
    }

    fn hold_key<'a>(&'a self, db: &'a str, key: &'a str) -> HarnessFuture<'a, Box<dyn HeldKey>> {
        Box::pin(async move {
            let name = mysql_lock_name_of(db, key)?;
            let mut conn = mysql_connect(db).await?;
            let row = sqlx::query("SELECT GET_LOCK(?, 0)")
                .bind(&name)
                .fetch_one(&mut conn)
                .await?;
            let taken: Option<i64> = row.try_get_unchecked(0)?;
            if taken != Some(1) {
                return Err(format!("GET_LOCK('{name}', 0) answered {taken:?}").into());
            }
            Ok(Box::new(MySqlHeld { conn, name }) as Box<dyn HeldKey>)
        })
    }

    fn kill_key_holder<'a>(&'a self, db: &'a str, key: &'a str) -> HarnessFuture<'a, bool> {
        Box::pin(async move {
            let name = mysql_lock_name_of(db, key)?;
            let mut conn = mysql_connect(db).await?;
            let row = sqlx::query("SELECT IS_USED_LOCK(?)")
                .bind(&name)
                .fetch_one(&mut conn)
                .await?;
            let holder: Option<i64> = row.try_get_unchecked(0)?;
            if let Some(holder) = holder {
                sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {holder}")))
                    .execute(&mut conn)
                    .await?;
            }
            conn.close().await?;
            Ok(holder.is_some())
        })
    }

    fn cleanup<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, ()> {
        Box::pin(async move {
            if let Some(database) = database_of(db) {
                let mut conn = mysql_connect(&self.url).await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "SET SESSION lock_wait_timeout = 10; DROP DATABASE IF EXISTS {database}"
                )))
                .execute(&mut conn)
                .await?;
                conn.close().await?;
            }
            Ok(())
        })
    }
}

/// The suite's custom lock on MariaDB: takes `key` unless it is held, recording the session
/// (`CONNECTION_ID()`) that took it, and logs the take.
pub(crate) async fn mysql_lock(
    conn: &mut MySqlConnection,
    table: &str,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let key_column = schema::key_column(Dialect::MariaDb);
    let taken = sqlx::query(AssertSqlSafe(format!(
        "INSERT IGNORE INTO {} ({key_column}, session) VALUES (?, CONNECTION_ID())",
        schema::held_keys(table)
    )))
    .bind(key)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if taken == 1 {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} ({key_column}, session) VALUES (?, CONNECTION_ID())",
            schema::lock_log(table)
        )))
        .bind(key)
        .execute(&mut *conn)
        .await?;
    }
    Ok(taken == 1)
}

/// The suite's custom unlock on MariaDB: releases `key`, and answers whether it was held.
pub(crate) async fn mysql_unlock(
    conn: &mut MySqlConnection,
    table: &str,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let released = sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {} WHERE {} = ?",
        schema::held_keys(table),
        schema::key_column(Dialect::MariaDb)
    )))
    .bind(key)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(released == 1)
}

// ----- SQLite -----

/// SQLite on sqlx: each scenario gets a new database file under
/// `std::env::temp_dir()/ruststream-conformance-sqlx`, in WAL mode, removed once the scenario
/// passed. The harness's own SQL runs on a connection it opens for each call.
#[derive(Clone, Debug)]
pub struct SqlxSqliteHarness {
    dir: PathBuf,
}

impl Default for SqlxSqliteHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl SqlxSqliteHarness {
    /// The harness, with its files under the system's temporary directory.
    pub fn new() -> Self {
        Self::in_dir(std::env::temp_dir().join("ruststream-conformance-sqlx"))
    }

    /// The harness, with its files in `dir`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }
}

/// The database file and its WAL companions.
fn sqlite_files(db: &str) -> impl Iterator<Item = PathBuf> + '_ {
    ["", "-wal", "-shm", "-journal"]
        .into_iter()
        .map(move |suffix| PathBuf::from(format!("{db}{suffix}")))
}

/// How the broker and the harness open the file `db`.
fn sqlite_options(db: &str) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(Path::new(db))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10))
}

async fn sqlite_connect(db: &str) -> HarnessResult<SqliteConnection> {
    SqliteConnection::connect_with(&sqlite_options(db))
        .await
        .map_err(|e| format!("cannot open the SQLite database {db}: {e}").into())
}

impl Harness for SqlxSqliteHarness {
    type Adapter = SqlxBroker<Sqlite>;
    type RowLock = NoRowLocks;

    fn name(&self) -> &'static str {
        "sqlx on SQLite"
    }

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            hold_key: Support::No(
                "SQLite has no locks a session holds: the process keeps the keys in work",
            ),
            kill_connection: Support::No("SQLite has no server to kill a connection from"),
            kill_process: Support::Yes,
        }
    }

    fn prepare<'a>(&'a self, table: &'a str) -> HarnessFuture<'a, String> {
        let path = self.dir.join(format!("{table}-{}.db", std::process::id()));
        let dir = self.dir.clone();
        Box::pin(async move {
            std::fs::create_dir_all(&dir)?;
            let db = path.to_string_lossy().into_owned();
            for file in sqlite_files(&db) {
                match std::fs::remove_file(&file) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(format!("cannot remove {}: {e}", file.display()).into()),
                }
            }
            Ok(db)
        })
    }

    fn broker(&self, db: &str) -> BrokerHandle<SqlxBroker<Sqlite>> {
        let pool = SqlitePoolOptions::new()
            .max_connections(POOL)
            .acquire_timeout(ACQUIRE);
        SqlxBroker::from_connect_options(sqlite_options(db), pool).handle()
    }

    fn execute<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = sqlite_connect(db).await?;
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&mut conn)
                .await?;
            conn.close().await?;
            Ok(())
        })
    }

    fn query_i64s<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, Vec<i64>> {
        Box::pin(async move {
            let mut conn = sqlite_connect(db).await?;
            let rows = sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .fetch_all(&mut conn)
                .await?;
            let values = first_column(&rows, sql);
            drop(rows);
            conn.close().await?;
            values
        })
    }

    fn cleanup<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, ()> {
        for file in sqlite_files(db) {
            let _ = std::fs::remove_file(file);
        }
        Box::pin(async { Ok(()) })
    }
}

/// The connection's session: a random number kept in a temporary table, which lives as long as
/// the connection.
async fn sqlite_session(conn: &mut SqliteConnection) -> Result<i64, sqlx::Error> {
    sqlx::raw_sql("CREATE TEMP TABLE IF NOT EXISTS cf_session AS SELECT abs(random()) AS id")
        .execute(&mut *conn)
        .await?;
    sqlx::query_scalar("SELECT id FROM temp.cf_session")
        .fetch_one(&mut *conn)
        .await
}

/// The suite's custom lock on SQLite: takes `key` unless it is held, recording the session
/// that took it, and logs the take.
pub(crate) async fn sqlite_lock(
    conn: &mut SqliteConnection,
    table: &str,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let session = sqlite_session(conn).await?;
    let key_column = schema::key_column(Dialect::Sqlite);
    let taken = sqlx::query(AssertSqlSafe(format!(
        "INSERT OR IGNORE INTO {} ({key_column}, session) VALUES (?1, ?2)",
        schema::held_keys(table)
    )))
    .bind(key)
    .bind(session)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if taken == 1 {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} ({key_column}, session) VALUES (?1, ?2)",
            schema::lock_log(table)
        )))
        .bind(key)
        .bind(session)
        .execute(&mut *conn)
        .await?;
    }
    Ok(taken == 1)
}

/// The suite's custom unlock on SQLite: releases `key`, and answers whether it was held.
pub(crate) async fn sqlite_unlock(
    conn: &mut SqliteConnection,
    table: &str,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let released = sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {} WHERE {} = ?1",
        schema::held_keys(table),
        schema::key_column(Dialect::Sqlite)
    )))
    .bind(key)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(released == 1)
}

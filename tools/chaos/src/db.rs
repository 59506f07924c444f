//! What the parent does on the servers, through sqlx: the run's database and tables, the
//! jobs, what the run left (rows, log), the services' sessions (to kill some), a transaction
//! held open, and what is held on the server after the services exited.

use std::time::Duration;

use ruststream::core::keys::mysql_lock_name;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, MySql, Postgres, Row};
use url::Url;

use crate::BoxError;
use crate::check::{Delivery, RowState};
use crate::rows::{IDS, KEY_PREFIX, LOG, POISON_PAYLOAD, TABLE, poison_sql};

/// A server: its URL (any database on it).
#[derive(Clone, Debug)]
pub struct Server {
    /// PostgreSQL, else MySQL/MariaDB.
    pub postgres: bool,
    url: Url,
}

impl Server {
    /// The server a `postgres://` or `mysql://` URL names.
    pub fn new(url: &str) -> Result<Self, BoxError> {
        let url = Url::parse(url).map_err(|e| format!("{url}: not a URL: {e}"))?;
        let postgres = match url.scheme() {
            "postgres" | "postgresql" => true,
            "mysql" | "mariadb" => false,
            other => return Err(format!("{url}: unknown scheme {other}").into()),
        };
        let mut url = url;
        if !postgres {
            url.set_scheme("mysql")
                .map_err(|()| "cannot set the scheme")?;
        }
        Ok(Self { postgres, url })
    }

    /// The URL of database `db` on this server (none: MySQL's connection without a default
    /// database), with `application_name` on PostgreSQL.
    pub fn url(&self, db: Option<&str>, application: Option<&str>) -> String {
        let mut url = self.url.clone();
        url.set_path(db.map(|d| format!("/{d}")).as_deref().unwrap_or(""));
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .filter(|(k, _)| k != "application_name")
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        url.set_query(None);
        if !pairs.is_empty() || (self.postgres && application.is_some()) {
            let mut q = url.query_pairs_mut();
            for (k, v) in &pairs {
                q.append_pair(k, v);
            }
            if let (true, Some(app)) = (self.postgres, application) {
                q.append_pair("application_name", app);
            }
        }
        url.to_string()
    }

    /// The server's host and port.
    pub fn addr(&self) -> (String, u16) {
        let host = self.url.host_str().unwrap_or("127.0.0.1").to_owned();
        let default = if self.postgres { 5432 } else { 3306 };
        (host, self.url.port().unwrap_or(default))
    }

    /// The user the URL names.
    pub fn user(&self) -> String {
        self.url.username().to_owned()
    }

    /// [`Server::url`] through another port on 127.0.0.1 (a gate, a pooler).
    pub fn url_at(&self, port: u16, db: Option<&str>, application: Option<&str>) -> String {
        let mut url = Url::parse(&self.url(db, application)).expect("a URL of the server's");
        let _ = url.set_host(Some("127.0.0.1"));
        let _ = url.set_port(Some(port));
        url.to_string()
    }

    /// Creates database `name`.
    pub async fn create_db(&self, name: &str) -> Result<(), BoxError> {
        self.admin(&format!("CREATE DATABASE {name}")).await
    }

    /// Drops database `name`, ending any session still on it (PostgreSQL).
    pub async fn drop_db(&self, name: &str) -> Result<(), BoxError> {
        if self.postgres {
            self.admin(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await
        } else {
            self.admin(&format!("DROP DATABASE IF EXISTS {name}")).await
        }
    }

    async fn admin(&self, sql: &str) -> Result<(), BoxError> {
        if self.postgres {
            let mut conn = PgConnection::connect(&self.url(Some("postgres"), None)).await?;
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&mut conn)
                .await?;
            conn.close().await?;
        } else {
            let mut conn = MySqlConnection::connect(&self.url(None, None)).await?;
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&mut conn)
                .await?;
            conn.close().await?;
        }
        Ok(())
    }
}

#[derive(Clone)]
enum Pool {
    Postgres(PgPool),
    MySql(MySqlPool),
}

/// A session of a service on the server.
#[derive(Clone, Copy, Debug)]
pub struct Session {
    /// The backend pid (PostgreSQL) or connection id (MySQL/MariaDB).
    pub id: i64,
    /// The process, where the session's `application_name` tells it.
    pub spawn: Option<i64>,
    /// The client's port, where the server tells it.
    pub port: Option<u16>,
}

/// A transaction held open on a connection of the parent's, until [`Held::end`].
pub enum Held {
    /// On PostgreSQL.
    Postgres(PoolConnection<Postgres>),
    /// On MySQL/MariaDB.
    MySql(PoolConnection<MySql>),
}

impl Held {
    /// Rolls the transaction back and gives the connection back.
    pub async fn end(self) {
        let _ = match self {
            Held::Postgres(mut c) => sqlx::raw_sql("ROLLBACK").execute(&mut *c).await.map(drop),
            Held::MySql(mut c) => sqlx::raw_sql("ROLLBACK").execute(&mut *c).await.map(drop),
        };
    }
}

/// The run's database, as the parent reaches it.
#[derive(Clone)]
pub struct RunDb {
    /// The server.
    pub server: Server,
    /// The database's name.
    pub name: String,
    /// The `application_name` of the parent's sessions (PostgreSQL).
    pub parent_app: String,
    pool: Pool,
}

impl RunDb {
    /// Connects to database `name` (created) on `server`. On MySQL/MariaDB the parent's
    /// connections have no default database, so that the services' sessions are the ones
    /// whose database is the run's.
    pub async fn connect(server: &Server, name: &str, parent_app: &str) -> Result<Self, BoxError> {
        let pool = if server.postgres {
            Pool::Postgres(
                PgPoolOptions::new()
                    .max_connections(4)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_lazy(&server.url(Some(name), Some(parent_app)))?,
            )
        } else {
            Pool::MySql(
                MySqlPoolOptions::new()
                    .max_connections(4)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_lazy(&server.url(None, None))?,
            )
        };
        Ok(Self {
            server: server.clone(),
            name: name.to_owned(),
            parent_app: parent_app.to_owned(),
            pool,
        })
    }

    /// Table `t` as the parent names it: qualified by the database on MySQL/MariaDB.
    pub fn table(&self, t: &str) -> String {
        if self.server.postgres {
            t.to_owned()
        } else {
            format!("{}.{t}", self.name)
        }
    }

    /// Runs statements, one each.
    pub async fn execute(&self, statements: &[String]) -> Result<(), BoxError> {
        for sql in statements {
            match &self.pool {
                Pool::Postgres(p) => {
                    sqlx::raw_sql(AssertSqlSafe(sql.clone())).execute(p).await?;
                }
                Pool::MySql(p) => {
                    sqlx::raw_sql(AssertSqlSafe(sql.clone())).execute(p).await?;
                }
            }
        }
        Ok(())
    }

    /// Creates the run's tables.
    pub async fn create_tables(&self, lease: bool, bare: bool) -> Result<(), BoxError> {
        let mut statements = crate::rows::create(self.server.postgres, lease, bare);
        if !self.server.postgres {
            // The parent has no default database: create them in the run's.
            statements = statements
                .into_iter()
                .map(|s| {
                    s.replacen(
                        &format!("CREATE TABLE {TABLE} "),
                        &format!("CREATE TABLE {} ", self.table(TABLE)),
                        1,
                    )
                    .replacen(
                        &format!("CREATE TABLE {LOG} "),
                        &format!("CREATE TABLE {} ", self.table(LOG)),
                        1,
                    )
                })
                .collect();
        }
        self.execute(&statements).await
    }

    /// Inserts `jobs` rows, job `n` (from 0) with `k = n % keys`, then keeps every id and `k`
    /// in `chaos_ids`.
    pub async fn publish(&self, jobs: u64, keys: u64) -> Result<(), BoxError> {
        let keys = keys.max(1);
        let table = self.table(TABLE);
        let chunk = 10_000u64;
        let mut from = 0u64;
        while from < jobs {
            let to = (from + chunk).min(jobs);
            let sql = if self.server.postgres {
                format!(
                    "INSERT INTO {table} (k, payload) SELECT g % {keys}, convert_to('{{}}', 'UTF8') \
                     FROM generate_series({from}, {}) AS g ORDER BY g",
                    to - 1
                )
            } else {
                let values: Vec<String> = (from..to)
                    .map(|n| format!("({}, '{{}}')", n % keys))
                    .collect();
                format!(
                    "INSERT INTO {table} (k, payload) VALUES {}",
                    values.join(", ")
                )
            };
            self.execute(&[sql]).await?;
            from = to;
        }
        let ids = self.table(IDS);
        self.execute(&[format!("CREATE TABLE {ids} AS SELECT id, k FROM {table}")])
            .await
    }

    /// Every job published: id and `k`.
    pub async fn jobs(&self) -> Result<Vec<(i64, i64)>, BoxError> {
        let sql = format!("SELECT id, k FROM {} ORDER BY id", self.table(IDS));
        Ok(match &self.pool {
            Pool::Postgres(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_all(p).await?,
            Pool::MySql(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_all(p).await?,
        })
    }

    /// poison_rows: gives every poison row ([`poison_sql`]) a payload that does not decode, as
    /// a row inserted by hand might have.
    pub async fn poison(&self) -> Result<(), BoxError> {
        let payload = if self.server.postgres {
            format!("convert_to('{POISON_PAYLOAD}', 'UTF8')")
        } else {
            format!("'{POISON_PAYLOAD}'")
        };
        let sql = format!(
            "UPDATE {} SET payload = {payload} WHERE {}",
            self.table(TABLE),
            poison_sql()
        );
        self.execute(&[sql]).await
    }

    /// Rows neither acknowledged nor failed; on the bare table (which keeps no failed rows),
    /// the rows left but the poison rows.
    pub async fn pending(&self, bare: bool) -> Result<i64, BoxError> {
        let condition = if bare {
            format!("NOT ({})", poison_sql())
        } else {
            "failed_at IS NULL".to_owned()
        };
        let sql = format!(
            "SELECT COUNT(*) FROM {} WHERE {condition}",
            self.table(TABLE)
        );
        Ok(match &self.pool {
            Pool::Postgres(p) => sqlx::query_scalar(AssertSqlSafe(sql)).fetch_one(p).await?,
            Pool::MySql(p) => sqlx::query_scalar(AssertSqlSafe(sql)).fetch_one(p).await?,
        })
    }

    /// The rows left in the table.
    pub async fn remaining(&self, bare: bool) -> Result<Vec<RowState>, BoxError> {
        let (failed, error) = if bare {
            let no_error = if self.server.postgres {
                "CAST(NULL AS TEXT)"
            } else {
                "CAST(NULL AS CHAR)"
            };
            ("0", no_error)
        } else {
            ("CASE WHEN failed_at IS NULL THEN 0 ELSE 1 END", "error")
        };
        let sql = format!(
            "SELECT id, attempt, {failed} AS failed, {error} AS error FROM {} ORDER BY id",
            self.table(TABLE)
        );
        let rows: Vec<(i64, i64, i64, Option<String>)> = match &self.pool {
            Pool::Postgres(p) => {
                let rows = sqlx::query(AssertSqlSafe(sql)).fetch_all(p).await?;
                rows.iter()
                    .map(|r| {
                        let failed: i32 = r.get(2);
                        (r.get(0), r.get(1), i64::from(failed), r.get(3))
                    })
                    .collect()
            }
            Pool::MySql(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_all(p).await?,
        };
        Ok(rows
            .into_iter()
            .map(|(id, attempt, failed, error)| RowState {
                id,
                attempt,
                failed: failed != 0,
                error,
            })
            .collect())
    }

    /// What the handlers recorded.
    pub async fn log(&self) -> Result<Vec<Delivery>, BoxError> {
        let key = if self.server.postgres { "key" } else { "`key`" };
        let sql = format!(
            "SELECT spawn, seq, job, attempt, {key}, pid, start_us, end_us, outcome FROM {} \
             ORDER BY start_us",
            self.table(LOG)
        );
        type LogRow = (
            i64,
            i64,
            i64,
            i64,
            Option<String>,
            i64,
            i64,
            Option<i64>,
            Option<String>,
        );
        let rows: Vec<LogRow> = match &self.pool {
            Pool::Postgres(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_all(p).await?,
            Pool::MySql(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_all(p).await?,
        };
        Ok(rows
            .into_iter()
            .map(
                |(spawn, seq, job, attempt, key, pid, start_us, end_us, outcome)| Delivery {
                    spawn,
                    seq,
                    job,
                    attempt,
                    key,
                    pid,
                    start_us,
                    end_us,
                    outcome,
                },
            )
            .collect())
    }

    /// The services' broker sessions now: PostgreSQL backend pids whose `application_name`
    /// is `{prefix}{spawn}`, with that spawn; MySQL/MariaDB connection ids whose database is
    /// the run's (the log pools and the parent connect without a default database), with the
    /// client's port, by which the parent finds the process.
    pub async fn broker_sessions(&self, prefix: &str) -> Result<Vec<Session>, BoxError> {
        Ok(match &self.pool {
            Pool::Postgres(p) => {
                let rows: Vec<(i32, String)> = sqlx::query_as(
                    "SELECT pid, application_name FROM pg_stat_activity WHERE datname = $1 \
                     AND application_name LIKE $2",
                )
                .bind(&self.name)
                .bind(format!("{prefix}%"))
                .fetch_all(p)
                .await?;
                rows.into_iter()
                    .map(|(pid, app)| {
                        let spawn = app.strip_prefix(prefix).and_then(|s| s.parse().ok());
                        Session {
                            id: i64::from(pid),
                            spawn,
                            port: None,
                        }
                    })
                    .collect()
            }
            Pool::MySql(p) => {
                let rows: Vec<(i64, String)> = sqlx::query_as(
                    "SELECT CAST(ID AS SIGNED), HOST FROM information_schema.PROCESSLIST \
                     WHERE DB = ?",
                )
                .bind(&self.name)
                .fetch_all(p)
                .await?;
                rows.into_iter()
                    .map(|(id, host)| Session {
                        id,
                        spawn: None,
                        port: host.rsplit_once(':').and_then(|(_, p)| p.parse().ok()),
                    })
                    .collect()
            }
        })
    }

    /// Kills a session on the server: `pg_terminate_backend`, `KILL CONNECTION`. Answers
    /// whether it was there to kill.
    pub async fn kill_session(&self, id: i64) -> Result<bool, BoxError> {
        match &self.pool {
            Pool::Postgres(p) => Ok(sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(id as i32)
                .fetch_one(p)
                .await?),
            Pool::MySql(p) => {
                match sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {id}")))
                    .execute(p)
                    .await
                {
                    Ok(_) => Ok(true),
                    // 1094, unknown thread id: it ended meanwhile.
                    Err(sqlx::Error::Database(e)) if e.message().contains("Unknown thread") => {
                        Ok(false)
                    }
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Opens a transaction that holds back vacuum (PostgreSQL: an xid and a snapshot) or
    /// purge (InnoDB: a consistent snapshot), having read the queue table, and keeps it open.
    pub async fn hold_transaction(&self) -> Result<Held, BoxError> {
        let table = self.table(TABLE);
        match &self.pool {
            Pool::Postgres(p) => {
                let mut c = p.acquire().await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT txid_current(); \
                     SELECT count(*) FROM {table}"
                )))
                .execute(&mut *c)
                .await?;
                Ok(Held::Postgres(c))
            }
            Pool::MySql(p) => {
                let mut c = p.acquire().await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "START TRANSACTION WITH CONSISTENT SNAPSHOT; SELECT COUNT(*) FROM {table}"
                )))
                .execute(&mut *c)
                .await?;
                Ok(Held::MySql(c))
            }
        }
    }

    /// What the services left on the server: sessions of the run's database other than the
    /// parent's (with their state: an open transaction shows), advisory locks (PostgreSQL),
    /// `GET_LOCK` locks of the keys and of the row lock form's marks (MySQL/MariaDB). One line
    /// each; empty when nothing is held.
    pub async fn leftovers(&self, keys: u64) -> Result<Vec<String>, BoxError> {
        let mut found = Vec::new();
        match &self.pool {
            Pool::Postgres(p) => {
                let sessions = sqlx::query(
                    "SELECT pid, COALESCE(application_name, ''), COALESCE(state, ''), \
                     backend_xid IS NOT NULL OR xact_start IS NOT NULL \
                     FROM pg_stat_activity WHERE datname = $1 AND application_name <> $2 \
                     AND pid <> pg_backend_pid()",
                )
                .bind(&self.name)
                .bind(&self.parent_app)
                .fetch_all(p)
                .await?;
                for r in sessions {
                    let pid: i32 = r.get(0);
                    let app: String = r.get(1);
                    let state: String = r.get(2);
                    let tx: bool = r.get(3);
                    found.push(format!(
                        "session {pid} ({app}) still open, state `{state}`{}",
                        if tx { ", in a transaction" } else { "" }
                    ));
                }
                let locks = sqlx::query(
                    "SELECT l.pid, l.classid::bigint, l.objid::bigint, l.objsubid::int, \
                     COALESCE(a.application_name, '') FROM pg_locks l \
                     LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
                     WHERE l.locktype = 'advisory' \
                     AND l.database = (SELECT oid FROM pg_database WHERE datname = $1) \
                     AND COALESCE(a.application_name, '') <> $2",
                )
                .bind(&self.name)
                .bind(&self.parent_app)
                .fetch_all(p)
                .await?;
                for r in locks {
                    let pid: Option<i32> = r.get(0);
                    let classid: Option<i64> = r.get(1);
                    let objid: Option<i64> = r.get(2);
                    let sub: Option<i32> = r.get(3);
                    let app: String = r.get(4);
                    found.push(format!(
                        "advisory lock ({classid:?}, {objid:?}, {sub:?}) held by session {pid:?} ({app})"
                    ));
                }
            }
            Pool::MySql(p) => {
                let sessions = sqlx::query(
                    "SELECT CAST(ID AS SIGNED), USER, COMMAND, COALESCE(STATE, '') \
                     FROM information_schema.PROCESSLIST WHERE DB = ?",
                )
                .bind(&self.name)
                .fetch_all(p)
                .await?;
                for r in sessions {
                    let id: i64 = r.get(0);
                    let user: String = r.get(1);
                    let command: String = r.get(2);
                    let state: String = r.get(3);
                    found.push(format!(
                        "session {id} ({user}) still open: {command} {state}"
                    ));
                }
                for k in 0..keys {
                    let name = mysql_lock_name(&self.name, &format!("{KEY_PREFIX}{k}"));
                    let holder: Option<i64> =
                        sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
                            .bind(&name)
                            .fetch_one(p)
                            .await?;
                    if let Some(holder) = holder {
                        found.push(format!("GET_LOCK `{name}` held by session {holder}"));
                    }
                }
                let marks: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT COUNT(*) FROM {} WHERE IS_USED_LOCK(SHA2(CONCAT('ruststream mark ', \
                     ?, '.', '{TABLE}', ' ', id), 256)) IS NOT NULL",
                    self.table(IDS)
                )))
                .bind(&self.name)
                .fetch_one(p)
                .await?;
                if marks > 0 {
                    found.push(format!("{marks} row lock marks (GET_LOCK) still held"));
                }
            }
        }
        Ok(found)
    }

    /// The server's version.
    pub async fn version(&self) -> Result<String, BoxError> {
        Ok(match &self.pool {
            Pool::Postgres(p) => sqlx::query_scalar("SELECT version()").fetch_one(p).await?,
            Pool::MySql(p) => sqlx::query_scalar("SELECT VERSION()").fetch_one(p).await?,
        })
    }

    /// Closes the parent's pool.
    pub async fn close(&self) {
        match &self.pool {
            Pool::Postgres(p) => p.close().await,
            Pool::MySql(p) => p.close().await,
        }
    }
}

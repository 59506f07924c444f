//! The harness of the conformance suite on PostgreSQL through sqlx, under sqlx's prepared
//! statements (`conformance_postgres`) or the simple query protocol
//! (`conformance_postgres_simple`).

use ruststream::BrokerHandle;
use ruststream_conformance::session::Session;
use ruststream_conformance::urls::{
    self, database_of, search_path_of, with_database, with_search_path,
};
use ruststream_conformance::{
    Capabilities, ClaimFuture, Harness, HarnessFuture, HarnessResult, HeldKey, RowLocks, Support,
};
use ruststream_core::Dialect;
use ruststream_core::Value;
use ruststream_core::keys::POSTGRES_KEY_HASH_SQL;
use ruststream_sqlx::SqlxBroker;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgConnection, PgPoolOptions, PgRow, PgTypeInfo, Postgres};
use sqlx::{AssertSqlSafe, Connection, Row, TypeInfo, ValueRef};

use crate::common::{ACQUIRE, POOL, Query, SqlxSession, first_column};

/// PostgreSQL on sqlx: the database `<database>_cf_sqlx` beside the URL's (created when
/// missing), and in it the schema `<table>_<pid>` per scenario, on the search path of every
/// session the locator opens (the broker's and the harness's own); the schema is dropped once
/// the scenario passed.
#[derive(Clone, Debug)]
pub struct SqlxPostgresHarness {
    url: String,
    database: String,
    /// The brokers run every statement under the simple query protocol.
    simple: bool,
}

impl Default for SqlxPostgresHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl SqlxPostgresHarness {
    /// The harness on `RUSTSTREAM_PG_URL`, in the database `<url's database>_cf_sqlx`.
    pub fn new() -> Self {
        let url = urls::postgres();
        let database = format!("{}_cf_sqlx", database_of(&url).unwrap_or("postgres"));
        Self {
            url,
            database,
            simple: false,
        }
    }

    /// The same harness, its brokers under the simple query protocol
    /// (`SqlxBroker::simple_query`), in the database `<url's database>_cf_sqlx_simple`: a
    /// PostgreSQL advisory lock belongs to the database, so its keys are not those of the
    /// suite under prepared statements, which may run at once.
    #[allow(
        dead_code,
        reason = "only the target conformance_postgres_simple uses it"
    )]
    pub fn simple_query(mut self) -> Self {
        self.database.push_str("_simple");
        self.simple = true;
        self
    }

    /// The URL of the harness's database.
    fn database_url(&self) -> String {
        with_database(&self.url, &self.database)
    }

    /// Creates the harness's database unless it exists.
    async fn ensure_database(&self) -> HarnessResult<()> {
        let mut conn = connect(&self.url).await?;
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
async fn connect(url: &str) -> HarnessResult<PgConnection> {
    PgConnection::connect(url).await.map_err(|e| {
        format!(
            "cannot reach PostgreSQL at {url} (set {}): {e}",
            urls::PG_URL_VAR
        )
        .into()
    })
}

/// [`POSTGRES_KEY_HASH_SQL`] of the first bind: the key's lock as the server computes it.
fn key_hash() -> String {
    POSTGRES_KEY_HASH_SQL.replace("{key}", "CAST($1 AS TEXT)")
}

/// An advisory key held on a session of the harness's own.
struct Held {
    conn: PgConnection,
    key: String,
}

impl HeldKey for Held {
    fn release(self: Box<Self>) -> HarnessFuture<'static, ()> {
        Box::pin(async move {
            let Held { mut conn, key } = *self;
            let released: bool = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT pg_advisory_unlock({})",
                key_hash()
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
        if self.simple {
            "sqlx on PostgreSQL (simple query protocol)"
        } else {
            "sqlx on PostgreSQL"
        }
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            hold_key: Support::Yes,
            kill_connection: Support::Yes,
            kill_process: Support::Yes,
            claim_in_lease: Support::Yes,
        }
    }

    fn prepare<'a>(&'a self, table: &'a str) -> HarnessFuture<'a, String> {
        Box::pin(async move {
            self.ensure_database().await?;
            let schema = format!("{table}_{}", std::process::id());
            let url = self.database_url();
            let mut conn = connect(&url).await?;
            sqlx::raw_sql(AssertSqlSafe(format!(
                "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            )))
            .execute(&mut conn)
            .await?;
            conn.close().await?;
            Ok(with_search_path(&url, &schema))
        })
    }

    fn broker(&self, db: &str) -> BrokerHandle<SqlxBroker<Postgres>> {
        let pool = PgPoolOptions::new()
            .max_connections(POOL)
            .acquire_timeout(ACQUIRE);
        SqlxBroker::from_url(db, pool)
            .simple_query(self.simple)
            .handle()
    }

    fn publish_in_transaction<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
        sql: &'a str,
        messages: Vec<ruststream::Message>,
        end: ruststream_conformance::TxEnd,
    ) -> HarnessFuture<'a, ruststream::Published> {
        Box::pin(async move {
            let conn = connect(db).await?;
            crate::common::publish_in_transaction::<Postgres, T>(conn, sql, messages, end).await
        })
    }

    fn publish_without_broker<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
        messages: Vec<ruststream::Message>,
    ) -> HarnessFuture<'a, ruststream::Published> {
        Box::pin(crate::common::publish_without_broker::<Postgres, T>(
            db, messages,
        ))
    }

    fn outbox_stats<'a, T: ruststream_conformance::SuiteRow>(
        &'a self,
        db: &'a str,
    ) -> HarnessFuture<'a, ruststream::Stats> {
        Box::pin(crate::common::outbox_stats::<Postgres, T>(db))
    }

    fn execute<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, ()> {
        Box::pin(async move {
            let mut conn = connect(db).await?;
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&mut conn)
                .await?;
            conn.close().await?;
            Ok(())
        })
    }

    fn session<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, Box<dyn Session>> {
        Box::pin(async move {
            let session = SqlxSession::<Postgres> {
                conn: connect(db).await?,
                bind: pg_bind,
                value: pg_value,
                affected: |done| done.rows_affected(),
            };
            Ok(Box::new(session) as Box<dyn Session>)
        })
    }

    fn query_i64s<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, Vec<i64>> {
        Box::pin(async move {
            let mut conn = connect(db).await?;
            let rows = sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .fetch_all(&mut conn)
                .await?;
            conn.close().await?;
            first_column(&rows, sql)
        })
    }

    fn hold_key<'a>(&'a self, db: &'a str, key: &'a str) -> HarnessFuture<'a, Box<dyn HeldKey>> {
        Box::pin(async move {
            let mut conn = connect(db).await?;
            let taken: bool = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT pg_try_advisory_lock({})",
                key_hash()
            )))
            .bind(key)
            .fetch_one(&mut conn)
            .await?;
            if !taken {
                return Err(format!("{key} is held by another session").into());
            }
            Ok(Box::new(Held {
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
                key_hash()
            );
            let mut conn = connect(db).await?;
            let killed: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
                .bind(key)
                .fetch_one(&mut conn)
                .await?;
            conn.close().await?;
            Ok(killed > 0)
        })
    }

    fn write_in_claim<'a>(
        ctx: &'a mut ruststream::Context<'_, ruststream::InboxContext>,
        sql: String,
    ) -> ClaimFuture<'a> {
        Box::pin(crate::common::write_in_claim::<Postgres>(ctx, sql))
    }

    fn cleanup<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, ()> {
        Box::pin(async move {
            if let Some(schema) = search_path_of(db) {
                let mut conn = connect(&self.database_url()).await?;
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

/// A `NULL` of no declared type: PostgreSQL infers the parameter's type from where it stands.
struct UntypedNull;

impl sqlx::Type<Postgres> for UntypedNull {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(Oid(0))
    }
}

impl sqlx::Encode<'_, Postgres> for UntypedNull {
    fn encode_by_ref(
        &self,
        _: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        Ok(sqlx::encode::IsNull::Yes)
    }
}

fn pg_bind(query: Query<'_, Postgres>, value: Value) -> Query<'_, Postgres> {
    match value {
        Value::Null => query.bind(UntypedNull),
        Value::Bool(b) => query.bind(b),
        Value::Int(i) => query.bind(i),
        Value::Text(t) => query.bind(t),
        Value::Bytes(b) => query.bind(b),
    }
}

/// A column as the core's value: integers, booleans and `bytea` as themselves, any other
/// type as its text where it reads as text (a time reads as its type's name).
fn pg_value(row: &PgRow, i: usize) -> HarnessResult<Value> {
    let raw = row.try_get_raw(i)?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let ty = raw.type_info().name().to_owned();
    Ok(match ty.as_str() {
        "INT2" => Value::Int(row.try_get::<i16, _>(i)?.into()),
        "INT4" => Value::Int(row.try_get::<i32, _>(i)?.into()),
        "INT8" => Value::Int(row.try_get::<i64, _>(i)?),
        "BOOL" => Value::Bool(row.try_get::<bool, _>(i)?),
        "BYTEA" => Value::Bytes(row.try_get::<Vec<u8>, _>(i)?),
        _ => Value::Text(row.try_get::<String, _>(i).unwrap_or(ty)),
    })
}

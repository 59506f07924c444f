//! A throwaway PostgreSQL schema for a test: a schema of its own on the server a URL names,
//! every connection of its pools and brokers working in it (`search_path`), so tests that run
//! side by side on one database do not meet each other's tables. See [`ruststream::testing`]
//! for running a service on it until its rows settle.

use std::sync::atomic::{AtomicUsize, Ordering};

use ruststream::InboxTable;
use ruststream::core::spec::Described;
use ruststream::core::{Ddl, Dialect};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Postgres};

use crate::SqlxBroker;

/// A schema of its own, `ruststream_test_<pid>_<n>`; [`PgSchema::drop`] removes it and its
/// tables.
#[derive(Debug, Clone)]
pub struct PgSchema {
    name: String,
    options: PgConnectOptions,
}

impl PgSchema {
    /// Creates the schema on the database `url` names (dropping one of the same name that a
    /// crashed test left).
    pub async fn create(url: &str) -> Result<Self, sqlx::Error> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("ruststream_test_{}_{n}", std::process::id());
        let options: PgConnectOptions = url.parse()?;
        let mut conn = PgConnection::connect_with(&options).await?;
        let sql = format!("DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}");
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut conn).await?;
        conn.close().await?;
        let options = options.options([("search_path", name.as_str())]);
        Ok(Self { name, options })
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connect options whose sessions work in the schema.
    pub fn connect_options(&self) -> PgConnectOptions {
        self.options.clone()
    }

    /// A pool of `max` connections working in the schema.
    pub async fn pool(&self, max: u32) -> Result<PgPool, sqlx::Error> {
        PgPoolOptions::new()
            .max_connections(max)
            .connect_with(self.connect_options())
            .await
    }

    /// Creates `T`'s table in the schema, as its description writes it.
    pub async fn create_table<T: InboxTable>(&self) -> Result<(), sqlx::Error> {
        let ddl = Ddl::new(Dialect::Postgres, T::TABLE.table_desc()).to_string();
        let mut conn = PgConnection::connect_with(&self.options).await?;
        sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut conn).await?;
        conn.close().await
    }

    /// A broker on the schema; it builds its pool when its service starts.
    pub fn broker(&self) -> SqlxBroker<Postgres> {
        SqlxBroker::from_connect_options(self.connect_options(), PgPoolOptions::new())
    }

    /// Drops the schema and everything in it.
    pub async fn drop(self) -> Result<(), sqlx::Error> {
        let mut conn = PgConnection::connect_with(&self.options).await?;
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut conn).await?;
        conn.close().await
    }
}

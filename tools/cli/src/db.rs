//! A connection to the database a URL names, running the core's statements.

use ruststream_core::{Dialect, Reply, Statement, Value};
use ruststream_sqlx::SqlxDatabase;
use sqlx::pool::PoolOptions;
use sqlx::{Database, Pool};

/// A pool of one database.
pub enum Db {
    /// PostgreSQL.
    Postgres(Pool<sqlx::Postgres>),
    /// MySQL or MariaDB.
    MySql(Pool<sqlx::MySql>, Dialect),
    /// SQLite.
    Sqlite(Pool<sqlx::Sqlite>),
}

fn pool<DB: Database>() -> PoolOptions<DB> {
    PoolOptions::new()
        .max_connections(2)
        .acquire_timeout(std::time::Duration::from_secs(10))
}

impl Db {
    /// Connects to `url`: `postgres://`, `mysql://` (MySQL or MariaDB) or `sqlite://`.
    pub async fn connect(url: &str) -> Result<Db, String> {
        let failed = |e: sqlx::Error| format!("cannot connect to `{}`: {e}", redact(url));
        let scheme = url.split(':').next().unwrap_or_default();
        match scheme {
            "postgres" | "postgresql" => {
                Ok(Db::Postgres(pool().connect(url).await.map_err(failed)?))
            }
            "mysql" | "mariadb" => {
                let pool: Pool<sqlx::MySql> = pool().connect(url).await.map_err(failed)?;
                let mut conn = pool.acquire().await.map_err(failed)?;
                let dialect = <sqlx::MySql as SqlxDatabase>::dialect(&mut conn)
                    .await
                    .map_err(|e| format!("`{}`: {e}", redact(url)))?;
                drop(conn);
                Ok(Db::MySql(pool, dialect))
            }
            "sqlite" => Ok(Db::Sqlite(pool().connect(url).await.map_err(failed)?)),
            other => Err(format!(
                "`{}`: the scheme `{other}` is not postgres://, mysql:// or sqlite://",
                redact(url)
            )),
        }
    }

    /// The server's dialect.
    pub fn dialect(&self) -> Dialect {
        match self {
            Db::Postgres(_) => Dialect::Postgres,
            Db::MySql(_, dialect) => *dialect,
            Db::Sqlite(_) => Dialect::Sqlite,
        }
    }

    /// Runs `statement` with `binds`: the values of its rows, or the rows it changed.
    pub async fn run(&self, statement: &Statement, binds: Vec<Value>) -> Result<Ran, String> {
        match self {
            Db::Postgres(pool) => run_on(pool, statement, binds).await,
            Db::MySql(pool, _) => run_on(pool, statement, binds).await,
            Db::Sqlite(pool) => run_on(pool, statement, binds).await,
        }
    }
}

/// What a statement answered.
pub enum Ran {
    /// The values of its rows.
    Rows(Vec<Vec<Value>>),
    /// The rows it changed.
    Affected(u64),
}

async fn run_on<DB: SqlxDatabase>(
    pool: &Pool<DB>,
    statement: &Statement,
    binds: Vec<Value>,
) -> Result<Ran, String> {
    let mut conn = pool.acquire().await.map_err(|e| e.to_string())?;
    match DB::run(&mut conn, statement, binds, false).await {
        Ok(Reply::Rows(rows)) => Ok(Ran::Rows(rows.into_iter().map(|r| r.values).collect())),
        Ok(Reply::Affected(n)) => Ok(Ran::Affected(n)),
        Ok(Reply::Failed(error)) | Err(error) => Err(error.to_string()),
        Ok(_) => Ok(Ran::Affected(0)),
    }
}

/// The URL without its password.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user = &url[scheme + 3..at];
            match user.split_once(':') {
                Some((name, _)) => format!("{}{name}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_password_is_not_printed() {
        assert_eq!(
            super::redact("postgres://app:secret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(
            super::redact("mysql://root@127.0.0.1/test"),
            "mysql://root@127.0.0.1/test"
        );
    }
}

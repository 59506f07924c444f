//! The DDL of the suite's tables and the SQL of its assertions, per dialect.
//!
//! Every table has the same columns, whatever its form: `id`, `k` (the column the advisory key
//! reads), `attempt`, `payload`, and where its form or settlement needs them `locked_until`
//! and `processed_at`. Times are SQLite `INTEGER` microseconds, PostgreSQL `TIMESTAMPTZ`,
//! MySQL and MariaDB `DATETIME(6)` (UTC), as the core writes them. `id` and `attempt` are
//! `BIGINT` (SQLite `INTEGER`): the row types read both as `i64`, with serde, `sqlx::FromRow`
//! and mysql_async's `FromRow` alike.
//!
//! The claim order of every table is its id, the primary key, and no table has a due column:
//! on InnoDB a claim's `FOR UPDATE` walks the primary key and locks only the rows it reads up
//! to the ones it takes, so the tables need no index beside it.
//!
//! Beside its table `t`, a scenario has `t_log` (what a handler in a child process marks) and,
//! in the custom lock form, `t_held_keys` (the `held_keys` of [custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks), with the session that took
//! each key) and `t_lock_log` (every key the custom lock took, with its session). The custom
//! lock's statements on them are here too ([`lock_statements`]): each adapter's lock runs them
//! on its own connection type.

use ruststream_core::Dialect;

use crate::Form;

/// The table a scenario creates, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableSpec {
    /// The table's name.
    pub name: &'static str,
    /// Its form: the lease form has `locked_until`, the custom lock form its `held_keys`.
    pub form: Form,
    /// Whether it has `processed_at`.
    pub processed: bool,
    /// Whether it keeps failed rows: `due_at` (in the past unless written: a row inserted by
    /// hand is due), `failed_at`, `error` and `errors`, and an index on `(due_at, id)`, the claim
    /// order.
    pub failing: bool,
}

/// The column of the custom lock's `held_keys` table, quoted for the dialect (`key` is a
/// reserved word of MySQL).
pub fn key_column(dialect: Dialect) -> String {
    dialect.quote("key")
}

/// The name of the table of keys the custom lock holds, beside `table`.
pub fn held_keys(table: &str) -> String {
    format!("{table}_held_keys")
}

/// The name of the table where the custom lock logs every key it takes, beside `table`.
pub fn lock_log(table: &str) -> String {
    format!("{table}_lock_log")
}

/// The name of the table where a handler marks what it started, beside `table`.
pub fn log(table: &str) -> String {
    format!("{table}_log")
}

/// The statements that drop every table of `spec`, if it exists.
pub fn drop(spec: &TableSpec) -> Vec<String> {
    [
        spec.name.to_owned(),
        log(spec.name),
        held_keys(spec.name),
        lock_log(spec.name),
    ]
    .iter()
    .map(|t| format!("DROP TABLE IF EXISTS {t}"))
    .collect()
}

/// The columns of a table whose rows may fail: due, failed_at, error and the errors history.
fn failing_columns(dialect: Dialect, time: &str) -> [String; 4] {
    let due = match dialect {
        Dialect::Sqlite => "INTEGER NOT NULL DEFAULT 0",
        Dialect::Postgres => "TIMESTAMPTZ NOT NULL DEFAULT 'epoch'",
        Dialect::MySql | Dialect::MariaDb => "DATETIME(6) NOT NULL DEFAULT '1970-01-02 00:00:00'",
    };
    let (error, errors) = match dialect {
        Dialect::Postgres => ("TEXT", "JSONB"),
        Dialect::MySql | Dialect::MariaDb => ("TEXT NULL", "JSON NULL"),
        Dialect::Sqlite => ("TEXT", "TEXT"),
    };
    [
        format!("due_at {due}"),
        format!("failed_at {time}"),
        format!("error {error}"),
        format!("errors {errors}"),
    ]
}

/// The statements that create every table of `spec`, one statement each.
pub fn create(dialect: Dialect, spec: &TableSpec) -> Vec<String> {
    let (id, int, bytes, time, text, suffix) = match dialect {
        Dialect::Sqlite => (
            "INTEGER PRIMARY KEY AUTOINCREMENT",
            "INTEGER",
            "BLOB",
            "INTEGER",
            "TEXT",
            "",
        ),
        Dialect::Postgres => (
            "BIGSERIAL PRIMARY KEY",
            "BIGINT",
            "BYTEA",
            "TIMESTAMPTZ",
            "TEXT",
            "",
        ),
        Dialect::MySql | Dialect::MariaDb => (
            "BIGINT AUTO_INCREMENT PRIMARY KEY",
            "BIGINT",
            "LONGBLOB",
            "DATETIME(6) NULL",
            "VARCHAR(255)",
            " ENGINE=InnoDB",
        ),
    };
    let mut columns = vec![
        format!("id {id}"),
        format!("k {int} NOT NULL DEFAULT 0"),
        format!("attempt {int} NOT NULL DEFAULT 0"),
        format!("payload {bytes}"),
    ];
    if spec.form == Form::Lease {
        columns.push(format!("locked_until {time}"));
    }
    if spec.processed {
        columns.push(format!("processed_at {time}"));
    }
    if spec.failing {
        columns.extend(failing_columns(dialect, time));
    }
    let key = key_column(dialect);
    let mut out = vec![format!(
        "CREATE TABLE {} ({}){suffix}",
        spec.name,
        columns.join(", ")
    )];
    if spec.failing {
        out.push(format!(
            "CREATE INDEX {0}_due ON {0} (due_at, id)",
            spec.name
        ));
    }
    out.push(format!(
        "CREATE TABLE {} (n {int} NOT NULL, attempt {int} NOT NULL){suffix}",
        log(spec.name)
    ));
    if spec.form == Form::Custom {
        out.push(format!(
            "CREATE TABLE {} ({key} {text} NOT NULL PRIMARY KEY, session {int}){suffix}",
            held_keys(spec.name)
        ));
        out.push(format!(
            "CREATE TABLE {} ({key} {text} NOT NULL, session {int} NOT NULL){suffix}",
            lock_log(spec.name)
        ));
    }
    out
}

/// The statements of the suite's custom lock ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)) on the `held_keys` of `table`, in the
/// dialect's placeholders. Each binds one value, the key's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockStatements {
    /// Run first, on every lock, where the session needs it: on SQLite it gives the connection
    /// a random number in a temporary table, which lives as long as the connection.
    pub session: Option<&'static str>,
    /// Takes the key unless it is held, recording the session that took it: one row affected
    /// where it took the key, none where the key is held.
    pub take: String,
    /// Logs a take in the lock log, with its session: run after a take that took the key.
    pub log: String,
    /// Releases the key: one row affected where it was held.
    pub release: String,
}

/// The custom lock's statements on `table`'s `held_keys` and lock log. The session is the
/// server's id of the connection (PostgreSQL `pg_backend_pid()`, MySQL and MariaDB
/// `CONNECTION_ID()`) or, on SQLite, the random number [`LockStatements::session`] keeps.
pub fn lock_statements(dialect: Dialect, table: &str) -> LockStatements {
    let (held, log, key) = (held_keys(table), lock_log(table), key_column(dialect));
    match dialect {
        Dialect::Postgres => LockStatements {
            session: None,
            take: format!(
                "INSERT INTO {held} ({key}, session) VALUES ($1, pg_backend_pid()) \
                 ON CONFLICT DO NOTHING"
            ),
            log: format!("INSERT INTO {log} ({key}, session) VALUES ($1, pg_backend_pid())"),
            release: format!("DELETE FROM {held} WHERE {key} = $1"),
        },
        Dialect::MySql | Dialect::MariaDb => LockStatements {
            session: None,
            take: format!("INSERT IGNORE INTO {held} ({key}, session) VALUES (?, CONNECTION_ID())"),
            log: format!("INSERT INTO {log} ({key}, session) VALUES (?, CONNECTION_ID())"),
            release: format!("DELETE FROM {held} WHERE {key} = ?"),
        },
        Dialect::Sqlite => {
            let session = "(SELECT id FROM temp.cf_session)";
            LockStatements {
                session: Some(
                    "CREATE TEMP TABLE IF NOT EXISTS cf_session AS SELECT abs(random()) AS id",
                ),
                take: format!(
                    "INSERT OR IGNORE INTO {held} ({key}, session) VALUES (?1, {session})"
                ),
                log: format!("INSERT INTO {log} ({key}, session) VALUES (?1, {session})"),
                release: format!("DELETE FROM {held} WHERE {key} = ?1"),
            }
        }
    }
}

/// `bytes` as a literal of the dialect's binary type.
pub fn bytes_literal(dialect: Dialect, bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    match dialect {
        Dialect::Postgres => format!("decode('{hex}', 'hex')"),
        Dialect::Sqlite | Dialect::MySql | Dialect::MariaDb => format!("X'{hex}'"),
    }
}

/// A time column as microseconds since the Unix epoch, `NULL` as -1: the inverse of how the
/// core writes times.
pub fn micros(dialect: Dialect, column: &str) -> String {
    match dialect {
        Dialect::Sqlite => format!("COALESCE({column}, -1)"),
        Dialect::Postgres => {
            format!("COALESCE(CAST(EXTRACT(EPOCH FROM {column}) * 1000000 AS BIGINT), -1)")
        }
        Dialect::MySql | Dialect::MariaDb => format!(
            "COALESCE(TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', {column}), -1)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ddl_per_dialect() {
        let spec = TableSpec {
            name: "cf_t_lease",
            form: Form::Lease,
            processed: true,
            failing: false,
        };
        let sqlite = create(Dialect::Sqlite, &spec);
        assert_eq!(
            sqlite[0],
            "CREATE TABLE cf_t_lease (id INTEGER PRIMARY KEY AUTOINCREMENT, k INTEGER NOT NULL DEFAULT 0, attempt INTEGER NOT NULL DEFAULT 0, payload BLOB, locked_until INTEGER, processed_at INTEGER)"
        );
        let pg = create(Dialect::Postgres, &spec);
        assert_eq!(
            pg[0],
            "CREATE TABLE cf_t_lease (id BIGSERIAL PRIMARY KEY, k BIGINT NOT NULL DEFAULT 0, attempt BIGINT NOT NULL DEFAULT 0, payload BYTEA, locked_until TIMESTAMPTZ, processed_at TIMESTAMPTZ)"
        );
        let custom = TableSpec {
            name: "cf_t_custom",
            form: Form::Custom,
            processed: false,
            failing: false,
        };
        let maria = create(Dialect::MariaDb, &custom);
        assert_eq!(
            maria[0],
            "CREATE TABLE cf_t_custom (id BIGINT AUTO_INCREMENT PRIMARY KEY, k BIGINT NOT NULL DEFAULT 0, attempt BIGINT NOT NULL DEFAULT 0, payload LONGBLOB) ENGINE=InnoDB"
        );
        assert_eq!(
            maria[2],
            "CREATE TABLE cf_t_custom_held_keys (`key` VARCHAR(255) NOT NULL PRIMARY KEY, session BIGINT) ENGINE=InnoDB"
        );
        assert_eq!(drop(&custom).len(), 4);
        let failing = TableSpec {
            name: "cf_t_row_lock",
            form: Form::RowLock,
            processed: false,
            failing: true,
        };
        let pg = create(Dialect::Postgres, &failing);
        assert_eq!(
            pg[0],
            "CREATE TABLE cf_t_row_lock (id BIGSERIAL PRIMARY KEY, k BIGINT NOT NULL DEFAULT 0, attempt BIGINT NOT NULL DEFAULT 0, payload BYTEA, due_at TIMESTAMPTZ NOT NULL DEFAULT 'epoch', failed_at TIMESTAMPTZ, error TEXT, errors JSONB)"
        );
        assert_eq!(
            pg[1],
            "CREATE INDEX cf_t_row_lock_due ON cf_t_row_lock (due_at, id)"
        );
    }

    #[test]
    fn lock_statements_per_dialect() {
        let pg = lock_statements(Dialect::Postgres, "cf_t_custom");
        assert_eq!(pg.session, None);
        assert_eq!(
            pg.take,
            "INSERT INTO cf_t_custom_held_keys (\"key\", session) VALUES ($1, pg_backend_pid()) ON CONFLICT DO NOTHING"
        );
        assert_eq!(
            pg.release,
            "DELETE FROM cf_t_custom_held_keys WHERE \"key\" = $1"
        );
        let maria = lock_statements(Dialect::MariaDb, "cf_t_custom");
        assert_eq!(
            maria.log,
            "INSERT INTO cf_t_custom_lock_log (`key`, session) VALUES (?, CONNECTION_ID())"
        );
        let sqlite = lock_statements(Dialect::Sqlite, "cf_t_custom");
        assert!(sqlite.session.is_some());
        assert_eq!(
            sqlite.take,
            "INSERT OR IGNORE INTO cf_t_custom_held_keys (\"key\", session) VALUES (?1, (SELECT id FROM temp.cf_session))"
        );
    }

    #[test]
    fn literals() {
        assert_eq!(bytes_literal(Dialect::Sqlite, b"{}"), "X'7b7d'");
        assert_eq!(
            bytes_literal(Dialect::Postgres, b"{}"),
            "decode('7b7d', 'hex')"
        );
    }
}

//! What a server says about itself, read into the core's terms: its version into the
//! [`Dialect`] the queue speaks to it (or why it cannot serve the queue), and its error codes
//! into the portable [`ErrorKind`].
//!
//! Every adapter reads its driver's version text and error codes through these functions, so
//! two adapters on one server agree on what it is and on what its errors mean. Which driver
//! type carries the code stays the adapter's business; what the code means is decided here.
//!
//! | server | oldest version | why |
//! |---|---|---|
//! | PostgreSQL | 9.5 | `FOR UPDATE SKIP LOCKED` |
//! | MySQL | 8.0.1 | `FOR UPDATE SKIP LOCKED` |
//! | MariaDB | 10.6 | `FOR UPDATE SKIP LOCKED` |
//! | SQLite | 3.35 | `RETURNING` |

use crate::dialect::Dialect;
use crate::value::ErrorKind;

/// The server family a driver reaches. Its version text tells the rest: a MySQL driver may
/// find MySQL or MariaDB.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Server {
    /// PostgreSQL.
    Postgres,
    /// MySQL or MariaDB, told apart by the version text.
    MySql,
    /// SQLite.
    Sqlite,
}

/// The oldest version of a server the queue runs on, and what it needs of that version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Minimum {
    /// The dialect of the server.
    pub dialect: Dialect,
    /// The oldest version: major, minor, patch.
    pub version: (u32, u32, u32),
    /// The oldest version as the server's documentation writes it.
    pub text: &'static str,
    /// What the queue needs that older versions lack.
    pub reason: &'static str,
}

/// The oldest version of each dialect's server.
pub const MINIMUMS: [Minimum; 4] = [
    Minimum {
        dialect: Dialect::Postgres,
        version: (9, 5, 0),
        text: "9.5",
        reason: "FOR UPDATE SKIP LOCKED",
    },
    Minimum {
        dialect: Dialect::MySql,
        version: (8, 0, 1),
        text: "8.0.1",
        reason: "FOR UPDATE SKIP LOCKED",
    },
    Minimum {
        dialect: Dialect::MariaDb,
        version: (10, 6, 0),
        text: "10.6",
        reason: "FOR UPDATE SKIP LOCKED",
    },
    Minimum {
        dialect: Dialect::Sqlite,
        version: (3, 35, 0),
        text: "3.35",
        reason: "RETURNING",
    },
];

/// The oldest version of `dialect`'s server.
pub fn minimum(dialect: Dialect) -> Minimum {
    MINIMUMS
        .into_iter()
        .find(|m| m.dialect == dialect)
        .expect("MINIMUMS lists every dialect")
}

/// Why a server does not serve the queue.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VersionError {
    /// The server is older than the queue needs.
    #[error(
        "{server} {version} is too old: ruststream needs {server} {minimum} or later ({reason})"
    )]
    TooOld {
        /// The server, as its dialect names it: `PostgreSQL`, `MySQL`, `MariaDB`, `SQLite`.
        server: &'static str,
        /// The version the server gave.
        version: String,
        /// The oldest version the queue runs on.
        minimum: &'static str,
        /// What the queue needs that the server lacks.
        reason: &'static str,
    },
    /// The version the server gave does not read as one.
    #[error("the {server} server gave the version `{version}`, which does not read as a version")]
    Unreadable {
        /// The server family.
        server: &'static str,
        /// The text the server gave.
        version: String,
    },
}

/// The dialect of a server by the version text it gives (`SHOW server_version_num`,
/// `SELECT VERSION()`, `sqlite_version()`), or why it does not serve the queue: the oldest
/// versions are [`MINIMUMS`] (PostgreSQL 9.5, MySQL 8.0.1, MariaDB 10.6, SQLite 3.35).
pub fn dialect_of(server: Server, version: &str) -> Result<Dialect, VersionError> {
    let text = version.trim();
    let dialect = match server {
        Server::Postgres => Dialect::Postgres,
        Server::Sqlite => Dialect::Sqlite,
        Server::MySql if text.to_ascii_lowercase().contains("mariadb") => Dialect::MariaDb,
        Server::MySql => Dialect::MySql,
    };
    let numbers = match dialect {
        Dialect::MariaDb => text.strip_prefix("5.5.5-").unwrap_or(text),
        _ => text,
    };
    let unreadable = || VersionError::Unreadable {
        server: match server {
            Server::Postgres => "PostgreSQL",
            Server::MySql => "MySQL/MariaDB",
            Server::Sqlite => "SQLite",
        },
        version: text.to_owned(),
    };
    let found = match dialect {
        Dialect::Postgres => postgres_version(numbers),
        _ => dotted(numbers),
    }
    .ok_or_else(unreadable)?;
    let least = minimum(dialect);
    if found < least.version {
        return Err(VersionError::TooOld {
            server: dialect.name(),
            version: text.to_owned(),
            minimum: least.text,
            reason: least.reason,
        });
    }
    Ok(dialect)
}

/// `major.minor.patch` at the start of `text`; missing parts are zero.
fn dotted(text: &str) -> Option<(u32, u32, u32)> {
    let end = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let mut parts = text[..end].split('.').map(|p| p.parse::<u32>());
    let major = parts.next()?.ok()?;
    let mut next = || parts.next().and_then(Result::ok).unwrap_or(0);
    Some((major, next(), next()))
}

/// PostgreSQL's version: `server_version_num` (five digits or more: `90624` is 9.6.24,
/// `160002` is 16.2) or the dotted `server_version`.
fn postgres_version(text: &str) -> Option<(u32, u32, u32)> {
    if text.len() >= 5 && text.bytes().all(|b| b.is_ascii_digit()) {
        let n: u32 = text.parse().ok()?;
        return Some(if n >= 100_000 {
            (n / 10_000, n % 10_000, 0)
        } else {
            (n / 10_000, n / 100 % 100, n % 100)
        });
    }
    dotted(text)
}

/// The kind of a SQLSTATE, PostgreSQL's (and the standard's) five-character error code; also
/// the fallback of MySQL and MariaDB errors ([`mysql_error_kind`]).
pub fn sqlstate_kind(sqlstate: &str) -> ErrorKind {
    // | SQLSTATE | kind |
    // |---|---|
    // | `40001` serialization failure, `40P01` deadlock detected | [`ErrorKind::Serialization`] |
    // | `42P01` undefined table; `42S02` (MySQL's) | [`ErrorKind::UndefinedTable`] |
    // | `42703` undefined column; `42S22` (MySQL's) | [`ErrorKind::UndefinedColumn`] |
    // | `57014` query canceled (`statement_timeout`, or a cancel request) | [`ErrorKind::Timeout`] |
    // | class `08` connection exception; `57P01` admin shutdown, `57P02` crash shutdown, `57P03` cannot connect now | [`ErrorKind::ConnectionLost`] |
    // | `28000` invalid authorization, `28P01` invalid password | [`ErrorKind::Authentication`] |
    // | `42501` insufficient privilege | [`ErrorKind::Privilege`] |
    // | `42P05` duplicate prepared statement, `26000` invalid statement name | [`ErrorKind::PreparedStatement`] |
    // | `3D000` invalid catalog name (no such database) | [`ErrorKind::Config`] |
    // | anything else | [`ErrorKind::Other`] |
    match sqlstate {
        "40001" | "40P01" => ErrorKind::Serialization,
        "42P01" | "42S02" => ErrorKind::UndefinedTable,
        "42703" | "42S22" => ErrorKind::UndefinedColumn,
        "57014" => ErrorKind::Timeout,
        "28000" | "28P01" => ErrorKind::Authentication,
        "42501" => ErrorKind::Privilege,
        "42P05" | "26000" => ErrorKind::PreparedStatement,
        "3D000" => ErrorKind::Config,
        "57P01" | "57P02" | "57P03" => ErrorKind::ConnectionLost,
        code if code.starts_with("08") => ErrorKind::ConnectionLost,
        _ => ErrorKind::Other,
    }
}

/// The kind of a MySQL or MariaDB error by its number, and by its SQLSTATE
/// ([`sqlstate_kind`]) where the number is none of the known ones.
pub fn mysql_error_kind(number: u16, sqlstate: Option<&str>) -> ErrorKind {
    // | number | kind |
    // |---|---|
    // | 1213 `ER_LOCK_DEADLOCK`, 1205 `ER_LOCK_WAIT_TIMEOUT` | [`ErrorKind::Serialization`] |
    // | 1146 `ER_NO_SUCH_TABLE` | [`ErrorKind::UndefinedTable`] |
    // | 1054 `ER_BAD_FIELD_ERROR` | [`ErrorKind::UndefinedColumn`] |
    // | 1317 `ER_QUERY_INTERRUPTED` (`KILL QUERY`), 3024 `ER_QUERY_TIMEOUT` (MySQL's `max_execution_time`), 1969 `ER_STATEMENT_TIMEOUT` (MariaDB's `max_statement_time`) | [`ErrorKind::Timeout`] |
    // | 1053 `ER_SERVER_SHUTDOWN`, 1927 `ER_CONNECTION_KILLED` (MariaDB), 4031 `ER_CLIENT_INTERACTION_TIMEOUT` (MySQL), 1158..1161 network read and write errors; 2006 `CR_SERVER_GONE_ERROR` and 2013 `CR_SERVER_LOST` (the client library's) | [`ErrorKind::ConnectionLost`] |
    // | 1045 `ER_ACCESS_DENIED_ERROR`, 1044 `ER_DBACCESS_DENIED_ERROR`, 1698 `ER_ACCESS_DENIED_NO_PASSWORD_ERROR` | [`ErrorKind::Authentication`] |
    // | 1142 `ER_TABLEACCESS_DENIED_ERROR`, 1143 `ER_COLUMNACCESS_DENIED_ERROR`, 1227 `ER_SPECIFIC_ACCESS_DENIED_ERROR` | [`ErrorKind::Privilege`] |
    // | 1049 `ER_BAD_DB_ERROR` | [`ErrorKind::Config`] |
    //
    // 1317 is what `KILL QUERY` raises in the session it interrupts: the statement ends, and the
    // session and its transaction stay, as after PostgreSQL's cancel request (`57014`), so both
    // are a [`ErrorKind::Timeout`]. A session ended with `KILL` (`KILL CONNECTION`) answers 1927
    // on MariaDB, and on MySQL its client finds the connection gone (2013).
    match number {
        1213 | 1205 => ErrorKind::Serialization,
        1146 => ErrorKind::UndefinedTable,
        1054 => ErrorKind::UndefinedColumn,
        1317 | 3024 | 1969 => ErrorKind::Timeout,
        1053 | 1927 | 4031 | 1158..=1161 | 2006 | 2013 => ErrorKind::ConnectionLost,
        1045 | 1044 | 1698 => ErrorKind::Authentication,
        1142 | 1143 | 1227 => ErrorKind::Privilege,
        1049 => ErrorKind::Config,
        _ => sqlstate.map_or(ErrorKind::Other, sqlstate_kind),
    }
}

/// The kind of a SQLite error by its result code (primary, or extended: the primary code is
/// its low byte) and, where the code is a generic one, its message.
pub fn sqlite_error_kind(code: i32, message: &str) -> ErrorKind {
    // | result code | kind |
    // |---|---|
    // | 5 `SQLITE_BUSY`, 6 `SQLITE_LOCKED` (past the busy timeout) | [`ErrorKind::Timeout`] |
    // | 9 `SQLITE_INTERRUPT`, 10 `SQLITE_IOERR`, 11 `SQLITE_CORRUPT`, 14 `SQLITE_CANTOPEN`, 26 `SQLITE_NOTADB` | [`ErrorKind::ConnectionLost`] |
    // | any other, with a message that says `no such table` | [`ErrorKind::UndefinedTable`] |
    // | any other, with a message that says `no such column` | [`ErrorKind::UndefinedColumn`] |
    // | anything else | [`ErrorKind::Other`] |
    match code & 0xff {
        5 | 6 => ErrorKind::Timeout,
        9 | 10 | 11 | 14 | 26 => ErrorKind::ConnectionLost,
        _ if message.contains("no such table") => ErrorKind::UndefinedTable,
        _ if message.contains("no such column") => ErrorKind::UndefinedColumn,
        _ => ErrorKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_give_dialects() {
        let table: &[(Server, &str, Dialect)] = &[
            (Server::Postgres, "90500", Dialect::Postgres),
            (Server::Postgres, "150020", Dialect::Postgres),
            (
                Server::Postgres,
                "16.2 (Debian 16.2-1.pgdg120+2)",
                Dialect::Postgres,
            ),
            (Server::Postgres, "9.6.24", Dialect::Postgres),
            (Server::Postgres, "17beta1", Dialect::Postgres),
            (Server::MySql, "8.0.1", Dialect::MySql),
            (Server::MySql, "8.0.36-0ubuntu0.22.04.1", Dialect::MySql),
            (Server::MySql, "8.4.0-commercial", Dialect::MySql),
            (
                Server::MySql,
                "10.11.19-MariaDB-0+deb12u1",
                Dialect::MariaDb,
            ),
            (Server::MySql, "5.5.5-10.6.3-MariaDB", Dialect::MariaDb),
            (Server::MySql, "10.6.0-mariadb-log", Dialect::MariaDb),
            (Server::MySql, "11.4.2-MariaDB", Dialect::MariaDb),
            (Server::Sqlite, "3.35.0", Dialect::Sqlite),
            (Server::Sqlite, "3.45.1", Dialect::Sqlite),
        ];
        for &(server, version, dialect) in table {
            assert_eq!(dialect_of(server, version), Ok(dialect), "{version}");
        }
    }

    #[test]
    fn old_versions_name_the_server_the_version_and_the_minimum() {
        let table: &[(Server, &str, &str)] = &[
            (
                Server::Postgres,
                "90400",
                "PostgreSQL 90400 is too old: ruststream needs PostgreSQL 9.5 or later (FOR UPDATE SKIP LOCKED)",
            ),
            (
                Server::Postgres,
                "9.4.26",
                "PostgreSQL 9.4.26 is too old: ruststream needs PostgreSQL 9.5 or later (FOR UPDATE SKIP LOCKED)",
            ),
            (
                Server::MySql,
                "8.0.0",
                "MySQL 8.0.0 is too old: ruststream needs MySQL 8.0.1 or later (FOR UPDATE SKIP LOCKED)",
            ),
            (
                Server::MySql,
                "5.7.44-log",
                "MySQL 5.7.44-log is too old: ruststream needs MySQL 8.0.1 or later (FOR UPDATE SKIP LOCKED)",
            ),
            (
                Server::MySql,
                "10.5.9-MariaDB",
                "MariaDB 10.5.9-MariaDB is too old: ruststream needs MariaDB 10.6 or later (FOR UPDATE SKIP LOCKED)",
            ),
            (
                Server::MySql,
                "5.5.5-10.5.9-MariaDB",
                "MariaDB 5.5.5-10.5.9-MariaDB is too old: ruststream needs MariaDB 10.6 or later (FOR UPDATE SKIP LOCKED)",
            ),
            (
                Server::Sqlite,
                "3.34.1",
                "SQLite 3.34.1 is too old: ruststream needs SQLite 3.35 or later (RETURNING)",
            ),
        ];
        for &(server, version, message) in table {
            let error = dialect_of(server, version).unwrap_err();
            assert!(matches!(error, VersionError::TooOld { .. }), "{error:?}");
            assert_eq!(error.to_string(), message);
        }
        assert!(matches!(
            dialect_of(Server::MySql, "unknown"),
            Err(VersionError::Unreadable { .. })
        ));
        assert!(matches!(
            dialect_of(Server::Postgres, ""),
            Err(VersionError::Unreadable { .. })
        ));
    }

    #[test]
    fn every_dialect_has_a_minimum() {
        for dialect in [
            Dialect::Postgres,
            Dialect::MySql,
            Dialect::MariaDb,
            Dialect::Sqlite,
        ] {
            assert_eq!(minimum(dialect).dialect, dialect);
        }
    }

    #[test]
    fn sqlstates_map_to_kinds() {
        let table = [
            ("40001", ErrorKind::Serialization),
            ("40P01", ErrorKind::Serialization),
            ("42P01", ErrorKind::UndefinedTable),
            ("42S02", ErrorKind::UndefinedTable),
            ("42703", ErrorKind::UndefinedColumn),
            ("42S22", ErrorKind::UndefinedColumn),
            ("57014", ErrorKind::Timeout),
            ("57P01", ErrorKind::ConnectionLost),
            ("57P02", ErrorKind::ConnectionLost),
            ("57P03", ErrorKind::ConnectionLost),
            ("08006", ErrorKind::ConnectionLost),
            ("08S01", ErrorKind::ConnectionLost),
            ("28P01", ErrorKind::Authentication),
            ("28000", ErrorKind::Authentication),
            ("42501", ErrorKind::Privilege),
            ("42P05", ErrorKind::PreparedStatement),
            ("26000", ErrorKind::PreparedStatement),
            ("3D000", ErrorKind::Config),
            ("42601", ErrorKind::Other),
            ("23505", ErrorKind::Other),
            ("55P03", ErrorKind::Other),
            ("HY000", ErrorKind::Other),
        ];
        for (code, kind) in table {
            assert_eq!(sqlstate_kind(code), kind, "{code}");
        }
    }

    #[test]
    fn mysql_numbers_map_to_kinds() {
        let table = [
            (1213, Some("40001"), ErrorKind::Serialization),
            (1205, Some("HY000"), ErrorKind::Serialization),
            (1146, Some("42S02"), ErrorKind::UndefinedTable),
            (1054, Some("42S22"), ErrorKind::UndefinedColumn),
            (1045, Some("28000"), ErrorKind::Authentication),
            (1044, Some("42000"), ErrorKind::Authentication),
            (1142, Some("42000"), ErrorKind::Privilege),
            (1049, Some("42000"), ErrorKind::Config),
            (1317, Some("70100"), ErrorKind::Timeout),
            (3024, Some("HY000"), ErrorKind::Timeout),
            (1969, Some("70100"), ErrorKind::Timeout),
            (1053, Some("08S01"), ErrorKind::ConnectionLost),
            (1927, Some("70100"), ErrorKind::ConnectionLost),
            (4031, Some("HY000"), ErrorKind::ConnectionLost),
            (1158, Some("08S01"), ErrorKind::ConnectionLost),
            (1161, Some("08S01"), ErrorKind::ConnectionLost),
            (2006, None, ErrorKind::ConnectionLost),
            (2013, None, ErrorKind::ConnectionLost),
            (1064, Some("42000"), ErrorKind::Other),
            (1062, Some("23000"), ErrorKind::Other),
            (1064, None, ErrorKind::Other),
            // Numbers of no kind of their own fall back to the SQLSTATE.
            (9998, Some("40001"), ErrorKind::Serialization),
            (9999, Some("08004"), ErrorKind::ConnectionLost),
        ];
        for (number, sqlstate, kind) in table {
            assert_eq!(mysql_error_kind(number, sqlstate), kind, "{number}");
        }
    }

    #[test]
    fn sqlite_codes_map_to_kinds() {
        let table = [
            (5, "database is locked", ErrorKind::Timeout),
            (6, "database table is locked", ErrorKind::Timeout),
            // SQLITE_BUSY_SNAPSHOT, an extended code of SQLITE_BUSY.
            (517, "database is locked", ErrorKind::Timeout),
            (9, "interrupted", ErrorKind::ConnectionLost),
            (10, "disk I/O error", ErrorKind::ConnectionLost),
            // SQLITE_IOERR_READ.
            (266, "disk I/O error", ErrorKind::ConnectionLost),
            (
                11,
                "database disk image is malformed",
                ErrorKind::ConnectionLost,
            ),
            (
                14,
                "unable to open database file",
                ErrorKind::ConnectionLost,
            ),
            (26, "file is not a database", ErrorKind::ConnectionLost),
            (1, "no such table: jobs", ErrorKind::UndefinedTable),
            (1, "no such column: attempt", ErrorKind::UndefinedColumn),
            (1, "near \"SELEC\": syntax error", ErrorKind::Other),
            // SQLITE_CONSTRAINT_PRIMARYKEY.
            (1555, "UNIQUE constraint failed: jobs.id", ErrorKind::Other),
        ];
        for (code, message, kind) in table {
            assert_eq!(sqlite_error_kind(code, message), kind, "{code} {message}");
        }
    }
}

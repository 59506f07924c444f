//! The mapping of values and errors between mysql_async and the core.

use mysql_async::consts::ColumnType;
use mysql_async::{Column, Params};
use ruststream_core::server::mysql_error_kind;
use ruststream_core::{DbError, ErrorKind, Value};

/// The character set number MySQL and MariaDB give binary strings and non-text columns.
const BINARY_CHARSET: u16 = 63;

/// The core's binds as mysql_async's positional parameters. A boolean binds as the integer 1
/// or 0, text as its UTF-8 bytes.
pub(crate) fn params(binds: Vec<Value>) -> Params {
    if binds.is_empty() {
        return Params::Empty;
    }
    Params::Positional(binds.into_iter().map(to_mysql).collect())
}

/// A core value as a mysql_async value.
pub(crate) fn to_mysql(value: Value) -> mysql_async::Value {
    match value {
        Value::Null => mysql_async::Value::NULL,
        Value::Bool(b) => mysql_async::Value::Int(i64::from(b)),
        Value::Int(i) => mysql_async::Value::Int(i),
        Value::Text(t) => mysql_async::Value::Bytes(t.into_bytes()),
        Value::Bytes(b) => mysql_async::Value::Bytes(b),
    }
}

/// A value read from a row as the core reads it, by its column's type: the binary protocol
/// (a statement with binds) sends typed values, the text protocol every value as its text.
// - integers (`TINYINT` .. `BIGINT`, `YEAR`) are `Value::Int`; an unsigned one past
//   `i64::MAX` is its decimal text;
// - text columns (`CHAR`, `VARCHAR`, `TEXT`, `ENUM`, `SET`, `JSON`, and a column of
//   `information_schema`, whose names MySQL 8 sends as binary strings) are `Value::Text`,
//   decoded as UTF-8 (bytes that are not UTF-8 stay `Value::Bytes`);
// - binary columns (`BINARY`, `VARBINARY`, `BLOB`, `BIT`, `GEOMETRY`) are `Value::Bytes`;
// - decimals, floats, dates and times are `Value::Text` in MySQL's own notation (the core
//   has no such types).
pub(crate) fn from_mysql(value: &mysql_async::Value, column: &Column) -> Value {
    use mysql_async::Value as My;
    match value {
        My::NULL => Value::Null,
        My::Int(i) => Value::Int(*i),
        My::UInt(u) => i64::try_from(*u).map_or_else(|_| Value::Text(u.to_string()), Value::Int),
        My::Float(f) => Value::Text(f.to_string()),
        My::Double(d) => Value::Text(d.to_string()),
        My::Date(year, month, day, hour, minute, second, micros) => {
            let date = format!("{year:04}-{month:02}-{day:02}");
            if column.column_type() == ColumnType::MYSQL_TYPE_DATE {
                Value::Text(date)
            } else if *micros == 0 {
                Value::Text(format!("{date} {hour:02}:{minute:02}:{second:02}"))
            } else {
                Value::Text(format!(
                    "{date} {hour:02}:{minute:02}:{second:02}.{micros:06}"
                ))
            }
        }
        My::Time(negative, days, hours, minutes, seconds, micros) => {
            let sign = if *negative { "-" } else { "" };
            let hours = u64::from(*days) * 24 + u64::from(*hours);
            if *micros == 0 {
                Value::Text(format!("{sign}{hours:02}:{minutes:02}:{seconds:02}"))
            } else {
                Value::Text(format!(
                    "{sign}{hours:02}:{minutes:02}:{seconds:02}.{micros:06}"
                ))
            }
        }
        My::Bytes(bytes) => from_bytes(bytes, column),
    }
}

/// A value the server sent as bytes: the text protocol's every value, and strings and blobs
/// in the binary protocol.
fn from_bytes(bytes: &[u8], column: &Column) -> Value {
    use ColumnType::*;
    match column.column_type() {
        MYSQL_TYPE_TINY | MYSQL_TYPE_SHORT | MYSQL_TYPE_INT24 | MYSQL_TYPE_LONG
        | MYSQL_TYPE_LONGLONG | MYSQL_TYPE_YEAR => {
            let text = String::from_utf8_lossy(bytes);
            match text.parse::<i64>() {
                Ok(i) => Value::Int(i),
                Err(_) => Value::Text(text.into_owned()),
            }
        }
        MYSQL_TYPE_DECIMAL
        | MYSQL_TYPE_NEWDECIMAL
        | MYSQL_TYPE_FLOAT
        | MYSQL_TYPE_DOUBLE
        | MYSQL_TYPE_TIMESTAMP
        | MYSQL_TYPE_TIMESTAMP2
        | MYSQL_TYPE_DATE
        | MYSQL_TYPE_NEWDATE
        | MYSQL_TYPE_TIME
        | MYSQL_TYPE_TIME2
        | MYSQL_TYPE_DATETIME
        | MYSQL_TYPE_DATETIME2
        | MYSQL_TYPE_JSON
        | MYSQL_TYPE_ENUM
        | MYSQL_TYPE_SET => text_or_bytes(bytes),
        MYSQL_TYPE_BIT | MYSQL_TYPE_GEOMETRY | MYSQL_TYPE_VECTOR => Value::Bytes(bytes.to_vec()),
        _ if is_text(column) => text_or_bytes(bytes),
        _ => Value::Bytes(bytes.to_vec()),
    }
}

/// Whether a string or blob column holds text: a character set other than binary, or a
/// column of `information_schema` (MySQL 8 sends its names as binary strings).
fn is_text(column: &Column) -> bool {
    column.character_set() != BINARY_CHARSET
        || column
            .schema_str()
            .eq_ignore_ascii_case("information_schema")
}

fn text_or_bytes(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::Text(text.to_owned()),
        Err(_) => Value::Bytes(bytes.to_vec()),
    }
}

/// A mysql_async error as the core reads it: a server's error by its number and SQLSTATE;
/// I/O errors, a closed connection and packet errors as lost; a disconnected pool as
/// [`ErrorKind::PoolClosed`]; anything else as [`ErrorKind::Other`].
pub(crate) fn db_error(error: &mysql_async::Error) -> DbError {
    use mysql_async::{DriverError, Error};
    let kind = match error {
        Error::Server(server) => mysql_error_kind(server.code, Some(&server.state)),
        Error::Io(_) => ErrorKind::ConnectionLost,
        Error::Driver(driver) => match driver {
            DriverError::PoolDisconnected => ErrorKind::PoolClosed,
            DriverError::ConnectionClosed
            | DriverError::PacketOutOfOrder
            | DriverError::PacketTooLarge
            | DriverError::UnexpectedPacket { .. } => ErrorKind::ConnectionLost,
            _ => ErrorKind::Other,
        },
        _ => ErrorKind::Other,
    };
    DbError::new(kind, error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(column_type: ColumnType, charset: u16) -> Column {
        Column::new(column_type).with_character_set(charset)
    }

    #[test]
    fn binds_convert() {
        assert_eq!(to_mysql(Value::Bool(true)), mysql_async::Value::Int(1));
        assert_eq!(
            to_mysql(Value::Text("é".into())),
            mysql_async::Value::Bytes("é".as_bytes().to_vec())
        );
        assert_eq!(params(Vec::new()), Params::Empty);
        assert_eq!(
            params(vec![Value::Null, Value::Int(3)]),
            Params::Positional(vec![mysql_async::Value::NULL, mysql_async::Value::Int(3)])
        );
    }

    #[test]
    fn values_read_by_column_type() {
        // utf8mb4_general_ci.
        let text = 45;
        let bigint = column(ColumnType::MYSQL_TYPE_LONGLONG, BINARY_CHARSET);
        // The text protocol sends integers as text.
        assert_eq!(
            from_mysql(&mysql_async::Value::Bytes(b"-42".to_vec()), &bigint),
            Value::Int(-42)
        );
        assert_eq!(
            from_mysql(&mysql_async::Value::Int(7), &bigint),
            Value::Int(7)
        );
        assert_eq!(
            from_mysql(&mysql_async::Value::UInt(u64::MAX), &bigint),
            Value::Text(u64::MAX.to_string())
        );
        let varchar = column(ColumnType::MYSQL_TYPE_VAR_STRING, text);
        assert_eq!(
            from_mysql(&mysql_async::Value::Bytes(b"key-1".to_vec()), &varchar),
            Value::Text("key-1".into())
        );
        let blob = column(ColumnType::MYSQL_TYPE_BLOB, BINARY_CHARSET);
        assert_eq!(
            from_mysql(&mysql_async::Value::Bytes(vec![0, 159]), &blob),
            Value::Bytes(vec![0, 159])
        );
        // information_schema's names come as binary strings on MySQL 8: they are text.
        let name = column(ColumnType::MYSQL_TYPE_VAR_STRING, BINARY_CHARSET)
            .with_schema(b"information_schema");
        assert_eq!(
            from_mysql(&mysql_async::Value::Bytes(b"payload".to_vec()), &name),
            Value::Text("payload".into())
        );
        let datetime = column(ColumnType::MYSQL_TYPE_DATETIME, BINARY_CHARSET);
        assert_eq!(
            from_mysql(
                &mysql_async::Value::Date(2024, 2, 29, 13, 5, 9, 120),
                &datetime
            ),
            Value::Text("2024-02-29 13:05:09.000120".into())
        );
        assert_eq!(
            from_mysql(&mysql_async::Value::NULL, &datetime),
            Value::Null
        );
        // A listed column name is text, whatever its metadata says: the core declares the
        // column text.
        let bare = column(ColumnType::MYSQL_TYPE_VAR_STRING, BINARY_CHARSET);
        assert_eq!(
            ruststream_core::ColumnType::Text.read(from_mysql(
                &mysql_async::Value::Bytes(b"id".to_vec()),
                &bare
            )),
            Ok(Value::Text("id".into()))
        );
    }

    #[test]
    fn errors_map_to_kinds() {
        let server = |code| {
            db_error(&mysql_async::Error::Server(mysql_async::ServerError {
                code,
                message: format!("error {code}"),
                state: "HY000".into(),
            }))
            .kind
        };
        assert_eq!(server(1213), ErrorKind::Serialization);
        assert_eq!(server(1205), ErrorKind::Serialization);
        assert_eq!(server(1146), ErrorKind::UndefinedTable);
        assert_eq!(server(1054), ErrorKind::UndefinedColumn);
        assert_eq!(server(1969), ErrorKind::Timeout);
        assert_eq!(server(1927), ErrorKind::ConnectionLost);
        assert_eq!(server(1064), ErrorKind::Other);
        let io = mysql_async::Error::Io(mysql_async::IoError::Io(std::io::Error::from(
            std::io::ErrorKind::UnexpectedEof,
        )));
        assert_eq!(db_error(&io).kind, ErrorKind::ConnectionLost);
        let closed = mysql_async::Error::Driver(mysql_async::DriverError::ConnectionClosed);
        assert_eq!(db_error(&closed).kind, ErrorKind::ConnectionLost);
        let pool = mysql_async::Error::Driver(mysql_async::DriverError::PoolDisconnected);
        assert_eq!(db_error(&pool).kind, ErrorKind::PoolClosed);
        assert_eq!(db_error(&pool).message, pool.to_string());
    }
}

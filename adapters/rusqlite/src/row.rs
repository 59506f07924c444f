//! The adapter's row, and the mapping of values and errors between rusqlite and the core.

use std::borrow::Cow;
use std::sync::Arc;

use rusqlite::types::Value as SqlValue;
use ruststream::de::{self, Cell, DecodeError};
use ruststream_core::server::sqlite_error_kind;
use ruststream_core::{DbError, ErrorKind, Value};
use serde::de::DeserializeOwned;

/// A row read from SQLite, owned: its column names and values (SQLite's storage classes), in
/// the statement's order, decoded into the table's row type with [`RusqliteRow::decode`].
#[derive(Clone, Debug, PartialEq)]
pub struct RusqliteRow {
    columns: Arc<[String]>,
    values: Vec<SqlValue>,
}

impl RusqliteRow {
    pub(crate) fn from_parts(columns: Arc<[String]>, values: Vec<SqlValue>) -> Self {
        debug_assert_eq!(columns.len(), values.len(), "one value per column");
        Self { columns, values }
    }

    /// The column names, in the statement's order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// The values, in the order of [`RusqliteRow::columns`].
    pub fn values(&self) -> &[SqlValue] {
        &self.values
    }

    /// How many columns the row has.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the row has no column.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The value of the column `name`: the first column of that exact name, else the first
    /// whose name matches ignoring ASCII case (SQLite's own rule for names).
    pub fn get(&self, name: &str) -> Option<&SqlValue> {
        ruststream_core::column_position(&self.columns, name).map(|i| &self.values[i])
    }

    /// Each column's name and value, in the statement's order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &SqlValue)> {
        self.columns.iter().map(String::as_str).zip(&self.values)
    }

    /// The row as `T`, by serde, each field from the column of its name: `INTEGER` into
    /// integers, `bool`, floats or `String`; `REAL` into floats; `TEXT` into `String`, unit
    /// enums or bytes; `BLOB` into `Vec<u8>`, or `String` when UTF-8; `NULL` into `None`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, DecodeError> {
        de::from_row(self)
    }
}

impl de::Row for RusqliteRow {
    fn column_count(&self) -> usize {
        self.values.len()
    }

    fn column_name(&self, index: usize) -> &str {
        &self.columns[index]
    }

    fn cell(&self, index: usize) -> Cell<'_> {
        match &self.values[index] {
            SqlValue::Null => Cell::Null,
            SqlValue::Integer(i) => Cell::Int(*i),
            SqlValue::Real(r) => Cell::Real(*r),
            SqlValue::Text(t) => Cell::Text(Cow::Borrowed(t)),
            SqlValue::Blob(b) => Cell::Bytes(b),
        }
    }
}

impl<S: Into<String>> FromIterator<(S, SqlValue)> for RusqliteRow {
    /// A row of these columns and values, such as to test a row type's decoding.
    fn from_iter<I: IntoIterator<Item = (S, SqlValue)>>(iter: I) -> Self {
        let (columns, values): (Vec<String>, Vec<SqlValue>) =
            iter.into_iter().map(|(c, v)| (c.into(), v)).unzip();
        Self {
            columns: columns.into(),
            values,
        }
    }
}

/// A core value as a SQLite bind parameter. A boolean binds as the integer 1 or 0.
pub(crate) fn to_sql(value: &Value) -> SqlValue {
    match value {
        Value::Null => SqlValue::Null,
        Value::Bool(b) => SqlValue::Integer(i64::from(*b)),
        Value::Int(i) => SqlValue::Integer(*i),
        Value::Text(t) => SqlValue::Text(t.clone()),
        Value::Bytes(b) => SqlValue::Blob(b.clone()),
    }
}

/// A SQLite value as the core reads it. The core has no floats: a `REAL` is the text of its
/// decimal form.
pub(crate) fn from_sql(value: &SqlValue) -> Value {
    match value {
        SqlValue::Null => Value::Null,
        SqlValue::Integer(i) => Value::Int(*i),
        SqlValue::Real(r) => Value::Text(r.to_string()),
        SqlValue::Text(t) => Value::Text(t.clone()),
        SqlValue::Blob(b) => Value::Bytes(b.clone()),
    }
}

/// A rusqlite error as the core reads it: a SQLite error by its extended result code and
/// message (`SQLITE_INTERRUPT` is a command cut short by a close); a column missing from a
/// statement's rows as [`ErrorKind::UndefinedColumn`]; anything else as [`ErrorKind::Other`].
pub(crate) fn db_error(error: &rusqlite::Error) -> DbError {
    let kind = match error {
        rusqlite::Error::SqliteFailure(failure, message) => {
            sqlite_error_kind(failure.extended_code, message.as_deref().unwrap_or(""))
        }
        rusqlite::Error::SqlInputError { error, msg, .. } => {
            sqlite_error_kind(error.extended_code, msg)
        }
        rusqlite::Error::InvalidColumnName(_) => ErrorKind::UndefinedColumn,
        _ => ErrorKind::Other,
    };
    DbError::new(kind, error.to_string())
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[test]
    fn values_round_trip() {
        for value in [
            Value::Null,
            Value::Int(-7),
            Value::Text("x".into()),
            Value::Bytes(vec![0, 255]),
        ] {
            assert_eq!(from_sql(&to_sql(&value)), value);
        }
        assert_eq!(to_sql(&Value::Bool(true)), SqlValue::Integer(1));
        assert_eq!(from_sql(&SqlValue::Real(1.5)), Value::Text("1.5".into()));
    }

    #[test]
    fn errors_map_to_kinds() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let missing_table = conn.prepare("SELECT * FROM nope").unwrap_err();
        assert_eq!(db_error(&missing_table).kind, ErrorKind::UndefinedTable);
        conn.execute_batch("CREATE TABLE t (a INTEGER)").unwrap();
        let missing_column = conn.prepare("SELECT b FROM t").unwrap_err();
        assert_eq!(db_error(&missing_column).kind, ErrorKind::UndefinedColumn);
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        assert_eq!(db_error(&busy).kind, ErrorKind::Timeout);
        let syntax = conn.prepare("SELEC 1").unwrap_err();
        assert_eq!(db_error(&syntax).kind, ErrorKind::Other);
    }

    #[test]
    fn get_matches_names_ignoring_case() {
        let row: RusqliteRow = [("Id", SqlValue::Integer(1)), ("id", SqlValue::Integer(2))]
            .into_iter()
            .collect();
        assert_eq!(row.get("id"), Some(&SqlValue::Integer(2)));
        assert_eq!(row.get("ID"), Some(&SqlValue::Integer(1)));
        assert_eq!(row.get("other"), None);
    }

    fn row(columns: &[(&str, SqlValue)]) -> RusqliteRow {
        columns
            .iter()
            .map(|(c, v)| (c.to_string(), v.clone()))
            .collect()
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "lowercase")]
    enum State {
        New,
        Done,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Job {
        id: i64,
        attempt: i16,
        small: i32,
        payload: Vec<u8>,
        name: String,
        note: Option<String>,
        locked_until: Option<i64>,
        score: f64,
        flag: bool,
        state: State,
    }

    #[test]
    fn decodes_a_struct_by_column_names() {
        let r = row(&[
            ("id", SqlValue::Integer(9)),
            ("extra", SqlValue::Text("ignored".into())),
            ("attempt", SqlValue::Integer(2)),
            ("small", SqlValue::Integer(-3)),
            ("payload", SqlValue::Blob(b"{\"a\":1}".to_vec())),
            ("name", SqlValue::Text("x".into())),
            ("note", SqlValue::Null),
            ("locked_until", SqlValue::Integer(77)),
            ("score", SqlValue::Real(0.5)),
            ("flag", SqlValue::Integer(1)),
            ("state", SqlValue::Text("done".into())),
        ]);
        let job: Job = r.decode().unwrap();
        assert_eq!(
            job,
            Job {
                id: 9,
                attempt: 2,
                small: -3,
                payload: b"{\"a\":1}".to_vec(),
                name: "x".into(),
                note: None,
                locked_until: Some(77),
                score: 0.5,
                flag: true,
                state: State::Done,
            }
        );
        let _ = State::New;
    }

    #[test]
    fn decodes_a_tuple_in_column_order() {
        let r = row(&[
            ("a", SqlValue::Integer(1)),
            ("b", SqlValue::Blob(vec![1, 2])),
        ]);
        let (a, b): (i64, Vec<u8>) = r.decode().unwrap();
        assert_eq!((a, b), (1, vec![1, 2]));
    }

    #[test]
    fn errors_name_the_column() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Narrow {
            attempt: i16,
        }
        let r = row(&[("attempt", SqlValue::Integer(70_000))]);
        let error = r.decode::<Narrow>().unwrap_err();
        assert_eq!(error.column(), Some("attempt"));
        assert!(
            error.to_string().starts_with("column `attempt`: "),
            "{error}"
        );

        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Bytes {
            payload: Vec<u8>,
        }
        let r = row(&[("payload", SqlValue::Integer(1))]);
        let error = r.decode::<Bytes>().unwrap_err();
        assert_eq!(error.column(), Some("payload"));

        let r = row(&[("other", SqlValue::Integer(1))]);
        let error = r.decode::<Bytes>().unwrap_err();
        assert!(
            error.to_string().contains("missing field `payload`"),
            "{error}"
        );
        let r = row(&[("payload", SqlValue::Null)]);
        assert!(r.decode::<Bytes>().is_err(), "NULL is no Vec<u8>");
    }
}

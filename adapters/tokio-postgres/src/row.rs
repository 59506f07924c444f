//! The adapter's row, and what the core reads of it.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;

use ruststream::de::{self, DecodeError};
use ruststream_core::{ColumnType, DbError, ErrorKind, OutColumn, Value};
use serde::de::DeserializeOwned;
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::{Row, SimpleQueryRow};

/// A row the broker read from PostgreSQL: a [`tokio_postgres::Row`] under the extended query
/// protocol (the default), a [`tokio_postgres::SimpleQueryRow`] of text under the simple query
/// protocol ([`TokioPostgresBroker::simple_query`](crate::TokioPostgresBroker::simple_query)).
///
/// The runtime carries it from the claim to the handler's task, where it decodes into the
/// table's row type with serde ([`PgRow::decode`]). The driver's row stays reachable
/// ([`PgRow::as_row`], [`PgRow::as_simple_row`]) for a service that reads it by hand.
pub struct PgRow {
    inner: Inner,
}

enum Inner {
    Extended(Row),
    Simple(SimpleQueryRow),
}

impl From<Row> for PgRow {
    fn from(row: Row) -> Self {
        Self {
            inner: Inner::Extended(row),
        }
    }
}

impl From<SimpleQueryRow> for PgRow {
    fn from(row: SimpleQueryRow) -> Self {
        Self {
            inner: Inner::Simple(row),
        }
    }
}

impl fmt::Debug for PgRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgRow")
            .field(
                "protocol",
                &match self.inner {
                    Inner::Extended(_) => "extended",
                    Inner::Simple(_) => "simple",
                },
            )
            .field("columns", &self.columns())
            .finish()
    }
}

impl PgRow {
    /// The column names, in the statement's order.
    pub fn columns(&self) -> Vec<&str> {
        match &self.inner {
            Inner::Extended(row) => row.columns().iter().map(|c| c.name()).collect(),
            Inner::Simple(row) => row.columns().iter().map(|c| c.name()).collect(),
        }
    }

    /// How many columns the row has.
    pub fn len(&self) -> usize {
        match &self.inner {
            Inner::Extended(row) => row.len(),
            Inner::Simple(row) => row.len(),
        }
    }

    /// Whether the row has no column.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The driver's row, under the extended query protocol.
    pub fn as_row(&self) -> Option<&Row> {
        match &self.inner {
            Inner::Extended(row) => Some(row),
            Inner::Simple(_) => None,
        }
    }

    /// The driver's row of text, under the simple query protocol.
    pub fn as_simple_row(&self) -> Option<&SimpleQueryRow> {
        match &self.inner {
            Inner::Simple(row) => Some(row),
            Inner::Extended(_) => None,
        }
    }

    /// The row as `T`, by serde: a struct reads its fields from the columns of the same names
    /// (columns it does not name are ignored), a tuple reads the columns in order.
    ///
    /// Under the extended protocol a value reads by its column's type: `smallint`, `integer`,
    /// `bigint` and `oid` into any integer type that holds the value (and floats); `real` and
    /// `double precision` into floats; `boolean` into `bool`; `text`, `varchar`, `char(n)`,
    /// `name`, `citext`, `json`, `jsonb` and `uuid` into `String` (and unit enums by name);
    /// `bytea` into `Vec<u8>` (and `serde_bytes` types); text into `Vec<u8>` as its UTF-8
    /// bytes; `NULL` into `Option::None` and `()`. A column of another type (a timestamp, a
    /// `numeric`) reads into nothing but an ignored field: cast it in SQL, or read it from
    /// [`PgRow::as_row`].
    ///
    /// Under the simple protocol every value is text, parsed as the field asks: integers,
    /// floats, `t`/`f` booleans, and `bytea`'s `\x..` hex text into `Vec<u8>` (text without
    /// the `\x` reads as its UTF-8 bytes).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, DecodeError> {
        de::from_row(self)
    }

    /// The value of the column at `index`, as the deserializer and the core read it.
    pub(crate) fn cell(&self, index: usize) -> Cell<'_> {
        match &self.inner {
            Inner::Extended(row) => {
                let ty = row.columns()[index].type_();
                match row.try_get::<_, Raw<'_>>(index) {
                    Ok(Raw(None)) => Cell::Null,
                    Ok(Raw(Some(raw))) => typed_cell(ty, raw),
                    Err(error) => Cell::Broken(error.to_string()),
                }
            }
            Inner::Simple(row) => match row.try_get(index) {
                Ok(Some(text)) => Cell::Text(text),
                Ok(None) => Cell::Null,
                Err(error) => Cell::Broken(error.to_string()),
            },
        }
    }

    /// The name of the column at `index`.
    pub(crate) fn column_name(&self, index: usize) -> &str {
        match &self.inner {
            Inner::Extended(row) => row.columns()[index].name(),
            Inner::Simple(row) => row.columns()[index].name(),
        }
    }

    /// The index of the column `name`: exact first, then ignoring ASCII case.
    pub(crate) fn index_of(&self, name: &str) -> Option<usize> {
        let names = self.columns();
        names
            .iter()
            .position(|c| *c == name)
            .or_else(|| names.iter().position(|c| c.eq_ignore_ascii_case(name)))
    }

    /// The values of `columns`, each read as the type the core declares it.
    pub(crate) fn core_values(
        &self,
        columns: &[OutColumn],
        sql: &str,
    ) -> Result<Vec<Value>, DbError> {
        columns
            .iter()
            .map(|column| {
                let index = self.index_of(column.name).ok_or_else(|| {
                    DbError::new(
                        ErrorKind::UndefinedColumn,
                        format!("the statement's rows have no column `{}`: {sql}", column.name),
                    )
                })?;
                core_value(self.cell(index), column.ty).map_err(|message| {
                    DbError::new(
                        ErrorKind::Other,
                        format!(
                            "column `{}` of the statement's rows does not read as {}: {message}: {sql}",
                            column.name,
                            column.ty.name()
                        ),
                    )
                })
            })
            .collect()
    }
}

impl de::Row for PgRow {
    fn column_count(&self) -> usize {
        self.len()
    }

    fn column_name(&self, index: usize) -> &str {
        PgRow::column_name(self, index)
    }

    fn cell(&self, index: usize) -> de::Cell<'_> {
        match PgRow::cell(self, index) {
            Cell::Null => de::Cell::Null,
            Cell::Bool(b) => de::Cell::Bool(b),
            Cell::Int(i) => de::Cell::Int(i),
            Cell::Float(f) => de::Cell::Real(f),
            Cell::Str(text) => de::Cell::Text(Cow::Borrowed(text)),
            Cell::Owned(text) => de::Cell::Text(Cow::Owned(text)),
            Cell::Bytes(bytes) => de::Cell::Bytes(bytes),
            Cell::Text(text) => de::Cell::Untyped(text),
            Cell::Unsupported(ty) => de::Cell::Invalid(format!(
                "the type `{}` does not decode with serde here; cast it in SQL, or read it from `PgRow::as_row`",
                ty.name()
            )),
            Cell::Broken(message) => de::Cell::Invalid(message),
        }
    }

    /// The simple protocol's text of a `bytea` is its hex output (`\x0a0b`).
    fn untyped_bytes<'a>(&self, text: &'a str) -> Result<Cow<'a, [u8]>, String> {
        bytea_text(text)
    }
}

/// The bytes of `bytea`'s text output: hex (`\x0a0b`), or else the text's own bytes (the
/// escape format of printable bytes).
fn bytea_text(text: &str) -> Result<Cow<'_, [u8]>, String> {
    let Some(hex) = text.strip_prefix("\\x") else {
        return Ok(Cow::Borrowed(text.as_bytes()));
    };
    if hex.len() % 2 != 0 {
        return Err("bytea hex text of odd length".to_owned());
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(|| "bytea hex text holds a non-hex digit".to_owned())
        })
        .collect::<Result<Vec<u8>, String>>()
        .map(Cow::Owned)
}

/// Any value, as the raw bytes of its binary format, or `None` for `NULL`.
struct Raw<'a>(Option<&'a [u8]>);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn StdError + Sync + Send>> {
        Ok(Raw(Some(raw)))
    }

    fn from_sql_null(_: &Type) -> Result<Self, Box<dyn StdError + Sync + Send>> {
        Ok(Raw(None))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// One value of a row, read as far as its type allows.
#[derive(Debug)]
pub(crate) enum Cell<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// Text of a text type.
    Str(&'a str),
    /// Text the adapter formatted (a `uuid`).
    Owned(String),
    Bytes(&'a [u8]),
    /// A value of the simple protocol: text of a type the row does not tell.
    Text(&'a str),
    /// A type the adapter does not read.
    Unsupported(&'a Type),
    /// The value does not read as its type says.
    Broken(String),
}

fn is_text_type(ty: &Type) -> bool {
    <&str as FromSql>::accepts(ty)
}

fn typed_cell<'a>(ty: &'a Type, raw: &'a [u8]) -> Cell<'a> {
    fn read<'a, T: FromSql<'a>>(
        ty: &Type,
        raw: &'a [u8],
        f: impl FnOnce(T) -> Cell<'a>,
    ) -> Cell<'a> {
        match T::from_sql(ty, raw) {
            Ok(v) => f(v),
            Err(error) => Cell::Broken(error.to_string()),
        }
    }
    match *ty {
        Type::BOOL => read::<bool>(ty, raw, Cell::Bool),
        Type::INT2 => read::<i16>(ty, raw, |v| Cell::Int(i64::from(v))),
        Type::INT4 => read::<i32>(ty, raw, |v| Cell::Int(i64::from(v))),
        Type::INT8 => read::<i64>(ty, raw, Cell::Int),
        Type::OID => read::<u32>(ty, raw, |v| Cell::Int(i64::from(v))),
        Type::FLOAT4 => read::<f32>(ty, raw, |v| Cell::Float(f64::from(v))),
        Type::FLOAT8 => read::<f64>(ty, raw, Cell::Float),
        Type::BYTEA => Cell::Bytes(raw),
        Type::JSON => match std::str::from_utf8(raw) {
            Ok(text) => Cell::Str(text),
            Err(error) => Cell::Broken(error.to_string()),
        },
        Type::JSONB => match raw.split_first() {
            Some((1, json)) => match std::str::from_utf8(json) {
                Ok(text) => Cell::Str(text),
                Err(error) => Cell::Broken(error.to_string()),
            },
            _ => Cell::Broken("an unknown jsonb format version".to_owned()),
        },
        Type::UUID => match <[u8; 16]>::try_from(raw) {
            Ok(bytes) => Cell::Owned(uuid_text(&bytes)),
            Err(_) => Cell::Broken("a uuid of the wrong length".to_owned()),
        },
        _ if is_text_type(ty) => read::<&str>(ty, raw, Cell::Str),
        _ => Cell::Unsupported(ty),
    }
}

fn uuid_text(bytes: &[u8; 16]) -> String {
    let mut out = String::with_capacity(36);
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(char::from_digit(u32::from(byte >> 4), 16).expect("a nibble is a hex digit"));
        out.push(char::from_digit(u32::from(byte & 0xf), 16).expect("a nibble is a hex digit"));
    }
    out
}

/// A cell as the core reads it: the value its type gives, read as the type the core declares
/// for its column. Under the simple protocol the row tells no types: the cell's text is read as
/// the declared type.
fn core_value(cell: Cell<'_>, ty: ColumnType) -> Result<Value, String> {
    let natural = match cell {
        Cell::Null => Value::Null,
        Cell::Bool(b) => Value::Bool(b),
        Cell::Int(i) => Value::Int(i),
        Cell::Float(f) => Value::Text(f.to_string()),
        Cell::Str(text) => Value::Text(text.to_owned()),
        Cell::Owned(text) => Value::Text(text),
        Cell::Bytes(bytes) => Value::Bytes(bytes.to_vec()),
        Cell::Text(text) => return ty.read_text(text),
        Cell::Unsupported(ty) => {
            return Err(format!(
                "the type `{}` is not one the broker reads (integers, text, uuid, boolean, bytea)",
                ty.name()
            ));
        }
        Cell::Broken(message) => return Err(message),
    };
    ty.read(natural)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_text_reads_as_the_core_declares_it() {
        let read = |text, ty| core_value(Cell::Text(text), ty).unwrap();
        assert_eq!(read("t", ColumnType::Bool), Value::Bool(true));
        assert_eq!(read("f", ColumnType::Bool), Value::Bool(false));
        assert_eq!(read("42", ColumnType::Id), Value::Int(42));
        assert_eq!(read("-3", ColumnType::Int), Value::Int(-3));
        assert_eq!(read("007", ColumnType::Id), Value::Text("007".into()));
        assert_eq!(read("7", ColumnType::Text), Value::Text("7".into()));
        assert_eq!(read("t", ColumnType::Text), Value::Text("t".into()));
        assert!(core_value(Cell::Text("x"), ColumnType::Bool).is_err());
        assert!(core_value(Cell::Text("x"), ColumnType::Int).is_err());
    }

    #[test]
    fn typed_cells_read_as_the_core_declares_them() {
        assert_eq!(
            core_value(Cell::Int(7), ColumnType::Text),
            Ok(Value::Text("7".into()))
        );
        assert_eq!(
            core_value(Cell::Int(1), ColumnType::Bool),
            Ok(Value::Bool(true))
        );
        assert_eq!(
            core_value(Cell::Str("5"), ColumnType::Int),
            Ok(Value::Int(5))
        );
        assert_eq!(core_value(Cell::Null, ColumnType::Bool), Ok(Value::Null));
    }

    #[test]
    fn bytea_text_reads_hex_and_plain_text() {
        assert_eq!(bytea_text("\\x00ff7b").unwrap(), vec![0, 255, b'{']);
        assert_eq!(bytea_text("plain").unwrap(), b"plain".to_vec());
        assert!(bytea_text("\\x0").is_err());
        assert!(bytea_text("\\xzz").is_err());
    }

    #[test]
    fn uuids_read_as_text() {
        let bytes = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(uuid_text(&bytes), "12345678-9abc-def0-0123-456789abcdef");
    }
}

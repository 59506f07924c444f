//! The adapter's row, and what the core reads of it.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;

use ruststream::de::{self, DecodeError};
use ruststream_core::{ColumnType, Value};
use serde::de::DeserializeOwned;
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::{Row, SimpleQueryRow};

/// A row the broker read from PostgreSQL, decoded into the table's row type with serde
/// ([`PgRow::decode`]); the driver's row stays reachable ([`PgRow::as_row`],
/// [`PgRow::as_simple_row`]) for a service that reads it by hand.
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

    /// The row as `T`, by serde, each field from the column of its name. Integers, floats,
    /// booleans, text types (`json`, `uuid` too) and `bytea` read as such; another type (a
    /// timestamp, a `numeric`) only into an ignored field: cast it in SQL, or use [`PgRow::as_row`].
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, DecodeError> {
        // A struct reads its fields from the columns of the same names (columns it does not
        // name are ignored), a tuple reads the columns in order.
        //
        // Under the extended protocol a value reads by its column's type: `smallint`,
        // `integer`, `bigint` and `oid` into any integer type that holds the value (and
        // floats); `real` and `double precision` into floats; `boolean` into `bool`; `text`,
        // `varchar`, `char(n)`, `name`, `citext`, `json`, `jsonb` and `uuid` into `String`
        // (and unit enums by name); `bytea` into `Vec<u8>` (and `serde_bytes` types); text
        // into `Vec<u8>` as its UTF-8 bytes; `NULL` into `Option::None` and `()`.
        //
        // Under the simple protocol every value is text, parsed as the field asks: integers,
        // floats, `t`/`f` booleans, and `bytea`'s `\x..` hex text into `Vec<u8>` (text without
        // the `\x` reads as its UTF-8 bytes).
        de::from_row(self)
    }

    /// The value of the column at `index`, as the deserializer and the core read it.
    pub(crate) fn cell(&self, index: usize) -> de::Cell<'_> {
        match &self.inner {
            Inner::Extended(row) => {
                let ty = row.columns()[index].type_();
                match row.try_get::<_, Raw<'_>>(index) {
                    Ok(Raw(None)) => de::Cell::Null,
                    Ok(Raw(Some(raw))) => typed_cell(ty, raw),
                    Err(error) => de::Cell::Invalid(error.to_string()),
                }
            }
            Inner::Simple(row) => match row.try_get(index) {
                Ok(Some(text)) => de::Cell::Untyped(text),
                Ok(None) => de::Cell::Null,
                Err(error) => de::Cell::Invalid(error.to_string()),
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

    /// The cell at `index` as the core reads it, as the type it declares.
    pub(crate) fn core_value(&self, index: usize, ty: ColumnType) -> Result<Value, String> {
        self.cell(index).read_as(ty)
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
        PgRow::cell(self, index)
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

fn is_text_type(ty: &Type) -> bool {
    <&str as FromSql>::accepts(ty)
}

fn typed_cell<'a>(ty: &'a Type, raw: &'a [u8]) -> de::Cell<'a> {
    fn read<'a, T: FromSql<'a>>(
        ty: &Type,
        raw: &'a [u8],
        f: impl FnOnce(T) -> de::Cell<'a>,
    ) -> de::Cell<'a> {
        match T::from_sql(ty, raw) {
            Ok(v) => f(v),
            Err(error) => de::Cell::Invalid(error.to_string()),
        }
    }
    match *ty {
        Type::BOOL => read::<bool>(ty, raw, de::Cell::Bool),
        Type::INT2 => read::<i16>(ty, raw, |v| de::Cell::Int(i64::from(v))),
        Type::INT4 => read::<i32>(ty, raw, |v| de::Cell::Int(i64::from(v))),
        Type::INT8 => read::<i64>(ty, raw, de::Cell::Int),
        Type::OID => read::<u32>(ty, raw, |v| de::Cell::Int(i64::from(v))),
        Type::FLOAT4 => read::<f32>(ty, raw, |v| de::Cell::Real(f64::from(v))),
        Type::FLOAT8 => read::<f64>(ty, raw, de::Cell::Real),
        Type::BYTEA => de::Cell::Bytes(raw),
        Type::JSON => match std::str::from_utf8(raw) {
            Ok(text) => de::Cell::Text(Cow::Borrowed(text)),
            Err(error) => de::Cell::Invalid(error.to_string()),
        },
        Type::JSONB => match raw.split_first() {
            Some((1, json)) => match std::str::from_utf8(json) {
                Ok(text) => de::Cell::Text(Cow::Borrowed(text)),
                Err(error) => de::Cell::Invalid(error.to_string()),
            },
            _ => de::Cell::Invalid("an unknown jsonb format version".to_owned()),
        },
        Type::UUID => match <[u8; 16]>::try_from(raw) {
            Ok(bytes) => de::Cell::Text(Cow::Owned(uuid_text(&bytes))),
            Err(_) => de::Cell::Invalid("a uuid of the wrong length".to_owned()),
        },
        _ if is_text_type(ty) => read::<&str>(ty, raw, |text| de::Cell::Text(Cow::Borrowed(text))),
        _ => de::Cell::Invalid(format!(
            "the type `{}` is not one ruststream reads (integers, floats, boolean, text, json, uuid, bytea): cast it in SQL, or read it from `PgRow::as_row`",
            ty.name()
        )),
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

#[cfg(test)]
mod tests {
    use super::*;

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

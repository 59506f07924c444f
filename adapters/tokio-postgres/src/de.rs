//! A serde `Deserializer` over a [`PgRow`]: a row type is `#[derive(serde::Deserialize)]`
//! here where it is `#[derive(sqlx::FromRow)]` with sqlx.

use std::fmt;

use serde::de::value::{BorrowedStrDeserializer, SeqDeserializer};
use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::forward_to_deserialize_any;

use crate::row::{Cell, PgRow};

/// Why a row does not decode into its row type: names the column at fault where there is one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    column: Option<String>,
    message: String,
}

impl DecodeError {
    /// The column whose value did not decode, if the error is about one.
    pub fn column(&self) -> Option<&str> {
        self.column.as_deref()
    }

    fn in_column(mut self, column: &str) -> Self {
        if self.column.is_none() {
            self.column = Some(column.to_owned());
        }
        self
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.column {
            Some(column) => write!(f, "column `{column}`: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for DecodeError {}

impl de::Error for DecodeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self {
            column: None,
            message: msg.to_string(),
        }
    }
}

/// The whole row: a map of column names to values (for structs), or a sequence of values (for
/// tuples).
pub(crate) struct RowDeserializer<'de> {
    row: &'de PgRow,
}

impl<'de> RowDeserializer<'de> {
    pub(crate) fn new(row: &'de PgRow) -> Self {
        Self { row }
    }
}

impl<'de> de::Deserializer<'de> for RowDeserializer<'de> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_map(Columns {
            row: self.row,
            next: 0,
        })
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_seq(Columns {
            row: self.row,
            next: 0,
        })
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        visitor.visit_newtype_struct(self)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct map struct enum identifier ignored_any
    }
}

/// The columns of a row, one at a time.
struct Columns<'de> {
    row: &'de PgRow,
    next: usize,
}

impl<'de> MapAccess<'de> for Columns<'de> {
    type Error = DecodeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DecodeError> {
        if self.next >= self.row.len() {
            return Ok(None);
        }
        seed.deserialize(BorrowedStrDeserializer::new(
            self.row.column_name(self.next),
        ))
        .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, DecodeError> {
        let i = self.next;
        self.next += 1;
        seed.deserialize(CellDeserializer {
            cell: self.row.cell(i),
        })
        .map_err(|e| e.in_column(self.row.column_name(i)))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.row.len() - self.next)
    }
}

impl<'de> SeqAccess<'de> for Columns<'de> {
    type Error = DecodeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DecodeError> {
        if self.next >= self.row.len() {
            return Ok(None);
        }
        self.next_value_seed(seed).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.row.len() - self.next)
    }
}

/// One value of a row.
struct CellDeserializer<'de> {
    cell: Cell<'de>,
}

fn unsupported(ty: &tokio_postgres::types::Type) -> DecodeError {
    de::Error::custom(format_args!(
        "the type `{}` does not decode with serde here; cast it in SQL, or read it from `PgRow::as_row`",
        ty.name()
    ))
}

/// The bytes of `bytea`'s text output: hex (`\x0a0b`), or the escape format.
fn bytea_text(text: &str) -> Result<Vec<u8>, DecodeError> {
    if let Some(hex) = text.strip_prefix("\\x") {
        if hex.len() % 2 != 0 {
            return Err(de::Error::custom("bytea hex text of odd length"));
        }
        return (0..hex.len())
            .step_by(2)
            .map(|i| {
                u8::from_str_radix(&hex[i..i + 2], 16)
                    .map_err(|_| de::Error::custom("bytea hex text holds a non-hex digit"))
            })
            .collect();
    }
    Ok(text.as_bytes().to_vec())
}

impl<'de> CellDeserializer<'de> {
    fn bytes_seq<V: Visitor<'de>>(bytes: &[u8], visitor: V) -> Result<V::Value, DecodeError> {
        let mut seq = SeqDeserializer::<_, DecodeError>::new(bytes.iter().copied());
        let value = visitor.visit_seq(&mut seq)?;
        seq.end()?;
        Ok(value)
    }

    fn integer<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.cell {
            Cell::Int(i) => visitor.visit_i64(i),
            Cell::Bool(b) => visitor.visit_i64(i64::from(b)),
            Cell::Text(text) => match text.parse::<i64>() {
                Ok(i) => visitor.visit_i64(i),
                Err(_) => match text.parse::<u64>() {
                    Ok(u) => visitor.visit_u64(u),
                    Err(_) => Err(de::Error::custom(format_args!(
                        "`{text}` is not an integer"
                    ))),
                },
            },
            _ => self.deserialize_any_inner(visitor),
        }
    }

    fn float<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.cell {
            Cell::Float(f) => visitor.visit_f64(f),
            // An integer read as a float, as SQL widens it.
            #[allow(clippy::cast_precision_loss)]
            Cell::Int(i) => visitor.visit_f64(i as f64),
            Cell::Text(text) => match text.parse::<f64>() {
                Ok(f) => visitor.visit_f64(f),
                Err(_) => Err(de::Error::custom(format_args!("`{text}` is not a number"))),
            },
            _ => self.deserialize_any_inner(visitor),
        }
    }

    fn deserialize_any_inner<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.cell {
            Cell::Null => visitor.visit_unit(),
            Cell::Bool(b) => visitor.visit_bool(b),
            Cell::Int(i) => visitor.visit_i64(i),
            Cell::Float(f) => visitor.visit_f64(f),
            Cell::Str(text) | Cell::Text(text) => visitor.visit_borrowed_str(text),
            Cell::Owned(text) => visitor.visit_string(text),
            Cell::Bytes(bytes) => visitor.visit_borrowed_bytes(bytes),
            Cell::Unsupported(ty) => Err(unsupported(ty)),
            Cell::Broken(message) => Err(de::Error::custom(message)),
        }
    }
}

impl<'de> de::Deserializer<'de> for CellDeserializer<'de> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_any_inner(visitor)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.cell {
            Cell::Int(i) => visitor.visit_bool(i != 0),
            Cell::Text(text) => match text {
                "t" | "true" => visitor.visit_bool(true),
                "f" | "false" => visitor.visit_bool(false),
                other => Err(de::Error::custom(format_args!(
                    "`{other}` is not a boolean"
                ))),
            },
            _ => self.deserialize_any_inner(visitor),
        }
    }

    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.integer(visitor)
    }

    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.integer(visitor)
    }

    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.integer(visitor)
    }

    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.integer(visitor)
    }

    fn deserialize_i128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.integer(visitor)
    }

    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.integer(visitor)
    }

    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.integer(visitor)
    }

    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.integer(visitor)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.integer(visitor)
    }

    fn deserialize_u128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.integer(visitor)
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.float(visitor)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.float(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.cell {
            Cell::Int(i) => visitor.visit_string(i.to_string()),
            Cell::Bytes(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => visitor.visit_borrowed_str(text),
                Err(_) => Err(de::Error::custom("bytea that is not UTF-8 text")),
            },
            _ => self.deserialize_any_inner(visitor),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.cell {
            Cell::Bytes(bytes) => visitor.visit_borrowed_bytes(bytes),
            Cell::Str(text) => visitor.visit_borrowed_bytes(text.as_bytes()),
            Cell::Owned(text) => visitor.visit_byte_buf(text.into_bytes()),
            Cell::Text(text) => visitor.visit_byte_buf(bytea_text(text)?),
            _ => self.deserialize_any_inner(visitor),
        }
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        // `Vec<u8>` asks for a sequence of bytes.
        match self.cell {
            Cell::Bytes(bytes) => Self::bytes_seq(bytes, visitor),
            Cell::Str(text) => Self::bytes_seq(text.as_bytes(), visitor),
            Cell::Owned(text) => Self::bytes_seq(text.as_bytes(), visitor),
            Cell::Text(text) => Self::bytes_seq(&bytea_text(text)?, visitor),
            _ => self.deserialize_any_inner(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.cell {
            Cell::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.cell {
            Cell::Null => visitor.visit_unit(),
            _ => Err(de::Error::custom("a value where the row type expects NULL")),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        match self.cell {
            Cell::Str(text) | Cell::Text(text) => {
                visitor.visit_enum(IntoDeserializer::<DecodeError>::into_deserializer(text))
            }
            Cell::Owned(text) => {
                visitor.visit_enum(IntoDeserializer::<DecodeError>::into_deserializer(text))
            }
            _ => Err(de::Error::custom(
                "an enum reads from text: a unit variant by its name",
            )),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_unit()
    }

    forward_to_deserialize_any! {
        tuple tuple_struct map struct identifier
    }
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
}

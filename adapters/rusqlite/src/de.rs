//! A serde `Deserializer` over a [`RusqliteRow`]: a row type is `#[derive(serde::Deserialize)]`
//! on SQLite where it is `#[derive(sqlx::FromRow)]` with sqlx.

use std::fmt;

use rusqlite::types::Value as SqlValue;
use serde::de::value::{BorrowedStrDeserializer, SeqDeserializer};
use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::forward_to_deserialize_any;

use crate::row::RusqliteRow;

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

/// The whole row: a map of column names to values (for structs), or a sequence of values
/// (for tuples).
pub(crate) struct RowDeserializer<'de> {
    row: &'de RusqliteRow,
}

impl<'de> RowDeserializer<'de> {
    pub(crate) fn new(row: &'de RusqliteRow) -> Self {
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
    row: &'de RusqliteRow,
    next: usize,
}

impl<'de> MapAccess<'de> for Columns<'de> {
    type Error = DecodeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DecodeError> {
        let Some(name) = self.row.columns().get(self.next) else {
            return Ok(None);
        };
        seed.deserialize(BorrowedStrDeserializer::new(name))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, DecodeError> {
        let i = self.next;
        self.next += 1;
        let name = &self.row.columns()[i];
        seed.deserialize(ValueDeserializer {
            value: &self.row.values()[i],
        })
        .map_err(|e| e.in_column(name))
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
struct ValueDeserializer<'de> {
    value: &'de SqlValue,
}

impl<'de> ValueDeserializer<'de> {
    fn bytes_seq<V: Visitor<'de>>(bytes: &'de [u8], visitor: V) -> Result<V::Value, DecodeError> {
        let mut seq = SeqDeserializer::<_, DecodeError>::new(bytes.iter().copied());
        let value = visitor.visit_seq(&mut seq)?;
        seq.end()?;
        Ok(value)
    }
}

impl<'de> de::Deserializer<'de> for ValueDeserializer<'de> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            SqlValue::Null => visitor.visit_unit(),
            SqlValue::Integer(i) => visitor.visit_i64(*i),
            SqlValue::Real(r) => visitor.visit_f64(*r),
            SqlValue::Text(t) => visitor.visit_borrowed_str(t),
            SqlValue::Blob(b) => visitor.visit_borrowed_bytes(b),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            SqlValue::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            SqlValue::Integer(i) => visitor.visit_bool(*i != 0),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            // SQLite stores a REAL with an integral value in a REAL column as an INTEGER.
            SqlValue::Integer(i) => visitor.visit_f64(*i as f64),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            SqlValue::Blob(b) => match std::str::from_utf8(b) {
                Ok(s) => visitor.visit_borrowed_str(s),
                Err(_) => visitor.visit_borrowed_bytes(b),
            },
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            SqlValue::Text(t) => visitor.visit_borrowed_bytes(t.as_bytes()),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_bytes(visitor)
    }

    /// `Vec<u8>` asks for a sequence: a `BLOB` (or a `TEXT`'s bytes) gives one of its bytes.
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            SqlValue::Blob(b) => Self::bytes_seq(b, visitor),
            SqlValue::Text(t) => Self::bytes_seq(t.as_bytes(), visitor),
            _ => self.deserialize_any(visitor),
        }
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
        match self.value {
            SqlValue::Text(t) => visitor.visit_enum(t.as_str().into_deserializer()),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_unit()
    }

    forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 char unit unit_struct tuple tuple_struct map
        struct identifier
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

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

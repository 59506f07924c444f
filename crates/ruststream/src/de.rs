//! A serde `Deserializer` over a driver's row: a row type is `#[derive(serde::Deserialize)]`
//! on an adapter whose driver has no row mapping of its own.
//!
//! An adapter implements [`Row`] for its row type: the columns' names, and each column's value
//! as a [`Cell`] borrowed from the row. [`from_row`] (or [`RowDeserializer`]) then decodes the
//! row into any `T: Deserialize`: a struct reads its fields from the columns of the same names
//! (columns it does not name are ignored), a tuple reads the columns in order. An error names
//! the column at fault ([`DecodeError::column`]).
//!
//! What each [`Cell`] reads into:
//!
//! | cell | reads into |
//! |---|---|
//! | [`Cell::Null`] | `Option::None`, `()` |
//! | [`Cell::Bool`] | `bool`, integers (0 or 1) |
//! | [`Cell::Int`] | any integer type that holds its value, floats, `bool` (non-zero is `true`), `String` (its decimal text) |
//! | [`Cell::Real`] | floats |
//! | [`Cell::Text`] | `String` and `&str`-like types, unit enums by variant name, `Vec<u8>` as its UTF-8 bytes |
//! | [`Cell::Bytes`] | `Vec<u8>` (and `serde_bytes` types), `String` when it is UTF-8 |
//! | [`Cell::Untyped`] | as the field asks: integers, floats, `bool` (`t`, `true`, `f`, `false`), text, unit enums, bytes ([`Row::untyped_bytes`]) |
//! | [`Cell::Invalid`] | nothing but an ignored field: anything else fails with its message |

use std::borrow::Cow;
use std::fmt;

use ruststream_core::{ColumnType, Value};
use serde::de::value::{BorrowedStrDeserializer, SeqDeserializer};
use serde::de::{
    self, Deserialize, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};
use serde::forward_to_deserialize_any;

/// A row an adapter's driver read: named columns, each with a value.
///
/// Indexes run from 0 to [`Row::column_count`] (exclusive), in the statement's order.
pub trait Row {
    /// How many columns the row has.
    fn column_count(&self) -> usize;

    /// The name of the column at `index`.
    fn column_name(&self, index: usize) -> &str;

    /// The value of the column at `index`.
    fn cell(&self, index: usize) -> Cell<'_>;

    /// The bytes a [`Cell::Untyped`]'s text stands for when a field reads it as `Vec<u8>`
    /// (default: its UTF-8 bytes); an adapter whose driver prints binary in its own format
    /// (PostgreSQL's `\x` hex) decodes it here. An `Err` is the [`DecodeError`]'s message.
    fn untyped_bytes<'a>(&self, text: &'a str) -> Result<Cow<'a, [u8]>, String> {
        Ok(Cow::Borrowed(text.as_bytes()))
    }
}

/// One value of a [`Row`], borrowed from it where it can be.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell<'a> {
    /// `NULL`.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Real(f64),
    /// Text of a text type: borrowed from the row, or formatted by the adapter (a `uuid`).
    Text(Cow<'a, str>),
    /// Binary data.
    Bytes(&'a [u8]),
    /// Text of a value whose type the row does not tell (PostgreSQL's simple query protocol):
    /// it is parsed as the field asks.
    Untyped(&'a str),
    /// A value the adapter does not read (of a type it does not decode, or malformed), with
    /// the reason: it decodes into an ignored field only.
    Invalid(String),
}

impl Cell<'_> {
    /// The cell as the core reads it for a statement's column, of the type the core declares
    /// (an adapter's reader for [`read_rows`](ruststream_core::read_rows)). A float reads as
    /// its text, an untyped cell is parsed as `ty`, and an invalid one fails with its reason.
    pub fn read_as(self, ty: ColumnType) -> Result<Value, String> {
        let natural = match self {
            Cell::Null => Value::Null,
            Cell::Bool(b) => Value::Bool(b),
            Cell::Int(i) => Value::Int(i),
            Cell::Real(f) => Value::Text(f.to_string()),
            Cell::Text(text) => Value::Text(text.into_owned()),
            Cell::Bytes(bytes) => Value::Bytes(bytes.to_vec()),
            Cell::Untyped(text) => return ty.read_text(text),
            Cell::Invalid(message) => return Err(message),
        };
        ty.read(natural)
    }
}

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

/// The row as `T`, by serde: see the [module](self) documentation.
pub fn from_row<'de, T: Deserialize<'de>, R: Row + ?Sized>(row: &'de R) -> Result<T, DecodeError> {
    T::deserialize(RowDeserializer::new(row))
}

/// The whole row: a map of column names to values (for structs), or a sequence of values (for
/// tuples).
pub struct RowDeserializer<'de, R: ?Sized> {
    row: &'de R,
}

impl<'de, R: Row + ?Sized> RowDeserializer<'de, R> {
    /// A deserializer of `row`.
    pub fn new(row: &'de R) -> Self {
        Self { row }
    }
}

impl<R: ?Sized> fmt::Debug for RowDeserializer<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowDeserializer").finish_non_exhaustive()
    }
}

impl<'de, R: Row + ?Sized> de::Deserializer<'de> for RowDeserializer<'de, R> {
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
struct Columns<'de, R: ?Sized> {
    row: &'de R,
    next: usize,
}

impl<R: Row + ?Sized> Columns<'_, R> {
    fn remaining(&self) -> usize {
        self.row.column_count().saturating_sub(self.next)
    }
}

impl<'de, R: Row + ?Sized> MapAccess<'de> for Columns<'de, R> {
    type Error = DecodeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DecodeError> {
        if self.next >= self.row.column_count() {
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
            row: self.row,
            cell: self.row.cell(i),
        })
        .map_err(|e| e.in_column(self.row.column_name(i)))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.remaining())
    }
}

impl<'de, R: Row + ?Sized> SeqAccess<'de> for Columns<'de, R> {
    type Error = DecodeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DecodeError> {
        if self.next >= self.row.column_count() {
            return Ok(None);
        }
        self.next_value_seed(seed).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.remaining())
    }
}

/// One value of a row.
struct CellDeserializer<'de, R: ?Sized> {
    row: &'de R,
    cell: Cell<'de>,
}

/// A sequence of `bytes`, one `u8` each: what `Vec<u8>` asks for.
fn bytes_seq<'de, V: Visitor<'de>>(bytes: &[u8], visitor: V) -> Result<V::Value, DecodeError> {
    let mut seq = SeqDeserializer::<_, DecodeError>::new(bytes.iter().copied());
    let value = visitor.visit_seq(&mut seq)?;
    seq.end()?;
    Ok(value)
}

impl<'de, R: Row + ?Sized> CellDeserializer<'de, R> {
    fn untyped_bytes(&self, text: &'de str) -> Result<Cow<'de, [u8]>, DecodeError> {
        self.row.untyped_bytes(text).map_err(de::Error::custom)
    }

    fn integer<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.cell {
            Cell::Int(i) => visitor.visit_i64(i),
            Cell::Bool(b) => visitor.visit_i64(i64::from(b)),
            Cell::Untyped(text) => match text.parse::<i64>() {
                Ok(i) => visitor.visit_i64(i),
                Err(_) => match text.parse::<u64>() {
                    Ok(u) => visitor.visit_u64(u),
                    Err(_) => Err(de::Error::custom(format_args!(
                        "`{text}` is not an integer"
                    ))),
                },
            },
            _ => self.any(visitor),
        }
    }

    fn float<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.cell {
            Cell::Real(f) => visitor.visit_f64(f),
            // An integer read as a float, as SQL widens it (and SQLite stores a REAL with an
            // integral value in a REAL column as an INTEGER).
            #[allow(clippy::cast_precision_loss)]
            Cell::Int(i) => visitor.visit_f64(i as f64),
            Cell::Untyped(text) => match text.parse::<f64>() {
                Ok(f) => visitor.visit_f64(f),
                Err(_) => Err(de::Error::custom(format_args!("`{text}` is not a number"))),
            },
            _ => self.any(visitor),
        }
    }

    fn any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.cell {
            Cell::Null => visitor.visit_unit(),
            Cell::Bool(b) => visitor.visit_bool(b),
            Cell::Int(i) => visitor.visit_i64(i),
            Cell::Real(f) => visitor.visit_f64(f),
            Cell::Text(Cow::Borrowed(text)) | Cell::Untyped(text) => {
                visitor.visit_borrowed_str(text)
            }
            Cell::Text(Cow::Owned(text)) => visitor.visit_string(text),
            Cell::Bytes(bytes) => visitor.visit_borrowed_bytes(bytes),
            Cell::Invalid(message) => Err(de::Error::custom(message)),
        }
    }
}

impl<'de, R: Row + ?Sized> de::Deserializer<'de> for CellDeserializer<'de, R> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.any(visitor)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.cell {
            Cell::Int(i) => visitor.visit_bool(i != 0),
            Cell::Untyped(text) => match text {
                "t" | "true" => visitor.visit_bool(true),
                "f" | "false" => visitor.visit_bool(false),
                other => Err(de::Error::custom(format_args!(
                    "`{other}` is not a boolean"
                ))),
            },
            _ => self.any(visitor),
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
            // Bytes that are not UTF-8 go to the visitor as they are: `String` refuses them.
            Cell::Bytes(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => visitor.visit_borrowed_str(text),
                Err(_) => visitor.visit_borrowed_bytes(bytes),
            },
            _ => self.any(visitor),
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
            Cell::Text(Cow::Borrowed(text)) => visitor.visit_borrowed_bytes(text.as_bytes()),
            Cell::Text(Cow::Owned(text)) => visitor.visit_byte_buf(text.into_bytes()),
            Cell::Untyped(text) => match self.untyped_bytes(text)? {
                Cow::Borrowed(bytes) => visitor.visit_borrowed_bytes(bytes),
                Cow::Owned(bytes) => visitor.visit_byte_buf(bytes),
            },
            _ => self.any(visitor),
        }
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_bytes(visitor)
    }

    /// `Vec<u8>` asks for a sequence: binary data (or text's bytes) gives one of its bytes.
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match &self.cell {
            Cell::Bytes(bytes) => bytes_seq(bytes, visitor),
            Cell::Text(text) => bytes_seq(text.as_bytes(), visitor),
            Cell::Untyped(text) => bytes_seq(&self.untyped_bytes(text)?, visitor),
            _ => self.any(visitor),
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
            Cell::Invalid(message) => Err(de::Error::custom(message)),
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
            Cell::Text(Cow::Borrowed(text)) | Cell::Untyped(text) => {
                visitor.visit_enum(IntoDeserializer::<DecodeError>::into_deserializer(text))
            }
            Cell::Text(Cow::Owned(text)) => {
                visitor.visit_enum(IntoDeserializer::<DecodeError>::into_deserializer(text))
            }
            Cell::Invalid(message) => Err(de::Error::custom(message)),
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
    use serde::Deserialize;

    use super::*;

    #[test]
    fn cells_read_as_the_core_declares_their_columns() {
        use ruststream_core::Value as CoreValue;
        let read = |cell: Cell<'_>, ty| cell.read_as(ty);
        assert_eq!(
            read(Cell::Int(7), ColumnType::Text),
            Ok(CoreValue::Text("7".into()))
        );
        assert_eq!(
            read(Cell::Int(1), ColumnType::Bool),
            Ok(CoreValue::Bool(true))
        );
        assert_eq!(
            read(Cell::Text("5".into()), ColumnType::Int),
            Ok(CoreValue::Int(5))
        );
        assert_eq!(
            read(Cell::Real(1.5), ColumnType::Id),
            Ok(CoreValue::Text("1.5".into()))
        );
        assert_eq!(
            read(Cell::Bytes(b"k"), ColumnType::Text),
            Ok(CoreValue::Text("k".into()))
        );
        assert_eq!(read(Cell::Null, ColumnType::Bool), Ok(CoreValue::Null));
        assert_eq!(
            read(Cell::Untyped("t"), ColumnType::Bool),
            Ok(CoreValue::Bool(true))
        );
        assert_eq!(
            read(Cell::Untyped("42"), ColumnType::Id),
            Ok(CoreValue::Int(42))
        );
        assert_eq!(
            read(Cell::Untyped("007"), ColumnType::Id),
            Ok(CoreValue::Text("007".into()))
        );
        assert!(read(Cell::Untyped("x"), ColumnType::Int).is_err());
        assert_eq!(
            read(Cell::Invalid("odd".into()), ColumnType::Text),
            Err("odd".into())
        );
    }

    /// A row of owned values, as a test builds one.
    struct TestRow {
        columns: Vec<(&'static str, Value)>,
        hex_bytes: bool,
    }

    enum Value {
        Null,
        Bool(bool),
        Int(i64),
        Real(f64),
        Text(&'static str),
        Formatted(&'static str),
        Bytes(Vec<u8>),
        Untyped(&'static str),
        Invalid(&'static str),
    }

    impl Row for TestRow {
        fn column_count(&self) -> usize {
            self.columns.len()
        }

        fn column_name(&self, index: usize) -> &str {
            self.columns[index].0
        }

        fn cell(&self, index: usize) -> Cell<'_> {
            match &self.columns[index].1 {
                Value::Null => Cell::Null,
                Value::Bool(b) => Cell::Bool(*b),
                Value::Int(i) => Cell::Int(*i),
                Value::Real(f) => Cell::Real(*f),
                Value::Text(t) => Cell::Text(Cow::Borrowed(t)),
                Value::Formatted(t) => Cell::Text(Cow::Owned((*t).to_owned())),
                Value::Bytes(b) => Cell::Bytes(b),
                Value::Untyped(t) => Cell::Untyped(t),
                Value::Invalid(m) => Cell::Invalid((*m).to_owned()),
            }
        }

        fn untyped_bytes<'a>(&self, text: &'a str) -> Result<Cow<'a, [u8]>, String> {
            match text.strip_prefix("0x") {
                Some(hex) if self.hex_bytes => (0..hex.len())
                    .step_by(2)
                    .map(|i| {
                        hex.get(i..i + 2)
                            .and_then(|h| u8::from_str_radix(h, 16).ok())
                            .ok_or_else(|| "not hex".to_owned())
                    })
                    .collect::<Result<Vec<u8>, String>>()
                    .map(Cow::Owned),
                _ => Ok(Cow::Borrowed(text.as_bytes())),
            }
        }
    }

    fn row(columns: Vec<(&'static str, Value)>) -> TestRow {
        TestRow {
            columns,
            hex_bytes: false,
        }
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
        uid: String,
        note: Option<String>,
        locked_until: Option<i64>,
        score: f64,
        whole: f32,
        flag: bool,
        on: bool,
        state: State,
    }

    #[test]
    fn decodes_a_struct_by_column_names() {
        let r = row(vec![
            ("id", Value::Int(9)),
            ("extra", Value::Invalid("not read")),
            ("attempt", Value::Int(2)),
            ("small", Value::Int(-3)),
            ("payload", Value::Bytes(b"{\"a\":1}".to_vec())),
            ("name", Value::Text("x")),
            ("uid", Value::Formatted("1234")),
            ("note", Value::Null),
            ("locked_until", Value::Int(77)),
            ("score", Value::Real(0.5)),
            ("whole", Value::Int(2)),
            ("flag", Value::Int(1)),
            ("on", Value::Bool(true)),
            ("state", Value::Text("done")),
        ]);
        let job: Job = from_row(&r).unwrap();
        assert_eq!(
            job,
            Job {
                id: 9,
                attempt: 2,
                small: -3,
                payload: b"{\"a\":1}".to_vec(),
                name: "x".into(),
                uid: "1234".into(),
                note: None,
                locked_until: Some(77),
                score: 0.5,
                whole: 2.0,
                flag: true,
                on: true,
                state: State::Done,
            }
        );
        let _ = State::New;
    }

    #[test]
    fn decodes_untyped_text_as_the_field_asks() {
        let mut r = row(vec![
            ("id", Value::Untyped("9")),
            ("attempt", Value::Untyped("2")),
            ("small", Value::Untyped("-3")),
            ("payload", Value::Untyped("0x00ff")),
            ("name", Value::Untyped("x")),
            ("uid", Value::Untyped("1234")),
            ("note", Value::Null),
            ("locked_until", Value::Untyped("77")),
            ("score", Value::Untyped("0.5")),
            ("whole", Value::Untyped("2")),
            ("flag", Value::Untyped("t")),
            ("on", Value::Untyped("true")),
            ("state", Value::Untyped("new")),
        ]);
        r.hex_bytes = true;
        let job: Job = from_row(&r).unwrap();
        assert_eq!(job.payload, vec![0, 255]);
        assert_eq!((job.id, job.attempt, job.small), (9, 2, -3));
        assert_eq!((job.score, job.whole), (0.5, 2.0));
        assert!(job.flag && job.on);
        assert_eq!(job.state, State::New);

        let big: (u64,) =
            from_row(&row(vec![("n", Value::Untyped("18446744073709551615"))])).unwrap();
        assert_eq!(big.0, u64::MAX);
        let error = from_row::<(i64,), _>(&row(vec![("n", Value::Untyped("x"))])).unwrap_err();
        assert_eq!(error.to_string(), "column `n`: `x` is not an integer");
        let error = from_row::<(bool,), _>(&row(vec![("b", Value::Untyped("x"))])).unwrap_err();
        assert_eq!(error.to_string(), "column `b`: `x` is not a boolean");
        let mut r = row(vec![("p", Value::Untyped("0xzz"))]);
        r.hex_bytes = true;
        let error = from_row::<(Vec<u8>,), _>(&r).unwrap_err();
        assert_eq!(error.to_string(), "column `p`: not hex");
    }

    #[test]
    fn decodes_a_tuple_in_column_order() {
        let r = row(vec![("a", Value::Int(1)), ("b", Value::Bytes(vec![1, 2]))]);
        let (a, b): (i64, Vec<u8>) = from_row(&r).unwrap();
        assert_eq!((a, b), (1, vec![1, 2]));
        let (text,): (Vec<u8>,) = from_row(&row(vec![("t", Value::Text("ab"))])).unwrap();
        assert_eq!(text, b"ab".to_vec());
    }

    #[test]
    fn errors_name_the_column() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Narrow {
            attempt: i16,
        }
        let error = from_row::<Narrow, _>(&row(vec![("attempt", Value::Int(70_000))])).unwrap_err();
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
        let error = from_row::<Bytes, _>(&row(vec![("payload", Value::Int(1))])).unwrap_err();
        assert_eq!(error.column(), Some("payload"));
        let error = from_row::<Bytes, _>(&row(vec![("other", Value::Int(1))])).unwrap_err();
        assert_eq!(error.column(), None);
        assert!(
            error.to_string().contains("missing field `payload`"),
            "{error}"
        );
        assert!(
            from_row::<Bytes, _>(&row(vec![("payload", Value::Null)])).is_err(),
            "NULL is no Vec<u8>"
        );

        let error = from_row::<(String,), _>(&row(vec![("at", Value::Invalid("a timestamptz"))]))
            .unwrap_err();
        assert_eq!(error.to_string(), "column `at`: a timestamptz");
        let error = from_row::<(State,), _>(&row(vec![("s", Value::Int(1))])).unwrap_err();
        assert_eq!(error.column(), Some("s"));
        let error =
            from_row::<(String,), _>(&row(vec![("s", Value::Bytes(vec![0xff]))])).unwrap_err();
        assert_eq!(error.column(), Some("s"));
    }
}

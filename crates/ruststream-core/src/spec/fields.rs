//! The fields of a row type that the start check compares with the table's columns.

/// What a Rust field of a row type holds, as far as the start check tells types apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldKind {
    /// An integer type (`i64`, `i32`, ..).
    Integer,
    /// Text (`String`).
    Text,
    /// Bytes (`Vec<u8>`).
    Bytes,
    /// A zone-aware date and time type (`chrono::DateTime`, `time::OffsetDateTime`, ..).
    Time,
    /// A date and time without a zone (`chrono::NaiveDateTime`, `time::PrimitiveDateTime`).
    LocalTime,
    /// Anything else: not checked.
    Other,
}

/// A field of a row type that decodes a role column (a time, the attempt, the payload, the
/// error): the start compares its type with the column's, so a row type that cannot decode
/// the column stops the service at start, naming the column, instead of failing every job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowField {
    /// The column it decodes.
    pub column: &'static str,
    /// The field's name.
    pub field: &'static str,
    /// The field's Rust type, as written.
    pub rust: &'static str,
    /// What the type holds.
    pub kind: FieldKind,
}

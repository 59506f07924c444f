//! What a row type tells the runtime about its table.

use ruststream_core::spec::Described;

/// A row type of a queue table, with its description.
pub trait InboxTable: Sized + Send + Sync + 'static {
    /// The primary key's type.
    type Id;
    /// The description's type, which lists its features: `InboxSpec<(Advisory, Payload)>`.
    type Table: Described;
    /// The description.
    const TABLE: Self::Table;
    /// The fields that decode the description's role columns (times, the attempt, the
    /// payload, the error), which the start check compares with the columns' types
    /// (`#[derive(Inbox)]` lists them; none by default).
    const ROW_FIELDS: &'static [ruststream_core::RowField] = &[];

    /// The row's id.
    fn id(&self) -> &Self::Id;
}

/// A row that carries an encoded message.
pub trait PayloadRow {
    /// The column's Rust type.
    type Column;

    /// The encoded message.
    fn payload(&self) -> &[u8];
}

/// A row that counts its takes.
pub trait AttemptRow {
    /// The column's Rust type.
    type Attempt;

    /// The attempt count.
    fn attempt(&self) -> &Self::Attempt;
}

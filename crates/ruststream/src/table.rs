//! What a row type tells the runtime about its table.

use ruststream_core::spec::{Accepts, Described, Features};

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

/// A table whose payload holds one message type: `#[inbox(message = Report)]`, or by hand. A
/// publisher of the table then takes `&Report` ([`IntoRow`](crate::IntoRow)), whose fields
/// give the key's columns, so a message without a field the key reads does not compile.
///
/// ```
/// use ruststream::{Inbox, MessageTable};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Report {
///     account: i64,
///     month: String,
/// }
///
/// /// The key reads `account`, and so does every report published into the table.
/// #[derive(Inbox)]
/// #[inbox(table = "reports", advisory_lock = "reports-{account}", message = Report)]
/// struct ReportJob {
///     #[field(id, generated)]
///     id: i64,
///     account: i64,
///     #[field(payload)]
///     payload: Vec<u8>,
/// }
///
/// let row = ReportJob::message_row(&Report { account: 7, month: "2026-11".into() }).unwrap();
/// # let _ = row;
/// ```
pub trait MessageTable: InboxTable {
    /// The message the payload holds.
    type Message: serde::Serialize + Send + Sync + 'static;

    /// The row to publish for `message`: its payload (JSON), and the key's columns read from
    /// its fields.
    fn message_row(message: &Self::Message) -> Result<crate::Message, crate::PublishError>;
}

/// A table whose rows a subscriber may decode as `M`: every table, unless its description
/// names the one message its payload holds (`message = Report`); then a handler of another
/// message does not compile. Generic code states it as a bound (`T: DecodesAs<Job>`).
#[diagnostic::on_unimplemented(
    message = "`{Self}`'s description names the message its payload holds, and this subscriber decodes another: `{M}`",
    label = "decode the message `{Self}` names (`MessageTable::Message`) in the handler"
)]
pub trait DecodesAs<M> {}

impl<T, M> DecodesAs<M> for T
where
    T: InboxTable,
    <<T::Table as Described>::Features as Features>::Message: Accepts<M>,
{
}

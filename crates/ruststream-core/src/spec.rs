//! Table descriptions: which columns a queue table has and which form takes its rows.
//!
//! A description is built in a `const`, and its features are written into its type:
//!
//! ```
//! use ruststream_core::spec::{Advisory, Attempt, Column, InboxSpec, KeyPart, Payload};
//!
//! const TABLE: InboxSpec<(Advisory, Attempt, Payload)> =
//!     InboxSpec::new("video_jobs", Column::new("id").generated())
//!         .advisory(&[KeyPart::Literal("video_jobs-"), KeyPart::Column("channel")])
//!         .attempt(Column::new("attempt").generated())
//!         .payload(Column::new("payload"));
//!
//! assert_eq!(TABLE.desc().form(), ruststream_core::spec::Form::Advisory);
//! ```
//!
//! The rules a description must keep are checked by the type system, each with a message that
//! names the rule: [`own::Lock`] and [`own::Unlock`] come together and only in the advisory
//! lock form, a description names at most one form, and a dialect without row locks (SQLite)
//! does not take the row lock form. See [`Described`] and [`ValidOn`].

use std::marker::PhantomData;

mod features;
mod fields;

use bits::{Bit, False, True};
pub use features::*;
pub use fields::{FieldKind, RowField};

/// A column of a queue table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Column {
    /// The column's name, unquoted.
    pub name: &'static str,
    /// Whether the database fills the column (an identity, a serial or a default): publishing
    /// does not write it.
    pub generated: bool,
}

impl Column {
    /// A column of this name, written by the service.
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            generated: false,
        }
    }

    /// The same column, filled by the database.
    pub const fn generated(self) -> Self {
        Self {
            name: self.name,
            generated: true,
        }
    }
}

/// A part of an advisory lock key: literal text or the text of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyPart {
    /// Text written into every key as it stands.
    Literal(&'static str),
    /// The value of this column, rendered as text by the database.
    Column(&'static str),
}

/// One column of the claim order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OrderBy {
    /// The column's name.
    pub column: &'static str,
    /// Largest first, instead of smallest first.
    pub descending: bool,
}

impl OrderBy {
    /// Smallest first.
    pub const fn asc(column: &'static str) -> Self {
        Self {
            column,
            descending: false,
        }
    }

    /// Largest first.
    pub const fn desc(column: &'static str) -> Self {
        Self {
            column,
            descending: true,
        }
    }
}

/// How many errors a row's error history keeps: the newest, once a row has failed more often.
pub const ERRORS_KEPT: usize = 10;

/// The form in which a table's rows are held while in work ([the forms](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Form {
    /// `FOR UPDATE SKIP LOCKED` in a transaction held while the handler runs: the default.
    RowLock,
    /// An expiry written into the row (`locked_until`), extended while in work.
    Lease,
    /// A lock on the row's key, held by the delivery's own connection.
    Advisory,
}

impl Form {
    /// The form's name as the documentation writes it.
    pub const fn name(self) -> &'static str {
        match self {
            Form::RowLock => "row lock",
            Form::Lease => "lease",
            Form::Advisory => "advisory lock",
        }
    }
}

/// How a table's rows are held while in work: the form, with what only that form reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// A row lock, in a transaction held while the handler runs: the default.
    RowLock,
    /// A lease: an expiry written into the row, extended while in work.
    Lease {
        /// The column that holds the lease's expiry.
        locked_until: Column,
    },
    /// A lock on the row's key, held by the delivery's own connection.
    Advisory {
        /// The key's parts.
        key: &'static [KeyPart],
        /// The service's own `Lock` and `Unlock` replace the dialect's.
        custom_lock: bool,
    },
}

impl Hold {
    /// The form this hold is.
    pub const fn form(self) -> Form {
        match self {
            Hold::RowLock => Form::RowLock,
            Hold::Lease { .. } => Form::Lease,
            Hold::Advisory { .. } => Form::Advisory,
        }
    }
}

/// The untyped content of a description: what the machines and the dialects read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableDesc {
    /// The table's name, unquoted. A `schema.table` name is quoted part by part.
    pub table: &'static str,
    /// The primary key.
    pub id: Column,
    /// The message's encoded body.
    pub payload: Option<Column>,
    /// The number of takes so far; each take adds one.
    pub attempt: Option<Column>,
    /// Settling marks this column with the time instead of deleting the row.
    pub processed_at: Option<Column>,
    /// A row is claimable once this time has come.
    pub due: Option<Column>,
    /// A failed row is marked with the time here and is never claimed again, until it is
    /// returned to the queue by hand.
    pub failed_at: Option<Column>,
    /// The text of a row's last error: why it failed, or why its last attempt was retried.
    pub error: Option<Column>,
    /// A JSON array of the row's last [`ERRORS_KEPT`] errors, each with its attempt and time.
    pub errors: Option<Column>,
    /// The form that holds a row while it is in work, with the columns the form reads.
    pub hold: Hold,
    /// The claim order; empty means the due column (if any), then the id.
    pub order: &'static [OrderBy],
    /// The columns of a unique index that deduplicates publishes: a publish of a row whose
    /// values there are already in the table writes nothing. Empty: every publish writes.
    pub unique: &'static [&'static str],
}

impl TableDesc {
    /// The form the description selects.
    pub const fn form(&self) -> Form {
        self.hold.form()
    }

    /// Whether the service's own `Lock` and `Unlock` replace the dialect's.
    pub const fn custom_lock(&self) -> bool {
        matches!(
            self.hold,
            Hold::Advisory {
                custom_lock: true,
                ..
            }
        )
    }

    /// The lease form: the column that holds the lease's expiry.
    pub const fn locked_until(&self) -> Option<Column> {
        match self.hold {
            Hold::Lease { locked_until } => Some(locked_until),
            Hold::RowLock | Hold::Advisory { .. } => None,
        }
    }

    /// The advisory lock form: the key's parts.
    pub const fn advisory(&self) -> Option<&'static [KeyPart]> {
        match self.hold {
            Hold::Advisory { key, .. } => Some(key),
            Hold::RowLock | Hold::Lease { .. } => None,
        }
    }

    /// Every column the description names, each once, in a stable order: the id, the
    /// described columns, the key's columns, then the order's columns.
    pub fn columns(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = vec![self.id.name];
        let described = [
            self.payload,
            self.attempt,
            self.locked_until(),
            self.processed_at,
            self.due,
            self.failed_at,
            self.error,
            self.errors,
        ];
        for column in described.into_iter().flatten() {
            push_unique(&mut out, column.name);
        }
        for column in self.key_columns() {
            push_unique(&mut out, column);
        }
        for order in self.order {
            push_unique(&mut out, order.column);
        }
        out
    }

    /// The columns the advisory key reads, each once, in the key's order.
    pub fn key_columns(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for part in self.advisory().unwrap_or(&[]) {
            if let KeyPart::Column(name) = part {
                push_unique(&mut out, name);
            }
        }
        out
    }

    /// Checks what the type system cannot: names that are empty or repeated in two roles, a
    /// key with no parts, a key column that is empty.
    pub fn validate(&self) -> Result<(), DescError> {
        let table = self.table;
        if table.trim().is_empty() {
            return Err(DescError::EmptyName {
                table,
                role: "table",
            });
        }
        self.validate_roles()?;
        self.validate_form()?;
        for order in self.order {
            if order.column.trim().is_empty() {
                return Err(DescError::EmptyName {
                    table,
                    role: "order",
                });
            }
        }
        self.validate_unique()
    }

    /// The columns by role, the id first.
    fn roles(&self) -> [(&'static str, Option<Column>); 9] {
        [
            ("id", Some(self.id)),
            ("payload", self.payload),
            ("attempt", self.attempt),
            ("locked_until", self.locked_until()),
            ("processed_at", self.processed_at),
            ("due", self.due),
            ("failed_at", self.failed_at),
            ("error", self.error),
            ("errors", self.errors),
        ]
    }

    /// No role's column is unnamed, and no column has two roles.
    fn validate_roles(&self) -> Result<(), DescError> {
        let table = self.table;
        let roles = self.roles();
        for (i, (role, column)) in roles.iter().enumerate() {
            let Some(column) = column else { continue };
            if column.name.trim().is_empty() {
                return Err(DescError::EmptyName { table, role });
            }
            for (other_role, other) in &roles[i + 1..] {
                if other.is_some_and(|o| o.name == column.name) {
                    return Err(DescError::SameColumn {
                        table,
                        column: column.name,
                        first: role,
                        second: other_role,
                    });
                }
            }
        }
        Ok(())
    }

    /// An advisory key of named parts.
    fn validate_form(&self) -> Result<(), DescError> {
        let table = self.table;
        let Some(parts) = self.advisory() else {
            return Ok(());
        };
        if parts.is_empty() {
            return Err(DescError::EmptyKey { table });
        }
        for part in parts {
            if let KeyPart::Column(name) = part
                && name.trim().is_empty()
            {
                return Err(DescError::EmptyName {
                    table,
                    role: "advisory key column",
                });
            }
        }
        Ok(())
    }

    /// The columns of the unique index that deduplicates publishes: named, and none of them
    /// a role's column but a written id.
    fn validate_unique(&self) -> Result<(), DescError> {
        let table = self.table;
        let roles = self.roles();
        for &column in self.unique {
            if column.trim().is_empty() {
                return Err(DescError::EmptyName {
                    table,
                    role: "unique column",
                });
            }
            if roles
                .iter()
                .flat_map(|(_, c)| c)
                .any(|c| c.name == column && (c.generated || c.name != self.id.name))
            {
                return Err(DescError::UniqueRoleColumn { table, column });
            }
        }
        Ok(())
    }
}

fn push_unique(out: &mut Vec<&'static str>, name: &'static str) {
    if !out.contains(&name) {
        out.push(name);
    }
}

/// A description that breaks a rule, found when it is checked at run time.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DescError {
    /// A name is empty.
    #[error("table `{table}`: the {role} name is empty")]
    EmptyName {
        /// The table.
        table: &'static str,
        /// What the name is for.
        role: &'static str,
    },
    /// One column is named in two roles.
    #[error("table `{table}`: column `{column}` is named both as {first} and as {second}")]
    SameColumn {
        /// The table.
        table: &'static str,
        /// The column.
        column: &'static str,
        /// Its first role.
        first: &'static str,
        /// Its second role.
        second: &'static str,
    },
    /// A unique column of deduplicated publishing is one the queue or the database writes (a
    /// role column other than an id the publish gives), so no publish names its value.
    #[error(
        "table `{table}`: unique column `{column}` is written by the queue or filled by the database, so no publish gives its value; name the columns a publish gives (the key's, or an id that is not generated)"
    )]
    UniqueRoleColumn {
        /// The table.
        table: &'static str,
        /// The column.
        column: &'static str,
    },
    /// An advisory key with no parts.
    #[error("table `{table}`: the advisory lock key has no parts")]
    EmptyKey {
        /// The table.
        table: &'static str,
    },
    /// A setting needs a column the description does not name.
    #[error(
        "table `{table}`: {setting} needs the table's {role} column, and the description names none; add `{method}"
    )]
    NeedsColumn {
        /// The table.
        table: &'static str,
        /// The setting.
        setting: &'static str,
        /// The column's role.
        role: &'static str,
        /// How to name it.
        method: &'static str,
    },
    /// The row lock form on a dialect without row locks.
    #[error(
        "table `{table}`: {dialect} has no row locks; name `locked_until` (the lease form) or `advisory_lock` (the advisory lock form)"
    )]
    NoRowLocks {
        /// The table.
        table: &'static str,
        /// The dialect.
        dialect: &'static str,
    },
}

/// A table description whose features are written into its type `F`, a tuple of feature
/// markers such as `(Advisory, Attempt, Payload)`. Each builder method appends its marker.
pub struct InboxSpec<F = ()> {
    desc: TableDesc,
    /// Whether `own::Lock` and `own::Unlock` are named so far: the key's lock is the
    /// service's own once both are, in the advisory lock form.
    own: (bool, bool),
    features: PhantomData<fn() -> F>,
}

impl<F> Clone for InboxSpec<F> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<F> Copy for InboxSpec<F> {}

impl<F> std::fmt::Debug for InboxSpec<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("InboxSpec").field(&self.desc).finish()
    }
}

impl InboxSpec<()> {
    /// A table of this name whose primary key is `id`. Without more, its rows are taken by
    /// row lock.
    pub const fn new(table: &'static str, id: Column) -> Self {
        Self {
            desc: TableDesc {
                table,
                id,
                payload: None,
                attempt: None,
                processed_at: None,
                due: None,
                failed_at: None,
                error: None,
                errors: None,
                hold: Hold::RowLock,
                order: &[],
                unique: &[],
            },
            own: (false, false),
            features: PhantomData,
        }
    }
}

impl<F> InboxSpec<F> {
    /// The untyped description.
    pub const fn desc(&self) -> &TableDesc {
        &self.desc
    }

    /// The table's schema in `dialect`: its `CREATE TABLE` and its indexes
    /// ([`Ddl`](crate::Ddl), whose `Display` writes the statements).
    pub fn ddl(&self, dialect: crate::Dialect) -> crate::Ddl {
        crate::Ddl::new(dialect, &self.desc)
    }

    const fn with<G>(self, desc: TableDesc) -> InboxSpec<G> {
        InboxSpec {
            desc,
            own: self.own,
            features: PhantomData,
        }
    }

    /// The column that holds the message's encoded body.
    pub const fn payload(self, column: Column) -> InboxSpec<F::Out>
    where
        F: Append<Payload>,
    {
        let mut desc = self.desc;
        desc.payload = Some(column);
        self.with(desc)
    }

    /// The column that counts takes.
    pub const fn attempt(self, column: Column) -> InboxSpec<F::Out>
    where
        F: Append<Attempt>,
    {
        let mut desc = self.desc;
        desc.attempt = Some(column);
        self.with(desc)
    }

    /// The lease form: the column that holds the lease's expiry.
    pub const fn lease(self, column: Column) -> InboxSpec<F::Out>
    where
        F: Append<Lease>,
    {
        let mut desc = self.desc;
        desc.hold = Hold::Lease {
            locked_until: column,
        };
        self.with(desc)
    }

    /// The advisory lock form: the key's parts.
    pub const fn advisory(self, parts: &'static [KeyPart]) -> InboxSpec<F::Out>
    where
        F: Append<Advisory>,
    {
        let mut desc = self.desc;
        desc.hold = Hold::Advisory {
            key: parts,
            custom_lock: self.own.0 && self.own.1,
        };
        self.with(desc)
    }

    /// Settle by writing the time into this column instead of deleting the row.
    pub const fn processed_at(self, column: Column) -> InboxSpec<F::Out>
    where
        F: Append<Processed>,
    {
        let mut desc = self.desc;
        desc.processed_at = Some(column);
        self.with(desc)
    }

    /// A row is claimable once the time in this column has come.
    pub const fn due(self, column: Column) -> InboxSpec<F::Out>
    where
        F: Append<Due>,
    {
        let mut desc = self.desc;
        desc.due = Some(column);
        self.with(desc)
    }

    /// Keep failed jobs: the column marked with the time a job failed for good. A failed row
    /// stays and no claim takes it again; without this column a failure returns the job to
    /// the queue instead ([Failed rows](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#failed-rows-are-kept)).
    pub const fn failed(self, column: Column) -> InboxSpec<F::Out>
    where
        F: Append<Failed>,
    {
        let mut desc = self.desc;
        desc.failed_at = Some(column);
        self.with(desc)
    }

    /// The column that keeps the text of a row's last error: why it failed, or why its last
    /// attempt was retried.
    pub const fn error(self, column: Column) -> InboxSpec<F::Out>
    where
        F: Append<ErrorText>,
    {
        let mut desc = self.desc;
        desc.error = Some(column);
        self.with(desc)
    }

    /// Keep a history of the row's errors: a JSON array of its last [`ERRORS_KEPT`] failed
    /// attempts, each `{"attempt", "at", "error"}` ([Failures](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#the-history-of-errors)).
    pub const fn errors(self, column: Column) -> Self {
        let mut desc = self.desc;
        desc.errors = Some(column);
        self.with(desc)
    }

    /// Deduplicated publishing: `columns` hold a unique index, and a publish whose values
    /// there are already in the table writes nothing and says so; a publish names each
    /// column's value ([Deduplicated publishing](https://github.com/ruststream/ruststream/blob/main/docs/src/publishing.md#deduplicated-publishing)).
    pub const fn unique(self, columns: &'static [&'static str]) -> Self {
        let mut desc = self.desc;
        desc.unique = columns;
        self.with(desc)
    }

    /// The claim order, instead of the due column and then the id.
    pub const fn order(self, order: &'static [OrderBy]) -> Self {
        let mut desc = self.desc;
        desc.order = order;
        self.with(desc)
    }

    /// The message the payload holds: the table's subscribers decode `M`, and a subscriber
    /// of another message does not compile. `#[inbox(message = M)]` names it too.
    pub const fn carries<M>(self) -> InboxSpec<F::Out>
    where
        F: Append<Carries<M>>,
    {
        self.with(self.desc)
    }

    /// The service's own lock or unlock: `.own::<own::Lock>()`, `.own::<own::Unlock>()`.
    pub const fn own<O: own::Own>(self) -> InboxSpec<F::Out>
    where
        F: Append<O>,
    {
        let mut spec = self;
        if O::LOCK {
            spec.own.0 = true;
        } else {
            spec.own.1 = true;
        }
        if let Hold::Advisory { key, .. } = spec.desc.hold {
            spec.desc.hold = Hold::Advisory {
                key,
                custom_lock: spec.own.0 && spec.own.1,
            };
        }
        spec.with(spec.desc)
    }
}

/// A description that keeps every rule that does not depend on the database.
pub trait Described {
    /// The description's features, such as `(Advisory, Payload, own::Lock, own::Unlock)`.
    type Features: Features;

    /// The untyped description.
    fn table_desc(&self) -> &TableDesc;
}

impl<F> Described for InboxSpec<F>
where
    F: Features,
    (F::Lock, F::Unlock): LockWithUnlock,
    (<F::Lock as Bit>::Or<F::Unlock>, F::Advisory): CustomLockInAdvisory,
    (F::Advisory, F::Lease): OneForm,
{
    type Features = F;

    fn table_desc(&self) -> &TableDesc {
        &self.desc
    }
}

/// A database family, as the type system sees it: whether it has row locks.
pub trait Database {
    /// Whether `FOR UPDATE SKIP LOCKED` exists.
    type RowLocks: Bit;
    /// The database's name in messages.
    const NAME: &'static str;
}

/// PostgreSQL 9.5 and later.
#[derive(Clone, Copy, Debug)]
pub struct Postgres;
/// MySQL 8.0.1 and later, MariaDB 10.6 and later.
#[derive(Clone, Copy, Debug)]
pub struct MySql;
/// SQLite.
#[derive(Clone, Copy, Debug)]
pub struct Sqlite;

impl Database for Postgres {
    type RowLocks = True;
    const NAME: &'static str = "PostgreSQL";
}
impl Database for MySql {
    type RowLocks = True;
    const NAME: &'static str = "MySQL";
}
impl Database for Sqlite {
    type RowLocks = False;
    const NAME: &'static str = "SQLite";
}

/// Rule: the row lock form needs row locks. Implemented for (names another form, has row
/// locks) pairs that keep it.
#[diagnostic::on_unimplemented(
    message = "rule: SQLite has no row locks, so a table on SQLite must name another form: this description names neither `locked_until` (lease) nor `advisory_lock`",
    label = "add `.lease(..)` (`#[field(locked_until)]`) or `.advisory(..)` (`advisory_lock = \"..\"`)"
)]
pub trait RowLockSupported {}
impl RowLockSupported for (True, True) {}
impl RowLockSupported for (True, False) {}
impl RowLockSupported for (False, True) {}

/// A description that keeps every rule on the database `D`.
pub trait ValidOn<D: Database>: Described {}

impl<F, D> ValidOn<D> for InboxSpec<F>
where
    D: Database,
    InboxSpec<F>: Described,
    F: Features,
    (<F::Advisory as Bit>::Or<F::Lease>, D::RowLocks): RowLockSupported,
{
}

/// The untyped description of `spec`, checked at compile time for the database `D` and at run
/// time by [`TableDesc::validate`].
pub fn describe<D: Database, S: ValidOn<D>>(spec: &S) -> Result<TableDesc, DescError> {
    let desc = *spec.table_desc();
    desc.validate()?;
    Ok(desc)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[KeyPart] = &[KeyPart::Literal("k-"), KeyPart::Column("k")];

    #[test]
    fn own_lock_and_unlock_make_a_custom_lock_in_any_order() {
        let before = InboxSpec::new("t", Column::new("id"))
            .own::<own::Lock>()
            .advisory(KEY)
            .own::<own::Unlock>();
        let after = InboxSpec::new("t", Column::new("id"))
            .advisory(KEY)
            .own::<own::Unlock>()
            .own::<own::Lock>();
        let custom = Hold::Advisory {
            key: KEY,
            custom_lock: true,
        };
        assert_eq!(before.desc().hold, custom);
        assert_eq!(after.desc().hold, custom);
        let half = InboxSpec::new("t", Column::new("id"))
            .own::<own::Lock>()
            .advisory(KEY);
        assert!(!half.desc().custom_lock());
    }

    #[test]
    fn each_form_reads_only_its_own_columns() {
        let lease = InboxSpec::new("t", Column::new("id")).lease(Column::new("until"));
        assert_eq!(lease.desc().form(), Form::Lease);
        assert_eq!(lease.desc().locked_until(), Some(Column::new("until")));
        assert_eq!(lease.desc().advisory(), None);
        let advisory = InboxSpec::new("t", Column::new("id")).advisory(KEY);
        assert_eq!(advisory.desc().form(), Form::Advisory);
        assert_eq!(advisory.desc().locked_until(), None);
        assert_eq!(advisory.desc().key_columns(), ["k"]);
        let row_lock = InboxSpec::new("t", Column::new("id"));
        assert_eq!(row_lock.desc().hold, Hold::RowLock);
        assert_eq!(row_lock.desc().columns(), ["id"]);
    }
}

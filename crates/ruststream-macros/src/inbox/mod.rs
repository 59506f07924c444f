//! `#[derive(Inbox)]`: a row type's table description, written as the manual `InboxSpec`
//! chain.
//!
//! The derive reads the struct's `#[inbox(..)]` ([`attrs`]) and its fields' `#[field(..)]`
//! ([`fields`]), checks the description's rules ([`rules`]), reads the columns the key, the
//! deduplication and the order name ([`columns`]), and writes the impls ([`expand`]). Every
//! mistake it finds is reported, not only the first.

mod attrs;
mod columns;
mod expand;
mod fields;
mod rules;

use proc_macro2::{Span, TokenStream};
use syn::{DeriveInput, Ident, Type};

use crate::Errors;

use attrs::TableAttrs;
use columns::Columns;
use expand::Description;

/// The role a field plays in the description.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Id,
    Attempt,
    Payload,
    LockedUntil,
    ProcessedAt,
    Due,
    FailedAt,
    Error,
    Errors,
}

impl Role {
    const ALL: [(Role, &'static str); 9] = [
        (Role::Id, "id"),
        (Role::Attempt, "attempt"),
        (Role::Payload, "payload"),
        (Role::LockedUntil, "locked_until"),
        (Role::ProcessedAt, "processed_at"),
        (Role::Due, "due"),
        (Role::FailedAt, "failed_at"),
        (Role::Error, "error"),
        (Role::Errors, "errors"),
    ];

    /// The roles whose columns the database reads and writes alone: a table names them in
    /// `#[inbox(..)]` when the struct has no field for them.
    const COLUMNS_ONLY: [Role; 6] = [
        Role::LockedUntil,
        Role::ProcessedAt,
        Role::Due,
        Role::FailedAt,
        Role::Error,
        Role::Errors,
    ];

    /// The role's word in `#[field(..)]` and in the messages.
    fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(role, _)| *role == self)
            .map(|(_, name)| *name)
            .unwrap_or("id")
    }

    /// The role a word of `#[field(..)]` or `#[inbox(..)]` names, if any.
    fn from_ident(ident: &Ident) -> Option<Self> {
        let word = ident.to_string();
        Self::ALL
            .iter()
            .find(|(_, name)| *name == word)
            .map(|(role, _)| *role)
    }
}

/// One named field of the row.
struct Field {
    ident: Ident,
    /// The field's name as the template and the order name it.
    name: String,
    ty: Type,
    /// The column: the field's name, or its `rename`.
    column: String,
    role: Option<(Role, Span)>,
    generated: Option<Span>,
    /// Named in `#[inbox(..)]`, with no field in the struct.
    column_only: bool,
}

impl Field {
    /// Whether the field plays the role `wanted`.
    fn plays(&self, wanted: Role) -> bool {
        matches!(self.role, Some((role, _)) if role == wanted)
    }

    /// The name of the field's role, for an error that names it.
    fn role_name(&self) -> &'static str {
        self.role.map_or("id", |(role, _)| role.name())
    }
}

/// The row's fields: the struct's, then the role columns `#[inbox(..)]` names without one.
struct Row {
    fields: Vec<Field>,
}

impl Row {
    /// The first field of a role.
    fn role(&self, wanted: Role) -> Option<&Field> {
        self.fields.iter().find(|f| f.plays(wanted))
    }

    /// The field named `name`.
    fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The names of the struct's fields, which the key, the order and `unique` may name.
    fn names(&self) -> Vec<&str> {
        self.fields
            .iter()
            .filter(|f| !f.column_only)
            .map(|f| f.name.as_str())
            .collect()
    }

    /// The column of a field named by the key, the order or `unique`.
    fn column_of(&self, field: &str) -> String {
        self.field(field)
            .map_or_else(|| field.to_owned(), |f| f.column.clone())
    }
}

/// Expands `#[derive(Inbox)]`: reads and checks the whole description, reporting every
/// mistake at once, then writes its impls.
pub(crate) fn derive(input: DeriveInput) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let attrs = TableAttrs::parse(&input, &mut errors);
    let mut fields = fields::parse(&input, &mut errors)?;
    fields::add_column_only(&mut fields, &attrs, &mut errors);
    let row = Row { fields };

    let name = &input.ident;
    rules::one_field_per_role(&row, &mut errors);
    rules::one_column_per_role(&row, &mut errors);
    let id = rules::primary_key(&row, name, &mut errors);
    let table = rules::table_name(&attrs, name, &mut errors);
    rules::one_form(&row, &attrs, &mut errors);
    let custom_lock = rules::custom_lock(&attrs, &mut errors);
    let columns = Columns::read(&row, &attrs, &mut errors);

    errors.finish()?;
    let (Some(id), Some(table)) = (id, table) else {
        // Both were reported above.
        return Err(syn::Error::new(name.span(), "`#[derive(Inbox)]`"));
    };
    let description = Description {
        input: &input,
        row: &row,
        attrs: &attrs,
        id,
        table,
        custom_lock,
        columns,
    };
    Ok(description.tokens())
}

//! The description's rules: one field and one column per role, a primary key, a table name,
//! one form, and a custom lock only whole and only in the advisory lock form.

use syn::{Ident, LitStr};

use crate::Errors;

use super::attrs::TableAttrs;
use super::{Field, Role, Row};

/// Each role is played by one field: a second one is an error at its attribute.
pub(super) fn one_field_per_role(row: &Row, errors: &mut Errors) {
    for (wanted, word) in Role::ALL {
        let mut first: Option<&Field> = None;
        for field in &row.fields {
            let Some((role, span)) = field.role else {
                continue;
            };
            if role != wanted {
                continue;
            }
            match first {
                None => first = Some(field),
                Some(first) if wanted == Role::Id => errors.push(syn::Error::new(
                    span,
                    format!(
                        "two fields are marked `#[field(id)]`: `{}` already is the table's primary key, and a table has one",
                        first.name
                    ),
                )),
                Some(first) => errors.push(syn::Error::new(
                    span,
                    format!(
                        "two fields are marked `#[field({word})]`: `{}` already is the {word} column",
                        first.name
                    ),
                )),
            }
        }
    }
}

/// Each role has a column of its own: two roles on one column is an error at the second.
pub(super) fn one_column_per_role(row: &Row, errors: &mut Errors) {
    let roled: Vec<&Field> = row.fields.iter().filter(|f| f.role.is_some()).collect();
    for (i, field) in roled.iter().enumerate() {
        if let Some(other) = roled[..i].iter().find(|o| o.column == field.column) {
            errors.push(syn::Error::new(
                field.ident.span(),
                format!(
                    "column `{}` is named twice: as the {} column (field `{}`) and as the {} column (field `{}`)",
                    field.column,
                    other.role_name(),
                    other.name,
                    field.role_name(),
                    field.name
                ),
            ));
        }
    }
}

/// The primary key's field; without one, an error at the struct's name.
pub(super) fn primary_key<'a>(
    row: &'a Row,
    name: &Ident,
    errors: &mut Errors,
) -> Option<&'a Field> {
    let id = row.role(Role::Id);
    if id.is_none() {
        errors.push(syn::Error::new(
            name.span(),
            "`#[derive(Inbox)]` needs the table's primary key: mark one field `#[field(id)]` (or `#[field(id, generated)]` when the database fills it)",
        ));
    }
    id
}

/// The table's name; a missing or empty one is an error at `#[inbox(..)]`, or at the
/// struct's name when it has none.
pub(super) fn table_name<'a>(
    attrs: &'a TableAttrs,
    name: &Ident,
    errors: &mut Errors,
) -> Option<&'a LitStr> {
    match &attrs.table {
        Some(table) if table.value().trim().is_empty() => {
            errors.push(syn::Error::new(
                table.span(),
                "`table = \"\"`: the table's name is empty",
            ));
            None
        }
        Some(table) => Some(table),
        None => {
            let message = "`#[derive(Inbox)]` needs the table's name: `#[inbox(table = \"..\")]`";
            errors.push(match &attrs.attr {
                Some(attr) => syn::Error::new_spanned(attr, message),
                None => syn::Error::new(name.span(), message),
            });
            None
        }
    }
}

/// The form: a lease or an advisory lock, not both; the error points at each.
pub(super) fn one_form(row: &Row, attrs: &TableAttrs, errors: &mut Errors) {
    let lease = row.role(Role::LockedUntil);
    if let (Some(lease), Some(advisory)) = (lease, &attrs.advisory) {
        let mut error = syn::Error::new(
            lease.role.map_or(lease.ident.span(), |(_, span)| span),
            "a table takes its rows in one form: `#[field(locked_until)]` selects the lease form and `advisory_lock` the advisory lock form; keep one",
        );
        error.combine(syn::Error::new(
            advisory.span(),
            "`advisory_lock` selects the advisory lock form, and `#[field(locked_until)]` the lease form",
        ));
        errors.push(error);
    }
}

/// Whether the table takes its keys by its own lock: `custom(lock, unlock)`, both halves,
/// and only in the advisory lock form.
pub(super) fn custom_lock(attrs: &TableAttrs, errors: &mut Errors) -> bool {
    let Some(custom) = attrs.custom else {
        return false;
    };
    let mut whole = false;
    match (custom.lock, custom.unlock) {
        (Some(_), Some(_)) => whole = true,
        (Some(_), None) => errors.push(syn::Error::new(
            custom.span,
            "`custom(lock)` without `unlock`: a custom lock and its release come together; write `custom(lock, unlock)`",
        )),
        (None, Some(_)) => errors.push(syn::Error::new(
            custom.span,
            "`custom(unlock)` without `lock`: a custom lock and its release come together; write `custom(lock, unlock)`",
        )),
        (None, None) => errors.push(syn::Error::new(
            custom.span,
            "`custom` names neither `lock` nor `unlock`: write `custom(lock, unlock)`",
        )),
    }
    if attrs.advisory.is_none() {
        errors.push(syn::Error::new(
            custom.span,
            "`custom(lock, unlock)` belongs to the advisory lock form: it replaces the lock and release of each row's key, and this table names no `advisory_lock = \"..\"`",
        ));
    }
    whole
}

//! The row's fields: the struct's named fields with their `#[field(..)]`, and the role columns
//! `#[inbox(..)]` names without a field.

use quote::ToTokens;
use syn::ext::IdentExt;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, FieldsNamed, Ident, LitStr};

use crate::Errors;

use super::attrs::TableAttrs;
use super::{Field, Role};

const FIELD_WORDS: &str = "`id`, `attempt`, `payload`, `locked_until`, `processed_at`, `due`, `failed_at`, `error`, `errors`, `generated` or `rename = \"..\"`";

/// Reads the struct's fields; a struct without named fields has no row to describe, so that
/// error ends the derive at once.
pub(super) fn parse(input: &DeriveInput, errors: &mut Errors) -> syn::Result<Vec<Field>> {
    let named = named_fields(input)?;
    let mut out = Vec::new();
    for field in &named.named {
        let Some(ident) = field.ident.clone() else {
            continue;
        };
        let parsed = FieldAttrs::parse(ident, field, errors).field;
        check_generated(&parsed, errors);
        out.push(parsed);
    }
    Ok(out)
}

/// The struct's named fields, or an error naming the shape the derive describes.
fn named_fields(input: &DeriveInput) -> syn::Result<&FieldsNamed> {
    match &input.data {
        Data::Struct(data) => match &data.fields {
            Fields::Named(named) => Ok(named),
            other => Err(syn::Error::new(
                other.span(),
                "`#[derive(Inbox)]` describes a struct with named fields: each field is a column of the same name",
            )),
        },
        Data::Enum(data) => Err(syn::Error::new(
            data.enum_token.span(),
            "`#[derive(Inbox)]` describes a struct with named fields, one row of the table; not an enum",
        )),
        Data::Union(data) => Err(syn::Error::new(
            data.union_token.span(),
            "`#[derive(Inbox)]` describes a struct with named fields, one row of the table; not a union",
        )),
    }
}

/// One field as its `#[field(..)]` attributes are read.
struct FieldAttrs {
    field: Field,
    /// Whether a `rename` was read, so a second one is an error.
    renamed: bool,
}

impl FieldAttrs {
    /// Reads a field's `#[field(..)]` attributes; a malformed one is reported and the rest
    /// are still read.
    fn parse(ident: Ident, field: &syn::Field, errors: &mut Errors) -> Self {
        let name = ident.unraw().to_string();
        let mut out = Self {
            field: Field {
                column: name.clone(),
                name,
                ident,
                ty: field.ty.clone(),
                role: None,
                generated: None,
                column_only: false,
            },
            renamed: false,
        };
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("field")) {
            if let Err(error) = attr.parse_nested_meta(|meta| out.word(&meta)) {
                errors.push(error);
            }
        }
        out
    }

    /// Reads one word of `#[field(..)]`: `generated`, `rename = ".."` or a role.
    fn word(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let span = meta.path.span();
        if meta.path.is_ident("generated") {
            if self.field.generated.is_some() {
                return Err(meta.error("`generated` is given twice"));
            }
            self.field.generated = Some(span);
        } else if meta.path.is_ident("rename") {
            if self.renamed {
                return Err(meta.error("`rename` is given twice"));
            }
            let lit: LitStr = meta.value()?.parse()?;
            if lit.value().trim().is_empty() {
                return Err(syn::Error::new(
                    lit.span(),
                    "`rename = \"\"`: the column's name is empty",
                ));
            }
            self.field.column = lit.value();
            self.renamed = true;
        } else if let Some(role) = meta.path.get_ident().and_then(Role::from_ident) {
            if let Some((first, _)) = self.field.role {
                return Err(meta.error(format!(
                    "a field is one column of one role, and this field is already `{}`",
                    first.name()
                )));
            }
            if !meta.input.is_empty() && !meta.input.peek(syn::Token![,]) {
                return Err(meta.error(format!(
                    "`{}` takes no value; write `#[field({})]`",
                    role.name(),
                    role.name()
                )));
            }
            self.field.role = Some((role, span));
        } else {
            return Err(meta.error(format!(
                "unknown field attribute `{}`; expected {FIELD_WORDS}",
                meta.path.to_token_stream()
            )));
        }
        Ok(())
    }
}

/// `generated` needs a role, and the payload cannot be one: the service writes it.
fn check_generated(field: &Field, errors: &mut Errors) {
    let Some(span) = field.generated else {
        return;
    };
    match field.role {
        None => errors.push(syn::Error::new(
            span,
            "`generated` marks a column of the description that the database fills; name its role too, as in `#[field(id, generated)]`",
        )),
        Some((Role::Payload, _)) => errors.push(syn::Error::new(
            span,
            "the payload is the message the service publishes: the database cannot fill it, so it is not `generated`",
        )),
        Some(_) => {}
    }
}

/// Adds the role columns `#[inbox(..)]` names as fields the struct does not read; a role a
/// field already plays, or an empty name, is an error instead.
pub(super) fn add_column_only(fields: &mut Vec<Field>, attrs: &TableAttrs, errors: &mut Errors) {
    for (role, lit) in &attrs.columns {
        if let Some(field) = fields.iter().find(|f| f.plays(*role)) {
            errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "the {} column is named twice: here and by field `{}`; keep one",
                    role.name(),
                    field.name
                ),
            ));
            continue;
        }
        if lit.value().trim().is_empty() {
            errors.push(syn::Error::new(
                lit.span(),
                format!("`{} = \"\"`: the column's name is empty", role.name()),
            ));
            continue;
        }
        fields.push(Field {
            ident: Ident::new(&format!("__ruststream_{}", role.name()), lit.span()),
            name: String::new(),
            ty: syn::parse_quote!(()),
            column: lit.value(),
            role: Some((*role, lit.span())),
            generated: None,
            column_only: true,
        });
    }
}

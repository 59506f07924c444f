//! The struct's `#[inbox(..)]` attributes: the table, its form and the columns the struct
//! does not read.

use proc_macro2::Span;
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{DeriveInput, LitStr, Type};

use crate::Errors;

use super::Role;

/// What `#[inbox(..)]` says.
#[derive(Default)]
pub(super) struct TableAttrs {
    /// The first `#[inbox]` attribute, where an error about a missing key points.
    pub(super) attr: Option<syn::Attribute>,
    pub(super) table: Option<LitStr>,
    pub(super) advisory: Option<LitStr>,
    pub(super) order: Option<LitStr>,
    /// `custom(..)`: where it is written, and the parts it names.
    pub(super) custom: Option<Custom>,
    /// Role columns without a field: `failed_at = "failed_at"`.
    pub(super) columns: Vec<(Role, LitStr)>,
    /// `message = Type`: the message the payload holds.
    pub(super) message: Option<Type>,
    /// `unique = "field, other"`: the columns that deduplicate publishes.
    pub(super) unique: Option<LitStr>,
}

/// `custom(lock, unlock)`: its span, and where it names `lock` and `unlock`.
#[derive(Clone, Copy)]
pub(super) struct Custom {
    pub(super) span: Span,
    pub(super) lock: Option<Span>,
    pub(super) unlock: Option<Span>,
}

impl TableAttrs {
    /// Reads every `#[inbox(..)]` of the struct; a malformed one is reported and the rest
    /// are still read, so one expansion names every mistake.
    pub(super) fn parse(input: &DeriveInput, errors: &mut Errors) -> Self {
        let mut out = Self::default();
        for attr in input.attrs.iter().filter(|a| a.path().is_ident("inbox")) {
            out.attr.get_or_insert_with(|| attr.clone());
            if let Err(error) = attr.parse_nested_meta(|meta| out.key(&meta)) {
                errors.push(error);
            }
        }
        out
    }

    /// Reads one `key = value` (or `custom(..)`) of `#[inbox(..)]`.
    fn key(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let path = &meta.path;
        if path.is_ident("table") {
            once(&self.table, path, "table")?;
            self.table = Some(meta.value()?.parse()?);
        } else if path.is_ident("advisory_lock") {
            once(&self.advisory, path, "advisory_lock")?;
            self.advisory = Some(meta.value()?.parse()?);
        } else if path.is_ident("order") {
            once(&self.order, path, "order")?;
            self.order = Some(meta.value()?.parse()?);
        } else if path.is_ident("unique") {
            once(&self.unique, path, "unique")?;
            self.unique = Some(meta.value()?.parse()?);
        } else if path.is_ident("message") {
            if self.message.is_some() {
                return Err(meta.error("`message` is given twice"));
            }
            self.message = Some(meta.value()?.parse()?);
        } else if let Some(role) = path
            .get_ident()
            .and_then(Role::from_ident)
            .filter(|r| Role::COLUMNS_ONLY.contains(r))
        {
            if self.columns.iter().any(|(r, _)| *r == role) {
                return Err(meta.error(format!("`{}` is given twice", role.name())));
            }
            self.columns.push((role, meta.value()?.parse()?));
        } else if path.is_ident("custom") {
            if self.custom.is_some() {
                return Err(meta.error("`custom(..)` is given twice"));
            }
            self.custom = Some(custom(meta)?);
        } else {
            return Err(meta.error(format!(
                "unknown `#[inbox(..)]` key `{}`; expected `table = \"..\"`, `advisory_lock = \"..\"`, `custom(lock, unlock)`, `order = \"..\"`, `unique = \"..\"`, `message = Type`, or a column the struct does not read: `locked_until`, `processed_at`, `due`, `failed_at`, `error` or `errors` = \"..\"",
                path.to_token_stream()
            )));
        }
        Ok(())
    }
}

/// An error at the key when its slot is already filled: each key is given once.
fn once(slot: &Option<LitStr>, path: &syn::Path, key: &str) -> syn::Result<()> {
    match slot {
        Some(_) => Err(syn::Error::new(
            path.span(),
            format!("`{key}` is given twice"),
        )),
        None => Ok(()),
    }
}

/// Reads `custom`, `custom(lock)`, `custom(lock, unlock)`..: which of the two parts it names
/// is checked later, with the rest of the description.
fn custom(meta: &ParseNestedMeta<'_>) -> syn::Result<Custom> {
    let (mut lock, mut unlock) = (None, None);
    if !meta.input.is_empty() && !meta.input.peek(syn::Token![,]) {
        meta.parse_nested_meta(|inner| {
            let slot = if inner.path.is_ident("lock") {
                &mut lock
            } else if inner.path.is_ident("unlock") {
                &mut unlock
            } else {
                return Err(inner.error(format!(
                    "unknown `custom(..)` part `{}`; expected `lock` and `unlock`: `custom(lock, unlock)`",
                    inner.path.to_token_stream()
                )));
            };
            if slot.is_some() {
                return Err(inner.error("given twice"));
            }
            *slot = Some(inner.path.span());
            Ok(())
        })?;
    }
    Ok(Custom {
        span: meta.path.span(),
        lock,
        unlock,
    })
}

//! The columns the description names by field: the advisory key's, the ones that deduplicate
//! publishes, and the claim order's.

use proc_macro2::TokenStream;
use quote::quote;
use syn::Ident;

use ruststream_core::keys::{TemplatePart, parse_template_for};

use crate::Errors;

use super::attrs::TableAttrs;
use super::{Role, Row};

/// What the key, `unique` and `order` read, as the chain and the impls write it.
#[derive(Default)]
pub(super) struct Columns {
    /// The advisory key's parts: `::ruststream::KeyPart::..`.
    pub(super) key: Vec<TokenStream>,
    /// The fields the database reads: the key's, `unique`'s and the queue's. The struct need
    /// not read them.
    pub(super) key_fields: Vec<Ident>,
    /// The key's and `unique`'s fields and their columns, which a message of the table fills.
    pub(super) message_keys: Vec<(String, String)>,
    /// The columns that deduplicate publishes.
    pub(super) unique: Vec<String>,
    /// The claim order: `::ruststream::OrderBy::..`.
    pub(super) order: Vec<TokenStream>,
}

impl Columns {
    /// Reads the key, `unique` and `order`, each checked against the row's fields; a
    /// mistake is reported and the rest are still read.
    pub(super) fn read(row: &Row, attrs: &TableAttrs, errors: &mut Errors) -> Self {
        let mut out = Self::default();
        let names = row.names();
        if let Some(template) = &attrs.advisory {
            out.advisory_key(row, &names, template, errors);
        }
        if let Some(lit) = &attrs.unique {
            out.unique(row, &names, lit, errors);
        }
        if let Some(lit) = &attrs.order {
            out.order(row, &names, lit, errors);
        }
        // The columns the database reads and writes for the queue: the struct need not read
        // them.
        for wanted in Role::COLUMNS_ONLY {
            if let Some(f) = row.role(wanted).filter(|f| !f.column_only) {
                out.key_fields.push(f.ident.clone());
            }
        }
        out
    }

    /// The advisory key, parsed now: each placeholder names a field, and the key reads its
    /// column.
    fn advisory_key(
        &mut self,
        row: &Row,
        names: &[&str],
        template: &syn::LitStr,
        errors: &mut Errors,
    ) {
        let parts = match parse_template_for(&template.value(), names) {
            Ok(parts) => parts,
            Err(error) => {
                errors.push(syn::Error::new(template.span(), error.to_string()));
                return;
            }
        };
        for part in parts {
            self.key.push(match part {
                TemplatePart::Literal(text) => {
                    quote!(::ruststream::KeyPart::Literal(#text))
                }
                TemplatePart::Field(field) => {
                    if let Some(f) = row.field(&field) {
                        self.key_fields.push(f.ident.clone());
                    }
                    let column = row.column_of(&field);
                    if !self.message_keys.iter().any(|(f, _)| *f == field) {
                        self.message_keys.push((field.clone(), column.clone()));
                    }
                    quote!(::ruststream::KeyPart::Column(#column))
                }
            });
        }
    }

    /// The columns that deduplicate publishes: `"field, other"`.
    fn unique(&mut self, row: &Row, names: &[&str], lit: &syn::LitStr, errors: &mut Errors) {
        for item in lit.value().split(',') {
            let field = item.trim();
            if field.is_empty() || !names.contains(&field) {
                errors.push(syn::Error::new(
                    lit.span(),
                    format!(
                        "unique `{}`: `{field}` names no field of the row; write fields separated by commas; the fields are: {}",
                        lit.value(),
                        names.join(", ")
                    ),
                ));
                continue;
            }
            let column = row.column_of(field);
            if let Some(f) = row
                .fields
                .iter()
                .find(|f| f.name == field && f.role.is_none())
            {
                self.key_fields.push(f.ident.clone());
                if !self.message_keys.iter().any(|(k, _)| k == field) {
                    self.message_keys.push((field.to_owned(), column.clone()));
                }
            }
            self.unique.push(column);
        }
    }

    /// The claim order: `"field, other desc"`.
    fn order(&mut self, row: &Row, names: &[&str], lit: &syn::LitStr, errors: &mut Errors) {
        match parse_order(&lit.value(), names) {
            Ok(columns) => {
                for (field, descending) in columns {
                    let column = row.column_of(&field);
                    self.order.push(if descending {
                        quote!(::ruststream::OrderBy::desc(#column))
                    } else {
                        quote!(::ruststream::OrderBy::asc(#column))
                    });
                }
            }
            Err(message) => errors.push(syn::Error::new(lit.span(), message)),
        }
    }
}

/// Parses `"field, other desc"` into (field, descending) pairs.
fn parse_order(order: &str, fields: &[&str]) -> Result<Vec<(String, bool)>, String> {
    let mut out = Vec::new();
    for (i, item) in order.split(',').enumerate() {
        let words: Vec<&str> = item.split_whitespace().collect();
        let (field, descending) = match words.as_slice() {
            [field] => (*field, false),
            [field, dir] if dir.eq_ignore_ascii_case("asc") => (*field, false),
            [field, dir] if dir.eq_ignore_ascii_case("desc") => (*field, true),
            [] => {
                return Err(format!(
                    "order `{order}`: item {} is empty; write fields separated by commas, each optionally followed by `asc` or `desc`",
                    i + 1
                ));
            }
            _ => {
                return Err(format!(
                    "order `{order}`: `{}` is not a field optionally followed by `asc` or `desc`",
                    item.trim()
                ));
            }
        };
        if !fields.contains(&field) {
            return Err(format!(
                "order `{order}`: `{field}` names no field of the row; the fields are: {}",
                fields.join(", ")
            ));
        }
        out.push((field.to_owned(), descending));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::parse_order;

    #[test]
    fn parses_the_claim_order() {
        let fields = ["id", "priority", "run_at"];
        assert_eq!(
            parse_order("priority desc, run_at, id ASC", &fields).unwrap(),
            vec![
                ("priority".to_owned(), true),
                ("run_at".to_owned(), false),
                ("id".to_owned(), false)
            ]
        );
        assert!(
            parse_order("id,", &fields)
                .unwrap_err()
                .contains("item 2 is empty")
        );
        assert!(
            parse_order("id sideways", &fields)
                .unwrap_err()
                .contains("`id sideways`")
        );
        assert!(
            parse_order("rank", &fields)
                .unwrap_err()
                .contains("the fields are: id, priority, run_at")
        );
    }
}

//! The derive's output: the `InboxTable` impl with its `InboxSpec` chain, and the
//! `AttemptRow`, `MessageTable` and `PayloadRow` impls the description's fields call for.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::spanned::Spanned;
use syn::{DeriveInput, Ident, LitStr, Type};

use super::attrs::TableAttrs;
use super::columns::Columns;
use super::{Field, Role, Row};

/// A description that passed every rule, ready to be written out.
pub(super) struct Description<'a> {
    pub(super) input: &'a DeriveInput,
    pub(super) row: &'a Row,
    pub(super) attrs: &'a TableAttrs,
    /// The primary key's field.
    pub(super) id: &'a Field,
    pub(super) table: &'a LitStr,
    /// Whether the table takes each key by its own `Lock` and `Unlock`.
    pub(super) custom_lock: bool,
    pub(super) columns: Columns,
}

/// The `InboxSpec` chain's calls, and the features they select.
#[derive(Default)]
struct Chain {
    features: Vec<TokenStream>,
    calls: Vec<TokenStream>,
}

impl Description<'_> {
    /// The impls, in order: `InboxTable`, then `AttemptRow`, `MessageTable` and `PayloadRow`
    /// where the description has their field or message.
    pub(super) fn tokens(&self) -> TokenStream {
        let mut out = self.inbox_table();
        if let Some(field) = self.row.role(Role::Attempt) {
            out.extend(self.attempt_row(field));
        }
        if let Some(message) = &self.attrs.message {
            out.extend(self.message_table(message));
        }
        if let Some(field) = self.row.role(Role::Payload) {
            out.extend(self.payload_row(field));
        }
        out
    }

    /// The chain and the features, in the spec's order: Advisory, Attempt, Payload, Lease,
    /// Processed, Due, own::Lock, own::Unlock.
    fn chain(&self) -> Chain {
        let mut chain = Chain::default();
        let key = &self.columns.key;
        if !key.is_empty() {
            chain.features.push(quote!(::ruststream::Advisory));
            chain.calls.push(quote!(.advisory(&[#(#key),*])));
        }
        self.role_columns(&mut chain);
        let (order, unique) = (&self.columns.order, &self.columns.unique);
        if !order.is_empty() {
            chain.calls.push(quote!(.order(&[#(#order),*])));
        }
        if !unique.is_empty() {
            chain.calls.push(quote!(.unique(&[#(#unique),*])));
        }
        if self.custom_lock {
            chain.features.push(quote!(::ruststream::own::Lock));
            chain.features.push(quote!(::ruststream::own::Unlock));
            chain.calls.push(quote!(.own::<::ruststream::own::Lock>()));
            chain
                .calls
                .push(quote!(.own::<::ruststream::own::Unlock>()));
        }
        if let Some(message) = &self.attrs.message {
            // The table's subscribers decode its message, and only it.
            chain.features.push(quote!(::ruststream::Carries<#message>));
            chain.calls.push(quote!(.carries::<#message>()));
        }
        chain
    }

    /// The role columns' calls, each with the feature it selects; the history of errors
    /// selects none.
    fn role_columns(&self, chain: &mut Chain) {
        let builder = [
            (
                Role::Attempt,
                quote!(::ruststream::Attempt),
                quote!(attempt),
            ),
            (
                Role::Payload,
                quote!(::ruststream::Payload),
                quote!(payload),
            ),
            (
                Role::LockedUntil,
                quote!(::ruststream::Lease),
                quote!(lease),
            ),
            (
                Role::ProcessedAt,
                quote!(::ruststream::Processed),
                quote!(processed_at),
            ),
            (Role::Due, quote!(::ruststream::Due), quote!(due)),
            (Role::FailedAt, quote!(::ruststream::Failed), quote!(failed)),
            (Role::Error, quote!(::ruststream::ErrorText), quote!(error)),
        ];
        for (wanted, feature, method) in builder {
            if let Some(field) = self.row.role(wanted) {
                let column = column(field);
                chain.features.push(feature);
                chain.calls.push(quote!(.#method(#column)));
            }
        }
        if let Some(field) = self.row.role(Role::Errors) {
            // The history of errors selects no feature: it changes no claim.
            let column = column(field);
            chain.calls.push(quote!(.errors(#column)));
        }
    }

    /// The fields that decode the role columns, for the start check.
    fn row_fields(&self) -> Vec<TokenStream> {
        let mut row_fields = Vec::new();
        for wanted in [
            Role::LockedUntil,
            Role::Due,
            Role::ProcessedAt,
            Role::FailedAt,
            Role::Attempt,
            Role::Payload,
            Role::Error,
        ] {
            if let Some(field) = self.row.role(wanted).filter(|f| !f.column_only) {
                let column = &field.column;
                let field_name = &field.name;
                let ty = &field.ty;
                let rust = quote!(#ty).to_string().replace(' ', "");
                let kind = field_kind(ty);
                row_fields.push(quote! {
                    ::ruststream::core::RowField {
                        column: #column,
                        field: #field_name,
                        rust: #rust,
                        kind: ::ruststream::core::FieldKind::#kind,
                    }
                });
            }
        }
        row_fields
    }

    /// `InboxTable`: the id's type, the description and the fields the start checks.
    fn inbox_table(&self) -> TokenStream {
        let Chain { features, calls } = self.chain();
        let row_fields = self.row_fields();
        let name = &self.input.ident;
        let (impl_generics, ty_generics, where_clause) = self.input.generics.split_for_impl();
        let table = self.table;
        let key_fields = &self.columns.key_fields;
        let id_ty = &self.id.ty;
        let id_ident = &self.id.ident;
        let id_column = column(self.id);
        quote! {
            #[automatically_derived]
            impl #impl_generics ::ruststream::InboxTable for #name #ty_generics #where_clause {
                type Id = #id_ty;
                type Table = ::ruststream::InboxSpec<(#(#features,)*)>;
                const TABLE: Self::Table = ::ruststream::InboxSpec::new(#table, #id_column) #(#calls)*;
                const ROW_FIELDS: &'static [::ruststream::core::RowField] = &[#(#row_fields),*];

                fn id(&self) -> &#id_ty {
                    // The key's and the queue's columns are read by the database, not by Rust.
                    let _ = (#(&self.#key_fields,)*);
                    &self.#id_ident
                }
            }
        }
    }

    /// `AttemptRow`: the attempt field, which the handler's `Ctx<keys::Attempt>` reads.
    fn attempt_row(&self, field: &Field) -> TokenStream {
        let name = &self.input.ident;
        let (impl_generics, ty_generics, where_clause) = self.input.generics.split_for_impl();
        let (ident, ty) = (&field.ident, &field.ty);
        quote! {
            #[automatically_derived]
            impl #impl_generics ::ruststream::AttemptRow for #name #ty_generics #where_clause {
                type Attempt = #ty;

                fn attempt(&self) -> &#ty {
                    &self.#ident
                }
            }
        }
    }

    /// `MessageTable`: the row a publish of the table's message writes.
    fn message_table(&self, message: &Type) -> TokenStream {
        let name = &self.input.ident;
        let (impl_generics, ty_generics, where_clause) = self.input.generics.split_for_impl();
        // Each field the key reads is read from the message's field of the same name: a
        // message without it does not compile, at the template.
        let span = self
            .attrs
            .advisory
            .as_ref()
            .map_or_else(|| message.span(), |t| t.span());
        let columns = self.columns.message_keys.iter().map(|(field, column)| {
            let field = Ident::new(field, span);
            quote::quote_spanned! {span=>
                .column(
                    #column,
                    ::ruststream::Value::from(::core::clone::Clone::clone(&message.#field)),
                )
            }
        });
        quote! {
            #[automatically_derived]
            impl #impl_generics ::ruststream::MessageTable for #name #ty_generics #where_clause {
                type Message = #message;

                fn message_row(
                    message: &#message,
                ) -> ::core::result::Result<::ruststream::Message, ::ruststream::PublishError> {
                    ::core::result::Result::Ok(
                        ::ruststream::Message::json(message)? #(#columns)*
                    )
                }
            }
        }
    }

    /// `PayloadRow`: the payload field, read as bytes.
    fn payload_row(&self, field: &Field) -> TokenStream {
        let name = &self.input.ident;
        let (impl_generics, ty_generics, where_clause) = self.input.generics.split_for_impl();
        let (ident, ty) = (&field.ident, &field.ty);
        let as_ref = quote::quote_spanned!(ty.span()=> ::core::convert::AsRef::<[u8]>::as_ref);
        quote! {
            #[automatically_derived]
            impl #impl_generics ::ruststream::PayloadRow for #name #ty_generics #where_clause {
                type Column = #ty;

                fn payload(&self) -> &[u8] {
                    #as_ref(&self.#ident)
                }
            }
        }
    }
}

/// What a field's type holds, by the last segment of its path, inside an `Option`: an
/// integer, text, bytes, a date and time, or anything else.
fn field_kind(ty: &Type) -> Ident {
    let kind = |ty: &Type| -> &'static str {
        let Type::Path(path) = ty else {
            return "Other";
        };
        let Some(last) = path.path.segments.last() else {
            return "Other";
        };
        match last.ident.to_string().as_str() {
            "i8" | "i16" | "i32" | "i64" | "i128" | "isize" | "u8" | "u16" | "u32" | "u64"
            | "u128" | "usize" => "Integer",
            "String" => "Text",
            "Vec" => "Bytes",
            "DateTime" | "OffsetDateTime" | "SystemTime" | "Timestamp" | "Timestamptz" => "Time",
            "NaiveDateTime" | "PrimitiveDateTime" => "LocalTime",
            _ => "Other",
        }
    };
    let inner = match ty {
        Type::Path(path)
            if path
                .path
                .segments
                .last()
                .is_some_and(|s| s.ident == "Option") =>
        {
            match &path.path.segments.last().map(|s| &s.arguments) {
                Some(syn::PathArguments::AngleBracketed(args)) => match args.args.first() {
                    Some(syn::GenericArgument::Type(inner)) => inner,
                    _ => ty,
                },
                _ => ty,
            }
        }
        _ => ty,
    };
    Ident::new(kind(inner), Span::call_site())
}

/// `::ruststream::Column::new("name")`, with `.generated()` where the database fills it.
fn column(field: &Field) -> TokenStream {
    let name = &field.column;
    if field.generated.is_some() {
        quote!(::ruststream::Column::new(#name).generated())
    } else {
        quote!(::ruststream::Column::new(#name))
    }
}

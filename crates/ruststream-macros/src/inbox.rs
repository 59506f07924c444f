//! `#[derive(Inbox)]`: a row type's table description, written as the manual `InboxSpec`
//! chain.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Ident, LitStr, Type};

use ruststream_core::keys::{TemplatePart, parse_template_for};

use crate::Errors;

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

    fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(role, _)| *role == self)
            .map(|(_, name)| *name)
            .unwrap_or("id")
    }

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

/// What `#[inbox(..)]` says.
#[derive(Default)]
struct TableAttrs {
    /// The first `#[inbox]` attribute, where an error about a missing key points.
    attr: Option<syn::Attribute>,
    table: Option<LitStr>,
    advisory: Option<LitStr>,
    order: Option<LitStr>,
    /// `custom(..)`: its span, and whether it names `lock` and `unlock`.
    custom: Option<(Span, Option<Span>, Option<Span>)>,
    /// Role columns without a field: `failed_at = "failed_at"`.
    columns: Vec<(Role, LitStr)>,
    /// `message = Type`: the message the payload holds.
    message: Option<Type>,
    /// `unique = "field, other"`: the columns that deduplicate publishes.
    unique: Option<LitStr>,
}

const FIELD_WORDS: &str = "`id`, `attempt`, `payload`, `locked_until`, `processed_at`, `due`, `failed_at`, `error`, `errors`, `generated` or `rename = \"..\"`";

pub(crate) fn derive(input: DeriveInput) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let attrs = table_attrs(&input, &mut errors);
    let mut fields = fields(&input, &mut errors)?;
    // Role columns the struct does not read, named in `#[inbox(..)]`.
    for (role, lit) in &attrs.columns {
        if let Some(field) = fields
            .iter()
            .find(|f| matches!(f.role, Some((r, _)) if r == *role))
        {
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
    let fields = fields;

    let name = &input.ident;
    let role = |wanted: Role| {
        fields
            .iter()
            .find(|f| matches!(f.role, Some((r, _)) if r == wanted))
    };

    // One field per role.
    for (wanted, word) in Role::ALL {
        let mut first: Option<&Field> = None;
        for field in &fields {
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

    // One column per role.
    let roled: Vec<&Field> = fields.iter().filter(|f| f.role.is_some()).collect();
    for (i, field) in roled.iter().enumerate() {
        if let Some(other) = roled[..i].iter().find(|o| o.column == field.column) {
            errors.push(syn::Error::new(
                field.ident.span(),
                format!(
                    "column `{}` is named twice: as the {} column (field `{}`) and as the {} column (field `{}`)",
                    field.column,
                    role_name(other),
                    other.name,
                    role_name(field),
                    field.name
                ),
            ));
        }
    }

    let id = role(Role::Id);
    if id.is_none() {
        errors.push(syn::Error::new(
            name.span(),
            "`#[derive(Inbox)]` needs the table's primary key: mark one field `#[field(id)]` (or `#[field(id, generated)]` when the database fills it)",
        ));
    }

    let table = match &attrs.table {
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
    };

    // The form: a lease or an advisory lock, not both.
    let lease = role(Role::LockedUntil);
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

    // The custom lock: both halves, and only in the advisory lock form.
    let mut custom = false;
    if let Some((span, lock, unlock)) = attrs.custom {
        match (lock, unlock) {
            (Some(_), Some(_)) => custom = true,
            (Some(_), None) => errors.push(syn::Error::new(
                span,
                "`custom(lock)` without `unlock`: a custom lock and its release come together; write `custom(lock, unlock)`",
            )),
            (None, Some(_)) => errors.push(syn::Error::new(
                span,
                "`custom(unlock)` without `lock`: a custom lock and its release come together; write `custom(lock, unlock)`",
            )),
            (None, None) => errors.push(syn::Error::new(
                span,
                "`custom` names neither `lock` nor `unlock`: write `custom(lock, unlock)`",
            )),
        }
        if attrs.advisory.is_none() {
            errors.push(syn::Error::new(
                span,
                "`custom(lock, unlock)` belongs to the advisory lock form: it replaces the lock and release of each row's key, and this table names no `advisory_lock = \"..\"`",
            ));
        }
    }

    // The advisory key, parsed now: each placeholder names a field, and the key reads its
    // column.
    let names: Vec<&str> = fields
        .iter()
        .filter(|f| !f.column_only)
        .map(|f| f.name.as_str())
        .collect();
    let column_of = |field: &str| {
        fields
            .iter()
            .find(|f| f.name == field)
            .map_or_else(|| field.to_owned(), |f| f.column.clone())
    };
    let mut key = Vec::new();
    // The fields the key reads: the database reads their columns, so the struct need not.
    let mut key_fields = Vec::new();
    // The key's fields and their columns, which a message of the table fills.
    let mut message_keys: Vec<(String, String)> = Vec::new();
    if let Some(template) = &attrs.advisory {
        match parse_template_for(&template.value(), &names) {
            Ok(parts) => {
                for part in parts {
                    key.push(match part {
                        TemplatePart::Literal(text) => {
                            quote!(::ruststream::KeyPart::Literal(#text))
                        }
                        TemplatePart::Field(field) => {
                            if let Some(f) = fields.iter().find(|f| f.name == field) {
                                key_fields.push(f.ident.clone());
                            }
                            let column = column_of(&field);
                            if !message_keys.iter().any(|(f, _)| *f == field) {
                                message_keys.push((field.clone(), column.clone()));
                            }
                            quote!(::ruststream::KeyPart::Column(#column))
                        }
                    });
                }
            }
            Err(error) => errors.push(syn::Error::new(template.span(), error.to_string())),
        }
    }

    // The columns that deduplicate publishes: `"field, other"`.
    let mut unique = Vec::new();
    if let Some(lit) = &attrs.unique {
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
            let column = column_of(field);
            if let Some(f) = fields.iter().find(|f| f.name == field && f.role.is_none()) {
                key_fields.push(f.ident.clone());
                if !message_keys.iter().any(|(k, _)| k == field) {
                    message_keys.push((field.to_owned(), column.clone()));
                }
            }
            unique.push(column);
        }
    }

    // The claim order: `"field, other desc"`.
    let mut order = Vec::new();
    if let Some(lit) = &attrs.order {
        match parse_order(&lit.value(), &names) {
            Ok(columns) => {
                for (field, descending) in columns {
                    let column = column_of(&field);
                    order.push(if descending {
                        quote!(::ruststream::OrderBy::desc(#column))
                    } else {
                        quote!(::ruststream::OrderBy::asc(#column))
                    });
                }
            }
            Err(message) => errors.push(syn::Error::new(lit.span(), message)),
        }
    }

    // The columns the database reads and writes for the queue: the struct need not read them.
    for wanted in Role::COLUMNS_ONLY {
        if let Some(f) = role(wanted).filter(|f| !f.column_only) {
            key_fields.push(f.ident.clone());
        }
    }

    errors.finish()?;
    let (Some(id), Some(table)) = (id, table) else {
        // Both were reported above.
        return Err(syn::Error::new(name.span(), "`#[derive(Inbox)]`"));
    };

    // The chain and the features, in the spec's order: Advisory, Attempt, Payload, Lease,
    // Processed, Due, own::Lock, own::Unlock.
    let mut features = Vec::new();
    let mut chain = Vec::new();
    if !key.is_empty() {
        features.push(quote!(::ruststream::Advisory));
        chain.push(quote!(.advisory(&[#(#key),*])));
    }
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
        if let Some(field) = role(wanted) {
            let column = column(field);
            features.push(feature);
            chain.push(quote!(.#method(#column)));
        }
    }
    if let Some(field) = role(Role::Errors) {
        // The history of errors selects no feature: it changes no claim.
        let column = column(field);
        chain.push(quote!(.errors(#column)));
    }
    if !order.is_empty() {
        chain.push(quote!(.order(&[#(#order),*])));
    }
    if !unique.is_empty() {
        chain.push(quote!(.unique(&[#(#unique),*])));
    }
    if custom {
        features.push(quote!(::ruststream::own::Lock));
        features.push(quote!(::ruststream::own::Unlock));
        chain.push(quote!(.own::<::ruststream::own::Lock>()));
        chain.push(quote!(.own::<::ruststream::own::Unlock>()));
    }
    if let Some(message) = &attrs.message {
        // The table's subscribers decode its message, and only it.
        features.push(quote!(::ruststream::Carries<#message>));
        chain.push(quote!(.carries::<#message>()));
    }

    // The fields that decode the role columns, for the start check.
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
        if let Some(field) = role(wanted).filter(|f| !f.column_only) {
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

    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let id_ty = &id.ty;
    let id_ident = &id.ident;
    let id_column = column(id);
    let mut out = quote! {
        #[automatically_derived]
        impl #impl_generics ::ruststream::InboxTable for #name #ty_generics #where_clause {
            type Id = #id_ty;
            type Table = ::ruststream::InboxSpec<(#(#features,)*)>;
            const TABLE: Self::Table = ::ruststream::InboxSpec::new(#table, #id_column) #(#chain)*;
            const ROW_FIELDS: &'static [::ruststream::core::RowField] = &[#(#row_fields),*];

            fn id(&self) -> &#id_ty {
                // The key's and the queue's columns are read by the database, not by Rust.
                let _ = (#(&self.#key_fields,)*);
                &self.#id_ident
            }
        }
    };
    if let Some(field) = role(Role::Attempt) {
        let (ident, ty) = (&field.ident, &field.ty);
        out.extend(quote! {
            #[automatically_derived]
            impl #impl_generics ::ruststream::AttemptRow for #name #ty_generics #where_clause {
                type Attempt = #ty;

                fn attempt(&self) -> &#ty {
                    &self.#ident
                }
            }
        });
    }
    if let Some(message) = &attrs.message {
        // Each field the key reads is read from the message's field of the same name: a
        // message without it does not compile, at the template.
        let span = attrs
            .advisory
            .as_ref()
            .map_or_else(|| message.span(), |t| t.span());
        let columns = message_keys.iter().map(|(field, column)| {
            let field = Ident::new(field, span);
            quote::quote_spanned! {span=>
                .column(
                    #column,
                    ::ruststream::Value::from(::core::clone::Clone::clone(&message.#field)),
                )
            }
        });
        out.extend(quote! {
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
        });
    }
    if let Some(field) = role(Role::Payload) {
        let (ident, ty) = (&field.ident, &field.ty);
        let as_ref = quote::quote_spanned!(ty.span()=> ::core::convert::AsRef::<[u8]>::as_ref);
        out.extend(quote! {
            #[automatically_derived]
            impl #impl_generics ::ruststream::PayloadRow for #name #ty_generics #where_clause {
                type Column = #ty;

                fn payload(&self) -> &[u8] {
                    #as_ref(&self.#ident)
                }
            }
        });
    }
    Ok(out)
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

fn role_name(field: &Field) -> &'static str {
    field.role.map_or("id", |(role, _)| role.name())
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

fn table_attrs(input: &DeriveInput, errors: &mut Errors) -> TableAttrs {
    let mut out = TableAttrs::default();
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("inbox")) {
        out.attr.get_or_insert_with(|| attr.clone());
        let parsed = attr.parse_nested_meta(|meta| {
            let path = &meta.path;
            let once = |slot: &Option<LitStr>, key: &str| match slot {
                Some(_) => Err(syn::Error::new(
                    path.span(),
                    format!("`{key}` is given twice"),
                )),
                None => Ok(()),
            };
            if path.is_ident("table") {
                once(&out.table, "table")?;
                out.table = Some(meta.value()?.parse()?);
            } else if path.is_ident("advisory_lock") {
                once(&out.advisory, "advisory_lock")?;
                out.advisory = Some(meta.value()?.parse()?);
            } else if path.is_ident("order") {
                once(&out.order, "order")?;
                out.order = Some(meta.value()?.parse()?);
            } else if path.is_ident("unique") {
                once(&out.unique, "unique")?;
                out.unique = Some(meta.value()?.parse()?);
            } else if path.is_ident("message") {
                if out.message.is_some() {
                    return Err(meta.error("`message` is given twice"));
                }
                out.message = Some(meta.value()?.parse()?);
            } else if let Some(role) = path
                .get_ident()
                .and_then(Role::from_ident)
                .filter(|r| Role::COLUMNS_ONLY.contains(r))
            {
                if out.columns.iter().any(|(r, _)| *r == role) {
                    return Err(meta.error(format!("`{}` is given twice", role.name())));
                }
                out.columns.push((role, meta.value()?.parse()?));
            } else if path.is_ident("custom") {
                if out.custom.is_some() {
                    return Err(meta.error("`custom(..)` is given twice"));
                }
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
                out.custom = Some((path.span(), lock, unlock));
            } else {
                return Err(meta.error(format!(
                    "unknown `#[inbox(..)]` key `{}`; expected `table = \"..\"`, `advisory_lock = \"..\"`, `custom(lock, unlock)`, `order = \"..\"`, `unique = \"..\"`, `message = Type`, or a column the struct does not read: `locked_until`, `processed_at`, `due`, `failed_at`, `error` or `errors` = \"..\"",
                    path.to_token_stream()
                )));
            }
            Ok(())
        });
        if let Err(error) = parsed {
            errors.push(error);
        }
    }
    out
}

fn fields(input: &DeriveInput, errors: &mut Errors) -> syn::Result<Vec<Field>> {
    let named = match &input.data {
        Data::Struct(data) => match &data.fields {
            Fields::Named(named) => named,
            other => {
                return Err(syn::Error::new(
                    other.span(),
                    "`#[derive(Inbox)]` describes a struct with named fields: each field is a column of the same name",
                ));
            }
        },
        Data::Enum(data) => {
            return Err(syn::Error::new(
                data.enum_token.span(),
                "`#[derive(Inbox)]` describes a struct with named fields, one row of the table; not an enum",
            ));
        }
        Data::Union(data) => {
            return Err(syn::Error::new(
                data.union_token.span(),
                "`#[derive(Inbox)]` describes a struct with named fields, one row of the table; not a union",
            ));
        }
    };
    let mut out = Vec::new();
    for field in &named.named {
        let Some(ident) = field.ident.clone() else {
            continue;
        };
        let name = ident.unraw().to_string();
        let mut parsed = Field {
            column: name.clone(),
            name,
            ident,
            ty: field.ty.clone(),
            role: None,
            generated: None,
            column_only: false,
        };
        let mut renamed = false;
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("field")) {
            let result = attr.parse_nested_meta(|meta| {
                let span = meta.path.span();
                if meta.path.is_ident("generated") {
                    if parsed.generated.is_some() {
                        return Err(meta.error("`generated` is given twice"));
                    }
                    parsed.generated = Some(span);
                } else if meta.path.is_ident("rename") {
                    if renamed {
                        return Err(meta.error("`rename` is given twice"));
                    }
                    let lit: LitStr = meta.value()?.parse()?;
                    if lit.value().trim().is_empty() {
                        return Err(syn::Error::new(
                            lit.span(),
                            "`rename = \"\"`: the column's name is empty",
                        ));
                    }
                    parsed.column = lit.value();
                    renamed = true;
                } else if let Some(role) = meta.path.get_ident().and_then(Role::from_ident) {
                    if let Some((first, _)) = parsed.role {
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
                    parsed.role = Some((role, span));
                } else {
                    return Err(meta.error(format!(
                        "unknown field attribute `{}`; expected {FIELD_WORDS}",
                        meta.path.to_token_stream()
                    )));
                }
                Ok(())
            });
            if let Err(error) = result {
                errors.push(error);
            }
        }
        if let Some(span) = parsed.generated {
            match parsed.role {
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
        out.push(parsed);
    }
    Ok(out)
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

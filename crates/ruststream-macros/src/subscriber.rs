//! `#[subscriber(SOURCE)]`: an `async fn` handler turned into a unit struct that implements
//! `Handle` and includes itself as a subscription.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, GenericArgument, Ident, ItemFn, PathArguments, ReturnType, Type, TypePath};

use crate::Errors;

const SHAPE: &str = "async fn name(message: &Message, Ctx(value): Ctx<keys::Key>, State(value): State<T>, ..) -> Result<(), E>";

/// Expands `#[subscriber(SOURCE)]` on an `async fn`: reads the source's type and the
/// handler's signature, reporting every mistake at once, then writes the subscriber.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    if args.is_empty() {
        return Err(syn::Error::new(
            Span::call_site(),
            "`#[subscriber(..)]` names the source of its messages, such as `#[subscriber(InboxQueue::<Row>::new(\"name\"))]`",
        ));
    }
    let source: Expr = syn::parse2(args)?;
    let source_ty = source_type(&source)?;
    let function: ItemFn = syn::parse2(item)?;
    let handler = Handler::read(&function.sig)?;
    Ok(Subscriber::new(&function, &source, source_ty, handler).tokens())
}

/// How the handler takes its message.
#[derive(Clone, Copy)]
enum Taking {
    /// `&Message`: the decoded message, lent.
    Lent,
    /// `Message`: a clone of the decoded message.
    Owned,
}

/// The handler's first argument: its message.
struct MessageArg {
    pat: Box<syn::Pat>,
    ty: Box<Type>,
    taking: Taking,
}

/// An argument after the message: its pattern, its type and what it extracts.
struct ExtractorArg {
    pat: Box<syn::Pat>,
    ty: Box<Type>,
    kind: Extractor,
}

/// A handler whose signature passed every rule: its message, its extractors and its
/// return type.
struct Handler {
    message: MessageArg,
    extractors: Vec<ExtractorArg>,
    output: Box<Type>,
}

impl Handler {
    /// Reads and checks the signature; every mistake is reported together, each at the token
    /// at fault.
    fn read(sig: &syn::Signature) -> syn::Result<Self> {
        let mut errors = Errors::default();
        check_qualifiers(sig, &mut errors);
        let mut inputs = sig.inputs.iter();
        let message = message_arg(sig, inputs.next(), &mut errors);
        let extractors = extractor_args(inputs, &mut errors);
        let output = output_type(sig, &mut errors);
        errors.finish()?;
        let (Some(message), Some(output)) = (message, output) else {
            return Err(syn::Error::new(sig.span(), "reported above"));
        };
        Ok(Self {
            message,
            extractors,
            output,
        })
    }
}

/// A subscriber is a safe, plain Rust `async fn` without generics or variadic arguments.
fn check_qualifiers(sig: &syn::Signature, errors: &mut Errors) {
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span(),
            format!("a subscriber is an `async fn`: `{SHAPE}`"),
        ));
    }
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span(),
            "a subscriber is an `async fn`, not a `const fn`",
        ));
    }
    if let Some(unsafety) = &sig.unsafety {
        errors.push(syn::Error::new(
            unsafety.span(),
            "a subscriber is a safe `async fn`",
        ));
    }
    if let Some(abi) = &sig.abi {
        errors.push(syn::Error::new(
            abi.span(),
            "a subscriber is a Rust `async fn`, with no `extern`",
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.push(syn::Error::new_spanned(
            &sig.generics,
            "a subscriber takes no generic parameters: it handles one message type",
        ));
    }
    if let Some(variadic) = &sig.variadic {
        errors.push(syn::Error::new(
            variadic.span(),
            "a subscriber takes no variadic arguments",
        ));
    }
}

/// The message: `pattern: &Message`, or `pattern: Message` for a clone of it.
fn message_arg(
    sig: &syn::Signature,
    first: Option<&FnArg>,
    errors: &mut Errors,
) -> Option<MessageArg> {
    let arg = match first {
        None => {
            errors.push(syn::Error::new(
                sig.paren_token.span.join(),
                format!("a subscriber takes its message first: `{SHAPE}`"),
            ));
            return None;
        }
        Some(FnArg::Receiver(receiver)) => {
            errors.push(syn::Error::new_spanned(
                receiver,
                "a subscriber is a free `async fn`, without `self`",
            ));
            return None;
        }
        Some(FnArg::Typed(arg)) => arg,
    };
    let (ty, taking) = match &*arg.ty {
        Type::Reference(reference) if reference.mutability.is_none() => {
            (reference.elem.clone(), Taking::Lent)
        }
        Type::Reference(reference) => {
            errors.push(syn::Error::new(
                reference.mutability.span(),
                "the message is lent to the handler shared, not mutable: write `&Message`, or take it by value: `Message`",
            ));
            return None;
        }
        // By value: a clone of the decoded message.
        other => (Box::new(other.clone()), Taking::Owned),
    };
    Some(MessageArg {
        pat: arg.pat.clone(),
        ty,
        taking,
    })
}

/// The extractors: `pattern: Ctx<Key>`, `pattern: State<T>` or any other `FromContext`.
fn extractor_args<'a>(
    inputs: impl Iterator<Item = &'a FnArg>,
    errors: &mut Errors,
) -> Vec<ExtractorArg> {
    let mut extractors = Vec::new();
    for input in inputs {
        match input {
            FnArg::Receiver(receiver) => errors.push(syn::Error::new_spanned(
                receiver,
                "a subscriber is a free `async fn`, without `self`",
            )),
            FnArg::Typed(arg) => extractors.push(ExtractorArg {
                pat: arg.pat.clone(),
                ty: arg.ty.clone(),
                kind: extractor(&arg.ty),
            }),
        }
    }
    extractors
}

/// The return type, which says the outcome; a handler that returns nothing is an error.
fn output_type(sig: &syn::Signature, errors: &mut Errors) -> Option<Box<Type>> {
    match &sig.output {
        ReturnType::Type(_, ty) => Some(ty.clone()),
        ReturnType::Default => {
            errors.push(syn::Error::new(
                sig.paren_token.span.close(),
                "a subscriber returns its outcome: add `-> Result<(), E>` (`Ok(())` acknowledges, `Err(e)` retries) or `-> HandlerOutcome`",
            ));
            None
        }
    }
}

/// The function's attributes as the output places them: the docs on the struct, the `cfg`s
/// on every item, and the rest on `handle`.
struct Attributes<'a> {
    docs: Vec<&'a syn::Attribute>,
    cfgs: Vec<&'a syn::Attribute>,
    others: Vec<&'a syn::Attribute>,
}

impl<'a> Attributes<'a> {
    /// Sorts the attributes into docs, `cfg`s and the rest, each in the order written.
    fn split(attrs: &'a [syn::Attribute]) -> Self {
        let (docs, rest): (Vec<_>, Vec<_>) =
            attrs.iter().partition(|attr| attr.path().is_ident("doc"));
        let (cfgs, others) = rest
            .into_iter()
            .partition(|attr| attr.path().is_ident("cfg"));
        Self { docs, cfgs, others }
    }
}

/// A checked handler and its source, ready to be written out as a unit struct, its `Handle`
/// impl, its options and its `IntoSubscription` impl.
struct Subscriber<'a> {
    function: &'a ItemFn,
    attrs: Attributes<'a>,
    source: &'a Expr,
    source_ty: TokenStream,
    handler: Handler,
    /// The name the subscription is known by: the function's, without `r#`.
    name_text: String,
    /// The delivery's context: its row, attempt and key, for the extractors and for a test's
    /// recorder ([`ruststream::testing::Recorded`]).
    context: TokenStream,
    /// The `handle` parameter the extractors read the context from.
    ctx: Ident,
    /// The `handle` parameter that holds the decoded message.
    message: Ident,
}

impl<'a> Subscriber<'a> {
    /// The subscriber of a checked handler, with the names its output uses.
    fn new(
        function: &'a ItemFn,
        source: &'a Expr,
        source_ty: TokenStream,
        handler: Handler,
    ) -> Self {
        Self {
            function,
            attrs: Attributes::split(&function.attrs),
            source,
            source_ty,
            handler,
            name_text: function.sig.ident.unraw().to_string(),
            context: quote!(::ruststream::InboxContext),
            ctx: Ident::new("ctx", Span::mixed_site()),
            message: Ident::new("message", Span::mixed_site()),
        }
    }

    /// The unit struct, then its impls, each under the function's `cfg`s.
    fn tokens(&self) -> TokenStream {
        let name = &self.function.sig.ident;
        let vis = &self.function.vis;
        let Attributes { docs, cfgs, .. } = &self.attrs;
        let handle = self.handle_impl();
        let options = self.options_impl();
        let subscription = self.subscription_impl();
        quote! {
            #(#cfgs)*
            #(#docs)*
            #[allow(non_camel_case_types)]
            #[derive(Clone, Copy, Debug)]
            #vis struct #name;

            #(#cfgs)*
            #handle

            #(#cfgs)*
            #options

            #(#cfgs)*
            #subscription
        }
    }

    /// `SubscriberBuilder<..>`: the type each option answers.
    fn builder_ty(&self) -> TokenStream {
        let (name, source_ty, context) = (&self.function.sig.ident, &self.source_ty, &self.context);
        let message_ty = &self.handler.message.ty;
        quote! {
            ::ruststream::SubscriberBuilder<#name, #source_ty, #message_ty, (), (), #context>
        }
    }

    /// `Handle`: takes the message, runs the extractors, then the function's body, and turns
    /// what it answers into the delivery's outcome.
    fn handle_impl(&self) -> TokenStream {
        let (name, context, ctx, message) = (
            &self.function.sig.ident,
            &self.context,
            &self.ctx,
            &self.message,
        );
        let others = &self.attrs.others;
        let message_ty = &self.handler.message.ty;
        let output = &self.handler.output;
        let block = &self.function.block;
        let ctx_param = if self.handler.extractors.is_empty() {
            quote!(_)
        } else {
            quote!(#ctx)
        };
        // Spanned at the return type, so a body that answers something else is an error there.
        let outcome = format_ident!("__ruststream_outcome", span = output.span());
        let into_outcome = quote_spanned!(output.span()=> ::ruststream::IntoOutcome::into_outcome);
        let take_message = self.take_message();
        let extract = self.extract();
        quote! {
            impl ::ruststream::Handle<#message_ty, (), (), #context> for #name {
                #(#others)*
                async fn handle(
                    &self,
                    #message: &#message_ty,
                    _: &(),
                    #ctx_param: &mut ::ruststream::Context<'_, #context>,
                ) -> ::core::result::Result<(), ::ruststream::HandlerOutcome> {
                    #take_message
                    #(#extract)*
                    let #outcome: #output = async move #block.await;
                    #into_outcome(#outcome).into_result()
                }
            }
        }
    }

    /// Binds the message's pattern: to the decoded message, or to a clone of it when the
    /// handler takes it by value.
    fn take_message(&self) -> TokenStream {
        let MessageArg { pat, ty, taking } = &self.handler.message;
        let message = &self.message;
        match taking {
            Taking::Owned => quote_spanned! {ty.span()=>
                let #pat: #ty = ::ruststream::__private::owned(#message);
            },
            Taking::Lent => quote!(let #pat: &#ty = #message;),
        }
    }

    /// Binds each extractor's pattern to what it extracts from the context, each spanned at
    /// its type so a type that extracts nothing is an error there.
    fn extract(&self) -> Vec<TokenStream> {
        let (source_ty, context, ctx) = (&self.source_ty, &self.context, &self.ctx);
        let extract = |ExtractorArg { pat, ty, kind }: &ExtractorArg| match kind {
            // The attempt of a table without the column is a compile error, naming it.
            Extractor::Ctx(key) if names_attempt(key) => quote_spanned! {ty.span()=>
                ::ruststream::__private::counts_attempts::<#source_ty>();
                let #pat: #ty = ::ruststream::Ctx::<#key>::from_context(#ctx).await?;
            },
            Extractor::Ctx(key) => quote_spanned! {ty.span()=>
                let #pat: #ty = ::ruststream::Ctx::<#key>::from_context(#ctx).await?;
            },
            Extractor::Other => quote_spanned! {ty.span()=>
                let #pat: #ty = <#ty as ::ruststream::FromContext<#context>>::from_context(#ctx).await?;
            },
        };
        self.handler.extractors.iter().map(extract).collect()
    }

    /// The subscriber's options: `builder()`, and each of the builder's options as a method
    /// of the unit struct, so `name.workers(4)` reads as the subscription with four workers.
    fn options_impl(&self) -> TokenStream {
        let (name, name_text, vis) = (
            &self.function.sig.ident,
            &self.name_text,
            &self.function.vis,
        );
        let (source, context) = (self.source, &self.context);
        let message_ty = &self.handler.message.ty;
        let builder = self.builder_ty();
        let builder_doc = format!(
            "The subscription `{name_text}` as a builder, to set its workers and timings before it is included."
        );
        let options = self.option_methods();
        quote! {
            #[allow(dead_code)]
            impl #name {
                #[doc = #builder_doc]
                #vis fn builder(self) -> #builder {
                    ::ruststream::subscriber::<Self, #message_ty, (), (), #context>(#name_text, self)
                        .map_source(|_| #source)
                }

                #options
            }
        }
    }

    /// The builder's options, each a method of the unit struct that starts from `builder()`.
    fn option_methods(&self) -> TokenStream {
        let vis = &self.function.vis;
        let builder = self.builder_ty();
        quote! {
            /// How many messages may be in work at once (default 1): `8`, or a
            /// `NonZeroUsize`; the start refuses zero.
            #vis fn workers(self, workers: impl ::ruststream::IntoWorkers) -> #builder {
                self.builder().workers(workers)
            }

            /// The retry policy: how long a retried message waits, by attempt.
            #vis fn retry_policy(self, policy: ::ruststream::RetryPolicy) -> #builder {
                self.builder().retry_policy(policy)
            }

            /// How many attempts a message gets before it fails (needs the attempt and
            /// `failed_at` columns).
            #vis fn max_attempts(self, attempts: u32) -> #builder {
                self.builder().max_attempts(attempts)
            }

            /// How long a handler may run before its message is retried.
            #vis fn timeout(self, timeout: ::std::time::Duration) -> #builder {
                self.builder().timeout(timeout)
            }

            /// How many rows to claim ahead of the free workers.
            #vis fn prefetch(self, rows: usize) -> #builder {
                self.builder().prefetch(rows)
            }

            /// Creates what the table's description needs where it is missing, at the start.
            #vis fn ensure_schema(self) -> #builder {
                self.builder().ensure_schema()
            }

            /// Calls `hook` with each message that fails.
            #vis fn on_failure(
                self,
                hook: impl ::core::ops::Fn(&::ruststream::Failure) + ::core::marker::Send + ::core::marker::Sync + 'static,
            ) -> #builder {
                self.builder().on_failure(hook)
            }

            /// How long to wait between claims that find nothing (default 1 s).
            #vis fn poll_interval(self, interval: ::std::time::Duration) -> #builder {
                self.builder().poll_interval(interval)
            }

            /// The lease form: how long a lease lasts (default 30 s); a lease in work is
            /// extended every third of it.
            #vis fn lease(self, lease: ::std::time::Duration) -> #builder {
                self.builder().lease(lease)
            }

            /// Gives the handler `value`, which it extracts by its type with `State<T>`.
            #vis fn state<T: ::core::clone::Clone + ::core::marker::Send + ::core::marker::Sync + 'static>(
                self,
                value: T,
            ) -> #builder {
                self.builder().state(value)
            }
        }
    }

    /// `IntoSubscription`: the subscriber with its default options, for any adapter its
    /// builder suits.
    fn subscription_impl(&self) -> TokenStream {
        let name = &self.function.sig.ident;
        let builder = self.builder_ty();
        quote! {
            impl<A: ::ruststream::adapter::Adapter> ::ruststream::IntoSubscription<A> for #name
            where
                #builder: ::ruststream::IntoSubscription<A>,
            {
                fn into_subscription(self) -> ::ruststream::Subscription<A> {
                    ::ruststream::IntoSubscription::<A>::into_subscription(self.builder())
                }
            }
        }
    }
}

/// What a failed expansion leaves: its errors, the function as it is written, and the source
/// in a closure nothing calls, so the errors are the only ones.
pub(crate) fn fallback(error: syn::Error, args: TokenStream, item: TokenStream) -> TokenStream {
    let error = error.into_compile_error();
    let source = match syn::parse2::<Expr>(args) {
        Ok(source) => quote! {
            const _: () = {
                #[allow(dead_code)]
                fn source() {
                    let _ = || #source;
                }
            };
        },
        Err(_) => TokenStream::new(),
    };
    quote!(#error #item #source)
}

/// An argument after the message: what it extracts.
enum Extractor {
    /// `Ctx<K>`: the value the delivery's context provides under `K`.
    Ctx(Box<Type>),
    /// Any other type: extracted by its `FromContext`, such as `State<T>` or an adapter's
    /// claim; a type that is none is a compile error at the argument.
    Other,
}

/// The extractor an argument's type names: `Ctx<K>` (or a path ending so), or another.
fn extractor(ty: &Type) -> Extractor {
    ctx_key(ty).map_or(Extractor::Other, |key| Extractor::Ctx(Box::new(key)))
}

/// Whether a key is the attempt's: `keys::Attempt` (or a path ending so).
fn names_attempt(key: &Type) -> bool {
    matches!(key, Type::Path(TypePath { qself: None, path })
        if path.segments.last().is_some_and(|s| s.ident == "Attempt"))
}

/// `K` of `Ctx<K>` (or `path::Ctx<K>`).
fn ctx_key(ty: &Type) -> Option<Type> {
    generic_of(ty, "Ctx")
}

/// `X` of `Name<X>` (or `path::Name<X>`).
fn generic_of(ty: &Type, name: &str) -> Option<Type> {
    let Type::Path(TypePath { qself: None, path }) = ty else {
        return None;
    };
    let last = path.segments.last()?;
    if last.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut args = args.args.iter();
    match (args.next(), args.next()) {
        (Some(GenericArgument::Type(key)), None) => Some(key.clone()),
        _ => None,
    }
}

/// The type of the source expression, read from its form: `Type::constructor(..)`,
/// `<Type>::constructor(..)` or `Type { .. }`.
fn source_type(source: &Expr) -> syn::Result<TokenStream> {
    let unreadable = || {
        syn::Error::new_spanned(
            source,
            "the source is written as a constructor call of its type, `Type::constructor(..)` or `<Type>::constructor(..)`, such as `InboxQueue::<Row>::new(\"name\")`, so the subscription can name its type",
        )
    };
    let path = match source {
        Expr::Call(call) => match &*call.func {
            Expr::Path(path) => path,
            _ => return Err(unreadable()),
        },
        Expr::Struct(lit) if lit.qself.is_none() => return Ok(type_path(lit.path.clone())),
        Expr::Paren(inner) => return source_type(&inner.expr),
        _ => return Err(unreadable()),
    };
    if let Some(qself) = &path.qself {
        // `<Type>::new(..)`; `<Type as Trait>::new(..)` names a trait's constructor, whose
        // type is the trait's to say.
        if qself.position == 0 {
            let ty = &qself.ty;
            return Ok(quote!(#ty));
        }
        return Err(unreadable());
    }
    let mut path = path.path.clone();
    if path.segments.len() < 2 {
        return Err(unreadable());
    }
    path.segments.pop();
    // Drop the trailing `::` the pop leaves.
    let last = path.segments.pop().map(|pair| pair.into_value());
    if let Some(last) = last {
        path.segments.push(last);
    }
    Ok(type_path(path))
}

/// A path as a type: turbofish arguments written as plain generics.
fn type_path(mut path: syn::Path) -> TokenStream {
    for segment in &mut path.segments {
        if let PathArguments::AngleBracketed(args) = &mut segment.arguments {
            args.colon2_token = None;
        }
    }
    quote!(#path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(source: &str) -> syn::Result<String> {
        source_type(&syn::parse_str(source).unwrap()).map(|ty| ty.to_string())
    }

    #[test]
    fn reads_the_source_type_from_its_constructor() {
        assert_eq!(
            read("InboxQueue::<Transcode>::new(\"videos\")").unwrap(),
            "InboxQueue < Transcode >"
        );
        assert_eq!(
            read("ruststream::InboxQueue::<a::Row>::new(\"x\")").unwrap(),
            "ruststream :: InboxQueue < a :: Row >"
        );
        assert_eq!(
            read("<InboxQueue<Row>>::new(\"x\")").unwrap(),
            "InboxQueue < Row >"
        );
        assert_eq!(read("(Queue::default())").unwrap(), "Queue");
        assert_eq!(read("Queue { name: \"x\" }").unwrap(), "Queue");
        for unreadable in ["queue()", "QUEUE", "make().queue()", "<T as Make>::new()"] {
            assert!(read(unreadable).is_err(), "{unreadable}");
        }
    }

    #[test]
    fn finds_the_key_of_an_extractor() {
        let key = |ty: &str| ctx_key(&syn::parse_str(ty).unwrap()).map(|k| quote!(#k).to_string());
        assert_eq!(
            key("Ctx<keys::Attempt>").as_deref(),
            Some("keys :: Attempt")
        );
        assert_eq!(key("ruststream::Ctx<K>").as_deref(), Some("K"));
        assert_eq!(key("Ctx"), None);
        assert_eq!(key("Ctx<A, B>"), None);
        assert_eq!(key("i64"), None);
        assert_eq!(key("&Ctx<K>"), None);
    }
}

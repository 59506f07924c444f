//! `#[ruststream::app]`: a `main` that runs the service a function builds.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::ItemFn;
use syn::spanned::Spanned;

use crate::Errors;

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    if !args.is_empty() {
        errors.push(syn::Error::new_spanned(
            &args,
            "`#[ruststream::app]` takes no arguments",
        ));
    }
    let function: ItemFn = syn::parse2(item)?;
    let sig = &function.sig;
    if let Some(asyncness) = &sig.asyncness {
        errors.push(syn::Error::new(
            asyncness.span(),
            "`#[ruststream::app]` takes a plain `fn` that builds the service, `fn app() -> impl App`: the generated `main` starts the runtime and runs it, so the function is not `async`",
        ));
    }
    if !sig.inputs.is_empty() {
        errors.push(syn::Error::new_spanned(
            &sig.inputs,
            "`#[ruststream::app]` takes a function without arguments, `fn app() -> impl App`: the generated `main` has nothing to pass it",
        ));
    }
    if !sig.generics.params.is_empty() {
        errors.push(syn::Error::new_spanned(
            &sig.generics,
            "`#[ruststream::app]` takes a function without generic parameters, `fn app() -> impl App`",
        ));
    }
    errors.finish()?;
    let name = &sig.ident;
    let main = syn::Ident::new("main", Span::call_site());
    Ok(quote! {
        #function

        /// Runs the service `app` builds, on a new multi-threaded tokio runtime, until SIGINT
        /// or SIGTERM; exits with 1 if it fails.
        fn #main() -> ::std::process::ExitCode {
            ::ruststream::run_app(#name())
        }
    })
}

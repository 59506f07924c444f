//! Procedural macros for ruststream, used through the runtime's re-exports:
//! [`ruststream::Inbox`](macro@Inbox), [`ruststream::subscriber`](macro@subscriber) and
//! [`ruststream::app`](macro@app).
//!
//! Each macro writes what a service would otherwise write by hand: `#[derive(Inbox)]` the
//! `InboxTable`, `PayloadRow` and `AttemptRow` impls with their `InboxSpec` chain,
//! `#[subscriber]` a unit struct that implements `Handle` and includes itself as a
//! subscription, `#[ruststream::app]` a `main` that runs the service. A description or a
//! handler that breaks a rule is a compile error at the attribute or token at fault, with a
//! message that names the rule.
//!
//! The generated code names the runtime as `::ruststream`, so a crate that uses the macros
//! depends on `ruststream`.

use proc_macro::TokenStream;

mod app;
mod inbox;
mod subscriber;

/// Describes a row type's queue table: `#[inbox(table = "..", ..)]` on the struct and a
/// `#[field(role)]` per role column; the columns it has choose the form
/// ([The three forms](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md)).
///
/// - `#[inbox(..)]`: `table = "name"` (required); `advisory_lock = "jobs-{field}"` (the
///   advisory form, keyed by the fields' columns; `{{` and `}}` are braces); `custom(lock,
///   unlock)` (your own `Lock` and `Unlock` take each key; advisory form only); `order =
///   "field, other desc"` (the claim order; default the due column, then the id); `unique =
///   "field, other"` (a publish whose values there are already in the table writes nothing:
///   `Published::skipped`); `message = Type` (the payload's one message: a publisher takes
///   `&Type`, and the key's and `unique`'s columns come from its fields of the same names);
///   `locked_until`, `processed_at`, `due`, `failed_at`, `error`, `errors` `= "column"` (a
///   role column with no field: the database alone reads and writes it).
/// - `#[field(..)]`: one role of `id` (exactly one field), `attempt`, `payload`,
///   `locked_until` (the lease form), `processed_at`, `due`, `failed_at` (failed rows stay,
///   marked), `error` (the last error's text), `errors` (the last attempts' errors, as JSON);
///   and `generated` (the database fills it) and
///   `rename = "column"`. A field without a role is a column the key or the order may read.
/// - A time role's field must decode the column's type: PostgreSQL `TIMESTAMPTZ`, MySQL and
///   MariaDB `DATETIME(6)`, SQLite an `INTEGER` of microseconds (`i64`); name the column in
///   `#[inbox(..)]` instead where the row need not read it ([Bad rows](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#bad-rows)).
///
/// # Example
///
/// `Transcode`, in [the advisory form](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#the-advisory-form): the videos of one channel go into work one at a
/// time.
///
/// ```
/// use ruststream::{Inbox, InboxTable};
///
/// /// One row of `video_jobs`, held by a lock on its channel's key while it is in work.
/// #[derive(Inbox)]
/// #[inbox(table = "video_jobs", advisory_lock = "video_jobs-{channel}")]
/// struct Transcode {
///     #[field(id, generated)]
///     id: i64,
///     channel: String,
///     #[field(attempt, generated)]
///     attempt: i16,
///     #[field(payload)]
///     payload: Vec<u8>,
/// }
/// ```
///
/// expands to what `examples/manual/sqlx_forms_advisory.rs` writes by hand (a description's
/// type lists its features in this order: `Advisory`, `Attempt`, `Payload`, `Lease`,
/// `Processed`, `Due`, `Failed`, `ErrorText`, `own::Lock`, `own::Unlock`):
///
/// ```
/// # use ruststream::*;
/// # struct Transcode { id: i64, channel: String, attempt: i16, payload: Vec<u8> }
/// impl InboxTable for Transcode {
///     type Id = i64;
///     type Table = InboxSpec<(Advisory, Attempt, Payload)>;
///     const TABLE: Self::Table = InboxSpec::new("video_jobs", Column::new("id").generated())
///         .advisory(&[KeyPart::Literal("video_jobs-"), KeyPart::Column("channel")])
///         .attempt(Column::new("attempt").generated())
///         .payload(Column::new("payload"));
///
///     fn id(&self) -> &i64 {
///         &self.id
///     }
/// }
///
/// impl AttemptRow for Transcode {
///     type Attempt = i16;
///
///     fn attempt(&self) -> &i16 {
///         &self.attempt
///     }
/// }
///
/// impl PayloadRow for Transcode {
///     type Column = Vec<u8>;
///
///     fn payload(&self) -> &[u8] {
///         &self.payload
///     }
/// }
/// ```
///
/// `Payout` ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)) takes its keys with the service's own lock:
///
/// ```
/// use ruststream::Inbox;
///
/// /// One row of `payouts`, held by the key of its account.
/// #[derive(Inbox)]
/// #[inbox(
///     table = "payouts",
///     advisory_lock = "accounts-{account_id}",
///     custom(lock, unlock)
/// )]
/// struct Payout {
///     #[field(id, generated)]
///     id: i64,
///     account_id: i64,
///     #[field(payload)]
///     payload: Vec<u8>,
/// }
/// # use ruststream::{InboxTable, InboxSpec, Advisory, Payload, own};
/// # let _: InboxSpec<(Advisory, Payload, own::Lock, own::Unlock)> = Payout::TABLE;
/// ```
///
/// # Errors
///
/// A description that breaks a rule does not compile, and the error points at the attribute
/// at fault: here, a key placeholder that names no field.
///
/// ```compile_fail
/// use ruststream::Inbox;
///
/// #[derive(Inbox)]
/// #[inbox(table = "video_jobs", advisory_lock = "video_jobs-{chanel}")]
/// struct Transcode {
///     #[field(id, generated)]
///     id: i64,
///     channel: String,
///     #[field(payload)]
///     payload: Vec<u8>,
/// }
/// ```
///
/// That SQLite has no row lock form is checked where the broker's database is known.
#[proc_macro_derive(Inbox, attributes(inbox, field))]
pub fn derive_inbox(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    inbox::derive(input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// A subscriber: `#[subscriber(InboxQueue::<Row>::new("name"))]` on `async fn name(message:
/// &M, extractors..) -> Result<(), E>` makes `name` a subscription a broker includes, with
/// its options: `b.include(name.workers(4))` ([Getting started](https://github.com/ruststream/ruststream/blob/main/docs/src/getting-started.md#the-program)).
///
/// The message may be taken by value (a clone); it may return `HandlerOutcome`; each later
/// argument is an extractor (`Ctx<K>`, `State<T>`, an adapter's claim). `name` becomes a unit
/// struct that implements `Handle` and `IntoSubscription`, with the subscription's options.
///
/// # Example
///
/// `transcode`, the subscriber of `Transcode` ([the advisory form](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#the-advisory-form)):
///
/// ```
/// use ruststream::{Ctx, HandlerOutcome, Inbox, InboxQueue, keys, subscriber};
/// # #[derive(Inbox)]
/// # #[inbox(table = "video_jobs", advisory_lock = "video_jobs-{channel}")]
/// # struct Transcode {
/// #     #[field(id, generated)]
/// #     id: i64,
/// #     channel: String,
/// #     #[field(attempt, generated)]
/// #     attempt: i16,
/// #     #[field(payload)]
/// #     payload: Vec<u8>,
/// # }
/// # #[derive(serde::Deserialize)]
/// # struct Video;
/// # async fn encode(_: &Video, _: i64) -> bool { true }
///
/// /// A video takes minutes to encode. The delivery's connection keeps the channel's key while the
/// /// handler runs, with no transaction open; a retry runs no statement and releases the key.
/// #[subscriber(InboxQueue::<Transcode>::new("videos"))]
/// async fn transcode(video: &Video, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
///     if encode(video, attempt).await {
///         return HandlerOutcome::ack();
///     }
///     HandlerOutcome::retry()
/// }
/// ```
///
/// expands to the handler `examples/manual/sqlx_forms_advisory.rs` writes by hand, and to
/// the subscription it builds:
///
/// ```
/// # use ruststream::*;
/// # #[derive(Inbox)]
/// # #[inbox(table = "video_jobs")]
/// # struct Transcode { #[field(id)] id: i64, #[field(payload)] payload: Vec<u8> }
/// # #[derive(serde::Deserialize)]
/// # struct Video;
/// # async fn encode(_: &Video, _: i64) -> bool { true }
/// #[allow(non_camel_case_types)]
/// struct transcode;
///
/// impl Handle<Video, (), (), InboxContext> for transcode {
///     async fn handle(
///         &self,
///         video: &Video,
///         _outs: &(),
///         ctx: &mut Context<'_, InboxContext>,
///     ) -> Result<(), HandlerOutcome> {
///         let Ctx(attempt) = Ctx::<keys::Attempt>::from_context(ctx).await?;
///         if encode(video, attempt).await {
///             return Ok(());
///         }
///         Err(HandlerOutcome::retry())
///     }
/// }
///
/// # let _ =
/// subscriber("transcode", transcode).map_source(|_| InboxQueue::<Transcode>::new("videos"))
/// # ;
/// ```
///
/// A service includes it as it stands, or with its workers set ([getting started](https://github.com/ruststream/ruststream/blob/main/docs/src/getting-started.md)):
///
/// ```ignore
/// .with_broker(broker.route::<Transcode>("videos"), |b| {
///     b.include(transcode);
/// })
/// .with_broker(broker.route::<IssueInvoice>("invoices"), |b| {
///     // Each of the four workers holds a connection while its invoice is in work.
///     b.include(issue.workers(nonzero!(4)));
/// })
/// ```
///
/// # Errors
///
/// A function that is not `async`, takes no message or takes it as `&mut`, is generic, or
/// returns nothing does not compile; the error points at the token at fault.
///
/// ```compile_fail
/// use ruststream::{HandlerOutcome, Inbox, InboxQueue, subscriber};
/// # #[derive(Inbox)]
/// # #[inbox(table = "invoice_jobs")]
/// # struct IssueInvoice { #[field(id)] id: i64, #[field(payload)] payload: Vec<u8> }
///
/// #[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
/// fn issue(invoice: &String) -> HandlerOutcome {
///     HandlerOutcome::ack()
/// }
/// ```
#[proc_macro_attribute]
pub fn subscriber(args: TokenStream, item: TokenStream) -> TokenStream {
    let (args, item): (proc_macro2::TokenStream, proc_macro2::TokenStream) =
        (args.into(), item.into());
    match subscriber::expand(args.clone(), item.clone()) {
        Ok(out) => out.into(),
        Err(error) => subscriber::fallback(error, args, item).into(),
    }
}

/// The service's `main`: `#[ruststream::app]` on `fn app() -> impl App { .. }` keeps the
/// function and adds `fn main() -> ExitCode { ruststream::run_app(app()) }`, which runs the
/// service on a new multi-threaded tokio runtime until SIGINT or SIGTERM.
///
/// # Example
///
/// A service that shuts down on SIGINT or SIGTERM ([shutdown](https://github.com/ruststream/ruststream/blob/main/docs/src/shutdown.md)):
///
/// ```no_run
/// use ruststream::{App, AppInfo, RustStream};
///
/// /// The service on the database `url` names.
/// fn service(url: &str) -> RustStream {
///     // A service adds its brokers and subscriptions here.
/// #   let _ = url;
///     RustStream::new(AppInfo::new("exports", "0.1.0"))
/// }
///
/// #[ruststream::app]
/// fn app() -> impl App {
///     service("sqlite:exports.db?mode=rwc")
/// }
/// ```
///
/// which adds
///
/// ```no_run
/// # fn app() -> impl ruststream::App {
/// #     ruststream::RustStream::new(ruststream::AppInfo::new("exports", "0.1.0"))
/// # }
/// fn main() -> std::process::ExitCode {
///     ruststream::run_app(app())
/// }
/// ```
///
/// # Errors
///
/// The function takes no arguments and is not `async`: `main` calls it and runs what it
/// answers.
///
/// ```compile_fail
/// use ruststream::{App, AppInfo, RustStream};
///
/// #[ruststream::app]
/// async fn app() -> impl App {
///     RustStream::new(AppInfo::new("exports", "0.1.0"))
/// }
/// ```
#[proc_macro_attribute]
pub fn app(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    match app::expand(args.into(), item.clone()) {
        Ok(out) => out.into(),
        // The function stays as it is written, beside an empty `main`, so the error is the
        // only one.
        Err(error) => {
            let mut out = error.into_compile_error();
            out.extend(item);
            out.extend(quote::quote!(
                fn main() {}
            ));
            out.into()
        }
    }
}

/// Errors gathered so that one expansion reports every mistake it finds.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(first) => first.combine(error),
            None => self.0 = Some(error),
        }
    }

    fn finish(&mut self) -> syn::Result<()> {
        match self.0.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

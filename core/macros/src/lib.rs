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

/// A row type's table description: `impl InboxTable`, and `impl PayloadRow` and
/// `impl AttemptRow` for its payload and attempt fields.
///
/// On the struct, `#[inbox(..)]` takes:
///
/// - `table = "name"`: the table (required).
/// - `advisory_lock = "template"`: the advisory lock form. Each `{field}` placeholder names a
///   field of the struct, and the key reads that field's column; `{{` and `}}` are literal
///   braces. The template is parsed at compile time.
/// - `custom(lock, unlock)`: the service's own `Lock` and `Unlock` replace the lock and
///   release of each key (advisory lock form only).
/// - `order = "field, other desc"`: the claim order, instead of the due column and then the id.
/// - `unique = "field, other"`: deduplicated publishing: the fields' columns hold a unique
///   index, and a publish of a row whose values there are already in the table writes
///   nothing and says so (`Published::skipped`). A publish gives each column's value, like a
///   key's.
/// - `message = Type`: the message the payload holds (`impl MessageTable`). A publisher of the
///   table then takes `&Type`, encoded as JSON, and fills each column the advisory key or
///   `unique` reads from the message's field of the same name: a message without such a
///   field does not compile.
/// - `locked_until = "column"`, `processed_at = "column"`, `due = "column"`,
///   `failed_at = "column"`, `error = "column"`: a role column the struct has no field for.
///   The database reads and writes these columns alone, so the row type need not decode them,
///   and a row type whose driver cannot read the column's type (a `TIMESTAMPTZ` into an
///   `i64`) is no trouble.
///
/// On a field, `#[field(..)]` takes one role, `id`, `attempt`, `payload`, `locked_until` (the
/// lease form), `processed_at`, `due`, `failed_at` (failed rows stay in the table, marked
/// with the time, and are never claimed again) or `error` (the text of the row's last
/// error), and optionally `generated` (the database fills the column, so publishing does not
/// write it) and `rename = "column"` (the column's name, by default the field's). Exactly one
/// field is the `id`. A field without a role is a column the advisory key or the order may
/// read.
///
/// A time role's field (`locked_until`, `processed_at`, `due`, `failed_at`) must decode the
/// column's type with the adapter's row mapping: on PostgreSQL a `TIMESTAMPTZ`
/// (`chrono::DateTime<Utc>` or `time::OffsetDateTime` with sqlx or tokio-postgres, as
/// `Option<..>` where the column may be `NULL`), on MySQL and MariaDB a `DATETIME(6)`
/// (`chrono::NaiveDateTime` or `time::PrimitiveDateTime`, or `mysql_async::Value`), on SQLite
/// an `INTEGER` of microseconds (`i64`). A service that does not read them names them in
/// `#[inbox(..)]` instead.
///
/// The description's type lists its features in this order: `Advisory`, `Attempt`,
/// `Payload`, `Lease`, `Processed`, `Due`, `Failed`, `ErrorText`, `own::Lock`,
/// `own::Unlock`.
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
/// expands to what `examples/manual/sqlx_forms_advisory.rs` writes by hand:
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
/// at fault: a missing `table`, no `#[field(id)]` or two, an unknown field attribute, an
/// `advisory_lock` placeholder that names no field (the message lists the fields) or that is
/// empty or unbalanced, `custom(lock)` without `unlock`, `custom(..)` without
/// `advisory_lock`, and `#[field(locked_until)]` together with `advisory_lock`.
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
/// A table without a lease or an advisory lock takes its rows by row lock, which SQLite does
/// not have: that rule is checked where the broker's database is known, not here.
#[proc_macro_derive(Inbox, attributes(inbox, field))]
pub fn derive_inbox(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    inbox::derive(input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// A subscriber: an `async fn` that handles one message, bound to its source.
///
/// `#[subscriber(SOURCE)]` goes on `async fn name(message: M, extractors..) -> Result<(), E>`
/// (or `&M`, or `-> HandlerOutcome`, or `-> Result<HandlerOutcome, E>`: `Ok(())`
/// acknowledges, `Err(e)` retries with `e` as the row's error, `Err(ruststream::permanent(e))`
/// fails it at once), where `SOURCE` is a constructor call of the source's type, such as
/// `InboxQueue::<Row>::new("name")`. Each argument after the message is an extractor:
/// `PATTERN: Ctx<K>`, which reads the value the delivery's context provides under the key
/// `K`, such as `Ctx(attempt): Ctx<keys::Attempt>`, or `PATTERN: State<T>`, the value of type
/// `T` the service (`RustStream::with_state`) or the subscription (`.state(value)`) was given,
/// such as `State(pool): State<PgPool>`.
///
/// It generates, in place of the function:
///
/// - a unit struct `name` (with the function's documentation), which implements
///   `Handle<M, (), (), InboxContext>`. Its `handle` extracts each argument with `Ctx::<K>::from_context(ctx).await?` or
///   `State::<T>::from_context(ctx).await?`, runs the function's body, and turns what it
///   returns into the trait's `Result<(), HandlerOutcome>` (`IntoOutcome`); a message taken by
///   value is a clone of the decoded one;
/// - `impl IntoSubscription<A>` for it, so a broker includes it as it stands,
///   `b.include(name)`: the subscription `subscriber("name", name).map_source(|_| SOURCE)`;
/// - inherent methods for every option of the subscription (`builder`, `workers`,
///   `poll_interval`, `lease`, `state`, `retry_policy`, `max_attempts`, `timeout`, `prefetch`,
///   `ensure_schema`, `on_failure`), which answer its `SubscriberBuilder`, so
///   `b.include(name.workers(4).max_attempts(8))` sets them.
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
/// A function that is not `async`, that takes no message, that takes its message by value,
/// or that takes an argument after the message that is not `Ctx<..>` does not compile; the
/// error points at the token at fault.
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

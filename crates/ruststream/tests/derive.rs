//! The macros write what the spec's manual examples write by hand: `#[derive(Inbox)]` the same
//! description, of the same type, as the manual `InboxSpec` chain; `#[subscriber]` a handler
//! that settles as the manual one does, and a subscription a broker includes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ruststream::adapter::{Adapter, AdapterError, TakesRows};
use ruststream::core::{Command, Dialect, Reply};
use ruststream::exec::BoxFuture;
use ruststream::{
    Advisory, AppInfo, Attempt, AttemptRow, BrokerHandle, Column, ContextKind, Ctx, DeliveryInfo,
    Due, Handle, HandlerOutcome, Inbox, InboxContext, InboxQueue, InboxSpec, InboxTable,
    IntoSubscription, KeyPart, Lease, OrderBy, Payload, PayloadRow, Processed, RustStream, Value,
    keys, nonzero, own, subscriber,
};
use serde::Deserialize;

// --- Rows: the derive beside the spec's manual descriptions -----------------------------------

/// The row lock form, `examples/sqlx_forms_row_lock.rs`.
#[derive(Inbox)]
#[inbox(table = "invoice_jobs")]
struct IssueInvoice {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The row lock form, `examples/manual/sqlx_forms_row_lock.rs`.
#[allow(dead_code)]
struct ManualIssueInvoice {
    id: i64,
    payload: Vec<u8>,
}

impl InboxTable for ManualIssueInvoice {
    type Id = i64;
    type Table = InboxSpec<(Payload,)>;
    const TABLE: Self::Table = InboxSpec::new("invoice_jobs", Column::new("id").generated())
        .payload(Column::new("payload"));

    fn id(&self) -> &i64 {
        &self.id
    }
}

impl PayloadRow for ManualIssueInvoice {
    type Column = Vec<u8>;

    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

/// The advisory form, `examples/sqlx_forms_advisory.rs`.
#[derive(Inbox)]
#[inbox(table = "video_jobs", advisory_lock = "video_jobs-{channel}")]
struct Transcode {
    #[field(id, generated)]
    id: i64,
    #[allow(dead_code)]
    channel: String,
    #[field(attempt, generated)]
    attempt: i16,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The advisory form, `examples/manual/sqlx_forms_advisory.rs`.
struct ManualTranscode {
    id: i64,
    attempt: i16,
    payload: Vec<u8>,
}

impl InboxTable for ManualTranscode {
    type Id = i64;
    type Table = InboxSpec<(Advisory, Attempt, Payload)>;
    const TABLE: Self::Table = InboxSpec::new("video_jobs", Column::new("id").generated())
        .advisory(&[KeyPart::Literal("video_jobs-"), KeyPart::Column("channel")])
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"));

    fn id(&self) -> &i64 {
        &self.id
    }
}

impl AttemptRow for ManualTranscode {
    type Attempt = i16;

    fn attempt(&self) -> &i16 {
        &self.attempt
    }
}

impl PayloadRow for ManualTranscode {
    type Column = Vec<u8>;

    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

/// A custom lock, `examples/sqlx_forms_lock.rs`.
#[derive(Inbox)]
#[inbox(
    table = "payouts",
    advisory_lock = "accounts-{account_id}",
    custom(lock, unlock)
)]
struct Payout {
    #[field(id, generated)]
    id: i64,
    #[allow(dead_code)]
    account_id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// A custom lock, `examples/manual/sqlx_forms_lock.rs`.
#[allow(dead_code)]
struct ManualPayout {
    id: i64,
    payload: Vec<u8>,
}

impl InboxTable for ManualPayout {
    type Id = i64;
    type Table = InboxSpec<(Advisory, Payload, own::Lock, own::Unlock)>;
    const TABLE: Self::Table = InboxSpec::new("payouts", Column::new("id").generated())
        .advisory(&[KeyPart::Literal("accounts-"), KeyPart::Column("account_id")])
        .payload(Column::new("payload"))
        .own::<own::Lock>()
        .own::<own::Unlock>();

    fn id(&self) -> &i64 {
        &self.id
    }
}

impl PayloadRow for ManualPayout {
    type Column = Vec<u8>;

    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

/// The lease form, with a due column the database fills and a claim order.
#[derive(Inbox)]
#[inbox(table = "exports", order = "priority desc, id")]
struct Export {
    #[field(id)]
    id: String,
    #[field(payload)]
    payload: Vec<u8>,
    #[field(attempt, generated)]
    attempt: i32,
    #[field(locked_until)]
    #[allow(dead_code)]
    locked_until: Option<i64>,
    #[field(due, generated)]
    #[allow(dead_code)]
    run_at: i64,
    #[allow(dead_code)]
    priority: i32,
}

const MANUAL_EXPORT: InboxSpec<(Attempt, Payload, Lease, Due)> =
    InboxSpec::new("exports", Column::new("id"))
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .lease(Column::new("locked_until"))
        .due(Column::new("run_at").generated())
        .order(&[OrderBy::desc("priority"), OrderBy::asc("id")]);

/// Settled by marking `processed_at`, in the advisory lock form, with renamed columns: the key
/// names fields and reads their columns.
#[derive(Inbox)]
#[inbox(table = "app.mails", advisory_lock = "mails-{tenant}:{{{box}}}")]
struct Mail {
    #[field(id, generated, rename = "mail_id")]
    id: u64,
    #[field(rename = "tenant_id")]
    #[allow(dead_code)]
    tenant: i64,
    #[allow(dead_code)]
    r#box: String,
    #[field(payload, rename = "body")]
    payload: String,
    #[field(processed_at)]
    #[allow(dead_code)]
    done_at: Option<i64>,
}

const MANUAL_MAIL: InboxSpec<(Advisory, Payload, Processed)> =
    InboxSpec::new("app.mails", Column::new("mail_id").generated())
        .advisory(&[
            KeyPart::Literal("mails-"),
            KeyPart::Column("tenant_id"),
            KeyPart::Literal(":{"),
            KeyPart::Column("box"),
            KeyPart::Literal("}"),
        ])
        .payload(Column::new("body"))
        .processed_at(Column::new("done_at"));

/// A generic row type keeps its parameters.
#[derive(Inbox)]
#[inbox(table = "generic_jobs")]
struct Generic<T: Send + Sync + 'static> {
    #[field(id)]
    id: T,
}

#[test]
fn derive_equals_the_manual_descriptions() {
    assert_eq!(IssueInvoice::TABLE.desc(), ManualIssueInvoice::TABLE.desc());
    assert_eq!(Transcode::TABLE.desc(), ManualTranscode::TABLE.desc());
    assert_eq!(Payout::TABLE.desc(), ManualPayout::TABLE.desc());
    assert_eq!(Export::TABLE.desc(), MANUAL_EXPORT.desc());
    assert_eq!(Mail::TABLE.desc(), MANUAL_MAIL.desc());
    assert_eq!(
        Generic::<i64>::TABLE.desc(),
        InboxSpec::new("generic_jobs", Column::new("id")).desc()
    );
    assert!(Payout::TABLE.desc().custom_lock());
    assert_eq!(
        Export::TABLE.desc().form(),
        ruststream::core::spec::Form::Lease
    );
    for desc in [
        IssueInvoice::TABLE.desc(),
        Transcode::TABLE.desc(),
        Payout::TABLE.desc(),
        Export::TABLE.desc(),
        Mail::TABLE.desc(),
    ] {
        desc.validate().unwrap();
    }
}

#[test]
fn derive_has_the_manual_types() {
    let _: <ManualIssueInvoice as InboxTable>::Table = IssueInvoice::TABLE;
    let _: <ManualTranscode as InboxTable>::Table = Transcode::TABLE;
    let _: <ManualPayout as InboxTable>::Table = Payout::TABLE;
    let _: InboxSpec<(Attempt, Payload, Lease, Due)> = Export::TABLE;
    let _: InboxSpec<(Advisory, Payload, Processed)> = Mail::TABLE;
    let _: InboxSpec<()> = Generic::<u8>::TABLE;
    fn same_id<A: InboxTable, B: InboxTable<Id = A::Id>>() {}
    same_id::<IssueInvoice, ManualIssueInvoice>();
    same_id::<Transcode, ManualTranscode>();
    same_id::<Payout, ManualPayout>();
    fn same_columns<A, B>()
    where
        A: PayloadRow + AttemptRow,
        B: PayloadRow<Column = A::Column> + AttemptRow<Attempt = A::Attempt>,
    {
    }
    same_columns::<Transcode, ManualTranscode>();
}

#[test]
fn derive_reads_the_row() {
    let row = Transcode {
        id: 7,
        channel: "news".into(),
        attempt: 2,
        payload: b"{}".to_vec(),
    };
    assert_eq!(*row.id(), 7);
    assert_eq!(*row.attempt(), 2);
    assert_eq!(row.payload(), b"{}");
    let manual = ManualTranscode {
        id: 7,
        attempt: 2,
        payload: b"{}".to_vec(),
    };
    assert_eq!(
        (row.id(), row.attempt(), row.payload()),
        (manual.id(), manual.attempt(), manual.payload())
    );
    let invoice = IssueInvoice {
        id: 1,
        payload: vec![1, 2],
    };
    assert_eq!((*invoice.id(), invoice.payload()), (1, &[1u8, 2][..]));
    let mail = Mail {
        id: 3,
        tenant: 1,
        r#box: "in".into(),
        payload: "hi".into(),
        done_at: None,
    };
    assert_eq!((*mail.id(), mail.payload()), (3, &b"hi"[..]));
    let export = Export {
        id: "e".into(),
        payload: vec![],
        attempt: 1,
        locked_until: None,
        run_at: 0,
        priority: 0,
    };
    assert_eq!((export.id().as_str(), *export.attempt()), ("e", 1));
    assert_eq!(*Generic { id: 5u8 }.id(), 5);
}

// --- Subscribers: the macro beside the spec's manual handlers ---------------------------------

#[derive(Clone, Debug, Deserialize)]
struct Video {
    fine: bool,
}

#[derive(Debug, Deserialize)]
struct Invoice {
    number: u32,
}

async fn encode(video: &Video, attempt: i64) -> bool {
    video.fine && attempt < 3
}

/// A video takes minutes to encode. The delivery's connection keeps the channel's key while the
/// handler runs, with no transaction open; a retry runs no statement and releases the key.
#[subscriber(InboxQueue::<Transcode>::new("videos"))]
async fn transcode(video: &Video, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
    if encode(video, attempt).await {
        return HandlerOutcome::ack();
    }
    HandlerOutcome::retry()
}

/// The manual twin of `transcode`.
struct TranscodeVideo;

impl Handle<Video, (), (), InboxContext> for TranscodeVideo {
    async fn handle(
        &self,
        video: &Video,
        _outs: &(),
        ctx: &mut ruststream::Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let Ctx(attempt) = Ctx::<keys::Attempt>::from_context(ctx).await?;
        if encode(video, attempt).await {
            return Ok(());
        }
        Err(HandlerOutcome::retry())
    }
}

/// The claim's transaction holds the row while the handler runs.
#[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
async fn issue(invoice: &Invoice) -> HandlerOutcome {
    if invoice.number == 0 {
        return HandlerOutcome::reject();
    }
    HandlerOutcome::ack()
}

/// `issue` written by hand, as the spec's manual examples write a handler: no context.
struct Issue;

impl Handle<Invoice> for Issue {
    fn handle(
        &self,
        invoice: &Invoice,
        _outs: &(),
        _ctx: &mut ruststream::Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        let outcome = if invoice.number == 0 {
            HandlerOutcome::reject()
        } else {
            HandlerOutcome::ack()
        };
        std::future::ready(outcome.into_result())
    }
}

/// Two extractors, patterns of any shape, and a source written `<Type>::new(..)`.
#[subscriber(<InboxQueue<Transcode>>::new("twice"))]
async fn twice(
    Video { fine }: &Video,
    first: Ctx<keys::Attempt>,
    Ctx(second): ruststream::Ctx<keys::Attempt>,
) -> HandlerOutcome {
    assert_eq!(first.0, second);
    if *fine {
        HandlerOutcome::ack()
    } else {
        HandlerOutcome::retry()
    }
}

fn inbox_context(attempt: Option<i64>) -> InboxContext {
    InboxContext::from_delivery(&DeliveryInfo {
        table: "video_jobs",
        subscription: "transcode",
        id: Value::Int(1),
        attempt,
        key: Some(Arc::from("video_jobs-news")),
    })
}

/// Runs `handler` on `message` with a context of `kind`, as the runtime does.
fn run<M, C, H: Handle<M, (), (), C>>(
    handler: &H,
    message: &M,
    mut kind: C,
) -> Result<(), HandlerOutcome> {
    let span = tracing::Span::none();
    let mut ctx = ruststream::Context::new(&mut kind, &span);
    block_on(handler.handle(message, &(), &mut ctx))
}

fn block_on<F: Future>(future: F) -> F::Output {
    futures::executor::block_on(future)
}

#[test]
fn subscriber_settles_as_the_manual_handler() {
    let fine = Video { fine: true };
    let broken = Video { fine: false };
    for (video, attempt) in [(&fine, 1), (&fine, 3), (&broken, 1)] {
        let generated = run(&transcode, video, inbox_context(Some(attempt)));
        let manual = run(&TranscodeVideo, video, inbox_context(Some(attempt)));
        assert_eq!(generated, manual, "{video:?}, attempt {attempt}");
    }
    // `ack` is `Ok`, `retry` an error; the attempt comes from the context.
    assert_eq!(run(&transcode, &fine, inbox_context(Some(1))), Ok(()));
    assert_eq!(
        run(&transcode, &fine, inbox_context(Some(3))),
        Err(HandlerOutcome::retry())
    );
    // A table without an attempt column: the extractor settles by its outcome, before the
    // body runs.
    let refused = run(&transcode, &fine, inbox_context(None)).expect_err("rejected");
    assert_eq!(refused.outcome(), HandlerOutcome::reject().outcome());
    assert!(
        refused
            .error()
            .is_some_and(|e| e.contains("describes no attempt column")),
        "{refused:?}"
    );
}

#[test]
fn subscriber_without_extractors_settles_as_the_manual_handler() {
    // `issue` reads the delivery's context (its row, for a test's recorder); it settles as the
    // manual `Issue`, which reads none.
    fn inbox<H: Handle<Invoice, (), (), InboxContext>>(_: &H) {}
    inbox(&issue);
    for number in [1, 0] {
        let invoice = Invoice { number };
        assert_eq!(
            run(&issue, &invoice, inbox_context(None)),
            run(&Issue, &invoice, ()),
            "invoice {number}"
        );
    }
    assert_eq!(
        run(&issue, &Invoice { number: 0 }, inbox_context(None)),
        Err(HandlerOutcome::reject())
    );
}

#[test]
fn subscriber_takes_any_patterns_and_several_extractors() {
    assert_eq!(
        run(&twice, &Video { fine: true }, inbox_context(Some(2))),
        Ok(())
    );
    assert_eq!(
        run(&twice, &Video { fine: false }, inbox_context(Some(2))),
        Err(HandlerOutcome::retry())
    );
}

// --- Subscriptions: what a broker includes -----------------------------------------------------

/// An adapter that takes every row type and is never started: it checks what a broker
/// includes.
struct Unstarted;

impl Adapter for Unstarted {
    type Row = ();
    type Lock = ();

    fn start(&self) -> BoxFuture<Result<Dialect, AdapterError>> {
        Box::pin(async { Err(AdapterError::new("never started")) })
    }

    fn execute(&self, _: Command, _: Option<()>) -> BoxFuture<Reply<()>> {
        Box::pin(std::future::pending())
    }

    fn close(&self) -> BoxFuture<()> {
        Box::pin(async {})
    }
}

impl<T> TakesRows<T> for Unstarted {
    fn decode((): ()) -> Result<T, String> {
        Err("never started".into())
    }

    fn custom_lock() -> Option<()> {
        None
    }
}

#[test]
fn subscriber_is_a_subscription() {
    let included = IntoSubscription::<Unstarted>::into_subscription(transcode);
    assert_eq!(included.name(), "transcode");
    assert_eq!(included.table(), Transcode::TABLE.desc());

    // The manual twin: `subscriber(..).map_source(..).build()`.
    let manual = subscriber("transcode", TranscodeVideo)
        .map_source(|_| InboxQueue::<Transcode>::new("videos"))
        .build();
    let manual = IntoSubscription::<Unstarted>::into_subscription(manual);
    assert_eq!(manual.table(), included.table());

    let issue_with_workers = issue.workers(nonzero!(4));
    assert_eq!(issue_with_workers.options().workers, 4);
    let timed = issue
        .poll_interval(Duration::from_millis(50))
        .lease(Duration::from_secs(9));
    assert_eq!(timed.options().poll_interval, Duration::from_millis(50));
    assert_eq!(timed.options().lease, Duration::from_secs(9));
    assert_eq!(timed.options().extend_every, Duration::from_secs(3));
    let included = IntoSubscription::<Unstarted>::into_subscription(issue_with_workers);
    assert_eq!(included.name(), "issue");
    assert_eq!(included.table(), IssueInvoice::TABLE.desc());
}

#[test]
fn broker_includes_subscribers_as_the_spec_writes() {
    // As in the row lock and advisory examples: `b.include(issue.workers(nonzero!(4)))` and
    // `b.include(transcode)`.
    let _service = RustStream::new(AppInfo::new("billing", "0.1.0")).with_broker(
        BrokerHandle::new(Unstarted),
        |b| {
            b.include(issue.workers(nonzero!(4)));
            b.include(transcode);
            b.include(twice.builder().build());
        },
    );
}

/// Failed rows: `failed_at` and `error` as field roles, and role columns the struct has no
/// field for, named in `#[inbox(..)]`.
#[derive(Inbox)]
#[inbox(
    table = "mails",
    locked_until = "locked_until",
    failed_at = "failed_at"
)]
#[allow(dead_code)]
struct FailingMail {
    #[field(id, generated)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i32,
    #[field(payload)]
    payload: Vec<u8>,
    #[field(error)]
    last_error: Option<String>,
}

#[derive(Inbox)]
#[inbox(table = "jobs")]
#[allow(dead_code)]
struct FailingJob {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
    #[field(failed_at, rename = "failed")]
    failed: Option<i64>,
    #[field(error)]
    error: Option<String>,
}

#[test]
fn derive_names_failed_rows_and_columns_without_fields() {
    let manual = InboxSpec::new("mails", Column::new("id").generated())
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .lease(Column::new("locked_until"))
        .failed(Column::new("failed_at"))
        .error(Column::new("last_error"));
    assert_eq!(FailingMail::TABLE.desc(), manual.desc());
    let _: InboxSpec<(
        Attempt,
        Payload,
        Lease,
        ruststream::Failed,
        ruststream::ErrorText,
    )> = FailingMail::TABLE;
    let job = InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .failed(Column::new("failed"))
        .error(Column::new("error"));
    assert_eq!(FailingJob::TABLE.desc(), job.desc());
    FailingMail::TABLE.desc().validate().unwrap();
}

#[test]
fn derive_lists_the_fields_that_decode_role_columns() {
    use ruststream::core::{FieldKind, RowField};
    let field = |column, rust, kind| RowField {
        column,
        field: column,
        rust,
        kind,
    };
    assert_eq!(
        FailingJob::ROW_FIELDS,
        &[
            field("failed", "Option<i64>", FieldKind::Integer),
            field("payload", "Vec<u8>", FieldKind::Bytes),
            field("error", "Option<String>", FieldKind::Text),
        ]
    );
    // Columns named in `#[inbox(..)]` have no field to decode them.
    let mail: Vec<&str> = FailingMail::ROW_FIELDS.iter().map(|f| f.column).collect();
    assert_eq!(mail, ["attempt", "payload", "last_error"]);
    assert!(
        FailingMail::ROW_FIELDS
            .iter()
            .all(|f| f.column != "locked_until" && f.column != "failed_at")
    );
}

/// The error of a handler that returns a `Result`: the message it prints, with a source.
#[derive(Debug)]
struct Unreachable(std::io::Error);

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the transcoder is unreachable")
    }
}

impl std::error::Error for Unreachable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// A handler as a Rust developer writes it: the message by value, `?` on its errors.
#[subscriber(InboxQueue::<Transcode>::new("videos"))]
async fn transcode_result(video: Video) -> Result<(), ruststream::BoxError> {
    if !video.fine {
        Err(Unreachable(std::io::Error::other("connection refused")))?;
    }
    Ok(())
}

/// A `Permanent` error, or a `HandlerOutcome` through `?`, settles as it says.
#[subscriber(InboxQueue::<Transcode>::new("videos"))]
async fn transcode_strict(video: &Video) -> Result<HandlerOutcome, ruststream::BoxError> {
    if !video.fine {
        let codec: Result<(), Unreachable> = Err(Unreachable(std::io::Error::other("bad codec")));
        codec.map_err(ruststream::permanent)?;
    }
    Err(HandlerOutcome::retry_in(std::time::Duration::from_secs(9)).with_error("busy"))?
}

#[test]
fn a_handler_returning_a_result_acks_retries_and_fails_as_its_result_says() {
    let fine = Video { fine: true };
    let broken = Video { fine: false };
    assert_eq!(run(&transcode_result, &fine, inbox_context(None)), Ok(()));
    let retried =
        run(&transcode_result, &broken, inbox_context(None)).expect_err("an error retries");
    assert_eq!(retried.outcome(), ruststream::core::Outcome::Retry);
    assert_eq!(
        retried.error(),
        Some("the transcoder is unreachable: connection refused"),
        "the error and its sources, as the row's error"
    );
    let failed =
        run(&transcode_strict, &broken, inbox_context(None)).expect_err("a permanent error fails");
    assert_eq!(failed.outcome(), ruststream::core::Outcome::Reject);
    assert_eq!(
        failed.error(),
        Some("the transcoder is unreachable: bad codec")
    );
    let busy =
        run(&transcode_strict, &fine, inbox_context(None)).expect_err("the outcome it returned");
    assert_eq!(busy.delay(), Some(std::time::Duration::from_secs(9)));
    assert_eq!(busy.error(), Some("busy"));
}

//! The spec's eight sqlx examples (forms.md, advisory.md, lock.md, shutdown.md, each by macros
//! and by hand), as the pages write them, with only what the pages leave out added below each
//! (the message types, `SCHEMA`, `encode`, the export handler). Each runs against a database of
//! its own: the row lock examples on PostgreSQL, the others on SQLite files.

use std::time::Duration;

use crate::common::*;

/// Runs `service` until `count` answers zero: every row the schema inserted is settled.
async fn drain<F, Fut>(service: ruststream::RustStream, count: F)
where
    F: Fn() -> Fut + Send + Sync,
    Fut: Future<Output = i64> + Send,
{
    service
        .shutdown_timeout(Duration::from_secs(10))
        .run_until(async {
            eventually("every row is settled", || async { count().await == 0 }).await;
        })
        .await
        .expect("the service runs");
}

// ----- forms.md: the row lock form on PostgreSQL -----

mod forms_row_lock {
    use ruststream_sqlx::prelude::*;
    use sqlx::Connection;
    use sqlx::postgres::PgPoolOptions;

    /// One row of `invoice_jobs`. No `locked_until` and no `advisory_lock`: the row lock form.
    #[derive(Inbox, sqlx::FromRow)]
    #[inbox(table = "invoice_jobs")]
    struct IssueInvoice {
        #[field(id, generated)]
        id: i64,
        #[field(payload)]
        payload: Vec<u8>,
    }

    /// The claim's transaction holds the row while the handler runs; the acknowledgement deletes
    /// the row and commits. A crash rolls the transaction back, and the row returns at once.
    #[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
    async fn issue(invoice: &Invoice) -> HandlerOutcome {
        tracing::info!(invoice.number, "issuing an invoice");
        HandlerOutcome::ack()
    }

    /// The service on the database `options` reach.
    pub fn service(options: PgConnectOptions) -> RustStream {
        let schema = options.clone();
        // Nothing connects here: the broker builds its pool when the service starts.
        let broker = SqlxBroker::from_connect_options(options, PgPoolOptions::new());
        RustStream::new(AppInfo::new("billing", "0.1.0"))
            // The table, created before the subscription checks it.
            .on_startup(async move |()| {
                let mut conn = PgConnection::connect_with(&schema).await?;
                sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
                conn.close().await
            })
            .with_broker(broker.route::<IssueInvoice>("invoices"), |b| {
                // Each of the four workers holds a connection while its invoice is in work.
                b.include(issue.workers(nonzero!(4)));
            })
    }

    // What the page leaves out.

    #[derive(serde::Deserialize)]
    struct Invoice {
        number: u64,
    }

    pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS invoice_jobs (
        id BIGSERIAL PRIMARY KEY,
        payload BYTEA NOT NULL
    );
    INSERT INTO invoice_jobs (payload)
    SELECT convert_to('{\"number\": ' || n || '}', 'UTF8') FROM generate_series(1, 8) AS n;";
}

mod manual_forms_row_lock {
    use ruststream_sqlx::prelude::*;
    use sqlx::Connection;
    use sqlx::postgres::PgPoolOptions;

    /// One row of `invoice_jobs`. No `.lease(..)` and no `.advisory(..)`: the row lock form.
    #[derive(sqlx::FromRow)]
    struct IssueInvoice {
        id: i64,
        payload: Vec<u8>,
    }

    impl InboxTable for IssueInvoice {
        type Id = i64;
        type Table = InboxSpec<(Payload,)>;
        const TABLE: Self::Table = InboxSpec::new("invoice_jobs", Column::new("id").generated())
            .payload(Column::new("payload"));

        fn id(&self) -> &i64 {
            &self.id
        }
    }

    impl PayloadRow for IssueInvoice {
        type Column = Vec<u8>;

        fn payload(&self) -> &[u8] {
            &self.payload
        }
    }

    /// The claim's transaction holds the row while the handler runs; the acknowledgement deletes
    /// the row and commits. A crash rolls the transaction back, and the row returns at once.
    struct Issue;

    impl Handle<Invoice> for Issue {
        fn handle(
            &self,
            invoice: &Invoice,
            _outs: &(),
            _ctx: &mut Context<'_>,
        ) -> impl Future<Output = Result<(), HandlerOutcome>> {
            tracing::info!(invoice.number, "issuing an invoice");
            ready(Ok(()))
        }
    }

    /// The service on the database `options` reach.
    pub fn service(options: PgConnectOptions) -> RustStream {
        let schema = options.clone();
        // Nothing connects here: the broker builds its pool when the service starts.
        let broker = SqlxBroker::from_connect_options(options, PgPoolOptions::new());
        RustStream::new(AppInfo::new("billing", "0.1.0"))
            // The table, created before the subscription checks it.
            .on_startup(async move |()| {
                let mut conn = PgConnection::connect_with(&schema).await?;
                sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
                conn.close().await
            })
            .with_broker(broker.route::<IssueInvoice>("invoices"), |b| {
                // Each of the four workers holds a connection while its invoice is in work.
                let issue = subscriber("invoices", Issue)
                    .map_source(|_| InboxQueue::<IssueInvoice>::new("invoices"))
                    .workers(nonzero!(4));
                b.include(issue.build());
            })
    }

    // What the page leaves out.

    #[derive(serde::Deserialize)]
    struct Invoice {
        number: u64,
    }

    const SCHEMA: &str = super::forms_row_lock::SCHEMA;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_row_lock_by_macros() {
    let db = Pg::new("ex_rl").await;
    drain(forms_row_lock::service(db.options.clone()), || {
        db.scalar("SELECT COUNT(*) FROM invoice_jobs")
    })
    .await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_row_lock_by_hand() {
    let db = Pg::new("ex_rl_manual").await;
    drain(manual_forms_row_lock::service(db.options.clone()), || {
        db.scalar("SELECT COUNT(*) FROM invoice_jobs")
    })
    .await;
    db.drop().await;
}

// ----- advisory.md: the advisory lock form on SQLite -----

mod forms_advisory {
    use ruststream_sqlx::prelude::*;
    use sqlx::Connection;
    use sqlx::sqlite::SqlitePoolOptions;

    /// One row of `video_jobs`, held by a lock on its channel's key while it is in work.
    #[derive(Inbox, sqlx::FromRow)]
    #[inbox(table = "video_jobs", advisory_lock = "video_jobs-{channel}")]
    struct Transcode {
        #[field(id, generated)]
        id: i64,
        channel: String,
        #[field(attempt, generated)]
        attempt: i16,
        #[field(payload)]
        payload: Vec<u8>,
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

    /// The service on the database `url` names.
    pub fn service(url: &str) -> RustStream {
        let schema_url = url.to_owned();
        // Nothing connects here: the broker builds its pool when the service starts.
        let broker = SqlxBroker::from_url(url, SqlitePoolOptions::new());
        RustStream::new(AppInfo::new("transcoder", "0.1.0"))
            // The table, created before the subscription checks it.
            .on_startup(async move |()| {
                let mut conn = SqliteConnection::connect(&schema_url).await?;
                sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
                conn.close().await
            })
            .with_broker(broker.route::<Transcode>("videos"), |b| {
                b.include(transcode);
            })
    }

    // What the page leaves out.

    #[derive(serde::Deserialize)]
    struct Video {
        name: String,
    }

    /// How many encodes ran.
    pub static ENCODES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    /// Fails each video's first attempt, so every video is retried once.
    async fn encode(video: &Video, attempt: i64) -> bool {
        tracing::info!(video.name, attempt, "encoding");
        ENCODES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        attempt >= 2
    }

    pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS video_jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        channel TEXT NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 0,
        payload BLOB NOT NULL
    );
    INSERT INTO video_jobs (channel, payload) VALUES
        ('news', CAST('{\"name\": \"a\"}' AS BLOB)),
        ('news', CAST('{\"name\": \"b\"}' AS BLOB)),
        ('sport', CAST('{\"name\": \"c\"}' AS BLOB));";
}

mod manual_forms_advisory {
    use ruststream_sqlx::prelude::*;
    use sqlx::Connection;
    use sqlx::sqlite::SqlitePoolOptions;

    /// One row of `video_jobs`, held by a lock on its channel's key while it is in work.
    #[derive(sqlx::FromRow)]
    struct Transcode {
        id: i64,
        attempt: i16,
        payload: Vec<u8>,
    }

    impl InboxTable for Transcode {
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

    impl AttemptRow for Transcode {
        type Attempt = i16;

        fn attempt(&self) -> &i16 {
            &self.attempt
        }
    }

    impl PayloadRow for Transcode {
        type Column = Vec<u8>;

        fn payload(&self) -> &[u8] {
            &self.payload
        }
    }

    /// A video takes minutes to encode. The delivery's connection keeps the channel's key while the
    /// handler runs, with no transaction open; a retry runs no statement and releases the key.
    struct TranscodeVideo;

    impl Handle<Video, (), (), InboxContext> for TranscodeVideo {
        async fn handle(
            &self,
            video: &Video,
            _outs: &(),
            ctx: &mut Context<'_, InboxContext>,
        ) -> Result<(), HandlerOutcome> {
            let Ctx(attempt) = Ctx::<keys::Attempt>::from_context(ctx).await?;
            if encode(video, attempt).await {
                return Ok(());
            }
            Err(HandlerOutcome::retry())
        }
    }

    /// The service on the database `url` names.
    pub fn service(url: &str) -> RustStream {
        let schema_url = url.to_owned();
        // Nothing connects here: the broker builds its pool when the service starts.
        let broker = SqlxBroker::from_url(url, SqlitePoolOptions::new());
        RustStream::new(AppInfo::new("transcoder", "0.1.0"))
            // The table, created before the subscription checks it.
            .on_startup(async move |()| {
                let mut conn = SqliteConnection::connect(&schema_url).await?;
                sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
                conn.close().await
            })
            .with_broker(broker.route::<Transcode>("videos"), |b| {
                let transcode = subscriber("videos", TranscodeVideo)
                    .map_source(|_| InboxQueue::<Transcode>::new("videos"));
                b.include(transcode.build());
            })
    }

    // What the page leaves out.

    #[derive(serde::Deserialize)]
    struct Video {
        name: String,
    }

    /// How many encodes ran.
    pub static ENCODES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    /// Fails each video's first attempt, so every video is retried once.
    async fn encode(video: &Video, attempt: i64) -> bool {
        tracing::info!(video.name, attempt, "encoding");
        ENCODES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        attempt >= 2
    }

    const SCHEMA: &str = super::forms_advisory::SCHEMA;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_advisory_by_macros() {
    let db = Lite::new("ex_ad").await;
    drain(forms_advisory::service(&db.url()), || {
        db.scalar("SELECT COUNT(*) FROM video_jobs")
    })
    .await;
    assert_eq!(
        forms_advisory::ENCODES.load(std::sync::atomic::Ordering::SeqCst),
        6,
        "each of the three videos is encoded twice: its first attempt is retried"
    );
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_advisory_by_hand() {
    let db = Lite::new("ex_ad_manual").await;
    drain(manual_forms_advisory::service(&db.url()), || {
        db.scalar("SELECT COUNT(*) FROM video_jobs")
    })
    .await;
    assert_eq!(
        manual_forms_advisory::ENCODES.load(std::sync::atomic::Ordering::SeqCst),
        6,
        "each of the three videos is encoded twice: its first attempt is retried"
    );
    db.drop().await;
}

// ----- lock.md: the service's own lock on SQLite -----

mod forms_lock {
    use ruststream_sqlx::prelude::*;
    use ruststream_sqlx::{Lock, Unlock};
    use sqlx::Connection;
    use sqlx::sqlite::SqlitePoolOptions;
    use sqlx::{Sqlite, SqliteConnection};

    /// One row of `payouts`, held by the key of its account.
    #[derive(Inbox, sqlx::FromRow)]
    #[inbox(
        table = "payouts",
        advisory_lock = "accounts-{account_id}",
        custom(lock, unlock)
    )]
    struct Payout {
        #[field(id, generated)]
        id: i64,
        account_id: i64,
        #[field(payload)]
        payload: Vec<u8>,
    }

    /// Billing holds an account's key in `held_keys` while it changes the account, so a payout
    /// never runs beside a billing run of its account.
    impl Lock<Sqlite> for Payout {
        async fn lock(conn: &mut SqliteConnection, key: &str) -> Result<bool, sqlx::Error> {
            let taken = sqlx::query("INSERT OR IGNORE INTO held_keys (key) VALUES (?)")
                .bind(key)
                .execute(conn)
                .await?;
            Ok(taken.rows_affected() == 1)
        }
    }

    impl Unlock<Sqlite> for Payout {
        async fn unlock(conn: &mut SqliteConnection, key: &str) -> Result<bool, sqlx::Error> {
            let released = sqlx::query("DELETE FROM held_keys WHERE key = ?")
                .bind(key)
                .execute(conn)
                .await?;
            Ok(released.rows_affected() == 1)
        }
    }

    #[subscriber(InboxQueue::<Payout>::new("payouts"))]
    async fn pay(transfer: &Transfer) -> HandlerOutcome {
        tracing::info!(transfer.cents, "paying out");
        HandlerOutcome::ack()
    }

    /// The service on the database `url` names.
    pub fn service(url: &str) -> RustStream {
        let schema_url = url.to_owned();
        // Nothing connects here: the broker builds its pool when the service starts.
        let broker = SqlxBroker::from_url(url, SqlitePoolOptions::new());
        RustStream::new(AppInfo::new("payouts", "0.1.0"))
            // The table, created before the subscription checks it.
            .on_startup(async move |()| {
                let mut conn = SqliteConnection::connect(&schema_url).await?;
                sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
                conn.close().await
            })
            .with_broker(broker, |b| {
                b.include(pay);
            })
    }

    // What the page leaves out.

    #[derive(serde::Deserialize)]
    struct Transfer {
        cents: i64,
    }

    pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS held_keys (key TEXT PRIMARY KEY);
    CREATE TABLE IF NOT EXISTS payouts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        account_id INTEGER NOT NULL,
        payload BLOB NOT NULL
    );
    INSERT INTO payouts (account_id, payload) VALUES
        (1, CAST('{\"cents\": 100}' AS BLOB)),
        (1, CAST('{\"cents\": 200}' AS BLOB)),
        (2, CAST('{\"cents\": 300}' AS BLOB));";
}

mod manual_forms_lock {
    use ruststream_sqlx::prelude::*;
    use ruststream_sqlx::{Lock, Unlock};
    use sqlx::Connection;
    use sqlx::sqlite::SqlitePoolOptions;
    use sqlx::{Sqlite, SqliteConnection};

    /// One row of `payouts`, held by the key of its account.
    #[derive(sqlx::FromRow)]
    struct Payout {
        id: i64,
        payload: Vec<u8>,
    }

    impl InboxTable for Payout {
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

    impl PayloadRow for Payout {
        type Column = Vec<u8>;

        fn payload(&self) -> &[u8] {
            &self.payload
        }
    }

    /// Billing holds an account's key in `held_keys` while it changes the account, so a payout
    /// never runs beside a billing run of its account.
    impl Lock<Sqlite> for Payout {
        async fn lock(conn: &mut SqliteConnection, key: &str) -> Result<bool, sqlx::Error> {
            let taken = sqlx::query("INSERT OR IGNORE INTO held_keys (key) VALUES (?)")
                .bind(key)
                .execute(conn)
                .await?;
            Ok(taken.rows_affected() == 1)
        }
    }

    impl Unlock<Sqlite> for Payout {
        async fn unlock(conn: &mut SqliteConnection, key: &str) -> Result<bool, sqlx::Error> {
            let released = sqlx::query("DELETE FROM held_keys WHERE key = ?")
                .bind(key)
                .execute(conn)
                .await?;
            Ok(released.rows_affected() == 1)
        }
    }

    struct Pay;

    impl Handle<Transfer> for Pay {
        fn handle(
            &self,
            transfer: &Transfer,
            _outs: &(),
            _ctx: &mut Context<'_>,
        ) -> impl Future<Output = Result<(), HandlerOutcome>> {
            tracing::info!(transfer.cents, "paying out");
            ready(Ok(()))
        }
    }

    /// The service on the database `url` names.
    pub fn service(url: &str) -> RustStream {
        let schema_url = url.to_owned();
        // Nothing connects here: the broker builds its pool when the service starts.
        let broker = SqlxBroker::from_url(url, SqlitePoolOptions::new());
        RustStream::new(AppInfo::new("payouts", "0.1.0"))
            // The table, created before the subscription checks it.
            .on_startup(async move |()| {
                let mut conn = SqliteConnection::connect(&schema_url).await?;
                sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
                conn.close().await
            })
            .with_broker(broker, |b| {
                let pay =
                    subscriber("payouts", Pay).map_source(|_| InboxQueue::<Payout>::new("payouts"));
                b.include(pay.build());
            })
    }

    // What the page leaves out.

    #[derive(serde::Deserialize)]
    struct Transfer {
        cents: i64,
    }

    const SCHEMA: &str = super::forms_lock::SCHEMA;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_lock_by_macros() {
    let db = Lite::new("ex_lock").await;
    drain(forms_lock::service(&db.url()), || {
        db.scalar("SELECT COUNT(*) FROM payouts")
    })
    .await;
    assert_eq!(db.scalar("SELECT COUNT(*) FROM held_keys").await, 0);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_lock_by_hand() {
    let db = Lite::new("ex_lock_manual").await;
    drain(manual_forms_lock::service(&db.url()), || {
        db.scalar("SELECT COUNT(*) FROM payouts")
    })
    .await;
    assert_eq!(db.scalar("SELECT COUNT(*) FROM held_keys").await, 0);
    db.drop().await;
}

// ----- shutdown.md: the broker's shutdown on SQLite -----

#[allow(dead_code)]
mod broker_shutdown {
    use ruststream_sqlx::prelude::*;
    use sqlx::Connection;
    use sqlx::sqlite::SqlitePoolOptions;

    /// The service on the database `url` names.
    pub fn service(url: &str) -> RustStream {
        let schema_url = url.to_owned();
        // Nothing connects here: the broker builds its pool when the service starts, and closes it
        // when the service stops, after the handlers have drained.
        let broker = SqlxBroker::from_url(url, SqlitePoolOptions::new());
        RustStream::new(AppInfo::new("exports", "0.1.0"))
            // The table, created before the subscription checks it.
            .on_startup(async move |()| {
                let mut conn = SqliteConnection::connect(&schema_url).await?;
                sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
                conn.close().await
            })
            .with_broker(broker.route::<Export>("exports"), |b| {
                b.include(export);
            })
    }

    #[ruststream::app]
    fn app() -> impl App {
        service("sqlite:exports.db?mode=rwc")
    }

    // What the page leaves out.

    /// One row of `exports`, taken by lease.
    #[derive(Inbox, sqlx::FromRow)]
    #[inbox(table = "exports")]
    struct Export {
        #[field(id, generated)]
        id: i64,
        #[field(locked_until)]
        #[sqlx(skip)]
        locked_until: (),
        #[field(payload)]
        payload: Vec<u8>,
    }

    #[derive(serde::Deserialize)]
    struct ExportFile {
        name: String,
    }

    #[subscriber(InboxQueue::<Export>::new("exports"))]
    async fn export(file: &ExportFile) -> HandlerOutcome {
        tracing::info!(file.name, "exporting");
        HandlerOutcome::ack()
    }

    pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS exports (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        locked_until INTEGER,
        payload BLOB NOT NULL
    );
    INSERT INTO exports (payload) VALUES
        (CAST('{\"name\": \"q1\"}' AS BLOB)),
        (CAST('{\"name\": \"q2\"}' AS BLOB));";
}

#[allow(dead_code)]
mod manual_broker_shutdown {
    use ruststream_sqlx::prelude::*;
    use sqlx::Connection;
    use sqlx::sqlite::SqlitePoolOptions;

    /// The service on the database `url` names.
    pub fn service(url: &str) -> RustStream {
        let schema_url = url.to_owned();
        // Nothing connects here: the broker builds its pool when the service starts, and closes it
        // when the service stops, after the handlers have drained.
        let broker = SqlxBroker::from_url(url, SqlitePoolOptions::new());
        RustStream::new(AppInfo::new("exports", "0.1.0"))
            // The table, created before the subscription checks it.
            .on_startup(async move |()| {
                let mut conn = SqliteConnection::connect(&schema_url).await?;
                sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
                conn.close().await
            })
            .with_broker(broker.route::<Export>("exports"), |b| {
                let export = subscriber("exports", Exporter)
                    .map_source(|_| InboxQueue::<Export>::new("exports"));
                b.include(export.build());
            })
    }

    #[ruststream::app]
    fn app() -> impl App {
        service("sqlite:exports.db?mode=rwc")
    }

    // What the page leaves out.

    /// One row of `exports`, taken by lease.
    #[derive(sqlx::FromRow)]
    struct Export {
        id: i64,
        payload: Vec<u8>,
    }

    impl InboxTable for Export {
        type Id = i64;
        type Table = InboxSpec<(Payload, Lease)>;
        const TABLE: Self::Table = InboxSpec::new("exports", Column::new("id").generated())
            .payload(Column::new("payload"))
            .lease(Column::new("locked_until"));

        fn id(&self) -> &i64 {
            &self.id
        }
    }

    impl PayloadRow for Export {
        type Column = Vec<u8>;

        fn payload(&self) -> &[u8] {
            &self.payload
        }
    }

    #[derive(serde::Deserialize)]
    struct ExportFile {
        name: String,
    }

    struct Exporter;

    impl Handle<ExportFile> for Exporter {
        fn handle(
            &self,
            file: &ExportFile,
            _outs: &(),
            _ctx: &mut Context<'_>,
        ) -> impl Future<Output = Result<(), HandlerOutcome>> {
            tracing::info!(file.name, "exporting");
            ready(Ok(()))
        }
    }

    const SCHEMA: &str = super::broker_shutdown::SCHEMA;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_shutdown_by_macros() {
    let db = Lite::new("ex_shut").await;
    drain(broker_shutdown::service(&db.url()), || {
        db.scalar("SELECT COUNT(*) FROM exports")
    })
    .await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_shutdown_by_hand() {
    let db = Lite::new("ex_shut_manual").await;
    drain(manual_broker_shutdown::service(&db.url()), || {
        db.scalar("SELECT COUNT(*) FROM exports")
    })
    .await;
    db.drop().await;
}

//! What the service tests share: a schema per test on the real server (its tables named as the
//! descriptions name them, reached through the sessions' `search_path`), the row types, a
//! handler that records what it sees, and polling helpers.
//!
//! The server is `RUSTSTREAM_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`); a
//! test that cannot reach it fails with a message naming the URL.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream::BrokerScope;
use ruststream_tokio_postgres::deadpool_postgres::{self, Manager, Pool, PoolConfig, Runtime};
use ruststream_tokio_postgres::prelude::*;
use ruststream_tokio_postgres::tokio_postgres::{self, Client, NoTls};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
pub const WAIT: Duration = Duration::from_secs(30);
pub const POLL: Duration = Duration::from_millis(50);

/// The PostgreSQL server of this test binary where it is not the shared one ([`use_url`]).
static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Points this test binary at `url` (a throwaway server of its own); the first call decides.
#[allow(dead_code)]
pub fn use_url(url: String) {
    let _ = URL.set(url);
}

pub fn base_url() -> String {
    if let Some(url) = URL.get() {
        return url.clone();
    }
    std::env::var("RUSTSTREAM_PG_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// `url` with these parameters added to its query.
fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// A session on `url`, or a failure that names it.
pub async fn connect_to(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!("cannot reach PostgreSQL at {url} (set RUSTSTREAM_PG_URL): {e}")
        });
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A test's place on the server: the schema `rs_tp_<test>_<pid>` with every table, and the
/// application name the broker's sessions carry, to find them in `pg_stat_activity`.
pub struct Db {
    /// The schema, which is also the broker's application name.
    pub name: String,
    helper: Client,
}

impl Db {
    /// Creates the schema and its tables, dropping what a failed run left.
    pub async fn new(test: &str) -> Self {
        let name = format!("rs_tp_{test}_{}", std::process::id());
        let helper = connect_to(&with_params(
            &base_url(),
            &format!("application_name={name}_helper"),
        ))
        .await;
        helper
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}; SET search_path = {name}; {SCHEMA}"
            ))
            .await
            .unwrap_or_else(|e| panic!("create the schema {name}: {e}"));
        Self { name, helper }
    }

    /// The URL of the broker's sessions: the schema on their search path, the test's
    /// application name.
    pub fn url(&self) -> String {
        with_params(
            &base_url(),
            &format!(
                "application_name={}&options=-c%20search_path%3D{}",
                self.name, self.name
            ),
        )
    }

    /// A session of the test's own, on the schema, under another application name.
    pub async fn client(&self) -> Client {
        connect_to(&with_params(
            &base_url(),
            &format!(
                "application_name={}_other&options=-c%20search_path%3D{}",
                self.name, self.name
            ),
        ))
        .await
    }

    /// A pool of the service's own, of `size` connections, on the schema.
    pub fn pool(&self, size: usize) -> Pool {
        let config: tokio_postgres::Config = self.url().parse().expect("the test URL parses");
        let manager =
            Manager::from_config(config, NoTls, deadpool_postgres::ManagerConfig::default());
        Pool::builder(manager)
            .config(PoolConfig::new(size))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(10)))
            .build()
            .expect("the pool builds")
    }

    /// A broker that builds its own pool of `size` connections.
    pub fn broker(&self, size: usize, simple: bool) -> TokioPostgresBroker {
        TokioPostgresBroker::from_url(self.url(), PoolConfig::new(size)).simple_query(simple)
    }

    /// Runs SQL on the schema.
    pub async fn execute(&self, sql: &str) {
        self.helper
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The first column of the first row, as an integer.
    pub async fn count(&self, sql: &str) -> i64 {
        self.helper
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    }

    /// The broker's sessions: those under the test's application name.
    pub async fn sessions(&self) -> i64 {
        self.count(&format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = '{}'",
            self.name
        ))
        .await
    }

    /// The query of the broker's sessions in a transaction that waits for the client.
    pub fn in_transaction_sql(&self) -> String {
        format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = '{}' \
             AND state = 'idle in transaction'",
            self.name
        )
    }

    /// The query of the advisory locks the broker's sessions hold.
    pub fn advisory_sql(&self) -> String {
        format!(
            "SELECT COUNT(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = '{}'",
            self.name
        )
    }

    /// Advisory locks the broker's sessions hold.
    pub async fn advisory_locks(&self) -> i64 {
        self.count(&self.advisory_sql()).await
    }

    /// Waits until `sql` answers `want`, for at most [`WAIT`]; answers what it answered last.
    pub async fn wait_count(&self, sql: &str, want: i64) -> i64 {
        self.wait_count_within(sql, want, WAIT).await
    }

    /// Waits until no session of the broker is left on the server. A closed connection's
    /// backend exits a moment after its socket closes: a few milliseconds.
    pub async fn sessions_gone(&self) -> bool {
        let sql = format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = '{}'",
            self.name
        );
        self.wait_count_within(&sql, 0, Duration::from_secs(2))
            .await
            == 0
    }

    /// Waits until `sql` answers `want`, for at most `limit`; answers what it answered last.
    pub async fn wait_count_within(&self, sql: &str, want: i64, limit: Duration) -> i64 {
        let start = Instant::now();
        loop {
            let got = self.count(sql).await;
            if got == want || start.elapsed() > limit {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Drops the schema.
    pub async fn finish(self) {
        self.execute(&format!(
            "SET search_path = public; DROP SCHEMA {} CASCADE",
            self.name
        ))
        .await;
    }
}

/// Every table of the tests: one per form.
pub const SCHEMA: &str = "
CREATE TABLE invoices (
    id BIGSERIAL PRIMARY KEY,
    attempt INT NOT NULL DEFAULT 0,
    payload BYTEA NOT NULL
);
CREATE TABLE exports (
    id BIGSERIAL PRIMARY KEY,
    attempt SMALLINT NOT NULL DEFAULT 0,
    payload BYTEA NOT NULL,
    locked_until TIMESTAMPTZ,
    processed_at TIMESTAMPTZ
);
CREATE TABLE videos (
    id BIGSERIAL PRIMARY KEY,
    channel TEXT NOT NULL,
    attempt INT NOT NULL DEFAULT 0,
    payload BYTEA NOT NULL
);
CREATE TABLE payouts (
    id BIGSERIAL PRIMARY KEY,
    account TEXT NOT NULL,
    attempt BIGINT NOT NULL DEFAULT 0,
    payload BYTEA NOT NULL
);
CREATE TABLE held_keys (key TEXT PRIMARY KEY);
";

macro_rules! row {
    ($ty:ident, $spec:ty, $table:expr) => {
        #[derive(Debug, Deserialize)]
        pub struct $ty {
            pub id: i64,
            pub attempt: i64,
            pub payload: Vec<u8>,
        }

        impl InboxTable for $ty {
            type Id = i64;
            type Table = $spec;
            const TABLE: Self::Table = $table;

            fn id(&self) -> &i64 {
                &self.id
            }
        }

        impl PayloadRow for $ty {
            type Column = Vec<u8>;

            fn payload(&self) -> &[u8] {
                &self.payload
            }
        }

        impl AttemptRow for $ty {
            type Attempt = i64;

            fn attempt(&self) -> &i64 {
                &self.attempt
            }
        }
    };
}

row!(
    Invoice,
    InboxSpec<(Attempt, Payload)>,
    InboxSpec::new("invoices", Column::new("id").generated())
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
);

row!(
    Export,
    InboxSpec<(Lease, Attempt, Payload, Processed)>,
    InboxSpec::new("exports", Column::new("id").generated())
        .lease(Column::new("locked_until"))
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .processed_at(Column::new("processed_at"))
);

row!(
    Video,
    InboxSpec<(Advisory, Attempt, Payload)>,
    InboxSpec::new("videos", Column::new("id").generated())
        .advisory(&[
            KeyPart::Literal("rs-tp-videos-"),
            KeyPart::Column("channel")
        ])
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
);

row!(
    Payout,
    InboxSpec<(Advisory, Attempt, Payload, own::Lock, own::Unlock)>,
    InboxSpec::new("payouts", Column::new("id").generated())
        .advisory(&[
            KeyPart::Literal("rs-tp-accounts-"),
            KeyPart::Column("account")
        ])
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .own::<own::Lock>()
        .own::<own::Unlock>()
);

/// The custom lock of `payouts`: a row of `held_keys` per key in work (a custom lock).
impl Lock for Payout {
    async fn lock(client: &Client, key: &str) -> Result<bool, tokio_postgres::Error> {
        let taken = client
            .execute(
                "INSERT INTO held_keys (key) VALUES ($1) ON CONFLICT DO NOTHING",
                &[&key],
            )
            .await?;
        Ok(taken == 1)
    }
}

impl Unlock for Payout {
    async fn unlock(client: &Client, key: &str) -> Result<bool, tokio_postgres::Error> {
        let released = client
            .execute("DELETE FROM held_keys WHERE key = $1", &[&key])
            .await?;
        Ok(released == 1)
    }
}

/// The message of every table.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Job {
    pub n: u32,
}

/// A key column's value unique to this process: keys are the database's, not the schema's.
pub fn key(part: impl std::fmt::Display) -> String {
    format!("{}-{part}", std::process::id())
}

/// The message `n`, with its key column where the table has one.
pub fn message(form: Form, n: u32) -> Message {
    let message = Message::json(&Job { n }).unwrap();
    match form {
        Form::Advisory => message.column("channel", key(n % 3)),
        Form::Custom => message.column("account", key(n % 3)),
        Form::RowLock | Form::Lease => message,
    }
}

/// The forms, one table each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    RowLock,
    Lease,
    Advisory,
    Custom,
}

impl Form {
    pub fn table(self) -> &'static str {
        match self {
            Form::RowLock => "invoices",
            Form::Lease => "exports",
            Form::Advisory => "videos",
            Form::Custom => "payouts",
        }
    }
}

/// What a handler saw: each message with the attempt of its delivery.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<Vec<(u32, i64)>>>);

impl Seen {
    /// Records a delivery; answers whether it is the first of its message.
    pub fn push(&self, n: u32, attempt: i64) -> bool {
        let mut seen = self.0.lock().unwrap();
        let first = !seen.iter().any(|(m, _)| *m == n);
        seen.push((n, attempt));
        first
    }

    pub fn all(&self) -> Vec<(u32, i64)> {
        let mut all = self.0.lock().unwrap().clone();
        all.sort_unstable();
        all
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// Records each delivery; retries the first delivery of every third message when asked to;
/// waits for a permit of its gate, when it has one, before it answers.
#[derive(Clone)]
pub struct Record {
    pub seen: Seen,
    pub retry_first: bool,
    pub gate: Option<Arc<Semaphore>>,
}

impl Record {
    pub fn new(seen: &Seen) -> Self {
        Self {
            seen: seen.clone(),
            retry_first: false,
            gate: None,
        }
    }

    pub fn retrying(seen: &Seen) -> Self {
        Self {
            retry_first: true,
            ..Self::new(seen)
        }
    }

    pub fn gated(seen: &Seen, gate: &Arc<Semaphore>) -> Self {
        Self {
            gate: Some(gate.clone()),
            ..Self::new(seen)
        }
    }
}

impl Handle<Job, (), (), InboxContext> for Record {
    async fn handle(
        &self,
        job: &Job,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let Ctx(attempt) = Ctx::<keys::Attempt>::from_context(ctx).await?;
        let first = self.seen.push(job.n, attempt);
        if let Some(gate) = &self.gate {
            gate.acquire().await.expect("the gate stays open").forget();
        }
        if self.retry_first && first && job.n.is_multiple_of(3) {
            return Err(HandlerOutcome::retry());
        }
        Ok(())
    }
}

/// Includes a subscription of `form`'s table with `workers` workers.
pub fn include(
    b: &mut BrokerScope<TokioPostgresBroker>,
    form: Form,
    handler: Record,
    workers: usize,
) {
    let workers = std::num::NonZeroUsize::new(workers).expect("at least one worker");
    macro_rules! sub {
        ($ty:ty) => {
            b.include(
                subscriber(form.table(), handler)
                    .map_source(|_| InboxQueue::<$ty>::new(form.table()))
                    .workers(workers)
                    .poll_interval(POLL)
                    .lease(Duration::from_secs(3))
                    .build(),
            )
        };
    }
    match form {
        Form::RowLock => sub!(Invoice),
        Form::Lease => sub!(Export),
        Form::Advisory => sub!(Video),
        Form::Custom => sub!(Payout),
    };
}

/// The subscription of `form`'s table, for a broker started by hand.
pub fn subscription(
    form: Form,
    handler: Record,
    workers: usize,
) -> ruststream::Subscription<TokioPostgresBroker> {
    let workers = std::num::NonZeroUsize::new(workers).expect("at least one worker");
    macro_rules! sub {
        ($ty:ty) => {
            ruststream::IntoSubscription::<TokioPostgresBroker>::into_subscription(
                subscriber(form.table(), handler)
                    .map_source(|_| InboxQueue::<$ty>::new(form.table()))
                    .workers(workers)
                    .poll_interval(POLL)
                    .lease(Duration::from_secs(3))
                    .build(),
            )
        };
    }
    match form {
        Form::RowLock => sub!(Invoice),
        Form::Lease => sub!(Export),
        Form::Advisory => sub!(Video),
        Form::Custom => sub!(Payout),
    }
}

/// Publishes through the right publisher of `form`'s table.
pub async fn publish(
    handle: &BrokerHandle<TokioPostgresBroker>,
    form: Form,
    message: Message,
) -> Result<(), TokioPostgresBrokerError> {
    let published = match form {
        Form::RowLock => {
            TokioPostgresPublisher::<Invoice>::new(handle)
                .publish(message)
                .await
        }
        Form::Lease => {
            TokioPostgresPublisher::<Export>::new(handle)
                .publish(message)
                .await
        }
        Form::Advisory => {
            TokioPostgresPublisher::<Video>::new(handle)
                .publish(message)
                .await
        }
        Form::Custom => {
            TokioPostgresPublisher::<Payout>::new(handle)
                .publish(message)
                .await
        }
    };
    published.map(drop)
}

/// Waits until `done` holds, for at most `limit`; answers whether it held.
pub async fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if done() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

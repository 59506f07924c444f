//! What the tests share: a database of its own per test on the server at
//! `RUSTSTREAM_MYSQL_URL`, the queue tables and their row types, handlers that record or block,
//! and waiting.
//!
//! The row types name fixed tables (`jobs`, `exports`, `video_jobs`, `payouts`): a description's
//! table is a constant. Each test makes its tables unique by creating them in a database of its
//! own, `rs_ma_<test>_<pid>`, dropped when the test passes; the broker connects to that
//! database. Its advisory lock names (`<database>.<key>`) are the test's own too.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mysql_async::prelude::{FromRow, Queryable};
use mysql_async::{Conn, Opts, OptsBuilder};
use ruststream_mysql_async::prelude::*;
use ruststream_mysql_async::{Lock, Unlock};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

pub const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/test";
pub const WAIT: Duration = Duration::from_secs(30);
pub const POLL: Duration = Duration::from_millis(20);

/// The test server's URL.
pub fn base_url() -> String {
    std::env::var("RUSTSTREAM_MYSQL_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// `url` with its database replaced by `db`.
pub fn url_with_db(url: &str, db: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).map_or(url.len(), |i| scheme_end + i);
    let query = url[authority_end..]
        .find('?')
        .map_or("", |i| &url[authority_end + i..]);
    format!("{}/{db}{query}", &url[..authority_end])
}

/// A session on the server at `url`; a server that does not answer fails the test with a
/// message naming the URL.
pub async fn connect_to(url: &str) -> Conn {
    let opts = Opts::from_url(url)
        .unwrap_or_else(|e| panic!("RUSTSTREAM_MYSQL_URL `{url}` does not parse: {e}"));
    Conn::new(opts).await.unwrap_or_else(|e| {
        panic!("cannot reach MySQL/MariaDB at {url} (set RUSTSTREAM_MYSQL_URL): {e}")
    })
}

/// A session on the test server, in its default database.
pub async fn connect() -> Conn {
    connect_to(&base_url()).await
}

/// A database of the test's own.
pub struct TestDb {
    /// Its name, `rs_ma_<test>_<pid>`.
    pub name: String,
    /// The server's URL with this database.
    pub url: String,
}

impl TestDb {
    /// Creates the database (dropping a leftover of an earlier run) and the tables of
    /// `schema`.
    pub async fn new(test: &str, schema: &[&str]) -> Self {
        let name = format!("rs_ma_{test}_{}", std::process::id());
        let mut conn = connect().await;
        conn.query_drop(format!("DROP DATABASE IF EXISTS `{name}`"))
            .await
            .unwrap();
        conn.query_drop(format!("CREATE DATABASE `{name}`"))
            .await
            .expect("create the test's database");
        conn.disconnect().await.unwrap();
        let db = Self {
            url: url_with_db(&base_url(), &name),
            name,
        };
        let mut conn = db.conn().await;
        for table in schema {
            conn.query_drop(*table)
                .await
                .unwrap_or_else(|e| panic!("{table}: {e}"));
        }
        conn.disconnect().await.unwrap();
        db
    }

    /// The broker's options: the test's database.
    pub fn opts(&self) -> Opts {
        Opts::from_url(&self.url).unwrap()
    }

    /// Options without `client_found_rows`, as a service's own pool may have them.
    pub fn plain_opts(&self) -> OptsBuilder {
        OptsBuilder::from_opts(self.opts()).client_found_rows(false)
    }

    /// A session of the test's own in this database.
    pub async fn conn(&self) -> Conn {
        connect_to(&self.url).await
    }

    pub async fn exec(&self, sql: &str) {
        let mut conn = self.conn().await;
        conn.query_drop(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        conn.disconnect().await.unwrap();
    }

    /// The first column of the first row, as an integer (`NULL` is `None`).
    pub async fn value(&self, sql: &str) -> Option<i64> {
        let mut conn = self.conn().await;
        let value: Option<Option<i64>> = conn
            .query_first(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        conn.disconnect().await.unwrap();
        value.flatten()
    }

    pub async fn count(&self, sql: &str) -> i64 {
        self.value(sql)
            .await
            .unwrap_or_else(|| panic!("{sql}: NULL"))
    }

    /// Whether `sql` counts `n`.
    pub async fn count_is(&self, sql: &'static str, n: i64) -> bool {
        self.count(sql).await == n
    }

    /// Whether `n` sessions are in this database.
    pub async fn sessions_are(&self, n: i64) -> bool {
        self.sessions().await == n
    }

    /// Whether no session holds `key`'s lock.
    pub async fn key_free(&self, key: &'static str) -> bool {
        self.holder(key).await.is_none()
    }

    /// The sessions in this database, other than the asking one.
    pub async fn sessions(&self) -> i64 {
        let mut conn = connect().await;
        let n: Option<i64> = conn
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID()",
                (self.name.as_str(),),
            )
            .await
            .unwrap();
        conn.disconnect().await.unwrap();
        n.unwrap_or(0)
    }

    /// The lock name of `key` in this database, as the core names it.
    pub fn lock_name(&self, key: &str) -> String {
        ruststream::core::keys::mysql_lock_name(&self.name, key)
    }

    /// The session that holds `key`'s lock, if one does.
    pub async fn holder(&self, key: &str) -> Option<i64> {
        let mut conn = connect().await;
        let holder: Option<Option<i64>> = conn
            .exec_first("SELECT IS_USED_LOCK(?)", (self.lock_name(key),))
            .await
            .unwrap();
        conn.disconnect().await.unwrap();
        holder.flatten()
    }

    /// Drops the database: at the end of a test that passed (a failed one leaves it to look
    /// at; the next run drops it first).
    pub async fn cleanup(self) {
        let mut conn = connect().await;
        conn.query_drop(format!("DROP DATABASE IF EXISTS `{}`", self.name))
            .await
            .unwrap();
        conn.disconnect().await.unwrap();
    }
}

/// The row lock form's table. Its claim order is the id's, which the primary key serves.
pub const JOBS: &str = "CREATE TABLE jobs (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    attempt INT NOT NULL DEFAULT 0,
    payload LONGBLOB NOT NULL
) ENGINE=InnoDB";

/// The lease form's table.
pub const EXPORTS: &str = "CREATE TABLE exports (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    attempt INT NOT NULL DEFAULT 0,
    payload LONGBLOB NOT NULL,
    locked_until DATETIME(6) NULL,
    processed_at DATETIME(6) NULL
) ENGINE=InnoDB";

/// The advisory lock form's table.
pub const VIDEO_JOBS: &str = "CREATE TABLE video_jobs (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    channel VARCHAR(100) NOT NULL,
    attempt INT NOT NULL DEFAULT 0,
    payload LONGBLOB NOT NULL
) ENGINE=InnoDB";

/// The custom lock's table, and the keys billing holds.
pub const PAYOUTS: &str = "CREATE TABLE payouts (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    account_id BIGINT NOT NULL,
    payload LONGBLOB NOT NULL
) ENGINE=InnoDB";
pub const HELD_KEYS: &str = "CREATE TABLE held_keys (k VARCHAR(200) PRIMARY KEY) ENGINE=InnoDB";

/// One row of `jobs`: the row lock form, by the macro.
#[derive(Debug, Inbox, FromRow)]
#[inbox(table = "jobs")]
pub struct Job {
    #[field(id, generated)]
    pub id: i64,
    #[field(attempt, generated)]
    pub attempt: i32,
    #[field(payload)]
    pub payload: Vec<u8>,
}

/// One row of `exports`: the lease form, marked processed when settled; described by hand.
#[derive(Debug, FromRow)]
pub struct Export {
    pub id: i64,
    pub attempt: i32,
    pub payload: Vec<u8>,
}

impl InboxTable for Export {
    type Id = i64;
    type Table = InboxSpec<(Attempt, Payload, Lease, Processed)>;
    const TABLE: Self::Table = InboxSpec::new("exports", Column::new("id").generated())
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .lease(Column::new("locked_until"))
        .processed_at(Column::new("processed_at"));

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

impl AttemptRow for Export {
    type Attempt = i32;

    fn attempt(&self) -> &i32 {
        &self.attempt
    }
}

/// One row of `video_jobs`: the advisory lock form, keyed by channel.
#[derive(Debug, Inbox, FromRow)]
#[inbox(table = "video_jobs", advisory_lock = "video_jobs-{channel}")]
pub struct VideoJob {
    #[field(id, generated)]
    pub id: i64,
    pub channel: String,
    #[field(attempt, generated)]
    pub attempt: i32,
    #[field(payload)]
    pub payload: Vec<u8>,
}

/// One row of `payouts`, held by its account's key in `held_keys` (a custom lock).
#[derive(Debug, Inbox, FromRow)]
#[inbox(
    table = "payouts",
    advisory_lock = "accounts-{account_id}",
    custom(lock, unlock)
)]
pub struct Payout {
    #[field(id, generated)]
    pub id: i64,
    pub account_id: i64,
    #[field(payload)]
    pub payload: Vec<u8>,
}

/// Billing holds an account's key in `held_keys` while it changes the account.
impl Lock for Payout {
    async fn lock(conn: &mut Conn, key: &str) -> Result<bool, mysql_async::Error> {
        conn.exec_drop("INSERT IGNORE INTO held_keys (k) VALUES (?)", (key,))
            .await?;
        Ok(conn.affected_rows() == 1)
    }
}

impl Unlock for Payout {
    async fn unlock(conn: &mut Conn, key: &str) -> Result<bool, mysql_async::Error> {
        conn.exec_drop("DELETE FROM held_keys WHERE k = ?", (key,))
            .await?;
        Ok(conn.affected_rows() == 1)
    }
}

/// The message of every table.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Video {
    pub n: u32,
}

pub fn video(n: u32) -> Message {
    Message::json(&Video { n }).unwrap()
}

/// What a handler saw: each message with the attempt of its delivery.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<Vec<(u32, i64)>>>);

impl Seen {
    pub fn push(&self, n: u32, attempt: i64) {
        self.0.lock().unwrap().push((n, attempt));
    }

    pub fn all(&self) -> Vec<(u32, i64)> {
        let mut all = self.0.lock().unwrap().clone();
        all.sort_unstable();
        all
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The messages seen, each once, in order.
    pub fn messages(&self) -> Vec<u32> {
        let mut ns: Vec<u32> = self.all().into_iter().map(|(n, _)| n).collect();
        ns.dedup();
        ns
    }
}

/// Records each delivery; retries the first attempt when asked to.
#[derive(Clone)]
pub struct Record {
    pub seen: Seen,
    pub retry_first: bool,
}

impl Record {
    pub fn new(seen: &Seen) -> Self {
        Self {
            seen: seen.clone(),
            retry_first: false,
        }
    }

    pub fn retrying(seen: &Seen) -> Self {
        Self {
            seen: seen.clone(),
            retry_first: true,
        }
    }
}

impl Handle<Video, (), (), InboxContext> for Record {
    async fn handle(
        &self,
        video: &Video,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let Ctx(attempt) = Ctx::<keys::Attempt>::from_context(ctx).await?;
        self.seen.push(video.n, attempt);
        if self.retry_first && attempt == 1 {
            return Err(HandlerOutcome::retry());
        }
        Ok(())
    }
}

/// Records each delivery, then waits until the gate opens before it acknowledges.
#[derive(Clone)]
pub struct Block {
    pub seen: Seen,
    pub started: Arc<AtomicUsize>,
    pub gate: Arc<Semaphore>,
}

impl Block {
    pub fn new() -> Self {
        Self {
            seen: Seen::default(),
            started: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    pub fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// Lets every handler waiting, and every later one, go on.
    pub fn open(&self) {
        self.gate.add_permits(Semaphore::MAX_PERMITS / 2);
    }
}

impl Handle<Video, (), (), InboxContext> for Block {
    async fn handle(
        &self,
        video: &Video,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let Ctx(attempt) = Ctx::<keys::Attempt>::from_context(ctx).await?;
        self.seen.push(video.n, attempt);
        self.started.fetch_add(1, Ordering::SeqCst);
        let _permit = self.gate.acquire().await.expect("the gate is never closed");
        Ok(())
    }
}

/// Waits until `done` holds, checking every few milliseconds, for at most `limit`. Answers
/// whether it held.
pub async fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    eventually_async(limit, || std::future::ready(done())).await
}

/// [`eventually`] with a check that asks the server.
pub async fn eventually_async<F: std::future::Future<Output = bool>>(
    limit: Duration,
    mut done: impl FnMut() -> F,
) -> bool {
    let start = Instant::now();
    loop {
        if done().await {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A service on `broker` with a short shutdown timeout.
pub fn service(
    broker: impl IntoBroker<Adapter = MySqlAsyncBroker>,
    include: impl FnOnce(&mut ruststream::BrokerScope<MySqlAsyncBroker>),
) -> RustStream {
    RustStream::new(AppInfo::new("mysql-async-tests", "0.1.0"))
        .shutdown_timeout(Duration::from_secs(10))
        .with_broker(broker, include)
}

//! What the service tests share: a database file per test, the tables, their row types and a
//! handler that records what it sees.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use ruststream::exec::Executor;
use ruststream_rusqlite::prelude::*;
use ruststream_rusqlite::rusqlite;
use serde::{Deserialize, Serialize};

/// A SQLite file under the target directory, unique to this test and process, removed (with
/// its WAL files) when dropped.
pub struct Db {
    pub path: PathBuf,
}

impl Db {
    pub fn new(test: &str) -> Self {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("rusqlite_{test}_{}.db", std::process::id()));
        let db = Self { path };
        db.remove();
        db
    }

    fn remove(&self) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut file = self.path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }

    pub fn conn(&self) -> Connection {
        let conn = Connection::open(&self.path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.path.display()));
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        conn
    }

    /// Creates every table the tests use.
    pub fn schema(&self) {
        self.conn()
            .execute_batch(SCHEMA)
            .expect("create the tables");
    }

    pub fn count(&self, sql: &str) -> i64 {
        self.conn()
            .query_row(sql, [], |row| row.get(0))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub fn execute(&self, sql: &str) {
        self.conn()
            .execute_batch(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        self.remove();
    }
}

pub const SCHEMA: &str = "
CREATE TABLE video_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel INTEGER,
    attempt INTEGER NOT NULL DEFAULT 0,
    payload BLOB
);
CREATE TABLE exports (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    payload BLOB,
    attempt INTEGER NOT NULL DEFAULT 0,
    locked_until INTEGER,
    processed_at INTEGER
);
CREATE TABLE payouts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id INTEGER NOT NULL,
    payload BLOB
);
CREATE TABLE held_keys (key TEXT PRIMARY KEY);
";

/// One row of `video_jobs`: the advisory lock form, keyed by channel.
#[derive(Debug, Deserialize)]
pub struct VideoJob {
    pub id: i64,
    pub attempt: i16,
    pub payload: Vec<u8>,
}

impl InboxTable for VideoJob {
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

impl PayloadRow for VideoJob {
    type Column = Vec<u8>;

    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

impl AttemptRow for VideoJob {
    type Attempt = i16;

    fn attempt(&self) -> &i16 {
        &self.attempt
    }
}

/// One row of `exports`: the lease form, marked processed when settled.
#[derive(Debug, Deserialize)]
pub struct ExportJob {
    pub id: i64,
    pub attempt: i32,
    pub payload: Vec<u8>,
    pub locked_until: Option<i64>,
    pub processed_at: Option<i64>,
}

impl InboxTable for ExportJob {
    type Id = i64;
    type Table = InboxSpec<(Lease, Attempt, Payload, Processed)>;
    const TABLE: Self::Table = InboxSpec::new("exports", Column::new("id").generated())
        .lease(Column::new("locked_until"))
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .processed_at(Column::new("processed_at"));

    fn id(&self) -> &i64 {
        &self.id
    }
}

impl PayloadRow for ExportJob {
    type Column = Vec<u8>;

    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

impl AttemptRow for ExportJob {
    type Attempt = i32;

    fn attempt(&self) -> &i32 {
        &self.attempt
    }
}

/// The message of both tables.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Video {
    pub n: u32,
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

/// The subscriptions to both tables, with a short poll: SQLite's advisory lock form takes one
/// row at a time, and the next waits up to a poll interval.
pub fn include_both(
    b: &mut ruststream::BrokerScope<RusqliteBroker>,
    videos: Record,
    exports: Record,
) {
    b.include(
        subscriber("videos", videos)
            .map_source(|_| InboxQueue::<VideoJob>::new("videos"))
            .workers(nonzero!(2))
            .poll_interval(POLL)
            .build(),
    );
    b.include(
        subscriber("exports", exports)
            .map_source(|_| InboxQueue::<ExportJob>::new("exports"))
            .workers(nonzero!(2))
            .poll_interval(POLL)
            .build(),
    );
}

pub const POLL: Duration = Duration::from_millis(20);

/// Waits until `done` holds, checking every few milliseconds on `exec`, for at most `limit`.
/// Answers whether it held.
pub async fn eventually(
    exec: &dyn Executor,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> bool {
    let start = Instant::now();
    loop {
        if done() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        exec.sleep(Duration::from_millis(10)).await;
    }
}

/// A service on `broker` with a short shutdown timeout.
pub fn service(
    broker: &BrokerHandle<RusqliteBroker>,
    include: impl FnOnce(&mut ruststream::BrokerScope<RusqliteBroker>),
) -> RustStream {
    RustStream::new(AppInfo::new("rusqlite-tests", "0.1.0"))
        .shutdown_timeout(Duration::from_secs(10))
        .with_broker(broker.clone(), include)
}

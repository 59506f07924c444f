//! What the example tests share: a PostgreSQL schema or a SQLite file of each test's own, a
//! recorder of the examples' tracing events that can hold a handler at an event, and waits.
//!
//! An unreachable database fails the test with a message naming its URL: nothing is skipped.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, LazyLock, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ruststream_sqlx::prelude::*;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Connection};
use tracing::field::{Field, Visit};
use tracing::span;

/// How long a test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(60);

/// The URL of the test PostgreSQL server.
pub fn pg_url() -> String {
    std::env::var("RUSTSTREAM_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A name unique to the test and the process.
pub fn namespace(test: &str) -> String {
    format!("rs_examples_{test}_{}", std::process::id())
}

/// Waits until `check` answers true, or fails naming `what`.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The tests of this binary run one at a time: the recorder of tracing events is the
/// process's.
pub async fn serial() -> futures::lock::MutexGuard<'static, ()> {
    static SERIAL: LazyLock<futures::lock::Mutex<()>> =
        LazyLock::new(|| futures::lock::Mutex::new(()));
    let guard = SERIAL.lock().await;
    recorder().clear();
    guard
}

// ----- PostgreSQL -----

/// A PostgreSQL schema of the test's own. The example's sessions find its tables there by
/// `search_path`, and carry the schema's name as their `application_name`; the test's own
/// sessions carry it with `_t`.
pub struct PgSchema {
    pub name: String,
    pub url: String,
    /// What the example's service connects with.
    pub options: PgConnectOptions,
    admin: sqlx::PgPool,
}

impl PgSchema {
    pub async fn new(test: &str) -> PgSchema {
        let url = pg_url();
        let base: PgConnectOptions = url
            .parse()
            .unwrap_or_else(|e| panic!("RUSTSTREAM_PG_URL `{url}` does not parse: {e}"));
        let name = namespace(test);
        let mut root = PgConnection::connect_with(&base).await.unwrap_or_else(|e| {
            panic!("PostgreSQL at {url} is unreachable (set RUSTSTREAM_PG_URL): {e}")
        });
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name};"
        )))
        .execute(&mut root)
        .await
        .unwrap_or_else(|e| panic!("create schema {name} at {url}: {e}"));
        root.close().await.ok();
        let options = base
            .options([("search_path", name.as_str())])
            .application_name(&name);
        let admin = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options.clone().application_name(&format!("{name}_t")))
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {url} is unreachable: {e}"));
        PgSchema {
            name,
            url,
            options,
            admin,
        }
    }

    /// Runs SQL (several statements) in the schema.
    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("{sql} at {}: {e}", self.url));
    }

    /// The integer the query answers.
    pub async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("{sql} at {}: {e}", self.url))
    }

    /// The example's sessions in `pg_stat_activity` (by `application_name`), with a condition.
    pub async fn sessions(&self, condition: &str) -> i64 {
        self.scalar(&format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = '{}' {condition}",
            self.name
        ))
        .await
    }

    pub async fn drop(self) {
        self.admin.close().await;
        let mut root = PgConnection::connect(&self.url).await.expect("reconnect");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            self.name
        )))
        .execute(&mut root)
        .await
        .expect("drop the schema");
        root.close().await.ok();
    }
}

// ----- SQLite -----

/// A SQLite file of the test's own in a temporary directory, removed at the end.
pub struct LiteFile {
    pub dir: PathBuf,
    pub path: PathBuf,
}

impl LiteFile {
    pub fn new(test: &str) -> LiteFile {
        let dir = std::env::temp_dir().join(namespace(test));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let path = dir.join("example.db");
        LiteFile { dir, path }
    }

    /// The URL the example's `service` takes: the spec's `sqlite:exports.db?mode=rwc`, on this
    /// file.
    pub fn url(&self) -> String {
        format!("sqlite:{}?mode=rwc", self.path.display())
    }

    async fn conn(&self) -> SqliteConnection {
        let options = SqliteConnectOptions::new()
            .filename(&self.path)
            .create_if_missing(true)
            .busy_timeout(Duration::from_secs(10));
        SqliteConnection::connect_with(&options)
            .await
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.path.display()))
    }

    /// Runs SQL (several statements) on a connection of the test's own.
    pub async fn exec(&self, sql: &str) {
        let mut conn = self.conn().await;
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        conn.close().await.ok();
    }

    /// The integer the query answers.
    pub async fn scalar(&self, sql: &str) -> i64 {
        let mut conn = self.conn().await;
        let n = sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_owned()))
            .fetch_one(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        conn.close().await.ok();
        n
    }

    /// The strings the query answers.
    pub async fn strings(&self, sql: &str) -> Vec<String> {
        let mut conn = self.conn().await;
        let out = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql.to_owned()))
            .fetch_all(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        conn.close().await.ok();
        out
    }

    /// The file descriptors of this process open on the file (or its `-wal`, `-shm` or
    /// `-journal`), as `/proc/self/fd` lists them.
    pub fn open_descriptors(&self) -> Vec<PathBuf> {
        open_descriptors(&self.path)
    }

    pub fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn open_descriptors(path: &Path) -> Vec<PathBuf> {
    let prefix = path.as_os_str().to_string_lossy().into_owned();
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd lists the descriptors")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with(&prefix))
        .collect()
}

// ----- the examples' tracing events -----

/// An event an example logged: its message and its fields, as text.
#[derive(Clone, Debug)]
pub struct Event {
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

impl Event {
    /// The field's value, as text.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    /// The field's value, as a number.
    pub fn int(&self, name: &str) -> Option<i64> {
        self.field(name)?.parse().ok()
    }
}

type Predicate = Box<dyn Fn(&Event) -> bool + Send + Sync>;

#[derive(Default)]
struct Hold {
    /// Events that match wait until the hold is released.
    predicate: Option<Predicate>,
    /// How many handlers wait now.
    held: usize,
}

/// Records the events of the examples (the targets of this test binary) and holds the
/// handler of an event that matches the hold, on its thread, until the hold is released.
#[derive(Default)]
pub struct Recorder {
    events: Mutex<Vec<Event>>,
    hold: Mutex<Hold>,
    released: Condvar,
}

/// The process's recorder, installed as the global tracing subscriber.
pub fn recorder() -> &'static Recorder {
    static RECORDER: OnceLock<&'static Recorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder: &'static Recorder = Box::leak(Box::default());
        tracing::subscriber::set_global_default(Dispatch(recorder))
            .expect("no other global tracing subscriber");
        recorder
    })
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Recorder {
    /// Forgets the events recorded so far.
    pub fn clear(&self) {
        lock(&self.events).clear();
    }

    /// The events recorded so far, in order.
    pub fn events(&self) -> Vec<Event> {
        lock(&self.events).clone()
    }

    /// The events of this message.
    pub fn messages(&self, message: &str) -> Vec<Event> {
        self.events()
            .into_iter()
            .filter(|e| e.message == message)
            .collect()
    }

    /// Holds every handler that logs an event `predicate` matches until the returned guard
    /// releases it (or drops).
    pub fn hold(
        &'static self,
        predicate: impl Fn(&Event) -> bool + Send + Sync + 'static,
    ) -> HoldGuard {
        lock(&self.hold).predicate = Some(Box::new(predicate));
        HoldGuard(self)
    }

    /// How many handlers are held now.
    pub fn held(&self) -> usize {
        lock(&self.hold).held
    }

    fn release(&self) {
        lock(&self.hold).predicate = None;
        self.released.notify_all();
    }

    fn record(&self, event: Event) {
        let matches = lock(&self.hold)
            .predicate
            .as_ref()
            .is_some_and(|p| p(&event));
        lock(&self.events).push(event);
        if matches {
            // The handler's thread waits; its tokio worker hands its tasks to another thread.
            tokio::task::block_in_place(|| {
                let mut hold = lock(&self.hold);
                hold.held += 1;
                while hold.predicate.is_some() {
                    hold = self.released.wait(hold).unwrap_or_else(|e| e.into_inner());
                }
                hold.held -= 1;
            });
        }
    }
}

/// Releases a hold when it drops.
pub struct HoldGuard(&'static Recorder);

impl HoldGuard {
    /// Lets the held handlers go on, and holds no more.
    pub fn release(self) {}
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        self.0.release();
    }
}

struct Dispatch(&'static Recorder);

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl tracing::Subscriber for Dispatch {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.is_event() && metadata.target().starts_with(env!("CARGO_CRATE_NAME"))
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut fields = fields.0;
        let message = fields.remove("message").unwrap_or_default();
        self.0.record(Event { message, fields });
    }

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}

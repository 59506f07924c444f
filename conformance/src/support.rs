//! What the scenarios share: the scenario's context [`Cx`], a handler that records what it
//! sees, gates, and waiting.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use ruststream::{
    AppInfo, BrokerHandle, Context, Ctx, Handle, HandlerOutcome, InboxContext, InboxQueue,
    IntoSubscription, Message, Publisher, RustStream, Subscriber, Value, keys, subscriber,
};
use ruststream_core::Dialect;

use crate::harness::Harness;
use crate::rows::{Job, SuiteRow};
use crate::schema::{self, TableSpec};
use crate::{Form, TestName};

/// The poll interval of most scenarios: short, so the suite runs fast.
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// How long a scenario waits for what must happen before it fails.
pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// The wall clock in microseconds since the Unix epoch, as the core writes times.
pub(crate) fn now_micros() -> i64 {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0);
    i64::try_from(micros).unwrap_or(i64::MAX)
}

/// Sleeps on the scenario's runtime.
pub(crate) async fn sleep(duration: Duration) {
    tokio::time::sleep(duration).await;
}

/// The context of one scenario run: the harness, the database, the table and its form.
pub struct Cx<'h, H: Harness> {
    /// The harness.
    pub harness: &'h H,
    /// The database's locator, from [`Harness::prepare`].
    pub db: String,
    /// The scenario's table.
    pub table: TableSpec,
    /// The test, which a crash test re-runs as its child.
    pub test: &'h TestName,
}

impl<H: Harness> fmt::Display for Cx<'_, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {}, {} form, table {}",
            self.test,
            self.harness.name(),
            self.table.form,
            self.table.name
        )
    }
}

impl<'h, H: Harness> Cx<'h, H> {
    /// Prepares the scenario's database and creates its tables, dropping them first.
    pub(crate) async fn prepare(harness: &'h H, table: TableSpec, test: &'h TestName) -> Self {
        let db = harness
            .prepare(table.name)
            .await
            .unwrap_or_else(|e| panic!("{test}: the harness did not prepare a database: {e}"));
        let cx = Self {
            harness,
            db,
            table,
            test,
        };
        for sql in schema::drop(&table) {
            cx.execute(&sql).await;
        }
        for sql in schema::create(harness.dialect(), &table) {
            cx.execute(&sql).await;
        }
        cx
    }

    /// The context of a child process on the database its parent prepared.
    pub(crate) fn attach(harness: &'h H, db: String, table: TableSpec, test: &'h TestName) -> Self {
        Self {
            harness,
            db,
            table,
            test,
        }
    }

    /// The database's dialect.
    pub fn dialect(&self) -> Dialect {
        self.harness.dialect()
    }

    /// The scenario's form.
    pub fn form(&self) -> Form {
        self.table.form
    }

    /// Runs one statement on the harness's connection; panics naming it on an error.
    pub async fn execute(&self, sql: &str) {
        if let Err(error) = self.harness.execute(&self.db, sql).await {
            panic!("{self}: `{sql}` failed: {error}");
        }
    }

    /// The first column of each row of a query, on the harness's connection.
    pub async fn i64s(&self, sql: &str) -> Vec<i64> {
        self.harness
            .query_i64s(&self.db, sql)
            .await
            .unwrap_or_else(|error| panic!("{self}: `{sql}` failed: {error}"))
    }

    /// The first column of the first row of a query.
    pub async fn i64(&self, sql: &str) -> i64 {
        match self.i64s(sql).await.first() {
            Some(value) => *value,
            None => panic!("{self}: `{sql}` answered no row"),
        }
    }

    /// The rows of the table that match `condition` (SQL, `1=1` for all).
    pub async fn count(&self, condition: &str) -> i64 {
        self.i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE {condition}",
            self.table.name
        ))
        .await
    }

    /// The attempt column of the row `id`.
    pub async fn attempt_of(&self, id: i64) -> i64 {
        self.i64(&format!(
            "SELECT attempt FROM {} WHERE id = {id}",
            self.table.name
        ))
        .await
    }

    /// A time column of the row `id`, in microseconds since the Unix epoch; -1 for `NULL`.
    pub async fn micros_of(&self, column: &str, id: i64) -> i64 {
        let expr = schema::micros(self.dialect(), column);
        self.i64(&format!(
            "SELECT {expr} FROM {} WHERE id = {id}",
            self.table.name
        ))
        .await
    }

    /// Inserts a row with the harness's SQL: id `id` (or the database's), key column `k`,
    /// and `payload`.
    pub async fn insert(&self, id: Option<i64>, k: i64, payload: &[u8]) {
        let payload = schema::bytes_literal(self.dialect(), payload);
        let sql = match id {
            Some(id) => format!(
                "INSERT INTO {} (id, k, payload) VALUES ({id}, {k}, {payload})",
                self.table.name
            ),
            None => format!(
                "INSERT INTO {} (k, payload) VALUES ({k}, {payload})",
                self.table.name
            ),
        };
        self.execute(&sql).await;
    }

    /// Inserts the row of job `n` with key column `n` and id `n`.
    pub async fn insert_job(&self, n: i64) {
        let payload = serde_json::to_vec(&Job { n }).expect("a job encodes");
        self.insert(Some(n), n, &payload).await;
    }

    /// The advisory key of the row whose key column is `k`, as the database renders it.
    pub fn key(&self, k: i64) -> String {
        format!("{}-{k}", self.table.name)
    }

    /// The custom lock form: marks `k`'s key held, as another system would.
    pub async fn hold_in_held_keys(&self, k: i64) {
        let sql = format!(
            "INSERT INTO {} ({}) VALUES ('{}')",
            schema::held_keys(self.table.name),
            schema::key_column(self.dialect()),
            self.key(k)
        );
        self.execute(&sql).await;
    }

    /// The custom lock form: removes `k`'s key from the held keys.
    pub async fn release_in_held_keys(&self, k: i64) {
        let sql = format!(
            "DELETE FROM {} WHERE {} = '{}'",
            schema::held_keys(self.table.name),
            schema::key_column(self.dialect()),
            self.key(k)
        );
        self.execute(&sql).await;
    }

    /// The custom lock form: how many keys are held.
    pub async fn held_keys(&self) -> i64 {
        self.i64(&format!(
            "SELECT COUNT(*) FROM {}",
            schema::held_keys(self.table.name)
        ))
        .await
    }

    /// A new broker on the scenario's database.
    pub fn broker(&self) -> BrokerHandle<H::Adapter> {
        self.harness.broker(&self.db)
    }

    /// A service on `broker` with the subscription `sub`, and this shutdown timeout.
    pub fn service<S>(
        &self,
        broker: &BrokerHandle<H::Adapter>,
        sub: S,
        shutdown_timeout: Duration,
    ) -> RustStream
    where
        S: IntoSubscription<H::Adapter> + 'static,
    {
        RustStream::new(AppInfo::new(
            "ruststream-conformance",
            env!("CARGO_PKG_VERSION"),
        ))
        .shutdown_timeout(shutdown_timeout)
        .with_broker(broker.clone(), move |b| {
            b.include(sub);
        })
    }

    /// Publishes job `n`, with key column `k` where the form keys its rows; panics if the
    /// publish fails.
    pub async fn publish<T: SuiteRow>(&self, publisher: &Publisher<T, H::Adapter>, n: i64, k: i64) {
        let mut message = Message::json(&Job { n }).expect("a job encodes");
        if matches!(T::FORM, Form::Advisory | Form::Custom) {
            message = message.column("k", Value::Int(k));
        }
        if let Err(error) = publisher.publish(message).await {
            panic!("{self}: publishing job {n} failed: {error}");
        }
    }

    /// Waits until `check` answers true, checking every 10 ms; panics naming `what` after
    /// 20 seconds.
    pub async fn until<F, Fut>(&self, what: &str, check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        self.until_within(what, WAIT, check).await;
    }

    /// Waits until `check` answers true, up to `limit`; panics naming `what` after it.
    pub async fn until_within<F, Fut>(&self, what: &str, limit: Duration, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let start = Instant::now();
        loop {
            if check().await {
                return;
            }
            if start.elapsed() > limit {
                panic!("{self}: after {limit:?}, still waiting until {what}");
            }
            sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The settings of a scenario's subscription.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Opts {
    pub(crate) workers: usize,
    pub(crate) poll: Duration,
    pub(crate) lease: Duration,
    pub(crate) prefetch: usize,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            workers: 1,
            poll: POLL,
            lease: Duration::from_secs(30),
            prefetch: 0,
        }
    }
}

impl Opts {
    pub(crate) fn workers(self, workers: usize) -> Self {
        Self { workers, ..self }
    }

    pub(crate) fn poll(self, poll: Duration) -> Self {
        Self { poll, ..self }
    }

    pub(crate) fn lease(self, lease: Duration) -> Self {
        Self { lease, ..self }
    }

    pub(crate) fn prefetch(self, prefetch: usize) -> Self {
        Self { prefetch, ..self }
    }
}

/// The subscription of `T`'s table, handled by `recorder`.
pub(crate) fn subscription<T: SuiteRow>(
    recorder: &Recorder,
    opts: Opts,
) -> Subscriber<Recorder, InboxQueue<T>, Job, (), (), InboxContext> {
    let workers = NonZeroUsize::new(opts.workers).unwrap_or(NonZeroUsize::MIN);
    subscriber(T::NAME, recorder.clone())
        .map_source(|_| InboxQueue::<T>::new(T::NAME))
        .workers(workers)
        .poll_interval(opts.poll)
        .lease(opts.lease)
        .prefetch(opts.prefetch)
        .build()
}

/// One delivery as a handler saw it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) n: i64,
    pub(crate) attempt: i64,
    pub(crate) at: Instant,
    /// The wall clock when it started, in microseconds since the Unix epoch.
    pub(crate) wall: i64,
}

#[derive(Debug, Default)]
struct Log {
    starts: Vec<Seen>,
    ends: Vec<(i64, Instant)>,
    by_key: HashMap<String, usize>,
    max_by_key: usize,
    in_work: usize,
    max_in_work: usize,
}

type Act = Arc<dyn Fn(Seen) -> BoxFuture<'static, Result<(), HandlerOutcome>> + Send + Sync>;

/// A handler that records every delivery it sees (the attempt by `Ctx<keys::Attempt>`), the
/// deliveries in work per key and in all, and answers as its script says.
#[derive(Clone)]
pub(crate) struct Recorder {
    log: Arc<Mutex<Log>>,
    act: Act,
}

impl Recorder {
    /// A handler that runs `act` for each delivery.
    pub(crate) fn new<F, Fut>(act: F) -> Self
    where
        F: Fn(Seen) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerOutcome>> + Send + 'static,
    {
        Self {
            log: Arc::default(),
            act: Arc::new(move |seen| Box::pin(act(seen))),
        }
    }

    /// A handler that records into this one's log (so the counts per key and in work span
    /// both) and runs `act` for each delivery: the handler of a second broker.
    pub(crate) fn sharing<F, Fut>(&self, act: F) -> Self
    where
        F: Fn(Seen) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerOutcome>> + Send + 'static,
    {
        Self {
            log: self.log.clone(),
            act: Arc::new(move |seen| Box::pin(act(seen))),
        }
    }

    /// A handler that waits for `gate` to open on the deliveries `held` picks, and
    /// acknowledges every delivery.
    pub(crate) fn gated(gate: &Gate, held: impl Fn(&Seen) -> bool + Send + Sync + 'static) -> Self {
        let gate = gate.clone();
        Self::new(move |seen| {
            let wait = held(&seen).then(|| gate.clone());
            async move {
                if let Some(gate) = wait {
                    gate.wait().await;
                }
                Ok(())
            }
        })
    }

    /// A handler that acknowledges at once.
    pub(crate) fn acking() -> Self {
        Self::new(|_| async { Ok(()) })
    }

    /// A handler that takes `duration`, then acknowledges.
    pub(crate) fn sleeping(duration: Duration) -> Self {
        Self::new(move |_| async move {
            sleep(duration).await;
            Ok(())
        })
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every delivery, in the order they started.
    pub(crate) fn starts(&self) -> Vec<Seen> {
        self.log().starts.clone()
    }

    /// How many deliveries started.
    pub(crate) fn count(&self) -> usize {
        self.log().starts.len()
    }

    /// The jobs in the order their deliveries started.
    pub(crate) fn ns(&self) -> Vec<i64> {
        self.log().starts.iter().map(|s| s.n).collect()
    }

    /// Each delivery's job and attempt, sorted.
    pub(crate) fn pairs(&self) -> Vec<(i64, i64)> {
        let mut pairs: Vec<(i64, i64)> =
            self.log().starts.iter().map(|s| (s.n, s.attempt)).collect();
        pairs.sort_unstable();
        pairs
    }

    /// Whether job `n` was seen.
    pub(crate) fn saw(&self, n: i64) -> bool {
        self.log().starts.iter().any(|s| s.n == n)
    }

    /// The delivery of job `n` at `attempt`.
    pub(crate) fn seen(&self, n: i64, attempt: i64) -> Option<Seen> {
        self.log()
            .starts
            .iter()
            .find(|s| s.n == n && s.attempt == attempt)
            .cloned()
    }

    /// When each delivery ended (its handler answered), by job, in order.
    pub(crate) fn ends(&self) -> Vec<(i64, Instant)> {
        self.log().ends.clone()
    }

    /// The most deliveries of one key in work at once.
    pub(crate) fn max_by_key(&self) -> usize {
        self.log().max_by_key
    }

    /// The most deliveries in work at once.
    pub(crate) fn max_in_work(&self) -> usize {
        self.log().max_in_work
    }

    /// The deliveries in work now.
    pub(crate) fn in_work(&self) -> usize {
        self.log().in_work
    }
}

/// Counts a delivery out of work when its handler ends, however it ends (a panic too).
struct InWork {
    log: Arc<Mutex<Log>>,
    key: Option<String>,
}

impl Drop for InWork {
    fn drop(&mut self) {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.in_work -= 1;
        if let Some(key) = &self.key
            && let Some(n) = log.by_key.get_mut(key)
        {
            *n -= 1;
        }
    }
}

impl Handle<Job, (), (), InboxContext> for Recorder {
    async fn handle(
        &self,
        job: &Job,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let Ctx(attempt) = Ctx::<keys::Attempt>::from_context(ctx).await?;
        let key = ctx.kind().info().key.clone();
        let seen = Seen {
            n: job.n,
            attempt,
            at: Instant::now(),
            wall: now_micros(),
        };
        let work = {
            let mut log = self.log();
            log.starts.push(seen.clone());
            log.in_work += 1;
            log.max_in_work = log.max_in_work.max(log.in_work);
            if let Some(key) = &key {
                let n = log.by_key.entry(key.to_string()).or_default();
                *n += 1;
                let n = *n;
                log.max_by_key = log.max_by_key.max(n);
            }
            InWork {
                log: self.log.clone(),
                key: key.map(|k| k.to_string()),
            }
        };
        let outcome = (self.act)(seen).await;
        self.log().ends.push((job.n, Instant::now()));
        drop(work);
        outcome
    }
}

/// A gate a handler waits at until the scenario opens it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Gate(Arc<AtomicBool>);

impl Gate {
    pub(crate) fn open(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub(crate) async fn wait(&self) {
        while !self.0.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The form holds rows one at a time here: SQLite's advisory lock form (the process's
/// registry), and the custom lock form everywhere ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)): a claim reads the first due rows
/// alone and takes nothing while their keys are held.
pub(crate) fn one_at_a_time(dialect: Dialect, form: Form) -> bool {
    match form {
        Form::Custom => true,
        Form::Advisory => dialect == Dialect::Sqlite,
        Form::Lease | Form::RowLock => false,
    }
}

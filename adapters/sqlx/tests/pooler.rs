//! `SqlxBroker<Postgres>` through a real PgBouncer (Debian's `pgbouncer`, which `scripts/test`
//! installs where it is missing), started by the test on a port of its own in front of a
//! fresh PostgreSQL the test binary starts (initdb, as the TLS tests do), in transaction
//! pooling (`pool_mode = transaction`), where each transaction may run on any server session:
//!
//! - under the simple query protocol (`simple_query(true)`), with the listening session on a
//!   direct connection or off, the lease form and the row lock form without an attempt column
//!   serve every row published through the pooler (by the broker and by an outbox of its
//!   own), and the rows, read as text, decode into the service's row types;
//! - the row lock form with an attempt column and the advisory lock form hold session locks
//!   and refuse at the start, naming transaction pooling, leaving no lock;
//! - with sqlx's prepared statements (the default, and with its statement cache off) the start
//!   fails at once, naming transaction pooling and the setting that cures it; with the
//!   listening session through the pooler, whatever the protocol, the start fails at once
//!   naming the listening session and transaction pooling.

#[path = "databases/common.rs"]
mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use ruststream_conformance::servers::bouncer::{Bouncer, Pooling};
use ruststream_conformance::servers::postgres::TlsServer;
use ruststream_sqlx::prelude::*;
use ruststream_sqlx::{SqlxOutbox, sqlx};
use sqlx::postgres::{PgPoolOptions, PgRow};
use sqlx::types::time::OffsetDateTime;

/// The row lock form with an attempt column, `pooler_rowlock`, and the advisory lock form,
/// `pooler_keyed`, of the tests' shared tables.
mod rows {
    crate::tables!("pooler");
}

use rows::{Keyed, RowLock};

/// A fresh PostgreSQL of this test binary's own, started by its first test and stopped once
/// the binary exits, and a schema of the test's own on it: the pooler stands in front of a
/// server that nothing else has configured.
async fn fresh_pg(test: &str) -> Pg {
    static SERVER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let url = SERVER.get_or_init(|| {
        let server = TlsServer::plain("pooler-sqlx");
        let url = server.url("");
        server.stop_at_exit();
        url
    });
    use_pg_url(url.clone());
    let db = Pg::new(test).await;
    let port: PgConnectOptions = url.parse().expect("the server's URL parses");
    assert_eq!(
        db.scalar("SELECT CAST(current_setting('port') AS BIGINT)")
            .await,
        i64::from(port.get_port()),
        "the test's schema is on the fresh server"
    );
    db
}

/// A broker through `bouncer`, with a pool of four connections.
fn broker_through(bouncer: &Bouncer) -> SqlxBroker<Postgres> {
    SqlxBroker::from_url(
        bouncer.url(),
        PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10)),
    )
}

/// The test's tables: those of `tables!("pooler")`, the lease form's `exports` with a text
/// column, and the row lock form without an attempt column, `plain_jobs`.
async fn schema(db: &Pg) {
    db.exec(&common::schema(common::Dialect::Postgres, "pooler"))
        .await;
    db.exec(
        "CREATE TABLE exports (
             id BIGSERIAL PRIMARY KEY,
             attempt INT NOT NULL DEFAULT 0,
             payload BYTEA NOT NULL,
             locked_until TIMESTAMPTZ,
             note TEXT NOT NULL DEFAULT 'it''s a \\ note'
         );
         CREATE TABLE plain_jobs (id BIGSERIAL PRIMARY KEY, payload BYTEA NOT NULL);",
    )
    .await;
}

/// What the service's own row type of `exports` decoded from the rows it was handed: under
/// the simple query protocol they come as text.
static DECODED: Mutex<Vec<Decoded>> = Mutex::new(Vec::new());

/// A row of `exports` as decoded: its id, attempt, note and lease expiry.
type Decoded = (i64, i32, String, Option<OffsetDateTime>);

/// The lease form's row, every column as the service reads it: `i64`, `i32`, `Vec<u8>`,
/// text and `timestamptz`, decoded by sqlx's derive.
#[derive(Debug, sqlx::FromRow)]
struct ExportColumns {
    id: i64,
    attempt: i32,
    payload: Vec<u8>,
    note: String,
    locked_until: Option<OffsetDateTime>,
}

/// A row of `exports`: its columns, as `ExportColumns` decodes them, recorded in [`DECODED`].
#[derive(Debug)]
struct Export(ExportColumns);

impl<'r> sqlx::FromRow<'r, PgRow> for Export {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        let columns = ExportColumns::from_row(row)?;
        DECODED.lock().unwrap().push((
            columns.id,
            columns.attempt,
            columns.note.clone(),
            columns.locked_until,
        ));
        Ok(Export(columns))
    }
}

impl InboxTable for Export {
    type Id = i64;
    type Table = InboxSpec<(Attempt, Payload, Lease)>;
    const TABLE: Self::Table = InboxSpec::new("exports", Column::new("id").generated())
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .lease(Column::new("locked_until"));

    fn id(&self) -> &i64 {
        &self.0.id
    }
}

impl PayloadRow for Export {
    type Column = Vec<u8>;

    fn payload(&self) -> &[u8] {
        &self.0.payload
    }
}

/// The row lock form without an attempt column: its claim and settlement run in one
/// transaction.
#[derive(Debug, sqlx::FromRow)]
struct Plain {
    id: i64,
    payload: Vec<u8>,
}

impl InboxTable for Plain {
    type Id = i64;
    type Table = InboxSpec<(Payload,)>;
    const TABLE: Self::Table =
        InboxSpec::new("plain_jobs", Column::new("id").generated()).payload(Column::new("payload"));

    fn id(&self) -> &i64 {
        &self.id
    }
}

impl PayloadRow for Plain {
    type Column = Vec<u8>;

    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

/// Why a start failed; fails the test if it started.
async fn refused(
    broker: SqlxBroker<Postgres>,
    sub: ruststream::Subscription<SqlxBroker<Postgres>>,
    what: &str,
) -> String {
    match broker.start([sub]).await {
        Ok(running) => {
            running.shutdown().await;
            panic!("{what} started through PgBouncer in transaction pooling");
        }
        Err(error) => error.to_string(),
    }
}

/// The lease form through transaction pooling under the simple query protocol, the listening
/// session on a direct connection: rows published through the pooler by the broker, and by
/// an outbox on a pool of its own (another process's publish, which the direct listener hears
/// of), are each served once and settled; the service's row type decodes the text rows, the
/// text column with its quote and backslash and the lease's `timestamptz` among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_form_and_publishing_work_through_transaction_pooling() {
    const N: u32 = 20;
    const OUTBOX: u32 = 5;
    let db = fresh_pg("pooler_lease").await;
    schema(&db).await;
    let bouncer = Bouncer::start(Pooling::Transaction, &pg_url(), &db.schema);
    let seen = Seen::default();
    let broker = broker_through(&bouncer)
        .simple_query(true)
        .listen_on(db.options.clone());
    assert!(broker.is_simple_query());
    let since = OffsetDateTime::now_utc();
    let running = broker
        .start([subscription::<Export, Postgres>(
            Record::new(&seen, &Gate::open()),
            2,
            Some(Duration::from_secs(10)),
        )])
        .await
        .expect("the lease form starts through transaction pooling");
    let publisher = running.publisher::<Export>();
    for n in 0..N {
        publisher
            .publish(message(n, None))
            .await
            .unwrap_or_else(|e| panic!("publish {n} through PgBouncer: {e}"));
    }
    // Another process's publish: an outbox on a pool of its own through the pooler.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy(&bouncer.url())
        .expect("the outbox's pool");
    SqlxOutbox::<Export, Postgres>::new()
        .simple_query(true)
        .publish_on(&pool, (N..N + OUTBOX).map(|n| message(n, None)))
        .await
        .expect("the outbox publishes through PgBouncer");
    eventually("every row is served", || async {
        seen.len() >= (N + OUTBOX) as usize
    })
    .await;
    eventually("every row is settled", || async {
        db.scalar("SELECT COUNT(*) FROM exports").await == 0
    })
    .await;
    running.shutdown().await;
    pool.close().await;
    let counts = seen.counts();
    assert_eq!(counts.len(), (N + OUTBOX) as usize, "{counts:?}");
    assert!(counts.values().all(|c| *c == 1), "each once: {counts:?}");
    assert!(
        seen.all().iter().all(|(_, attempt)| *attempt == Some(1)),
        "each at attempt 1: {:?}",
        seen.all()
    );
    let decoded = DECODED.lock().unwrap().clone();
    assert_eq!(decoded.len(), (N + OUTBOX) as usize, "{decoded:?}");
    let until = OffsetDateTime::now_utc() + Duration::from_secs(60);
    for (id, attempt, note, locked_until) in &decoded {
        assert!(*id > 0 && *attempt == 1, "{decoded:?}");
        assert_eq!(note, "it's a \\ note");
        let locked_until = locked_until.expect("the lease's expiry");
        assert!(
            locked_until > since && locked_until < until,
            "the expiry {locked_until} is the lease's, from {since}"
        );
    }
    drop(bouncer);
    db.drop().await;
}

/// The row lock form without an attempt column through transaction pooling: its claim and
/// settlement run in one transaction, which the pooler keeps on one server session. Under the
/// simple query protocol, the listener off, every row is served once and settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_row_lock_form_without_attempts_works_through_transaction_pooling() {
    const N: u32 = 12;
    let db = fresh_pg("pooler_plain").await;
    schema(&db).await;
    let bouncer = Bouncer::start(Pooling::Transaction, &pg_url(), &db.schema);
    let seen = Seen::default();
    let running = broker_through(&bouncer)
        .simple_query(true)
        .without_listener()
        .start([subscription::<Plain, Postgres>(
            Record::new(&seen, &Gate::open()),
            2,
            None,
        )])
        .await
        .expect("the row lock form without attempts starts through transaction pooling");
    let publisher = running.publisher::<Plain>();
    for n in 0..N {
        publisher
            .publish(message(n, None))
            .await
            .unwrap_or_else(|e| panic!("publish {n} through PgBouncer: {e}"));
    }
    eventually("every row is served", || async { seen.len() >= N as usize }).await;
    eventually("every row is settled", || async {
        db.scalar("SELECT COUNT(*) FROM plain_jobs").await == 0
    })
    .await;
    running.shutdown().await;
    let counts = seen.counts();
    assert_eq!(counts.len(), N as usize, "{counts:?}");
    assert!(counts.values().all(|c| *c == 1), "each once: {counts:?}");
    drop(bouncer);
    db.drop().await;
}

/// The forms that hold session locks refuse transaction pooling at the start, naming it, even
/// under the simple query protocol with the listener direct: the row lock form with an attempt
/// column (its counts' marks) and the advisory lock form (its keys). No lock is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forms_that_hold_session_locks_refuse_transaction_pooling() {
    let db = fresh_pg("pooler_locks").await;
    schema(&db).await;
    let bouncer = Bouncer::start(Pooling::Transaction, &pg_url(), &db.schema);
    let broker = || {
        broker_through(&bouncer)
            .simple_query(true)
            .listen_on(db.options.clone())
    };
    let record = || Record::new(&Seen::default(), &Gate::open());

    let error = refused(
        broker(),
        subscription::<RowLock, Postgres>(record(), 2, None),
        "the row lock form with an attempt column",
    )
    .await;
    assert!(
        error.contains("row lock form marks each row it counts")
            && error.contains("pool_mode = transaction")
            && error.contains("pooler_rowlock"),
        "the error names the form, transaction pooling and the table: {error}"
    );

    let error = refused(
        broker(),
        subscription::<Keyed, Postgres>(record(), 2, None),
        "the advisory lock form",
    )
    .await;
    assert!(
        error.contains("advisory lock form holds each key")
            && error.contains("pool_mode = transaction")
            && error.contains("pooler_keyed"),
        "the error names the form, transaction pooling and the table: {error}"
    );
    assert_eq!(db.advisory_locks().await, 0, "no lock left");
    drop(bouncer);
    db.drop().await;
}

/// Without the simple query protocol, sqlx's prepared statements meet each other on the pooled
/// server sessions: the start fails at once (no retry), naming transaction pooling and
/// `simple_query(true)`, with the listener direct, whether sqlx caches its statements or not
/// (`statement_cache_capacity(0)` still names each statement it prepares). With the listener
/// through the pooler, under either protocol, the start's own notification comes back on the
/// pool's connection, and the start fails at once naming the listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_simple_query_the_start_fails_at_once_naming_the_pooler() {
    let db = fresh_pg("pooler_prepared").await;
    schema(&db).await;
    let bouncer = Bouncer::start(Pooling::Transaction, &pg_url(), &db.schema);
    let lease = || {
        subscription::<Export, Postgres>(
            Record::new(&Seen::default(), &Gate::open()),
            2,
            Some(Duration::from_secs(10)),
        )
    };
    let options: PgConnectOptions = bouncer.url().parse().expect("the pooler's URL parses");
    let pool = || {
        PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
    };
    for (broker, what) in [
        (
            broker_through(&bouncer).listen_on(db.options.clone()),
            "sqlx's prepared statements",
        ),
        (
            SqlxBroker::from_connect_options(options.clone().statement_cache_capacity(0), pool())
                .listen_on(db.options.clone()),
            "sqlx's statements, uncached",
        ),
    ] {
        assert!(!broker.is_simple_query());
        let since = Instant::now();
        let error = refused(broker, lease(), what).await;
        eprintln!("{what}: {error}");
        assert!(
            since.elapsed() < Duration::from_secs(15),
            "{what}: refused at once, not retried ({:?})",
            since.elapsed()
        );
        assert!(
            error.contains("transaction pooling")
                && error.contains("pool_mode = transaction")
                && error.contains("simple_query(true)")
                && error.contains("exports"),
            "{what}: the error names transaction pooling, its cure and the table: {error}"
        );
    }

    // The listener through the pooler too, even under the simple query protocol: the start's
    // notification comes back on the pool's connection, handed the listening session's server
    // session, and the start says so.
    for broker in [
        broker_through(&bouncer),
        broker_through(&bouncer).simple_query(true),
    ] {
        let since = Instant::now();
        let error = refused(broker, lease(), "a listener through the pooler").await;
        eprintln!("a listener through the pooler: {error}");
        assert!(
            since.elapsed() < Duration::from_secs(15),
            "refused at once ({:?})",
            since.elapsed()
        );
        assert!(
            error.contains("listening session")
                && error.contains("pool_mode = transaction")
                && error.contains("listen_on"),
            "the error names the listener, transaction pooling and its cure: {error}"
        );
    }
    assert_eq!(db.advisory_locks().await, 0, "no lock left");
    assert_eq!(db.scalar("SELECT COUNT(*) FROM exports").await, 0);
    drop(bouncer);
    db.drop().await;
}

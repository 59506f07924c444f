//! The maintenance brokers run by themselves, on every database, with several brokers on one
//! table (each its own pool, as separate processes would be).
//!
//! Retention deletes only the rows whose mark is older than its age, in batches smaller than
//! what is to delete, and no broker deletes while another session holds the table's
//! retention lock (PostgreSQL, MariaDB). Periodic jobs: three brokers on one every-second
//! schedule publish each tick once, with no gap; stopped for longer than a tick and started
//! again, they publish the ticks missed meanwhile; the same with three OS processes on
//! PostgreSQL (this test binary run again as children).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ruststream::core::{Dialect as CoreDialect, Statements, TableDesc};
use ruststream::{Inbox, InboxQueue, IntoSubscription, Message, Periodic, Schedule, Subscription};
use ruststream_sqlx::{SqlxBroker, SqlxDatabase, sqlx};
use sqlx::{AssertSqlSafe, Connection};

use crate::common::*;

/// Rows kept once settled or failed, for retention to delete.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(
    table = "kept",
    locked_until = "locked_until",
    processed_at = "processed_at",
    failed_at = "failed_at",
    error = "error"
)]
#[allow(dead_code)]
pub struct Kept {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The rows of a periodic job, kept once handled.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(
    table = "ticks",
    locked_until = "locked_until",
    processed_at = "processed_at"
)]
#[allow(dead_code)]
pub struct TickRow {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

fn schema(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => {
            "CREATE TABLE kept (id BIGSERIAL PRIMARY KEY, payload BYTEA NOT NULL,
                 locked_until TIMESTAMPTZ, processed_at TIMESTAMPTZ, failed_at TIMESTAMPTZ,
                 error TEXT);
             CREATE TABLE ticks (id BIGSERIAL PRIMARY KEY, payload BYTEA NOT NULL,
                 locked_until TIMESTAMPTZ, processed_at TIMESTAMPTZ);"
        }
        Dialect::MariaDb => {
            "CREATE TABLE kept (id BIGINT AUTO_INCREMENT PRIMARY KEY, payload LONGBLOB NOT NULL,
                 locked_until DATETIME(6) NULL, processed_at DATETIME(6) NULL,
                 failed_at DATETIME(6) NULL, error TEXT);
             CREATE TABLE ticks (id BIGINT AUTO_INCREMENT PRIMARY KEY, payload LONGBLOB NOT NULL,
                 locked_until DATETIME(6) NULL, processed_at DATETIME(6) NULL);"
        }
        Dialect::Sqlite => {
            "CREATE TABLE kept (id INTEGER PRIMARY KEY AUTOINCREMENT, payload BLOB NOT NULL,
                 locked_until INTEGER, processed_at INTEGER, failed_at INTEGER, error TEXT);
             CREATE TABLE ticks (id INTEGER PRIMARY KEY AUTOINCREMENT, payload BLOB NOT NULL,
                 locked_until INTEGER, processed_at INTEGER);"
        }
    }
}

fn core_dialect(dialect: Dialect) -> CoreDialect {
    match dialect {
        Dialect::Postgres => CoreDialect::Postgres,
        Dialect::MariaDb => CoreDialect::MariaDb,
        Dialect::Sqlite => CoreDialect::Sqlite,
    }
}

/// Inserts `n` rows of `kept` whose `column` is `ago` seconds before the server's now.
async fn insert_marked<D: TestDb>(db: &D, n: usize, column: &str, ago: u64) {
    let (payload, at) = match db.dialect() {
        Dialect::Postgres => (
            "decode('00', 'hex')".to_owned(),
            format!("now() - interval '{ago} seconds'"),
        ),
        Dialect::MariaDb => (
            "X'00'".to_owned(),
            format!("UTC_TIMESTAMP(6) - INTERVAL {ago} SECOND"),
        ),
        Dialect::Sqlite => (
            "X'00'".to_owned(),
            format!("(CAST(strftime('%s', 'now') AS INTEGER) - {ago}) * 1000000"),
        ),
    };
    let rows = vec![format!("({payload}, {at})"); n].join(", ");
    db.exec(&format!(
        "INSERT INTO kept (payload, {column}) VALUES {rows}"
    ))
    .await;
}

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

/// A subscription of `kept` that deletes rows processed over an hour ago and failed over a
/// day ago, in batches of 10, every 200 ms.
fn retaining<DB: SqlxDatabase>() -> Subscription<SqlxBroker<DB>>
where
    SqlxBroker<DB>: ruststream::adapter::TakesRows<Kept>,
{
    ruststream::subscriber("kept", Record::new(&Seen::default(), &Gate::open()))
        .map_source(|_| InboxQueue::<Kept>::new("kept"))
        .poll_interval(POLL)
        .retain_processed(Duration::from_secs(HOUR))
        .retain_failed(Duration::from_secs(DAY))
        .retention_every(Duration::from_millis(200), 10)
        .into_subscription()
}

async fn count<D: TestDb>(db: &D, condition: &str) -> i64 {
    db.scalar(&format!("SELECT COUNT(*) FROM kept WHERE {condition}"))
        .await
}

/// 25 rows processed two hours ago, 5 a minute ago; 12 failed two days ago, 3 an hour ago.
/// With `holder` (a session of the test's own), the table's retention lock is held there
/// first: two brokers delete nothing until it is released. Then three brokers delete the 37
/// old rows, 10 per statement, and keep the 8 young ones.
pub async fn retention_deletes_old_marked_rows<D: TestDb>(
    db: &D,
    holder: Option<<D::DB as sqlx::Database>::Connection>,
) where
    SqlxBroker<D::DB>: ruststream::adapter::TakesRows<Kept>,
    for<'c> &'c mut <D::DB as sqlx::Database>::Connection: sqlx::Executor<'c, Database = D::DB>,
{
    let dialect = db.dialect();
    db.exec(schema(dialect)).await;
    insert_marked(db, 25, "processed_at", 2 * HOUR).await;
    insert_marked(db, 5, "processed_at", 60).await;
    insert_marked(db, 12, "failed_at", 2 * DAY).await;
    insert_marked(db, 3, "failed_at", HOUR).await;
    assert_eq!(count(db, "1 = 1").await, 45);

    let desc: TableDesc = *<Kept as ruststream::InboxTable>::TABLE.desc();
    let statements = Statements::retention(core_dialect(dialect), &desc, 10);
    let mut brokers = Vec::new();
    if let Some(mut holder) = holder {
        let lock = statements.try_lock.expect("a server takes a lock");
        let unlock = statements.unlock.expect("and releases it");
        sqlx::raw_sql(AssertSqlSafe(lock.sql.to_string()))
            .execute(&mut holder)
            .await
            .expect("the test's session takes the retention lock");
        for _ in 0..2 {
            brokers.push(
                db.broker()
                    .start([retaining::<D::DB>()])
                    .await
                    .expect("the broker starts"),
            );
        }
        // Some ten runs of each broker's retention, each finding the lock taken.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            count(db, "1 = 1").await,
            45,
            "{dialect:?}: no broker deletes while another session holds the lock"
        );
        sqlx::raw_sql(AssertSqlSafe(unlock.sql.to_string()))
            .execute(&mut holder)
            .await
            .expect("the test's session releases the lock");
        holder.close().await.ok();
    }
    while brokers.len() < 3 {
        brokers.push(
            db.broker()
                .start([retaining::<D::DB>()])
                .await
                .expect("the broker starts"),
        );
    }
    eventually("the old marked rows are deleted", || async {
        count(db, "1 = 1").await == 8
    })
    .await;
    // A little longer: the runs that follow delete nothing more.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        count(db, "processed_at IS NOT NULL").await,
        5,
        "{dialect:?}"
    );
    assert_eq!(count(db, "failed_at IS NOT NULL").await, 3, "{dialect:?}");
    for broker in brokers {
        broker.shutdown().await;
    }
}

/// The seconds of a tick since the epoch: the number its message carries.
fn seconds(tick: SystemTime) -> u32 {
    let secs = tick
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs();
    u32::try_from(secs).expect("fits until 2106")
}

/// A subscription of `ticks`, recording what it handles, and publishing one row a second when
/// `periodic`.
fn ticking<DB: SqlxDatabase>(seen: &Seen, periodic: bool) -> Subscription<SqlxBroker<DB>>
where
    SqlxBroker<DB>: ruststream::adapter::TakesRows<TickRow>,
{
    let mut builder = ruststream::subscriber("ticks", Record::new(seen, &Gate::open()))
        .map_source(|_| InboxQueue::<TickRow>::new("ticks"))
        .poll_interval(POLL);
    if periodic {
        let schedule = Schedule::cron("* * * * * *").expect("every second");
        builder = builder.periodic(
            Periodic::new("every-second", schedule, |tick| {
                Message::json(&Job { n: seconds(tick) })
            })
            .catch_up(10),
        );
    }
    builder.into_subscription()
}

/// Three brokers, each with the schedule, for `run`; then all shut down.
async fn three_brokers_for<D: TestDb>(db: &D, seen: &Seen, run: Duration)
where
    SqlxBroker<D::DB>: ruststream::adapter::TakesRows<TickRow>,
{
    let mut brokers = Vec::new();
    for _ in 0..3 {
        brokers.push(
            db.broker()
                .start([ticking::<D::DB>(seen, true)])
                .await
                .expect("the broker starts"),
        );
    }
    tokio::time::sleep(run).await;
    for broker in brokers {
        broker.shutdown().await;
    }
}

/// Three brokers on one every-second schedule for 5 s, stopped for 2.5 s, then three again for
/// 3 s: the rows' ticks are consecutive seconds, each once, across the stop.
pub async fn periodic_jobs_publish_each_tick_once<D: TestDb>(db: &D)
where
    SqlxBroker<D::DB>: ruststream::adapter::TakesRows<TickRow>,
{
    let dialect = db.dialect();
    db.exec(schema(dialect)).await;
    let seen = Seen::default();
    three_brokers_for(db, &seen, Duration::from_secs(5)).await;
    let stopped = seconds(SystemTime::now());
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let restarted = seconds(SystemTime::now());
    three_brokers_for(db, &seen, Duration::from_secs(3)).await;

    // A broker without the schedule handles the rows still waiting.
    let drain = db
        .broker()
        .start([ticking::<D::DB>(&seen, false)])
        .await
        .expect("the broker starts");
    eventually("every tick's row is handled", || async {
        db.scalar("SELECT COUNT(*) FROM ticks WHERE processed_at IS NULL")
            .await
            == 0
    })
    .await;
    drain.shutdown().await;

    let counts = seen.counts();
    let doubled: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubled.is_empty(),
        "{dialect:?}: ticks doubled: {doubled:?}"
    );
    let ticks: Vec<u32> = counts.keys().copied().collect();
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM ticks").await,
        i64::try_from(ticks.len()).expect("few"),
        "{dialect:?}: one row per tick"
    );
    let (first, last) = (ticks[0], ticks[ticks.len() - 1]);
    assert_eq!(
        ticks,
        (first..=last).collect::<Vec<_>>(),
        "{dialect:?}: no tick missed"
    );
    assert!(ticks.len() >= 9, "{dialect:?}: ticks over 10 s: {ticks:?}");
    assert!(
        first < stopped && last > restarted,
        "{dialect:?}: the ticks span the stop ({stopped}..{restarted}): {ticks:?}"
    );
    assert!(
        (stopped + 1..restarted).all(|t| ticks.contains(&t)),
        "{dialect:?}: the ticks missed while stopped are published: {ticks:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_postgres() {
    let db = Pg::new("pg_retention").await;
    let holder = sqlx::PgConnection::connect_with(&db.options)
        .await
        .expect("a session of the test's own");
    retention_deletes_old_marked_rows(&db, Some(holder)).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_mariadb() {
    let db = My::new("my_retention").await;
    let holder = sqlx::MySqlConnection::connect_with(&db.options)
        .await
        .expect("a session of the test's own");
    retention_deletes_old_marked_rows(&db, Some(holder)).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_sqlite() {
    let db = Lite::new("lite_retention").await;
    retention_deletes_old_marked_rows(&db, None).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_postgres() {
    let db = Pg::new("pg_periodic").await;
    periodic_jobs_publish_each_tick_once(&db).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_mariadb() {
    let db = My::new("my_periodic").await;
    periodic_jobs_publish_each_tick_once(&db).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_sqlite() {
    let db = Lite::new("lite_periodic").await;
    periodic_jobs_publish_each_tick_once(&db).await;
    db.drop().await;
}

/// The environment a child process of `periodic_processes_postgres` reads: the broker's URL,
/// and how long it runs, in milliseconds.
const CHILD_URL: &str = "RUSTSTREAM_PERIODIC_CHILD_URL";
const CHILD_MS: &str = "RUSTSTREAM_PERIODIC_CHILD_MS";

/// One process of `periodic_processes_postgres`: a broker with the every-second schedule on
/// the URL the parent gives, for as long as it says, then a shutdown. Run by that test as a
/// child process (this test binary again); alone it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of periodic_processes_postgres"]
async fn periodic_child() {
    let (Ok(url), Ok(ms)) = (std::env::var(CHILD_URL), std::env::var(CHILD_MS)) else {
        return;
    };
    let options: sqlx::postgres::PgConnectOptions = url.parse().expect("the parent's URL");
    let broker = SqlxBroker::from_connect_options(
        options,
        sqlx::postgres::PgPoolOptions::new().max_connections(4),
    );
    let seen = Seen::default();
    let running = broker
        .start([ticking::<sqlx::Postgres>(&seen, true)])
        .await
        .expect("the broker starts");
    tokio::time::sleep(Duration::from_millis(ms.parse().expect("milliseconds"))).await;
    running.shutdown().await;
}

/// Three processes on one every-second schedule for 5 s, all stopped for 2.5 s, then three
/// again for 3 s: the table holds one row per tick, consecutive seconds across the stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_processes_postgres() {
    let db = Pg::new("pg_periodic_procs").await;
    db.exec(schema(Dialect::Postgres)).await;
    let url = db.broker_url();
    let run = |ms: u64| {
        let children: Vec<std::process::Child> = (0..3)
            .map(|_| {
                std::process::Command::new(std::env::current_exe().expect("the test binary"))
                    .args(["--exact", "maintenance::periodic_child", "--ignored"])
                    .env(CHILD_URL, &url)
                    .env(CHILD_MS, ms.to_string())
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect("a child process")
            })
            .collect();
        for mut child in children {
            assert!(child.wait().expect("it ends").success(), "a child failed");
        }
    };
    run(5_000);
    let stopped = seconds(SystemTime::now());
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let restarted = seconds(SystemTime::now());
    run(3_000);

    let payloads: Vec<Vec<u8>> = sqlx::query_scalar("SELECT payload FROM ticks ORDER BY id")
        .fetch_all(&db.admin)
        .await
        .expect("the rows");
    let mut ticks: Vec<u32> = payloads
        .iter()
        .map(|p| {
            serde_json::from_slice::<Job>(p)
                .expect("a tick's message")
                .n
        })
        .collect();
    let rows = ticks.len();
    ticks.sort_unstable();
    ticks.dedup();
    assert_eq!(
        ticks.len(),
        rows,
        "no tick doubled across processes: {ticks:?}"
    );
    let (first, last) = (ticks[0], ticks[ticks.len() - 1]);
    assert_eq!(ticks, (first..=last).collect::<Vec<_>>(), "no tick missed");
    assert!(ticks.len() >= 9, "ticks over 10 s: {ticks:?}");
    assert!(
        first < stopped && last > restarted,
        "the ticks span the stop ({stopped}..{restarted}): {ticks:?}"
    );
    db.drop().await;
}

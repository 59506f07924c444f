//! A service on tokio over a real SQLite file: publish, handle, settle, retry, rows that do
//! not decode, the custom lock, and the shutdown.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use ruststream::exec::{Executor, Tokio};
use ruststream_core::{
    Action, Command, CommandId, ConnId, Dialect, ErrorKind, Reply, StatementKind, Value,
};
use ruststream_rusqlite::CustomLock;
use ruststream_rusqlite::prelude::*;
use ruststream_rusqlite::rusqlite::{self, Connection};
use serde::{Deserialize, Serialize};

const WAIT: Duration = Duration::from_secs(20);

fn acquire() -> Command {
    Command {
        id: CommandId(u64::MAX),
        conn: ConnId(u64::MAX),
        action: Action::Acquire,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_handles_and_settles_both_forms() {
    let db = Db::new("settles");
    settles_both_forms(&db, RusqliteBroker::open(&db.path)).await;
}

/// A task that never looks for an answer before it waits gets every answer by its wake-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_handles_and_settles_both_forms_without_looking_for_answers() {
    let db = Db::new("settles_woken");
    settles_both_forms(
        &db,
        RusqliteBroker::open(&db.path).look_for_answer(Duration::ZERO),
    )
    .await;
}

async fn settles_both_forms(db: &Db, broker: RusqliteBroker) {
    const N: u32 = 12;
    db.schema();
    let broker = broker.handle();
    let videos = broker.publisher::<VideoJob>();
    let exports = broker.publisher::<ExportJob>();
    let early = videos
        .publish(
            Message::json(&Video { n: 99 })
                .unwrap()
                .column("channel", Value::Int(1)),
        )
        .await;
    assert!(
        matches!(early, Err(PublishError::Closed)),
        "a publisher answers Closed before the service starts: {early:?}"
    );

    let (seen_videos, seen_exports) = (Seen::default(), Seen::default());
    let service = service(&broker, |b| {
        include_both(b, Record::new(&seen_videos), Record::new(&seen_exports))
    });
    let stop = async {
        for n in 0..N {
            let message = Message::json(&Video { n }).unwrap();
            videos
                .publish(
                    message
                        .clone()
                        .column("channel", Value::Int(i64::from(n % 3))),
                )
                .await
                .unwrap();
            exports.publish(message).await.unwrap();
        }
        eventually(&Tokio, WAIT, || {
            seen_videos.len() >= N as usize && seen_exports.len() >= N as usize
        })
        .await;
    };
    service.run_until(stop).await.unwrap();

    let all: Vec<u32> = (0..N).collect();
    assert_eq!(seen_videos.messages(), all);
    assert_eq!(seen_exports.messages(), all);
    assert!(
        seen_videos
            .all()
            .iter()
            .chain(&seen_exports.all())
            .all(|(_, attempt)| *attempt == 1),
        "one attempt each"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM video_jobs"),
        0,
        "acknowledged rows are deleted"
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM exports"), i64::from(N));
    assert_eq!(
        db.count(
            "SELECT COUNT(*) FROM exports \
             WHERE processed_at IS NOT NULL AND locked_until IS NULL AND attempt = 1"
        ),
        i64::from(N),
        "acknowledged lease rows are marked processed, their lease cleared"
    );

    // The pool it built is closed: nothing open, no connection lent.
    let adapter = broker.adapter();
    assert!(adapter.is_closed());
    assert_eq!(adapter.open_connections(), 0);
    match ruststream::adapter::Adapter::execute(adapter, acquire(), None).await {
        Reply::Failed(error) => assert_eq!(error.kind, ErrorKind::PoolClosed, "{error}"),
        other => panic!("an acquire after the close answers {other:?}"),
    }
    // A publisher kept past the shutdown refuses, and writes nothing.
    let late = exports
        .publish(Message::json(&Video { n: 100 }).unwrap())
        .await;
    assert!(matches!(late, Err(PublishError::Closed)), "{late:?}");
    assert_eq!(db.count("SELECT COUNT(*) FROM exports"), i64::from(N));
    assert_eq!(db.count("SELECT COUNT(*) FROM video_jobs"), 0);
    let journal: String = db
        .conn()
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .unwrap();
    assert_eq!(journal, "wal", "the broker put the file into WAL mode");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_returns_the_row_and_counts_the_attempt() {
    const N: u32 = 4;
    let db = Db::new("retry");
    db.schema();
    let broker = RusqliteBroker::open(&db.path).handle();
    let videos = broker.publisher::<VideoJob>();
    let exports = broker.publisher::<ExportJob>();
    let (seen_videos, seen_exports) = (Seen::default(), Seen::default());
    let service = service(&broker, |b| {
        include_both(
            b,
            Record::retrying(&seen_videos),
            Record::retrying(&seen_exports),
        )
    });
    let stop = async {
        for n in 0..N {
            let message = Message::json(&Video { n }).unwrap();
            videos
                .publish(message.clone().column("channel", Value::Int(i64::from(n))))
                .await
                .unwrap();
            exports.publish(message).await.unwrap();
        }
        eventually(&Tokio, WAIT, || {
            seen_videos.len() >= 2 * N as usize && seen_exports.len() >= 2 * N as usize
        })
        .await;
    };
    service.run_until(stop).await.unwrap();

    let expected: Vec<(u32, i64)> = (0..N).flat_map(|n| [(n, 1), (n, 2)]).collect();
    assert_eq!(
        seen_videos.all(),
        expected,
        "each message twice: attempt 1, then 2"
    );
    assert_eq!(seen_exports.all(), expected);
    assert_eq!(db.count("SELECT COUNT(*) FROM video_jobs"), 0);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM exports WHERE processed_at IS NOT NULL AND attempt = 2"),
        i64::from(N),
        "the second take counted the second attempt, and the acknowledgement settled it"
    );
}

/// On tables that keep no failed rows (no `failed_at` column), rows that do not decode are
/// never handed and never deleted: they stay in the queue, as retries. (The rows behind them
/// in SQLite's advisory form, which reads the first due rows alone, wait: such a table names
/// a `failed_at` column to keep them out of the way.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_that_do_not_decode_stay_without_the_handler() {
    let db = Db::new("reject");
    db.schema();
    let broker = RusqliteBroker::open(&db.path).handle();
    let videos = broker.publisher::<VideoJob>();
    let exports = broker.publisher::<ExportJob>();
    let (seen_videos, seen_exports) = (Seen::default(), Seen::default());
    let service = service(&broker, |b| {
        include_both(b, Record::new(&seen_videos), Record::new(&seen_exports))
    });
    let stop = async {
        let good = Message::json(&Video { n: 7 }).unwrap();
        videos
            .publish(good.clone().column("channel", Value::Int(2)))
            .await
            .unwrap();
        exports.publish(good).await.unwrap();
        eventually(&Tokio, WAIT, || {
            seen_videos.len() >= 1 && seen_exports.len() >= 1
        })
        .await;
        // A row whose attempt outgrows the row type's i16 once taken, and payloads that are
        // not JSON: none decodes.
        db.execute(
            "INSERT INTO video_jobs (channel, attempt, payload) VALUES (5, 32767, CAST('{\"n\":50}' AS BLOB))",
        );
        let garbage = Message::bytes(b"not json".to_vec());
        videos
            .publish(garbage.clone().column("channel", Value::Int(1)))
            .await
            .unwrap();
        exports.publish(garbage).await.unwrap();
        eventually(&Tokio, WAIT, || {
            db.count("SELECT COUNT(*) FROM video_jobs WHERE attempt > 32768") == 1
                && db.count(
                    "SELECT COUNT(*) FROM exports WHERE processed_at IS NULL AND attempt >= 1",
                ) == 1
        })
        .await;
    };
    service.run_until(stop).await.unwrap();

    assert_eq!(
        seen_videos.all(),
        vec![(7, 1)],
        "the handler saw only the good message"
    );
    assert_eq!(seen_exports.all(), vec![(7, 1)]);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM video_jobs"),
        2,
        "the undecodable rows stay in the table: no row leaves it but by an acknowledgement"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM exports WHERE processed_at IS NULL"),
        1,
        "the undecodable export stays unsettled"
    );
}

/// One row of `payouts`, held by its account's key in `held_keys` (the custom lock example).
#[derive(Debug, Deserialize)]
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

/// Billing holds an account's key in `held_keys` while it changes the account.
impl Lock for Payout {
    fn lock(conn: &Connection, key: &str) -> rusqlite::Result<bool> {
        let taken = conn.execute("INSERT OR IGNORE INTO held_keys (key) VALUES (?1)", [key])?;
        Ok(taken == 1)
    }
}

impl Unlock for Payout {
    fn unlock(conn: &Connection, key: &str) -> rusqlite::Result<bool> {
        let released = conn.execute("DELETE FROM held_keys WHERE key = ?1", [key])?;
        Ok(released == 1)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Transfer {
    account: i64,
    cents: i64,
}

/// Records each payout, and whether its key was in `held_keys` while it ran.
#[derive(Clone)]
struct Pay {
    db: Arc<std::path::PathBuf>,
    paid: Arc<std::sync::Mutex<Vec<(i64, bool)>>>,
}

impl Handle<Transfer> for Pay {
    async fn handle(
        &self,
        transfer: &Transfer,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        let path = self.db.clone();
        let key = format!("accounts-{}", transfer.account);
        let held = tokio::task::spawn_blocking(move || {
            let conn = Connection::open(&*path).unwrap();
            conn.busy_timeout(Duration::from_secs(10)).unwrap();
            conn.query_row(
                "SELECT COUNT(*) FROM held_keys WHERE key = ?1",
                [key],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
                == 1
        })
        .await
        .unwrap();
        self.paid.lock().unwrap().push((transfer.account, held));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_billing_holds_keeps_its_payout_waiting() {
    let db = Db::new("custom_lock");
    db.schema();
    // Billing holds account 7's key.
    db.execute("INSERT INTO held_keys (key) VALUES ('accounts-7')");
    let broker = RusqliteBroker::open(&db.path).handle();
    let payouts = broker.publisher::<Payout>();
    let pay = Pay {
        db: Arc::new(db.path.clone()),
        paid: Arc::default(),
    };
    let paid = pay.paid.clone();
    let service = service(&broker, |b| {
        b.include(
            subscriber("payouts", pay)
                .map_source(|_| InboxQueue::<Payout>::new("payouts"))
                .poll_interval(POLL)
                .build(),
        );
    });
    let paid_accounts = || {
        paid.lock()
            .unwrap()
            .iter()
            .map(|(a, _)| *a)
            .collect::<Vec<_>>()
    };
    let stop = async {
        for account in [8, 7] {
            let transfer = Transfer {
                account,
                cents: 100,
            };
            payouts
                .publish(
                    Message::json(&transfer)
                        .unwrap()
                        .column("account_id", Value::Int(account)),
                )
                .await
                .unwrap();
        }
        assert!(
            eventually(&Tokio, WAIT, || paid_accounts() == [8]).await,
            "account 8's payout runs"
        );
        // Many poll intervals later, account 7's payout still waits for billing.
        Tokio.sleep(POLL * 20).await;
        assert_eq!(
            paid_accounts(),
            [8],
            "account 7's payout waits while billing holds its key"
        );
        assert_eq!(
            db.count("SELECT COUNT(*) FROM payouts WHERE account_id = 7"),
            1
        );
        assert_eq!(db.count("SELECT COUNT(*) FROM held_keys"), 1);
        // Billing releases the key: the payout runs.
        db.execute("DELETE FROM held_keys WHERE key = 'accounts-7'");
        assert!(
            eventually(&Tokio, WAIT, || paid_accounts() == [8, 7]).await,
            "account 7's payout runs once billing released its key"
        );
        eventually(&Tokio, WAIT, || {
            db.count("SELECT COUNT(*) FROM held_keys") == 0
        })
        .await;
    };
    service.run_until(stop).await.unwrap();

    assert_eq!(
        *paid.lock().unwrap(),
        [(8, true), (7, true)],
        "each payout ran while the custom lock held its key in held_keys"
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM payouts"), 0);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM held_keys"),
        0,
        "the custom unlock released every key"
    );
}

/// Takes its time, and counts the handlers that started and finished.
#[derive(Clone, Default)]
struct Slow {
    started: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
}

impl Handle<Video> for Slow {
    async fn handle(
        &self,
        _video: &Video,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.finished.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_until_drains_then_closes_the_pool() {
    const N: i64 = 6;
    let db = Db::new("shutdown");
    db.schema();
    let broker = RusqliteBroker::open(&db.path).max_connections(4).handle();
    let exports = broker.publisher::<ExportJob>();
    let slow = Slow::default();
    let (started, finished) = (slow.started.clone(), slow.finished.clone());
    let service = service(&broker, |b| {
        b.include(
            subscriber("exports", slow)
                .map_source(|_| InboxQueue::<ExportJob>::new("exports"))
                .workers(nonzero!(2))
                .poll_interval(POLL)
                .build(),
        );
    });
    let stop = async {
        for n in 0..N as u32 {
            exports
                .publish(Message::json(&Video { n }).unwrap())
                .await
                .unwrap();
        }
        // Stop while handlers are in work.
        eventually(&Tokio, WAIT, || started.load(Ordering::SeqCst) >= 1).await;
    };
    service.run_until(stop).await.unwrap();

    let done = finished.load(Ordering::SeqCst);
    assert_eq!(
        started.load(Ordering::SeqCst),
        done,
        "run_until returned after the handlers in work finished"
    );
    assert!(
        (1..N as usize).contains(&done),
        "{done} handled before the stop"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM exports WHERE processed_at IS NOT NULL"),
        done as i64,
        "every handled row is settled"
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM exports"), N);
    assert!(broker.adapter().is_closed());
    assert_eq!(broker.adapter().open_connections(), 0, "the pool is closed");

    let late = exports
        .publish(Message::json(&Video { n: 100 }).unwrap())
        .await;
    assert!(matches!(late, Err(PublishError::Closed)), "{late:?}");
    assert_eq!(
        db.count("SELECT COUNT(*) FROM exports"),
        N,
        "no row written past the shutdown"
    );
}

/// The rusqlite broker, whose first lease claim panics inside its future.
struct PanicsOnce {
    inner: RusqliteBroker,
    panicked: Arc<AtomicUsize>,
}

impl ruststream::adapter::Adapter for PanicsOnce {
    type Row = RusqliteRow;
    type Lock = CustomLock;

    fn start(
        &self,
    ) -> ruststream::exec::BoxFuture<Result<Dialect, ruststream::adapter::AdapterError>> {
        ruststream::adapter::Adapter::start(&self.inner)
    }

    fn execute(
        &self,
        command: Command,
        lock: Option<CustomLock>,
    ) -> ruststream::exec::BoxFuture<Reply<RusqliteRow>> {
        let claim = matches!(
            &command.action,
            Action::Execute { statement, .. } if statement.kind == StatementKind::ClaimLease
        );
        if claim && self.panicked.fetch_add(1, Ordering::SeqCst) == 0 {
            return Box::pin(async { panic!("the first lease claim panics") });
        }
        self.inner.execute(command, lock)
    }

    fn close(&self) -> ruststream::exec::BoxFuture<()> {
        self.inner.close()
    }
}

impl ruststream::adapter::TakesRows<ExportJob> for PanicsOnce {
    fn decode(row: RusqliteRow) -> Result<ExportJob, String> {
        <RusqliteBroker as ruststream::adapter::TakesRows<ExportJob>>::decode(row)
    }

    fn custom_lock() -> Option<CustomLock> {
        <RusqliteBroker as ruststream::adapter::TakesRows<ExportJob>>::custom_lock()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_future_panics_fails_and_the_service_goes_on() {
    let db = Db::new("panics");
    db.schema();
    let panicked = Arc::new(AtomicUsize::new(0));
    let broker = BrokerHandle::new(PanicsOnce {
        inner: RusqliteBroker::open(&db.path),
        panicked: panicked.clone(),
    });
    let exports = broker.publisher::<ExportJob>();
    let seen = Seen::default();
    let service = RustStream::new(AppInfo::new("rusqlite-tests", "0.1.0"))
        .shutdown_timeout(Duration::from_secs(10))
        .with_broker(broker.clone(), |b| {
            b.include(
                subscriber("exports", Record::new(&seen))
                    .map_source(|_| InboxQueue::<ExportJob>::new("exports"))
                    .poll_interval(POLL)
                    .build(),
            );
        });
    let stop = async {
        exports
            .publish(Message::json(&Video { n: 7 }).unwrap())
            .await
            .unwrap();
        eventually(&Tokio, WAIT, || seen.len() == 1).await;
    };
    service.run_until(stop).await.unwrap();
    assert!(
        panicked.load(Ordering::SeqCst) >= 2,
        "the claim that panicked was followed by another"
    );
    assert_eq!(seen.all(), [(7, 1)], "the next claim took the row");
    assert_eq!(
        db.count("SELECT COUNT(*) FROM exports WHERE processed_at IS NOT NULL"),
        1
    );
}

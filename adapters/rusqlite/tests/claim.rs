//! A handler takes a transaction on its delivery's connection (`RusqliteClaim`) in the
//! advisory lock form, and runs its writes in it on the connection's thread: they commit with
//! the acknowledgement, roll back with a retry, and are gone with a process killed between the
//! write and the commit. Both or neither, never one.
//!
//! The kill: the test binary runs again as a child (`RS_RUSQLITE_CLAIM_CHILD` names the
//! database file), whose handler writes its effect in the claim's transaction, creates a marker
//! file (SQLite's write lock is the transaction's until it ends), and waits; the parent kills it
//! with SIGKILL once the marker is there.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ruststream::{FromContext, RetryPolicy};
use ruststream_rusqlite::prelude::*;
use ruststream_rusqlite::rusqlite::Connection;
use ruststream_rusqlite::{RusqliteClaim, rusqlite};
use serde::{Deserialize, Serialize};

const CHILD: &str = "RS_RUSQLITE_CLAIM_CHILD";

/// A row of `jobs`, held by its key while in work.
#[derive(Inbox, Deserialize)]
#[inbox(table = "jobs", advisory_lock = "jobs-{k}")]
struct Job {
    #[field(id, generated)]
    id: i64,
    k: i64,
    #[field(attempt, generated)]
    attempt: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct Work {
    n: i64,
}

/// Writes `effects (n, attempt)` in the claim's transaction; then waits to be killed (the
/// child, marking it first), retries the attempts below `retry_below`, or acknowledges.
struct Effect {
    marker: Option<PathBuf>,
    retry_below: i64,
    handled: Arc<AtomicUsize>,
}

impl Handle<Work, (), (), InboxContext> for Effect {
    async fn handle(
        &self,
        work: &Work,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let attempt = ctx.kind().info().attempt.unwrap_or(0);
        let claim = RusqliteClaim::from_context(ctx).await?;
        let n = work.n;
        // A second attempt's write would break the primary key if the first one's stayed.
        claim
            .call(move |conn: &mut rusqlite::Connection| {
                conn.execute(
                    "INSERT INTO effects (n, attempt) VALUES (?1, ?2)",
                    [n, attempt],
                )
            })
            .await
            .ok_or_else(|| HandlerOutcome::retry().with_error("the connection's thread ended"))?
            .map_err(|e| HandlerOutcome::retry().with_error(e))?;
        if let Some(marker) = &self.marker {
            std::fs::write(marker, b"written").expect("the marker");
            tokio::time::sleep(Duration::from_secs(600)).await;
        }
        self.handled.fetch_add(1, Ordering::SeqCst);
        if attempt < self.retry_below {
            return Err(HandlerOutcome::retry().with_error("not yet"));
        }
        Ok(())
    }
}

fn service(path: &Path, effect: Effect) -> RustStream {
    let broker = RusqliteBroker::open(path);
    RustStream::new(AppInfo::new("claims", "0.1.0")).with_broker(broker, move |b| {
        let sub = subscriber("claims", effect)
            .map_source(|_| InboxQueue::<Job>::new("claims"))
            .poll_interval(Duration::from_millis(50))
            .retry_policy(RetryPolicy::immediate());
        b.include(sub.build());
    })
}

fn count(path: &Path, sql: &str) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

async fn until(what: &str, check: impl Fn() -> bool) {
    let since = Instant::now();
    while !check() {
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_in_the_claim_commit_with_the_acknowledgement() {
    if let Ok(path) = std::env::var(CHILD) {
        let path = PathBuf::from(path);
        let marker = path.with_extension("marker");
        let effect = Effect {
            marker: Some(marker),
            retry_below: 0,
            handled: Arc::default(),
        };
        let _ = service(&path, effect)
            .run_until(tokio::time::sleep(Duration::from_secs(60)))
            .await;
        eprintln!("the child was not killed within a minute");
        std::process::exit(3);
    }
    let dir = std::env::temp_dir().join(format!("ruststream-claim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("claim.db");
    let _ = std::fs::remove_file(&path);
    Connection::open(&path)
        .unwrap()
        .execute_batch(
            "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, k INTEGER NOT NULL,
                 attempt INTEGER NOT NULL DEFAULT 0, payload BLOB NOT NULL);
             CREATE TABLE effects (n INTEGER PRIMARY KEY, attempt INTEGER NOT NULL);",
        )
        .unwrap();
    let payload = serde_json::to_vec(&Work { n: 1 }).unwrap();
    Connection::open(&path)
        .unwrap()
        .execute("INSERT INTO jobs (k, payload) VALUES (1, ?1)", [payload])
        .unwrap();

    // The child writes in the claim's transaction and is killed before the commit.
    let marker = path.with_extension("marker");
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "writes_in_the_claim_commit_with_the_acknowledgement",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD, &path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the child starts");
    until("the child's handler wrote in its claim", || marker.exists()).await;
    child.kill().expect("SIGKILL");
    child.wait().expect("the child ends");
    assert_eq!(
        count(&path, "SELECT COUNT(*) FROM effects"),
        0,
        "the killed child's write is gone with its transaction"
    );
    assert_eq!(
        count(&path, "SELECT COUNT(*) FROM jobs"),
        1,
        "the row stays"
    );

    // A service whose handler writes and retries, then writes and acknowledges.
    let handled = Arc::new(AtomicUsize::new(0));
    let effect = Effect {
        marker: None,
        retry_below: 3,
        handled: handled.clone(),
    };
    service(&path, effect)
        .run_until(until("the row is settled", || {
            count(&path, "SELECT COUNT(*) FROM jobs") == 0
        }))
        .await
        .expect("the service runs");
    assert_eq!(handled.load(Ordering::SeqCst), 2, "attempts 2 and 3");
    assert_eq!(
        count(
            &path,
            "SELECT COUNT(*) FROM effects WHERE n = 1 AND attempt = 3"
        ),
        1,
        "the acknowledged attempt's write, once"
    );
    assert_eq!(
        count(&path, "SELECT COUNT(*) FROM effects"),
        1,
        "nothing of the killed attempt or the retried one"
    );
    let _ = std::fs::remove_dir_all(dir);
}

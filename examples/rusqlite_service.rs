//! A service on SQLite with rusqlite: exports of accounts, one account at a time, written with
//! the macros. It runs until SIGINT or SIGTERM, then lets the exports in work finish, releases
//! every key, and closes its connections.
//!
//! ```sh
//! cargo run --example rusqlite_service
//! ```
//!
//! `RUSTSTREAM_EXAMPLE_DB` names the SQLite file (default `target/rusqlite_service.db`);
//! `RUSTSTREAM_EXAMPLE_JOBS` publishes that many exports at startup (default 20).

use std::path::PathBuf;
use std::time::Duration;

use ruststream::Job;
use ruststream::core::Dialect;
use ruststream_rusqlite::prelude::*;
use ruststream_rusqlite::rusqlite::Connection;
use serde::{Deserialize, Serialize};

/// One row of `exports`, held by the key of its account while it is in work.
#[derive(Inbox, Deserialize)]
#[inbox(
    table = "exports",
    advisory_lock = "exports-{account}",
    failed_at = "failed_at",
    error = "error"
)]
pub struct Export {
    #[field(id, generated)]
    id: i64,
    account: i64,
    #[field(attempt, generated)]
    attempt: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The message: which account to export.
#[derive(Serialize, Deserialize)]
pub struct Report {
    /// The account.
    pub account: i64,
}

/// An export takes a while; the key of its account is held meanwhile. `Ok` acknowledges the
/// job; an error retries it, up to the fifth attempt.
#[subscriber(InboxQueue::<Export>::new("exports"))]
async fn export(report: &Report, job: Job<Export>) -> Result<(), BoxError> {
    tracing::info!(report.account, attempt = job.attempt(), "exporting");
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("exported account {}", report.account);
    Ok(())
}

fn path() -> PathBuf {
    std::env::var_os("RUSTSTREAM_EXAMPLE_DB")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/rusqlite_service.db"))
}

/// The service on the SQLite file at `path`; it publishes `jobs` exports once it runs.
fn service(path: PathBuf, jobs: i64) -> RustStream {
    let schema = path.clone();
    let broker = RusqliteBroker::open(&path).handle();
    let publisher = broker.publisher::<Export>();
    RustStream::new(AppInfo::new("exports", "0.1.0"))
        .shutdown_timeout(Duration::from_secs(10))
        // The table, created before the subscription checks it.
        .on_startup(async move || {
            if let Some(dir) = schema.parent() {
                std::fs::create_dir_all(dir)?;
            }
            // As the description writes it; `account`, a key's column, holds integers.
            let ddl = Export::TABLE
                .ddl(Dialect::Sqlite)
                .column_type("account", "INTEGER NOT NULL");
            Connection::open(&schema)?.execute_batch(&ddl.to_string())?;
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        })
        .on_started(async move || {
            for account in 0..jobs {
                let message = Message::json(&Report { account })?.column("account", account % 4);
                publisher.publish(message).await?;
            }
            println!("published {jobs} exports");
            Ok::<(), PublishError>(())
        })
        .with_broker(broker, |b| {
            b.include(export.workers(2).max_attempts(5));
        })
}

#[ruststream::app]
fn app() -> impl App {
    let jobs = std::env::var("RUSTSTREAM_EXAMPLE_JOBS")
        .ok()
        .and_then(|j| j.parse().ok())
        .unwrap_or(20);
    service(path(), jobs)
}

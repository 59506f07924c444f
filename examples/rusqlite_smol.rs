//! A service on smol, with no tokio runtime: the rusqlite adapter's connections run on threads
//! of their own and answer through channels any executor can wait on. Handlers run on smol's
//! global executor (`SMOL_THREADS` threads, one by default); the main thread drives the
//! service with `smol::block_on`.
//!
//! ```sh
//! cargo run --example rusqlite_smol
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ruststream::core::Dialect;
use ruststream::exec::Smol;
use ruststream_rusqlite::prelude::*;
use ruststream_rusqlite::rusqlite::Connection;
use serde::{Deserialize, Serialize};

/// One row of `emails`, in the lease form.
#[derive(Inbox, Deserialize)]
#[inbox(table = "emails", failed_at = "failed_at", error = "error")]
pub struct Email {
    #[field(id, generated)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i64,
    #[field(locked_until)]
    locked_until: Option<i64>,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The message: an email to send.
#[derive(Serialize, Deserialize)]
pub struct Send {
    /// Its number.
    pub n: u64,
}

/// Sends an email: here, waits a moment on smol's timer and counts it.
struct Mailer(Arc<AtomicU64>);

impl Handle<Send> for Mailer {
    async fn handle(&self, _: &Send, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        smol::Timer::after(Duration::from_millis(1)).await;
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Publishes `jobs` emails into the SQLite file at `path` and sends them on smol;
/// answers how many were sent.
pub fn run(
    path: &Path,
    jobs: u64,
) -> Result<u64, Box<dyn std::error::Error + std::marker::Send + Sync>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // The table anew, as its description writes it.
    let conn = Connection::open(path)?;
    conn.execute_batch("DROP TABLE IF EXISTS emails")?;
    conn.execute_batch(&Email::TABLE.ddl(Dialect::Sqlite).to_string())?;
    drop(conn);
    let sent = Arc::new(AtomicU64::new(0));
    let broker = RusqliteBroker::open(path).handle();
    let publisher = broker.publisher::<Email>();
    let mailer = subscriber("emails", Mailer(sent.clone()))
        .map_source(|_| InboxQueue::<Email>::new("emails"))
        .workers(nonzero!(4));
    let service = RustStream::new(AppInfo::new("mailer", "0.1.0"))
        .executor(Arc::new(Smol))
        .on_started(async move |()| {
            for n in 0..jobs {
                publisher.publish(Message::json(&Send { n })?).await?;
            }
            Ok::<(), PublishError>(())
        })
        .with_broker(broker, |b| {
            b.include(mailer.build());
        });
    let done = sent.clone();
    smol::block_on(service.run_until(async move {
        while done.load(Ordering::SeqCst) < jobs {
            smol::Timer::after(Duration::from_millis(5)).await;
        }
    }))?;
    Ok(sent.load(Ordering::SeqCst))
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    match run(&PathBuf::from("target/rusqlite_smol.db"), 200) {
        Ok(sent) => {
            println!("{sent} emails sent on smol");
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

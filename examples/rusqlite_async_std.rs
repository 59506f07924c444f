//! A service on async-std, with no tokio runtime: the rusqlite adapter's connections run on
//! threads of their own and answer through channels any executor can wait on. async-std is
//! discontinued upstream in favour of smol: `examples/rusqlite_smol.rs` is this service on smol.
//!
//! ```sh
//! cargo run --example rusqlite_async_std
//! ```

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ruststream::core::Dialect;
use ruststream::exec::AsyncStd;
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

/// Sends an email: here, waits a moment on async-std's timer, counts it and says so.
struct Mailer(Arc<AtomicU64>, UnboundedSender<()>);

impl Handle<Send> for Mailer {
    async fn handle(&self, _: &Send, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        async_std::task::sleep(Duration::from_millis(1)).await;
        self.0.fetch_add(1, Ordering::SeqCst);
        let _ = self.1.unbounded_send(());
        Ok(())
    }
}

/// Publishes `jobs` emails into the SQLite file at `path` and sends them on async-std;
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
    let (each_sent, mut sent_one) = futures::channel::mpsc::unbounded();
    let broker = RusqliteBroker::open(path).handle();
    let publisher = broker.publisher::<Email>();
    let mailer = subscriber("emails", Mailer(sent.clone(), each_sent))
        .map_source(|_| InboxQueue::<Email>::new("emails"))
        .workers(nonzero!(4));
    let service = RustStream::new(AppInfo::new("mailer", "0.1.0"))
        .executor(Arc::new(AsyncStd))
        .on_started(async move |()| {
            for n in 0..jobs {
                publisher.publish(Message::json(&Send { n })?).await?;
            }
            Ok::<(), PublishError>(())
        })
        .with_broker(broker, |b| {
            b.include(mailer.build());
        });
    // Until every email is sent: the handler says so for each.
    async_std::task::block_on(service.run_until(async move {
        for _ in 0..jobs {
            let _ = sent_one.next().await;
        }
    }))?;
    Ok(sent.load(Ordering::SeqCst))
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    match run(&PathBuf::from("target/rusqlite_async_std.db"), 200) {
        Ok(sent) => {
            println!("{sent} emails sent on async-std");
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

//! A service on plain threads with no async runtime: rusqlite's connections on threads of their
//! own, handlers on a small thread pool, and the main thread waiting. It publishes a batch,
//! handles it, and stops once every job is done.
//!
//! ```sh
//! cargo run --example rusqlite_threads
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::channel::oneshot;
use ruststream::core::Dialect;
use ruststream::exec::Threads;
use ruststream_rusqlite::prelude::*;
use ruststream_rusqlite::rusqlite::Connection;
use serde::{Deserialize, Serialize};

/// One row of `thumbnails`, in the lease form.
#[derive(Inbox, Deserialize)]
#[inbox(table = "thumbnails", failed_at = "failed_at", error = "error")]
pub struct Thumbnail {
    #[field(id, generated)]
    id: i64,
    #[field(attempt, generated)]
    attempt: i64,
    #[field(locked_until)]
    locked_until: Option<i64>,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The message: which image to shrink.
#[derive(Serialize, Deserialize)]
pub struct Image {
    /// Its number.
    pub n: u64,
}

/// Counts the images done, and says when all are.
struct Shrink {
    done: Arc<AtomicU64>,
    all: u64,
    finished: std::sync::Mutex<Option<oneshot::Sender<()>>>,
}

impl Handle<Image> for Shrink {
    async fn handle(
        &self,
        _image: &Image,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        // The work: blocking is fine here, each handler has a pool thread.
        std::thread::sleep(Duration::from_millis(2));
        if self.done.fetch_add(1, Ordering::SeqCst) + 1 == self.all
            && let Some(finished) = self.finished.lock().expect("not poisoned").take()
        {
            let _ = finished.send(());
        }
        Ok(())
    }
}

/// Publishes `jobs` images into the SQLite file at `path`, handles them on plain threads, and
/// answers how many were done.
pub fn run(path: &Path, jobs: u64) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // The table anew, as its description writes it.
    let conn = Connection::open(path)?;
    conn.execute_batch("DROP TABLE IF EXISTS thumbnails")?;
    conn.execute_batch(&Thumbnail::TABLE.ddl(Dialect::Sqlite).to_string())?;
    drop(conn);
    let done = Arc::new(AtomicU64::new(0));
    let (finished, all_done) = oneshot::channel();
    let shrink = Shrink {
        done: done.clone(),
        all: jobs,
        finished: std::sync::Mutex::new(Some(finished)),
    };
    let broker = RusqliteBroker::open(path).handle();
    let publisher = broker.publisher::<Thumbnail>();
    let service = RustStream::new(AppInfo::new("thumbnails", "0.1.0"))
        .executor(Arc::new(Threads::new()?))
        .on_started(async move |()| {
            for n in 0..jobs {
                publisher.publish(Message::json(&Image { n })?).await?;
            }
            Ok::<(), PublishError>(())
        })
        .with_broker(broker, |b| {
            let shrink = subscriber("thumbnails", shrink)
                .map_source(|_| InboxQueue::<Thumbnail>::new("thumbnails"))
                .workers(nonzero!(4));
            b.include(shrink.build());
        });
    futures::executor::block_on(service.run_until(async {
        let _ = all_done.await;
    }))?;
    Ok(done.load(Ordering::SeqCst))
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    let path = PathBuf::from("target/rusqlite_threads.db");
    match run(&path, 200) {
        Ok(done) => {
            println!("{done} thumbnails done on plain threads");
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

//! The advisory lock form ([the advisory form](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#the-advisory-form)): a video takes minutes to encode, and the videos of one
//! channel go into work one at a time; an encode that fails returns its row with the release of
//! its key.
//!
//! ```sh
//! cargo run --example sqlx_forms_advisory
//! ```
//!
//! The service runs on `videos.db` until SIGINT or SIGTERM, and encodes the videos of
//! `video_jobs`, rows such as
//! `INSERT INTO video_jobs (channel, payload) VALUES ('news', '{"channel":"news","title":"a"}')`.
//!
//! The table holds only what the example shows: it names no `failed_at` column, so a job
//! that fails returns to the queue. A table of yours names `failed_at` and `error` too, so a
//! job that keeps failing is kept aside ([Failures](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#failed-rows-are-kept)).

use ruststream_sqlx::prelude::*;
use sqlx::sqlite::SqlitePoolOptions;

/// One row of `video_jobs`, held by a lock on its channel's key while it is in work.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(table = "video_jobs", advisory_lock = "video_jobs-{channel}")]
struct Transcode {
    #[field(id, generated)]
    id: i64,
    channel: String,
    #[field(attempt, generated)]
    attempt: i16,
    #[field(payload)]
    payload: Vec<u8>,
}

/// A video takes minutes to encode. The delivery's connection keeps the channel's key while the
/// handler runs, with no transaction open; a retry runs no statement and releases the key.
#[subscriber(InboxQueue::<Transcode>::new("videos"))]
async fn transcode(video: &Video, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
    if encode(video, attempt).await {
        return HandlerOutcome::ack();
    }
    HandlerOutcome::retry()
}

/// The service on the database `url` names.
pub fn service(url: &str) -> RustStream {
    // Nothing connects here: the broker builds its pool when the service starts.
    let broker = SqlxBroker::from_url(url, SqlitePoolOptions::new());
    RustStream::new(AppInfo::new("transcoder", "0.1.0")).with_broker(
        broker.route::<Transcode>("videos"),
        |b| {
            // The start creates the table, as its description writes it, where it is missing.
            b.include(transcode.builder().ensure_schema());
        },
    )
}

/// The message of a row: the video to encode.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Video {
    /// The channel the video belongs to, whose key its row is held by.
    pub channel: String,
    /// The video's title.
    pub title: String,
}

/// The encoder, a stand-in that takes a moment instead of minutes. Its first attempt at a
/// video fails, as a busy encoder's does, so each video is retried once.
async fn encode(video: &Video, attempt: i64) -> bool {
    tracing::info!(channel = %video.channel, title = %video.title, attempt, "encoding");
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let encoded = attempt > 1;
    tracing::info!(
        channel = %video.channel,
        title = %video.title,
        attempt,
        encoded,
        "encode ended"
    );
    encoded
}

/// The service on `videos.db`, until SIGINT or SIGTERM.
#[ruststream::app]
fn app() -> impl App {
    service("sqlite:videos.db?mode=rwc")
}

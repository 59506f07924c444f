//! The advisory lock form ([the advisory form](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#the-advisory-form)) by hand: a video takes minutes to encode, and the
//! videos of one channel go into work one at a time; an encode that fails returns its row with
//! the release of its key.
//!
//! ```sh
//! cargo run --example manual_sqlx_forms_advisory
//! ```
//!
//! The table holds only what the example shows: it names no `failed_at` column, so a job
//! that fails returns to the queue. A table of yours names `failed_at` and `error` too, so a
//! job that keeps failing is kept aside ([Failures](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#failed-rows-are-kept)).

use ruststream_sqlx::prelude::*;
use sqlx::sqlite::SqlitePoolOptions;

/// One row of `video_jobs`, held by a lock on its channel's key while it is in work.
#[derive(sqlx::FromRow)]
struct Transcode {
    id: i64,
    attempt: i16,
    payload: Vec<u8>,
}

impl InboxTable for Transcode {
    type Id = i64;
    type Table = InboxSpec<(Advisory, Attempt, Payload)>;
    const TABLE: Self::Table = InboxSpec::new("video_jobs", Column::new("id").generated())
        .advisory(&[KeyPart::Literal("video_jobs-"), KeyPart::Column("channel")])
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"));

    fn id(&self) -> &i64 {
        &self.id
    }
}

impl AttemptRow for Transcode {
    type Attempt = i16;

    fn attempt(&self) -> &i16 {
        &self.attempt
    }
}

impl PayloadRow for Transcode {
    type Column = Vec<u8>;

    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

/// A video takes minutes to encode. The delivery's connection keeps the channel's key while the
/// handler runs, with no transaction open; a retry runs no statement and releases the key.
struct TranscodeVideo;

impl Handle<Video, (), (), InboxContext> for TranscodeVideo {
    async fn handle(
        &self,
        video: &Video,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        let Ctx(attempt) = Ctx::<keys::Attempt>::from_context(ctx).await?;
        if encode(video, attempt).await {
            return Ok(());
        }
        Err(HandlerOutcome::retry())
    }
}

/// The service on the database `url` names.
pub fn service(url: &str) -> RustStream {
    // Nothing connects here: the broker builds its pool when the service starts.
    let broker = SqlxBroker::from_url(url, SqlitePoolOptions::new());
    RustStream::new(AppInfo::new("transcoder", "0.1.0")).with_broker(
        broker.route::<Transcode>("videos"),
        |b| {
            // The start creates the table, as its description writes it, where it is missing.
            let transcode = subscriber("videos", TranscodeVideo)
                .map_source(|_| InboxQueue::<Transcode>::new("videos"))
                .ensure_schema();
            b.include(transcode.build());
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

// A subscriber argument after the message that is not an extractor `Ctx<..>`.
use ruststream::{Ctx, HandlerOutcome, Inbox, InboxQueue, keys, subscriber};

#[derive(Inbox)]
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

#[subscriber(InboxQueue::<Transcode>::new("videos"))]
async fn transcode(video: &String, attempt: i64, Ctx(key): Ctx<keys::Attempt>) -> HandlerOutcome {
    let _ = (video, attempt, key);
    HandlerOutcome::ack()
}

fn main() {}

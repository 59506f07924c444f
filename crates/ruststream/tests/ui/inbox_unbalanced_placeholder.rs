// Unbalanced braces in `advisory_lock`: a `{` never closed, a `}` never opened.
use ruststream::Inbox;

#[derive(Inbox)]
#[inbox(table = "video_jobs", advisory_lock = "video_jobs-{channel")]
struct Transcode {
    #[field(id, generated)]
    id: i64,
    channel: String,
}

#[derive(Inbox)]
#[inbox(table = "audio_jobs", advisory_lock = "audio_jobs-channel}")]
struct Mix {
    #[field(id, generated)]
    id: i64,
    channel: String,
}

fn main() {}

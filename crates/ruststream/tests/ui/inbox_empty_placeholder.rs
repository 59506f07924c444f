// An empty `advisory_lock` placeholder, and an empty template.
use ruststream::Inbox;

#[derive(Inbox)]
#[inbox(table = "video_jobs", advisory_lock = "video_jobs-{}")]
struct Transcode {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

#[derive(Inbox)]
#[inbox(table = "audio_jobs", advisory_lock = "")]
struct Mix {
    #[field(id, generated)]
    id: i64,
}

fn main() {}

// An `advisory_lock` placeholder that names no field.
use ruststream::Inbox;

#[derive(Inbox)]
#[inbox(table = "video_jobs", advisory_lock = "video_jobs-{chanel}")]
struct Transcode {
    #[field(id, generated)]
    id: i64,
    channel: String,
    #[field(payload)]
    payload: Vec<u8>,
}

fn main() {}

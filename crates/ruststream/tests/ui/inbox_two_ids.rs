// Two fields marked `#[field(id)]`.
use ruststream::Inbox;

#[derive(Inbox)]
#[inbox(table = "jobs")]
struct Job {
    #[field(id, generated)]
    id: i64,
    #[field(id)]
    uuid: String,
    #[field(payload)]
    payload: Vec<u8>,
}

fn main() {}

// `#[inbox(..)]` without `table`, and a row without any `#[inbox]`.
use ruststream::Inbox;

#[derive(Inbox)]
#[inbox(advisory_lock = "jobs-{id}")]
struct Job {
    #[field(id)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

#[derive(Inbox)]
struct Bare {
    #[field(id)]
    id: i64,
}

fn main() {}

// A row with no `#[field(id)]`.
use ruststream::Inbox;

#[derive(Inbox)]
#[inbox(table = "jobs")]
struct Job {
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

fn main() {}

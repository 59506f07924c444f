// A field attribute the derive does not know.
use ruststream::Inbox;

#[derive(Inbox)]
#[inbox(table = "jobs")]
struct Job {
    #[field(id, generated)]
    id: i64,
    #[field(body)]
    payload: Vec<u8>,
}

fn main() {}

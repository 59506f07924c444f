// `#[field(locked_until)]` (the lease form) together with `advisory_lock`.
use ruststream::Inbox;

#[derive(Inbox)]
#[inbox(table = "exports", advisory_lock = "exports-{id}")]
struct Export {
    #[field(id, generated)]
    id: i64,
    #[field(locked_until)]
    locked_until: Option<i64>,
}

fn main() {}

// `custom(lock, unlock)` in a table that names no `advisory_lock`.
use ruststream::Inbox;

#[derive(Inbox)]
#[inbox(table = "payouts", custom(lock, unlock))]
struct Payout {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

fn main() {}

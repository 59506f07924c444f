// `custom(lock)` without `unlock`, and the other way round.
use ruststream::Inbox;

#[derive(Inbox)]
#[inbox(table = "payouts", advisory_lock = "accounts-{account_id}", custom(lock))]
struct Payout {
    #[field(id, generated)]
    id: i64,
    account_id: i64,
}

#[derive(Inbox)]
#[inbox(table = "refunds", advisory_lock = "accounts-{account_id}", custom(unlock))]
struct Refund {
    #[field(id, generated)]
    id: i64,
    account_id: i64,
}

fn main() {}

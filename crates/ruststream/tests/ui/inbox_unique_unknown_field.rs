// `unique` names a field the row does not have.
use ruststream::Inbox;

#[derive(Inbox)]
#[inbox(table = "receipts", locked_until = "locked_until", unique = "order")]
struct Receipt {
    #[field(id, generated)]
    id: i64,
    order_id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

fn main() {}

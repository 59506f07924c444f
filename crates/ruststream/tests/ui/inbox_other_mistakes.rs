// More mistakes, each at its attribute: an unknown `#[inbox]` key, two payloads, two roles on
// one field, a generated payload, `generated` without a role, a column named twice, an order
// on no field, a tuple struct.
use ruststream::Inbox;

#[derive(Inbox)]
#[inbox(table = "jobs", queue = "jobs")]
struct UnknownKey {
    #[field(id)]
    id: i64,
}

#[derive(Inbox)]
#[inbox(table = "jobs", order = "priority desc")]
struct Roles {
    #[field(id)]
    id: i64,
    #[field(payload, generated)]
    payload: Vec<u8>,
    #[field(payload)]
    body: Vec<u8>,
    #[field(attempt, due)]
    attempt: i16,
    #[field(generated)]
    created_at: i64,
    #[field(processed_at, rename = "id")]
    done_at: Option<i64>,
}

#[derive(Inbox)]
#[inbox(table = "jobs")]
struct Tuple(i64);

fn main() {}

// Rule: a custom lock belongs to the advisory lock form: it locks keys.
use ruststream_core::spec::{describe, own, Column, InboxSpec, Payload, Postgres};

const SPEC: InboxSpec<(Payload, own::Lock, own::Unlock)> =
    InboxSpec::new("payouts", Column::new("id").generated())
        .payload(Column::new("payload"))
        .own::<own::Lock>()
        .own::<own::Unlock>();

fn main() {
    let _ = describe::<Postgres, _>(&SPEC);
}

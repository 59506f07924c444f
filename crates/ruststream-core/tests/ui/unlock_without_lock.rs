// Rule: `own::Lock` and `own::Unlock` come together: a custom lock takes and releases.
use ruststream_core::spec::{
    describe, own, Advisory, Column, InboxSpec, KeyPart, MySql, Payload,
};

const SPEC: InboxSpec<(Advisory, Payload, own::Unlock)> =
    InboxSpec::new("payouts", Column::new("id").generated())
        .advisory(&[KeyPart::Literal("accounts-"), KeyPart::Column("account_id")])
        .payload(Column::new("payload"))
        .own::<own::Unlock>();

fn main() {
    let _ = describe::<MySql, _>(&SPEC);
}

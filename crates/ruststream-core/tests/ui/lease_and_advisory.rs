// Rule: a table takes its rows in one form.
use ruststream_core::spec::{
    describe, Advisory, Column, InboxSpec, KeyPart, Lease, Payload, Postgres,
};

const SPEC: InboxSpec<(Payload, Lease, Advisory)> =
    InboxSpec::new("video_jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .lease(Column::new("locked_until"))
        .advisory(&[KeyPart::Literal("video_jobs-"), KeyPart::Column("channel")]);

fn main() {
    let _ = describe::<Postgres, _>(&SPEC);
}

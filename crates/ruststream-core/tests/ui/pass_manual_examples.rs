// The descriptions of the spec's manual examples compile, and describe what they say.
use ruststream_core::spec::{
    describe, own, Advisory, Attempt, Column, Form, InboxSpec, KeyPart, Lease, MySql, Payload,
    Postgres, Sqlite,
};

// examples/manual/sqlx_forms_advisory.rs
const TRANSCODE: InboxSpec<(Advisory, Attempt, Payload)> =
    InboxSpec::new("video_jobs", Column::new("id").generated())
        .advisory(&[KeyPart::Literal("video_jobs-"), KeyPart::Column("channel")])
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"));

// examples/manual/sqlx_forms_lock.rs
const PAYOUT: InboxSpec<(Advisory, Payload, own::Lock, own::Unlock)> =
    InboxSpec::new("payouts", Column::new("id").generated())
        .advisory(&[KeyPart::Literal("accounts-"), KeyPart::Column("account_id")])
        .payload(Column::new("payload"))
        .own::<own::Lock>()
        .own::<own::Unlock>();

// examples/manual/sqlx_forms_row_lock.rs
const INVOICE: InboxSpec<(Payload,)> =
    InboxSpec::new("invoice_jobs", Column::new("id").generated()).payload(Column::new("payload"));

// A lease table, on SQLite too.
const EXPORT: InboxSpec<(Payload, Attempt, Lease)> =
    InboxSpec::new("exports", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"));

fn main() {
    let transcode = describe::<Sqlite, _>(&TRANSCODE).unwrap();
    assert_eq!(transcode.form(), Form::Advisory);
    assert!(!transcode.custom_lock());
    let payout = describe::<Sqlite, _>(&PAYOUT).unwrap();
    assert_eq!(payout.form(), Form::Advisory);
    assert!(payout.custom_lock());
    assert_eq!(describe::<Postgres, _>(&PAYOUT).unwrap(), payout);
    let invoice = describe::<Postgres, _>(&INVOICE).unwrap();
    assert_eq!(invoice.form(), Form::RowLock);
    assert_eq!(describe::<MySql, _>(&INVOICE).unwrap(), invoice);
    let export = describe::<Sqlite, _>(&EXPORT).unwrap();
    assert_eq!(export.form(), Form::Lease);
    assert_eq!(describe::<Postgres, _>(&EXPORT).unwrap(), export);
}

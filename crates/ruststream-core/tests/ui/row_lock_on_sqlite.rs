// Rule: SQLite has no row locks, so a table on SQLite names another form.
use ruststream_core::spec::{Column, InboxSpec, Payload, Sqlite};

const SPEC: InboxSpec<(Payload,)> =
    InboxSpec::new("invoice_jobs", Column::new("id").generated()).payload(Column::new("payload"));

fn main() {
    let _ = ruststream_core::spec::describe::<Sqlite, _>(&SPEC);
}

//! The start check of the failure columns: the time columns must hold what the queue writes
//! and what the row type decodes; the attempt, payload and error columns their types.

use super::*;

use ruststream_core::{CheckError, FieldKind, RowField};

const AS_INTEGER: &[RowField] = &[RowField {
    column: "locked_until",
    field: "locked_until",
    rust: "Option<i64>",
    kind: FieldKind::Integer,
}];
const AS_TIME: &[RowField] = &[RowField {
    column: "locked_until",
    field: "locked_until",
    rust: "Option<DateTime<Utc>>",
    kind: FieldKind::Time,
}];
/// A local time decodes MySQL's DATETIME, not PostgreSQL's timestamptz.
const AS_LOCAL: &[RowField] = &[RowField {
    column: "locked_until",
    field: "locked_until",
    rust: "Option<NaiveDateTime>",
    kind: FieldKind::LocalTime,
}];

/// The check's failure of a lease table whose `locked_until` the server declares `ty` (the
/// usual type where `None`), with the row type's `fields`.
fn check_lease(
    dialect: Dialect,
    fields: &'static [RowField],
    ty: Option<&str>,
) -> Option<CheckError> {
    let mut sim = Sim::new(dialect, failing(Form::Lease, true), 1);
    sim.row_fields = fields;
    if let Some(ty) = ty {
        sim.db.column_types.insert("locked_until", ty.to_owned());
    }
    sim.spawn();
    sim.run();
    let sub = sim.procs[0].sub;
    sim.events(0, 0).into_iter().find_map(|e| match e {
        Event::CheckFailed { error, .. } => Some(error),
        Event::Ready { sub: s } if s == sub => None,
        _ => None,
    })
}

/// The start check compares the time columns' types with what the queue writes, and with
/// what the row type's fields decode: a mismatch fails the check, naming the column, before
/// any row is claimed.
#[test]
fn the_check_refuses_time_columns_the_row_type_cannot_decode() {
    refuses_fields_that_cannot_decode();
    refuses_columns_the_queue_cannot_write();
}

fn refuses_fields_that_cannot_decode() {
    let check = check_lease;
    // The integer field on a server's time column: refused, naming field and column.
    for dialect in SERVERS {
        let error = check(dialect, AS_INTEGER, None).expect("refused");
        assert!(
            matches!(
                &error,
                CheckError::FieldType {
                    column: "locked_until",
                    field: "locked_until",
                    ..
                }
            ),
            "{dialect:?}: {error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains("`locked_until: Option<i64>`")
                && text.contains("#[inbox(locked_until = \"locked_until\")]"),
            "{text}"
        );
        assert_eq!(
            check(dialect, AS_TIME, None),
            None,
            "{dialect:?}: a time field decodes"
        );
        assert_eq!(
            check(dialect, &[], None),
            None,
            "{dialect:?}: no field, nothing to decode"
        );
    }
    // On SQLite the integer is right, and a time type is not.
    assert_eq!(check(Dialect::Sqlite, AS_INTEGER, None), None);
    assert!(matches!(
        check(Dialect::Sqlite, AS_TIME, None),
        Some(CheckError::FieldType { .. })
    ));
}

fn refuses_columns_the_queue_cannot_write() {
    let check = check_lease;
    // A time column declared as an integer on a server: the queue cannot write its times.
    let error = check(Dialect::Postgres, &[], Some("bigint")).expect("refused");
    assert!(
        matches!(
            &error,
            CheckError::ColumnType {
                column: "locked_until",
                expected: "TIMESTAMPTZ",
                ..
            }
        ),
        "{error:?}"
    );
    let error = check(Dialect::MariaDb, &[], Some("varchar")).expect("refused");
    assert!(
        error.to_string().contains("declare it DATETIME(6)"),
        "{error}"
    );
    // Times to the microsecond: the lease's fence compares them exactly.
    for ty in ["datetime", "datetime(3)", "timestamp(0)"] {
        assert!(check(Dialect::MySql, &[], Some(ty)).is_some(), "{ty}");
    }
    assert_eq!(check(Dialect::MySql, &[], Some("timestamp(6)")), None);
    assert!(check(Dialect::Postgres, &[], Some("timestamp without time zone")).is_some());
    // SQLite: any affinity but text keeps the integers.
    assert!(check(Dialect::Sqlite, &[], Some("TEXT")).is_some());
    assert!(check(Dialect::Sqlite, &[], Some("VARCHAR(20)")).is_some());
    for ty in ["", "NUMERIC", "DATETIME", "BIGINT"] {
        assert_eq!(check(Dialect::Sqlite, &[], Some(ty)), None, "{ty}");
    }
    assert!(check(Dialect::Postgres, AS_LOCAL, None).is_some());
    assert_eq!(check(Dialect::MariaDb, AS_LOCAL, None), None);
}

/// The attempt, the payload and the error columns too: their types hold what the queue
/// writes, and the row type's fields decode them.
#[test]
fn the_check_compares_the_attempt_payload_and_error_columns() {
    use ruststream_core::{CheckError, FieldKind, RowField};
    let check = |dialect: Dialect, fields: &'static [RowField], column: &'static str, ty: &str| {
        let mut sim = Sim::new(dialect, failing(Form::Lease, true), 1);
        sim.row_fields = fields;
        sim.db.column_types.insert(column, ty.to_owned());
        sim.spawn();
        sim.run();
        sim.events(0, 0).into_iter().find_map(|e| match e {
            Event::CheckFailed { error, .. } => Some(error),
            _ => None,
        })
    };
    let refused = |error: Option<CheckError>, column: &str| match error {
        Some(
            CheckError::ColumnType { column: c, .. } | CheckError::FieldType { column: c, .. },
        ) => c == column,
        _ => false,
    };
    // Columns of the wrong type.
    assert!(refused(
        check(Dialect::Postgres, &[], "payload", "jsonb"),
        "payload"
    ));
    assert!(refused(
        check(Dialect::MariaDb, &[], "attempt", "varchar(10)"),
        "attempt"
    ));
    assert!(refused(
        check(Dialect::Postgres, &[], "error", "integer"),
        "error"
    ));
    assert_eq!(check(Dialect::Postgres, &[], "payload", "text"), None);
    assert_eq!(check(Dialect::MySql, &[], "attempt", "int(11)"), None);
    assert_eq!(check(Dialect::MySql, &[], "error", "mediumtext"), None);
    // Fields of the wrong kind.
    const ATTEMPT_AS_TEXT: &[RowField] = &[RowField {
        column: "attempt",
        field: "attempt",
        rust: "String",
        kind: FieldKind::Text,
    }];
    const ERROR_AS_BYTES: &[RowField] = &[RowField {
        column: "error",
        field: "error",
        rust: "Vec<u8>",
        kind: FieldKind::Bytes,
    }];
    const PAYLOAD_AS_INTEGER: &[RowField] = &[RowField {
        column: "payload",
        field: "payload",
        rust: "i64",
        kind: FieldKind::Integer,
    }];
    for dialect in ALL {
        assert!(
            refused(check(dialect, ATTEMPT_AS_TEXT, "id", "bigint"), "attempt"),
            "{dialect:?}"
        );
        assert!(
            refused(check(dialect, ERROR_AS_BYTES, "id", "bigint"), "error"),
            "{dialect:?}"
        );
        assert!(
            refused(
                check(dialect, PAYLOAD_AS_INTEGER, "id", "bigint"),
                "payload"
            ),
            "{dialect:?}"
        );
    }
}

//! The judgement of what the catalog says of a subscription's table: its columns and their
//! types, and whether an index serves its claims. Pure functions of the description, the
//! subscription's options and the catalog's rows: they answer what the check does next.

use std::collections::{BTreeMap, BTreeSet};

use crate::dialect::{Ddl, Dialect, Statement, claim_order, serves_claims};
use crate::spec::{FieldKind, RowField, TableDesc};
use crate::types::{CheckError, Reply};
use crate::value::Value;

use super::super::options::{MissingIndex, SubscribeOptions};
use super::super::rows::rows_of;

/// What the check does after the table's columns.
#[derive(Debug)]
pub(super) enum Columns {
    /// No table, and `ensure_schema`: run the schema's statements, then list the columns again.
    CreateSchema,
    /// The table, a column or a type is wrong.
    Fail(CheckError),
    /// The columns pass; list the indexes.
    ListIndexes,
    /// The columns pass, and nothing is to be done about the indexes.
    Pass,
}

/// What the check does after the table's indexes.
#[derive(Debug)]
pub(super) enum Indexes {
    /// An index serves the claims, or none can be made.
    Pass,
    /// `ensure_schema`: create the claim index.
    Create(Statement),
    /// `missing_claim_index` fails the start.
    Fail(CheckError),
    /// The start warns, and goes on.
    Warn(String),
}

/// The table's columns and their types (the catalog's rows `reply`): a missing table (created
/// where `ensure_schema` says so, once: `schema_ran`), a missing column, a type that does not
/// hold what the queue writes, or a pass.
pub(super) fn columns<R>(
    dialect: Dialect,
    desc: &TableDesc,
    options: &SubscribeOptions,
    schema_ran: bool,
    reply: Reply<R>,
) -> Columns {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    for row in rows_of(reply) {
        let mut values = row.values.into_iter();
        if let Some(Value::Text(name)) = values.next() {
            let ty = match values.next() {
                Some(Value::Text(ty)) => ty,
                _ => String::new(),
            };
            types.insert(name, ty);
        }
    }
    let found: BTreeSet<String> = types.keys().cloned().collect();
    let table = desc.table;
    if found.is_empty() && options.ensure_schema && !schema_ran {
        return Columns::CreateSchema;
    }
    let error = if found.is_empty() {
        Some(CheckError::MissingTable { table })
    } else {
        missing_column(desc, &found)
            .map(|(column, role)| CheckError::MissingColumn {
                table,
                column,
                role,
            })
            .or_else(|| type_mismatch(dialect, desc, options.row_fields, &types))
    };
    match error {
        Some(error) => Columns::Fail(error),
        None if options.missing_claim_index == MissingIndex::Ignore && !options.ensure_schema => {
            Columns::Pass
        }
        None => Columns::ListIndexes,
    }
}

/// The table's indexes (the catalog's rows `reply`): one that serves the claims passes;
/// without one the claim index is created (`ensure_schema`), the check fails, or the start
/// warns, as the subscription says.
pub(super) fn indexes<R>(
    dialect: Dialect,
    desc: &TableDesc,
    options: &SubscribeOptions,
    reply: Reply<R>,
) -> Indexes {
    let indexes: Vec<Vec<String>> = rows_of(reply)
        .into_iter()
        .filter_map(|row| match row.values.into_iter().nth(1) {
            Some(Value::Text(columns)) => Some(columns.split(',').map(str::to_owned).collect()),
            _ => None,
        })
        .collect();
    if serves_claims(desc, &indexes) {
        return Indexes::Pass;
    }
    let Some(create) = Ddl::new(dialect, desc).create_claim_index() else {
        return Indexes::Pass;
    };
    if options.ensure_schema {
        return Indexes::Create(create);
    }
    let table = desc.table;
    let order = claim_order(desc)
        .iter()
        .map(|o| o.column)
        .collect::<Vec<_>>()
        .join(", ");
    if options.missing_claim_index == MissingIndex::Fail {
        return Indexes::Fail(CheckError::MissingClaimIndex {
            table,
            order,
            create: create.sql.to_string(),
        });
    }
    Indexes::Warn(format!(
        "table `{table}` has no index that serves its claims (ordered by {order}): each claim sorts the claimable rows{}; create it: {}",
        if dialect.has_row_locks() && dialect != Dialect::Postgres {
            ", and locks every row it sorts"
        } else {
            ""
        },
        create.sql
    ))
}

/// The first described column the table lacks, with its role.
fn missing_column(
    desc: &TableDesc,
    found: &BTreeSet<String>,
) -> Option<(&'static str, &'static str)> {
    let mut roles: Vec<(&'static str, &'static str)> = vec![(desc.id.name, "the id")];
    let described = [
        (desc.payload, "the payload"),
        (desc.attempt, "the attempt"),
        (desc.locked_until(), "the lease's `locked_until`"),
        (desc.processed_at, "`processed_at`"),
        (desc.due, "the due time"),
        (desc.failed_at, "`failed_at`, the mark of a failed row"),
        (desc.error, "the error text"),
    ];
    for (column, role) in described {
        if let Some(column) = column {
            roles.push((column.name, role));
        }
    }
    for column in desc.key_columns() {
        roles.push((column, "a part of the advisory lock key"));
    }
    for order in desc.order {
        roles.push((order.column, "a column of the claim order"));
    }
    roles.into_iter().find(|(column, _)| {
        !found.contains(*column) && !found.iter().any(|f| f.eq_ignore_ascii_case(column))
    })
}

/// What a role's column holds: a time, an integer, bytes (or text), or text.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Time,
    Integer,
    Payload,
    Text,
    Json,
}

impl Family {
    /// The type the queue needs the column to be of, in messages, and the Rust types that
    /// decode it.
    fn expected(self, dialect: Dialect) -> (&'static str, &'static str) {
        match (self, dialect) {
            (Family::Time, Dialect::Postgres) => (
                "TIMESTAMPTZ",
                "`chrono::DateTime<Utc>` or `time::OffsetDateTime` (in an `Option` where it may be NULL)",
            ),
            (Family::Time, Dialect::MySql | Dialect::MariaDb) => (
                "DATETIME(6)",
                "`chrono::NaiveDateTime` or `time::PrimitiveDateTime` (in an `Option` where it may be NULL)",
            ),
            (Family::Time, Dialect::Sqlite) => (
                "INTEGER (microseconds since the Unix epoch)",
                "`i64` (in an `Option` where it may be NULL)",
            ),
            (Family::Integer, _) => ("an integer type", "an integer type such as `i64`"),
            (Family::Payload, Dialect::Postgres) => ("BYTEA or TEXT", "`Vec<u8>`"),
            (Family::Payload, _) => ("a binary or text type", "`Vec<u8>`"),
            (Family::Text, _) => (
                "a text type",
                "`String` (in an `Option` where it may be NULL)",
            ),
            (Family::Json, Dialect::Postgres) => ("JSONB", "`serde_json::Value`"),
            (Family::Json, _) => (
                "JSON or a text type",
                "`String` or `serde_json::Value` (in an `Option` where it may be NULL)",
            ),
        }
    }

    /// Whether a column of this type, as the database names it (lower case), holds what
    /// the queue writes.
    fn holds(self, dialect: Dialect, ty: &str) -> bool {
        let text = ty.contains("char") || ty.contains("text") || ty.contains("clob");
        match (self, dialect) {
            (Family::Time, Dialect::Postgres) => ty == "timestamp with time zone",
            // The lease's fence compares the expiry written to the microsecond.
            (Family::Time, Dialect::MySql | Dialect::MariaDb) => {
                ty == "datetime(6)" || ty == "timestamp(6)"
            }
            // SQLite keeps an integer in any column but one of text affinity, where it
            // compares as text.
            (Family::Time | Family::Integer, Dialect::Sqlite) => !text,
            (Family::Integer, _) => ty.contains("int"),
            (Family::Payload, Dialect::Postgres) => ty == "bytea" || text,
            (Family::Payload, Dialect::MySql | Dialect::MariaDb) => {
                ty.contains("blob") || ty.contains("binary") || text
            }
            (Family::Payload, Dialect::Sqlite) => true,
            (Family::Text | Family::Json, Dialect::Sqlite) => true,
            (Family::Text, _) => text,
            (Family::Json, Dialect::Postgres) => ty == "jsonb",
            (Family::Json, Dialect::MySql | Dialect::MariaDb) => ty == "json" || text,
        }
    }

    /// Whether a field of this kind decodes such a column.
    fn decodes(self, dialect: Dialect, kind: FieldKind) -> bool {
        match (self, kind) {
            (_, FieldKind::Other) => true,
            (Family::Time, kind) => match dialect {
                Dialect::Sqlite => !matches!(
                    kind,
                    FieldKind::Time | FieldKind::LocalTime | FieldKind::Bytes
                ),
                // A zone-aware time decodes `timestamptz`; a local one does not.
                Dialect::Postgres => kind == FieldKind::Time,
                Dialect::MySql | Dialect::MariaDb => {
                    matches!(kind, FieldKind::Time | FieldKind::LocalTime)
                }
            },
            (Family::Integer, kind) => kind == FieldKind::Integer,
            (Family::Payload, kind) => matches!(kind, FieldKind::Bytes | FieldKind::Text),
            (Family::Text, kind) => kind == FieldKind::Text,
            (Family::Json, kind) => dialect != Dialect::Postgres && kind == FieldKind::Text,
        }
    }
}

/// The first described column whose type does not hold what the queue writes into it (a
/// time, an attempt count, the payload, an error's text), or whose field in the row type
/// cannot decode it.
fn type_mismatch(
    dialect: Dialect,
    desc: &TableDesc,
    fields: &[RowField],
    types: &BTreeMap<String, String>,
) -> Option<CheckError> {
    let roles = [
        (desc.locked_until(), "locked_until", Family::Time),
        (desc.due, "due", Family::Time),
        (desc.processed_at, "processed_at", Family::Time),
        (desc.failed_at, "failed_at", Family::Time),
        (desc.attempt, "attempt", Family::Integer),
        (desc.payload, "payload", Family::Payload),
        (desc.error, "error", Family::Text),
        (desc.errors, "errors", Family::Json),
    ];
    for (column, role, family) in roles {
        let Some(column) = column else { continue };
        let Some(found) = types
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(column.name))
            .map(|(_, ty)| ty.clone())
        else {
            continue;
        };
        let ty = found.to_ascii_lowercase();
        if ty.is_empty() && dialect != Dialect::Sqlite {
            // The server named no type: nothing to compare.
            continue;
        }
        let (expected, hint) = family.expected(dialect);
        if !family.holds(dialect, &ty) {
            return Some(CheckError::ColumnType {
                table: desc.table,
                column: column.name,
                role,
                found,
                expected,
            });
        }
        let Some(field) = fields.iter().find(|f| f.column == column.name) else {
            continue;
        };
        if !family.decodes(dialect, field.kind) {
            return Some(CheckError::FieldType {
                table: desc.table,
                column: column.name,
                role,
                field: field.field,
                rust: field.rust,
                found,
                hint,
            });
        }
    }
    None
}

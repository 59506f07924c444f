//! The start check's reads of the schema (columns, indexes, isolation) and its creation.

use ruststream_core::{Dialect, Reply, Row, TableDesc, Value};

use super::{Call, Db};

impl Db {
    /// The table's indexes: the primary key, and the claim index unless it is missing.
    pub(super) fn list_indexes(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call { desc, .. } = *c;
        let mut rows = vec![Row::values(vec![
            Value::Text("pkey".into()),
            Value::Text(desc.id.name.into()),
        ])];
        if !self.missing_claim_index {
            let mut columns: Vec<&str> = desc.order.iter().map(|o| o.column).collect();
            if columns.is_empty() {
                columns.extend(desc.due.map(|c| c.name));
            }
            columns.push(desc.id.name);
            rows.push(Row::values(vec![
                Value::Text("claim".into()),
                Value::Text(columns.join(",")),
            ]));
        }
        Reply::Rows(rows)
    }

    /// Creates what the schema lacks: the table and its claim index.
    pub(super) fn create_schema(&mut self, _c: &Call<'_>) -> Reply<i64> {
        self.missing_table = false;
        self.missing_claim_index = false;
        Reply::Done
    }

    pub(super) fn current_database(&mut self, _c: &Call<'_>) -> Reply<i64> {
        Reply::Rows(vec![Row::values(vec![Value::Text("test".into())])])
    }

    /// The isolation level the server answers.
    pub(super) fn isolation(&mut self, _c: &Call<'_>) -> Reply<i64> {
        Reply::Rows(vec![Row::values(vec![Value::Text(
            self.isolation
                .clone()
                .unwrap_or_else(|| "read committed".into()),
        )])])
    }

    /// The table's columns with their types; none where the table is missing.
    pub(super) fn list_columns(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call { dialect, desc, .. } = *c;
        if self.missing_table {
            return Reply::Rows(Vec::new());
        }
        Reply::Rows(
            desc.columns()
                .into_iter()
                .filter(|c| !self.missing_columns.contains(c))
                .map(|c| {
                    let ty = self
                        .column_types
                        .get(c)
                        .cloned()
                        .unwrap_or_else(|| default_type(dialect, desc, c).to_owned());
                    Row::values(vec![Value::Text(c.to_owned()), Value::Text(ty)])
                })
                .collect(),
        )
    }
}

/// The type a server names a column of `desc` by, as the usual schema declares it: a time
/// role's time type, an integer otherwise.
fn default_type(dialect: Dialect, desc: &TableDesc, column: &str) -> &'static str {
    let time = [
        desc.locked_until(),
        desc.due,
        desc.processed_at,
        desc.failed_at,
    ]
    .into_iter()
    .flatten()
    .any(|c| c.name == column);
    let payload = desc.payload.is_some_and(|c| c.name == column);
    let error = desc.error.is_some_and(|c| c.name == column);
    match (dialect, time, payload, error) {
        (Dialect::Sqlite, _, true, _) => "BLOB",
        (Dialect::Sqlite, _, _, true) => "TEXT",
        (Dialect::Sqlite, ..) => "INTEGER",
        (Dialect::Postgres, true, ..) => "timestamp with time zone",
        (Dialect::MySql | Dialect::MariaDb, true, ..) => "datetime(6)",
        (Dialect::Postgres, _, true, _) => "bytea",
        (Dialect::MySql | Dialect::MariaDb, _, true, _) => "longblob",
        (_, _, _, true) => "text",
        _ => "bigint",
    }
}

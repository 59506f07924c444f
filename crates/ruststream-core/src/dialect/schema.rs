//! A table's schema from its description: its `CREATE TABLE`, its claim index and the indexes
//! of its marks, per dialect ([`Ddl`]); the statement that lists a table's indexes, and the
//! rule that tells whether one of them serves the claims ([`serves_claims`]).

use std::fmt;

use crate::spec::{Column, OrderBy, TableDesc};

use super::{ColumnType, Dialect, Output, Renderer, Sql, Statement, StatementKind, named};

/// The schema a description needs, in one dialect: the table with every column it names,
/// the claim index, and the indexes the counts and the retention read; each statement
/// creates only what is missing ([The schema](https://github.com/ruststream/ruststream/blob/main/docs/src/operating.md#the-schema)).
///
/// A column the description only names (a key's, an order's, a unique one) is text (an
/// order's an integer) unless [`Ddl::column_type`] gives its type:
///
/// ```
/// use ruststream_core::spec::{Advisory, Attempt, Column, InboxSpec, KeyPart, Payload};
/// use ruststream_core::{Ddl, Dialect};
///
/// const JOBS: InboxSpec<(Advisory, Attempt, Payload)> =
///     InboxSpec::new("video_jobs", Column::new("id").generated())
///         .advisory(&[KeyPart::Literal("video-"), KeyPart::Column("channel")])
///         .attempt(Column::new("attempt"))
///         .payload(Column::new("payload"));
///
/// let ddl = Ddl::new(Dialect::Postgres, JOBS.desc()).column_type("channel", "BIGINT NOT NULL");
/// assert!(ddl.to_string().contains("\"channel\" BIGINT NOT NULL"));
/// ```
// Each described column takes the type the queue writes into it (a time is `TIMESTAMPTZ`,
// `DATETIME(6)` or SQLite's `INTEGER` microseconds; the payload `BYTEA`, `LONGBLOB` or
// `BLOB`); the id is a 64-bit integer, generated where the description says so. On MySQL and
// MariaDB the indexes are part of the `CREATE TABLE`, and `Ddl::create_indexes` writes them
// apart for a table that exists.
#[derive(Clone, Debug)]
pub struct Ddl {
    dialect: Dialect,
    desc: TableDesc,
    types: Vec<(String, String)>,
}

impl Ddl {
    /// The schema of `desc` in `dialect`.
    pub fn new(dialect: Dialect, desc: &TableDesc) -> Self {
        Self {
            dialect,
            desc: *desc,
            types: Vec::new(),
        }
    }

    /// The column `column` takes this SQL type, as written (`"BIGINT NOT NULL"`, `"UUID
    /// PRIMARY KEY"` for the id): for a column whose type the description does not say, or to
    /// replace the type the queue would give.
    pub fn column_type(mut self, column: &str, sql_type: &str) -> Self {
        self.types.retain(|(c, _)| c != column);
        self.types.push((column.to_owned(), sql_type.to_owned()));
        self
    }

    /// The statements, in order: the table, then each index apart where the dialect creates
    /// them apart.
    pub fn statements(&self) -> Vec<String> {
        let mut out = vec![self.create_table()];
        if !self.mysql_like() {
            out.extend(self.create_indexes());
        }
        out
    }

    /// The statements as [`Statement`]s that run without binds: for the start's
    /// `ensure_schema`.
    pub fn schema_statements(&self) -> Vec<Statement> {
        self.statements()
            .into_iter()
            .map(|sql| raw(self.dialect, &sql))
            .collect()
    }

    /// The indexes' statements apart (on MySQL and MariaDB without `IF NOT EXISTS`, which
    /// MySQL lacks: run them where the index is missing).
    pub fn create_indexes(&self) -> Vec<String> {
        self.indexes()
            .into_iter()
            .map(|index| self.create_index(&index))
            .collect()
    }

    /// The claim index's statement apart, where the claim order needs one: for a table that
    /// exists without it.
    pub fn create_claim_index(&self) -> Option<Statement> {
        let claim = self.indexes().into_iter().find(|i| i.claim)?;
        Some(raw(self.dialect, &self.create_index(&claim)))
    }

    /// `CREATE TABLE IF NOT EXISTS` with every column the description names.
    pub fn create_table(&self) -> String {
        let q = |name: &str| self.dialect.quote_one(name);
        let mut lines: Vec<String> = Vec::new();
        let columns = self.desc.columns();
        let unique_only = self.desc.unique.iter().filter(|c| !columns.contains(c));
        for column in columns.iter().chain(unique_only) {
            lines.push(format!("{} {}", q(column), self.type_of(column)));
        }
        let id_in_line = self
            .given(self.desc.id.name)
            .map_or(self.dialect == Dialect::Sqlite, |t| {
                t.to_ascii_uppercase().contains("PRIMARY KEY")
            });
        if !id_in_line {
            lines.push(format!("PRIMARY KEY ({})", q(self.desc.id.name)));
        }
        if !self.desc.unique.is_empty() {
            let columns: Vec<String> = self.desc.unique.iter().map(|c| q(c)).collect();
            lines.push(format!("UNIQUE ({})", columns.join(", ")));
        }
        if self.mysql_like() {
            for index in self.indexes() {
                lines.push(format!(
                    "KEY {} ({})",
                    q(&index.name),
                    self.index_columns(&index)
                ));
            }
        }
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n    {}\n)",
            self.dialect.quote(self.desc.table),
            lines.join(",\n    ")
        )
    }

    fn mysql_like(&self) -> bool {
        self.dialect.mysql_like()
    }

    fn given(&self, column: &str) -> Option<&str> {
        self.types
            .iter()
            .find(|(c, _)| c == column)
            .map(|(_, t)| t.as_str())
    }

    /// The SQL type of `column`: as given, as its role says, or text (an order's column: an
    /// integer).
    fn type_of(&self, column: &str) -> String {
        if let Some(given) = self.given(column) {
            return given.to_owned();
        }
        let d = &self.desc;
        let is = |c: Option<Column>| c.is_some_and(|c| c.name == column);
        let mysql = self.mysql_like();
        let (pg, my, lite) = if column == d.id.name {
            if d.id.generated {
                (
                    "BIGINT GENERATED BY DEFAULT AS IDENTITY",
                    "BIGINT NOT NULL AUTO_INCREMENT",
                    "INTEGER PRIMARY KEY AUTOINCREMENT",
                )
            } else {
                ("BIGINT NOT NULL", "BIGINT NOT NULL", "INTEGER PRIMARY KEY")
            }
        } else if is(d.payload) {
            ("BYTEA NOT NULL", "LONGBLOB NOT NULL", "BLOB NOT NULL")
        } else if is(d.attempt) {
            (
                "INTEGER NOT NULL DEFAULT 0",
                "INT NOT NULL DEFAULT 0",
                "INTEGER NOT NULL DEFAULT 0",
            )
        } else if is(d.due) {
            (
                "TIMESTAMPTZ NOT NULL DEFAULT now()",
                "DATETIME(6) NOT NULL",
                "INTEGER NOT NULL",
            )
        } else if is(d.locked_until()) || is(d.processed_at) || is(d.failed_at) {
            ("TIMESTAMPTZ NULL", "DATETIME(6) NULL", "INTEGER NULL")
        } else if is(d.error) {
            ("TEXT NULL", "TEXT NULL", "TEXT NULL")
        } else if is(d.errors) {
            ("JSONB NULL", "JSON NULL", "TEXT NULL")
        } else if d.order.iter().any(|o| o.column == column)
            && !d.key_columns().contains(&column)
            && !d.unique.contains(&column)
        {
            (
                "BIGINT NOT NULL DEFAULT 0",
                "BIGINT NOT NULL DEFAULT 0",
                "INTEGER NOT NULL DEFAULT 0",
            )
        } else {
            // A key's or a unique column: text that an index can hold on MySQL.
            ("TEXT NOT NULL", "VARCHAR(255) NOT NULL", "TEXT NOT NULL")
        };
        match self.dialect {
            Dialect::Postgres => pg,
            _ if mysql => my,
            _ => lite,
        }
        .to_owned()
    }

    /// The indexes: the claim index where the claim order needs one, and one per mark.
    fn indexes(&self) -> Vec<Index> {
        let d = &self.desc;
        let base = d.table.rsplit('.').next().unwrap_or(d.table);
        let mut out = Vec::new();
        let order = claim_order(d);
        if order.first().is_some_and(|o| o.column != d.id.name) {
            let mut columns: Vec<OrderBy> = Vec::new();
            if self.mysql_like() {
                // No partial indexes: the marks lead, each read as `IS NULL`.
                for mark in [d.processed_at, d.failed_at].into_iter().flatten() {
                    columns.push(OrderBy::asc(mark.name));
                }
            }
            columns.extend(order.iter().copied());
            if self.mysql_like()
                && let Some(lease) = d.locked_until()
            {
                // The lease is read beside the order: a count of the claimable rows reads it
                // in the index.
                columns.push(OrderBy::asc(lease.name));
            }
            out.push(Index {
                name: format!("{base}_claim"),
                columns,
                partial: !self.mysql_like(),
                not_null: None,
                claim: true,
            });
        }
        for (mark, suffix) in [
            (d.failed_at, "failed"),
            (d.processed_at, "processed"),
            (d.locked_until(), "lease"),
        ] {
            if let Some(mark) = mark {
                out.push(Index {
                    name: format!("{base}_{suffix}"),
                    columns: vec![OrderBy::asc(mark.name)],
                    partial: false,
                    not_null: (!self.mysql_like()).then_some(mark.name),
                    claim: false,
                });
            }
        }
        out
    }

    fn index_columns(&self, index: &Index) -> String {
        index
            .columns
            .iter()
            .map(|o| {
                let mut s = self.dialect.quote_one(o.column);
                if o.descending {
                    s.push_str(" DESC");
                }
                s
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn create_index(&self, index: &Index) -> String {
        let q = |name: &str| self.dialect.quote_one(name);
        let d = &self.desc;
        let (name, table) = match (self.dialect, d.table.rsplit_once('.')) {
            // SQLite names the schema on the index, not on its table.
            (Dialect::Sqlite, Some((schema, table))) => {
                (format!("{}.{}", q(schema), q(&index.name)), q(table))
            }
            _ => (q(&index.name), self.dialect.quote(d.table)),
        };
        let exists = if self.mysql_like() {
            ""
        } else {
            "IF NOT EXISTS "
        };
        let mut sql = format!(
            "CREATE INDEX {exists}{name} ON {table} ({})",
            self.index_columns(index)
        );
        if index.partial {
            let marks: Vec<String> = [d.processed_at, d.failed_at]
                .into_iter()
                .flatten()
                .map(|m| format!("{} IS NULL", q(m.name)))
                .collect();
            if !marks.is_empty() {
                sql.push_str(" WHERE ");
                sql.push_str(&marks.join(" AND "));
            }
        }
        if let Some(mark) = index.not_null {
            sql.push_str(&format!(" WHERE {} IS NOT NULL", q(mark)));
        }
        sql
    }
}

impl fmt::Display for Ddl {
    /// The statements, each ended with `;`, one after another.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, statement) in self.statements().iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            writeln!(f, "{statement};")?;
        }
        Ok(())
    }
}

/// An index the schema creates.
#[derive(Clone, Debug)]
struct Index {
    name: String,
    /// Its columns, each in its order.
    columns: Vec<OrderBy>,
    /// Only the rows whose marks are `NULL` (PostgreSQL, SQLite).
    partial: bool,
    /// Only the rows where this mark is set (PostgreSQL, SQLite).
    not_null: Option<&'static str>,
    claim: bool,
}

/// The order a claim takes rows in: the description's, or the due column, then the id.
pub(crate) fn claim_order(desc: &TableDesc) -> Vec<OrderBy> {
    let mut order: Vec<OrderBy> = desc.order.to_vec();
    if order.is_empty()
        && let Some(due) = desc.due
    {
        order.push(OrderBy::asc(due.name));
    }
    if !order.iter().any(|o| o.column == desc.id.name) {
        order.push(OrderBy::asc(desc.id.name));
    }
    order
}

/// Whether one of a table's indexes (`indexes`: each one's columns in order) serves its
/// claims: past any leading marks read as `IS NULL`, its first column is the claim order's
/// first. A claim ordered by the id alone is served by the primary key.
pub fn serves_claims(desc: &TableDesc, indexes: &[Vec<String>]) -> bool {
    let order = claim_order(desc);
    let Some(first) = order.first() else {
        return true;
    };
    if first.column == desc.id.name {
        return true;
    }
    let marks: Vec<&str> = [desc.processed_at, desc.failed_at, desc.locked_until()]
        .into_iter()
        .flatten()
        .map(|c| c.name)
        .collect();
    indexes.iter().any(|columns| {
        columns
            .iter()
            .map(|c| c.trim())
            .find(|c| !marks.iter().any(|m| m.eq_ignore_ascii_case(c)))
            .is_some_and(|c| c.eq_ignore_ascii_case(first.column))
    })
}

/// A statement of fixed text, without binds or rows.
fn raw(dialect: Dialect, sql: &str) -> Statement {
    let mut s = Sql::new(dialect);
    s.push(sql);
    s.finish(StatementKind::CreateSchema, Output::Nothing)
}

impl Renderer<'_> {
    /// Lists the table's indexes: a row of each, with its name and its columns in order,
    /// separated by commas.
    pub(super) fn list_indexes(&self) -> Statement {
        let mut s = Sql::new(self.dialect);
        let schema = self.desc.table.rsplit_once('.').map(|(schema, _)| schema);
        match self.dialect {
            Dialect::Postgres => {
                s.push(
                    "SELECT CAST(c.relname AS TEXT) AS index_name, \
                     CAST(array_to_string(ARRAY(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY AS k(n, o) \
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o), ',') AS TEXT) AS index_columns \
                     FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid \
                     JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = ",
                );
                if schema.is_some() {
                    s.arg(super::Arg::Schema);
                } else {
                    s.push("current_schema()");
                }
                s.push(" AND t.relname = ").arg(super::Arg::TableName);
            }
            Dialect::MySql | Dialect::MariaDb => {
                s.push(
                    "SELECT index_name AS index_name, \
                     GROUP_CONCAT(column_name ORDER BY seq_in_index SEPARATOR ',') AS index_columns \
                     FROM information_schema.statistics WHERE table_schema = ",
                );
                if schema.is_some() {
                    s.arg(super::Arg::Schema);
                } else {
                    s.push("DATABASE()");
                }
                s.push(" AND table_name = ")
                    .arg(super::Arg::TableName)
                    .push(" GROUP BY index_name");
            }
            Dialect::Sqlite => {
                s.push(
                    "SELECT l.name AS index_name, \
                     (SELECT group_concat(name, ',') FROM (SELECT ii.name AS name FROM pragma_index_info(l.name",
                );
                if schema.is_some() {
                    s.push(", ").arg(super::Arg::Schema);
                }
                s.push(") ii ORDER BY ii.seqno)) AS index_columns FROM pragma_index_list(")
                    .arg(super::Arg::TableName);
                if schema.is_some() {
                    s.push(", ").arg(super::Arg::Schema);
                }
                s.push(") l");
            }
        }
        s.finish(
            StatementKind::ListIndexes,
            named(&[
                ("index_name", ColumnType::Text),
                ("index_columns", ColumnType::Text),
            ]),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Column, Hold, KeyPart};

    const ADVISORY: TableDesc = TableDesc {
        table: "jobs",
        id: Column::new("id").generated(),
        payload: Some(Column::new("payload")),
        attempt: Some(Column::new("attempt")),
        hold: Hold::Advisory {
            key: &[KeyPart::Literal("k-"), KeyPart::Column("channel")],
            custom_lock: false,
        },
        processed_at: None,
        due: Some(Column::new("due_at")),
        failed_at: Some(Column::new("failed_at")),
        error: Some(Column::new("error")),
        errors: None,
        order: &[],
        unique: &[],
    };

    #[test]
    fn postgres_creates_the_table_and_a_partial_claim_index() {
        let ddl = Ddl::new(Dialect::Postgres, &ADVISORY).statements();
        assert_eq!(
            ddl[0],
            "CREATE TABLE IF NOT EXISTS \"jobs\" (\n    \"id\" BIGINT GENERATED BY DEFAULT AS IDENTITY,\n    \
             \"payload\" BYTEA NOT NULL,\n    \"attempt\" INTEGER NOT NULL DEFAULT 0,\n    \
             \"due_at\" TIMESTAMPTZ NOT NULL DEFAULT now(),\n    \"failed_at\" TIMESTAMPTZ NULL,\n    \
             \"error\" TEXT NULL,\n    \"channel\" TEXT NOT NULL,\n    PRIMARY KEY (\"id\")\n)"
        );
        assert_eq!(
            ddl[1],
            "CREATE INDEX IF NOT EXISTS \"jobs_claim\" ON \"jobs\" (\"due_at\", \"id\") WHERE \"failed_at\" IS NULL"
        );
        assert_eq!(
            ddl[2],
            "CREATE INDEX IF NOT EXISTS \"jobs_failed\" ON \"jobs\" (\"failed_at\") WHERE \"failed_at\" IS NOT NULL"
        );
        assert_eq!(ddl.len(), 3);
    }

    #[test]
    fn mysql_writes_its_indexes_in_the_table_with_the_marks_first() {
        let ddl = Ddl::new(Dialect::MariaDb, &ADVISORY)
            .column_type("channel", "BIGINT NOT NULL")
            .statements();
        assert_eq!(ddl.len(), 1);
        assert!(
            ddl[0].contains("`id` BIGINT NOT NULL AUTO_INCREMENT"),
            "{}",
            ddl[0]
        );
        assert!(ddl[0].contains("`channel` BIGINT NOT NULL"), "{}", ddl[0]);
        assert!(
            ddl[0].contains("KEY `jobs_claim` (`failed_at`, `due_at`, `id`)"),
            "{}",
            ddl[0]
        );
        assert!(
            ddl[0].contains("KEY `jobs_failed` (`failed_at`)"),
            "{}",
            ddl[0]
        );
        let apart = Ddl::new(Dialect::MySql, &ADVISORY).create_indexes();
        assert_eq!(
            apart[0],
            "CREATE INDEX `jobs_claim` ON `jobs` (`failed_at`, `due_at`, `id`)"
        );
    }

    #[test]
    fn sqlite_declares_its_id_in_line_and_names_the_schema_on_the_index() {
        let desc = TableDesc {
            table: "aux.jobs",
            ..ADVISORY
        };
        let ddl = Ddl::new(Dialect::Sqlite, &desc).statements();
        assert!(ddl[0].starts_with("CREATE TABLE IF NOT EXISTS \"aux\".\"jobs\""));
        assert!(ddl[0].contains("\"id\" INTEGER PRIMARY KEY AUTOINCREMENT"));
        assert!(!ddl[0].contains("PRIMARY KEY (\"id\")"));
        assert_eq!(
            ddl[1],
            "CREATE INDEX IF NOT EXISTS \"aux\".\"jobs_claim\" ON \"jobs\" (\"due_at\", \"id\") WHERE \"failed_at\" IS NULL"
        );
    }

    #[test]
    fn a_table_ordered_by_its_id_needs_no_claim_index() {
        let desc = TableDesc {
            due: None,
            failed_at: None,
            ..ADVISORY
        };
        assert!(
            Ddl::new(Dialect::Postgres, &desc)
                .create_indexes()
                .is_empty()
        );
        assert!(
            Ddl::new(Dialect::Postgres, &desc)
                .create_claim_index()
                .is_none()
        );
        assert!(serves_claims(&desc, &[]));
    }

    #[test]
    fn unique_columns_and_descending_orders_are_written() {
        const ORDER: &[OrderBy] = &[OrderBy::desc("priority")];
        let desc = TableDesc {
            order: ORDER,
            unique: &["dedupe"],
            hold: Hold::RowLock,
            ..ADVISORY
        };
        let ddl = Ddl::new(Dialect::Postgres, &desc).statements();
        assert!(
            ddl[0].contains("\"priority\" BIGINT NOT NULL DEFAULT 0"),
            "{}",
            ddl[0]
        );
        assert!(ddl[0].contains("UNIQUE (\"dedupe\")"), "{}", ddl[0]);
        assert!(ddl[0].contains("\"dedupe\" TEXT NOT NULL"), "{}", ddl[0]);
        for dialect in [Dialect::Sqlite, Dialect::MySql] {
            let ddl = Ddl::new(dialect, &desc).create_table();
            assert_eq!(ddl.matches("dedupe").count(), 2, "{ddl}");
        }
        assert!(ddl[1].contains("(\"priority\" DESC, \"id\")"), "{}", ddl[1]);
    }

    #[test]
    fn the_claim_index_rule_reads_past_leading_marks() {
        let index = |cols: &[&str]| cols.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        assert!(serves_claims(&ADVISORY, &[index(&["due_at", "id"])]));
        assert!(serves_claims(
            &ADVISORY,
            &[index(&["id"]), index(&["FAILED_AT", "due_at", "id"])]
        ));
        assert!(!serves_claims(
            &ADVISORY,
            &[index(&["id"]), index(&["failed_at"])]
        ));
        assert!(!serves_claims(&ADVISORY, &[index(&["channel", "due_at"])]));
    }

    #[test]
    fn a_given_primary_key_type_replaces_the_table_key() {
        let ddl = Ddl::new(Dialect::Postgres, &ADVISORY)
            .column_type("id", "UUID PRIMARY KEY DEFAULT gen_random_uuid()")
            .create_table();
        assert!(ddl.contains("\"id\" UUID PRIMARY KEY DEFAULT gen_random_uuid()"));
        assert!(!ddl.contains("PRIMARY KEY (\"id\")"));
    }
}

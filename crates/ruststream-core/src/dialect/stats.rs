//! The statements that read a table's state for people: its counts ([`Statements::stats`])
//! and its failed rows ([`Statements::list_failed`]).

use super::render::Lead;
use super::{Arg, ColumnType, Dialect, OutColumn, Output, Renderer, Sql, Statement, StatementKind};
use crate::spec::TableDesc;
use crate::stats::{FailedRow, STATS_CAP, Stats};
use crate::value::{Time, Value};

use super::Statements;

/// Which failed rows a list reads: the first, those after [`Arg::Floor`], or the one of
/// [`Arg::Id`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Listing {
    First,
    After,
    ById,
}

impl Statements {
    /// One statement that reads `desc`'s counts ([`Stats`]), each counted up to [`STATS_CAP`]
    /// rows by a subquery an index answers, so its cost is bounded by the cap, not the table;
    /// and the database's time it read them at. Arguments: none.
    pub fn stats(dialect: Dialect, desc: &TableDesc) -> Statement {
        Renderer::new(dialect, desc).stats()
    }

    /// Reads up to [`Arg::Limit`] failed rows in id order, after [`Arg::Floor`] where `after`
    /// is set, or with `by_id` the one of [`Arg::Id`] ([`FailedRow`]). `None` for a table that
    /// keeps no failed rows.
    pub fn list_failed(
        dialect: Dialect,
        desc: &TableDesc,
        after: bool,
        by_id: bool,
    ) -> Option<Statement> {
        let failed = desc.failed_at?;
        let listing = match (after, by_id) {
            (_, true) => Listing::ById,
            (true, false) => Listing::After,
            (false, false) => Listing::First,
        };
        Some(Renderer::new(dialect, desc).list_failed(failed.name, listing))
    }
}

/// The columns of [`Statements::stats`]' one row.
const STATS_COLUMNS: [(&str, ColumnType); 7] = [
    ("due", ColumnType::Int),
    ("scheduled", ColumnType::Int),
    ("in_work", ColumnType::Int),
    ("failed", ColumnType::Int),
    ("processed", ColumnType::Int),
    ("oldest_due", ColumnType::Int),
    ("read_at", ColumnType::Int),
];

impl Renderer<'_> {
    /// A time expression as microseconds since the Unix epoch.
    /// A JSON cell read as text.
    fn json_text(&self, expr: &str) -> String {
        match self.dialect {
            Dialect::Postgres => format!("CAST({expr} AS TEXT)"),
            Dialect::MySql | Dialect::MariaDb => format!("CAST({expr} AS CHAR)"),
            Dialect::Sqlite => expr.to_owned(),
        }
    }

    fn micros(&self, expr: &str) -> String {
        super::statement::micros(self.dialect, expr)
    }

    /// `(SELECT COUNT(*) FROM (SELECT 1 FROM t <cond> LIMIT cap) c) AS name`: `cond` writes
    /// the `WHERE` clause, if any.
    fn capped_count(&self, s: &mut Sql, name: &str, cond: impl FnOnce(&mut Sql)) {
        s.push("(SELECT COUNT(*) FROM (SELECT 1 AS one FROM ")
            .push(&self.table());
        cond(s);
        s.push(&format!(" LIMIT {}) {name}_rows) AS {name}", STATS_CAP + 1));
    }

    fn marks_null(&self, s: &mut Sql) -> bool {
        let mut wrote = false;
        for mark in [self.desc.processed_at, self.desc.failed_at]
            .into_iter()
            .flatten()
        {
            if wrote {
                s.push(" AND ");
            }
            s.push(&self.q(mark.name)).push(" IS NULL");
            wrote = true;
        }
        wrote
    }

    pub(super) fn stats(&self) -> Statement {
        let d = *self.desc;
        let mut s = Sql::new(self.dialect);
        s.push("SELECT ");
        self.capped_count(&mut s, "due", |s| {
            self.claimable(s, Lead::Where);
        });
        s.push(", ");
        match d.due {
            Some(due) => self.capped_count(&mut s, "scheduled", |s| {
                s.push(" WHERE ");
                if self.marks_null(s) {
                    s.push(" AND ");
                }
                s.push(&self.q(due.name)).push(" > ");
                s.db_now();
            }),
            None => {
                s.push("0 AS scheduled");
            }
        }
        s.push(", ");
        match d.locked_until() {
            Some(lease) => self.capped_count(&mut s, "in_work", |s| {
                s.push(" WHERE ");
                if self.marks_null(s) {
                    s.push(" AND ");
                }
                s.push(&self.q(lease.name)).push(" > ");
                s.db_now();
            }),
            None => {
                s.push("NULL AS in_work");
            }
        }
        for (mark, name) in [(d.failed_at, "failed"), (d.processed_at, "processed")] {
            s.push(", ");
            match mark {
                Some(mark) => self.capped_count(&mut s, name, |s| {
                    s.push(" WHERE ")
                        .push(&self.q(mark.name))
                        .push(" IS NOT NULL");
                }),
                None => {
                    s.push(&format!("NULL AS {name}"));
                }
            }
        }
        s.push(", ");
        match d.due {
            Some(due) => {
                // The first row in the due column's order, not `MIN`: the index's order
                // answers it at its first claimable entry, where MySQL's `MIN` under the
                // lease's `OR` reads the whole range.
                s.push("(SELECT ")
                    .push(&self.micros(&self.q(due.name)))
                    .push(" FROM ")
                    .push(&self.table());
                self.claimable(&mut s, Lead::Where);
                s.push(" ORDER BY ")
                    .push(&self.q(due.name))
                    .push(" ASC LIMIT 1) AS oldest_due");
            }
            None => {
                s.push("NULL AS oldest_due");
            }
        }
        // The ages are the database's: the counts' time is its clock's.
        let now = self.micros(super::statement::db_now(self.dialect));
        s.push(", ").push(&now).push(" AS read_at");
        s.finish(StatementKind::Stats, super::named(&STATS_COLUMNS))
    }

    pub(super) fn list_failed(&self, failed: &str, listing: Listing) -> Statement {
        let d = *self.desc;
        let mut s = Sql::new(self.dialect);
        let mut columns = vec![OutColumn::new("id", ColumnType::Id)];
        s.push("SELECT ").push(&self.id()).push(" AS id");
        let optional = [
            (
                d.attempt.map(|c| self.q(c.name)),
                "attempt",
                ColumnType::Int,
            ),
            (d.error.map(|c| self.q(c.name)), "error", ColumnType::Text),
            (
                Some(self.micros(&self.q(failed))),
                "failed_at",
                ColumnType::Int,
            ),
            (
                d.payload.map(|c| self.q(c.name)),
                "payload",
                ColumnType::Bytes,
            ),
            (
                d.errors.map(|c| self.json_text(&self.q(c.name))),
                "errors",
                ColumnType::Text,
            ),
        ];
        for (expr, name, ty) in optional {
            let expr = expr.unwrap_or_else(|| "NULL".to_owned());
            s.push(", ").push(&expr).push(" AS ").push(name);
            columns.push(OutColumn::new(name, ty));
        }
        s.push(" FROM ")
            .push(&self.table())
            .push(" WHERE ")
            .push(&self.q(failed))
            .push(" IS NOT NULL");
        if listing == Listing::ById {
            s.push(" AND ").push(&self.id()).push(" = ").arg(Arg::Id);
        } else {
            if listing == Listing::After {
                s.push(" AND ").push(&self.id()).push(" > ").arg(Arg::Floor);
            }
            s.push(" ORDER BY ")
                .push(&self.id())
                .push(" ASC LIMIT ")
                .arg(Arg::Limit);
        }
        s.finish(
            StatementKind::ListFailed,
            Output::Rows {
                columns: columns.into(),
                raw: false,
            },
        )
    }
}

impl Stats {
    /// The counts in the one row of [`Statements::stats`], read at the database's time it
    /// answers, or at `at` where it answers none.
    pub fn from_values(table: &'static str, values: &[Value], at: Time) -> Result<Self, String> {
        let int = |i: usize| -> Result<Option<i64>, String> {
            match values.get(i) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Int(n)) => Ok(Some(*n)),
                Some(other) => Err(format!(
                    "the stats of table `{table}`: column `{}` holds {other}, not an integer",
                    STATS_COLUMNS[i].0
                )),
            }
        };
        let count = |i: usize| -> Result<Option<crate::stats::Count>, String> {
            Ok(int(i)?.map(|n| crate::stats::Count::capped(u64::try_from(n).unwrap_or(0))))
        };
        Ok(Stats {
            table,
            due: count(0)?.unwrap_or_default(),
            scheduled: count(1)?.unwrap_or_default(),
            in_work: count(2)?,
            failed: count(3)?,
            processed: count(4)?,
            oldest_due: int(5)?.map(Time),
            waiting: None,
            at: int(6)?.map_or(at, Time),
        })
    }
}

impl FailedRow {
    /// A row of [`Statements::list_failed`].
    pub fn from_values(values: Vec<Value>) -> Self {
        let mut it = values.into_iter();
        let id = it.next().unwrap_or(Value::Null);
        let attempt = it.next().and_then(|v| v.as_int());
        let error = match it.next() {
            Some(Value::Text(t)) => Some(t),
            _ => None,
        };
        let failed_at = it.next().and_then(|v| v.as_int()).map(Time);
        let payload = match it.next() {
            Some(Value::Bytes(b)) => Some(b),
            Some(Value::Text(t)) => Some(t.into_bytes()),
            _ => None,
        };
        let errors = match it.next() {
            Some(Value::Text(t)) => crate::stats::AttemptError::parse_all(&t),
            Some(Value::Bytes(b)) => {
                crate::stats::AttemptError::parse_all(&String::from_utf8_lossy(&b))
            }
            _ => Vec::new(),
        };
        FailedRow {
            id,
            attempt,
            error,
            failed_at,
            payload,
            errors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Column, Hold, KeyPart};

    const LEASE: TableDesc = TableDesc {
        table: "jobs",
        id: Column::new("id").generated(),
        payload: Some(Column::new("payload")),
        attempt: Some(Column::new("attempt")),
        hold: Hold::Lease {
            locked_until: Column::new("locked_until"),
        },
        processed_at: Some(Column::new("done_at")),
        due: Some(Column::new("due_at")),
        failed_at: Some(Column::new("failed_at")),
        error: Some(Column::new("error")),
        errors: None,
        order: &[],
        unique: &[],
    };

    #[test]
    fn postgres_counts_each_state_up_to_the_cap() {
        let s = Statements::stats(Dialect::Postgres, &LEASE);
        let now = "statement_timestamp()";
        let micros = |e: &str| format!("CAST(EXTRACT(EPOCH FROM {e}) * 1000000 AS BIGINT)");
        let (oldest, read_at) = (micros("\"due_at\""), micros(now));
        let cap = STATS_CAP + 1;
        assert_eq!(
            &*s.sql,
            format!(
                "SELECT (SELECT COUNT(*) FROM (SELECT 1 AS one FROM \"jobs\" WHERE \"done_at\" IS NULL AND \"failed_at\" IS NULL AND \"due_at\" <= {now} AND (\"locked_until\" IS NULL OR \"locked_until\" <= {now}) LIMIT {cap}) due_rows) AS due, \
                 (SELECT COUNT(*) FROM (SELECT 1 AS one FROM \"jobs\" WHERE \"done_at\" IS NULL AND \"failed_at\" IS NULL AND \"due_at\" > {now} LIMIT {cap}) scheduled_rows) AS scheduled, \
                 (SELECT COUNT(*) FROM (SELECT 1 AS one FROM \"jobs\" WHERE \"done_at\" IS NULL AND \"failed_at\" IS NULL AND \"locked_until\" > {now} LIMIT {cap}) in_work_rows) AS in_work, \
                 (SELECT COUNT(*) FROM (SELECT 1 AS one FROM \"jobs\" WHERE \"failed_at\" IS NOT NULL LIMIT {cap}) failed_rows) AS failed, \
                 (SELECT COUNT(*) FROM (SELECT 1 AS one FROM \"jobs\" WHERE \"done_at\" IS NOT NULL LIMIT {cap}) processed_rows) AS processed, \
                 (SELECT {oldest} FROM \"jobs\" WHERE \"done_at\" IS NULL AND \"failed_at\" IS NULL AND \"due_at\" <= {now} AND (\"locked_until\" IS NULL OR \"locked_until\" <= {now}) ORDER BY \"due_at\" ASC LIMIT 1) AS oldest_due, \
                 {read_at} AS read_at"
            )
        );
        assert!(s.args.is_empty(), "the counts bind no time: {:?}", s.args);
    }

    #[test]
    fn a_table_without_marks_or_lease_reads_null_for_them() {
        let desc = TableDesc {
            hold: Hold::Advisory {
                key: &[KeyPart::Column("k")],
                custom_lock: false,
            },
            processed_at: None,
            failed_at: None,
            due: None,
            error: None,
            errors: None,
            ..LEASE
        };
        for dialect in [Dialect::Postgres, Dialect::MariaDb, Dialect::Sqlite] {
            let s = Statements::stats(dialect, &desc);
            assert!(s.sql.contains(" LIMIT 100001) due_rows"), "{}", s.sql);
            assert!(!s.sql.contains("WHERE"), "{}", s.sql);
            for name in ["0 AS scheduled", "NULL AS in_work", "NULL AS failed"] {
                assert!(s.sql.contains(name), "{}", s.sql);
            }
            assert!(s.args.is_empty());
            let stats = Stats::from_values(
                "jobs",
                &[
                    Value::Int(3),
                    Value::Int(0),
                    Value::Null,
                    Value::Null,
                    Value::Null,
                    Value::Null,
                ],
                Time(0),
            )
            .unwrap();
            assert_eq!(stats.due.value(), 3);
            assert_eq!(stats.failed, None);
            assert_eq!(stats.oldest_due_age(), None);
        }
    }

    #[test]
    fn a_count_past_the_cap_reads_as_at_least_the_cap() {
        let values = [
            Value::Int(i64::try_from(STATS_CAP).unwrap() + 1),
            Value::Int(2),
            Value::Int(1),
            Value::Int(0),
            Value::Int(5),
            Value::Int(1_000_000),
        ];
        let stats = Stats::from_values("jobs", &values, Time(3_500_000)).unwrap();
        assert_eq!(stats.due.value(), STATS_CAP);
        assert!(!stats.due.is_exact());
        assert_eq!(stats.due.to_string(), format!("{STATS_CAP}+"));
        assert!(stats.scheduled.is_exact());
        assert_eq!(stats.in_work.map(|c| c.value()), Some(1));
        assert_eq!(
            stats.oldest_due_age(),
            Some(std::time::Duration::from_millis(2500))
        );
        let wrong = [Value::Text("x".into())];
        let error = Stats::from_values("jobs", &wrong, Time(0)).unwrap_err();
        assert!(
            error.contains("`jobs`") && error.contains("`due`"),
            "{error}"
        );
    }

    #[test]
    fn mysql_reads_failed_rows_after_an_id_with_times_in_microseconds() {
        let s = Statements::list_failed(Dialect::MySql, &LEASE, true, false).unwrap();
        assert_eq!(
            &*s.sql,
            "SELECT `id` AS id, `attempt` AS attempt, `error` AS error, \
             TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', `failed_at`) AS failed_at, \
             `payload` AS payload, NULL AS errors FROM `jobs` WHERE `failed_at` IS NOT NULL AND `id` > ? ORDER BY `id` ASC LIMIT ?"
        );
        assert_eq!(&*s.args, &[Arg::Floor, Arg::Limit]);
        let one = Statements::list_failed(Dialect::Sqlite, &LEASE, false, true).unwrap();
        assert!(
            one.sql
                .ends_with("WHERE \"failed_at\" IS NOT NULL AND \"id\" = ?1"),
            "{}",
            one.sql
        );
        let none = TableDesc {
            failed_at: None,
            ..LEASE
        };
        assert!(Statements::list_failed(Dialect::Postgres, &none, false, false).is_none());
        let row = FailedRow::from_values(vec![
            Value::Int(7),
            Value::Int(5),
            Value::Text("boom".into()),
            Value::Int(9),
            Value::Bytes(b"{}".to_vec()),
        ]);
        assert_eq!(row.id, Value::Int(7));
        assert_eq!(row.attempt, Some(5));
        assert_eq!(row.error.as_deref(), Some("boom"));
        assert_eq!(row.failed_at, Some(Time(9)));
        assert_eq!(row.payload.as_deref(), Some(&b"{}"[..]));
        assert!(row.errors.is_empty());
    }

    #[test]
    fn a_history_of_errors_is_read_as_text_and_parsed() {
        let desc = TableDesc {
            errors: Some(crate::Column::new("errors")),
            ..LEASE
        };
        for (dialect, expr) in [
            (Dialect::Postgres, r#"CAST("errors" AS TEXT) AS errors"#),
            (Dialect::MariaDb, "CAST(`errors` AS CHAR) AS errors"),
            (Dialect::Sqlite, r#""errors" AS errors"#),
        ] {
            let s = Statements::list_failed(dialect, &desc, false, false).unwrap();
            assert!(s.sql.contains(expr), "{dialect:?}: {}", s.sql);
        }
        let history = r#"[{"attempt": 1, "at": 5, "error": "one"}, {"x": 1},
            {"attempt": null, "at": 6, "error": "two"}]"#;
        let row = FailedRow::from_values(vec![
            Value::Int(7),
            Value::Int(2),
            Value::Text("two".into()),
            Value::Int(9),
            Value::Null,
            Value::Text(history.into()),
        ]);
        let read: Vec<(Option<i64>, Option<Time>, &str)> = row
            .errors
            .iter()
            .map(|e| (e.attempt, e.at, e.error.as_str()))
            .collect();
        assert_eq!(
            read,
            [
                (Some(1), Some(Time(5)), "one"),
                (None, Some(Time(6)), "two")
            ],
            "the entries in order; one without an error passed over"
        );
        let bad = FailedRow::from_values(vec![
            Value::Int(7),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Text("not json".into()),
        ]);
        assert!(
            bad.errors.is_empty(),
            "a cell that is no array reads as none"
        );
    }
}

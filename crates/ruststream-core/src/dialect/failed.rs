//! The statements of failed rows and of retries that wait: the failed mark, the retry's due
//! time and error, and the redrive and deletion of failed rows.

use super::{Arg, Dialect, Output, Renderer, Sql, Statement, StatementKind};
use crate::spec::ERRORS_KEPT;

/// Which failed rows a redrive or a deletion of failed rows selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailedRows {
    /// Every failed row.
    All,
    /// The failed rows among this many ids ([`Arg::IdAt`] `0..n`).
    Ids(usize),
    /// The failed rows whose error text contains a given text ([`Arg::ErrorLike`]).
    ErrorContains,
}

/// The `LIKE` pattern, escaped with `!`, of an error text that contains `text`.
pub fn error_like(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('%');
    for c in text.chars() {
        if matches!(c, '%' | '_' | '!') {
            out.push('!');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// Whether an assignment is the first of an update's `SET`, or follows another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Assign {
    First,
    Next,
}

impl Assign {
    fn sql(self) -> &'static str {
        match self {
            Assign::First => " SET ",
            Assign::Next => ", ",
        }
    }
}

impl Renderer<'_> {
    /// `, error = COALESCE(?, error)` where the table has an error column.
    fn set_error(&self, s: &mut Sql, assign: Assign) {
        if let Some(error) = self.desc.error {
            let error = self.q(error.name);
            s.push(assign.sql())
                .push(&error)
                .push(" = COALESCE(")
                .arg(Arg::Error)
                .push(", ")
                .push(&error)
                .push(")");
        }
    }

    /// `, errors = <errors with this attempt's entry>` where the table keeps a history of
    /// errors: the error, the attempt and the database's time appended, the oldest dropped
    /// past [`ERRORS_KEPT`]; a settlement without an error leaves it as it was. A cell that
    /// holds no JSON array starts a new one.
    fn set_errors(&self, s: &mut Sql, assign: Assign) {
        let Some(errors) = self.desc.errors else {
            return;
        };
        let e = self.q(errors.name);
        let attempt = self
            .desc
            .attempt
            .map_or_else(|| "NULL".to_owned(), |c| self.q(c.name));
        let now = super::statement::micros(self.dialect, super::statement::db_now(self.dialect));
        let kept = ERRORS_KEPT.to_string();
        s.push(assign.sql()).push(&e).push(" = CASE WHEN ");
        if self.dialect == Dialect::Postgres {
            // The argument's first use gives its type.
            s.push("CAST(").arg(Arg::Error).push(" AS TEXT)");
        } else {
            s.arg(Arg::Error);
        }
        s.push(" IS NULL THEN ").push(&e).push(" ELSE ");
        // `history` is the cell as an array, `fresh` the new entry.
        let (history, length, drop_first, append_open, text) = match self.dialect {
            Dialect::Postgres => (
                format!("CASE WHEN jsonb_typeof({e}) = 'array' THEN {e} ELSE '[]'::jsonb END"),
                "jsonb_array_length",
                "{} - 0",
                "({}) || jsonb_build_array(jsonb_build_object('attempt', {attempt}, 'at', {now}, 'error', ",
                "CAST(",
            ),
            Dialect::MySql | Dialect::MariaDb => (
                format!(
                    "CASE WHEN JSON_VALID({e}) THEN CASE WHEN JSON_TYPE({e}) = 'ARRAY' THEN {e} ELSE JSON_ARRAY() END ELSE JSON_ARRAY() END"
                ),
                "JSON_LENGTH",
                "JSON_REMOVE({}, '$[0]')",
                "JSON_ARRAY_APPEND({}, '$', JSON_OBJECT('attempt', {attempt}, 'at', {now}, 'error', ",
                "CONVERT(",
            ),
            Dialect::Sqlite => (
                format!(
                    "CASE WHEN json_valid({e}) THEN CASE WHEN json_type({e}) = 'array' THEN {e} ELSE '[]' END ELSE '[]' END"
                ),
                "json_array_length",
                "json_remove({}, '$[0]')",
                "json_insert({}, '$[#]', json_object('attempt', {attempt}, 'at', {now}, 'error', ",
                "",
            ),
        };
        let trimmed = format!(
            "CASE WHEN {length}({history}) >= {kept} THEN {} ELSE {history} END",
            drop_first.replace("{}", &history)
        );
        let open = append_open
            .replace("{}", &trimmed)
            .replace("{attempt}", &attempt)
            .replace("{now}", &now);
        s.push(&open).push(text).arg(Arg::Error);
        s.push(match self.dialect {
            Dialect::Postgres => " AS TEXT)))",
            Dialect::MySql | Dialect::MariaDb => " USING utf8mb4)))",
            Dialect::Sqlite => "))",
        });
        s.push(" END");
    }

    /// Marks a row failed; `fence` as for [`Renderer::settle`].
    pub(super) fn fail(&self, fence: Option<&str>) -> Option<Statement> {
        let failed = self.desc.failed_at?;
        let mut s = Sql::new(self.dialect);
        s.push("UPDATE ")
            .push(&self.table())
            .push(" SET ")
            .push(&self.q(failed.name))
            .push(" = ");
        s.db_now();
        self.set_error(&mut s, Assign::Next);
        self.set_errors(&mut s, Assign::Next);
        if let Some(lease) = self.desc.locked_until() {
            s.push(", ").push(&self.q(lease.name)).push(" = NULL");
        }
        s.push(" WHERE ").push(&self.id()).push(" = ").arg(Arg::Id);
        if let Some(lease) = fence {
            self.fence(&mut s, lease);
        }
        Some(s.finish(
            StatementKind::Fail {
                fenced: fence.is_some(),
            },
            Output::Affected,
        ))
    }

    /// Writes a retried row's due time and error; `fence` as for [`Renderer::settle`]. In the
    /// lease form without a due column the lease's expiry holds the row until then. `None`
    /// where there is nothing to write.
    pub(super) fn retry_later(&self, fence: Option<&str>) -> Option<Statement> {
        let mut s = Sql::new(self.dialect);
        s.push("UPDATE ").push(&self.table());
        let mut assign = Assign::First;
        if let Some(due) = self.desc.due {
            s.push(" SET ").push(&self.q(due.name)).push(" = ");
            s.db_now_plus(Arg::RetryIn);
            assign = Assign::Next;
        }
        if let Some(lease) = self.desc.locked_until() {
            s.push(assign.sql()).push(&self.q(lease.name)).push(" = ");
            match assign {
                Assign::First => s.db_now_plus(Arg::RetryIn),
                Assign::Next => s.push("NULL"),
            };
            assign = Assign::Next;
        }
        if self.desc.error.is_some() {
            self.set_error(&mut s, assign);
            assign = Assign::Next;
        }
        if self.desc.errors.is_some() {
            self.set_errors(&mut s, assign);
            assign = Assign::Next;
        }
        if assign == Assign::First {
            return None;
        }
        s.push(" WHERE ").push(&self.id()).push(" = ").arg(Arg::Id);
        if let Some(lease) = fence {
            self.fence(&mut s, lease);
        }
        Some(s.finish(
            StatementKind::RetryLater {
                fenced: fence.is_some(),
            },
            Output::Affected,
        ))
    }

    /// ` WHERE failed IS NOT NULL` and the rows `which` selects.
    fn failed_rows(&self, s: &mut Sql, failed: &str, which: FailedRows) {
        s.push(" WHERE ").push(&self.q(failed)).push(" IS NOT NULL");
        match which {
            FailedRows::All => {}
            FailedRows::Ids(n) => {
                s.push(" AND ").push(&self.id()).push(" IN (");
                for i in 0..n.max(1) {
                    if i > 0 {
                        s.push(", ");
                    }
                    s.arg(Arg::IdAt(i));
                }
                s.push(")");
            }
            FailedRows::ErrorContains => match self.desc.error {
                Some(error) => {
                    s.push(" AND ")
                        .push(&self.q(error.name))
                        .push(" LIKE ")
                        .arg(Arg::ErrorLike)
                        .push(" ESCAPE '!'");
                }
                // Without an error column no row's error contains anything.
                None => {
                    s.push(" AND 1 = 0");
                }
            },
        }
    }

    pub(super) fn redrive(&self, failed: &str, which: FailedRows) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push("UPDATE ")
            .push(&self.table())
            .push(" SET ")
            .push(&self.q(failed))
            .push(" = NULL");
        if let Some(error) = self.desc.error {
            s.push(", ").push(&self.q(error.name)).push(" = NULL");
        }
        if let Some(attempt) = self.desc.attempt {
            s.push(", ").push(&self.q(attempt.name)).push(" = 0");
        }
        if let Some(due) = self.desc.due {
            s.push(", ").push(&self.q(due.name)).push(" = ");
            s.db_now();
        }
        if let Some(lease) = self.desc.locked_until() {
            s.push(", ").push(&self.q(lease.name)).push(" = NULL");
        }
        self.failed_rows(&mut s, failed, which);
        s.finish(StatementKind::Redrive(which), Output::Affected)
    }

    pub(super) fn delete_failed(&self, failed: &str, which: FailedRows) -> Statement {
        let mut s = Sql::new(self.dialect);
        s.push("DELETE FROM ").push(&self.table());
        self.failed_rows(&mut s, failed, which);
        s.finish(StatementKind::DeleteFailed(which), Output::Affected)
    }
}

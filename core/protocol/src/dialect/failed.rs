//! The statements of failed rows and of retries that wait: the failed mark, the retry's due
//! time and error, and the redrive and deletion of failed rows.

use super::{Arg, Output, Renderer, Sql, Statement, StatementKind};

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

impl Renderer<'_> {
    /// `, error = COALESCE(?, error)` where the table has an error column.
    fn set_error(&self, s: &mut Sql, first: bool) {
        if let Some(error) = self.desc.error {
            let error = self.q(error.name);
            s.push(if first { " SET " } else { ", " })
                .push(&error)
                .push(" = COALESCE(")
                .arg(Arg::Error)
                .push(", ")
                .push(&error)
                .push(")");
        }
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
        self.set_error(&mut s, false);
        if let Some(lease) = self.desc.locked_until {
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
        let mut first = true;
        if let Some(due) = self.desc.due {
            s.push(" SET ").push(&self.q(due.name)).push(" = ");
            s.db_now_plus(Arg::RetryIn);
            first = false;
        }
        if let Some(lease) = self.desc.locked_until {
            s.push(if first { " SET " } else { ", " })
                .push(&self.q(lease.name))
                .push(" = ");
            if first {
                s.db_now_plus(Arg::RetryIn);
            } else {
                s.push("NULL");
            }
            first = false;
        }
        if self.desc.error.is_some() {
            self.set_error(&mut s, first);
            first = false;
        }
        if first {
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
        if let Some(lease) = self.desc.locked_until {
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

//! A table's state as people read it: its counts ([`Stats`]) and its failed rows
//! ([`FailedRow`]), read by [`Statements::stats`](crate::Statements::stats) and
//! [`Statements::list_failed`](crate::Statements::list_failed).

use std::fmt;
use std::time::Duration;

use crate::value::{Time, Value};

/// The most rows one count of [`Stats`] counts: a count that reaches it reads "at least"
/// ([`Count::is_exact`] is `false`), so that its cost stays bounded on a table of any size.
pub const STATS_CAP: u64 = 100_000;

/// A number of rows, counted up to [`STATS_CAP`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Count {
    value: u64,
    exact: bool,
}

impl Count {
    /// A count of `n` rows, read from a count of at most `STATS_CAP + 1` rows: more than the
    /// cap reads as the cap, not exact.
    pub fn capped(n: u64) -> Self {
        if n > STATS_CAP {
            Self {
                value: STATS_CAP,
                exact: false,
            }
        } else {
            Self {
                value: n,
                exact: true,
            }
        }
    }

    /// The rows counted: all of them where [`Count::is_exact`], else at least this many.
    pub fn value(self) -> u64 {
        self.value
    }

    /// Whether the count is every row, not the cap.
    pub fn is_exact(self) -> bool {
        self.exact
    }
}

impl fmt::Display for Count {
    /// `42`, or `100000+` past the cap.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.exact {
            write!(f, "{}", self.value)
        } else {
            write!(f, "{}+", self.value)
        }
    }
}

/// A queue table's counts at one time: jobs due, scheduled, in work, failed and processed,
/// and the oldest due job's age ([Stats](https://github.com/ruststream/ruststream/blob/main/docs/src/operating.md#stats)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    /// The table's name as its description gives it.
    pub table: &'static str,
    /// Rows a claim may take now (not processed, not failed, due, no lease running); in the
    /// row lock and advisory forms this includes the rows in work, which the table does not show.
    pub due: Count,
    /// Rows due later (a retry's delay, a publish with a due time).
    pub scheduled: Count,
    /// The lease form: rows whose lease runs (in work, or, on a table without a due column,
    /// waiting out a retry's delay); `None` in the other forms.
    pub in_work: Option<Count>,
    /// Rows marked failed; `None` where the table has no such column.
    pub failed: Option<Count>,
    /// Rows marked processed; `None` where the table has no such column.
    pub processed: Option<Count>,
    /// The earliest due time among the rows due, where the table has a due column (see
    /// [`Stats::oldest_due_age`]).
    pub oldest_due: Option<Time>,
    /// On a table with no due and no lease column, the rows waiting out a retry's delay in
    /// this process's memory (counted in `due` too); `None` elsewhere, or where no
    /// subscription of the table runs in this broker (the CLI's counts, a publisher's).
    pub waiting: Option<u64>,
    /// When the counts were read.
    pub at: Time,
}

impl Stats {
    /// How long the oldest due row has waited, at the time of the counts.
    pub fn oldest_due_age(&self) -> Option<Duration> {
        let oldest = self.oldest_due?;
        let micros = self.at.micros().saturating_sub(oldest.micros()).max(0);
        Some(Duration::from_micros(u64::try_from(micros).unwrap_or(0)))
    }
}

/// A failed row, as [`Statements::list_failed`](crate::Statements::list_failed) reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedRow {
    /// The row's id.
    pub id: Value,
    /// Its attempts, where the table counts them.
    pub attempt: Option<i64>,
    /// Its last error, where the table keeps one.
    pub error: Option<String>,
    /// When it failed.
    pub failed_at: Option<Time>,
    /// Its payload, where the table has one.
    pub payload: Option<Vec<u8>>,
    /// Its last errors, oldest first, where the table keeps a history of them.
    pub errors: Vec<AttemptError>,
}

/// One failed attempt in a row's history of errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptError {
    /// The attempt that failed, where the table counts attempts.
    pub attempt: Option<i64>,
    /// When it failed, by the database's clock.
    pub at: Option<Time>,
    /// The handler's error.
    pub error: String,
}

impl AttemptError {
    /// The entries of a history cell (a JSON array of `{"attempt", "at", "error"}`); what
    /// does not read as one is passed over.
    pub fn parse_all(json: &str) -> Vec<AttemptError> {
        let Ok(serde_json::Value::Array(entries)) = serde_json::from_str(json) else {
            return Vec::new();
        };
        entries
            .iter()
            .filter_map(|entry| {
                Some(AttemptError {
                    attempt: entry.get("attempt").and_then(serde_json::Value::as_i64),
                    at: entry
                        .get("at")
                        .and_then(serde_json::Value::as_i64)
                        .map(Time),
                    error: entry.get("error")?.as_str()?.to_owned(),
                })
            })
            .collect()
    }
}

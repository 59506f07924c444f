//! Replies read once, at the boundary, into what the machines use: taken rows, counted rows,
//! advisory candidates, a lock's answer, the ids a settlement statement returned.
//!
//! The columns come in the order the statement's [`Output::Rows`](crate::Output::Rows) lists
//! them, each read as its declared type: a taken row is the id, then the attempt where the
//! table has the column; a counted row the id and the count; a candidate the id and the key.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::types::{Reply, Row};
use crate::value::Value;

/// A row a claim took: its id, the attempt the take counted, the lease's expiry a lease claim
/// wrote (by the database's clock), and the driver's row.
#[derive(Debug)]
pub(super) struct Taken<R> {
    pub(super) id: Value,
    pub(super) attempt: Option<i64>,
    pub(super) until: Option<i64>,
    pub(super) raw: Option<R>,
}

impl<R> Taken<R> {
    /// Reads a taken row; `attempts`: the table has an attempt column, read second; a lease
    /// claim's expiry comes last. `add` is what the statement's count adds to the attempt it
    /// read (MySQL's lease claim reads the rows before it counts them).
    pub(super) fn read(row: Row<R>, attempts: bool, add: i64) -> Self {
        let mut values = row.values.into_iter();
        let id = values.next().unwrap_or(Value::Null);
        let attempt = if attempts {
            values.next().and_then(|v| v.as_int()).map(|a| a + add)
        } else {
            None
        };
        let until = values.next().and_then(|v| v.as_int());
        Self {
            id,
            attempt,
            until,
            raw: row.raw,
        }
    }
}

/// The row lock form: the row whose attempt a claim counted, with the count and the mark
/// that keeps other counts off it until its lock.
#[derive(Clone, Debug)]
pub(super) struct Counted {
    pub(super) id: Value,
    pub(super) attempt: i64,
    pub(super) mark: Value,
}

impl Counted {
    /// Reads a counted row: its id, its attempt and its mark; `add` is what the count adds to
    /// the attempt the row shows (MySQL reads it before it counts). A row whose attempt is
    /// `NULL` is one the count looked at and did not count.
    pub(super) fn read_counted<R>(row: Row<R>, add: i64) -> Option<Self> {
        let mut values = row.values.into_iter();
        let id = values.next().unwrap_or(Value::Null);
        let attempt = values.next().and_then(|v| v.as_int())?;
        let mark = values.next().unwrap_or(Value::Null);
        Some(Self {
            id,
            attempt: attempt + add,
            mark,
        })
    }
}

/// The advisory lock form: a due row and its key.
#[derive(Debug)]
pub(super) struct Candidate {
    pub(super) id: Value,
    pub(super) key: Arc<str>,
}

impl Candidate {
    /// The id of a candidate's row, unread.
    pub(super) fn id_of<R>(row: &Row<R>) -> Value {
        row.values.first().cloned().unwrap_or(Value::Null)
    }

    /// Reads a candidate; a `NULL` key is the empty key.
    pub(super) fn read<R>(row: Row<R>) -> Self {
        let mut values = row.values.into_iter();
        let id = values.next().unwrap_or(Value::Null);
        let key = match values.next() {
            Some(Value::Text(t)) => t,
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        Self {
            id,
            key: key.into(),
        }
    }
}

/// The rows of a reply; none for any other reply.
pub(super) fn rows_of<R>(reply: Reply<R>) -> Vec<Row<R>> {
    match reply {
        Reply::Rows(rows) => rows,
        _ => Vec::new(),
    }
}

/// A lock's or an unlock's answer: the service's own (`Reply::Bool`), or the database's, the
/// first column of the first row. Anything else is no.
pub(super) fn answer<R>(reply: Reply<R>) -> bool {
    match reply {
        Reply::Bool(b) => b,
        Reply::Rows(rows) => rows
            .first()
            .and_then(|r| r.values.first())
            .and_then(Value::as_bool)
            .unwrap_or(false),
        _ => false,
    }
}

/// Whether a statement affected any row.
pub(super) fn affected_any<R>(reply: &Reply<R>) -> bool {
    matches!(reply, Reply::Affected(n) if *n > 0)
}

/// The first column of the first row as an integer (a server process id).
pub(super) fn first_int<R>(reply: Reply<R>) -> Option<i64> {
    rows_of(reply)
        .into_iter()
        .next()
        .and_then(|r| r.values.into_iter().next())
        .and_then(|v| v.as_int())
}

/// The first column of the first row as text (a setting, a database's name).
pub(super) fn first_text<R>(reply: Reply<R>) -> Option<String> {
    rows_of(reply)
        .into_iter()
        .next()
        .and_then(|r| r.values.into_iter().next())
        .and_then(|v| match v {
            Value::Text(t) => Some(t),
            _ => None,
        })
}

/// The first column of every row: the ids a settlement statement returned, the names of the
/// table's columns.
pub(super) fn first_column<R>(reply: Reply<R>) -> BTreeSet<Value> {
    rows_of(reply)
        .into_iter()
        .filter_map(|row| row.values.into_iter().next())
        .collect()
}

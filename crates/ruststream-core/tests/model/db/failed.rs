//! Reads of the table's state (counts, failed rows) and the redrive or deletion of failed rows.

use ruststream_core::{Arg, FailedRows, Reply, Row, StatementKind, Value};

use super::{Call, Db, DbRow};

impl Db {
    /// The table's counts: ready, delayed, leased, failed, processed, the oldest due, the
    /// clock.
    pub(super) fn stats(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call { desc, clock, .. } = *c;
        let now = clock;
        let open = |r: &DbRow| {
            (desc.processed_at.is_none() || r.processed_at.is_none())
                && (desc.failed_at.is_none() || r.failed_at.is_none())
        };
        let leased = |r: &DbRow| r.locked_until.is_some_and(|t| t > now);
        let due_now = |r: &DbRow| desc.due.is_none() || r.due <= now;
        let count = |f: &dyn Fn(&DbRow) -> bool| {
            Value::Int(self.rows.values().filter(|r| f(r)).count() as i64)
        };
        let or_null = |present: bool, v: Value| if present { v } else { Value::Null };
        let oldest = self
            .rows
            .values()
            .filter(|r| open(r) && due_now(r) && !leased(r))
            .map(|r| r.due)
            .min();
        Reply::Rows(vec![Row::values(vec![
            count(&|r| open(r) && due_now(r) && !leased(r)),
            if desc.due.is_some() {
                count(&|r| open(r) && !due_now(r))
            } else {
                Value::Int(0)
            },
            or_null(
                desc.locked_until().is_some(),
                count(&|r| open(r) && leased(r)),
            ),
            or_null(desc.failed_at.is_some(), count(&|r| r.failed_at.is_some())),
            or_null(
                desc.processed_at.is_some(),
                count(&|r| r.processed_at.is_some()),
            ),
            match (desc.due, oldest) {
                (Some(_), Some(t)) => Value::Int(t),
                _ => Value::Null,
            },
            Value::Int(clock),
        ])])
    }

    /// The failed rows, page by page from a floor, or one of them.
    pub(super) fn list_failed(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call {
            statement, binds, ..
        } = *c;
        let floor = statement
            .args
            .iter()
            .position(|x| *x == Arg::Floor)
            .and_then(|i| binds[i].as_int());
        let only = statement
            .args
            .iter()
            .position(|x| *x == Arg::Id)
            .and_then(|i| binds[i].as_int());
        let limit = statement
            .args
            .iter()
            .position(|x| *x == Arg::Limit)
            .and_then(|i| binds[i].as_int())
            .unwrap_or(i64::MAX);
        Reply::Rows(
            self.rows
                .iter()
                .filter(|(id, r)| {
                    r.failed_at.is_some()
                        && floor.is_none_or(|f| **id > f)
                        && only.is_none_or(|o| **id == o)
                })
                .take(usize::try_from(limit).unwrap_or(usize::MAX))
                .map(|(id, r)| {
                    Row::values(vec![
                        Value::Int(*id),
                        Value::Int(r.attempt),
                        r.error.clone().map_or(Value::Null, Value::Text),
                        r.failed_at.map_or(Value::Null, Value::Int),
                        Value::Bytes(format!("{{\"row\":{id}}}").into_bytes()),
                    ])
                })
                .collect(),
        )
    }

    /// Redrives failed rows (queued again from their first attempt) or deletes them.
    pub(super) fn redrive_or_delete_failed(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call {
            desc,
            sess,
            statement,
            clock,
            ..
        } = *c;
        let which = match statement.kind {
            StatementKind::Redrive(w) | StatementKind::DeleteFailed(w) => w,
            _ => unreachable!(),
        };
        let picked: Option<Vec<i64>> = match which {
            FailedRows::Ids(n) => Some((0..n).map(|i| c.int(Arg::IdAt(i))).collect()),
            _ => None,
        };
        let contains: Option<String> = match which {
            FailedRows::ErrorContains => match c.arg(Arg::ErrorLike) {
                Value::Text(t) => Some(
                    t.trim_matches('%')
                        .replace("!%", "%")
                        .replace("!_", "_")
                        .replace("!!", "!"),
                ),
                _ => None,
            },
            _ => None,
        };
        let ids: Vec<i64> = self
            .rows
            .iter()
            .filter(|(_, r)| r.failed_at.is_some())
            .filter(|(id, _)| picked.as_ref().is_none_or(|p| p.contains(id)))
            .filter(|(_, r)| {
                contains
                    .as_ref()
                    .is_none_or(|c| r.error.as_deref().is_some_and(|e| e.contains(c.as_str())))
            })
            .map(|(id, _)| *id)
            .collect();
        let redrive = matches!(statement.kind, StatementKind::Redrive(_));
        let now = if redrive && desc.due.is_some() {
            clock
        } else {
            0
        };
        for &id in &ids {
            self.write(sess, id, |r| {
                if redrive {
                    let r = r.as_mut().expect("row");
                    r.failed_at = None;
                    r.error = None;
                    r.attempt = 0;
                    r.locked_until = None;
                    r.due = now;
                } else {
                    *r = None;
                }
            });
        }
        Reply::Affected(ids.len() as u64)
    }
}

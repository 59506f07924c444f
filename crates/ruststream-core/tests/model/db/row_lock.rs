//! The row lock form's statements: the claim's lock, the counts of attempts and their marks.

use ruststream_core::{Arg, Reply, Row, StatementKind, Value};

use super::{Call, Db};

impl Db {
    /// The row lock claim: locks the first claimable row no other transaction holds.
    pub(super) fn lock_row(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call {
            desc,
            sess,
            statement,
            clock,
            in_tx,
            ..
        } = *c;
        assert!(in_tx, "FOR UPDATE outside a transaction");
        let now = clock;
        let id = self
            .ordered(desc, now, &c.passed())
            .into_iter()
            .find(|id| !self.locked_by_other(*id, sess));
        match id {
            Some(id) => {
                self.row_locks.insert(id, sess);
                Reply::Rows(vec![self.row_reply(desc, id, &statement.output)])
            }
            None => Reply::Rows(Vec::new()),
        }
    }

    /// The count (`CountRow`) or MySQL's select of ids (`SelectRowId`): counts and marks
    /// the first rows it may, or locks them.
    pub(super) fn count_rows(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call {
            dialect,
            desc,
            sess,
            statement,
            clock,
            in_tx,
            ..
        } = *c;
        let now = clock;
        let limit = usize::try_from(c.int(Arg::Limit)).expect("a limit");
        assert!(limit >= 1, "a count of no rows");
        let floor = c.floor();
        // MySQL's select leaves out the rows another count marked (`IS_FREE_LOCK`)
        // before its LIMIT; PostgreSQL's CTE locks them and passes them over after.
        let select = statement.kind == StatementKind::SelectRowId;
        let ids: Vec<i64> = self
            .ordered(desc, now, &c.passed())
            .into_iter()
            .filter(|id| *id >= floor && !self.locked_by_other(*id, sess))
            .filter(|id| !select || !self.marks.contains_key(id))
            .take(limit)
            .collect();
        let mut rows = Vec::new();
        let mut counted = 0;
        for id in ids {
            let mut attempt = Value::Int(self.rows[&id].attempt);
            if statement.kind == StatementKind::CountRow {
                assert!(!in_tx, "the count commits on its own");
                // The count's CTE locks the rows, then counts the first `take` of
                // them whose marks it takes; the others come back uncounted.
                let take = usize::try_from(c.int(Arg::Take)).expect("a take");
                if counted < take && self.try_mark(sess, id) {
                    counted += 1;
                    self.write(sess, id, |r| r.as_mut().expect("row").attempt += 1);
                    attempt = Value::Int(self.rows[&id].attempt);
                } else {
                    attempt = Value::Null;
                }
            } else {
                assert!(in_tx, "FOR UPDATE outside a transaction");
                self.row_locks.insert(id, sess);
            }
            rows.push(Row::values(vec![
                Value::Int(id),
                attempt,
                Self::mark_value(dialect, id),
            ]));
        }
        Reply::Rows(rows)
    }

    /// Locks a counted row at the attempt its count wrote, passing over one held elsewhere.
    pub(super) fn lock_row_by_id(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call {
            desc,
            sess,
            statement,
            clock,
            in_tx,
            ..
        } = *c;
        assert!(in_tx, "FOR UPDATE outside a transaction");
        let id = c.int(Arg::Id);
        let now = clock;
        let attempt = c.int(Arg::Attempt);
        // `SKIP LOCKED`: a row another transaction holds (a count that looks at it) is
        // passed over, and the claim tries again.
        if self.locked_by_other(id, sess) {
            self.skipped_counted += 1;
            return Reply::Rows(Vec::new());
        }
        let lockable = self
            .rows
            .get(&id)
            .is_some_and(|r| self.claimable(desc, r, now) && r.attempt == attempt);
        if !lockable {
            if self.rows.get(&id).is_some_and(|r| r.attempt != attempt) {
                self.superseded += 1;
            }
            return Reply::Rows(Vec::new());
        }
        self.row_locks.insert(id, sess);
        if statement.kind == StatementKind::LockRowByIdUnmarking {
            // The lock took the row: the select list releases the count's mark.
            let marked = Self::mark_row(&c.arg(Arg::MarkAt(0)));
            if self.marks.get(&marked) == Some(&sess) {
                self.marks.remove(&marked);
            } else {
                self.violations.push(format!(
                    "session {sess} releases the mark of row {marked} it does not hold"
                ));
            }
        }
        Reply::Rows(vec![self.row_reply(desc, id, &statement.output)])
    }

    /// Takes the marks of counted rows without waiting: which it took.
    pub(super) fn mark_rows(&mut self, c: &Call<'_>, n: usize) -> Reply<i64> {
        let Call { sess, .. } = *c;
        let rows = (0..n)
            .map(|i| {
                let id = Self::mark_row(&c.arg(Arg::MarkAt(i)));
                let taken = self.try_mark(sess, id);
                Row::values(vec![Value::Int(i as i64), Value::Bool(taken)])
            })
            .collect();
        Reply::Rows(rows)
    }

    /// Releases the marks of counted rows the session holds.
    pub(super) fn unmark_rows(&mut self, c: &Call<'_>, n: usize) -> Reply<i64> {
        let Call { sess, .. } = *c;
        for i in 0..n {
            let id = Self::mark_row(&c.arg(Arg::MarkAt(i)));
            if self.marks.get(&id) == Some(&sess) {
                self.marks.remove(&id);
            } else {
                self.violations.push(format!(
                    "session {sess} releases the mark of row {id} it does not hold"
                ));
            }
        }
        Reply::Done
    }

    /// Counts an attempt on each row it names.
    pub(super) fn count_attempt(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call {
            sess, statement, ..
        } = *c;
        let mut affected = 0;
        let ids = statement
            .args
            .iter()
            .filter(|a| matches!(a, Arg::IdAt(_)))
            .count();
        for i in 0..ids {
            let id = c.int(Arg::IdAt(i));
            if self.rows.contains_key(&id) {
                self.write(sess, id, |r| r.as_mut().expect("row").attempt += 1);
                affected += 1;
            }
        }
        Reply::Affected(affected)
    }
}

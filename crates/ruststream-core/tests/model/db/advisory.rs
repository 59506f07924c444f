//! The advisory form's statements: candidates with their keys, the keys' locks and the take.

use ruststream_core::{Arg, Reply, Row, StatementKind, Value};

use super::{Call, Db, candidate_key, render_key};

impl Db {
    /// The advisory claim's candidates: claimable rows with their keys, past the keys passed
    /// over.
    pub(super) fn candidates(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call {
            desc,
            statement,
            binds,
            clock,
            ..
        } = *c;
        let now = clock;
        let limit = usize::try_from(c.int(Arg::Limit)).expect("a limit");
        // The keys the claim passes over: none of their rows is a candidate.
        let excluded: Vec<&Value> = statement
            .args
            .iter()
            .zip(binds)
            .filter(|(a, _)| matches!(a, Arg::ExcludedKey(_)))
            .map(|(_, v)| v)
            .collect();
        Reply::Rows(
            self.ordered(desc, now, &c.passed())
                .into_iter()
                .filter(|id| {
                    let key = Value::Text(render_key(desc, *id, &self.rows[id]));
                    *id >= c.floor() && !excluded.contains(&&key)
                })
                .take(limit)
                .map(|id| {
                    Row::values(vec![
                        Value::Int(id),
                        candidate_key(desc, id, &self.rows[&id]),
                    ])
                })
                .collect(),
        )
    }

    /// Takes a key's advisory lock without waiting: whether it did.
    pub(super) fn try_lock(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call { sess, .. } = *c;
        let key = c.arg(Arg::Key);
        let taken = match self.advisory.get_mut(&key) {
            Some((holder, n)) if *holder == sess => {
                *n += 1;
                true
            }
            Some(_) => false,
            None => {
                self.advisory.insert(key, (sess, 1));
                true
            }
        };
        Reply::Rows(vec![Row::values(vec![Value::Bool(taken)])])
    }

    /// Releases a key's advisory lock once: whether the session held it.
    pub(super) fn unlock(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call { sess, .. } = *c;
        let key = c.arg(Arg::Key);
        let released = match self.advisory.get_mut(&key) {
            Some((holder, n)) if *holder == sess => {
                *n -= 1;
                if *n == 0 {
                    self.advisory.remove(&key);
                }
                true
            }
            _ => false,
        };
        Reply::Rows(vec![Row::values(vec![Value::Bool(released)])])
    }

    /// The advisory take: counts the attempt of a row still claimable.
    pub(super) fn take(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call {
            desc,
            sess,
            statement,
            clock,
            ..
        } = *c;
        let id = c.int(Arg::Id);
        let now = clock;
        let claimable = self
            .rows
            .get(&id)
            .is_some_and(|r| self.claimable(desc, r, now));
        if !claimable {
            return if statement.kind == StatementKind::Take {
                Reply::Rows(Vec::new())
            } else {
                Reply::Affected(0)
            };
        }
        if desc.attempt.is_some() {
            self.write(sess, id, |r| r.as_mut().expect("row").attempt += 1);
        }
        if statement.kind == StatementKind::Take {
            Reply::Rows(vec![self.row_reply(desc, id, &statement.output)])
        } else {
            Reply::Affected(1)
        }
    }

    pub(super) fn read_row(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call {
            desc, statement, ..
        } = *c;
        let id = c.int(Arg::Id);
        if self.rows.contains_key(&id) {
            Reply::Rows(vec![self.row_reply(desc, id, &statement.output)])
        } else {
            Reply::Rows(Vec::new())
        }
    }
}

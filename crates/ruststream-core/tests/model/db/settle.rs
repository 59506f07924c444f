//! Settlements of one row: acknowledgements, rejections and retries, fenced by the lease.

use ruststream_core::{Arg, Reply, StatementKind, Value};

use super::{Call, Db};

impl Db {
    /// Whether the row `id` is there and, for a fenced statement, still holds the fence and no
    /// other session's lock: else the settlement touches nothing.
    fn may_settle(&self, c: &Call<'_>, id: i64, fenced: bool) -> bool {
        let Some(row) = self.rows.get(&id) else {
            return false;
        };
        !fenced
            || (row.locked_until == Some(c.int(Arg::Fence)) && !self.locked_by_other(id, c.sess))
    }

    /// An acknowledgement: deletes the row or marks it processed, fenced by its lease.
    pub(super) fn settle_done(&mut self, c: &Call<'_>, fenced: bool) -> Reply<i64> {
        let Call {
            desc,
            sess,
            statement,
            clock,
            ..
        } = *c;
        let id = c.int(Arg::Id);
        if !self.may_settle(c, id, fenced) {
            return Reply::Affected(0);
        }
        if matches!(statement.kind, StatementKind::Delete { .. }) {
            self.write(sess, id, |r| *r = None);
        } else {
            let now = clock;
            let lease = desc.locked_until().is_some();
            self.write(sess, id, |r| {
                let r = r.as_mut().expect("row");
                r.processed_at = Some(now);
                if lease {
                    r.locked_until = None;
                }
            });
        }
        Reply::Affected(1)
    }

    /// A rejection or a retry: marks the row failed, or due again after its delay.
    pub(super) fn settle_failed(&mut self, c: &Call<'_>, fenced: bool) -> Reply<i64> {
        let Call {
            desc,
            sess,
            statement,
            clock,
            ..
        } = *c;
        let id = c.int(Arg::Id);
        if !self.may_settle(c, id, fenced) {
            return Reply::Affected(0);
        }
        let error = statement
            .args
            .contains(&Arg::Error)
            .then(|| match c.arg(Arg::Error) {
                Value::Text(t) => Some(t),
                _ => None,
            })
            .flatten();
        let fail = matches!(statement.kind, StatementKind::Fail { .. });
        let now = clock;
        let retry_at = (!fail && (desc.due.is_some() || desc.locked_until().is_some()))
            .then(|| clock + c.int(Arg::RetryIn));
        let (due, lease) = (desc.due.is_some(), desc.locked_until().is_some());
        self.write(sess, id, |r| {
            let r = r.as_mut().expect("row");
            if let Some(error) = error {
                r.error = Some(error);
            }
            if fail {
                r.failed_at = Some(now);
                r.locked_until = None;
            } else if let Some(at) = retry_at {
                if due {
                    r.due = at;
                    r.locked_until = None;
                } else if lease {
                    r.locked_until = Some(at);
                }
            }
        });
        Reply::Affected(1)
    }
}

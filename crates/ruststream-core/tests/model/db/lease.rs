//! The lease form's statements: claims that lease rows, extensions, releases and batches of
//! settlements.

use ruststream_core::{Arg, Reply, Row, StatementKind, Value};

use super::{Call, Db};

impl Db {
    /// The lease claim: leases the first claimable rows and counts their attempts.
    pub(super) fn claim_lease(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call {
            desc,
            sess,
            statement,
            clock,
            ..
        } = *c;
        let now = clock;
        let until = clock + c.int(Arg::LeaseFor);
        let limit = usize::try_from(c.int(Arg::Limit)).expect("a limit");
        let floor = c.floor();
        let ids: Vec<i64> = self
            .ordered(desc, now, &c.passed())
            .into_iter()
            .filter(|id| *id >= floor && !self.locked_by_other(*id, sess))
            .take(limit)
            .collect();
        let mut rows = Vec::new();
        for id in ids {
            let counts = desc.attempt.is_some();
            self.write(sess, id, |r| {
                let r = r.as_mut().expect("row");
                r.locked_until = Some(until);
                if counts {
                    r.attempt += 1;
                }
            });
            rows.push(self.row_reply(desc, id, &statement.output));
        }
        Reply::Rows(rows)
    }

    /// MySQL's lease claim: locks the rows to lease, read with the expiry they get.
    pub(super) fn select_lease(&mut self, c: &Call<'_>) -> Reply<i64> {
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
        let limit = usize::try_from(c.int(Arg::Limit)).expect("a limit");
        let ids: Vec<i64> = self
            .ordered(desc, now, &c.passed())
            .into_iter()
            .filter(|id| !self.locked_by_other(*id, sess))
            .take(limit)
            .collect();
        let mut rows = Vec::new();
        // The expiry the leases get, read with the rows.
        let until = clock + c.int(Arg::LeaseFor);
        for id in ids {
            self.row_locks.insert(id, sess);
            let mut row = self.row_reply(desc, id, &statement.output);
            if let Some(last) = row.values.last_mut() {
                *last = Value::Int(until);
            }
            rows.push(row);
        }
        Reply::Rows(rows)
    }

    /// Leases the rows a `SelectLease` locked, counting their attempts.
    pub(super) fn mark_lease(&mut self, c: &Call<'_>, n: usize) -> Reply<i64> {
        let Call { desc, sess, .. } = *c;
        let until = c.int(Arg::Fence);
        let mut affected = 0;
        for i in 0..n {
            let id = c.int(Arg::IdAt(i));
            if self.rows.contains_key(&id) {
                let counts = desc.attempt.is_some();
                self.write(sess, id, |r| {
                    let r = r.as_mut().expect("row");
                    r.locked_until = Some(until);
                    if counts {
                        r.attempt += 1;
                    }
                });
                affected += 1;
            }
        }
        Reply::Affected(affected)
    }

    /// Moves a held lease's expiry on, or releases it: nothing where the lease changed.
    pub(super) fn extend_or_release_lease(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call {
            sess, statement, ..
        } = *c;
        let id = c.int(Arg::Id);
        let fence = c.int(Arg::Fence);
        let holds = self
            .rows
            .get(&id)
            .is_some_and(|r| r.locked_until == Some(fence));
        if !holds || self.locked_by_other(id, sess) {
            return Reply::Affected(0);
        }
        let until = if statement.kind == StatementKind::ExtendLease {
            let until = fence + c.int(Arg::Extend);
            self.moved.insert((id, fence), until);
            Some(until)
        } else {
            None
        };
        self.write(sess, id, |r| r.as_mut().expect("row").locked_until = until);
        Reply::Affected(1)
    }

    /// A batch of lease settlements: each row whose lease still holds is settled.
    pub(super) fn settle_leases(&mut self, c: &Call<'_>, rows: usize) -> Reply<i64> {
        let Call {
            desc, sess, clock, ..
        } = *c;
        let mut settled = Vec::new();
        for i in 0..rows {
            let id = c.int(Arg::IdAt(i));
            let holds = self
                .rows
                .get(&id)
                .is_some_and(|row| row.locked_until == Some(c.int(Arg::FenceAt(i))));
            if !holds || self.locked_by_other(id, sess) {
                continue;
            }
            if desc.processed_at.is_none() {
                self.write(sess, id, |r| *r = None);
            } else {
                let now = clock;
                self.write(sess, id, |r| {
                    let r = r.as_mut().expect("row");
                    r.processed_at = Some(now);
                    r.locked_until = None;
                });
            }
            settled.push(Row::values(vec![Value::Int(id)]));
        }
        Reply::Rows(settled)
    }
}

//! Transactions, savepoints and inserts: the statements around the claims and settlements.

use ruststream_core::{Arg, Reply, Value};

use super::{Call, Db};

impl Db {
    /// BEGIN: the session opens a transaction.
    pub(super) fn begin(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call { sess, in_tx, .. } = *c;
        assert!(!in_tx, "BEGIN inside a transaction");
        self.sessions.get_mut(&sess).expect("session").in_tx = true;
        Reply::Done
    }

    pub(super) fn commit_statement(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call { sess, .. } = *c;
        self.commit(sess);
        Reply::Done
    }

    pub(super) fn rollback_statement(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call { sess, .. } = *c;
        self.rollback(sess);
        Reply::Done
    }

    /// Undoes what handlers wrote since the savepoint marked before the lend.
    pub(super) fn rollback_to_savepoint(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call { sess, .. } = *c;
        // The savepoint is marked just before the transaction is lent: what the
        // handler wrote goes.
        self.sessions
            .get_mut(&sess)
            .expect("session")
            .effects
            .clear();
        Reply::Done
    }

    /// Inserts the published rows, one per run of the row's arguments.
    pub(super) fn publish(&mut self, c: &Call<'_>) -> Reply<i64> {
        let Call {
            desc,
            sess,
            statement,
            binds,
            clock,
            in_tx,
            ..
        } = *c;
        // One row per run of the row's arguments: a batch repeats them.
        let per_row = statement
            .args
            .iter()
            .skip(1)
            .position(|x| Some(x) == statement.args.first())
            .map_or(statement.args.len(), |i| i + 1)
            .max(1);
        let rows = (binds.len() / per_row).max(1);
        for row in 0..rows {
            let args = &statement.args[row * per_row..(row + 1) * per_row];
            let binds = &binds[row * per_row..(row + 1) * per_row];
            let of = |a: Arg| args.iter().position(|x| *x == a).map(|i| &binds[i]);
            let channel = of(Arg::Column("channel"))
                .and_then(Value::as_int)
                .unwrap_or(0);
            // A row published without a due time is due at the database's time.
            let due = if desc.due.is_some() {
                of(Arg::Due).and_then(Value::as_int).unwrap_or(clock)
            } else {
                0
            };
            let id = self.insert(channel, due);
            if in_tx {
                self.sessions
                    .get_mut(&sess)
                    .expect("session")
                    .undo
                    .push((id, None));
            }
        }
        Reply::Affected(rows as u64)
    }
}

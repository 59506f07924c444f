//! What a [`Sim`] saw: the commands it ran and the events its processes answered, read back by
//! process, connection, statement kind or row.

use ruststream_core::{
    Arg, BrokerError, ClosedCounts, ConnId, DbError, Delivered, DeliveryId, Event, Outcome,
    PublishId, StatementKind, Time, Value,
};
use std::collections::BTreeSet;
use std::time::Duration;

use super::{Entry, Exec, OTHER_SYSTEM, Op, Ran, Sim};
use crate::db::{DbRow, SessId, lock_arg};

impl Sim {
    pub(crate) fn mark(&self) -> usize {
        self.journal.len()
    }

    pub(crate) fn runs(&self, p: usize, since: usize) -> Vec<&Ran> {
        self.journal[since..]
            .iter()
            .filter_map(|e| match e {
                Entry::Ran(r) if r.proc == p => Some(r),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn ops(&self, p: usize, since: usize) -> Vec<Op> {
        self.runs(p, since)
            .into_iter()
            .map(|r| r.op.clone())
            .collect()
    }

    /// The ops on the connection of `p`'s first command since `since`: one flow's, where a
    /// claim runs beside it.
    pub(crate) fn first_flow_ops(&self, p: usize, since: usize) -> Vec<Op> {
        match self.runs(p, since).first() {
            Some(first) => self.ops_on(p, first.conn, since),
            None => Vec::new(),
        }
    }

    pub(crate) fn ops_on(&self, p: usize, conn: ConnId, since: usize) -> Vec<Op> {
        self.runs(p, since)
            .into_iter()
            .filter(|r| r.conn == conn)
            .map(|r| r.op.clone())
            .collect()
    }

    /// The runs of a statement kind.
    pub(crate) fn runs_of(&self, p: usize, since: usize, kind: StatementKind) -> Vec<&Ran> {
        self.runs(p, since)
            .into_iter()
            .filter(|r| r.op == Exec(kind))
            .collect()
    }

    pub(crate) fn events(&self, p: usize, since: usize) -> Vec<Event<i64>> {
        self.journal[since..]
            .iter()
            .filter_map(|e| match e {
                Entry::Event { proc, event, .. } if *proc == p => Some(event.clone()),
                _ => None,
            })
            .collect()
    }

    /// The index in the journal of the first event of `p` that matches.
    /// The index in the journal of `p`'s subscription's `Ready`: what ran after its check.
    pub(crate) fn ready_at(&self, p: usize) -> usize {
        let sub = self.procs[p].sub;
        self.event_index(p, |e| *e == Event::Ready { sub })
            .expect("the subscription is ready")
    }

    pub(crate) fn event_index(
        &self,
        p: usize,
        matches: impl Fn(&Event<i64>) -> bool,
    ) -> Option<usize> {
        self.journal.iter().position(
            |e| matches!(e, Entry::Event { proc, event, .. } if *proc == p && matches(event)),
        )
    }

    pub(crate) fn delivered(&self, p: usize, since: usize) -> Vec<Delivered<i64>> {
        self.events(p, since)
            .into_iter()
            .filter_map(|e| match e {
                Event::Delivered(d) => Some(d),
                _ => None,
            })
            .collect()
    }

    /// The ids the statements of `kind` that `p` ran since `since` started at.
    pub(crate) fn floors(&self, p: usize, since: usize, kind: StatementKind) -> Vec<Value> {
        self.runs_of(p, since, kind)
            .into_iter()
            .filter_map(|r| {
                let st = r.statement.as_ref()?;
                let i = st.args.iter().position(|a| *a == Arg::Floor)?;
                Some(r.binds[i].clone())
            })
            .collect()
    }

    /// Acknowledges every row `p` was handed but `row`, 100 ms apart, until `row` is handed
    /// again after `since` (at most 40 times): claims keep running past it. Answers when.
    pub(crate) fn ack_others_until(
        &mut self,
        row: i64,
        since: usize,
        done: &mut BTreeSet<i64>,
    ) -> Option<Time> {
        for _ in 0..40 {
            if self.delivered_rows(0, since).contains(&row) {
                return Some(self.now);
            }
            for other in self.delivered_rows(0, 0) {
                if other != row && done.insert(other) {
                    let d = self.delivery(0, other);
                    self.settle(0, d, Outcome::Ack);
                }
            }
            self.run();
            self.advance(Duration::from_millis(100));
        }
        None
    }

    pub(crate) fn delivered_rows(&self, p: usize, since: usize) -> Vec<i64> {
        self.delivered(p, since)
            .iter()
            .map(|d| d.row.expect("the driver row"))
            .collect()
    }

    /// The time of the first delivery of `row` by `p` since `since`.
    pub(crate) fn delivered_at(&self, p: usize, since: usize, row: i64) -> Option<Time> {
        self.journal[since..].iter().find_map(|e| match e {
            Entry::Event {
                proc,
                event: Event::Delivered(d),
                at,
                ..
            } if *proc == p && d.row == Some(row) => Some(*at),
            _ => None,
        })
    }

    /// The last delivery of `row` by `p`.
    pub(crate) fn delivery(&self, p: usize, row: i64) -> DeliveryId {
        self.delivered(p, 0)
            .iter()
            .rev()
            .find(|d| d.row == Some(row))
            .unwrap_or_else(|| panic!("row {row} was never delivered"))
            .delivery
    }

    /// The connection whose claim statement read `row` last: the delivery's connection.
    pub(crate) fn conn_of(&self, p: usize, row: i64) -> ConnId {
        self.runs(p, 0)
            .into_iter()
            .rev()
            .find(|r| {
                matches!(
                    r.op,
                    Exec(
                        StatementKind::LockRow
                            | StatementKind::LockRowById
                            | StatementKind::LockRowByIdUnmarking
                            | StatementKind::Take
                            | StatementKind::ReadRow
                    )
                ) && r.raw_rows().contains(&row)
            })
            .unwrap_or_else(|| panic!("no claim read row {row}"))
            .conn
    }

    pub(crate) fn sess_of(&self, p: usize, conn: ConnId) -> SessId {
        self.procs[p].adapter.conns[&conn]
    }

    /// Every `Closed` event of `p`, with the connections held then.
    pub(crate) fn closed(&self, p: usize) -> Vec<(ClosedCounts, usize)> {
        self.journal
            .iter()
            .filter_map(|e| match e {
                Entry::Event {
                    proc,
                    event: Event::Closed(counts),
                    held,
                    ..
                } if *proc == p => Some((*counts, *held)),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn row(&self, id: i64) -> &DbRow {
        self.db
            .rows
            .get(&id)
            .unwrap_or_else(|| panic!("row {id} is not in the table"))
    }

    pub(crate) fn executed(&self, kind: StatementKind) -> usize {
        self.db.executed.get(&kind).copied().unwrap_or(0)
    }

    pub(crate) fn in_work(&self, p: usize) -> usize {
        self.procs[p].broker.in_work(self.procs[p].sub)
    }

    pub(crate) fn statements(&self, p: usize) -> &ruststream_core::Statements {
        self.procs[p]
            .broker
            .statements(self.procs[p].sub)
            .expect("the subscription's statements")
    }

    /// A session of another system that holds the advisory lock of `key`.
    pub(crate) fn hold_elsewhere(&mut self, key: &str) -> SessId {
        let sess = self.db.acquire(OTHER_SYSTEM);
        self.db
            .advisory
            .insert(lock_arg(self.dialect, key), (sess, 1));
        sess
    }
}

impl Sim {
    /// Publishes `rows` rows of `channel` in one batch.
    pub(crate) fn publish_all(
        &mut self,
        p: usize,
        channel: i64,
        rows: usize,
    ) -> Result<PublishId, BrokerError> {
        let publisher = self.procs[p].publisher;
        let batch = (0..rows).map(|_| self.message(channel)).collect();
        let result = self.procs[p].broker.publish_all(publisher, batch, self.now);
        self.poll(p);
        result
    }

    /// The results of the publishes answered since `since`.
    pub(crate) fn published(
        &self,
        p: usize,
        since: usize,
    ) -> Vec<(PublishId, Result<(), DbError>)> {
        self.events(p, since)
            .into_iter()
            .filter_map(|e| match e {
                Event::Published { publish, result } => Some((publish, result.map(drop))),
                _ => None,
            })
            .collect()
    }
}

//! Publishes: rows written into a table, one insert or several in one transaction, and on
//! PostgreSQL the notifications that wake other processes' subscriptions, at most one per
//! [`NOTIFY_EVERY`] per publisher.

use std::collections::{BTreeMap, VecDeque};

use crate::dialect::{Arg, Dialect, FailedRows, Statement, Statements};
use crate::spec::{DescError, TableDesc};
use crate::stats::{FailedRow, Stats};
use crate::types::{Action, Event, PublishId, Published, PublisherId, ReadTable, Reply, TableRead};
use crate::value::{DbError, Time, Value};

use super::options::{BrokerError, FailedRowsOf, NOTIFY_EVERY, PUBLISH_BATCH, Publish};
use super::{Broker, State, Step, Sweep};

mod flow;

use flow::{Ended, Next, PublishRun, Purpose};
pub(super) use flow::{PublishFlow, PublishStage};

/// Whether an insert notifies the table's listeners (PostgreSQL) itself, or leaves it to a
/// notification that follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Notice {
    Sent,
    Deferred,
}

/// What a change of failed rows does to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FailedChange {
    /// Back to the queue, due now.
    Redrive,
    /// Deleted.
    Delete,
}

/// A table publishes write into, with its statements.
#[derive(Debug)]
pub(super) struct Publisher {
    desc: TableDesc,
    statement: Statement,
    /// `BEGIN` and `COMMIT`, around a batch of several inserts.
    begin: Statement,
    commit: Statement,
    /// The inserts of a batch, by the rows they write.
    batches: BTreeMap<usize, Statement>,
    /// PostgreSQL: the inserts without the notification, by the rows they write, and the
    /// notification on its own ([`NOTIFY_EVERY`]).
    quiet_batches: BTreeMap<usize, Statement>,
    notify: Option<Statement>,
    /// When this publisher's last notifying statement started.
    notified_at: Option<Time>,
    /// When the notification owed for quiet inserts that took effect is due.
    pub(super) notify_due: Option<Time>,
}

impl Publisher {
    pub(super) fn new(dialect: Dialect, desc: TableDesc) -> Self {
        let statements = Statements::render(dialect, &desc, 1);
        Self {
            desc,
            statement: statements.publish,
            begin: statements.begin,
            commit: statements.commit,
            batches: BTreeMap::new(),
            quiet_batches: BTreeMap::new(),
            notify: Statements::notify(dialect, &desc),
            notified_at: None,
            notify_due: None,
        }
    }

    /// The insert of `rows` rows, notifying or `quiet`, rendered once per size; a table whose
    /// rows have no column to write takes its one-row insert.
    fn insert(&mut self, dialect: Dialect, rows: usize, notice: Notice) -> Statement {
        let quiet = notice == Notice::Deferred;
        if rows == 1 && !quiet {
            return self.statement.clone();
        }
        let desc = self.desc;
        let one = &self.statement;
        let rendered = if quiet {
            &mut self.quiet_batches
        } else {
            &mut self.batches
        };
        rendered
            .entry(rows)
            .or_insert_with(|| {
                if quiet {
                    Statements::publish_quiet(dialect, &desc, rows)
                } else {
                    Statements::publish_rows(dialect, &desc, rows)
                }
                .unwrap_or_else(|| one.clone())
            })
            .clone()
    }

    /// The binds of `row` for the single-row insert. A column the row names that the insert
    /// does not write (a misspelt name, a column the table's key does not read) fails the
    /// publish, naming it.
    fn binds(&self, row: &Publish) -> Result<Vec<Value>, BrokerError> {
        let writes = |name: &str| {
            self.statement
                .args
                .iter()
                .any(|arg| matches!(arg, Arg::Column(c) if *c == name))
        };
        if let Some((unknown, _)) = row.columns.iter().find(|(name, _)| !writes(name)) {
            return Err(BrokerError::UnknownColumn {
                table: self.desc.table,
                column: unknown,
                writes: self
                    .statement
                    .args
                    .iter()
                    .filter_map(|arg| match arg {
                        Arg::Column(c) => Some(*c),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let mut missing = None;
        let binds = self.statement.binds(|arg| match arg {
            Arg::Id => row.id.clone().unwrap_or_else(|| {
                missing = Some(self.desc.id.name);
                Value::Null
            }),
            Arg::Payload => Value::Bytes(row.payload.clone()),
            // No due time: the statement makes the row due at the database's time.
            Arg::Due => row.due.map_or(Value::Null, |due| Value::Int(due.micros())),
            Arg::Column(name) => row
                .columns
                .iter()
                .find(|(c, _)| *c == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| {
                    missing = Some(name);
                    Value::Null
                }),
            _ => Value::Null,
        });
        match missing {
            Some(column) => Err(BrokerError::MissingValue {
                table: self.desc.table,
                column,
            }),
            None => Ok(binds),
        }
    }

    /// Whether the table deduplicates its publishes: each row then takes a statement of its
    /// own, whose count of rows written tells whether it was already there.
    fn deduplicates(&self) -> bool {
        !self.desc.unique.is_empty()
    }

    /// The inserts of `binds` (one row each), up to [`PUBLISH_BATCH`] rows per statement (one
    /// where the table deduplicates its publishes).
    fn inserts(
        &mut self,
        dialect: Dialect,
        binds: Vec<Vec<Value>>,
        notice: Notice,
    ) -> VecDeque<(Statement, Vec<Value>)> {
        let mut inserts = VecDeque::new();
        let mut binds = binds.into_iter().peekable();
        let per_statement = if self.deduplicates() {
            1
        } else {
            PUBLISH_BATCH
        };
        while binds.peek().is_some() {
            let chunk: Vec<Vec<Value>> = binds.by_ref().take(per_statement).collect();
            let statement = self.insert(dialect, chunk.len(), notice);
            if statement.args.len() == chunk.iter().map(Vec::len).sum::<usize>() {
                inserts.push_back((statement, chunk.concat()));
            } else {
                // Rows with no column to write: one `DEFAULT VALUES` insert each.
                let one = self.insert(dialect, 1, notice);
                for binds in chunk {
                    inserts.push_back((one.clone(), binds));
                }
            }
        }
        inserts
    }
}

/// The rows of a deduplicated publish (one insert each) whose insert wrote nothing.
fn skipped(written: &[u64]) -> Vec<usize> {
    written
        .iter()
        .enumerate()
        .filter(|(_, n)| **n == 0)
        .map(|(row, _)| row)
        .collect()
}

/// The inserts of jobs into a table, for a caller that runs them itself: in a transaction the
/// service holds (an outbox), or on a connection without a broker; [`Inserts::statements`]
/// answers each statement with its binds, in order.
// Up to `PUBLISH_BATCH` rows go in one insert, so more rows take several statements, which
// are all or nothing only inside one transaction. On PostgreSQL each insert notifies the
// subscriptions listening in other processes, in the caller's transaction: they hear of the
// rows when it commits, and not at all when it rolls back.
#[derive(Debug)]
pub struct Inserts {
    dialect: Dialect,
    publisher: Publisher,
}

impl Inserts {
    /// The inserts into `desc`'s table in `dialect`, each rendered once per size.
    pub fn new(dialect: Dialect, desc: TableDesc) -> Self {
        Self {
            dialect,
            publisher: Publisher::new(dialect, desc),
        }
    }

    /// The dialect the statements are rendered in.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The table's description.
    pub fn desc(&self) -> &TableDesc {
        &self.publisher.desc
    }

    /// What a publish of [`Inserts::statements`] wrote, from the rows each of its statements
    /// wrote, in order: on a table that deduplicates its publishes each row has a statement
    /// of its own, and a statement that wrote none was a row already there.
    pub fn published(&self, written: &[u64]) -> Published {
        Published {
            skipped: if self.publisher.deduplicates() {
                skipped(written)
            } else {
                Vec::new()
            },
        }
    }

    /// The statements that write `rows`, each with its binds, in order; a row due at no time of
    /// its own is due at the database's time when it is written. Fails, naming the table and column, for a row that gives no
    /// value for a column the table needs or names one the insert does not write.
    pub fn statements(
        &mut self,
        rows: &[Publish],
    ) -> Result<Vec<(Statement, Vec<Value>)>, BrokerError> {
        let binds = rows
            .iter()
            .map(|row| self.publisher.binds(row))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self
            .publisher
            .inserts(self.dialect, binds, Notice::Sent)
            .into())
    }
}

impl<R> Broker<R> {
    /// Starts a publish of `rows` through `publisher`.
    pub(super) fn start_publish(
        &mut self,
        publisher: PublisherId,
        rows: Vec<Publish>,
    ) -> Result<PublishId, BrokerError> {
        let now = self.now;
        let dialect = self.dialect;
        let p = self
            .publishers
            .get_mut(publisher.0)
            .ok_or(BrokerError::Unknown("publisher"))?;
        let binds = rows
            .iter()
            .map(|row| p.binds(row))
            .collect::<Result<Vec<_>, _>>()?;
        // PostgreSQL: a notification commits one at a time with the other notifying
        // transactions of the database, so a publisher notifies at most once per
        // `NOTIFY_EVERY` and owes one notification after the inserts it left quiet.
        let quiet = p.notify.is_some()
            && !binds.is_empty()
            && p.notified_at
                .is_some_and(|t| now < t.plus(NOTIFY_EVERY) && now >= t);
        if p.notify.is_some() && !quiet && !binds.is_empty() {
            p.notified_at = Some(now);
        }
        let notice = if quiet {
            Notice::Deferred
        } else {
            Notice::Sent
        };
        let inserts = p.inserts(dialect, binds, notice);
        let in_tx = inserts.len() > 1;
        let run = PublishRun {
            in_tx,
            quiet,
            internal: false,
        };
        let written = Vec::new();
        Ok(self.run_publish(publisher, inserts, run, Purpose::Publish { written }))
    }

    /// `publisher`, at `now`, where the broker still runs.
    fn open_publisher(
        &mut self,
        publisher: PublisherId,
        now: Time,
    ) -> Result<&Publisher, BrokerError> {
        self.now = now;
        if self.state != State::Running {
            return Err(BrokerError::Closed);
        }
        self.publishers
            .get(publisher.0)
            .ok_or(BrokerError::Unknown("publisher"))
    }

    /// Starts a redrive or a deletion (`change`) of the failed rows `which` selects in
    /// `publisher`'s table.
    pub(super) fn change_failed(
        &mut self,
        publisher: PublisherId,
        which: FailedRowsOf,
        change: FailedChange,
        now: Time,
    ) -> Result<PublishId, BrokerError> {
        let dialect = self.dialect;
        let p = self.open_publisher(publisher, now)?;
        let selects = match &which {
            FailedRowsOf::All => FailedRows::All,
            FailedRowsOf::Ids(ids) => FailedRows::Ids(ids.len()),
            FailedRowsOf::ErrorContains(_) => FailedRows::ErrorContains,
        };
        let statement = match change {
            FailedChange::Redrive => Statements::redrive(dialect, &p.desc, selects),
            FailedChange::Delete => Statements::delete_failed(dialect, &p.desc, selects),
        }
        .ok_or(DescError::NeedsColumn {
            table: p.desc.table,
            setting: match change {
                FailedChange::Redrive => "a redrive of failed rows",
                FailedChange::Delete => "a deletion of failed rows",
            },
            role: "failed_at",
            method: ".failed(..)` (`#[field(failed_at)]`)",
        })?;
        let binds = statement.binds(|arg| match (arg, &which) {
            (Arg::IdAt(i), FailedRowsOf::Ids(ids)) => ids.get(i).cloned().unwrap_or(Value::Null),
            (Arg::ErrorLike, FailedRowsOf::ErrorContains(text)) => {
                Value::Text(crate::dialect::error_like(text))
            }
            _ => Value::Int(now.micros()),
        });
        let mut steps = VecDeque::from([(statement, binds)]);
        if let Some(notify) = p.notify.clone().filter(|_| change == FailedChange::Redrive) {
            steps.push_back((notify, Vec::new()));
        }
        let change = Purpose::Change { affected: 0 };
        let id = self.run_publish(publisher, steps, PublishRun::default(), change);
        self.drive();
        Ok(id)
    }

    /// Starts a read of `publisher`'s table's state: its counts, or failed rows.
    pub(super) fn start_read(
        &mut self,
        publisher: PublisherId,
        read: ReadTable,
        now: Time,
    ) -> Result<PublishId, BrokerError> {
        let dialect = self.dialect;
        let p = self.open_publisher(publisher, now)?;
        let statement = match &read {
            ReadTable::Stats => Some(Statements::stats(dialect, &p.desc)),
            ReadTable::Failed { after, .. } => {
                Statements::list_failed(dialect, &p.desc, after.is_some(), false)
            }
            ReadTable::FailedRow(_) => Statements::list_failed(dialect, &p.desc, false, true),
        }
        .ok_or(DescError::NeedsColumn {
            table: p.desc.table,
            setting: "a list of failed rows",
            role: "failed_at",
            method: ".failed(..)` (`#[field(failed_at)]`)",
        })?;
        let binds = statement.binds(|arg| match (arg, &read) {
            (Arg::Limit, ReadTable::Failed { limit, .. }) => Value::Int(i64::from(*limit)),
            (Arg::Floor, ReadTable::Failed { after, .. }) => after.clone().unwrap_or(Value::Null),
            (Arg::Id, ReadTable::FailedRow(id)) => id.clone(),
            _ => Value::Int(now.micros()),
        });
        let steps = VecDeque::from([(statement, binds)]);
        let rows = Vec::new();
        let id = self.run_publish(
            publisher,
            steps,
            PublishRun::default(),
            Purpose::Read { read, rows },
        );
        self.drive();
        Ok(id)
    }

    fn run_publish(
        &mut self,
        publisher: PublisherId,
        inserts: VecDeque<(Statement, Vec<Value>)>,
        run: PublishRun,
        purpose: Purpose,
    ) -> PublishId {
        let id = PublishId(self.next_publish);
        self.next_publish += 1;
        let conn = self.new_conn();
        let flow = PublishFlow::new(publisher, conn, inserts, run, purpose);
        self.publishes.insert(id, flow);
        self.send(
            conn,
            Action::Acquire,
            Step::Publish {
                publish: id,
                stage: PublishStage::Acquire,
            },
        );
        id
    }

    /// The reply to a publish's command: the flow decides, the broker carries it out.
    pub(super) fn on_publish(&mut self, publish: PublishId, stage: PublishStage, reply: Reply<R>) {
        let Some(flow) = self.publishes.get_mut(&publish) else {
            return;
        };
        let conn = flow.conn;
        match flow.on_reply(stage, reply, &self.publishers[flow.publisher.0]) {
            Next::Send(action, stage) => self.send(conn, action, Step::Publish { publish, stage }),
            Next::Forget => {
                self.conns.forget(conn);
                self.end_publish(publish);
            }
            Next::End => self.end_publish(publish),
        }
    }

    /// A publish ended: the notification its quiet inserts owe, and its report.
    fn end_publish(&mut self, publish: PublishId) {
        let Some(flow) = self.publishes.remove(&publish) else {
            return;
        };
        let Ended {
            publisher,
            owes_notice,
            internal,
            purpose,
            result,
        } = flow.end();
        if owes_notice {
            let now = self.now;
            let p = &mut self.publishers[publisher.0];
            let due = p.notified_at.map_or(now, |t| t.plus(NOTIFY_EVERY)).max(now);
            if p.notify_due.is_none_or(|t| t > due) {
                p.notify_due = Some(due);
            }
            if self.state == State::ShuttingDown {
                self.notify_owed(Sweep::All);
            }
        }
        let event = match purpose {
            Purpose::Read { read, rows } => {
                let table = self.publishers[publisher.0].desc.table;
                let result = result.and_then(|()| self.table_read(table, read, rows));
                Event::Read { publish, result }
            }
            Purpose::Change { affected } => Event::Changed {
                publish,
                result: result.map(|()| affected),
            },
            Purpose::Publish { .. } if internal => return,
            Purpose::Publish { written } => {
                let deduplicates = self.publishers[publisher.0].deduplicates();
                let skipped = if deduplicates {
                    skipped(&written)
                } else {
                    Vec::new()
                };
                Event::Published {
                    publish,
                    result: result.map(|()| Published { skipped }),
                }
            }
        };
        self.events.push_back(event);
    }

    /// What a read of `table`'s state says, from the rows it returned.
    fn table_read(
        &mut self,
        table: &'static str,
        read: ReadTable,
        rows: Vec<Vec<Value>>,
    ) -> Result<TableRead, DbError> {
        match read {
            ReadTable::Stats => {
                let row = rows.first().map_or(&[][..], |r| &r[..]);
                Stats::from_values(table, row, self.now)
                    .map(|stats| TableRead::Stats(self.with_waiting(stats)))
                    .map_err(|message| DbError::new(crate::ErrorKind::Other, message))
            }
            ReadTable::Failed { .. } | ReadTable::FailedRow(_) => Ok(TableRead::Failed(
                rows.into_iter().map(FailedRow::from_values).collect(),
            )),
        }
    }

    /// PostgreSQL: the notifications owed for quiet inserts, those due (or all of them, at
    /// the shutdown).
    pub(super) fn notify_owed(&mut self, which: Sweep) {
        let now = self.now;
        for i in 0..self.publishers.len() {
            let p = &mut self.publishers[i];
            let due = p
                .notify_due
                .is_some_and(|t| which == Sweep::All || t <= now);
            let Some(statement) = p.notify.clone().filter(|_| due) else {
                continue;
            };
            p.notify_due = None;
            p.notified_at = Some(now);
            let inserts = VecDeque::from([(statement, Vec::new())]);
            let run = PublishRun {
                internal: true,
                ..PublishRun::default()
            };
            let written = Vec::new();
            self.run_publish(PublisherId(i), inserts, run, Purpose::Publish { written });
        }
    }
}

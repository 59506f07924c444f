//! One publish on its connection: the inserts (in a transaction where there are several), a
//! change of failed rows, or a read of the table's state. The flow owns its state and answers
//! what it does next; the broker sends the commands and reports the end.

use std::collections::VecDeque;

use crate::dialect::Statement;
use crate::types::{Action, ConnId, PublisherId, ReadTable, Reply};
use crate::value::{DbError, Value};

use super::Publisher;

/// Where a publish is.
#[derive(Clone, Copy, Debug)]
pub(in crate::broker) enum PublishStage {
    Acquire,
    Begin,
    Insert,
    Commit,
    Release,
    Close,
}

/// How a publish's inserts run.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PublishRun {
    /// In one transaction.
    pub(super) in_tx: bool,
    /// Without notifying: a notification follows them.
    pub(super) quiet: bool,
    /// The broker's own notification: no [`Event::Published`](crate::Event::Published).
    pub(super) internal: bool,
}

/// What a publish is for, and so what its end reports.
#[derive(Debug)]
pub(super) enum Purpose {
    /// Rows written: the rows each insert wrote, in order (on a table that deduplicates its
    /// publishes, one insert per row).
    Publish { written: Vec<u64> },
    /// A change of failed rows: the rows it changed.
    Change { affected: u64 },
    /// A read of the table's state: the values of the rows it returned.
    Read {
        read: ReadTable,
        rows: Vec<Vec<Value>>,
    },
}

/// A publish in flight.
#[derive(Debug)]
pub(in crate::broker) struct PublishFlow {
    pub(super) publisher: PublisherId,
    pub(super) conn: ConnId,
    /// The statements still to run, in order.
    inserts: VecDeque<(Statement, Vec<Value>)>,
    run: PublishRun,
    purpose: Purpose,
    result: Option<Result<(), DbError>>,
}

/// What a publish does after a reply.
#[derive(Debug)]
pub(super) enum Next {
    /// Sends the action on the publish's connection; its reply comes back at the stage.
    Send(Action, PublishStage),
    /// The connection was never acquired: forget it, and end.
    Forget,
    /// The connection went back: end.
    End,
}

/// How a publish ended.
#[derive(Debug)]
pub(super) struct Ended {
    pub(super) publisher: PublisherId,
    /// Quiet inserts took effect: the publisher owes their notification.
    pub(super) owes_notice: bool,
    /// The broker's own notification: nothing to report.
    pub(super) internal: bool,
    pub(super) purpose: Purpose,
    pub(super) result: Result<(), DbError>,
}

impl PublishFlow {
    /// A publish of `inserts` through `publisher` on `conn`, for `purpose`.
    pub(super) fn new(
        publisher: PublisherId,
        conn: ConnId,
        inserts: VecDeque<(Statement, Vec<Value>)>,
        run: PublishRun,
        purpose: Purpose,
    ) -> Self {
        Self {
            publisher,
            conn,
            inserts,
            run,
            purpose,
            result: None,
        }
    }

    /// The reply to the command of `stage`: what the publish does next. `p` is its publisher.
    pub(super) fn on_reply<R>(
        &mut self,
        stage: PublishStage,
        reply: Reply<R>,
        p: &Publisher,
    ) -> Next {
        if let Reply::Failed(error) = reply {
            if self.result.is_none() {
                self.result = Some(Err(error));
            }
            return match stage {
                PublishStage::Acquire => Next::Forget,
                // Closing the session ends a transaction left open: nothing is written.
                PublishStage::Begin | PublishStage::Insert | PublishStage::Commit => {
                    Next::Send(Action::Close, PublishStage::Close)
                }
                PublishStage::Release | PublishStage::Close => Next::End,
            };
        }
        match (stage, reply, &mut self.purpose) {
            (PublishStage::Insert, Reply::Affected(n), Purpose::Publish { written }) => {
                written.push(n);
            }
            (PublishStage::Insert, Reply::Affected(n), Purpose::Change { affected }) => {
                *affected += n;
            }
            (PublishStage::Insert, Reply::Rows(returned), Purpose::Read { rows, .. }) => {
                rows.extend(returned.into_iter().map(|row| row.values));
            }
            _ => {}
        }
        let in_tx = self.run.in_tx;
        let next = match stage {
            PublishStage::Acquire if in_tx => Some((p.begin.clone(), PublishStage::Begin)),
            PublishStage::Acquire | PublishStage::Begin | PublishStage::Insert => {
                match self.inserts.pop_front() {
                    Some((statement, binds)) => {
                        let action = Action::Execute { statement, binds };
                        return Next::Send(action, PublishStage::Insert);
                    }
                    None if in_tx => Some((p.commit.clone(), PublishStage::Commit)),
                    None => None,
                }
            }
            PublishStage::Commit => None,
            PublishStage::Release | PublishStage::Close => return Next::End,
        };
        match next {
            Some((statement, stage)) => {
                let binds = Vec::new();
                Next::Send(Action::Execute { statement, binds }, stage)
            }
            None => {
                self.result = Some(Ok(()));
                Next::Send(Action::Release, PublishStage::Release)
            }
        }
    }

    /// The publish's end, for the broker to report.
    pub(super) fn end(self) -> Ended {
        let result = self.result.unwrap_or(Ok(()));
        Ended {
            publisher: self.publisher,
            owes_notice: self.run.quiet && result.is_ok(),
            internal: self.run.internal,
            purpose: self.purpose,
            result,
        }
    }
}

//! What a subscription keeps for its form alone: the row lock form's counts, the lease
//! form's settlements and gathering, the advisory lock form's rendered candidates.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::super::claim::ClaimId;
use crate::dialect::Statement;
use crate::spec::Hold;
use crate::types::DeliveryId;
use crate::value::Time;

/// A subscription's state that one form only reads, as its table holds rows.
#[derive(Debug)]
pub(in crate::broker) enum FormState {
    RowLock(RowLockState),
    Lease(LeaseState),
    Advisory(AdvisoryState),
}

impl FormState {
    /// The empty state of the form `hold` is.
    pub(in crate::broker) fn new(hold: Hold) -> Self {
        match hold {
            Hold::RowLock => FormState::RowLock(RowLockState::default()),
            Hold::Lease { .. } => FormState::Lease(LeaseState::default()),
            Hold::Advisory { .. } => FormState::Advisory(AdvisoryState::default()),
        }
    }
}

/// The row lock form: the counts of claims on a table with an attempt column.
#[derive(Debug, Default)]
pub(in crate::broker) struct RowLockState {
    pub(in crate::broker) counts: CountQueue,
}

/// The lease form: its settlements, and the wait of its next claim for the handlers.
#[derive(Debug, Default)]
pub(in crate::broker) struct LeaseState {
    pub(in crate::broker) settles: SettleQueue,
    /// Until when the claim due waits for the handlers that run
    /// ([`Sub::gathers`](super::Sub::gathers)).
    pub(in crate::broker) gather_until: Option<Time>,
    /// How long the last claim took, from its start to its end.
    pub(in crate::broker) claim_took: Duration,
    /// On the servers: rows whose handlers have ended and whose settlements still run. Up to
    /// `workers` of them hold no worker's slot (see ARCHITECTURE.md).
    pub(in crate::broker) settling_freed: usize,
}

/// The advisory lock form: the candidates that pass over `n` keys, by `n` and whether they
/// start at the floor.
#[derive(Debug, Default)]
pub(in crate::broker) struct AdvisoryState {
    pub(in crate::broker) excluding: BTreeMap<(usize, bool), Statement>,
}

// The row lock form with an attempt column: a claim counts and commits the attempt, then
// locks the counted row. Claims acquire their connections side by side; the claims waiting
// when a count starts are counted together, in one statement on the first one's connection
// (the leader). The count marks the rows it counts on the leader's session until their locks
// have answered, and passes over rows marked by another process's count, looking past them.
// The next count starts once the last count's rows have answered their locks.
#[derive(Debug, Default)]
pub(in crate::broker) struct CountQueue {
    /// The count whose statements run, until it hands its rows out.
    pub(in crate::broker) counting: Option<Count>,
    /// Counts that handed their rows out, until each row's lock has answered.
    pub(in crate::broker) locking: Vec<Count>,
    /// Claims that hold a connection and wait for a count, in order.
    pub(in crate::broker) waiting: VecDeque<ClaimId>,
    /// The rows the last count passed over, marked by a count of another process.
    pub(in crate::broker) passed: usize,
}

/// One count of several claims' rows.
#[derive(Debug)]
pub(in crate::broker) struct Count {
    /// The claim whose connection runs the count.
    pub(in crate::broker) leader: ClaimId,
    /// The claims it counts for (the leader first) that have not locked their row or ended.
    pub(in crate::broker) members: Vec<ClaimId>,
    /// The rows it counts at most: one for each member it started with.
    pub(in crate::broker) take: usize,
    /// The rows its statement looks at, past the rows marked elsewhere.
    pub(in crate::broker) look: usize,
    /// The marks its leader holds, once it handed its rows out.
    pub(in crate::broker) marks: usize,
    /// Its statement starts at the subscription's [`Floor`](super::Floor).
    pub(in crate::broker) from_floor: bool,
}

/// The lease form, where the database returns the rows a statement settled: the delivery
/// whose settlement statement runs now. Settlements asked for meanwhile wait, then run
/// together in one statement.
#[derive(Debug, Default)]
pub(in crate::broker) struct SettleQueue {
    pub(in crate::broker) settling: Option<DeliveryId>,
    pub(in crate::broker) waiting: VecDeque<DeliveryId>,
    /// The settlements of several leases in one statement, by the rows they settle.
    pub(in crate::broker) batches: BTreeMap<usize, Statement>,
}

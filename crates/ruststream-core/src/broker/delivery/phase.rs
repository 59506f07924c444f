//! Where a delivery is: its phase from the claim to the end, where the runtime's handler is
//! with it, and what its settlement writes and reports. The two run side by side: the
//! shutdown ends a delivery still at its handler, and a handler settles before the end.

use std::sync::Arc;
use std::time::Duration;

use super::{Delivery, Ending};

/// Where a delivery is between its claim and its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// In work: its handler has it, or it waits claimed ahead; nothing runs on it.
    InWork,
    /// A step runs beside its work (an extension, a ping, a transaction begun for its
    /// handler); `queued` is the ending asked for meanwhile, which starts after it.
    Busy { queued: Option<Ending> },
    /// It ends: the statements of its ending run.
    Ending(Ending),
    /// Its settlement's statement took effect; what remains of its ending runs.
    Settled(Ending),
}

/// Where the runtime's handler is with a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Handler {
    /// Not handed: it waits claimed ahead, or ends without a handler.
    Unhanded,
    /// Claimed ahead, handed once its session answers a ping; a worker's slot is kept for it.
    Pinging,
    /// Handed, and not settled or dropped by the runtime yet.
    Working,
    /// Handed, and settled or dropped by the runtime.
    Done,
    /// As [`Handler::Done`], in the lease form: its row counts among the subscription's
    /// [`settling_freed`](super::super::sub::LeaseState::settling_freed) until it ends.
    Freed,
}

/// A failure, reported once its settlement takes effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Failure {
    /// The row is marked failed.
    Kept,
    /// The table keeps no failed rows: the row returns to the queue.
    Returned,
}

/// What a delivery's settlement writes and reports, as the table keeps it.
#[derive(Debug, Default)]
pub(super) struct Terms {
    /// A retry: how long the row waits before it is due again.
    pub(super) delay: Option<Duration>,
    /// The error the settlement records.
    pub(super) error: Option<Arc<str>>,
    /// A failure, reported once it takes effect, and once only.
    pub(super) failure: Option<Failure>,
    /// Its take counted past the attempt budget: it fails without a handler.
    pub(super) exhausted: bool,
    /// A failure returned to the queue of a table with nowhere to write its delay: the
    /// delay paces the subscription's next claim instead.
    pub(super) paced: bool,
}

impl Delivery {
    /// How it ends, once its ending has started.
    pub(in crate::broker) fn ending(&self) -> Option<Ending> {
        match self.phase {
            Phase::Ending(ending) | Phase::Settled(ending) => Some(ending),
            Phase::InWork | Phase::Busy { .. } => None,
        }
    }

    /// Whether it is in work with nothing running on it.
    pub(in crate::broker) fn in_work(&self) -> bool {
        self.phase == Phase::InWork
    }

    /// Whether a step runs beside its work with no ending asked for yet.
    pub(in crate::broker) fn may_queue(&self) -> bool {
        self.phase == Phase::Busy { queued: None }
    }

    /// Whether its settlement is still to be chosen: no ending started or asked for.
    pub(super) fn unsettled(&self) -> bool {
        matches!(self.phase, Phase::InWork | Phase::Busy { queued: None })
    }

    /// Whether its settlement's statement took effect.
    pub(super) fn is_settled(&self) -> bool {
        matches!(self.phase, Phase::Settled(_))
    }

    /// A step starts beside its work.
    pub(in crate::broker) fn begin_step(&mut self) {
        if self.phase == Phase::InWork {
            self.phase = Phase::Busy { queued: None };
        }
    }

    /// Its step is over: back in work, with the ending asked for meanwhile.
    pub(in crate::broker) fn back_to_work(&mut self) -> Option<Ending> {
        match self.phase {
            Phase::Busy { queued } => {
                self.phase = Phase::InWork;
                queued
            }
            Phase::InWork | Phase::Ending(_) | Phase::Settled(_) => None,
        }
    }

    /// Asks for `ending` once the step that runs is over; `false` where no step runs, or an
    /// ending is asked for or started already.
    pub(in crate::broker) fn queue_ending(&mut self, ending: Ending) -> bool {
        if !self.may_queue() {
            return false;
        }
        self.phase = Phase::Busy {
            queued: Some(ending),
        };
        true
    }

    /// Its ending starts.
    pub(in crate::broker) fn begin_ending(&mut self, ending: Ending) {
        self.phase = Phase::Ending(ending);
    }

    /// A ping failed: it ends as asked for meanwhile, or else dropped.
    pub(super) fn ping_failed(&mut self) {
        let queued = match self.phase {
            Phase::Busy { queued } => queued,
            Phase::InWork | Phase::Ending(_) | Phase::Settled(_) => None,
        };
        self.phase = Phase::Ending(queued.unwrap_or(Ending::Drop));
    }

    /// Its settlement's statement took effect.
    pub(super) fn mark_settled(&mut self) {
        if let Phase::Ending(ending) = self.phase {
            self.phase = Phase::Settled(ending);
        }
    }

    /// Whether the runtime was handed it.
    pub(in crate::broker) fn is_handed(&self) -> bool {
        matches!(
            self.handler,
            Handler::Working | Handler::Done | Handler::Freed
        )
    }

    /// Whether a worker's slot is taken by it: at its handler, or kept while it is pinged.
    pub(in crate::broker) fn at_handler(&self) -> bool {
        matches!(self.handler, Handler::Pinging | Handler::Working)
    }

    /// Whether its row counts among the subscription's settling rows whose worker is free.
    pub(in crate::broker) fn is_freed(&self) -> bool {
        self.handler == Handler::Freed
    }

    /// It is handed to the runtime.
    pub(in crate::broker) fn hand(&mut self) {
        self.handler = Handler::Working;
    }

    /// Its session is pinged before it is handed.
    pub(in crate::broker) fn start_ping(&mut self) {
        self.handler = Handler::Pinging;
    }

    /// It was pinged and is not handed after all.
    pub(in crate::broker) fn unhand(&mut self) {
        if self.handler == Handler::Pinging {
            self.handler = Handler::Unhanded;
        }
    }

    /// The runtime settled or dropped it; `frees`: its worker is free while its statement
    /// runs. `false` where it took no worker's slot.
    pub(in crate::broker) fn leave_handler(&mut self, frees: bool) -> bool {
        // A row pinged is one claimed ahead and not handed yet: the runtime, which learns a
        // delivery's id from `Event::Delivered`, cannot name it.
        debug_assert!(
            self.handler != Handler::Pinging,
            "the runtime settled or dropped a delivery it was not handed"
        );
        self.handler = match self.handler {
            Handler::Working if frees => Handler::Freed,
            Handler::Working => Handler::Done,
            Handler::Pinging => Handler::Unhanded,
            Handler::Unhanded | Handler::Done | Handler::Freed => return false,
        };
        true
    }
}

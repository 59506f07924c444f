//! The timer table: every time the broker waits for, by what waits, so the next one is one
//! lookup.

use std::collections::{BTreeMap, BTreeSet};

use crate::types::{DeliveryId, PublisherId, SubId};
use crate::value::Time;

/// Something that waits for a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Timer {
    /// The oldest connection kept for the next flow goes back to the pool.
    Linger,
    /// A publisher's notification owed for quiet inserts is due.
    Notify(PublisherId),
    /// A dropped delivery's connection is closed, whatever still runs on it.
    Deadline(DeliveryId),
    /// A lease in work is extended.
    Extend(DeliveryId),
    /// A check that failed on a passing error runs again.
    Check(SubId),
    /// A subscription claims.
    Claim(SubId),
    /// A row lock claim's lock of its counted row tries again.
    Relock(super::claim::ClaimId),
    /// A run of the maintenance starts: retention or a periodic job.
    Maintenance(super::maintenance::Task),
}

/// The armed timers, each at most once, ordered by time.
#[derive(Debug, Default)]
pub(super) struct Timers {
    queue: BTreeSet<(Time, Timer)>,
    armed: BTreeMap<Timer, Time>,
}

impl Timers {
    /// Arms `timer` at `at`, replacing its earlier time; `None` disarms it.
    pub(super) fn set(&mut self, timer: Timer, at: Option<Time>) {
        if self.armed.get(&timer).copied() == at {
            return;
        }
        if let Some(old) = self.armed.remove(&timer) {
            self.queue.remove(&(old, timer));
        }
        if let Some(at) = at {
            self.armed.insert(timer, at);
            self.queue.insert((at, timer));
        }
    }

    /// The earliest armed time.
    pub(super) fn next(&self) -> Option<Time> {
        self.queue.first().map(|(at, _)| *at)
    }

    /// The timers due by `now`, earliest first.
    pub(super) fn due(&self, now: Time) -> Vec<Timer> {
        self.queue
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, timer)| *timer)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_time_is_the_earliest_armed_and_a_timer_is_armed_once() {
        let mut timers = Timers::default();
        assert_eq!(timers.next(), None);
        timers.set(Timer::Claim(SubId(0)), Some(Time(30)));
        timers.set(Timer::Extend(DeliveryId(1)), Some(Time(10)));
        timers.set(Timer::Linger, Some(Time(20)));
        assert_eq!(timers.next(), Some(Time(10)));
        // Re-armed later: the old time is gone.
        timers.set(Timer::Extend(DeliveryId(1)), Some(Time(40)));
        assert_eq!(timers.next(), Some(Time(20)));
        assert_eq!(
            timers.due(Time(30)),
            vec![Timer::Linger, Timer::Claim(SubId(0))]
        );
        timers.set(Timer::Linger, None);
        timers.set(Timer::Claim(SubId(0)), None);
        assert_eq!(timers.next(), Some(Time(40)));
        assert!(timers.due(Time(39)).is_empty());
    }
}

//! The counts of each table over time: a sample every interval, kept in memory in a ring
//! buffer of a fixed length per table.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use ruststream::Stats;
use serde::Serialize;

use crate::Shared;

/// The counts of one table at one time.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Sample {
    /// When the counts were read, in milliseconds since the Unix epoch.
    pub(crate) at_ms: i64,
    pub(crate) due: u64,
    pub(crate) scheduled: u64,
    pub(crate) in_work: Option<u64>,
    pub(crate) failed: Option<u64>,
    pub(crate) processed: Option<u64>,
    /// How long the oldest due row had waited, in milliseconds.
    pub(crate) oldest_due_age_ms: Option<u64>,
}

impl From<&Stats> for Sample {
    fn from(stats: &Stats) -> Self {
        Self {
            at_ms: stats.at.micros() / 1000,
            due: stats.due.value(),
            scheduled: stats.scheduled.value(),
            in_work: stats.in_work.map(|c| c.value()),
            failed: stats.failed.map(|c| c.value()),
            processed: stats.processed.map(|c| c.value()),
            oldest_due_age_ms: stats.oldest_due_age().map(duration_ms),
        }
    }
}

/// Milliseconds of a duration, saturating.
pub(crate) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The last samples of one table, oldest first.
#[derive(Debug)]
pub(crate) struct Ring {
    samples: VecDeque<Sample>,
    capacity: usize,
}

impl Ring {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            samples: VecDeque::with_capacity(capacity.min(4096)),
            capacity: capacity.max(1),
        }
    }

    /// Adds a sample, dropping the oldest when the ring is full.
    pub(crate) fn push(&mut self, sample: Sample) {
        while self.samples.len() >= self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    /// The samples, oldest first.
    pub(crate) fn samples(&self) -> Vec<Sample> {
        self.samples.iter().cloned().collect()
    }
}

/// Samples every table every `every` until the dashboard's state is dropped.
pub(crate) async fn sample(shared: Weak<Shared>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        sample_once(&shared).await;
    }
}

/// One sample of every table; a table whose counts cannot be read now gets none.
async fn sample_once(shared: &Arc<Shared>) {
    for table in &shared.tables {
        if let Ok(stats) = table.source.stats().await {
            table
                .history
                .lock()
                .expect("the history's lock is never poisoned")
                .push(Sample::from(&stats));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: u64) -> Sample {
        Sample {
            at_ms: n as i64,
            due: n,
            scheduled: 0,
            in_work: None,
            failed: None,
            processed: None,
            oldest_due_age_ms: None,
        }
    }

    #[test]
    fn the_ring_keeps_the_last_samples() {
        let mut ring = Ring::new(3);
        for n in 0..5 {
            ring.push(sample(n));
        }
        let dues: Vec<u64> = ring.samples().iter().map(|s| s.due).collect();
        assert_eq!(dues, [2, 3, 4]);
    }
}

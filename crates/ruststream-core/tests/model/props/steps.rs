//! The steps of a schedule, each applied to the world: inputs to the brokers, time, crashes,
//! shutdowns, publishes and another system's locks.

use std::time::Duration;

use ruststream_core::{BrokerError, Form, Outcome, Settlement};

use super::Step;
use super::world::{World, start};
use crate::sim::message;

impl World {
    /// Applies a step; the steps that may cut a take or a settlement short count.
    pub(super) fn apply_step(&mut self, step: &Step) {
        self.log.push(format!("{step:?}"));
        let interrupts = match step {
            Step::Fail { .. } | Step::Crash { .. } | Step::Shutdown { .. } | Step::Drop { .. } => {
                true
            }
            Step::Advance { .. } => self.form() == Form::Lease,
            _ => false,
        };
        if interrupts {
            self.interruptions += 1;
        }
        let slots = self.processes.len();
        match *step {
            Step::Foreign { channel, hold } => self.foreign(channel, hold),
            Step::Check => {
                self.quiesce();
                self.check_liveness();
            }
            Step::Run { process, command } => self.run_command(process % slots, command, None),
            Step::Fail {
                process,
                command,
                lost,
            } => self.run_command(process % slots, command, Some(lost)),
            Step::Reply { process, reply } => self.deliver_reply(process % slots, reply),
            Step::Settle {
                process,
                handler,
                outcome,
                delay_ms,
            } => self.settle(process % slots, handler, outcome, delay_ms),
            Step::Drop { process, handler } => self.drop_handler(process % slots, handler),
            Step::Lend { process, handler } => self.lend(process % slots, handler),
            Step::Advance { millis } => self.advance(millis),
            Step::Crash { process } => self.crash(process % slots),
            Step::Shutdown { process } => self.shutdown(process % slots),
            Step::PublishAll {
                process,
                channel,
                rows,
            } => self.publish_all(process % slots, channel, rows),
            Step::Publish { process, channel } => self.publish(process % slots, channel),
        }
    }

    /// A handler settles its message; a retry waits `delay_ms`.
    pub(super) fn settle(&mut self, slot: usize, handler: usize, outcome: Outcome, delay_ms: u64) {
        let now = self.local(slot);
        let p = &mut self.processes[slot];
        if p.handlers.is_empty() {
            return;
        }
        let id = *p
            .handlers
            .keys()
            .nth(handler % p.handlers.len())
            .expect("a handler");
        let h = p.handlers.remove(&id).expect("a handler");
        // A retry at the last attempt the budget allows fails the row at once.
        let last = self.config.max_attempts.is_some_and(|max| {
            self.attempts
                .get(&h.row)
                .is_some_and(|a| *a >= i64::from(max))
        });
        if outcome != Outcome::Retry || last {
            *self.settled.entry(h.row).or_default() += 1;
        }
        match outcome {
            Outcome::Ack => self.acked.insert(h.row),
            Outcome::Reject => self.rejected.insert(h.row),
            Outcome::Retry if last => self.rejected.insert(h.row),
            Outcome::Retry => false,
        };
        let mut settlement = Settlement::new(outcome).error(format!("error of {}", h.row));
        if delay_ms > 0 {
            settlement = settlement.delay(Duration::from_millis(delay_ms));
            let until = self.now.plus(Duration::from_millis(delay_ms)).micros();
            self.waits_until.insert(h.row, until);
            let nowhere = self.desc.due.is_none() && self.desc.locked_until().is_none();
            if nowhere && outcome == Outcome::Retry {
                self.retried_here.insert(h.row, (self.ids[slot], id, until));
            }
        }
        p.broker.settle_with(id, settlement, now);
        self.pump(slot);
    }

    /// A handler is dropped unsettled.
    pub(super) fn drop_handler(&mut self, slot: usize, handler: usize) {
        let now = self.local(slot);
        let p = &mut self.processes[slot];
        if p.handlers.is_empty() {
            return;
        }
        let id = *p
            .handlers
            .keys()
            .nth(handler % p.handlers.len())
            .expect("a handler");
        p.handlers.remove(&id);
        p.broker.drop_delivery(id, now);
        self.pump(slot);
    }

    /// A handler asks for its delivery's transaction.
    pub(super) fn lend(&mut self, slot: usize, handler: usize) {
        let now = self.local(slot);
        let p = &mut self.processes[slot];
        if p.handlers.is_empty() {
            return;
        }
        let id = *p
            .handlers
            .keys()
            .nth(handler % p.handlers.len())
            .expect("a handler");
        p.broker.lend_transaction(id, now);
        self.pump(slot);
    }

    /// Time passes: the timers due fire.
    pub(super) fn advance(&mut self, millis: u64) {
        self.now = self.now.plus(Duration::from_millis(millis));
        for slot in 0..self.processes.len() {
            let now = self.local(slot);
            let due = self.processes[slot]
                .broker
                .poll_timeout()
                .is_some_and(|t| t <= now);
            if due {
                self.processes[slot].broker.handle_timeout(now);
                self.pump(slot);
            }
        }
    }

    /// A process dies and starts again, with a new process number.
    pub(super) fn crash(&mut self, slot: usize) {
        let locks = self.db.advisory.clone();
        self.tick += 1;
        self.db.kill_process(self.ids[slot]);
        self.note_changes(locks, self.db.next_id, None);
        self.looked[slot].clear();
        self.tried[slot].clear();
        self.ids[slot] = self.next_id;
        self.next_id += 1;
        self.processes[slot] = start(self.desc, self.config, self.local(slot));
        self.pump(slot);
    }

    /// A process shuts down; a publisher kept past it writes nothing.
    pub(super) fn shutdown(&mut self, slot: usize) {
        let now = self.local(slot);
        let p = &mut self.processes[slot];
        if p.shutdown {
            return;
        }
        p.shutdown = true;
        p.held_at_shutdown = p.handlers.len();
        p.broker.shutdown(now);
        self.pump(slot);
        // A publisher kept past the shutdown writes nothing.
        let rows = self.db.rows.len();
        let p = &mut self.processes[slot];
        let refused = p.broker.publish(p.publisher, message(&self.desc, 0), now);
        assert_eq!(refused, Err(BrokerError::Closed));
        assert_eq!(self.db.rows.len(), rows);
    }

    /// Several rows in one publish; after the shutdown, another program inserts them.
    pub(super) fn publish_all(&mut self, slot: usize, channel: i64, rows: usize) {
        let now = self.local(slot);
        let p = &mut self.processes[slot];
        if p.shutdown {
            let (locks, before) = (self.db.advisory.clone(), self.db.next_id);
            self.tick += 1;
            for _ in 0..rows {
                self.db.insert(channel, self.now.micros());
            }
            self.note_changes(locks, before, None);
            return;
        }
        let batch = (0..rows).map(|_| message(&self.desc, channel)).collect();
        p.broker
            .publish_all(p.publisher, batch, now)
            .expect("a running broker publishes");
        p.broker.wake(p.sub, now);
        self.pump(slot);
    }

    /// A row is published; after the shutdown, another program inserts it.
    pub(super) fn publish(&mut self, slot: usize, channel: i64) {
        let now = self.local(slot);
        let p = &mut self.processes[slot];
        if p.shutdown {
            let (locks, rows) = (self.db.advisory.clone(), self.db.next_id);
            self.tick += 1;
            self.db.insert(channel, self.now.micros());
            self.note_changes(locks, rows, None);
            return;
        }
        p.broker
            .publish(p.publisher, message(&self.desc, channel), now)
            .expect("a running broker publishes");
        p.broker.wake(p.sub, now);
        self.pump(slot);
    }
}

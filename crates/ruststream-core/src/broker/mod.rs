//! The broker machine: the checks, claims, deliveries, publishes and shutdown of every
//! subscription of one database, as a set of small machines.
//!
//! This file holds the public API and the dispatch of replies to the machine that asked; the
//! machines live beside it, one file per concern: [`conns`] (the connections the flows use,
//! the ones kept for the next flow, the sessions a release must end first), [`gate`] (SQLite's
//! one statement at a time), [`timers`] (the timer table), [`check`] (a table's check before
//! it claims), [`claim`] (one claim machine per form), [`delivery`] (a row from its claim to
//! its end, per form), [`ahead`] (rows claimed ahead) and [`publish`] (publishes and
//! PostgreSQL's notifications).

mod ahead;
mod check;
mod claim;
mod conns;
mod delivery;
mod gate;
mod maintenance;
mod options;
mod publish;
mod rows;
mod session;
mod sub;
mod timers;
mod waiting;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::dialect::{Dialect, Statement, Statements};
use crate::spec::{DescError, Form, TableDesc};
use crate::types::{
    ClosedCounts, Command, CommandId, DeliveryId, Event, Outcome, PublishId, PublisherId, Reply,
    Settlement, SubId,
};
use crate::value::Time;

pub use options::{
    BrokerError, CONNECTION_LINGER, DROP_GRACE, FailedRowsOf, MAX_ERROR_LEN, MAX_RETRY_DELAY,
    MissingIndex, NOTIFY_EVERY, PING_AHEAD_AFTER, PUBLISH_BATCH, Publish, SETTLE_BATCH,
    SubscribeOptions,
};

use ahead::Ahead;
use check::CheckStage;
pub use check::start_retry_delay;
use claim::{Claim, ClaimId, ClaimStage};
use conns::Conns;
use delivery::{Deliveries, Delivery, DeliveryStage, Ending};
use gate::Gate;
pub use maintenance::{
    MAINTENANCE_RETRY, Maintained, PERIODIC_CATCH_UP, PeriodicJob, RETENTION_BATCH,
    RETENTION_EVERY, Retention, Ticks,
};
use maintenance::{Maintenance, MaintenanceStage, Task};
pub use publish::Inserts;
use publish::{FailedChange, PublishFlow, PublishStage, Publisher};
use sub::{Sub, SubState};
use timers::{Timer, Timers};
pub use waiting::WAITING_MAX;

/// Which of the kept connections, or of the notifications owed, go now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sweep {
    /// Those due: kept past the linger, or owed past their time.
    Due,
    /// All of them: the linger is off, or the shutdown began.
    All,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Running,
    ShuttingDown,
    Closed,
}

/// The machine and stage a command's reply goes to.
#[derive(Debug)]
enum Step {
    Check {
        sub: SubId,
        stage: CheckStage,
    },
    Claim {
        claim: ClaimId,
        stage: ClaimStage,
    },
    Delivery {
        delivery: DeliveryId,
        stage: DeliveryStage,
    },
    Publish {
        publish: PublishId,
        stage: PublishStage,
    },
    /// The `ROLLBACK` before a connection goes back to the pool; `then` is the release's
    /// flow, answered once the connection is given back.
    Rollback {
        conn: crate::types::ConnId,
        then: Box<Step>,
    },
    /// A command whose flow has ended (a connection closed past its deadline): its reply is
    /// only awaited.
    Orphan,
    /// A run of the maintenance: retention or a periodic job.
    Maintenance {
        task: Task,
        stage: MaintenanceStage,
    },
}

/// The broker of one database: every subscription's check, claims and jobs, every publish,
/// and the shutdown, with no IO, clock or task of its own. Drive it as the [crate] page says:
/// after any input, drain [`Broker::poll_command`] and [`Broker::poll_event`], then arm one timer.
// It does no IO, reads no clock and spawns nothing. Its methods fall in four groups:
//
// - **getters** (`&self`): [`Broker::is_closed`], [`Broker::statements`], [`Broker::in_work`];
// - **inputs**, each with the time: [`Broker::handle_reply`], [`Broker::handle_timeout`],
//   [`Broker::settle`], [`Broker::drop_delivery`], [`Broker::wake`], [`Broker::shutdown`];
// - **application calls**: [`Broker::subscribe`], [`Broker::publisher`], [`Broker::publish`];
// - **outputs**: [`Broker::poll_command`], [`Broker::poll_event`], [`Broker::poll_timeout`].
//
// After any input, drain [`Broker::poll_command`] and [`Broker::poll_event`] until both are
// empty, then arm one timer for [`Broker::poll_timeout`]. A spurious `handle_timeout` is
// harmless. `R` is the adapter's row type, which the core carries to the runtime unread.
//
// Commands of one connection come out in the order they must run. On SQLite the broker hands
// out one statement at a time (the next after the reply to the last): SQLite takes one
// writer at a time, and statements handed out side by side would wait on each other in its
// busy handler, which sleeps.
#[derive(Debug)]
pub struct Broker<R> {
    dialect: Dialect,
    state: State,
    subs: Vec<Sub>,
    publishers: Vec<Publisher>,
    claims: BTreeMap<ClaimId, Claim<R>>,
    deliveries: Deliveries,
    ahead: Ahead<R>,
    publishes: BTreeMap<PublishId, PublishFlow>,
    /// The step each command in flight answers to.
    pending: BTreeMap<CommandId, Step>,
    conns: Conns,
    gate: Gate,
    timers: Timers,
    /// Retention and periodic jobs.
    maintenance: Maintenance,
    /// Keys in work in this process: the registry on SQLite, a shortcut elsewhere.
    keys: BTreeSet<Arc<str>>,
    /// Advisory candidates whose key did not read as text, by row id, and why: their rows
    /// fail saying so.
    unread_keys: BTreeMap<crate::value::Value, Arc<str>>,
    commands: VecDeque<Command>,
    events: VecDeque<Event<R>>,
    counts: ClosedCounts,
    /// The `ROLLBACK` a connection given back with a transaction open runs first.
    rollback: Statement,
    /// The adapter's statements are prepared statements that live in the server session
    /// ([`Broker::set_prepared_statements`]).
    prepared_statements: bool,
    next_command: u64,
    next_claim: ClaimId,
    next_delivery: u64,
    next_publish: u64,
    now: Time,
}

impl<R> Broker<R> {
    /// A broker for a database of this dialect.
    pub fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            state: State::Running,
            subs: Vec::new(),
            publishers: Vec::new(),
            claims: BTreeMap::new(),
            deliveries: Deliveries::default(),
            ahead: Ahead::new(),
            publishes: BTreeMap::new(),
            pending: BTreeMap::new(),
            conns: Conns::new(CONNECTION_LINGER),
            gate: Gate::new(dialect == Dialect::Sqlite),
            timers: Timers::default(),
            maintenance: Maintenance::default(),
            keys: BTreeSet::new(),
            unread_keys: BTreeMap::new(),
            commands: VecDeque::new(),
            events: VecDeque::new(),
            counts: ClosedCounts::default(),
            rollback: crate::dialect::rollback(dialect),
            prepared_statements: false,
            next_command: 0,
            next_claim: ClaimId::FIRST,
            next_delivery: 0,
            next_publish: 0,
            now: Time(0),
        }
    }

    /// How long a connection a flow gave back is kept for the next flow before it goes back
    /// to the pool; [`CONNECTION_LINGER`] unless set. `Duration::ZERO` keeps none: every flow
    /// acquires its connection from the pool and releases it there.
    pub fn set_connection_linger(&mut self, linger: Duration) {
        self.conns.linger = linger;
        if linger.is_zero() {
            self.release_idle(Sweep::All);
        }
        self.rearm();
    }

    /// Whether the adapter's statements are prepared statements kept in the server session
    /// (`false` unless set); then the start on PostgreSQL refuses a pooler in transaction
    /// pooling for every form. Set it before [`Broker::subscribe`].
    pub fn set_prepared_statements(&mut self, prepared: bool) {
        // Through a pooler in transaction pooling (PgBouncer's `pool_mode = transaction`) such
        // statements meet the server sessions other clients use: a statement of the same name
        // already there, or one of this connection's missing. Where it is set, the start checks on
        // PostgreSQL that each connection is a server session of its own for every form, not
        // only for the forms that hold session locks, and fails naming transaction pooling
        // ([`CheckError::PreparedStatements`](crate::CheckError::PreparedStatements)). Set it
        // before [`Broker::subscribe`].
        self.prepared_statements = prepared;
    }

    // ----- getters -----

    /// The dialect.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Whether the shutdown is complete.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Whether the broker refuses new work: shutting down or shut down.
    pub fn is_shutting_down(&self) -> bool {
        self.state != State::Running
    }

    /// The statements of a subscription, rendered when it subscribed.
    pub fn statements(&self, sub: SubId) -> Option<&Statements> {
        self.subs.get(sub.0).map(|s| &s.statements)
    }

    /// The description of a subscription's table.
    pub fn table(&self, sub: SubId) -> Option<&TableDesc> {
        self.subs.get(sub.0).map(|s| &s.desc)
    }

    /// How many messages are in work, over every subscription.
    pub fn in_work_total(&self) -> usize {
        self.subs.iter().map(|s| s.rows_handed).sum()
    }

    /// How many messages of a subscription are in work.
    pub fn in_work(&self, sub: SubId) -> usize {
        self.subs.get(sub.0).map_or(0, |s| s.rows_handed)
    }

    /// How many rows failed in this process on a subscription's table with nowhere to write
    /// their retry's delay, and wait it here while the claims pass over them.
    pub fn waiting(&self, sub: SubId) -> usize {
        self.subs.get(sub.0).map_or(0, |s| s.waiting.len())
    }

    /// How many rows a subscription claimed ahead and holds for its next free worker
    /// ([`SubscribeOptions::prefetch`]).
    pub fn claimed_ahead(&self, sub: SubId) -> usize {
        self.ahead.len(sub)
    }

    /// The connections the core holds now: those its flows use and those it keeps for the
    /// next flow ([`CONNECTION_LINGER`]).
    pub fn held_connections(&self) -> usize {
        self.conns.count()
    }

    /// What the shutdown has done so far to the advisory locks.
    pub fn counts(&self) -> ClosedCounts {
        self.counts
    }

    // ----- application calls -----

    /// Adds a subscription to `desc`'s table. It checks the table first, then claims.
    pub fn subscribe(
        &mut self,
        desc: TableDesc,
        options: SubscribeOptions,
        now: Time,
    ) -> Result<SubId, BrokerError> {
        self.now = now;
        if self.state != State::Running {
            return Err(BrokerError::Closed);
        }
        desc.validate()?;
        if options.workers == 0 {
            return Err(BrokerError::NoWorkers { table: desc.table });
        }
        if desc.form() == Form::RowLock && !self.dialect.has_row_locks() {
            return Err(DescError::NoRowLocks {
                table: desc.table,
                dialect: self.dialect.name(),
            }
            .into());
        }
        if options.max_attempts.is_some() {
            let needs = [
                (
                    desc.attempt.is_none(),
                    "attempt",
                    ".attempt(..)` (`#[field(attempt)]`)",
                ),
                (
                    desc.failed_at.is_none(),
                    "failed_at",
                    ".failed(..)` (`#[field(failed_at)]`)",
                ),
            ];
            if let Some((_, role, method)) = needs.into_iter().find(|(missing, ..)| *missing) {
                return Err(DescError::NeedsColumn {
                    table: desc.table,
                    setting: "max_attempts",
                    role,
                    method,
                }
                .into());
            }
        }
        let id = SubId(self.subs.len());
        let statements =
            Statements::render(self.dialect, &desc, options.workers + options.prefetch);
        self.subs.push(Sub::new(desc, statements, options));
        self.ahead.add_sub();
        self.start_check(id);
        self.drive();
        Ok(id)
    }

    /// A publisher of rows into `desc`'s table; its statement is rendered once.
    pub fn publisher(&mut self, desc: TableDesc) -> Result<PublisherId, BrokerError> {
        desc.validate()?;
        self.publishers.push(Publisher::new(self.dialect, desc));
        Ok(PublisherId(self.publishers.len() - 1))
    }

    /// Publishes a row. Refused with [`BrokerError::Closed`] from the shutdown on: nothing is
    /// written then.
    pub fn publish(
        &mut self,
        publisher: PublisherId,
        row: Publish,
        now: Time,
    ) -> Result<PublishId, BrokerError> {
        self.publish_all(publisher, vec![row], now)
    }

    /// Publishes rows together: all of them or, when a statement fails, none; one
    /// [`Event::Published`] answers the batch. Refused once shut down, and for a row that lacks
    /// a column the table needs ([`BrokerError::MissingValue`]).
    pub fn publish_all(
        &mut self,
        publisher: PublisherId,
        rows: Vec<Publish>,
        now: Time,
    ) -> Result<PublishId, BrokerError> {
        self.now = now;
        if self.state != State::Running {
            return Err(BrokerError::Closed);
        }
        let id = self.start_publish(publisher, rows)?;
        self.drive();
        Ok(id)
    }

    // ----- inputs -----

    /// A subscription's table has new rows: claim now rather than at the next poll.
    pub fn wake(&mut self, sub: SubId, now: Time) {
        self.now = now;
        if let Some(s) = self.subs.get_mut(sub.0)
            && !s.stopped
        {
            s.next_claim_at = Some(now);
        }
        self.drive();
    }

    /// Time has passed: claims due, lease extensions due, deadlines of dropped deliveries,
    /// kept connections that go back to the pool, notifications owed.
    pub fn handle_timeout(&mut self, now: Time) {
        self.now = now;
        let due = self.timers.due(now);
        self.release_idle(Sweep::Due);
        if self.state != State::Closed {
            self.notify_owed(Sweep::Due);
        }
        for timer in &due {
            if let Timer::Deadline(delivery) = timer {
                self.force_close(*delivery);
            }
        }
        if due.iter().any(|t| matches!(t, Timer::Relock(_))) {
            self.relock_due();
        }
        if self.state == State::Running {
            for timer in &due {
                let Timer::Extend(delivery) = *timer else {
                    continue;
                };
                let extend = self
                    .deliveries
                    .get(delivery)
                    .is_some_and(|d| d.in_work() && d.extend_at().is_some_and(|t| t <= now));
                if extend {
                    self.extend(delivery);
                }
            }
        }
        self.drive();
    }

    /// The handler settled a delivery, at once and without an error: [`Broker::settle_with`]
    /// of the outcome alone.
    pub fn settle(&mut self, delivery: DeliveryId, outcome: Outcome, now: Time) {
        self.settle_with(delivery, Settlement::new(outcome), now);
    }

    /// The handler settled a job: an acknowledgement settles the row as done, a retry returns
    /// it after its delay with its error, a rejection marks it failed (or, on a table that
    /// keeps no failed rows, returns it); a failure is told with [`Event::Failed`].
    pub fn settle_with(&mut self, delivery: DeliveryId, settlement: Settlement, now: Time) {
        self.now = now;
        self.handler_done(delivery);
        let outcome = self.note_settlement(delivery, settlement);
        self.end(delivery, Ending::Settle(outcome));
        self.drive();
    }

    /// Returns the failed rows `which` selects, in `publisher`'s table, to the queue: due now,
    /// attempts from zero, `failed_at` and error cleared. [`Event::Changed`] tells how many.
    /// Refused for a table that keeps no failed rows.
    pub fn redrive(
        &mut self,
        publisher: PublisherId,
        which: FailedRowsOf,
        now: Time,
    ) -> Result<PublishId, BrokerError> {
        self.change_failed(publisher, which, FailedChange::Redrive, now)
    }

    /// Reads `publisher`'s table's state for people: its counts ([`crate::Stats`]), or its
    /// failed rows ([`crate::FailedRow`]), on a connection of its own. [`Event::Read`] tells
    /// what it read. A list of failed rows is refused for a table that keeps none.
    pub fn read_table(
        &mut self,
        publisher: PublisherId,
        read: crate::ReadTable,
        now: Time,
    ) -> Result<PublishId, BrokerError> {
        self.start_read(publisher, read, now)
    }

    /// Deletes the failed rows `which` selects, in `publisher`'s table. [`Event::Changed`]
    /// tells how many rows. Refused for a table that keeps no failed rows.
    pub fn delete_failed(
        &mut self,
        publisher: PublisherId,
        which: FailedRowsOf,
        now: Time,
    ) -> Result<PublishId, BrokerError> {
        self.change_failed(publisher, which, FailedChange::Delete, now)
    }

    /// The handler asks for a transaction on its job's connection, to write in it; the core
    /// answers [`Event::Lent`] with the connection, or `conn: None` where it lends none (the
    /// job not in work, lent already, a lease lost, SQLite's lease form, a failed begin).
    pub fn lend_transaction(&mut self, delivery: DeliveryId, now: Time) {
        // In the row lock form the claim's open transaction, past a savepoint the core marks; in
        // the advisory lock form a transaction the core begins on the connection that holds the
        // key; in the lease form a transaction the core begins on a connection it takes for it
        // (not on SQLite, which takes one writer at a time). An acknowledgement's statement then
        // runs in it, fenced by the lease in the lease form, and commits with the handler's writes
        // (a lease lost meanwhile rolls them back); a retry, a failure or a drop undoes them first
        // (back to the savepoint, or a rollback). The core runs nothing on the connection until
        // the handler settles.
        self.now = now;
        self.begin_lend(delivery);
        self.drive();
    }

    /// The runtime dropped a delivery without settling it: its row returns to the queue, and a
    /// lock it holds is released (its connection closed) within [`DROP_GRACE`].
    pub fn drop_delivery(&mut self, delivery: DeliveryId, now: Time) {
        self.now = now;
        self.handler_done(delivery);
        self.end(delivery, Ending::Drop);
        self.drive();
    }

    /// Stops a subscription's claims. Its deliveries in work go on and settle as usual; the
    /// runtime stops every subscription this way before it shuts the broker down.
    pub fn stop(&mut self, sub: SubId, now: Time) {
        self.now = now;
        if let Some(s) = self.subs.get_mut(sub.0) {
            s.stopped = true;
            s.next_claim_at = None;
            self.give_back_ahead(sub);
        }
        self.drive();
    }

    /// Begins the shutdown: no claim starts, no publish is taken, extensions stop, every
    /// advisory lock in work is released and every row lock rolled back; lease deliveries keep
    /// their leases. [`Event::Closed`] follows once every command has been answered.
    pub fn shutdown(&mut self, now: Time) {
        self.now = now;
        if self.state != State::Running {
            return;
        }
        self.state = State::ShuttingDown;
        self.ahead.clear();
        self.release_idle(Sweep::All);
        self.notify_owed(Sweep::All);
        self.deliveries.mark_all_dirty();
        // A lease extension in flight ends with the shutdown once it is answered.
        for id in self.deliveries.ids_where(Delivery::may_queue) {
            if let Some(d) = self.deliveries.get_mut(id) {
                d.queue_ending(Ending::Shutdown);
            }
        }
        for id in self.deliveries.ids_where(Delivery::in_work) {
            self.end(id, Ending::Shutdown);
        }
        self.relock_give_up();
        self.drive();
    }

    /// The reply to a command.
    pub fn handle_reply(&mut self, id: CommandId, reply: Reply<R>, now: Time) {
        self.now = now;
        self.command_answered(id, &reply);
        let Some(step) = self.pending.remove(&id) else {
            return;
        };
        self.dispatch(step, reply);
        self.drive();
    }

    // ----- outputs -----

    /// The next command to run.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event<R>> {
        self.events.pop_front()
    }

    /// When [`Broker::handle_timeout`] is next due, if anything waits for time.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.next()
    }

    // ----- the machinery -----

    fn next_command_id(&mut self) -> CommandId {
        let id = CommandId(self.next_command);
        self.next_command += 1;
        id
    }

    /// Hands a reply to the machine whose step it answers.
    fn dispatch(&mut self, step: Step, reply: Reply<R>) {
        match step {
            Step::Check { sub, stage } => self.on_check(sub, stage, reply),
            Step::Claim { claim, stage } => self.on_claim(claim, stage, reply),
            Step::Delivery { delivery, stage } => self.on_delivery(delivery, stage, reply),
            Step::Publish { publish, stage } => self.on_publish(publish, stage, reply),
            Step::Rollback { conn, then } => self.rolled_back(conn, *then, &reply),
            Step::Orphan => {}
            Step::Maintenance { task, stage } => self.on_maintenance(task, stage, reply),
        }
    }

    /// Starts the checks and claims that are due, ends the shutdown when nothing is left, and
    /// arms the timers.
    fn drive(&mut self) {
        loop {
            self.answer_here();
            self.drive_once();
            if !self.owes_answers() {
                break;
            }
        }
        self.rearm();
    }

    fn drive_once(&mut self) {
        let now = self.now;
        if self.state == State::Running {
            self.start_maintenance_due();
            for i in 0..self.subs.len() {
                let s = &self.subs[i];
                if s.state == SubState::Checking
                    && s.check.conn.is_none()
                    && s.check.again_at.is_some_and(|t| t <= now)
                {
                    self.start_check(SubId(i));
                }
                loop {
                    let s = &self.subs[i];
                    if !s.may_claim() || s.next_claim_at.is_none_or(|t| t > now) {
                        break;
                    }
                    let gated = self.gate.is_on();
                    if self.subs[i].gathers(now, gated) {
                        break;
                    }
                    let started = self.start_claim(SubId(i));
                    let s = &self.subs[i];
                    // The row lock form takes one row per claim: after a full claim, the
                    // next starts at once while slots are free.
                    if !started || !s.row_locks() || !s.last_full {
                        break;
                    }
                }
            }
        }
        if self.state == State::ShuttingDown && self.pending.is_empty() {
            debug_assert!(self.conns.is_empty(), "a connection outlived the shutdown");
            debug_assert!(
                self.deliveries.is_empty(),
                "a delivery outlived the shutdown"
            );
            self.state = State::Closed;
            self.events.push_back(Event::Closed(self.counts));
        }
    }

    /// Arms the timers of what changed: the kept connections, the notifications owed, the
    /// checks and claims of every subscription, and the deliveries touched since.
    fn rearm(&mut self) {
        let running = self.state == State::Running;
        self.timers.set(Timer::Linger, self.conns.next_expiry());
        for (i, p) in self.publishers.iter().enumerate() {
            let due = p.notify_due.filter(|_| self.state != State::Closed);
            self.timers.set(Timer::Notify(PublisherId(i)), due);
        }
        for (i, s) in self.subs.iter().enumerate() {
            let check = s
                .check
                .again_at
                .filter(|_| running && s.check.conn.is_none());
            self.timers.set(Timer::Check(SubId(i)), check);
            let claim = s
                .next_claim_at
                .filter(|_| running && s.may_claim())
                .map(|t| s.gather_until().map_or(t, |g| t.max(g)));
            self.timers.set(Timer::Claim(SubId(i)), claim);
        }
        self.rearm_maintenance();
        for (claim, at) in self.relock_times() {
            self.timers.set(Timer::Relock(claim), at);
        }
        for id in self.deliveries.take_dirty() {
            let (deadline, extend) = match self.deliveries.get(id) {
                Some(d) => (
                    d.deadline(),
                    d.extend_at().filter(|_| running && d.in_work()),
                ),
                None => (None, None),
            };
            self.timers.set(Timer::Deadline(id), deadline);
            self.timers.set(Timer::Extend(id), extend);
        }
    }
}

//! Metrics, through the [`metrics`](https://docs.rs/metrics) crate's facade: the service
//! records them, and an exporter the service installs (Prometheus, OpenTelemetry, StatsD, ..)
//! publishes them. Without an exporter they cost next to nothing and go nowhere.
//!
//! Install the exporter's recorder before the service starts: a broker takes the handles of
//! its subscriptions' metrics when it starts, from the recorder installed then.
//!
//! | name | kind | labels | what it counts or measures |
//! |---|---|---|---|
//! | `ruststream_published_total` | counter | `table` | rows written by a publish: a `Publisher`'s, once the database answered, and an `Outbox`'s (each adapter's outbox type, such as `SqlxOutbox`), once its inserts ran (a transaction rolled back afterwards is still counted); rows a table that deduplicates its publishes already had are not counted |
//! | `ruststream_claimed_total` | counter | `table`, `subscription` | rows handed to the subscription's handler: every take counts, so a retried row counts again; a row claimed ahead counts when it is handed; a row failed at its take for being past `max_attempts` is not handed and not counted here |
//! | `ruststream_settled_total` | counter | `table`, `subscription`, `outcome` | settlements that took effect, by `outcome`: `acknowledged` (deleted, or marked processed), `retried` (returned to the queue for another attempt, including a rejection on a table without a `failed_at` column, which keeps it as a retry), `rejected` (marked failed) |
//! | `ruststream_retried_total` | counter | `table`, `subscription` | rows returned to the queue for another attempt: the count of `ruststream_settled_total{outcome="retried"}`, as a series of its own for alerts (a handler's panic and its timeout are retries) |
//! | `ruststream_failed_total` | counter | `table`, `subscription` | rows that failed: rejected by the handler, whose payload or row did not decode, or taken past `max_attempts` (failed without the handler); on a table without `failed_at` the failure is reported and the row stays in the queue |
//! | `ruststream_returned_total` | counter | `table`, `subscription` | deliveries that left work without a settlement taking effect: dropped, ended by the shutdown, their lease lost, or their settlement's statement failed; the row returns to the queue (at once, or when its lease runs out) |
//! | `ruststream_in_work` | gauge | `table`, `subscription` | rows handed to the handler and not yet settled or returned, in this process |
//! | `ruststream_claimed_ahead` | gauge | `table`, `subscription` | rows the subscription claimed ahead (`prefetch`) and holds for its next free worker |
//! | `ruststream_waiting` | gauge | `table`, `subscription` | rows that failed in this process on a table with nowhere to write their retry's delay (no due or lease column), which its claims pass over until the delay ends |
//! | `ruststream_claim_duration_seconds` | histogram | `table`, `subscription` | each claim's search of the table for claimable rows: from the statement sent to the database's answer, whether it found rows or not (the row lock form's `SELECT .. FOR UPDATE SKIP LOCKED` or its count of attempts, the lease form's `UPDATE .. RETURNING` or its `SELECT .. FOR UPDATE`, the advisory lock form's candidates) |
//! | `ruststream_pickup_seconds` | histogram | `table`, `subscription` | from the claim's search that found the row (the statement sent; the last such search, where several read the row) to the handler starting: the claim's statements, the lock or take of the row, and the wait of a row claimed ahead for a free worker. The time the row was due in the table before that claim is not included: the claim reads no due or publish time. A subscription remembers the searches of the 2,048 to 4,096 rows found last: a row handed after more were found has no sample |
//! | `ruststream_handler_duration_seconds` | histogram | `table`, `subscription` | from the handler starting to its outcome (a panic or a timeout ends it too) |
//! | `ruststream_settle_duration_seconds` | histogram | `table`, `subscription` | from the handler's outcome to its settlement taking effect in the database |
//!
//! `table` is the table's name as its description gives it, `subscription` the subscriber's
//! name. Every series of a subscription exists from its broker's start, at 0.
//!
//! The tracing span of each delivery, `delivery`, carries the fields `subscription`, `table`,
//! `id`, `attempt` (where the table counts attempts), `key` (in the advisory lock form) and
//! `outcome`, recorded when the delivery ends: `acknowledged`, `retried`, `rejected`, or
//! `returned` where it left work without a settlement. The span lasts from the handler's
//! start to the settlement.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use metrics::{Counter, Gauge, Histogram, Unit};
use ruststream_core::dialect::{FormStatements, LeaseClaim, RowLockClaim};
use ruststream_core::{
    Action, Broker, ColumnType, Command, CommandId, DbError, Delivered, DeliveryId, Outcome,
    Output, PublishId, Published, Reply, Statement, StatementKind, Statements, SubId, Value,
};

/// `ruststream_published_total`: rows written by a publish.
pub const PUBLISHED: &str = "ruststream_published_total";
/// `ruststream_claimed_total`: rows handed to a handler.
pub const CLAIMED: &str = "ruststream_claimed_total";
/// `ruststream_settled_total`: settlements that took effect, by outcome.
pub const SETTLED: &str = "ruststream_settled_total";
/// `ruststream_retried_total`: rows returned to the queue for another attempt.
pub const RETRIED: &str = "ruststream_retried_total";
/// `ruststream_failed_total`: rows that failed.
pub const FAILED: &str = "ruststream_failed_total";
/// `ruststream_returned_total`: deliveries that left work without a settlement.
pub const RETURNED: &str = "ruststream_returned_total";
/// `ruststream_in_work`: rows handed to a handler and not yet settled or returned.
pub const IN_WORK: &str = "ruststream_in_work";
/// `ruststream_claimed_ahead`: rows claimed ahead, waiting for a free worker.
pub const CLAIMED_AHEAD: &str = "ruststream_claimed_ahead";
/// `ruststream_waiting`: rows that wait their retry's delay in this process.
pub const WAITING: &str = "ruststream_waiting";
/// `ruststream_claim_duration_seconds`: each claim's search of the table.
pub const CLAIM_DURATION: &str = "ruststream_claim_duration_seconds";
/// `ruststream_pickup_seconds`: from the claim's search that found a row to its handler's start.
pub const PICKUP: &str = "ruststream_pickup_seconds";
/// `ruststream_handler_duration_seconds`: from the handler's start to its outcome.
pub const HANDLER_DURATION: &str = "ruststream_handler_duration_seconds";
/// `ruststream_settle_duration_seconds`: from the handler's outcome to its settlement.
pub const SETTLE_DURATION: &str = "ruststream_settle_duration_seconds";

/// The label of the table's name.
pub const TABLE: &str = "table";
/// The label of the subscriber's name.
pub const SUBSCRIPTION: &str = "subscription";
/// The label of a settlement's outcome, on [`SETTLED`].
pub const OUTCOME: &str = "outcome";

/// The `outcome` of an acknowledgement.
pub const ACKNOWLEDGED: &str = "acknowledged";
/// The `outcome` of a retry.
pub const RETRIED_OUTCOME: &str = "retried";
/// The `outcome` of a rejection that marked the row failed.
pub const REJECTED: &str = "rejected";
/// The span's `outcome` of a delivery that left work without a settlement.
pub const RETURNED_OUTCOME: &str = "returned";

/// Tells the installed recorder every metric's unit and description. A broker calls it when
/// it starts; a service may call it earlier, once its exporter is installed.
pub fn describe() {
    metrics::describe_counter!(PUBLISHED, Unit::Count, "Rows written by a publish.");
    metrics::describe_counter!(CLAIMED, Unit::Count, "Rows handed to a handler.");
    metrics::describe_counter!(
        SETTLED,
        Unit::Count,
        "Settlements that took effect, by outcome."
    );
    metrics::describe_counter!(
        RETRIED,
        Unit::Count,
        "Rows returned to the queue for another attempt."
    );
    metrics::describe_counter!(FAILED, Unit::Count, "Rows that failed.");
    metrics::describe_counter!(
        RETURNED,
        Unit::Count,
        "Deliveries that left work without a settlement."
    );
    metrics::describe_gauge!(
        IN_WORK,
        Unit::Count,
        "Rows handed to a handler and not yet settled or returned."
    );
    metrics::describe_gauge!(
        CLAIMED_AHEAD,
        Unit::Count,
        "Rows claimed ahead, waiting for a free worker."
    );
    metrics::describe_gauge!(
        WAITING,
        Unit::Count,
        "Rows that wait their retry's delay in this process, passed over by its claims."
    );
    metrics::describe_histogram!(
        CLAIM_DURATION,
        Unit::Seconds,
        "Each claim's search of the table for claimable rows."
    );
    metrics::describe_histogram!(
        PICKUP,
        Unit::Seconds,
        "From the claim's search that found a row to its handler's start."
    );
    metrics::describe_histogram!(
        HANDLER_DURATION,
        Unit::Seconds,
        "From the handler's start to its outcome."
    );
    metrics::describe_histogram!(
        SETTLE_DURATION,
        Unit::Seconds,
        "From the handler's outcome to its settlement in the database."
    );
}

/// Counts rows written by a publish into `table`.
pub(crate) fn published(table: &'static str, rows: u64) {
    if rows > 0 {
        metrics::counter!(PUBLISHED, TABLE => table).increment(rows);
    }
}

/// The tracing span of a delivery: its table, subscription, row and attempt, and its outcome
/// once it ends.
pub(crate) fn delivery_span<R>(
    subscription: &'static str,
    table: &'static str,
    delivered: &Delivered<R>,
) -> tracing::Span {
    tracing::info_span!(
        "delivery",
        subscription,
        table,
        id = %delivered.id,
        attempt = delivered.attempt,
        key = delivered.key.as_deref(),
        outcome = tracing::field::Empty,
    )
}

/// The `outcome` label of a settlement.
fn outcome_label(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Ack => ACKNOWLEDGED,
        Outcome::Retry => RETRIED_OUTCOME,
        Outcome::Reject => REJECTED,
    }
}

/// One subscription's metrics, taken from the recorder when the broker starts.
struct SubMetrics {
    claimed: Counter,
    acknowledged: Counter,
    retried_settled: Counter,
    rejected: Counter,
    retried: Counter,
    failed: Counter,
    returned: Counter,
    in_work: Level,
    ahead: Level,
    waiting: Level,
    claim: Histogram,
    pickup: Histogram,
    handler: Histogram,
    settle: Histogram,
}

/// This broker's share of a gauge that every broker of the process with the same table and
/// subscription adds to: it moves the gauge by its own changes, and takes its share back when
/// the broker ends, so that two brokers do not overwrite each other's counts.
struct Level {
    gauge: Gauge,
    share: f64,
}

impl Level {
    /// The share of `gauge`, at 0; the series exists from the start.
    fn new(gauge: Gauge) -> Self {
        gauge.increment(0.0);
        Self { gauge, share: 0.0 }
    }

    /// Sets this broker's share to `value`.
    fn set(&mut self, value: f64) {
        let change = value - self.share;
        if change > 0.0 {
            self.gauge.increment(change);
        } else if change < 0.0 {
            self.gauge.decrement(-change);
        }
        self.share = value;
    }
}

impl Drop for Level {
    fn drop(&mut self) {
        self.set(0.0);
    }
}

impl SubMetrics {
    fn new(table: &'static str, subscription: &'static str) -> Self {
        let settled = |outcome: &'static str| {
            metrics::counter!(
                SETTLED,
                TABLE => table,
                SUBSCRIPTION => subscription,
                OUTCOME => outcome
            )
        };
        let m = Self {
            claimed: metrics::counter!(CLAIMED, TABLE => table, SUBSCRIPTION => subscription),
            acknowledged: settled(ACKNOWLEDGED),
            retried_settled: settled(RETRIED_OUTCOME),
            rejected: settled(REJECTED),
            retried: metrics::counter!(RETRIED, TABLE => table, SUBSCRIPTION => subscription),
            failed: metrics::counter!(FAILED, TABLE => table, SUBSCRIPTION => subscription),
            returned: metrics::counter!(RETURNED, TABLE => table, SUBSCRIPTION => subscription),
            in_work: Level::new(metrics::gauge!(
                IN_WORK,
                TABLE => table,
                SUBSCRIPTION => subscription
            )),
            ahead: Level::new(metrics::gauge!(
                CLAIMED_AHEAD,
                TABLE => table,
                SUBSCRIPTION => subscription
            )),
            waiting: Level::new(metrics::gauge!(
                WAITING,
                TABLE => table,
                SUBSCRIPTION => subscription
            )),
            claim: metrics::histogram!(
                CLAIM_DURATION,
                TABLE => table,
                SUBSCRIPTION => subscription
            ),
            pickup: metrics::histogram!(PICKUP, TABLE => table, SUBSCRIPTION => subscription),
            handler: metrics::histogram!(
                HANDLER_DURATION,
                TABLE => table,
                SUBSCRIPTION => subscription
            ),
            settle: metrics::histogram!(
                SETTLE_DURATION,
                TABLE => table,
                SUBSCRIPTION => subscription
            ),
        };
        // Every series exists from the start, at 0.
        for counter in [
            &m.claimed,
            &m.acknowledged,
            &m.retried_settled,
            &m.rejected,
            &m.retried,
            &m.failed,
            &m.returned,
        ] {
            counter.increment(0);
        }
        m
    }
}

/// A delivery in work: its span, and when its handler started and its settlement began.
struct Work {
    sub: SubId,
    span: tracing::Span,
    started: Instant,
    settling: Option<Instant>,
}

/// A claim's search in flight: its subscription, when it was sent, and where its rows' ids
/// are.
struct Search {
    sub: SubId,
    sent: Instant,
    id_at: Option<usize>,
}

/// The most rows a subscription remembers the search of. Past it the oldest are forgotten,
/// down to half of it, so the cost of forgetting is spread over the rows found since.
const STAMPS: usize = 4096;

/// Per subscription: when the search that last found each row was sent. A row a search found
/// and this process never handed (another claim or process took it after the search read it)
/// stays until it is among the oldest past [`STAMPS`].
#[derive(Default)]
struct Stamps {
    /// Each row's search time, and the order in which the rows were found.
    sent: HashMap<Value, (Instant, u64)>,
    next: u64,
}

impl Stamps {
    /// A search sent at `at` found the row `id`.
    fn found(&mut self, id: Value, at: Instant) {
        self.sent.insert(id, (at, self.next));
        self.next += 1;
        if self.sent.len() > STAMPS {
            self.forget_oldest();
        }
    }

    /// Keeps the half of [`STAMPS`] found last.
    fn forget_oldest(&mut self) {
        let keep = STAMPS / 2;
        let mut order: Vec<u64> = self.sent.values().map(|&(_, n)| n).collect();
        let at = order.len() - keep;
        let (_, &mut cutoff, _) = order.select_nth_unstable(at);
        self.sent.retain(|_, &mut (_, n)| n >= cutoff);
    }

    /// When the search that found `id` was sent, forgetting it.
    fn take(&mut self, id: &Value) -> Option<Instant> {
        self.sent.remove(id).map(|(at, _)| at)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.sent.len()
    }
}

/// What the driver records: the subscriptions' metrics, and what it needs to measure the
/// claims, deliveries and publishes in flight.
pub(crate) struct DriverMetrics {
    subs: Vec<SubMetrics>,
    /// The searches in flight.
    searches: HashMap<CommandId, Search>,
    /// The subscription each search statement seen belongs to, by its text's address (the
    /// text kept, so the address is not reused).
    owners: HashMap<usize, (Arc<str>, SubId)>,
    /// Per subscription: when the search that last found each row was sent.
    found: Vec<Stamps>,
    work: HashMap<DeliveryId, Work>,
    /// The publishes in flight: their table and how many rows each has.
    publishes: HashMap<PublishId, (&'static str, usize)>,
}

impl DriverMetrics {
    /// The metrics of these subscriptions, each `(table, subscription)`.
    pub(crate) fn new(subs: impl IntoIterator<Item = (&'static str, &'static str)>) -> Self {
        describe();
        let subs: Vec<SubMetrics> = subs
            .into_iter()
            .map(|(table, name)| SubMetrics::new(table, name))
            .collect();
        Self {
            found: subs.iter().map(|_| Stamps::default()).collect(),
            subs,
            searches: HashMap::new(),
            owners: HashMap::new(),
            work: HashMap::new(),
            publishes: HashMap::new(),
        }
    }

    /// A command is on its way: a claim's search is timed.
    pub(crate) fn sent<R>(&mut self, command: &Command, core: &Broker<R>) {
        let Action::Execute { statement, .. } = &command.action else {
            return;
        };
        if !is_search(statement.kind) {
            return;
        }
        let Some(sub) = self.owner(statement, core) else {
            return;
        };
        let id_at = match &statement.output {
            Output::Rows { columns, .. } => columns.iter().position(|c| c.ty == ColumnType::Id),
            _ => None,
        };
        self.searches.insert(
            command.id,
            Search {
                sub,
                sent: Instant::now(),
                id_at,
            },
        );
    }

    /// A command's reply came in: a search's duration is recorded, and the rows it found
    /// remembered.
    pub(crate) fn answered<R>(&mut self, id: CommandId, reply: &Reply<R>) {
        let Some(search) = self.searches.remove(&id) else {
            return;
        };
        let Some(m) = self.subs.get(search.sub.0) else {
            return;
        };
        m.claim.record(search.sent.elapsed());
        let (Reply::Rows(rows), Some(at)) = (reply, search.id_at) else {
            return;
        };
        let found = &mut self.found[search.sub.0];
        for row in rows {
            if let Some(id) = row.values.get(at).filter(|v| **v != Value::Null) {
                found.found(id.clone(), search.sent);
            }
        }
    }

    /// A delivery's handler starts.
    pub(crate) fn handed<R>(&mut self, delivered: &Delivered<R>, span: &tracing::Span) {
        let sub = delivered.sub;
        let Some(m) = self.subs.get(sub.0) else {
            return;
        };
        m.claimed.increment(1);
        if let Some(sent) = self.found[sub.0].take(&delivered.id) {
            m.pickup.record(sent.elapsed());
        }
        self.work.insert(
            delivered.delivery,
            Work {
                sub,
                span: span.clone(),
                started: Instant::now(),
                settling: None,
            },
        );
    }

    /// A handler's outcome reached the driver: its settlement begins.
    pub(crate) fn settling(&mut self, delivery: DeliveryId) {
        if let Some(work) = self.work.get_mut(&delivery)
            && work.settling.is_none()
        {
            let now = Instant::now();
            self.subs[work.sub.0]
                .handler
                .record(now.duration_since(work.started));
            work.settling = Some(now);
        }
    }

    /// A settlement took effect.
    pub(crate) fn settled(&mut self, delivery: DeliveryId, outcome: Outcome) {
        let Some(work) = self.work.remove(&delivery) else {
            return;
        };
        let m = &self.subs[work.sub.0];
        match outcome {
            Outcome::Ack => m.acknowledged.increment(1),
            Outcome::Retry => {
                m.retried_settled.increment(1);
                m.retried.increment(1);
            }
            Outcome::Reject => m.rejected.increment(1),
        }
        if let Some(since) = work.settling {
            m.settle.record(since.elapsed());
        }
        work.span.record("outcome", outcome_label(outcome));
    }

    /// A delivery left work without a settlement.
    pub(crate) fn returned(&mut self, delivery: DeliveryId) {
        let Some(work) = self.work.remove(&delivery) else {
            return;
        };
        self.subs[work.sub.0].returned.increment(1);
        work.span.record("outcome", RETURNED_OUTCOME);
    }

    /// A row of `sub` failed.
    pub(crate) fn failed(&mut self, sub: SubId) {
        if let Some(m) = self.subs.get(sub.0) {
            m.failed.increment(1);
        }
    }

    /// A publish of `rows` rows into `table` is on its way.
    pub(crate) fn publishing(&mut self, publish: PublishId, table: &'static str, rows: usize) {
        self.publishes.insert(publish, (table, rows));
    }

    /// A publish ended.
    pub(crate) fn published(&mut self, publish: PublishId, result: &Result<Published, DbError>) {
        let Some((table, rows)) = self.publishes.remove(&publish) else {
            return;
        };
        if let Ok(published) = result {
            let written = rows.saturating_sub(published.skipped.len());
            published_rows(table, written);
        }
    }

    /// The gauges, as the core counts them now.
    pub(crate) fn gauges<R>(&mut self, core: &Broker<R>) {
        for (i, m) in self.subs.iter_mut().enumerate() {
            m.in_work.set(core.in_work(SubId(i)) as f64);
            m.ahead.set(core.claimed_ahead(SubId(i)) as f64);
            m.waiting.set(core.waiting(SubId(i)) as f64);
        }
    }

    /// The subscription a claim's search belongs to: the one that rendered the statement, or,
    /// for a statement rendered for one claim, the one whose search of the same kind shares
    /// the longest start of its text (the table's name is in it).
    fn owner<R>(&mut self, statement: &Statement, core: &Broker<R>) -> Option<SubId> {
        let address = Arc::as_ptr(&statement.sql).cast::<u8>() as usize;
        if let Some((_, sub)) = self.owners.get(&address) {
            return Some(*sub);
        }
        let mut best: Option<(usize, SubId)> = None;
        'subs: for i in 0..self.subs.len() {
            let Some(statements) = core.statements(SubId(i)) else {
                continue;
            };
            for own in searches(statements) {
                if Arc::ptr_eq(&own.sql, &statement.sql) {
                    best = Some((usize::MAX, SubId(i)));
                    break 'subs;
                }
                if own.kind == statement.kind {
                    let common = common_start(&own.sql, &statement.sql);
                    if best.is_none_or(|(longest, _)| common > longest) {
                        best = Some((common, SubId(i)));
                    }
                }
            }
        }
        let (_, sub) = best?;
        self.owners.insert(address, (statement.sql.clone(), sub));
        Some(sub)
    }
}

/// Counts `rows` rows written into `table`.
fn published_rows(table: &'static str, rows: usize) {
    published(table, u64::try_from(rows).unwrap_or(u64::MAX));
}

/// Whether a statement of this kind is a claim's search of the table for claimable rows.
fn is_search(kind: StatementKind) -> bool {
    matches!(
        kind,
        StatementKind::LockRow
            | StatementKind::CountRow
            | StatementKind::SelectRowId
            | StatementKind::ClaimLease
            | StatementKind::SelectLease
            | StatementKind::Candidates
    )
}

/// A subscription's searches of its table for claimable rows.
fn searches(statements: &Statements) -> Vec<&Statement> {
    let mut out = Vec::new();
    match &statements.form {
        FormStatements::RowLock(st) => {
            match &st.claim {
                RowLockClaim::Lock { lock_row } => out.push(lock_row),
                RowLockClaim::Count { count_row, .. } => out.push(count_row),
                RowLockClaim::SelectCount { select_row_id, .. } => out.push(select_row_id),
            }
            out.extend(&st.count_row_from);
        }
        FormStatements::Lease(st) => {
            match &st.claim {
                LeaseClaim::Returning { claim } => out.push(claim),
                LeaseClaim::Locking { select, .. } => out.push(select),
            }
            out.extend(&st.claim_from);
        }
        FormStatements::Advisory(st) => {
            out.push(&st.candidates);
            out.extend(&st.candidates_from);
        }
    }
    out
}

/// How many bytes two texts share from their start.
fn common_start(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{STAMPS, Stamps};
    use crate::Value;

    /// Rows found and never handed here (another claim took them after the search read them)
    /// are forgotten oldest first, so the stamps stay within their bound however long the
    /// service runs, and the newest stay timed.
    #[test]
    fn stamps_of_rows_never_handed_stay_bounded_and_the_newest_stay() {
        let mut stamps = Stamps::default();
        let start = Instant::now();
        // Each search finds 100 rows, all stamped with its time.
        let at = |i: usize| start + Duration::from_micros((i / 100) as u64);
        let rows = 10 * STAMPS;
        for i in 0..rows {
            stamps.found(Value::Int(i as i64), at(i));
            assert!(
                stamps.len() <= STAMPS,
                "{} stamps after {i} rows",
                stamps.len()
            );
        }
        assert!(stamps.len() >= STAMPS / 2, "{} stamps", stamps.len());
        let newest = Value::Int(rows as i64 - 1);
        assert_eq!(stamps.take(&newest), Some(at(rows - 1)));
        assert_eq!(stamps.take(&newest), None, "taken once");
        assert_eq!(
            stamps.take(&Value::Int(0)),
            None,
            "the oldest are forgotten"
        );
    }

    /// A row found again by a later search is timed from that search.
    #[test]
    fn a_row_found_again_is_timed_from_the_later_search() {
        let mut stamps = Stamps::default();
        let first = Instant::now();
        let later = first + Duration::from_millis(5);
        stamps.found(Value::Int(7), first);
        stamps.found(Value::Int(7), later);
        assert_eq!(stamps.len(), 1);
        assert_eq!(stamps.take(&Value::Int(7)), Some(later));
    }
}

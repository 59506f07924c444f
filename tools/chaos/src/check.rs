//! The invariants, checked from outside: from what the handlers recorded (the log), what the
//! table holds after the run, and the faults the parent injected. Pure: no IO.
//!
//! - **Settled as the outcomes say.** A row deleted had its last delivery acknowledged; a
//!   row failed with the handler's rejection error had its last delivery rejected, at the
//!   attempt the row counts; a row failed otherwise went past the attempt budget (its
//!   attempt above `max_attempts`); no row is left queued.
//! - **In work once.** The handler intervals of one row do not overlap; in the advisory form
//!   neither do those of one key. A delivery whose process was SIGKILLed (or died) without
//!   recording its end ends when the parent saw the process gone. An overlap is excused, and
//!   counted apart, where the fault explains it: in the row lock and advisory forms a session
//!   killed on the server (or the server restarted) between the first one's take (at most
//!   [`TAKE_SLACK_US`] before its start) and the second start, since the row's
//!   transaction or the key's lock ended with that session while its handler went on; in the
//!   lease form the second start a whole lease after the first (the lease ran out while the
//!   handler worked).
//! - **Attempts exact.** A row's attempts rise at each start; they are consecutive, and the
//!   first is 1, unless a fault (a kill, a killed session, a restart) fell between the two
//!   starts (before the first): a take that a fault cut short spends its attempt. No handler
//!   runs past the budget.
//! - **A retry waits its delay.** Where the subscriptions retry after a delay (not
//!   retry_storm's immediate retries), a row's next delivery after one that ended in a retry
//!   starts no sooner than that delivery's end plus the delay (less [`RETRY_SLACK_US`]): the
//!   retry's due time is written after the handler ended, by the database's clock, and the
//!   claim compares with that clock. Not where a fault hit the retrying process (a kill, a
//!   killed session of its, its death) or the server (a restart) between the two starts,
//!   since the row may then return without the retry's due time; not where the two overlap
//!   (the check above judges that); in the lease form not where the second starts a lease
//!   after the first (the lease ran out before the retry was written). The times of the log
//!   are the machine's clock, which the database's shares (each child brings its own clock
//!   back to it, clock_skew included). A process whose own clock decided the due time would
//!   fail this: 45 s behind, it would make the row due at once. On a table with nowhere to
//!   write the delay (poison_rows' bare table, but in the lease form) the row waits it in the
//!   memory of the process that retried it, so only that process's next delivery is judged.
//! - **A poison row never spins** (poison_rows): a row whose payload does not decode never
//!   reaches a handler, stays in the table (which keeps no failed rows), and is taken again no
//!   sooner than its delay by each process: at most [`Poison::most_takes`] times in the run.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::Form;
use crate::plan::{Outcome, REJECT_PREFIX};
use crate::rows::KEY_PREFIX;

/// One delivery as its handler recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The process (each start has its own number).
    pub spawn: i64,
    /// The delivery's number in its process.
    pub seq: i64,
    /// The row's id.
    pub job: i64,
    /// The attempt the take counted.
    pub attempt: i64,
    /// The advisory key, in that form.
    pub key: Option<String>,
    /// The process id.
    pub pid: i64,
    /// When the handler started (µs since the epoch).
    pub start_us: i64,
    /// When it ended, if it recorded that.
    pub end_us: Option<i64>,
    /// Its outcome, if it recorded that.
    pub outcome: Option<String>,
}

/// A row left in the table after the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowState {
    /// The row's id.
    pub id: i64,
    /// Its attempt column.
    pub attempt: i64,
    /// Whether it is marked failed.
    pub failed: bool,
    /// Its error column.
    pub error: Option<String>,
}

/// A fault the parent injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// A process SIGKILLed.
    Kill,
    /// A session killed on the server.
    SessionKill,
    /// The server restarted (from the stop to the start).
    Restart,
}

/// A fault and when it happened: from the parent's call to its answer (µs since the epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// When the parent set out to inject it.
    pub from_us: i64,
    /// When the parent saw it done.
    pub to_us: i64,
    /// What.
    pub kind: FaultKind,
    /// The process it hit, where known: the one killed, or (PostgreSQL, by the session's
    /// `application_name`) the one whose session was killed.
    pub spawn: Option<i64>,
}

/// What the check needs of a run.
pub struct Input<'a> {
    /// Every job published: id and `k`.
    pub jobs: &'a [(i64, i64)],
    /// The rows left in the table.
    pub remaining: &'a [RowState],
    /// The log.
    pub log: &'a [Delivery],
    /// Processes that ended without a graceful shutdown (killed, or died): when the parent
    /// saw them gone.
    pub ended: &'a HashMap<i64, i64>,
    /// The faults, in the order of their `from_us`.
    pub faults: &'a [Fault],
    /// The form.
    pub form: Form,
    /// The subscriptions' `max_attempts`.
    pub max_attempts: i64,
    /// The lease, in µs.
    pub lease_us: i64,
    /// When the first service started.
    pub start_us: i64,
    /// The subscriptions' retry delay, in µs (0: retries are due at once, nothing to check).
    pub retry_delay_us: i64,
    /// Whether a retried row waits its delay in the memory of the process that retried it
    /// only (a table with no due and no lease column).
    pub waits_in_process: bool,
    /// poison_rows: the rows that do not decode.
    pub poison: Option<Poison<'a>>,
}

/// poison_rows' rows that do not decode, and how often each may have been taken.
pub struct Poison<'a> {
    /// Their ids.
    pub ids: &'a HashSet<i64>,
    /// The most takes a poison row may count by the stop: one at once, then one a delay in
    /// each process, over the run.
    pub most_takes: i64,
    /// Each poison row's takes read just before the services were sent SIGTERM.
    pub at_stop: &'a HashMap<i64, i64>,
    /// The takes a poison row may count after that read: one a process, by a claim already
    /// on its way when the signal came.
    pub in_flight: i64,
}

/// What the check found.
#[derive(Debug, Default)]
pub struct Report {
    /// Breaks of the invariants.
    pub violations: Vec<String>,
    /// Overlaps a fault explains.
    pub excused: Vec<String>,
    /// Deliveries recorded.
    pub deliveries: usize,
    /// Rows deleted.
    pub acked: usize,
    /// Rows failed by a rejection.
    pub rejected: usize,
    /// Rows failed past the attempt budget.
    pub exhausted: usize,
    /// Attempts spent without a recorded delivery (a fault in between).
    pub spent: i64,
    /// poison_rows: the poison rows, and the most takes one of them counted.
    pub poison: Option<(usize, i64)>,
}

/// How far apart two starts must be, beyond the lease, for the lease form to excuse their
/// overlap: the lease is written at the claim, a moment before the handler starts.
const LEASE_SLACK_US: i64 = 500_000;

/// How much sooner than its retry's delay a row's next delivery may start: the rounding of
/// the times the log and the server hold.
pub const RETRY_SLACK_US: i64 = 5_000;

/// How long before its handler starts a delivery's row (or key) may have been taken: a
/// session killed in between ended the lock before the handler began.
const TAKE_SLACK_US: i64 = 250_000;

/// Whether a fault of one of `kinds` (sorted by `from_us`) overlaps `[from, to]`.
fn fault_in(faults: &[Fault], from: i64, to: i64, kinds: &[FaultKind]) -> bool {
    fault_where(faults, from, to, |f| kinds.contains(&f.kind))
}

/// Whether a fault that `pick` accepts (sorted by `from_us`) overlaps `[from, to]`.
fn fault_where(faults: &[Fault], from: i64, to: i64, pick: impl Fn(&Fault) -> bool) -> bool {
    // No fault lasts longer than a minute (a restart takes seconds): the ones that may reach
    // `from` start at most that much before it.
    const LONGEST_US: i64 = 60_000_000;
    let first = faults.partition_point(|f| f.from_us < from.saturating_sub(LONGEST_US));
    faults[first..]
        .iter()
        .take_while(|f| f.from_us <= to)
        .any(|f| f.to_us >= from && pick(f))
}

/// The interval of a delivery: its recorded end, or when its process was seen gone.
fn end_of(d: &Delivery, ended: &HashMap<i64, i64>) -> Option<i64> {
    d.end_us.or_else(|| ended.get(&d.spawn).copied())
}

fn describe(d: &Delivery, ended: &HashMap<i64, i64>) -> String {
    let end = match (d.end_us, ended.get(&d.spawn)) {
        (Some(end), _) => end.to_string(),
        (None, Some(gone)) => format!("open, process gone at {gone}"),
        (None, None) => "open".to_owned(),
    };
    format!(
        "spawn {} attempt {} [{}..{end}]",
        d.spawn, d.attempt, d.start_us
    )
}

/// Checks a set of intervals (one row's, or one key's) for overlaps; `what` names the set.
fn overlaps(what: &str, list: &[&Delivery], input: &Input<'_>, report: &mut Report) {
    // Sorted by start: each start is compared with the latest end so far.
    let mut latest: Option<(&Delivery, i64)> = None;
    for &d in list {
        if let Some((before, end)) = latest
            && d.start_us < end
        {
            let excuse = match input.form {
                Form::Lease => (d.start_us - before.start_us >= input.lease_us - LEASE_SLACK_US)
                    .then_some("the lease ran out while the handler worked"),
                // The first delivery's row lock or key lock ends with its session: a
                // session of its process killed, or the server restarted.
                Form::RowLock | Form::Advisory => {
                    let taken = before.start_us.saturating_sub(TAKE_SLACK_US);
                    fault_where(input.faults, taken, d.start_us, |f| {
                        f.kind == FaultKind::Restart
                            || (f.kind == FaultKind::SessionKill
                                && f.spawn.is_none_or(|s| s == before.spawn))
                    })
                    .then_some(
                        "a session of the first one's process was killed (or the server \
                             restarted) in between",
                    )
                }
            };
            let text = format!(
                "{what}: in work twice at once: {} and {}",
                describe(before, input.ended),
                describe(d, input.ended)
            );
            match excuse {
                Some(why) => report.excused.push(format!("{text} ({why})")),
                None => report.violations.push(text),
            }
        }
        let end = end_of(d, input.ended).unwrap_or(i64::MAX);
        if latest.is_none_or(|(_, e)| end > e) {
            latest = Some((d, end));
        }
    }
}

/// Checks that each retry of one row (its deliveries, sorted by start) waited the retry delay:
/// before any process's next delivery, or where the row waits in the memory of the process
/// that retried it, before that process's.
fn retry_waits(job: i64, list: &[&Delivery], input: &Input<'_>, report: &mut Report) {
    if input.retry_delay_us <= 0 {
        return;
    }
    if input.waits_in_process {
        let mut by_spawn: BTreeMap<i64, Vec<&Delivery>> = BTreeMap::new();
        for &d in list {
            by_spawn.entry(d.spawn).or_default().push(d);
        }
        for own in by_spawn.values() {
            retry_pairs(job, own, input, report);
        }
    } else {
        retry_pairs(job, list, input, report);
    }
}

/// [`retry_waits`] over consecutive deliveries of `list`.
fn retry_pairs(job: i64, list: &[&Delivery], input: &Input<'_>, report: &mut Report) {
    for pair in list.windows(2) {
        let (before, d) = (pair[0], pair[1]);
        let (Some(end), Some(Outcome::Retry)) = (
            before.end_us,
            before.outcome.as_deref().and_then(Outcome::parse),
        ) else {
            continue;
        };
        // An overlap is the other check's; the lease may have run out under a long handler.
        if d.start_us < end
            || (input.form == Form::Lease
                && d.start_us - before.start_us >= input.lease_us - LEASE_SLACK_US)
        {
            continue;
        }
        // The retrying process (or a session of its, or the server) hit in between: the row
        // may have returned without the retry written.
        let hit = fault_where(input.faults, before.start_us, d.start_us, |f| {
            f.kind == FaultKind::Restart || f.spawn.is_none_or(|s| s == before.spawn)
        }) || input
            .ended
            .get(&before.spawn)
            .is_some_and(|&gone| gone <= d.start_us);
        if hit {
            continue;
        }
        let waited = d.start_us - end;
        if waited < input.retry_delay_us - RETRY_SLACK_US {
            report.violations.push(format!(
                "job {job}: {} started {:.1} ms after {} ended in a retry, before the retry \
                 delay of {} ms",
                describe(d, input.ended),
                waited as f64 / 1000.0,
                describe(before, input.ended),
                input.retry_delay_us / 1000
            ));
        }
    }
}

/// Checks a run.
pub fn check(input: &Input<'_>) -> Report {
    let mut report = Report {
        deliveries: input.log.len(),
        ..Report::default()
    };
    let all_faults = [FaultKind::Kill, FaultKind::SessionKill, FaultKind::Restart];
    let keys: HashMap<i64, i64> = input.jobs.iter().copied().collect();
    let remaining: HashMap<i64, &RowState> = input.remaining.iter().map(|r| (r.id, r)).collect();

    let mut by_job: BTreeMap<i64, Vec<&Delivery>> = BTreeMap::new();
    let mut by_key: BTreeMap<&str, Vec<&Delivery>> = BTreeMap::new();
    for d in input.log {
        if !keys.contains_key(&d.job) {
            report
                .violations
                .push(format!("job {}: delivered but never published", d.job));
            continue;
        }
        if d.end_us.is_none() && !input.ended.contains_key(&d.spawn) {
            report.violations.push(format!(
                "job {}: the handler of {} never recorded its end, and its process shut down \
                 gracefully",
                d.job,
                describe(d, input.ended)
            ));
        }
        by_job.entry(d.job).or_default().push(d);
        if input.form == Form::Advisory {
            let expected = format!("{KEY_PREFIX}{}", keys[&d.job]);
            match d.key.as_deref() {
                Some(key) if key == expected => by_key.entry(key).or_default().push(d),
                other => report.violations.push(format!(
                    "job {}: delivered with key {other:?}, expected {expected}",
                    d.job
                )),
            }
        }
    }
    for list in by_job.values_mut() {
        list.sort_by_key(|d| (d.start_us, d.attempt));
    }
    for list in by_key.values_mut() {
        list.sort_by_key(|d| (d.start_us, d.attempt));
    }

    if let Some(poison) = &input.poison {
        check_poison(poison, &by_job, &remaining, &mut report);
    }
    for &(job, _) in input.jobs {
        if input.poison.as_ref().is_some_and(|p| p.ids.contains(&job)) {
            continue;
        }
        let list = by_job.get(&job).map(Vec::as_slice).unwrap_or(&[]);
        let what = format!("job {job}");
        overlaps(&what, list, input, &mut report);

        // Attempts.
        let mut before_start = input.start_us;
        let mut before_attempt = 0;
        for d in list {
            if d.attempt <= before_attempt {
                report.violations.push(format!(
                    "{what}: attempt {} started after attempt {before_attempt}",
                    d.attempt
                ));
            } else if d.attempt > before_attempt + 1 {
                if fault_in(input.faults, before_start, d.start_us, &all_faults) {
                    report.spent += d.attempt - before_attempt - 1;
                } else {
                    report.violations.push(format!(
                        "{what}: attempt {} followed attempt {before_attempt} with no fault in \
                         between (attempts spent without a delivery)",
                        d.attempt
                    ));
                }
            }
            if d.attempt > input.max_attempts {
                report.violations.push(format!(
                    "{what}: handed at attempt {}, past max_attempts {}",
                    d.attempt, input.max_attempts
                ));
            }
            before_start = d.start_us;
            before_attempt = before_attempt.max(d.attempt);
        }

        // The row's end.
        let last = list.last();
        let last_outcome = last.and_then(|d| d.outcome.as_deref().and_then(Outcome::parse));
        let fault_since_last = fault_in(
            input.faults,
            last.map_or(input.start_us, |d| d.start_us),
            i64::MAX,
            &all_faults,
        );
        match remaining.get(&job) {
            None => {
                if last_outcome == Some(Outcome::Ack) {
                    report.acked += 1;
                } else {
                    report.violations.push(format!(
                        "{what}: deleted, but its last delivery was not acknowledged ({})",
                        last.map_or("no delivery".to_owned(), |d| format!(
                            "{}, outcome {}",
                            describe(d, input.ended),
                            d.outcome.as_deref().unwrap_or("none")
                        ))
                    ));
                }
            }
            Some(row) if !row.failed => report.violations.push(format!(
                "{what}: still queued at attempt {} after the run (last delivery: {})",
                row.attempt,
                last.map_or("none".to_owned(), |d| describe(d, input.ended))
            )),
            Some(row) => {
                let error = row.error.as_deref().unwrap_or("");
                if error.starts_with(REJECT_PREFIX) {
                    report.rejected += 1;
                    match last {
                        Some(d) if last_outcome == Some(Outcome::Reject) => {
                            if row.attempt != d.attempt {
                                report.violations.push(format!(
                                    "{what}: rejected at attempt {}, but the row counts {}",
                                    d.attempt, row.attempt
                                ));
                            }
                        }
                        _ => report.violations.push(format!(
                            "{what}: failed with a rejection, but its last delivery did not \
                             reject ({})",
                            last.map_or("none".to_owned(), |d| describe(d, input.ended))
                        )),
                    }
                } else if row.attempt > input.max_attempts
                    || (row.attempt == input.max_attempts && last_outcome == Some(Outcome::Retry))
                {
                    report.exhausted += 1;
                    let last_attempt = last.map_or(0, |d| d.attempt);
                    // The retry of the last attempt the budget allows fails the row at once;
                    // only a fault (a kill, a lost session) takes a row past the budget.
                    let at_once =
                        row.attempt == input.max_attempts && last_attempt == input.max_attempts;
                    if !fault_since_last && !at_once {
                        report.violations.push(format!(
                            "{what}: failed past the budget at attempt {} after its last \
                             delivery at attempt {last_attempt}, with no fault since",
                            row.attempt
                        ));
                    }
                    if last_outcome == Some(Outcome::Reject) && !fault_since_last {
                        report.violations.push(format!(
                            "{what}: its last delivery rejected, but the row failed past the \
                             budget ({error})"
                        ));
                    }
                } else {
                    report.violations.push(format!(
                        "{what}: failed at attempt {} with an unexpected error: {error}",
                        row.attempt
                    ));
                }
            }
        }
    }

    for (job, list) in &by_job {
        retry_waits(*job, list, input, &mut report);
    }
    for (key, list) in &by_key {
        overlaps(&format!("key {key}"), list, input, &mut report);
    }
    report
}

/// The poison rows: never handed, still in the table, taken again but never in a loop.
fn check_poison(
    poison: &Poison<'_>,
    by_job: &BTreeMap<i64, Vec<&Delivery>>,
    remaining: &HashMap<i64, &RowState>,
    report: &mut Report,
) {
    let mut most = 0;
    for &job in poison.ids {
        if let Some(list) = by_job.get(&job) {
            report.violations.push(format!(
                "job {job}: a poison row (its payload does not decode) reached the handler {} \
                 time(s)",
                list.len()
            ));
        }
        let Some(row) = remaining.get(&job) else {
            report.violations.push(format!(
                "job {job}: a poison row is gone from a table that keeps no failed rows"
            ));
            continue;
        };
        most = most.max(row.attempt);
        let before_stop = poison.at_stop.get(&job).copied().unwrap_or(row.attempt);
        if row.attempt < 2 {
            report.violations.push(format!(
                "job {job}: a poison row was taken {} time(s): never again after its delay",
                row.attempt
            ));
        } else if before_stop > poison.most_takes {
            report.violations.push(format!(
                "job {job}: a poison row was taken {before_stop} times before the stop, more \
                 than the {} its delay allows",
                poison.most_takes
            ));
        } else if row.attempt > before_stop + poison.in_flight {
            report.violations.push(format!(
                "job {job}: a poison row was taken {} times after the stop signal, more than \
                 one a process",
                row.attempt - before_stop
            ));
        }
    }
    report.poison = Some((poison.ids.len(), most));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(
        spawn: i64,
        job: i64,
        attempt: i64,
        start: i64,
        end: Option<i64>,
        outcome: &str,
    ) -> Delivery {
        Delivery {
            spawn,
            seq: 0,
            job,
            attempt,
            key: Some(format!("{KEY_PREFIX}{}", job % 2)),
            pid: 100 + spawn,
            start_us: start,
            end_us: end,
            outcome: (!outcome.is_empty()).then(|| outcome.to_owned()),
        }
    }

    fn run(
        form: Form,
        jobs: &[(i64, i64)],
        remaining: &[RowState],
        log: &[Delivery],
        ended: &[(i64, i64)],
        faults: &[Fault],
    ) -> Report {
        run_with_delay(form, jobs, remaining, log, ended, faults, 0)
    }

    fn run_with_delay(
        form: Form,
        jobs: &[(i64, i64)],
        remaining: &[RowState],
        log: &[Delivery],
        ended: &[(i64, i64)],
        faults: &[Fault],
        retry_delay_us: i64,
    ) -> Report {
        let ended: HashMap<i64, i64> = ended.iter().copied().collect();
        check(&Input {
            jobs,
            remaining,
            log,
            ended: &ended,
            faults,
            form,
            max_attempts: 3,
            lease_us: 2_000_000,
            start_us: 0,
            retry_delay_us,
            waits_in_process: false,
            poison: None,
        })
    }

    #[test]
    fn a_clean_run_passes() {
        let jobs = [(1, 1), (2, 0), (3, 1)];
        let log = [
            d(1, 1, 1, 10, Some(20), "retry"),
            d(1, 1, 2, 30, Some(40), "ack"),
            d(2, 2, 1, 10, Some(50), "reject"),
            d(2, 3, 1, 41, Some(60), "ack"),
        ];
        let remaining = [RowState {
            id: 2,
            attempt: 1,
            failed: true,
            error: Some(format!("{REJECT_PREFIX} job 2 at attempt 1")),
        }];
        let report = run(Form::Advisory, &jobs, &remaining, &log, &[], &[]);
        assert_eq!(report.violations, Vec::<String>::new());
        assert_eq!((report.acked, report.rejected), (2, 1));
    }

    #[test]
    fn overlaps_of_a_row_and_of_a_key_are_caught() {
        let jobs = [(1, 1), (3, 1)];
        // Job 1 twice at once; jobs 1 and 3 (key chaos-1) at once.
        let log = [
            d(1, 1, 1, 10, Some(30), "retry"),
            d(2, 1, 2, 20, Some(40), "ack"),
            d(2, 3, 1, 35, Some(50), "ack"),
        ];
        let report = run(Form::Advisory, &jobs, &[], &log, &[], &[]);
        let v = &report.violations;
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(v[0].starts_with("job 1: in work twice"));
        // Key chaos-1: job 1's two deliveries, then job 1's second with job 3's.
        assert!(v[1].starts_with("key chaos-1: in work twice"));
        assert!(v[2].ends_with("spawn 2 attempt 1 [35..50]"));
    }

    #[test]
    fn an_open_interval_of_a_killed_process_ends_at_the_kill() {
        let jobs = [(1, 1)];
        let log = [d(1, 1, 1, 10, None, ""), d(2, 1, 2, 30, Some(40), "ack")];
        let kill = [Fault {
            from_us: 25,
            to_us: 25,
            kind: FaultKind::Kill,
            spawn: Some(1),
        }];
        let report = run(Form::RowLock, &jobs, &[], &log, &[(1, 25)], &kill);
        assert_eq!(report.violations, Vec::<String>::new());
        // Killed at 35, after the second start: an overlap.
        let report = run(Form::RowLock, &jobs, &[], &log, &[(1, 35)], &kill);
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
        // A process that shut down gracefully left a handler open.
        let report = run(Form::RowLock, &jobs, &[], &log, &[], &kill);
        assert!(report.violations[0].contains("never recorded its end"));
    }

    #[test]
    fn an_overlap_after_a_killed_session_is_excused_in_the_row_lock_form_only() {
        let jobs = [(1, 1)];
        let log = [
            d(1, 1, 1, 10, Some(30), "ack"),
            d(2, 1, 2, 20, Some(40), "ack"),
        ];
        let cut = [Fault {
            from_us: 15,
            to_us: 16,
            kind: FaultKind::SessionKill,
            spawn: Some(1),
        }];
        let report = run(Form::RowLock, &jobs, &[], &log, &[], &cut);
        assert_eq!(report.violations, Vec::<String>::new());
        assert_eq!(report.excused.len(), 1);
        // A session of the second delivery's process explains nothing.
        let other = [Fault {
            spawn: Some(2),
            ..cut[0]
        }];
        let report = run(Form::RowLock, &jobs, &[], &log, &[], &other);
        assert_eq!(report.violations.len(), 1);
        let report = run(Form::Lease, &jobs, &[], &log, &[], &cut);
        assert_eq!(report.violations.len(), 1);
    }

    #[test]
    fn a_session_killed_between_the_take_and_the_handler_excuses_an_overlap() {
        let jobs = [(1, 1)];
        let start = 1_000_000;
        let log = [
            d(1, 1, 1, start, Some(start + 100_000), "ack"),
            d(1, 1, 2, start + 25_000, Some(start + 120_000), "ack"),
        ];
        // Killed 10 ms before the first handler started: after its take.
        let cut = [Fault {
            from_us: start - 10_000,
            to_us: start - 9_000,
            kind: FaultKind::SessionKill,
            spawn: Some(1),
        }];
        let report = run(Form::RowLock, &jobs, &[], &log, &[], &cut);
        assert_eq!(report.violations, Vec::<String>::new());
        assert_eq!(report.excused.len(), 1);
        // Killed long before: it explains nothing.
        let early = [Fault {
            from_us: start - 2 * TAKE_SLACK_US,
            to_us: start - 2 * TAKE_SLACK_US + 1_000,
            ..cut[0]
        }];
        let report = run(Form::RowLock, &jobs, &[], &log, &[], &early);
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
    }

    #[test]
    fn attempts_must_rise_and_skip_only_across_a_fault() {
        let jobs = [(1, 1)];
        let log = [
            d(1, 1, 1, 10, Some(20), "retry"),
            d(1, 1, 3, 30, Some(40), "ack"),
        ];
        let report = run(Form::Lease, &jobs, &[], &log, &[], &[]);
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
        assert!(report.violations[0].contains("no fault in between"));
        let kill = [Fault {
            from_us: 25,
            to_us: 25,
            kind: FaultKind::Kill,
            spawn: Some(1),
        }];
        let report = run(Form::Lease, &jobs, &[], &log, &[], &kill);
        assert_eq!(report.violations, Vec::<String>::new());
        assert_eq!(report.spent, 1);
        let log = [
            d(1, 1, 2, 10, Some(20), "retry"),
            d(1, 1, 2, 30, Some(40), "ack"),
        ];
        let report = run(Form::Lease, &jobs, &[], &log, &[], &kill);
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("attempt 2 started after attempt 2"))
        );
    }

    #[test]
    fn ends_must_match_the_last_outcome() {
        let jobs = [(1, 1), (2, 0), (3, 1), (4, 0)];
        let log = [
            d(1, 1, 1, 10, Some(20), "retry"),
            d(1, 2, 1, 10, Some(20), "ack"),
            d(1, 3, 1, 10, Some(20), "retry"),
            d(1, 3, 2, 30, Some(40), "retry"),
            d(1, 3, 3, 50, Some(60), "retry"),
        ];
        let remaining = [
            RowState {
                id: 2,
                attempt: 1,
                failed: true,
                error: Some(format!("{REJECT_PREFIX} job 2")),
            },
            RowState {
                id: 3,
                attempt: 3,
                failed: true,
                error: None,
            },
            RowState {
                id: 4,
                attempt: 0,
                failed: false,
                error: None,
            },
        ];
        let report = run(Form::RowLock, &jobs, &remaining, &log, &[], &[]);
        let v = &report.violations;
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(v[0].starts_with("job 1: deleted, but its last delivery was not acknowledged"));
        assert!(v[1].starts_with("job 2: failed with a rejection, but"));
        assert!(v[2].starts_with("job 4: still queued"));
        assert_eq!(report.exhausted, 1);
    }

    #[test]
    fn a_retry_must_wait_its_delay_unless_a_fault_hit_the_retrying_process() {
        let jobs = [(1, 1)];
        let delay = 100_000;
        // Attempt 2 starts 40 ms after attempt 1 retried (a process whose clock is behind
        // wrote the due time in the past).
        let soon = [
            d(1, 1, 1, 0, Some(50_000), "retry"),
            d(2, 1, 2, 90_000, Some(150_000), "ack"),
        ];
        for form in Form::ALL {
            let report = run_with_delay(form, &jobs, &[], &soon, &[], &[], delay);
            assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
            assert!(
                report.violations[0].contains("before the retry delay of 100 ms"),
                "{:?}",
                report.violations
            );
        }
        // No delay to wait (retry_storm): nothing to check.
        let report = run_with_delay(Form::Lease, &jobs, &[], &soon, &[], &[], 0);
        assert_eq!(report.violations, Vec::<String>::new());
        // Waited the delay, less the slack.
        let waited = [
            d(1, 1, 1, 0, Some(50_000), "retry"),
            d(2, 1, 2, 150_000 - RETRY_SLACK_US, Some(200_000), "ack"),
        ];
        let report = run_with_delay(Form::RowLock, &jobs, &[], &waited, &[], &[], delay);
        assert_eq!(report.violations, Vec::<String>::new());
        // The retrying process's session killed, or the process gone, in between.
        let cut = Fault {
            from_us: 60_000,
            to_us: 61_000,
            kind: FaultKind::SessionKill,
            spawn: Some(1),
        };
        let report = run_with_delay(Form::RowLock, &jobs, &[], &soon, &[], &[cut], delay);
        assert_eq!(report.violations, Vec::<String>::new());
        let report = run_with_delay(Form::RowLock, &jobs, &[], &soon, &[(1, 60_000)], &[], delay);
        assert_eq!(report.violations, Vec::<String>::new());
        // Another process's session explains nothing.
        let other = Fault {
            spawn: Some(2),
            ..cut
        };
        let report = run_with_delay(Form::RowLock, &jobs, &[], &soon, &[], &[other], delay);
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
        // The lease form: a start a lease after the first's (the lease ran out first).
        let late = [
            d(1, 1, 1, 0, Some(1_960_000), "retry"),
            d(2, 1, 2, 2_000_000, Some(2_100_000), "ack"),
        ];
        let report = run_with_delay(Form::Lease, &jobs, &[], &late, &[], &[], delay);
        assert_eq!(report.violations, Vec::<String>::new());
        let report = run_with_delay(Form::RowLock, &jobs, &[], &late, &[], &[], delay);
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
    }
    #[test]
    fn a_retry_waits_in_its_own_process_where_the_table_has_nowhere_to_write_it() {
        let jobs = [(1, 1)];
        let ended = HashMap::new();
        // Another process takes the row 10 ms after the first retried it; the first itself
        // takes it again after the delay.
        let log = [
            d(1, 1, 1, 0, Some(50_000), "retry"),
            d(2, 1, 2, 60_000, Some(70_000), "retry"),
            d(1, 1, 3, 160_000, Some(170_000), "ack"),
        ];
        let input = |waits_in_process| Input {
            jobs: &jobs,
            remaining: &[],
            log: &log,
            ended: &ended,
            faults: &[],
            form: Form::RowLock,
            max_attempts: i64::MAX,
            lease_us: 2_000_000,
            start_us: 0,
            retry_delay_us: 100_000,
            waits_in_process,
            poison: None,
        };
        assert_eq!(check(&input(true)).violations, Vec::<String>::new());
        assert_eq!(check(&input(false)).violations.len(), 2);
        // The retrying process itself too soon.
        let soon = [
            d(1, 1, 1, 0, Some(50_000), "retry"),
            d(1, 1, 2, 60_000, Some(70_000), "ack"),
        ];
        let report = check(&Input {
            log: &soon,
            ..input(true)
        });
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
    }

    #[test]
    fn a_poison_row_is_never_handed_stays_and_is_taken_within_its_bound() {
        let jobs = [(1, 1), (7, 1), (107, 0)];
        let ids: HashSet<i64> = [7, 107].into();
        let ended = HashMap::new();
        let row = |id, attempt| RowState {
            id,
            attempt,
            failed: false,
            error: None,
        };
        let log = [d(1, 1, 1, 0, Some(10), "ack")];
        let run_at = |remaining: &[RowState], log: &[Delivery], at_stop: &HashMap<i64, i64>| {
            check(&Input {
                jobs: &jobs,
                remaining,
                log,
                ended: &ended,
                faults: &[],
                form: Form::Advisory,
                max_attempts: i64::MAX,
                lease_us: 2_000_000,
                start_us: 0,
                retry_delay_us: 0,
                waits_in_process: true,
                poison: Some(Poison {
                    ids: &ids,
                    most_takes: 10,
                    at_stop,
                    in_flight: 2,
                }),
            })
        };
        let none = HashMap::new();
        let run = |remaining: &[RowState], log: &[Delivery]| run_at(remaining, log, &none);
        let report = run(&[row(7, 4), row(107, 10)], &log);
        assert_eq!(report.violations, Vec::<String>::new());
        assert_eq!(report.poison, Some((2, 10)));
        // Spinning, never retried, gone, handed.
        let report = run(&[row(7, 11), row(107, 1)], &log);
        assert_eq!(report.violations.len(), 2, "{:?}", report.violations);
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("more than the 10"))
        );
        assert!(report.violations.iter().any(|v| v.contains("never again")));
        // Up to one take a process after the stop signal; more is a spin.
        let at_stop = HashMap::from([(7, 4), (107, 9)]);
        let report = run_at(&[row(7, 6), row(107, 12)], &log, &at_stop);
        assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
        assert!(
            report.violations[0].contains("job 107")
                && report.violations[0].contains("after the stop")
        );
        let handed = [log[0].clone(), d(1, 7, 1, 20, Some(25), "ack")];
        let report = run(&[row(107, 3)], &handed);
        assert_eq!(report.violations.len(), 2, "{:?}", report.violations);
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("reached the handler"))
        );
        assert!(report.violations.iter().any(|v| v.contains("is gone")));
    }
}

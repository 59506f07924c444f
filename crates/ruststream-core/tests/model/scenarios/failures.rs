//! Failed rows, delayed retries and attempt budgets, in every form: a rejection marks the row
//! failed with its error and no claim takes it again; a retry waits its delay; a take past the
//! budget fails the row without a handler, crashes counted; failed rows are redriven or
//! deleted by hand.

use super::*;
use ruststream_core::{FailedRowsOf, Settlement};

const ERROR: &str = "the payment service answered 503";

/// Every form with the dialects it runs on.
fn cases() -> Vec<(Form, Dialect)> {
    let mut out: Vec<(Form, Dialect)> = SERVERS.iter().map(|&d| (Form::RowLock, d)).collect();
    out.extend(ALL.iter().map(|&d| (Form::Lease, d)));
    out.extend(ALL.iter().map(|&d| (Form::Advisory, d)));
    out
}

impl Sim {
    pub(super) fn settle_with(&mut self, p: usize, delivery: DeliveryId, settlement: Settlement) {
        let now = self.local(p);
        self.procs[p].broker.settle_with(delivery, settlement, now);
        self.poll(p);
    }

    fn failed_events(&self, p: usize, since: usize) -> Vec<(i64, Option<String>, bool)> {
        self.events(p, since)
            .into_iter()
            .filter_map(|e| match e {
                Event::Failed {
                    id, error, kept, ..
                } => Some((id.as_int()?, error.map(|e| e.to_string()), kept)),
                _ => None,
            })
            .collect()
    }
}

/// A rejection keeps the row, marked failed at the settlement's time with its error; the
/// settlement and the failure are reported; no claim takes the row again, however long.
#[test]
fn a_rejected_row_stays_marked_failed_with_its_error_and_is_never_claimed_again() {
    for (form, dialect) in cases() {
        let mut sim = Sim::start(dialect, failing(form, true), 1, &[0, 1]);
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        let at = sim.now;
        sim.settle_with(0, delivery, Settlement::new(Outcome::Reject).error(ERROR));
        sim.run();
        let row = sim.row(1);
        assert_eq!(row.failed_at, Some(at.micros()), "{form:?} {dialect:?}");
        assert_eq!(row.error.as_deref(), Some(ERROR), "{form:?} {dialect:?}");
        assert_eq!(
            row.locked_until, None,
            "{form:?} {dialect:?}: the lease is cleared"
        );
        let events = sim.events(0, mark);
        assert!(
            events.contains(&Event::Settled {
                delivery,
                outcome: Outcome::Reject
            }),
            "{form:?} {dialect:?}: {events:?}"
        );
        assert_eq!(
            sim.failed_events(0, mark),
            [(1, Some(ERROR.to_owned()), true)],
            "{form:?} {dialect:?}"
        );
        let fails = sim.runs_of(
            0,
            mark,
            StatementKind::Fail {
                fenced: form == Form::Lease,
            },
        );
        assert_eq!(fails.len(), 1, "{form:?} {dialect:?}");
        // Row 2 is taken and acknowledged; row 1 never comes back.
        sim.advance(Duration::from_secs(1));
        let two = sim.delivery(0, 2);
        sim.settle(0, two, Outcome::Ack);
        sim.run();
        sim.advance(LEASE_TIME * 4);
        assert_eq!(sim.delivered_rows(0, mark), [2], "{form:?} {dialect:?}");
        assert!(sim.db.rows.contains_key(&1), "{form:?} {dialect:?}");
        assert!(sim.db.violations.is_empty());
    }
}

/// A table that keeps no failed rows returns a rejected row to the queue, as a retry, and
/// reports the failure as not kept: no row leaves the table but by an acknowledgement.
#[test]
fn a_rejection_on_a_table_without_failed_at_returns_the_row() {
    for (form, dialect) in cases() {
        let mut desc = failing(form, false);
        desc.failed_at = None;
        let mut sim = Sim::start(dialect, desc, 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        sim.settle_with(0, delivery, Settlement::new(Outcome::Reject).error(ERROR));
        sim.run();
        sim.advance(LEASE_TIME * 2);
        assert!(sim.db.rows.contains_key(&1), "{form:?} {dialect:?}");
        assert_eq!(
            sim.failed_events(0, mark),
            [(1, Some(ERROR.to_owned()), false)],
            "{form:?} {dialect:?}"
        );
        assert_eq!(
            sim.delivered_rows(0, mark),
            [1],
            "{form:?} {dialect:?}: taken again"
        );
        assert_eq!(
            sim.row(1).error.as_deref(),
            Some(ERROR),
            "{form:?} {dialect:?}"
        );
    }
}

/// A retry with a delay writes when the row is due again (the due column, or in the lease
/// form without one the lease's expiry): no claim takes it before, one takes it after.
#[test]
fn a_delayed_retry_is_not_claimed_before_its_time() {
    let mut cases: Vec<(Form, Dialect, bool)> =
        cases().into_iter().map(|(f, d)| (f, d, true)).collect();
    cases.extend(ALL.iter().map(|&d| (Form::Lease, d, false)));
    for (form, dialect, due) in cases {
        let mut sim = Sim::start(dialect, failing(form, due), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        let at = sim.now;
        let delay = Duration::from_secs(90);
        sim.settle_with(
            0,
            delivery,
            Settlement::new(Outcome::Retry).delay(delay).error(ERROR),
        );
        sim.run();
        let kind = StatementKind::RetryLater {
            fenced: form == Form::Lease,
        };
        let retry = only(sim.runs_of(0, mark, kind));
        assert_eq!(
            retry.bind(Arg::RetryIn),
            Value::Int(i64::try_from(delay.as_micros()).expect("fits")),
            "{form:?} {dialect:?}: the delay, from the database's time"
        );
        // Due again the delay after the database's time of the statement.
        let row = sim.row(1);
        let written = if due {
            row.due
        } else {
            row.locked_until.unwrap_or_default()
        };
        assert_eq!(written, at.plus(delay).micros(), "{form:?} {dialect:?}");
        assert_eq!(
            sim.row(1).error.as_deref(),
            Some(ERROR),
            "{form:?} {dialect:?}"
        );
        sim.advance(Duration::from_secs(89));
        assert!(
            sim.delivered_rows(0, mark).is_empty(),
            "{form:?} {dialect:?}: taken before its delay"
        );
        sim.advance(Duration::from_secs(3));
        assert_eq!(sim.delivered_rows(0, mark), [1], "{form:?} {dialect:?}");
        let taken_at = sim.delivered_at(0, mark, 1).expect("delivered");
        assert!(taken_at >= at.plus(delay), "{form:?} {dialect:?}");
        assert_eq!(sim.row(1).attempt, 2, "{form:?} {dialect:?}");
    }
}

/// A retry without a delay or an error writes nothing: the row lock form commits the counted
/// attempt, the advisory form releases the key, the lease form releases the lease.
#[test]
fn a_retry_at_once_writes_no_due_time() {
    for (form, dialect) in cases() {
        let mut sim = Sim::start(dialect, failing(form, true), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Retry);
        sim.run();
        for fenced in [false, true] {
            let kind = StatementKind::RetryLater { fenced };
            assert!(
                sim.runs_of(0, mark, kind).is_empty(),
                "{form:?} {dialect:?}"
            );
        }
        assert_eq!(sim.delivered_rows(0, mark), [1], "{form:?} {dialect:?}");
    }
}

/// The last attempt `max_attempts` allows fails its row at once when its handler retries,
/// with the handler's own error, rather than waiting its backoff to fail at the next take;
/// the claims go on with the next row.
#[test]
fn the_last_attempt_fails_the_row_at_once_with_the_handlers_error() {
    for (form, dialect) in cases() {
        let mut sim = Sim::new(dialect, failing(form, false), 1);
        sim.max_attempts = Some(2);
        sim.insert(0);
        sim.insert(1);
        sim.spawn();
        sim.run();
        for attempt in 1..=2 {
            let delivery = sim.delivery(0, 1);
            assert_eq!(sim.row(1).attempt, attempt, "{form:?} {dialect:?}");
            let retry = Settlement::new(Outcome::Retry)
                .delay(Duration::from_secs(3600))
                .error(format!("smtp timeout {attempt}"));
            sim.settle_with(0, delivery, retry);
            sim.run();
            if attempt == 1 {
                // The next row goes on while the retried one waits its delay.
                let next = sim.delivery(0, 2);
                sim.settle(0, next, Outcome::Ack);
                sim.run();
                sim.advance(Duration::from_secs(3601));
            }
        }
        let row = sim.row(1);
        assert!(
            row.failed_at.is_some(),
            "{form:?} {dialect:?}: failed at once, not after its hour: {row:?}"
        );
        assert_eq!(row.attempt, 2, "{form:?} {dialect:?}");
        assert_eq!(
            row.error.as_deref(),
            Some("smtp timeout 2"),
            "{form:?} {dialect:?}"
        );
        let failed = sim.failed_events(0, 0);
        assert_eq!(
            failed,
            [(1, Some("smtp timeout 2".to_owned()), true)],
            "{form:?} {dialect:?}"
        );
        let handed: Vec<i64> = sim.delivered_rows(0, 0);
        assert_eq!(
            handed.iter().filter(|&&r| r == 1).count(),
            2,
            "{form:?} {dialect:?}: handed twice, never a third time"
        );
        assert!(
            handed.contains(&2),
            "{form:?} {dialect:?}: the next row is taken"
        );
    }
}

/// Attempts spent by crashes count: a row whose handler kills its process is taken by each
/// process that starts after, until a take past the budget fails it without a handler.
#[test]
fn a_row_that_crashes_every_process_ends_failed_after_the_budget() {
    for (form, dialect) in cases() {
        if dialect == Dialect::Sqlite && form == Form::Advisory {
            // SQLite's registry lives in the process: covered by the lease form on SQLite.
            continue;
        }
        let mut sim = Sim::new(dialect, failing(form, false), 1);
        sim.max_attempts = Some(3);
        sim.insert(0);
        for crash in 0..3 {
            let p = sim.spawn();
            sim.run();
            sim.advance(LEASE_TIME * 2);
            assert_eq!(
                sim.delivered_rows(p, 0),
                [1],
                "{form:?} {dialect:?}: process {crash} takes the row"
            );
            sim.crash(p);
        }
        let p = sim.spawn();
        sim.run();
        sim.advance(LEASE_TIME * 2);
        assert!(sim.delivered_rows(p, 0).is_empty(), "{form:?} {dialect:?}");
        let row = sim.row(1);
        assert!(row.failed_at.is_some(), "{form:?} {dialect:?}: {row:?}");
        assert_eq!(row.attempt, 4, "{form:?} {dialect:?}");
        let failed = sim.failed_events(p, 0);
        let error = failed[0].1.as_deref().expect("the report says why");
        assert!(
            error.contains("attempt 4 is past max_attempts (3)"),
            "{form:?} {dialect:?}: {error}"
        );
    }
}

/// `max_attempts` needs the attempt and `failed_at` columns; the refusal names the missing
/// one.
#[test]
fn max_attempts_without_its_columns_is_refused_naming_the_column() {
    let mut no_failed = failing(Form::Lease, true);
    no_failed.failed_at = None;
    let mut no_attempt = failing(Form::Lease, true);
    no_attempt.attempt = None;
    for (desc, role) in [(no_failed, "failed_at"), (no_attempt, "attempt")] {
        let mut broker = Broker::<i64>::new(Dialect::Postgres);
        let options = SubscribeOptions {
            max_attempts: Some(3),
            ..SubscribeOptions::default()
        };
        let refused = broker.subscribe(desc, options, T0).expect_err("refused");
        let BrokerError::Desc(DescError::NeedsColumn {
            table, role: found, ..
        }) = &refused
        else {
            panic!("{refused:?}");
        };
        assert_eq!((*table, *found), ("jobs", role));
        let message = refused.to_string();
        assert!(message.contains("max_attempts"), "{message}");
        assert!(
            message.contains(&format!("needs the table's {role} column"))
                && message.ends_with(&format!("(`#[field({role})]`)")),
            "{message}"
        );
    }
}

/// Failed rows return to the queue by hand, all of them, by id or by their error, with their
/// attempts counted from zero; or they are deleted. A table without `failed_at` refuses both.
#[test]
fn failed_rows_are_redriven_or_deleted_through_the_broker() {
    for (form, dialect) in cases() {
        let mut sim = Sim::start(dialect, failing(form, true), 1, &[0, 1, 2]);
        for row in 1..=3 {
            let delivery = sim.delivery(0, row);
            sim.settle_with(0, delivery, Settlement::new(Outcome::Reject).error(ERROR));
            sim.run();
            sim.advance(Duration::from_secs(1));
        }
        assert!(sim.db.rows.values().all(|r| r.failed_at.is_some()));
        let mark = sim.mark();
        let publisher = sim.procs[0].publisher;
        let now = sim.now;
        sim.procs[0]
            .broker
            .redrive(publisher, FailedRowsOf::All, now)
            .expect("a redrive");
        sim.poll(0);
        sim.run();
        let changed: Vec<Event<i64>> = sim
            .events(0, mark)
            .into_iter()
            .filter(|e| matches!(e, Event::Changed { .. }))
            .collect();
        assert!(
            matches!(changed.as_slice(), [Event::Changed { result: Ok(3), .. }]),
            "{form:?} {dialect:?}: {changed:?}"
        );
        let redrive = only(sim.runs_of(
            0,
            mark,
            StatementKind::Redrive(ruststream_core::FailedRows::All),
        ));
        assert_eq!(redrive.reply, Reply::Affected(3));
        sim.advance(Duration::from_secs(2));
        let again = sim.delivered_rows(0, mark);
        assert_eq!(again.first(), Some(&1), "{form:?} {dialect:?}: {again:?}");
        assert_eq!(
            sim.row(1).attempt,
            1,
            "{form:?} {dialect:?}: counted from zero"
        );
        // Fail it again, then delete it.
        let delivery = sim.delivery(0, 1);
        sim.settle(0, delivery, Outcome::Reject);
        sim.run();
        let mark = sim.mark();
        sim.procs[0]
            .broker
            .delete_failed(publisher, FailedRowsOf::Ids(vec![Value::Int(1)]), sim.now)
            .expect("a deletion");
        sim.poll(0);
        sim.run();
        assert!(!sim.db.rows.contains_key(&1), "{form:?} {dialect:?}");
        assert!(
            sim.events(0, mark)
                .iter()
                .any(|e| matches!(e, Event::Changed { result: Ok(1), .. })),
            "{form:?} {dialect:?}"
        );
    }
    let mut broker = Broker::<i64>::new(Dialect::Postgres);
    let publisher = broker.publisher(row_lock()).expect("a publisher");
    let refused = broker
        .redrive(publisher, FailedRowsOf::All, T0)
        .expect_err("refused");
    assert!(refused.to_string().contains("failed_at"), "{refused}");
}

/// An error text longer than [`ruststream_core::MAX_ERROR_LEN`] is cut on a character
/// boundary before it is written; a delay past [`ruststream_core::MAX_RETRY_DELAY`] is cut
/// to it.
#[test]
fn long_errors_and_delays_are_cut() {
    for (form, dialect) in [
        (Form::Lease, Dialect::Postgres),
        (Form::RowLock, Dialect::MySql),
    ] {
        let mut sim = Sim::start(dialect, failing(form, true), 1, &[0, 1]);
        let long = "é".repeat(5_000);
        let delivery = sim.delivery(0, 1);
        sim.settle_with(0, delivery, Settlement::new(Outcome::Reject).error(long));
        sim.run();
        let error = sim.row(1).error.clone().expect("an error");
        assert!(
            error.len() <= ruststream_core::MAX_ERROR_LEN,
            "{}",
            error.len()
        );
        assert!(error.ends_with('…') && error.starts_with("éé"));
        let mark = sim.mark();
        let delivery = sim.delivery(0, 2);
        let at = sim.now;
        sim.settle_with(
            0,
            delivery,
            Settlement::new(Outcome::Retry).delay(Duration::MAX),
        );
        sim.run();
        let kind = StatementKind::RetryLater {
            fenced: form == Form::Lease,
        };
        let retry = only(sim.runs_of(0, mark, kind));
        let _ = at;
        assert_eq!(
            retry.bind(Arg::RetryIn),
            Value::Int(i64::try_from(ruststream_core::MAX_RETRY_DELAY.as_micros()).expect("fits"))
        );
    }
}

/// A failure on a table with nowhere to write its delay (no due and no lease column) waits
/// its delay in the process: the claims pass over the row until then, so it is not taken
/// again sooner, while the row behind it (of the same key, in the advisory form) goes on.
#[test]
fn a_failure_with_nowhere_to_wait_waits_its_delay_while_the_rows_behind_go_on() {
    for (form, dialect) in [
        (Form::RowLock, Dialect::Postgres),
        (Form::RowLock, Dialect::MySql),
        (Form::Advisory, Dialect::MariaDb),
        (Form::Advisory, Dialect::Postgres),
        (Form::Advisory, Dialect::Sqlite),
    ] {
        for outcome in [Outcome::Reject, Outcome::Retry] {
            let mut desc = failing(form, false);
            desc.failed_at = None;
            let cx = format!("{form:?} {dialect:?} {outcome:?}");
            // Two rows of one key: the second waits behind the first in the advisory form.
            let mut sim = Sim::start(dialect, desc, 1, &[0, 0]);
            let delivery = sim.delivery(0, 1);
            let mark = sim.mark();
            let at = sim.now;
            let delay = Duration::from_secs(30);
            sim.settle_with(0, delivery, Settlement::new(outcome).delay(delay));
            sim.run();
            let sub = sim.procs[0].sub;
            assert_eq!(sim.procs[0].broker.waiting(sub), 1, "{cx}: the row waits");
            assert_eq!(
                sim.delivered_rows(0, mark),
                [2],
                "{cx}: the row behind goes on"
            );
            let second = sim.delivery(0, 2);
            sim.settle(0, second, Outcome::Ack);
            sim.run();
            sim.advance(delay - Duration::from_millis(10));
            assert_eq!(
                sim.delivered_rows(0, mark),
                [2],
                "{cx}: not taken again before its delay"
            );
            sim.advance(POLL);
            assert_eq!(sim.delivered_rows(0, mark), [2, 1], "{cx}");
            let again = sim.delivered_at(0, mark, 1).expect("taken again");
            assert!(again >= at.plus(delay), "{cx}: after its delay");
            assert_eq!(sim.procs[0].broker.waiting(sub), 0, "{cx}");
        }
    }
}

/// A claim that read a row before its retry began to wait here passes over it. Here one
/// claim reads two rows and waits on the first one's key, held elsewhere, while a claim
/// beside it takes the second, whose handler retries it; the first claim then comes to the
/// row, and does not take it again before its delay.
#[test]
fn a_claim_that_read_a_row_before_its_retry_passes_over_it() {
    for dialect in SERVERS {
        let mut desc = failing(Form::Advisory, false);
        desc.failed_at = None;
        let cx = format!("{dialect:?}");
        let mut sim = Sim::start(dialect, desc, 2, &[2]);
        let first = sim.delivery(0, 1);
        sim.hold_elsewhere("jobs-3");
        let elsewhere = sim.insert(3);
        let row = sim.insert(0);
        // The next claim's first lock waits.
        let held = std::rc::Rc::new(std::cell::Cell::new(false));
        let h = held.clone();
        sim.hook(move |_, c| match &c.action {
            Action::Execute { statement, .. }
                if statement.kind == StatementKind::TryLock && !h.get() =>
            {
                h.set(true);
                Intercept::Hold
            }
            _ => Intercept::Run,
        });
        let mark = sim.mark();
        sim.advance(POLL);
        let waits = sim.take_held(0);
        assert_eq!(
            waits.len(),
            1,
            "{cx}: a claim waits on the lock of row {elsewhere}'s key"
        );
        // A worker frees: a claim beside it takes the row, and its handler retries it.
        sim.settle(0, first, Outcome::Ack);
        sim.run();
        assert_eq!(sim.delivered_rows(0, mark), [row], "{cx}");
        let retried = sim.delivery(0, row);
        let delay = Duration::from_secs(30);
        sim.settle_with(0, retried, Settlement::new(Outcome::Retry).delay(delay));
        sim.run();
        // The first claim's lock answers (held elsewhere): it comes to the row.
        for command in waits {
            sim.run_command(0, command);
        }
        sim.run();
        assert_eq!(
            sim.delivered_rows(0, mark),
            [row],
            "{cx}: the row is not taken again before its delay"
        );
        sim.advance(delay + POLL);
        assert_eq!(
            sim.delivered_rows(0, mark),
            [row, row],
            "{cx}: after its delay"
        );
    }
}

/// A row whose key column is `NULL` has no key to hold it in order: the advisory claim takes
/// it (counting the attempt) and fails it without running the handler, with an error naming
/// the table, the row and the key's column; the rows beside it are served. Where the table
/// keeps no failed rows, the row stays, due again after a poll interval, and is never handed.
#[test]
fn a_row_whose_key_column_is_null_fails_naming_the_column_and_the_others_go_on() {
    for dialect in ALL {
        for keeps_failed in [true, false] {
            let mut desc = failing(Form::Advisory, true);
            if !keeps_failed {
                desc.failed_at = None;
            }
            let mut sim = Sim::new(dialect, desc, 2);
            let broken = sim.insert(NULL_CHANNEL);
            let fine = sim.insert(1);
            let p = sim.spawn();
            sim.run();
            let cx = format!("{dialect:?}, keeps failed rows: {keeps_failed}");
            let handed: Vec<Option<i64>> = sim.delivered(p, 0).iter().map(|d| d.row).collect();
            assert_eq!(
                handed,
                [Some(fine)],
                "{cx}: only the row with a key is handed"
            );
            let failed = sim.failed_events(p, 0);
            let (id, error, kept) = failed.first().cloned().unwrap_or_else(|| panic!("{cx}"));
            assert_eq!((id, kept), (broken, keeps_failed), "{cx}");
            let error = error.unwrap_or_default();
            assert!(
                error.contains("table `jobs`")
                    && error.contains(&format!("row {broken}"))
                    && error.contains("`channel`")
                    && error.contains("NULL"),
                "{cx}: {error}"
            );
            let row = &sim.db.rows[&broken];
            assert_eq!(row.attempt, 1, "{cx}: its take counted the attempt");
            assert_eq!(row.failed_at.is_some(), keeps_failed, "{cx}");
            if !keeps_failed {
                assert!(row.due > sim.now.micros(), "{cx}: due again after a poll");
            }
            if dialect != Dialect::Sqlite {
                assert_eq!(sim.db.advisory.len(), 1, "{cx}: the handed row's lock only");
            }
        }
    }
}

/// On a table with nowhere to write a retry's delay, a count sent while the leader of the
/// count before it still held its row back (its marks not yet released) may run after that
/// row's retry let it go: it must pass over the row, which waits its delay here, and not
/// count it again at once.
#[test]
fn a_count_sent_before_a_retry_passes_over_the_row_its_process_counted() {
    let mut desc = failing(Form::RowLock, false);
    desc.failed_at = None;
    let mut sim = Sim::new(Dialect::Postgres, desc, 3);
    for _ in 0..4 {
        sim.insert(0);
    }
    // Row 2's lock waits, so the claims that free meanwhile are counted together; that
    // count's leader keeps its marks, and the count after it waits, until the test says.
    let (mut locks, mut unmarks, mut counts) = (0, 0, 0);
    sim.hook(move |_, c| {
        let nth = |n: &mut i32| {
            *n += 1;
            *n
        };
        match kind_of(c) {
            Some(StatementKind::LockRowByIdUnmarking) if nth(&mut locks) == 2 => Intercept::Hold,
            Some(StatementKind::UnmarkRows(_)) if nth(&mut unmarks) == 1 => Intercept::Hold,
            Some(StatementKind::CountRow) if nth(&mut counts) == 4 => Intercept::Hold,
            _ => Intercept::Run,
        }
    });
    let retry = || Settlement::new(Outcome::Retry).delay(Duration::from_secs(30));
    let p = sim.spawn();
    sim.run();
    // Row 1 retries while row 2's lock waits: two claims wait for the next count.
    let first = sim.delivery(p, 1);
    sim.settle_with(p, first, retry());
    sim.run();
    let lock = sim.take_held(p);
    assert_eq!(lock.len(), 1, "row 2's lock waits");
    for command in lock {
        sim.run_command(p, command);
    }
    sim.run();
    let unmark = sim.take_held(p);
    let kinds: Vec<_> = unmark.iter().map(kind_of).collect();
    assert_eq!(
        kinds,
        [Some(StatementKind::UnmarkRows(2))],
        "the leader keeps two marks"
    );
    // Row 2 acknowledges: its worker's claim sends a count while the leader's row waits.
    let second = sim.delivery(p, 2);
    sim.settle(p, second, Outcome::Ack);
    sim.run();
    let count = sim.take_held(p);
    assert_eq!(count.len(), 1, "the next count waits");
    // The marks go: the leader's row goes to its handler, which retries it.
    for command in unmark {
        sim.run_command(p, command);
    }
    sim.run();
    let leader = *sim
        .delivered_rows(p, 0)
        .last()
        .expect("the leader's row in work");
    let delivery = sim.delivery(p, leader);
    sim.settle_with(p, delivery, retry());
    sim.run();
    let mark = sim.mark();
    let before = sim.row(leader).attempt;
    // The count sent before that retry runs now: it passes over the rows that wait.
    for command in count {
        sim.run_command(p, command);
    }
    sim.run();
    assert!(
        !sim.delivered_rows(p, mark).contains(&leader),
        "row {leader} is not taken again at once"
    );
    assert_eq!(sim.row(leader).attempt, before, "no attempt spent");
}

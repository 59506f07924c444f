//! The lease form: a claim writes `locked_until` and counts the attempt; the lease is extended
//! while in work, and a settlement fenced by it fails once another claim took the row.

use super::*;

/// "an expiry written into the row": the claim writes `locked_until` and counts the attempt,
/// and holds no connection while the message is in work.
#[test]
fn lease_claim_writes_locked_until_and_counts_the_attempt() {
    for dialect in ALL {
        let sim = Sim::start(dialect, lease(), 1, &[0]);
        let d = only(sim.delivered(0, 0));
        assert_eq!(d.row, Some(1));
        assert_eq!(d.attempt, Some(1), "{dialect:?}");
        let row = sim.row(1);
        assert_eq!(row.attempt, 1, "{dialect:?}");
        assert_eq!(row.locked_until, Some(T0.plus(LEASE_TIME).micros()));
        let claim = match dialect {
            Dialect::MySql | Dialect::MariaDb => vec![
                Acquire,
                Exec(StatementKind::Begin),
                Exec(StatementKind::SelectLease),
                Exec(StatementKind::MarkLease(1)),
                Exec(StatementKind::Commit),
                Release,
            ],
            _ => vec![Acquire, Exec(StatementKind::ClaimLease), Release],
        };
        let check_len = sim.ops(0, 0).len() - claim.len();
        assert_eq!(sim.ops(0, 0)[check_len..], claim, "{dialect:?}");
        assert_eq!(sim.procs[0].broker.held_connections(), 0, "{dialect:?}");
        assert!(sim.db.sessions.values().all(|s| !s.in_tx));
    }
}

/// "statements to claim, extend and settle": a lease in work is extended every
/// `extend_every`, and no longer once settled.
#[test]
fn lease_is_extended_every_extend_every_while_in_work() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[0]);
        sim.advance_to(just_before(T0.plus(EXTEND)));
        assert_eq!(sim.executed(StatementKind::ExtendLease), 0, "{dialect:?}");
        sim.advance_to(T0.plus(EXTEND));
        let extend = only(sim.runs_of(0, 0, StatementKind::ExtendLease));
        assert_eq!(extend.at, T0.plus(EXTEND), "{dialect:?}");
        assert_eq!(extend.bind(Arg::Id), Value::Int(1));
        assert_eq!(
            extend.bind(Arg::Fence),
            Value::Int(T0.plus(LEASE_TIME).micros()),
            "{dialect:?}: fenced by the lease it wrote"
        );
        // Moved by the time since the claim: a lease past the database's time.
        let until = T0.plus(EXTEND).plus(LEASE_TIME).micros();
        let by = i64::try_from(EXTEND.as_micros()).expect("fits");
        assert_eq!(extend.bind(Arg::Extend), Value::Int(by));
        assert_eq!(sim.row(1).locked_until, Some(until), "{dialect:?}");
        sim.advance_to(T0.plus(EXTEND * 2));
        assert_eq!(sim.executed(StatementKind::ExtendLease), 2, "{dialect:?}");
        let delivery = sim.delivery(0, 1);
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        sim.advance(Duration::from_secs(120));
        assert_eq!(sim.executed(StatementKind::ExtendLease), 2, "{dialect:?}");
        assert!(!sim.db.rows.contains_key(&1));
    }
}

/// A lease that ran out and that another claim took: the extension finds it gone and says
/// `LeaseLost`; a settlement afterwards fails with `LeaseLost` and runs no statement.
#[test]
fn lease_taken_by_another_claim_yields_lease_lost_and_settle_fails_without_touching_the_row() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        // The first process stalls past its lease.
        sim.procs[0].paused = true;
        sim.advance_to(T0.plus(LEASE_TIME + POLL));
        let second = sim.spawn();
        sim.run();
        let taken = only(sim.delivered(second, 0));
        assert_eq!(taken.row, Some(1), "{dialect:?}");
        assert_eq!(taken.attempt, Some(2));
        let theirs = sim.row(1).clone();
        // The first process wakes up and extends.
        sim.procs[0].paused = false;
        let mark = sim.mark();
        sim.fire(0);
        assert_eq!(
            sim.ops(0, mark),
            [Acquire, Exec(StatementKind::ExtendLease), Release],
            "{dialect:?}"
        );
        assert!(
            sim.events(0, mark).contains(&Event::LeaseLost { delivery }),
            "{dialect:?}: {:?}",
            sim.events(0, mark)
        );
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.events(0, mark),
            [Event::SettleFailed {
                delivery,
                error: SettleError::LeaseLost
            }],
            "{dialect:?}"
        );
        assert!(
            !sim.ops(0, mark).iter().any(touches_a_held_row),
            "{dialect:?}: no statement runs: {:?}",
            sim.ops(0, mark)
        );
        assert_eq!(sim.row(1), &theirs, "{dialect:?}: the row is untouched");
    }
}

/// A settlement fenced by a lease another claim took after it ran out takes no effect.
#[test]
fn lease_settle_after_the_lease_was_taken_fails_with_lease_lost() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        sim.procs[0].paused = true;
        sim.advance_to(T0.plus(LEASE_TIME));
        let second = sim.spawn();
        sim.run();
        assert_eq!(sim.delivered_rows(second, 0), [1], "{dialect:?}");
        let theirs = sim.row(1).clone();
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.first_flow_ops(0, mark)[..3],
            [Acquire, delete(true), Release],
            "{dialect:?}"
        );
        assert!(!sim.ops(0, mark)[3..].iter().any(touches_a_held_row));
        assert!(sim.events(0, mark).contains(&Event::SettleFailed {
            delivery,
            error: SettleError::LeaseLost
        }));
        assert_eq!(sim.row(1), &theirs, "{dialect:?}");
    }
}

/// "After a crash ... the row returns when the lease runs out": not a moment before.
#[test]
fn lease_crash_returns_the_row_only_when_the_lease_runs_out() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[0]);
        sim.crash(0);
        sim.advance_to(T0.plus(LEASE_TIME - POLL));
        let second = sim.spawn();
        sim.run();
        let claim = lease_claim_kind(dialect);
        let claims = sim.runs_of(second, 0, claim);
        assert_eq!(
            claims.len(),
            1,
            "{dialect:?}: a claim 1 s before the lease runs out"
        );
        assert!(
            claims[0].raw_rows().is_empty(),
            "{dialect:?}: takes nothing"
        );
        assert!(sim.delivered(second, 0).is_empty());
        sim.advance_to(T0.plus(LEASE_TIME));
        let d = only(sim.delivered(second, 0));
        assert_eq!(d.row, Some(1), "{dialect:?}: a claim after takes it");
        assert_eq!(d.attempt, Some(2), "{dialect:?}");
        assert_eq!(sim.delivered_at(second, 0, 1), Some(T0.plus(LEASE_TIME)));
    }
}

/// "... a delete or the processed_at mark": in the lease form, a fenced mark.
#[test]
fn lease_ack_marks_processed_at_instead_of_deleting() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease_marked(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        sim.advance(Duration::from_secs(2));
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.first_flow_ops(0, mark)[..3],
            [
                Acquire,
                Exec(StatementKind::MarkProcessed { fenced: true }),
                Release
            ],
            "{dialect:?}"
        );
        assert!(sim.events(0, mark).contains(&Event::Settled {
            delivery,
            outcome: Outcome::Ack
        }));
        let row = sim.row(1);
        assert_eq!(
            row.processed_at,
            Some(T0.plus(Duration::from_secs(2)).micros())
        );
        assert_eq!(row.locked_until, None, "{dialect:?}");
        sim.advance(Duration::from_secs(120));
        assert_eq!(
            sim.delivered_rows(0, 0),
            [1],
            "{dialect:?}: never claimed again"
        );
    }
}

/// `retry()` in the lease form gives the row back at once, its attempt counted.
#[test]
fn lease_retry_releases_the_lease_and_the_row_returns() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Retry);
        sim.run();
        assert_eq!(
            sim.first_flow_ops(0, mark)[..3],
            [Acquire, Exec(StatementKind::ReleaseLease), Release],
            "{dialect:?}"
        );
        assert!(sim.events(0, mark).contains(&Event::Settled {
            delivery,
            outcome: Outcome::Retry
        }));
        let again = only(sim.delivered(0, mark));
        assert_eq!(again.row, Some(1), "{dialect:?}");
        assert_eq!(again.attempt, Some(2));
    }
}

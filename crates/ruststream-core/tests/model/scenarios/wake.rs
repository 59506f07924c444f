//! `wake` and the claims of one subscription: advisory claims run side by side, lease claims
//! one at a time, and a lease worker takes its next row while its settlement runs.

use super::*;

/// `wake` makes a subscription claim now, before its poll interval.
#[test]
fn wake_claims_before_the_poll_interval() {
    for (dialect, desc) in [
        (Dialect::Postgres, row_lock()),
        (Dialect::MySql, row_lock()),
        (Dialect::Postgres, lease()),
        (Dialect::Sqlite, lease()),
        (Dialect::MariaDb, advisory()),
        (Dialect::Sqlite, advisory()),
        (Dialect::Postgres, custom()),
    ] {
        let mut sim = Sim::start(dialect, desc, 1, &[]);
        assert_eq!(sim.timeout(0), Some(T0.plus(POLL)), "{dialect:?}");
        sim.advance(Duration::from_millis(200));
        let mark = sim.mark();
        sim.insert(0);
        sim.advance(Duration::from_millis(300));
        assert!(
            sim.ops(0, mark).is_empty(),
            "{dialect:?}: no claim without a wake"
        );
        sim.wake(0);
        sim.run();
        assert_eq!(sim.delivered_rows(0, mark), [1], "{dialect:?}");
        assert_eq!(
            sim.delivered_at(0, mark, 1),
            Some(T0.plus(Duration::from_millis(500)))
        );
    }
}

/// A claim that found a key held passes over the later rows of that key in the same batch, so
/// a later row of the key never overtakes an earlier one when the key is released meanwhile.
#[test]
fn advisory_claim_keeps_claim_order_within_a_key() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, advisory(), 3);
        sim.insert(0);
        sim.insert(1);
        sim.insert(0);
        let other = sim.hold_elsewhere("jobs-0");
        let p = sim.spawn();
        let second = lock_arg(dialect, "jobs-1");
        sim.run_until(p, |c| {
            matches!(&c.action, Action::Execute { statement, binds }
                if statement.kind == StatementKind::TryLock && binds.first() == Some(&second))
        });
        // The other system lets go of jobs-0 after the claim found it held.
        sim.db.kill(other);
        sim.run();
        assert_eq!(
            sim.delivered_rows(p, 0),
            [2],
            "{dialect:?}: row 3 of jobs-0 overtook row 1, which the claim passed over"
        );
    }
}

/// The first statement of a claim of the form, per dialect: the one a test holds to keep the
/// claim in flight.
fn claim_kind(desc: &TableDesc, dialect: Dialect) -> StatementKind {
    match desc.form() {
        Form::Lease => lease_claim_kind(dialect),
        _ => StatementKind::Candidates,
    }
}

/// "Claims of several workers and processes never wait for each other": within one process,
/// an advisory claim on the database's locks starts while another claim of the subscription
/// is still in flight, as soon as a worker is free.
#[test]
fn advisory_claims_of_one_subscription_run_side_by_side() {
    let desc = advisory();
    for dialect in SERVERS {
        // Two workers, a backlog: the first claim takes two rows, both in work.
        let mut sim = Sim::start(dialect, desc, 2, &[0, 1, 2, 3, 4, 5]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{dialect:?}");
        hold_kind(&mut sim, claim_kind(&desc, dialect));
        // One settles: a claim starts for its slot, and hangs.
        let mark = sim.mark();
        let first = sim.delivery(0, 1);
        sim.settle(0, first, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.procs[0].held.len(),
            1,
            "{dialect:?}: one claim in flight"
        );
        // The other settles while that claim hangs: a second claim starts beside it.
        let second = sim.delivery(0, 2);
        sim.settle(0, second, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.procs[0].held.len(),
            2,
            "{dialect:?} {:?}: a second claim runs beside the first",
            desc.form()
        );
        // Both answer: each takes a row of its own, and no row twice.
        sim.hook = None;
        for command in sim.take_held(0) {
            sim.run_command(0, command);
        }
        sim.run();
        let rows = sim.delivered_rows(0, mark);
        assert_eq!(rows.len(), 2, "{dialect:?}: {rows:?}");
        assert_ne!(rows[0], rows[1], "{dialect:?}: one row, one delivery");
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
    }
}

/// A lease claim runs alone: a worker that frees while it runs waits for it, and the next
/// claim, at once after it, takes a row for every worker that freed meanwhile. No row is
/// delivered twice, and nothing waits for the poll.
#[test]
fn lease_claims_of_one_subscription_run_one_at_a_time() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, lease(), 2, &[0, 1, 2, 3, 4, 5]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{dialect:?}");
        let kind = lease_claim_kind(dialect);
        hold_kind(&mut sim, kind);
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        assert_eq!(sim.procs[0].held.len(), 1, "{dialect:?}: one claim");
        sim.settle(0, sim.delivery(0, 2), Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.procs[0].held.len(),
            1,
            "{dialect:?}: the second worker waits for the claim in flight"
        );
        let held_at = sim.now;
        sim.hook = None;
        for command in sim.take_held(0) {
            sim.run_command(0, command);
        }
        sim.run();
        assert_eq!(sim.delivered_rows(0, mark), [3, 4], "{dialect:?}");
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
        assert_eq!(sim.runs_of(0, mark, kind).len(), 2, "{dialect:?}");
        assert_eq!(
            sim.delivered_at(0, mark, 4),
            Some(held_at),
            "{dialect:?}: the next claim ran at once"
        );
    }
}

/// Holds the lease form's settlements (a fenced delete, alone or in a batch) unanswered.
fn hold_lease_settlements(sim: &mut Sim) {
    sim.hook(|_, c| match &c.action {
        Action::Execute { statement, .. }
            if matches!(
                statement.kind,
                StatementKind::Delete { .. } | StatementKind::SettleLeases(_)
            ) =>
        {
            Intercept::Hold
        }
        _ => Intercept::Run,
    });
}

/// On SQLite, which runs one statement at a time, a lease worker waits for its settlement: a
/// claim beside it would only wait for it, on a second connection.
#[test]
fn a_lease_worker_on_sqlite_waits_for_its_settlement() {
    let mut sim = Sim::start(Dialect::Sqlite, lease(), 1, &[0, 1, 2]);
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    hold_lease_settlements(&mut sim);
    let mark = sim.mark();
    sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
    sim.run();
    assert_eq!(
        count(&sim.ops(0, mark), &Acquire),
        1,
        "the settlement's connection alone: {:?}",
        sim.ops(0, mark)
    );
    assert!(sim.delivered_rows(0, mark).is_empty());
    sim.hook = None;
    for command in sim.take_held(0) {
        sim.run_command(0, command);
    }
    sim.run();
    assert_eq!(sim.delivered_rows(0, mark), [2]);
}

/// In the lease form a worker whose settlement runs takes its next row: the lease holds the
/// settled row until the statement answers. At most `workers` rows settle so beyond the rows
/// in work. (SQLite runs one statement at a time: there the claim waits for the settlement.)
#[test]
fn a_lease_worker_takes_its_next_row_while_its_settlement_runs() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, lease(), 1, &[0, 1, 2, 3]);
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
        hold_lease_settlements(&mut sim);
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.delivered_rows(0, mark),
            [2],
            "{dialect:?}: the next row while row 1 settles"
        );
        assert!(sim.db.rows.contains_key(&1), "{dialect:?}: row 1 not yet");
        sim.settle(0, sim.delivery(0, 2), Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.delivered_rows(0, mark),
            [2],
            "{dialect:?}: two rows settle and one worker: no third"
        );
        sim.hook = None;
        for command in sim.take_held(0) {
            sim.run_command(0, command);
        }
        sim.run();
        assert!(
            !sim.db.rows.contains_key(&1) && !sim.db.rows.contains_key(&2),
            "{dialect:?}: both settled"
        );
        assert_eq!(sim.delivered_rows(0, mark), [2, 3], "{dialect:?}");
    }
}

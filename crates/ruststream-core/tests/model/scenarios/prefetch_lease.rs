//! The lease form's rows claimed ahead (prefetch): they wait under their lease, extended, and go
//! to the next free worker; stopping gives them back.

use super::*;

fn start_prefetching(dialect: Dialect, workers: usize, prefetch: usize, channels: &[i64]) -> Sim {
    let mut sim = Sim::new(dialect, lease(), workers);
    sim.prefetch = prefetch;
    for &channel in channels {
        sim.insert(channel);
    }
    sim.spawn();
    sim.run();
    sim
}

/// A subscription claims up to `workers + prefetch` rows, hands `workers` of them to the
/// runtime, and hands the next one when a worker frees, without a claim.
#[test]
fn rows_claimed_ahead_wait_under_their_lease_and_go_to_the_next_free_worker() {
    for dialect in ALL {
        let mut sim = start_prefetching(dialect, 2, 2, &[0, 1, 2, 3, 4, 5]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{dialect:?}: two workers");
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
        let sub = sim.procs[0].sub;
        assert_eq!(sim.procs[0].broker.claimed_ahead(sub), 2, "{dialect:?}");
        for row in [3, 4] {
            assert_eq!(
                sim.row(row).locked_until,
                Some(T0.plus(LEASE_TIME).micros()),
                "{dialect:?}: row {row} is leased"
            );
        }
        assert_eq!(
            sim.row(5).locked_until,
            None,
            "{dialect:?}: four claimed in all"
        );
        let mark = sim.mark();
        hold_first_settlement(&mut sim);
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        // The worker is free once the handler has settled: row 3 goes to it at once, while
        // row 1's settlement has not even run, and without a claim.
        assert_eq!(
            sim.delivered_rows(0, mark),
            [3],
            "{dialect:?}: claimed ahead, in order"
        );
        assert!(sim.runs(0, mark).is_empty(), "{dialect:?}");
        sim.run();
        let held = sim.take_held(0);
        assert_eq!(held.len(), 1, "{dialect:?}: row 1's settlement");
        sim.hook(|_, _| Intercept::Run);
        for command in held {
            sim.run_command(0, command);
        }
        sim.run();
        assert!(!sim.db.rows.contains_key(&1), "{dialect:?}");
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
    }
}

/// A row claimed ahead is extended like a lease in work, so it is still held when handed.
#[test]
fn rows_claimed_ahead_are_extended_while_they_wait() {
    let mut sim = start_prefetching(Dialect::Postgres, 1, 1, &[0, 1]);
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    sim.advance_to(T0.plus(EXTEND));
    let extended: BTreeSet<Value> = sim
        .runs_of(0, 0, StatementKind::ExtendLease)
        .iter()
        .map(|r| r.bind(Arg::Id))
        .collect();
    assert_eq!(extended, BTreeSet::from([Value::Int(1), Value::Int(2)]));
    assert_eq!(
        sim.row(2).locked_until,
        Some(T0.plus(EXTEND).plus(LEASE_TIME).micros())
    );
}

/// A row claimed ahead whose lease another process took meanwhile is never handed, and the
/// runtime hears nothing of it.
#[test]
fn a_row_claimed_ahead_whose_lease_was_lost_is_never_handed() {
    let mut sim = start_prefetching(Dialect::Postgres, 1, 1, &[0, 1, 2]);
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    // Another process's lease on row 2.
    let theirs = T0.plus(LEASE_TIME * 9).micros();
    sim.db.rows.get_mut(&2).expect("row 2").locked_until = Some(theirs);
    let mark = sim.mark();
    sim.advance_to(T0.plus(EXTEND));
    assert!(
        !sim.events(0, mark)
            .iter()
            .any(|e| matches!(e, Event::LeaseLost { .. })),
        "{:?}",
        sim.events(0, mark)
    );
    sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
    sim.run();
    assert_ne!(
        sim.delivered_rows(0, mark).first(),
        Some(&2),
        "row 2 is not handed"
    );
    assert_eq!(sim.row(2).locked_until, Some(theirs), "row 2 is untouched");
}

/// When the subscription stops, the rows still waiting are given back at once (their
/// leases released), and no longer count as in work.
#[test]
fn stopping_gives_back_the_rows_claimed_ahead() {
    for dialect in ALL {
        let mut sim = start_prefetching(dialect, 1, 2, &[0, 1, 2]);
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
        let mark = sim.mark();
        let sub = sim.procs[0].sub;
        sim.procs[0].broker.stop(sub, sim.now);
        sim.poll(0);
        sim.run();
        assert_eq!(
            sim.runs_of(0, mark, StatementKind::ReleaseLease).len(),
            2,
            "{dialect:?}"
        );
        for row in [2, 3] {
            assert_eq!(
                sim.row(row).locked_until,
                None,
                "{dialect:?}: row {row} is back"
            );
        }
        assert_eq!(sim.procs[0].broker.claimed_ahead(sub), 0);
        assert_eq!(sim.in_work(0), 1, "{dialect:?}: the one in work goes on");
        assert!(
            !sim.events(0, mark)
                .iter()
                .any(|e| matches!(e, Event::Returned { .. } | Event::Delivered(_))),
            "{dialect:?}: {:?}",
            sim.events(0, mark)
        );
    }
}

/// At the shutdown, the rows claimed ahead are given back at once; the one in work keeps its
/// lease.
#[test]
fn the_shutdown_gives_back_the_rows_claimed_ahead() {
    let mut sim = start_prefetching(Dialect::Postgres, 1, 2, &[0, 1, 2]);
    let mark = sim.mark();
    sim.shutdown(0);
    sim.run();
    assert_eq!(sim.runs_of(0, mark, StatementKind::ReleaseLease).len(), 2);
    assert_eq!(sim.row(2).locked_until, None);
    assert_eq!(sim.row(3).locked_until, None);
    assert_eq!(sim.row(1).locked_until, Some(T0.plus(LEASE_TIME).micros()));
    assert_eq!(sim.closed(0).len(), 1);
}

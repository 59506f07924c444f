//! The lease form's claims, one at a time on a server: a claim due while handlers still run
//! waits for them, for at most half the last claim's time, so one claim takes the rows of
//! several workers rather than each claim the row of the worker that freed first.

use super::*;

/// Runs the claim that the inputs so far started with its statement held, and answers it
/// `took` later: the claim's time, which the next wait is half of.
fn slow_claim(sim: &mut Sim, took: Duration) {
    hold_kind(sim, StatementKind::ClaimLease);
    sim.run();
    let held = sim.take_held(0);
    assert_eq!(held.len(), 1, "one claim at a time");
    sim.hook = None;
    sim.now = sim.now.plus(took);
    for command in held {
        sim.run_command(0, command);
    }
    sim.run();
}

fn claims(sim: &Sim, since: usize) -> usize {
    sim.runs_of(0, since, StatementKind::ClaimLease).len()
}

/// No claim runs since `mark` until `wait` from now has nearly passed; one has by just after.
fn claim_runs_after(sim: &mut Sim, mark: usize, wait: Duration) {
    let from = sim.now;
    let margin = Duration::from_micros(100);
    sim.advance_to(from.plus(wait - margin));
    assert_eq!(claims(sim, mark), 0, "still waiting {:?} in", wait - margin);
    sim.advance_to(from.plus(wait + margin));
    assert_eq!(claims(sim, mark), 1, "the claim ran by {:?}", wait + margin);
}

fn settle_rows(sim: &mut Sim, rows: &[i64]) {
    for &row in rows {
        let d = sim.delivery(0, row);
        sim.settle(0, d, Outcome::Ack);
        sim.run();
    }
}

#[test]
fn a_lease_claim_waits_for_the_handlers_that_run_and_takes_their_rows_too() {
    let mut sim = Sim::start(Dialect::Postgres, lease(), 4, &[0; 16]);
    assert_eq!(sim.delivered_rows(0, 0), [1, 2, 3, 4]);
    // The four handlers end together: the claim takes a row for each, in 4 ms.
    for row in [1, 2, 3, 4] {
        let d = sim.delivery(0, row);
        sim.settle(0, d, Outcome::Ack);
    }
    let mark = sim.mark();
    slow_claim(&mut sim, Duration::from_millis(4));
    assert_eq!(sim.delivered_rows(0, mark), [5, 6, 7, 8]);

    // Three handlers end, one by one, while the fourth runs: the claim waits.
    let mark = sim.mark();
    settle_rows(&mut sim, &[5, 6, 7]);
    assert_eq!(
        claims(&sim, mark),
        0,
        "a handler still runs: the claim waits"
    );
    // The last ends: the claim runs at once, for all four.
    let d = sim.delivery(0, 8);
    sim.settle(0, d, Outcome::Ack);
    slow_claim(&mut sim, Duration::from_millis(3));
    assert_eq!(claims(&sim, mark), 1);
    assert_eq!(sim.delivered_rows(0, mark), [9, 10, 11, 12]);

    // One ends and no other: the claim waits half the last claim's 3 ms, then takes one row.
    let mark = sim.mark();
    settle_rows(&mut sim, &[9]);
    claim_runs_after(&mut sim, mark, Duration::from_micros(1_500));
    assert_eq!(sim.delivered_rows(0, mark), [13]);
}

/// However slow the last claim, a claim waits for the handlers 2 ms at most.
#[test]
fn a_lease_claim_waits_for_the_handlers_two_milliseconds_at_most() {
    let mut sim = Sim::start(Dialect::Postgres, lease(), 2, &[0; 6]);
    assert_eq!(sim.delivered_rows(0, 0), [1, 2]);
    for row in [1, 2] {
        let d = sim.delivery(0, row);
        sim.settle(0, d, Outcome::Ack);
    }
    let mark = sim.mark();
    slow_claim(&mut sim, Duration::from_millis(10));
    assert_eq!(sim.delivered_rows(0, mark), [3, 4]);
    let mark = sim.mark();
    settle_rows(&mut sim, &[3]);
    claim_runs_after(&mut sim, mark, Duration::from_millis(2));
    assert_eq!(sim.delivered_rows(0, mark), [5]);
}

//! One clock: the database's. Processes whose clocks are off the database's by more than a
//! lease, ahead or behind: none takes a row another holds, a lease runs its length by the
//! database's clock, and a retry waits its delay by it.

use super::*;
use ruststream_core::Settlement;

/// 45 s: more than the 30 s lease, as a VM after a suspend or a mis-set NTP leaves a clock.
const OFF: Duration = Duration::from_secs(45);

/// A lease table with `rows` rows, held by process 0 (in step with the database), and a
/// second process whose clock is `OFF` ahead (`ahead`) or behind, started 2 s later.
fn two_clocks(dialect: Dialect, rows: usize, ahead: bool) -> Sim {
    let channels: Vec<i64> = (0..rows as i64).collect();
    let mut sim = Sim::start(dialect, lease(), rows, &channels);
    assert_eq!(
        sim.delivered(0, 0).len(),
        rows,
        "{dialect:?}: process 0 holds every row"
    );
    sim.advance(Duration::from_secs(2));
    sim.spawn_skewed(OFF, ahead);
    sim.run();
    sim
}

/// The case: a process whose clock runs 45 s ahead starts beside one that holds every
/// row under a 30 s lease. It takes none of them while the first extends its leases, and none
/// is ever in work twice.
#[test]
fn a_process_whose_clock_runs_ahead_takes_no_row_another_holds() {
    for dialect in SERVERS {
        let mut sim = two_clocks(dialect, 4, true);
        let mark = sim.mark();
        // Well past the lease by the second process's clock, and past a lease's length by the
        // database's: process 0's extensions keep every row.
        sim.advance(LEASE_TIME + EXTEND);
        assert!(
            sim.delivered(1, 0).is_empty(),
            "{dialect:?}: the process ahead took rows in work: {:?}",
            sim.delivered_rows(1, 0)
        );
        assert!(sim.runs_of(0, mark, StatementKind::ExtendLease).len() >= 4);
        for row in 1..=4 {
            let until = sim.row(row).locked_until.expect("leased");
            assert!(
                until > sim.now.micros(),
                "{dialect:?}: row {row} is held by the database's clock"
            );
            let d = sim.delivery(0, row);
            sim.settle(0, d, Outcome::Ack);
        }
        sim.run();
        assert!(
            sim.db.rows.is_empty(),
            "{dialect:?}: every row settled once"
        );
        assert!(sim.delivered(1, 0).is_empty(), "{dialect:?}");
    }
}

/// A process whose clock runs 45 s behind writes leases that run the lease's length by the
/// database's clock, not 15 s in the past: a process in step takes none of its rows.
#[test]
fn a_process_whose_clock_runs_behind_leases_for_the_whole_lease() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, lease(), 2);
        sim.insert(0);
        sim.insert(1);
        let behind = sim.spawn_skewed(OFF, false);
        sim.run();
        let claimed_at = sim.now;
        assert_eq!(sim.delivered_rows(behind, 0), [1, 2], "{dialect:?}");
        for row in [1, 2] {
            assert_eq!(
                sim.row(row).locked_until,
                Some(claimed_at.plus(LEASE_TIME).micros()),
                "{dialect:?}: row {row} leased for the lease's length by the database's clock"
            );
        }
        let in_step = sim.spawn();
        sim.run();
        sim.advance(LEASE_TIME + EXTEND);
        assert!(
            sim.delivered(in_step, 0).is_empty(),
            "{dialect:?}: rows in work were taken: {:?}",
            sim.delivered_rows(in_step, 0)
        );
    }
}

/// A retry's delay runs by the database's clock: the row is due the delay after the
/// database's time of the settlement, whatever the settling process's clock says, and no
/// claim takes it before.
#[test]
fn a_retried_row_waits_its_delay_by_the_database_clock() {
    for (dialect, ahead) in SERVERS.into_iter().flat_map(|d| [(d, true), (d, false)]) {
        let mut sim = Sim::new(dialect, lease(), 1);
        sim.insert(0);
        let p = sim.spawn_skewed(OFF, ahead);
        sim.run();
        let delivery = sim.delivery(p, 1);
        let delay = Duration::from_secs(5);
        let settled_at = sim.now;
        sim.settle_with(p, delivery, Settlement::new(Outcome::Retry).delay(delay));
        sim.run();
        assert_eq!(
            sim.row(1).due,
            settled_at.plus(delay).micros(),
            "{dialect:?} ahead {ahead}: due the delay after the database's time"
        );
        let mark = sim.mark();
        sim.advance(delay - Duration::from_millis(1));
        assert!(
            sim.delivered(p, mark).is_empty(),
            "{dialect:?} ahead {ahead}"
        );
        sim.advance(POLL * 2);
        assert_eq!(
            sim.delivered_rows(p, mark),
            [1],
            "{dialect:?} ahead {ahead}"
        );
    }
}

/// An extension moves a lease by the time passed since its claim's statement left, on the
/// process's own clock: the row stays held a lease past the database's time.
#[test]
fn an_extension_by_a_process_off_the_database_clock_keeps_the_lease_a_lease_ahead() {
    for (dialect, ahead) in SERVERS.into_iter().flat_map(|d| [(d, true), (d, false)]) {
        let mut sim = Sim::new(dialect, lease(), 1);
        sim.insert(0);
        sim.spawn_skewed(OFF, ahead);
        sim.run();
        let claimed_at = sim.now;
        sim.advance(EXTEND);
        assert_eq!(sim.executed(StatementKind::ExtendLease), 1, "{dialect:?}");
        assert_eq!(
            sim.row(1).locked_until,
            Some(claimed_at.plus(EXTEND).plus(LEASE_TIME).micros()),
            "{dialect:?} ahead {ahead}"
        );
    }
}

/// A retried row is taken again when its delay ends, not at the next poll, in every form and
/// dialect where its table keeps the delay; a claim that starts before then (woken by
/// another row, or by the settlement) does not make it wait for the poll.
#[test]
fn a_retried_row_is_claimed_again_when_its_delay_ends() {
    for dialect in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
        for desc in [lease(), row_lock(), advisory()] {
            if dialect == Dialect::Sqlite && desc.form() == Form::RowLock {
                continue;
            }
            let mut sim = Sim::new(dialect, desc, 1);
            sim.insert(0);
            let p = sim.spawn();
            sim.run();
            let delivery = sim.delivery(p, 1);
            let delay = Duration::from_millis(50);
            sim.settle_with(p, delivery, Settlement::new(Outcome::Retry).delay(delay));
            sim.run();
            let mark = sim.mark();
            sim.advance(delay + Duration::from_millis(20));
            assert_eq!(
                sim.delivered_rows(p, mark),
                [1],
                "{dialect:?} {:?}: taken again when the delay ends",
                desc.form()
            );
        }
    }
}

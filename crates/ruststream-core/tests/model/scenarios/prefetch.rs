//! The row lock and advisory forms' rows claimed ahead (prefetch): they wait in their
//! transaction or under their key, and are given back at a stop, a shutdown or a crash.

use super::*;

fn prefetching(
    dialect: Dialect,
    desc: TableDesc,
    workers: usize,
    prefetch: usize,
    rows: i64,
) -> Sim {
    let mut sim = Sim::new(dialect, desc, workers);
    sim.prefetch = prefetch;
    for channel in 0..rows {
        sim.insert(channel);
    }
    sim.spawn();
    sim.run();
    sim
}

/// The row lock form: a row claimed ahead waits in its claim's transaction, on a connection of
/// its own, and goes to the next free worker without a claim.
#[test]
fn row_lock_rows_claimed_ahead_wait_in_their_transactions_and_go_to_the_next_free_worker() {
    for dialect in SERVERS {
        let mut sim = prefetching(dialect, row_lock(), 2, 2, 6);
        let sub = sim.procs[0].sub;
        assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{dialect:?}: two workers");
        assert_eq!(sim.procs[0].broker.claimed_ahead(sub), 2, "{dialect:?}");
        assert_eq!(
            sim.procs[0].broker.held_connections(),
            4,
            "{dialect:?}: a connection per row held"
        );
        let mut sessions = BTreeSet::new();
        for row in [1, 2, 3, 4] {
            let sess = *sim
                .db
                .row_locks
                .get(&row)
                .unwrap_or_else(|| panic!("{dialect:?}: row {row} is locked"));
            assert!(sim.db.sessions[&sess].in_tx, "{dialect:?}: row {row}");
            sessions.insert(sess);
        }
        assert_eq!(sessions.len(), 4, "{dialect:?}: a session of its own each");
        assert!(
            !sim.db.row_locks.contains_key(&5),
            "{dialect:?}: four claimed in all"
        );
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        // The freed worker takes row 3 at once, before anything has run.
        assert_eq!(
            sim.delivered_rows(0, mark),
            [3],
            "{dialect:?}: in claim order"
        );
        assert!(sim.runs(0, mark).is_empty(), "{dialect:?}");
        sim.run();
        assert!(
            !sim.db.rows.contains_key(&1),
            "{dialect:?}: row 1 is settled"
        );
        // Row 1's slot goes to the next claim, which claims row 5 ahead.
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
        assert_eq!(sim.procs[0].broker.claimed_ahead(sub), 2, "{dialect:?}");
        assert!(sim.db.row_locks.contains_key(&5), "{dialect:?}");
        assert_eq!(
            sim.row(3).attempt,
            1,
            "{dialect:?}: counted once, when claimed"
        );
    }
}

/// The advisory lock form: a row claimed ahead waits under its key's lock, on a connection of
/// its own, and goes to the next free worker without a claim.
#[test]
fn advisory_rows_claimed_ahead_wait_under_their_keys_and_go_to_the_next_free_worker() {
    for dialect in SERVERS {
        let mut sim = prefetching(dialect, advisory(), 1, 2, 4);
        let sub = sim.procs[0].sub;
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}: one worker");
        assert_eq!(sim.procs[0].broker.claimed_ahead(sub), 2, "{dialect:?}");
        assert_eq!(sim.procs[0].broker.held_connections(), 3, "{dialect:?}");
        for channel in 0..3 {
            let arg = lock_arg(dialect, &format!("jobs-{channel}"));
            assert!(
                sim.db.advisory.contains_key(&arg),
                "{dialect:?}: the key of channel {channel} is locked"
            );
        }
        let arg = lock_arg(dialect, "jobs-3");
        assert!(
            !sim.db.advisory.contains_key(&arg),
            "{dialect:?}: three in all"
        );
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        assert_eq!(
            sim.delivered_rows(0, mark),
            [2],
            "{dialect:?}: in claim order"
        );
        assert!(sim.runs(0, mark).is_empty(), "{dialect:?}");
        sim.run();
        assert!(!sim.db.rows.contains_key(&1), "{dialect:?}");
        assert!(
            !sim.db.advisory.contains_key(&lock_arg(dialect, "jobs-0")),
            "{dialect:?}: row 1's key is released"
        );
        assert_eq!(
            sim.procs[0].broker.claimed_ahead(sub),
            2,
            "{dialect:?}: rows 3 and 4"
        );
        assert_eq!(sim.in_work(0), 1, "{dialect:?}");
    }
}

/// Stopping the subscription gives back the rows claimed ahead at once: their transactions
/// roll back, or their keys' locks are released; the one in work goes on.
#[test]
fn stopping_gives_back_the_rows_claimed_ahead_in_every_form_that_holds_a_session() {
    for dialect in SERVERS {
        for desc in [row_lock(), advisory()] {
            let form = desc.form();
            let mut sim = prefetching(dialect, desc, 1, 2, 3);
            let sub = sim.procs[0].sub;
            assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?} {form:?}");
            assert_eq!(
                sim.procs[0].broker.claimed_ahead(sub),
                2,
                "{dialect:?} {form:?}"
            );
            let mark = sim.mark();
            sim.procs[0].broker.stop(sub, sim.now);
            sim.poll(0);
            sim.run();
            assert_eq!(
                sim.procs[0].broker.claimed_ahead(sub),
                0,
                "{dialect:?} {form:?}"
            );
            assert_eq!(
                sim.in_work(0),
                1,
                "{dialect:?} {form:?}: the one in work goes on"
            );
            assert_eq!(
                sim.procs[0].broker.held_connections(),
                1,
                "{dialect:?} {form:?}: the rows ahead gave their connections back"
            );
            let ops = sim.ops(0, mark);
            assert_eq!(
                ops.iter().filter(|op| **op == Release).count(),
                2,
                "{dialect:?} {form:?}: back to the pool, not closed: {ops:?}"
            );
            assert!(!ops.contains(&Close), "{dialect:?} {form:?}: {ops:?}");
            if form == Form::RowLock {
                assert_eq!(
                    sim.runs_of(0, mark, StatementKind::Rollback).len(),
                    2,
                    "{dialect:?}"
                );
                assert_eq!(sim.db.row_locks.keys().copied().collect::<Vec<_>>(), [1]);
            } else {
                assert_eq!(sim.db.advisory.len(), 1, "{dialect:?}: only row 1's key");
            }
            for row in [2, 3] {
                assert_eq!(sim.row(row).attempt, 1, "{dialect:?} {form:?}: row {row}");
            }
            assert!(
                !sim.events(0, mark)
                    .iter()
                    .any(|e| matches!(e, Event::Returned { .. } | Event::Delivered(_))),
                "{dialect:?} {form:?}: the runtime hears nothing of them: {:?}",
                sim.events(0, mark)
            );
        }
    }
}

/// At the shutdown the rows claimed ahead are given back with the rows in work, and the
/// advisory counts include their keys; nothing is held after it.
#[test]
fn the_shutdown_gives_back_the_rows_claimed_ahead_in_every_form_that_holds_a_session() {
    for dialect in SERVERS {
        for desc in [row_lock(), advisory()] {
            let form = desc.form();
            let mut sim = prefetching(dialect, desc, 1, 2, 3);
            sim.shutdown(0);
            sim.run();
            let (counts, _) = only(sim.closed(0));
            if form == Form::Advisory {
                assert_eq!(
                    counts.locks_released, 3,
                    "{dialect:?}: the key in work and the two ahead"
                );
            }
            assert!(sim.db.row_locks.is_empty(), "{dialect:?} {form:?}");
            assert!(sim.db.advisory.is_empty(), "{dialect:?} {form:?}");
            assert_eq!(
                sim.procs[0].broker.held_connections(),
                0,
                "{dialect:?} {form:?}"
            );
        }
    }
}

/// A crash returns the rows claimed ahead at once, as it returns the rows in work.
#[test]
fn a_crash_returns_the_rows_claimed_ahead_at_once() {
    for dialect in SERVERS {
        for desc in [row_lock(), advisory()] {
            let form = desc.form();
            let mut sim = prefetching(dialect, desc, 1, 2, 3);
            assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?} {form:?}");
            // A second process with three workers, claiming nothing ahead.
            sim.workers = 3;
            sim.prefetch = 0;
            let second = sim.spawn();
            sim.run();
            assert!(sim.delivered(second, 0).is_empty(), "{dialect:?} {form:?}");
            sim.crash(0);
            sim.advance(POLL);
            let mut rows = sim.delivered_rows(second, 0);
            rows.sort_unstable();
            assert_eq!(rows, [1, 2, 3], "{dialect:?} {form:?}");
        }
    }
}

/// A claim that reads the first due rows alone (SQLite's registry, a custom lock) claims
/// nothing ahead.
#[test]
fn a_claim_of_the_first_due_rows_alone_claims_nothing_ahead() {
    for (dialect, desc) in [
        (Dialect::Sqlite, advisory()),
        (Dialect::Sqlite, custom()),
        (Dialect::Postgres, custom()),
    ] {
        let sim = prefetching(dialect, desc, 1, 3, 4);
        let sub = sim.procs[0].sub;
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
        assert_eq!(sim.procs[0].broker.claimed_ahead(sub), 0, "{dialect:?}");
        assert_eq!(sim.procs[0].broker.held_connections(), 1, "{dialect:?}");
    }
}

/// A row claimed ahead that waited [`PING_AHEAD_AFTER`] is handed once its session answered a
/// `SELECT 1`; one that waited less is handed at once (above).
#[test]
fn a_row_claimed_ahead_that_waited_is_handed_once_its_session_answers() {
    for dialect in SERVERS {
        for desc in [row_lock(), advisory()] {
            let form = desc.form();
            let mut sim = prefetching(dialect, desc, 1, 1, 2);
            assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?} {form:?}");
            let conn = sim.conn_of(0, 2);
            sim.advance(PING_AHEAD_AFTER);
            let mark = sim.mark();
            sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
            assert!(
                sim.delivered(0, mark).is_empty(),
                "{dialect:?} {form:?}: not before its session answered"
            );
            sim.run();
            assert_eq!(
                sim.ops_on(0, conn, mark).first(),
                Some(&Exec(StatementKind::Ping)),
                "{dialect:?} {form:?}"
            );
            let d = only(sim.delivered(0, mark));
            assert_eq!(d.row, Some(2), "{dialect:?} {form:?}");
            assert_eq!(d.attempt, Some(1), "{dialect:?} {form:?}");
            assert_eq!(sim.in_work(0), 1, "{dialect:?} {form:?}");
        }
    }
}

/// A row claimed ahead whose session the server ended while it waited (its transaction or
/// its key's lock gone with it) is never handed: its connection closes, and the row is
/// claimed again, with its next attempt.
#[test]
fn a_row_claimed_ahead_whose_session_ended_is_never_handed() {
    for dialect in SERVERS {
        for desc in [row_lock(), advisory()] {
            let form = desc.form();
            let mut sim = prefetching(dialect, desc, 1, 1, 2);
            assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?} {form:?}");
            let sess = sim.sess_of(0, sim.conn_of(0, 2));
            sim.advance(PING_AHEAD_AFTER);
            sim.db.kill(sess);
            let mark = sim.mark();
            sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
            sim.run();
            let handed = sim.delivered(0, mark);
            assert!(
                handed.iter().all(|d| d.attempt == Some(2)),
                "{dialect:?} {form:?}: the stale claim of row 2 is never handed: {handed:?}"
            );
            let d = only(handed);
            assert_eq!(d.row, Some(2), "{dialect:?} {form:?}: claimed again");
            assert!(
                sim.events(0, mark)
                    .iter()
                    .any(|e| matches!(e, Event::Error { .. })),
                "{dialect:?} {form:?}: the lost session is told"
            );
            assert_eq!(sim.row(2).attempt, 2, "{dialect:?} {form:?}");
        }
    }
}

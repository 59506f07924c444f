//! Row lock claims that count attempts: a count commits before its rows are locked, claims
//! waiting together are counted in one statement, and counted rows are passed over by others.

use super::*;

/// A row lock claim that counts an attempt commits the count before it locks the row, under
/// the row's mark. The next claim acquires its connection beside it and counts once the first
/// has locked its row: a count meanwhile would hold the counted row for a moment, and the
/// first one's lock would find it held. No row is counted twice.
#[test]
fn row_lock_claims_that_count_attempts_count_after_the_last_counts_locks() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 2, &[0, 1, 2, 3]);
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
        sim.hook(move |_, c| {
            if locks_by_id(c) {
                Intercept::Hold
            } else {
                Intercept::Run
            }
        });
        let first = sim.delivery(0, 1);
        sim.settle(0, first, Outcome::Ack);
        sim.run();
        assert_eq!(sim.procs[0].held.len(), 1, "{dialect:?}: one claim locks");
        let marked: Vec<i64> = sim.db.marks.keys().copied().collect();
        assert_eq!(
            marked,
            [3],
            "{dialect:?}: its row stays marked until its lock"
        );
        let second = sim.delivery(0, 2);
        let mark = sim.mark();
        sim.settle(0, second, Outcome::Ack);
        sim.run();
        let ops = sim.ops(0, mark);
        assert!(
            ops.contains(&Acquire),
            "{dialect:?}: the second claim acquires beside the first: {ops:?}"
        );
        let counting = [StatementKind::CountRow, StatementKind::SelectRowId];
        assert!(
            counting.iter().all(|k| sim.runs_of(0, mark, *k).is_empty()),
            "{dialect:?}: but does not count while the first has not locked its row: {ops:?}"
        );
        sim.hook = None;
        for command in sim.take_held(0) {
            sim.run_command(0, command);
        }
        sim.run();
        assert_eq!(sim.in_work(0), 2, "{dialect:?}");
        let mut rows = sim.delivered_rows(0, mark);
        rows.sort_unstable();
        assert_eq!(
            rows,
            [3, 4],
            "{dialect:?}: each claim takes a row of its own"
        );
        for row in [3, 4] {
            assert_eq!(
                sim.row(row).attempt,
                1,
                "{dialect:?}: row {row} counted once"
            );
        }
        assert!(sim.db.marks.is_empty(), "{dialect:?}: {:?}", sim.db.marks);
    }
}

/// The claims waiting for a count when it starts are counted together: one statement counts a
/// row for each of them, and each locks its own row on its own connection. Rows are counted
/// once each and none goes to two claims.
#[test]
fn row_lock_claims_waiting_together_are_counted_in_one_statement() {
    for dialect in SERVERS {
        let counting = if dialect == Dialect::Postgres {
            StatementKind::CountRow
        } else {
            StatementKind::SelectRowId
        };
        let mut sim = Sim::start(dialect, row_lock(), 4, &[0; 12]);
        assert_eq!(sim.in_work(0), 4, "{dialect:?}");
        let counts = sim.runs_of(0, 0, counting).len();
        assert!(
            counts < 4,
            "{dialect:?}: four claims, {counts} counts: {:?}",
            sim.ops(0, 0)
        );
        for round in 0..2 {
            let mark = sim.mark();
            let in_work: Vec<i64> = sim
                .delivered_rows(0, 0)
                .into_iter()
                .skip(4 * round)
                .collect();
            for row in in_work {
                let d = sim.delivery(0, row);
                sim.settle(0, d, Outcome::Ack);
            }
            sim.run();
            assert_eq!(sim.in_work(0), 4, "{dialect:?}");
            let counts = sim.runs_of(0, mark, counting).len();
            assert!(
                counts < 4,
                "{dialect:?}: four claims side by side, {counts} counts: {:?}",
                sim.ops(0, mark)
            );
        }
        let rows = sim.delivered_rows(0, 0);
        let distinct: BTreeSet<i64> = rows.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            rows.len(),
            "{dialect:?}: one delivery a row: {rows:?}"
        );
        for row in rows.iter().skip(8) {
            assert_eq!(
                sim.row(*row).attempt,
                1,
                "{dialect:?}: row {row} counted once"
            );
        }
    }
}

/// A MySQL count's select that answers more rows than it asked for, or one row twice (a
/// server or driver that breaks its `LIMIT`): the claim counts the rows it may, once each,
/// and goes on to lock and deliver them, rather than leaving its connection in a
/// transaction with nothing after it.
#[test]
fn a_count_select_answering_more_rows_than_asked_counts_those_it_may() {
    let mut sim = Sim::new(Dialect::MySql, row_lock(), 1);
    let first = sim.insert(0);
    let second = sim.insert(1);
    let mut answered = false;
    sim.hook(move |_, c| match kind_of(c) {
        Some(StatementKind::SelectRowId) if !answered => {
            answered = true;
            let row = |id: i64| {
                Row::values(vec![
                    Value::Int(id),
                    Value::Int(0),
                    Db::mark_value(Dialect::MySql, id),
                ])
            };
            Intercept::Answer(Reply::Rows(vec![row(first), row(first), row(second)]))
        }
        _ => Intercept::Run,
    });
    let p = sim.spawn();
    sim.run();
    let delivered = sim.delivered(p, 0);
    assert_eq!(
        delivered.iter().map(|d| d.row).collect::<Vec<_>>(),
        [Some(first)],
        "one worker: the first row, counted once"
    );
    assert_eq!(sim.db.rows[&first].attempt, 1);
    assert_eq!(
        sim.db.rows[&second].attempt, 0,
        "the row past the limit is not counted"
    );
    assert_eq!(
        sim.procs[p].broker.held_connections(),
        1,
        "the delivery's connection only"
    );
}

/// Two processes claim from one table in the row lock form with an attempt column. Between the
/// first one's count and its locks no transaction holds the counted rows; the second one's
/// count passes over them (the first holds their marks) and counts the others, so every row
/// is counted once and taken at attempt 1. The marks go once the locks have answered.
#[test]
fn a_count_passes_over_rows_another_process_counted_and_has_not_locked_yet() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, row_lock(), 2);
        for _ in 0..4 {
            sim.insert(0);
        }
        // The first process's locks of its counted rows wait.
        sim.hook(|p, c| {
            if p == 0 && locks_by_id(c) {
                Intercept::Hold
            } else {
                Intercept::Run
            }
        });
        let first = sim.spawn();
        sim.run();
        let counted: Vec<i64> = sim
            .db
            .rows
            .iter()
            .filter(|(_, r)| r.attempt == 1)
            .map(|(id, _)| *id)
            .collect();
        assert!(
            !counted.is_empty(),
            "{dialect:?}: the first process counted"
        );
        assert_eq!(
            sim.db.marks.keys().copied().collect::<Vec<_>>(),
            counted,
            "{dialect:?}: and holds their marks until its locks answer"
        );
        let second = sim.spawn();
        sim.run();
        let taken = sim.delivered_rows(second, 0);
        assert!(
            !taken.is_empty() && taken.iter().all(|row| !counted.contains(row)),
            "{dialect:?}: the second process takes rows the first did not count: {taken:?}, counted {counted:?}"
        );
        sim.hook(|_, _| Intercept::Run);
        for command in sim.take_held(first) {
            sim.run_command(first, command);
        }
        sim.run();
        let mut all = sim.delivered_rows(first, 0);
        assert!(
            counted.iter().all(|row| all.contains(row)),
            "{dialect:?}: the first process takes the rows it counted: {all:?}"
        );
        all.extend(sim.delivered_rows(second, 0));
        all.sort_unstable();
        assert_eq!(all, [1, 2, 3, 4], "{dialect:?}: each row taken once");
        for p in [first, second] {
            for d in sim.delivered(p, 0) {
                assert_eq!(d.attempt, Some(1), "{dialect:?}: {:?} counted once", d.id);
            }
        }
        for row in sim.db.rows.values() {
            assert_eq!(row.attempt, 1, "{dialect:?}: every row counted once");
        }
        assert_eq!(
            sim.db.superseded, 0,
            "{dialect:?}: no lock found its row recounted"
        );
        assert!(
            sim.db.marks.is_empty(),
            "{dialect:?}: no mark is left: {:?}",
            sim.db.marks
        );
    }
}

/// A count's leader that stops before its rows are locked (the broker shuts down between the
/// count and the locks) closes its connection instead of giving it back to the pool with the
/// marks held: the marks end with the session, and the counted rows are free.
#[test]
fn a_leader_that_ends_holding_marks_closes_its_connection() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, row_lock(), 2);
        for _ in 0..2 {
            sim.insert(0);
        }
        sim.hook(|_, c| {
            if kind_of(c) == Some(StatementKind::Begin) {
                Intercept::Hold
            } else {
                Intercept::Run
            }
        });
        let p = sim.spawn();
        sim.run();
        // The MySQL count's own BEGIN waits too: let it and its count through.
        loop {
            let held = sim.take_held(p);
            if !sim.db.marks.is_empty() || held.is_empty() {
                sim.procs[p].held = held;
                break;
            }
            for command in held {
                sim.run_command(p, command);
            }
            sim.run();
        }
        assert!(
            !sim.db.marks.is_empty(),
            "{dialect:?}: the count marked its rows"
        );
        sim.shutdown(p);
        sim.hook(|_, _| Intercept::Run);
        for command in sim.take_held(p) {
            sim.run_command(p, command);
        }
        sim.run();
        assert!(
            sim.db.marks.is_empty(),
            "{dialect:?}: the marks ended with the leader's session: {:?}",
            sim.db.marks
        );
        assert!(
            sim.events(p, 0)
                .iter()
                .any(|e| matches!(e, Event::Closed(_))),
            "{dialect:?}: the broker closed"
        );
    }
}

/// A count answered after the shutdown began takes no row: its leader closes its connection
/// instead of giving it back to the pool, and the marks end with the session.
#[test]
fn a_count_answered_after_the_shutdown_leaves_no_mark() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, row_lock(), 1);
        for _ in 0..4 {
            sim.insert(0);
        }
        let counting = if dialect == Dialect::Postgres {
            StatementKind::CountRow
        } else {
            StatementKind::MarkRows(1)
        };
        sim.hook(move |_, c| {
            if kind_of(c) == Some(counting) {
                Intercept::Hold
            } else {
                Intercept::Run
            }
        });
        let p = sim.spawn();
        sim.run();
        let held = sim.take_held(p);
        assert_eq!(held.len(), 1, "{dialect:?}: the count waits");
        let reply = sim.exec(p, &held[0]);
        assert!(
            !sim.db.marks.is_empty(),
            "{dialect:?}: the count marked its row"
        );
        sim.shutdown(p);
        sim.run();
        sim.hook(|_, _| Intercept::Run);
        sim.answer(p, held[0].clone(), reply);
        sim.run();
        assert!(
            sim.db.violations.is_empty(),
            "{dialect:?}: {:?}",
            sim.db.violations
        );
        assert!(sim.db.marks.is_empty(), "{dialect:?}: {:?}", sim.db.marks);
        assert!(
            sim.ops(p, 0).contains(&Close),
            "{dialect:?}: the leader's connection closed: {:?}",
            sim.ops(p, 0)
        );
        assert!(
            sim.events(p, 0)
                .iter()
                .any(|e| matches!(e, Event::Closed(_))),
            "{dialect:?}: the broker closed"
        );
    }
}

/// A counted row's lock that finds the row held (a count of another process that looks at it,
/// or any other transaction) passes it over and tries again shortly, holding the row's mark
/// meanwhile: once the row is free the claim takes it at its count. Held past the tries
/// (ten, over about a second), the claim gives the row up: its attempt spent, its mark
/// released, and the next claim counts it again.
#[test]
fn a_counted_row_found_held_is_locked_again_shortly() {
    for dialect in SERVERS {
        for released in [true, false] {
            let mut sim = Sim::new(dialect, row_lock(), 1);
            let row = sim.insert(0);
            sim.hook(|_, c| {
                if locks_by_id(c) {
                    Intercept::Hold
                } else {
                    Intercept::Run
                }
            });
            let p = sim.spawn();
            sim.run();
            let held = sim.take_held(p);
            assert_eq!(held.len(), 1, "{dialect:?}: the counted row's lock waits");
            // Another transaction takes the row before the lock runs.
            const FOREIGN: SessId = 9_999;
            sim.db.row_locks.insert(row, FOREIGN);
            sim.hook(|_, _| Intercept::Run);
            for command in held {
                sim.run_command(p, command);
            }
            sim.run();
            sim.advance(Duration::from_millis(6));
            assert!(
                sim.delivered_rows(p, 0).is_empty(),
                "{dialect:?}: the held row is not taken"
            );
            assert_eq!(
                sim.runs_of(p, 0, StatementKind::LockRowByIdUnmarking).len(),
                3,
                "{dialect:?}: the lock tried again at 1 and 3 ms"
            );
            assert_eq!(
                sim.db.marks.keys().copied().collect::<Vec<_>>(),
                [row],
                "{dialect:?}: the mark is kept while the lock tries again"
            );
            if released {
                sim.db.row_locks.remove(&row);
                sim.advance(Duration::from_millis(8));
                let delivered = sim.delivered(p, 0);
                assert_eq!(delivered.len(), 1, "{dialect:?}: taken once free");
                assert_eq!(delivered[0].attempt, Some(1), "{dialect:?}: at its count");
            } else {
                sim.advance(Duration::from_millis(1_100));
                assert!(sim.delivered_rows(p, 0).is_empty(), "{dialect:?}");
                assert_eq!(
                    sim.runs_of(p, 0, StatementKind::LockRowByIdUnmarking).len(),
                    11,
                    "{dialect:?}: ten tries again, then the row is given up"
                );
                assert_eq!(sim.row(row).attempt, 1, "{dialect:?}: its attempt spent");
            }
            assert!(
                sim.db.marks.is_empty(),
                "{dialect:?}: the mark is released: {:?}",
                sim.db.marks
            );
            if !released {
                // Free again, the row is counted and taken by the next claim.
                sim.db.row_locks.remove(&row);
                sim.advance(POLL * 2);
                let delivered = sim.delivered(p, 0);
                assert_eq!(delivered.len(), 1, "{dialect:?}: taken by a later claim");
                assert_eq!(delivered[0].attempt, Some(2), "{dialect:?}");
            }
        }
    }
}

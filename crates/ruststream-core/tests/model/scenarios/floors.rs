//! Claims in id order start past the rows taken before them, and a look from the table's
//! start waits while claims keep the floor.

use super::*;

/// In a table claimed in id order, a claim after one that found all it asked for starts at
/// that claim's lowest id (past the entries of the rows settled before it), and a row that
/// becomes claimable again below that id is found by a claim from the table's start within a
/// second.
#[test]
fn claims_in_id_order_start_past_the_rows_taken_before_them() {
    for dialect in [Dialect::Postgres, Dialect::Sqlite] {
        let mut sim = Sim::start(dialect, lease_marked(), 2, &[0; 12]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{dialect:?}");
        let floor_of = |sim: &Sim, since: usize| sim.floors(0, since, StatementKind::ClaimLease);
        assert!(
            floor_of(&sim, 0).is_empty(),
            "{dialect:?}: the first claim starts at the beginning"
        );
        let mark = sim.mark();
        for row in [1, 2] {
            let d = sim.delivery(0, row);
            sim.settle(0, d, Outcome::Ack);
        }
        sim.run();
        assert_eq!(sim.delivered_rows(0, mark), [3, 4], "{dialect:?}");
        assert_eq!(
            floor_of(&sim, mark).first(),
            Some(&Value::Int(1)),
            "{dialect:?}: the next claim starts at the last full claim's lowest id"
        );
        // Row 4 ends; row 3 comes back to the queue below where the claims now start.
        let d = sim.delivery(0, 4);
        sim.settle(0, d, Outcome::Ack);
        sim.run();
        let mark = sim.mark();
        let d = sim.delivery(0, 3);
        sim.settle(0, d, Outcome::Retry);
        sim.run();
        let returned = sim.now;
        let mut done: BTreeSet<i64> = [1, 2, 4].into();
        let again = sim.ack_others_until(3, mark, &mut done);
        let again = again.unwrap_or_else(|| {
            panic!(
                "{dialect:?}: row 3 never came back: {:?}",
                sim.delivered_rows(0, 0)
            )
        });
        assert!(
            again.micros() - returned.micros() <= 1_100_000,
            "{dialect:?}: row 3 came back {} µs after its retry",
            again.micros() - returned.micros()
        );
    }
}

/// The floors the claims of `kind` since `mark` started at: `None` for a look from the
/// table's start.
fn starts(sim: &Sim, mark: usize, kind: StatementKind) -> Vec<Option<i64>> {
    sim.runs_of(0, mark, kind)
        .iter()
        .map(|r| {
            let st = r.statement.as_ref()?;
            let i = st.args.iter().position(|a| *a == Arg::Floor)?;
            r.binds[i].as_int()
        })
        .collect()
}

/// After a claim from the floor that found less than it asked for, the next claim looks from
/// the table's start for rows claimable again below the floor: at once while such a look is
/// cheap; while it is dear (here 20 ms: the entries of settled rows that vacuum may not
/// remove yet) the claims keep the floor, and the look from the start follows twenty times
/// its length after the last one, in every form that claims in id order.
#[test]
fn a_dear_look_from_the_start_waits_while_claims_keep_the_floor() {
    for (desc, kind) in [
        (lease_marked(), StatementKind::ClaimLease),
        (row_lock_marked(), StatementKind::CountRow),
        (advisory(), StatementKind::Candidates),
    ] {
        for dear in [false, true] {
            let form = desc.form();
            let mut sim = Sim::start(Dialect::Postgres, desc, 2, &[0, 1, 2, 3, 4, 5]);
            assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{form:?}");
            for row in [1, 2] {
                let d = sim.delivery(0, row);
                sim.settle(0, d, Outcome::Ack);
            }
            sim.run();
            assert_eq!(sim.delivered_rows(0, 0), [1, 2, 3, 4], "{form:?}");
            // The next claim starts at the table's start and takes row 5; its look takes 20 ms
            // when dear.
            sim.advance(Duration::from_secs(2));
            hold_kind(&mut sim, kind);
            let d = sim.delivery(0, 3);
            sim.settle(0, d, Outcome::Ack);
            sim.run();
            let held = sim.take_held(0);
            assert_eq!(held.len(), 1, "{form:?}: the look from the start");
            sim.hook = None;
            let sent = sim.now;
            if dear {
                sim.now = sim.now.plus(Duration::from_millis(20));
            }
            for command in held {
                sim.run_command(0, command);
            }
            sim.run();
            assert_eq!(sim.delivered_rows(0, 0), [1, 2, 3, 4, 5], "{form:?}");
            // Rows 4 and 5 end: the claims from the floor find row 6, then nothing.
            let mark = sim.mark();
            for row in [4, 5] {
                let d = sim.delivery(0, row);
                sim.settle(0, d, Outcome::Ack);
                sim.run();
            }
            assert_eq!(sim.delivered_rows(0, mark), [6], "{form:?}");
            let starts = |sim: &Sim| starts(sim, mark, kind);
            let now = starts(&sim);
            if !dear {
                assert_eq!(
                    now.last(),
                    Some(&None),
                    "{form:?}: a cheap look from the start follows at once"
                );
                continue;
            }
            // (A lease claim waits for the handler of row 5, and finds row 6 and no more.)
            assert!(
                !now.is_empty() && now.iter().all(Option::is_some),
                "{form:?}: the claims that found row 6 and then nothing start at the floor, and no look from the start follows at once: {now:?}"
            );
            // Twenty times 20 ms after the last look from the start was sent.
            sim.advance_to(sent.plus(Duration::from_millis(390)));
            let before = starts(&sim);
            assert!(
                before.iter().all(Option::is_some),
                "{form:?}: none before 400 ms: {before:?}"
            );
            sim.advance_to(sent.plus(Duration::from_millis(410)));
            let later = starts(&sim);
            assert!(
                later.len() == before.len() + 1 && later.last() == Some(&None),
                "{form:?}: the look from the start 400 ms after the last: {later:?}"
            );
        }
    }
}

/// On PostgreSQL an advisory table claimed in id order starts its looks past the rows taken
/// before them, but never past a row still queued: a row in work here, whose key the look
/// passes over, keeps the floor at or below it, so when it returns to the queue the next look
/// finds it before any later row of its key.
#[test]
fn advisory_looks_in_id_order_start_past_taken_rows_but_not_past_one_in_work() {
    // Row 3 and row 12 share a key; the others have keys of their own.
    let channels = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 2];
    let mut sim = Sim::start(Dialect::Postgres, advisory(), 2, &channels);
    assert_eq!(sim.delivered_rows(0, 0), [1, 2]);
    let floors = |sim: &Sim, since: usize| -> Vec<i64> {
        sim.floors(0, since, StatementKind::Candidates)
            .iter()
            .filter_map(Value::as_int)
            .collect()
    };
    assert!(
        floors(&sim, 0).is_empty(),
        "the first look starts at the beginning"
    );
    let mut done: BTreeSet<i64> = BTreeSet::new();
    for row in [1, 2] {
        let d = sim.delivery(0, row);
        sim.settle(0, d, Outcome::Ack);
        done.insert(row);
    }
    sim.run();
    assert_eq!(sim.delivered_rows(0, 0), [1, 2, 3, 4]);
    // Row 4 ends; row 3 returns to the queue while looks start past rows 1 and 2.
    let d = sim.delivery(0, 4);
    sim.settle(0, d, Outcome::Ack);
    done.insert(4);
    sim.run();
    let mark = sim.mark();
    let d = sim.delivery(0, 3);
    sim.settle(0, d, Outcome::Retry);
    sim.run();
    let started = floors(&sim, 0);
    assert!(
        started.iter().any(|&f| f > 1),
        "looks start past the rows settled before them: {started:?}"
    );
    sim.ack_others_until(3, mark, &mut done);
    let again = sim.delivered_rows(0, mark);
    let at = again.iter().position(|&r| r == 3);
    assert!(at.is_some(), "row 3 came back: {again:?}");
    assert!(
        !again[..at.unwrap_or(0)].contains(&12),
        "row 12 overtook row 3 of its key: {again:?}"
    );
    assert!(
        floors(&sim, mark).iter().all(|&f| f <= 3),
        "no look starts past row 3 while it is queued: {:?}",
        floors(&sim, mark)
    );
}

/// Two workers on ten rows of keys of their own (PostgreSQL): rows 1 and 2 handed and
/// acknowledged, rows 3 and 4 in work, and the claims past them.
fn advisory_with_rows_3_and_4_in_work() -> Sim {
    let channels = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
    let mut sim = Sim::start(Dialect::Postgres, advisory(), 2, &channels);
    assert_eq!(sim.delivered_rows(0, 0), [1, 2]);
    for row in [1, 2] {
        let d = sim.delivery(0, row);
        sim.settle(0, d, Outcome::Ack);
    }
    sim.run();
    assert_eq!(sim.delivered_rows(0, 0), [1, 2, 3, 4]);
    sim
}

/// A claim whose look from the floor finds only keys held elsewhere looks again at once from
/// the same floor, not from the table's start: a look from the start passes every index entry
/// the rows taken before it left, which vacuum may not have removed.
#[test]
fn advisory_a_second_look_starts_where_the_first_did() {
    let mut sim = advisory_with_rows_3_and_4_in_work();
    // The next rows' keys are held by another system's session.
    sim.hold_elsewhere("jobs-4");
    sim.hold_elsewhere("jobs-5");
    let mark = sim.mark();
    for row in [3, 4] {
        let d = sim.delivery(0, row);
        sim.settle(0, d, Outcome::Ack);
    }
    sim.run();
    let looks = sim.runs_of(0, mark, StatementKind::Candidates).len();
    let floors: Vec<i64> = sim
        .floors(0, mark, StatementKind::Candidates)
        .iter()
        .filter_map(Value::as_int)
        .collect();
    assert!(
        looks >= 2,
        "a look found the held keys, then another: {looks} looks"
    );
    assert_eq!(
        floors.len(),
        looks,
        "every look starts past the rows taken before it: {floors:?} of {looks} looks"
    );
    assert!(floors.iter().all(|&f| f > 2), "{floors:?}");
    let taken = sim.delivered_rows(0, mark);
    assert!(
        taken.contains(&7) && !taken.contains(&5) && !taken.contains(&6),
        "the rows of free keys past the held ones: {taken:?}"
    );
}

/// A claim whose first look, from the table's start, finds only keys held elsewhere looks
/// again from the floor that look set, not from the start once more: what lies below the
/// floor the first look has read, and each look from the start passes every index entry the
/// rows taken before it left.
#[test]
fn advisory_a_second_look_after_one_from_the_start_starts_at_the_floor() {
    let mut sim = advisory_with_rows_3_and_4_in_work();
    for key in ["jobs-4", "jobs-5", "jobs-6", "jobs-7"] {
        sim.hold_elsewhere(key);
    }
    // Past the time by which a claim starts from the table's start again.
    sim.advance(Duration::from_secs(2));
    let mark = sim.mark();
    for row in [3, 4] {
        let d = sim.delivery(0, row);
        sim.settle(0, d, Outcome::Ack);
    }
    sim.run();
    // Each look with its claim's connection, and where it started (`None`: the start).
    let looks: Vec<(ConnId, Option<i64>)> = sim
        .runs_of(0, mark, StatementKind::Candidates)
        .iter()
        .map(|r| {
            let floor = r.statement.as_ref().and_then(|st| {
                let i = st.args.iter().position(|a| *a == Arg::Floor)?;
                r.binds[i].as_int()
            });
            (r.conn, floor)
        })
        .collect();
    let (conn, first) = looks[0];
    assert!(
        first.is_none(),
        "the first look is from the start: {looks:?}"
    );
    let again: Vec<Option<i64>> = looks[1..]
        .iter()
        .filter(|(c, _)| *c == conn)
        .map(|(_, f)| *f)
        .collect();
    assert!(
        !again.is_empty(),
        "it found the held keys' rows only, and its claim looked again: {looks:?}"
    );
    assert!(
        again.iter().all(|f| f.is_some_and(|f| f > 2)),
        "the looks after it start past the rows taken before: {looks:?}"
    );
    let taken = sim.delivered_rows(0, mark);
    assert!(
        taken.contains(&9) && taken.iter().all(|row| !(5..=8).contains(row)),
        "the rows of free keys past the held ones: {taken:?}"
    );
}

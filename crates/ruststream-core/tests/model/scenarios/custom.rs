//! Custom locks, `custom(lock, unlock)`: the service's own lock and unlock run instead of the
//! database's advisory statements.

use super::*;

/// "custom(lock, unlock) hands the lock and the release of each key to the service's SQL."
#[test]
fn custom_lock_runs_the_services_lock_and_unlock_instead_of_statements() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, custom(), 1, &[0]);
        let conn = sim.conn_of(0, 1);
        let mut claim = vec![
            Acquire,
            Exec(StatementKind::Candidates),
            Op::Lock("jobs-0".into()),
        ];
        claim.extend(take_ops(dialect));
        assert_eq!(sim.ops_on(0, conn, 0), claim, "{dialect:?}");
        assert_eq!(sim.db.custom.get("jobs-0"), Some(&sim.sess_of(0, conn)));
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.ops_on(0, conn, mark),
            [delete(false), Op::Unlock("jobs-0".into()), Release],
            "{dialect:?}"
        );
        assert_eq!(sim.executed(StatementKind::TryLock), 0, "{dialect:?}");
        assert_eq!(sim.executed(StatementKind::Unlock), 0, "{dialect:?}");
        assert!(sim.db.custom.is_empty());
        assert!(sim.db.advisory.is_empty());
    }
}

/// "lock tries the key without waiting and answers whether it took it": false takes nothing.
#[test]
fn custom_lock_answering_false_takes_nothing() {
    for dialect in ALL {
        let mut sim = Sim::new(dialect, custom(), 2);
        sim.insert(0);
        sim.insert(1);
        let other = sim.db.acquire(OTHER_SYSTEM);
        sim.db.custom.insert("jobs-0".into(), other);
        sim.spawn();
        sim.run();
        sim.advance(POLL * 3);
        let locks: Vec<(Op, Reply<i64>)> = sim
            .runs(0, 0)
            .iter()
            .filter(|r| matches!(r.op, Op::Lock(_)))
            .map(|r| (r.op.clone(), r.reply.clone()))
            .collect();
        assert!(locks.len() >= 2, "{dialect:?}: every claim asks: {locks:?}");
        assert!(
            locks
                .iter()
                .all(|l| *l == (Op::Lock("jobs-0".into()), Reply::Bool(false))),
            "{dialect:?}: {locks:?}"
        );
        assert!(sim.delivered(0, 0).is_empty(), "{dialect:?}");
        assert_eq!(sim.executed(take_kind(dialect)), 0, "{dialect:?}: no take");
        assert_eq!(sim.row(1).attempt, 0);
        assert_eq!(
            sim.row(2).attempt,
            0,
            "{dialect:?}: the first due rows alone"
        );
        assert_eq!(sim.procs[0].broker.held_connections(), 0);
        // The service's lock lets go: the next claim takes the row.
        sim.db.custom.clear();
        sim.advance(POLL);
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
    }
}

/// "unlock answers whether the session held the key; an answer of false ... closes the
/// connection, which ends the session and its locks."
#[test]
fn custom_unlock_answering_false_closes_the_connection() {
    for dialect in ALL {
        for outcome in [Outcome::Ack, Outcome::Retry] {
            let mut sim = Sim::start(dialect, custom(), 1, &[0]);
            let delivery = sim.delivery(0, 1);
            let conn = sim.conn_of(0, 1);
            let sess = sim.sess_of(0, conn);
            // The service's state lost the key meanwhile.
            sim.db.custom.clear();
            let mark = sim.mark();
            sim.settle(0, delivery, outcome);
            sim.run();
            let mut expected = Vec::new();
            if outcome == Outcome::Ack {
                expected.push(delete(false));
            }
            expected.extend([Op::Unlock("jobs-0".into()), Close]);
            assert_eq!(
                sim.ops_on(0, conn, mark),
                expected,
                "{dialect:?} {outcome:?}"
            );
            assert!(
                !sim.db.sessions[&sess].alive,
                "{dialect:?}: the session ended"
            );
            assert!(sim.db.custom.values().all(|s| *s != sess));
            assert!(!sim.procs[0].adapter.conns.contains_key(&conn));
        }
    }
}

/// "... or an error, closes the connection."
#[test]
fn custom_unlock_error_closes_the_connection() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, custom(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let sess = sim.sess_of(0, conn);
        sim.hook(|_, c| match c.action {
            Action::Unlock { .. } => Intercept::Answer(Reply::Failed(DbError::new(
                ErrorKind::Other,
                "the service's unlock failed",
            ))),
            _ => Intercept::Run,
        });
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Retry);
        sim.run();
        assert_eq!(
            sim.ops_on(0, conn, mark),
            [Op::Unlock("jobs-0".into()), Close],
            "{dialect:?}"
        );
        assert!(!sim.db.sessions[&sess].alive);
        assert!(
            sim.db.custom.values().all(|s| *s != sess),
            "{dialect:?}: the session's locks ended"
        );
        assert!(
            sim.events(0, mark)
                .iter()
                .any(|e| matches!(e, Event::Error { .. })),
            "{dialect:?}"
        );
        // The row returns.
        sim.hook = None;
        sim.advance(POLL);
        let again = only(sim.delivered(0, mark));
        assert_eq!(
            (again.row, again.attempt),
            (Some(1), Some(2)),
            "{dialect:?}"
        );
    }
}

/// An unlock inside a claim (the row was no longer claimable) that answers false closes the
/// claim's connection too.
#[test]
fn custom_unlock_answering_false_in_a_claim_closes_its_connection() {
    for dialect in ALL {
        let mut sim = Sim::new(dialect, custom(), 1);
        sim.insert(0);
        sim.spawn();
        let take = sim.run_until(0, |c| kind_of(c) == Some(take_kind(dialect)));
        // Between the candidates and the take, the row went away and the key with it.
        sim.db.rows.remove(&1);
        sim.db.custom.clear();
        let mark = sim.mark();
        sim.run();
        assert_eq!(
            sim.ops_on(0, take.conn, mark),
            [Exec(take_kind(dialect)), Op::Unlock("jobs-0".into()), Close],
            "{dialect:?}"
        );
        assert_eq!(sim.procs[0].broker.held_connections(), 0);
        assert!(sim.delivered(0, 0).is_empty());
    }
}

/// "The dialect still selects the candidates and takes each row, so the claim keeps its order
/// and counts the attempt as before."
#[test]
fn custom_lock_keeps_the_claim_order_and_counts_the_attempt() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, custom(), 1, &[5, 3]);
        let d = only(sim.delivered(0, 0));
        assert_eq!(d.row, Some(1), "{dialect:?}: the first in claim order");
        assert_eq!(d.key.as_deref(), Some("jobs-5"));
        assert_eq!(d.attempt, Some(1), "{dialect:?}");
        assert_eq!(sim.row(1).attempt, 1);
        assert_eq!(sim.executed(StatementKind::Candidates), 1);
        assert_eq!(sim.executed(take_kind(dialect)), 1, "{dialect:?}");
        // The take committed: a crash spends the attempt.
        sim.crash(0);
        let second = sim.spawn();
        sim.run();
        let again = only(sim.delivered(second, 0));
        assert_eq!(
            (again.row, again.attempt),
            (Some(1), Some(2)),
            "{dialect:?}"
        );
    }
}

/// "The process keeps no registry of keys for such a table, on SQLite too: the service's lock
/// decides."
#[test]
fn custom_lock_keeps_no_registry_of_keys_on_sqlite_either() {
    let mut sim = Sim::start(Dialect::Sqlite, custom(), 2, &[0, 0]);
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    sim.advance(POLL * 3);
    // The key in work is asked of the service's lock again by every claim, not skipped.
    let asks = sim
        .runs(0, 0)
        .iter()
        .filter(|r| r.op == Op::Lock("jobs-0".into()))
        .count();
    assert!(asks >= 3, "{asks} locks asked");
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    // Where the service's lock says yes, the claim takes the row: nothing in the process
    // stands in the way. (Here the service releases the key behind the delivery's back.)
    let delivery = sim.delivery(0, 1);
    sim.settle(0, delivery, Outcome::Ack);
    sim.run();
    sim.advance(POLL);
    assert_eq!(sim.delivered_rows(0, 0), [1, 2]);
    // A SQLite table of the registry form never asks.
    let mut registry = Sim::start(Dialect::Sqlite, advisory(), 2, &[0, 0]);
    registry.advance(POLL * 3);
    assert!(
        !registry
            .runs(0, 0)
            .iter()
            .any(|r| matches!(r.op, Op::Lock(_)))
    );
}

/// "A claim reads the first due rows alone and takes nothing while their keys are held, so the
/// next row waits up to a poll interval."
#[test]
fn custom_lock_next_row_waits_up_to_a_poll_interval() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, custom(), 3, &[0, 1, 2]);
        sim.advance(Duration::from_millis(3500));
        assert_eq!(
            sim.delivered_rows(0, 0),
            [1],
            "{dialect:?}: rows 2 and 3 have free keys, but are not the first due"
        );
        for claim in sim.runs_of(0, 0, StatementKind::Candidates) {
            assert_eq!(claim.bind(Arg::Limit), Value::Int(1), "{dialect:?}");
        }
        // Each poll's claim meanwhile found the first due row's key held, and took nothing.
        assert!(
            sim.runs_of(0, 0, StatementKind::Candidates).len() >= 3,
            "{dialect:?}"
        );
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        let settled_at = sim.now;
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        // The unlock that answered true starts the next claim at once.
        assert_eq!(sim.delivered_rows(0, mark), [2], "{dialect:?}");
        assert_eq!(
            sim.delivered_at(0, mark, 2),
            Some(settled_at),
            "{dialect:?}"
        );
    }
}

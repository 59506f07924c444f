//! Kept connections (`CONNECTION_LINGER`): a connection a flow gives back serves the next flow,
//! and goes back to the pool after the linger, unless its state is in doubt.

use super::*;

/// A process with the default linger on a table with these channels, started and run.
fn start_lingering(dialect: Dialect, desc: TableDesc, workers: usize, channels: &[i64]) -> Sim {
    let mut sim = Sim::new(dialect, desc, workers);
    sim.linger = CONNECTION_LINGER;
    for &channel in channels {
        sim.insert(channel);
    }
    sim.spawn();
    sim.run();
    sim
}

/// A connection a flow gives back serves the next flow without the pool, and goes back to
/// the pool once it has been idle for the linger.
#[test]
fn a_kept_connection_serves_the_next_flow_and_goes_back_to_the_pool_after_the_linger() {
    for dialect in ALL {
        let mut sim = start_lingering(dialect, lease(), 1, &[0, 1]);
        // The check's connection runs the first claim: one acquire, nothing given back yet.
        let ops = sim.ops(0, 0);
        assert_eq!(count(&ops, &Acquire), 1, "{dialect:?}: {ops:?}");
        assert_eq!(count(&ops, &Release), 0, "{dialect:?}: {ops:?}");
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
        assert_eq!(sim.procs[0].broker.held_connections(), 1, "{dialect:?}");
        // The settlement runs on the kept connection. On the servers the claim beside it, for
        // the worker the settlement freed, asks the pool, and the settlement's connection,
        // given back while that acquire waits, goes to the pool, where the acquire finds it.
        // On SQLite the claim follows the settlement, on the kept connection.
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let ops = sim.ops(0, mark);
        let beside = usize::from(dialect != Dialect::Sqlite);
        assert_eq!(ops[0], delete(true), "{dialect:?}: {ops:?}");
        assert_eq!(count(&ops, &Acquire), beside, "{dialect:?}: {ops:?}");
        assert_eq!(count(&ops, &Release), beside, "{dialect:?}: {ops:?}");
        assert_eq!(sim.delivered_rows(0, mark), [2], "{dialect:?}");
        // Idle: kept for the linger, not a moment less, then given back.
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 2), Outcome::Ack);
        sim.run();
        let idle_from = sim.now;
        let kept = sim.procs[0].broker.held_connections();
        assert!(kept >= 1, "{dialect:?}: {:?}", sim.ops(0, mark));
        let released = count(&sim.ops(0, mark), &Release);
        assert_eq!(sim.timeout(0), Some(idle_from.plus(CONNECTION_LINGER)));
        sim.advance_to(just_before(idle_from.plus(CONNECTION_LINGER)));
        assert_eq!(count(&sim.ops(0, mark), &Release), released, "{dialect:?}");
        sim.advance_to(idle_from.plus(CONNECTION_LINGER));
        assert_eq!(
            count(&sim.ops(0, mark), &Release),
            released + kept,
            "{dialect:?}"
        );
        assert_eq!(sim.procs[0].broker.held_connections(), 0, "{dialect:?}");
        assert!(sim.db.held_by(1).is_empty(), "{dialect:?}");
    }
}

/// `Duration::ZERO` keeps nothing: each flow acquires and releases its own connection.
#[test]
fn a_zero_linger_gives_every_connection_back_at_once() {
    let mut sim = Sim::start(Dialect::Postgres, lease(), 1, &[0]);
    let mark = sim.mark();
    sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
    sim.run();
    assert_eq!(
        sim.first_flow_ops(0, mark),
        [Acquire, delete(true), Release],
        "{:?}",
        sim.ops(0, mark)
    );
    assert_eq!(sim.procs[0].broker.held_connections(), 0);
}

/// A connection whose statement failed is closed at once, not kept, and the next flow
/// acquires another.
#[test]
fn a_connection_whose_statement_failed_is_closed_not_kept() {
    for dialect in ALL {
        let mut sim = start_lingering(dialect, lease(), 1, &[0]);
        sim.hook(|_, command| match &command.action {
            Action::Execute { statement, .. }
                if statement.kind == StatementKind::Delete { fenced: true } =>
            {
                Intercept::Answer(Reply::Failed(DbError::new(
                    ErrorKind::Other,
                    "the disk is full",
                )))
            }
            _ => Intercept::Run,
        });
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let ops = sim.ops(0, mark);
        assert_eq!(
            sim.first_flow_ops(0, mark),
            [delete(true), Close],
            "{dialect:?}: {ops:?}"
        );
        // The claim beside it, and every flow after, runs its statements on another.
        let failed = sim.runs(0, mark)[0].conn;
        let after = sim.runs(0, mark);
        assert!(
            after
                .iter()
                .skip(1)
                .all(|r| r.conn != failed || r.op == Close),
            "{dialect:?}: {ops:?}"
        );
        assert!(ops.contains(&Acquire), "{dialect:?}: {ops:?}");
    }
}

/// A connection whose transaction is in doubt is not kept: a `COMMIT` that failed may leave the
/// row lock's transaction open on MySQL, so the connection closes.
#[test]
fn a_connection_whose_commit_failed_is_closed_not_kept() {
    for dialect in SERVERS {
        let mut sim = start_lingering(dialect, row_lock(), 1, &[0]);
        let conn = sim.conn_of(0, 1);
        sim.hook(|_, command| match &command.action {
            Action::Execute { statement, .. } if statement.kind == StatementKind::Commit => {
                Intercept::Answer(Reply::Failed(DbError::new(
                    ErrorKind::Other,
                    "the commit failed",
                )))
            }
            _ => Intercept::Run,
        });
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let ops = sim.ops_on(0, conn, mark);
        assert_eq!(ops.last(), Some(&Close), "{dialect:?}: {ops:?}");
    }
}

/// The row lock's connection, once its settlement committed, serves the next claim.
#[test]
fn a_committed_row_lock_connection_serves_the_next_claim() {
    for dialect in SERVERS {
        let mut sim = start_lingering(dialect, row_lock(), 1, &[0, 1]);
        let conn = sim.conn_of(0, 1);
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        assert_eq!(sim.delivered_rows(0, mark), [2], "{dialect:?}");
        assert_eq!(sim.conn_of(0, 2), conn, "{dialect:?}");
        let ops = sim.ops(0, mark);
        assert!(
            !ops.contains(&Acquire) && !ops.contains(&Release),
            "{dialect:?}: {ops:?}"
        );
        assert!(sim.db.sessions[&sim.sess_of(0, conn)].in_tx, "{dialect:?}");
    }
}

/// A connection that ran the service's own lock is not kept: what the lock left in the
/// session is the service's.
#[test]
fn a_connection_that_ran_a_custom_lock_is_not_kept() {
    for dialect in ALL {
        let mut sim = start_lingering(dialect, custom(), 1, &[0]);
        let conn = sim.conn_of(0, 1);
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.ops_on(0, conn, mark),
            [delete(false), Op::Unlock("jobs-0".into()), Release],
            "{dialect:?}"
        );
    }
}

/// While an acquire waits for the pool, a connection given back goes to the pool, where that
/// acquire finds it, rather than waiting out the linger.
#[test]
fn a_connection_given_back_while_an_acquire_waits_goes_to_the_pool() {
    // MySQL: each settlement runs a statement of its own (no batch: `DELETE` returns no ids).
    let mut sim = start_lingering(Dialect::MySql, lease(), 2, &[0, 1]);
    assert_eq!(sim.delivered_rows(0, 0), [1, 2]);
    let kept = sim.runs(0, 0)[0].conn;
    // The pool has no connection to give: acquires wait.
    sim.hook(|_, command| match command.action {
        Action::Acquire => Intercept::Hold,
        _ => Intercept::Run,
    });
    let mark = sim.mark();
    sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
    sim.settle(0, sim.delivery(0, 2), Outcome::Ack);
    sim.run();
    let waiting = sim.take_held(0);
    assert!(
        waiting
            .iter()
            .all(|c| c.conn != kept && c.action == Action::Acquire),
        "one settlement took the kept connection, the other waits: {waiting:?}"
    );
    assert!(!waiting.is_empty());
    assert_eq!(
        sim.ops_on(0, kept, mark),
        [delete(true), Release],
        "given back to the pool at once"
    );
    sim.hook(|_, _| Intercept::Run);
    for command in waiting {
        sim.run_command(0, command);
    }
    sim.run();
    assert!(sim.db.rows.is_empty());
}

/// The shutdown gives every kept connection back before the broker closes.
#[test]
fn the_shutdown_gives_kept_connections_back() {
    for dialect in ALL {
        let mut sim = start_lingering(dialect, lease(), 1, &[0]);
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        assert_eq!(sim.procs[0].broker.held_connections(), 1, "{dialect:?}");
        let mark = sim.mark();
        sim.shutdown(0);
        sim.run();
        assert_eq!(sim.ops(0, mark), [Release], "{dialect:?}");
        assert_eq!(sim.closed(0).len(), 1, "{dialect:?}");
        assert_eq!(sim.procs[0].broker.held_connections(), 0, "{dialect:?}");
        assert!(sim.db.held_by(1).is_empty(), "{dialect:?}");
    }
}

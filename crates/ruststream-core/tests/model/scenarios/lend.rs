//! A handler takes a transaction on its delivery's connection: the row lock form lends its
//! claim's open transaction past a savepoint, the advisory lock form a transaction begun where
//! the key is held, the lease form one begun on a connection taken for it. An acknowledgement
//! commits the handler's writes with the settlement; a retry or a failure undoes them first.

use super::*;
use ruststream_core::Settlement;

impl Sim {
    fn lend(&mut self, p: usize, delivery: DeliveryId) {
        self.procs[p].broker.lend_transaction(delivery, self.now);
        self.poll(p);
    }

    fn lent(&self, p: usize, since: usize) -> Vec<(DeliveryId, Option<ConnId>)> {
        self.events(p, since)
            .into_iter()
            .filter_map(|e| match e {
                Event::Lent { delivery, conn } => Some((delivery, conn)),
                _ => None,
            })
            .collect()
    }
}

/// The savepoint runs on the connection that holds the row, and that connection is lent; the
/// acknowledgement then deletes and commits on it, with no rollback to the savepoint.
#[test]
fn a_lent_transaction_commits_with_the_acknowledgement() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let mark = sim.mark();
        sim.lend(0, delivery);
        sim.run();
        assert_eq!(sim.lent(0, mark), [(delivery, Some(conn))], "{dialect:?}");
        assert_eq!(
            sim.ops_on(0, conn, mark),
            [Exec(StatementKind::Savepoint)],
            "{dialect:?}: the savepoint, and nothing else while the handler holds it"
        );
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.ops_on(0, conn, mark),
            [delete(false), Exec(StatementKind::Commit), Release],
            "{dialect:?}"
        );
        assert!(!sim.db.rows.contains_key(&1), "{dialect:?}");
    }
}

/// A retry or a rejection rolls back to the savepoint before it writes and commits: the
/// handler's writes go, the row's due time, error or failure stay.
#[test]
fn a_lent_transaction_rolls_back_to_its_savepoint_on_a_retry_or_a_failure() {
    for outcome in [Outcome::Retry, Outcome::Reject] {
        let mut sim = Sim::start(Dialect::Postgres, row_lock(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        sim.lend(0, delivery);
        sim.run();
        let mark = sim.mark();
        sim.procs[0].broker.settle_with(
            delivery,
            Settlement::new(outcome)
                .delay(Duration::from_secs(5))
                .error("the mail server is down"),
            sim.now,
        );
        sim.poll(0);
        sim.run();
        let ops = sim.ops_on(0, conn, mark);
        assert_eq!(
            ops.first(),
            Some(&Exec(StatementKind::RollbackToSavepoint)),
            "{outcome:?}: {ops:?}"
        );
        assert!(
            ops.contains(&Exec(StatementKind::Commit)),
            "{outcome:?}: the retry's write commits after it: {ops:?}"
        );
    }
}

/// A dropped handler's transaction rolls back whole; a second lend, a lend of a delivery no
/// longer in work, and a lend in another form answer no connection.
#[test]
fn only_a_row_lock_delivery_in_work_lends_its_transaction_once() {
    let mut sim = Sim::start(Dialect::Postgres, row_lock(), 1, &[0]);
    let delivery = sim.delivery(0, 1);
    let conn = sim.conn_of(0, 1);
    sim.lend(0, delivery);
    sim.run();
    let mark = sim.mark();
    sim.lend(0, delivery);
    assert_eq!(sim.lent(0, mark), [(delivery, None)], "lent once");
    let mark = sim.mark();
    sim.drop_delivery(0, delivery);
    sim.run();
    assert_eq!(
        sim.ops_on(0, conn, mark)[..1],
        [Exec(StatementKind::Rollback)],
        "a drop rolls back whole"
    );
    let mark = sim.mark();
    sim.lend(0, delivery);
    assert_eq!(sim.lent(0, mark), [(delivery, None)], "no longer in work");

    let mut sim = Sim::start(Dialect::Sqlite, lease(), 1, &[0]);
    let delivery = sim.delivery(0, 1);
    let mark = sim.mark();
    sim.lend(0, delivery);
    assert_eq!(
        sim.lent(0, mark),
        [(delivery, None)],
        "SQLite's lease form lends nothing"
    );
}

/// The lease form begins a transaction on a connection taken for it: an acknowledgement's
/// settlement runs in it, fenced by the lease, and commits with the handler's writes; a retry
/// rolls it back, then gives the lease back on the same connection.
#[test]
fn a_lease_delivery_lends_a_transaction_on_a_connection_of_its_own() {
    for dialect in SERVERS {
        for outcome in [Outcome::Ack, Outcome::Retry] {
            let mut sim = Sim::start(dialect, lease(), 1, &[0]);
            let delivery = sim.delivery(0, 1);
            let mark = sim.mark();
            sim.lend(0, delivery);
            sim.run();
            let lent = sim.lent(0, mark);
            let [(lent_delivery, Some(conn))] = lent[..] else {
                panic!("{dialect:?}: one connection lent: {lent:?}");
            };
            assert_eq!(lent_delivery, delivery);
            assert_eq!(
                sim.ops_on(0, conn, mark),
                [Acquire, Exec(StatementKind::Begin)],
                "{dialect:?}: a connection of its own, in a transaction"
            );
            let mark = sim.mark();
            sim.settle(0, delivery, outcome);
            sim.run();
            let ops = sim.ops_on(0, conn, mark);
            let expected = match outcome {
                Outcome::Ack => vec![delete(true), Exec(StatementKind::Commit), Release],
                _ => vec![Exec(StatementKind::Rollback)],
            };
            assert_eq!(
                ops[..expected.len()],
                expected[..],
                "{dialect:?} {outcome:?}: {ops:?}"
            );
            assert_eq!(
                ops.last(),
                Some(&Release),
                "{dialect:?} {outcome:?}: {ops:?}"
            );
            assert!(
                sim.events(0, mark)
                    .contains(&Event::Settled { delivery, outcome }),
                "{dialect:?} {outcome:?}"
            );
            assert_eq!(sim.db.rows.contains_key(&1), outcome != Outcome::Ack);
        }
    }
}

/// A lease lost while the handler wrote in the lent transaction: the fenced settlement finds
/// no row, the transaction rolls back with the handler's writes, and the settlement fails.
#[test]
fn a_lent_transaction_whose_lease_was_lost_rolls_back() {
    let mut sim = Sim::start(Dialect::Postgres, lease(), 1, &[0]);
    let delivery = sim.delivery(0, 1);
    let mark = sim.mark();
    sim.lend(0, delivery);
    sim.run();
    let [(_, Some(conn))] = sim.lent(0, mark)[..] else {
        panic!("one connection lent");
    };
    // Another process took the row after the lease ran out.
    if let Some(row) = sim.db.rows.get_mut(&1) {
        row.locked_until = Some(i64::MAX);
    }
    let mark = sim.mark();
    sim.settle(0, delivery, Outcome::Ack);
    sim.run();
    assert_eq!(
        sim.ops_on(0, conn, mark),
        [delete(true), Exec(StatementKind::Rollback), Release]
    );
    assert!(sim.events(0, mark).contains(&Event::SettleFailed {
        delivery,
        error: ruststream_core::SettleError::LeaseLost
    }));
    assert!(
        sim.db.rows.contains_key(&1),
        "the row stays, with the other's lease"
    );
}

/// A handler that asks while its lease is being extended gets its transaction once the
/// extension has answered; extensions run on connections of their own while it is lent.
#[test]
fn a_lend_asked_for_during_an_extension_begins_after_it() {
    let mut sim = Sim::start(Dialect::Postgres, lease(), 1, &[0]);
    let delivery = sim.delivery(0, 1);
    sim.hook(|_, c| match &c.action {
        Action::Execute { statement, .. } if statement.kind == StatementKind::ExtendLease => {
            Intercept::Hold
        }
        _ => Intercept::Run,
    });
    sim.advance(LEASE_TIME);
    let extend = sim.take_held(0);
    assert_eq!(extend.len(), 1, "one extension held");
    sim.hook(|_, _| Intercept::Run);
    let mark = sim.mark();
    sim.lend(0, delivery);
    sim.run();
    assert!(sim.lent(0, mark).is_empty(), "not while the extension runs");
    for command in extend {
        sim.run_command(0, command);
    }
    sim.poll(0);
    sim.run();
    let lent = sim.lent(0, mark);
    let [(_, Some(conn))] = lent[..] else {
        panic!("lent after the extension: {lent:?}");
    };
    let next = sim.timeout(0).expect("the next extension");
    let mark = sim.mark();
    sim.advance_to(next);
    sim.run();
    assert!(
        sim.ops(0, mark).contains(&Exec(StatementKind::ExtendLease)),
        "the lease is extended while the transaction is lent"
    );
    assert!(
        sim.ops_on(0, conn, mark).is_empty(),
        "not on the lent connection"
    );
}

/// The advisory lock form begins a transaction on the connection that holds the key: an
/// acknowledgement's statement runs in it and commits, then the key is released; a retry
/// rolls it back first.
#[test]
fn an_advisory_delivery_lends_a_transaction_on_its_keys_connection() {
    for (outcome, expected) in [
        (
            Outcome::Ack,
            vec![
                Exec(StatementKind::Delete { fenced: false }),
                Exec(StatementKind::Commit),
            ],
        ),
        (Outcome::Retry, vec![Exec(StatementKind::Rollback)]),
    ] {
        let mut sim = Sim::start(Dialect::Postgres, advisory(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let mark = sim.mark();
        sim.lend(0, delivery);
        sim.run();
        assert_eq!(sim.lent(0, mark), [(delivery, Some(conn))], "{outcome:?}");
        assert_eq!(
            sim.ops_on(0, conn, mark),
            [Exec(StatementKind::Begin)],
            "{outcome:?}"
        );
        let mark = sim.mark();
        sim.settle(0, delivery, outcome);
        sim.run();
        let ops = sim.ops_on(0, conn, mark);
        assert_eq!(ops[..expected.len()], expected[..], "{outcome:?}: {ops:?}");
        assert!(
            ops.contains(&Exec(StatementKind::Unlock)),
            "{outcome:?}: the key is released after: {ops:?}"
        );
        assert!(
            sim.events(0, mark)
                .contains(&Event::Settled { delivery, outcome }),
            "{outcome:?}"
        );
    }
}

//! Lease settlements asked for while one runs settle together in one statement; a lost lease
//! fails alone, a failed batch fails each, a deadlock runs it again.

use super::*;

/// Settlements asked for while another of the subscription's runs wait for it, then settle
/// together in one statement, each fenced by its own lease.
#[test]
fn lease_settlements_asked_for_while_one_runs_settle_together() {
    for dialect in [Dialect::Postgres, Dialect::MariaDb, Dialect::Sqlite] {
        let mut sim = Sim::start(dialect, lease(), 4, &[0, 1, 2, 3]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 2, 3, 4], "{dialect:?}");
        hold_first_settlement(&mut sim);
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let first = sim.take_held(0);
        assert_eq!(first.len(), 1, "{dialect:?}");
        for row in [2, 3, 4] {
            sim.settle(0, sim.delivery(0, row), Outcome::Ack);
        }
        sim.run();
        assert!(
            !sim.ops(0, mark).iter().any(|o| matches!(
                o,
                Exec(StatementKind::Delete { .. } | StatementKind::SettleLeases(_))
            )),
            "{dialect:?}: the three wait for the first: {:?}",
            sim.ops(0, mark)
        );
        assert_eq!(
            sim.in_work(0),
            4,
            "{dialect:?}: still in work until settled"
        );
        for command in first {
            sim.run_command(0, command);
        }
        sim.run();
        let batch = only(sim.runs_of(0, mark, StatementKind::SettleLeases(3)));
        let ids: Vec<Value> = (0..3).map(|i| batch.bind(Arg::IdAt(i))).collect();
        assert_eq!(
            ids,
            [Value::Int(2), Value::Int(3), Value::Int(4)],
            "{dialect:?}"
        );
        for (i, row) in [2, 3, 4].into_iter().enumerate() {
            assert_eq!(
                batch.bind(Arg::FenceAt(i)),
                Value::Int(T0.plus(LEASE_TIME).micros()),
                "{dialect:?}: row {row} fenced by its lease"
            );
        }
        assert_eq!(
            sim.runs_of(0, mark, StatementKind::Delete { fenced: true })
                .len(),
            1
        );
        let settled: Vec<DeliveryId> = sim
            .events(0, mark)
            .into_iter()
            .filter_map(|e| match e {
                Event::Settled {
                    delivery,
                    outcome: Outcome::Ack,
                } => Some(delivery),
                _ => None,
            })
            .collect();
        assert_eq!(settled.len(), 4, "{dialect:?}: {:?}", sim.events(0, mark));
        assert!(sim.db.rows.is_empty(), "{dialect:?}");
        assert_eq!(sim.in_work(0), 0, "{dialect:?}");
    }
}

/// In a batch, a row whose lease another claim took is not settled: that delivery alone
/// fails with `LeaseLost`, the others settle.
#[test]
fn a_lost_lease_in_a_settlement_batch_fails_alone() {
    for dialect in [Dialect::Postgres, Dialect::MariaDb, Dialect::Sqlite] {
        let mut sim = Sim::start(dialect, lease(), 3, &[0, 1, 2]);
        hold_first_settlement(&mut sim);
        let mark = sim.mark();
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let first = sim.take_held(0);
        let (two, three) = (sim.delivery(0, 2), sim.delivery(0, 3));
        sim.settle(0, two, Outcome::Ack);
        sim.settle(0, three, Outcome::Ack);
        // Another process's lease on row 3.
        let theirs = T0.plus(LEASE_TIME * 3).micros();
        sim.db.rows.get_mut(&3).expect("row 3").locked_until = Some(theirs);
        for command in first {
            sim.run_command(0, command);
        }
        sim.run();
        assert_eq!(
            sim.runs_of(0, mark, StatementKind::SettleLeases(2)).len(),
            1,
            "{dialect:?}"
        );
        let events = sim.events(0, mark);
        assert!(
            events.contains(&Event::Settled {
                delivery: two,
                outcome: Outcome::Ack
            }),
            "{dialect:?}: {events:?}"
        );
        assert!(
            events.contains(&Event::SettleFailed {
                delivery: three,
                error: SettleError::LeaseLost
            }),
            "{dialect:?}: {events:?}"
        );
        assert!(!sim.db.rows.contains_key(&2));
        assert_eq!(
            sim.row(3).locked_until,
            Some(theirs),
            "{dialect:?}: untouched"
        );
    }
}

/// A batch whose statement fails fails every settlement in it, closes its connection, and
/// the settlements that waited behind it still run.
#[test]
fn a_failed_settlement_batch_fails_each_of_its_settlements() {
    for dialect in [Dialect::Postgres, Dialect::Sqlite] {
        let mut sim = Sim::start(dialect, lease(), 3, &[0, 1, 2]);
        hold_first_settlement(&mut sim);
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let first = sim.take_held(0);
        let (two, three) = (sim.delivery(0, 2), sim.delivery(0, 3));
        sim.settle(0, two, Outcome::Ack);
        sim.settle(0, three, Outcome::Ack);
        sim.hook(|_, command| match &command.action {
            Action::Execute { statement, .. }
                if matches!(statement.kind, StatementKind::SettleLeases(_)) =>
            {
                Intercept::Answer(Reply::Failed(DbError::new(
                    ErrorKind::Other,
                    "the disk is full",
                )))
            }
            _ => Intercept::Run,
        });
        let mark = sim.mark();
        for command in first {
            sim.run_command(0, command);
        }
        sim.run();
        let events = sim.events(0, mark);
        for delivery in [two, three] {
            assert!(
                events.iter().any(|e| matches!(
                    e,
                    Event::SettleFailed { delivery: d, error: SettleError::Db(_) } if *d == delivery
                )),
                "{dialect:?}: {events:?}"
            );
        }
        assert!(sim.ops(0, mark).contains(&Close), "{dialect:?}");
        assert_eq!(sim.in_work(0), 0, "{dialect:?}");
        assert!(sim.db.rows.contains_key(&2) && sim.db.rows.contains_key(&3));
    }
}

/// A settlement batch that a deadlock rolled back (PostgreSQL's 40P01, MySQL's 1213: a
/// batch's row locks against a claim's) runs again at once on its connection, with the
/// settlements it carried: every row settles, none waits for its lease to run out.
#[test]
fn a_settlement_batch_a_deadlock_rolled_back_runs_again_at_once() {
    for dialect in [Dialect::Postgres, Dialect::Sqlite] {
        let mut sim = Sim::start(dialect, lease(), 3, &[0, 1, 2]);
        hold_first_settlement(&mut sim);
        sim.settle(0, sim.delivery(0, 1), Outcome::Ack);
        sim.run();
        let first = sim.take_held(0);
        let (two, three) = (sim.delivery(0, 2), sim.delivery(0, 3));
        sim.settle(0, two, Outcome::Ack);
        sim.settle(0, three, Outcome::Ack);
        let mut deadlocked = false;
        sim.hook(move |_, command| match &command.action {
            Action::Execute { statement, .. }
                if !deadlocked && matches!(statement.kind, StatementKind::SettleLeases(_)) =>
            {
                deadlocked = true;
                Intercept::Answer(Reply::Failed(DbError::new(
                    ErrorKind::Serialization,
                    "deadlock detected",
                )))
            }
            _ => Intercept::Run,
        });
        let mark = sim.mark();
        for command in first {
            sim.run_command(0, command);
        }
        sim.run();
        let runs = sim.runs_of(0, mark, StatementKind::SettleLeases(2));
        assert_eq!(runs.len(), 2, "{dialect:?}: the batch ran again");
        assert_eq!(runs[0].conn, runs[1].conn, "{dialect:?}: on its connection");
        let events = sim.events(0, mark);
        for delivery in [two, three] {
            assert!(
                events.contains(&Event::Settled {
                    delivery,
                    outcome: Outcome::Ack
                }),
                "{dialect:?}: {events:?}"
            );
        }
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, Event::SettleFailed { .. })),
            "{dialect:?}: {events:?}"
        );
        assert!(!sim.ops(0, mark).contains(&Close), "{dialect:?}");
        assert!(sim.db.rows.is_empty(), "{dialect:?}");
        assert_eq!(sim.in_work(0), 0, "{dialect:?}");
    }
}

/// A settlement that keeps deadlocking runs again three times, then fails as any failed
/// settlement does: its connection closes, and its row waits for its lease.
#[test]
fn a_settlement_that_keeps_deadlocking_fails_after_three_reruns() {
    let mut sim = Sim::start(Dialect::Postgres, lease(), 1, &[0]);
    sim.hook(|_, command| match &command.action {
        Action::Execute { statement, .. }
            if matches!(statement.kind, StatementKind::Delete { fenced: true }) =>
        {
            Intercept::Answer(Reply::Failed(DbError::new(
                ErrorKind::Serialization,
                "deadlock detected",
            )))
        }
        _ => Intercept::Run,
    });
    let mark = sim.mark();
    let one = sim.delivery(0, 1);
    sim.settle(0, one, Outcome::Ack);
    sim.run();
    assert_eq!(
        sim.runs_of(0, mark, StatementKind::Delete { fenced: true })
            .len(),
        4,
        "the statement and three reruns"
    );
    let events = sim.events(0, mark);
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::SettleFailed { delivery, error: SettleError::Db(_) } if *delivery == one
        )),
        "{events:?}"
    );
    assert!(sim.ops(0, mark).contains(&Close));
    assert!(sim.db.rows.contains_key(&1), "the row stays, leased");
}

/// MySQL's `DELETE` and MariaDB's `UPDATE` return no rows: there, each settlement runs its
/// own statement, side by side.
#[test]
fn settlements_run_one_statement_each_where_the_database_returns_no_rows() {
    for (dialect, desc) in [
        (Dialect::MySql, lease()),
        (Dialect::MariaDb, lease_marked()),
    ] {
        let mut sim = Sim::start(dialect, desc, 3, &[0, 1, 2]);
        let mark = sim.mark();
        for row in [1, 2, 3] {
            sim.settle(0, sim.delivery(0, row), Outcome::Ack);
        }
        sim.run();
        let kind = match &sim.statements(0).form {
            FormStatements::Lease(f) => f.settle.kind,
            FormStatements::RowLock(f) => f.settle.kind,
            FormStatements::Advisory(f) => f.settle.kind,
        };
        assert_eq!(sim.runs_of(0, mark, kind).len(), 3, "{dialect:?}");
        assert!(
            !sim.ops(0, mark)
                .iter()
                .any(|o| matches!(o, Exec(StatementKind::SettleLeases(_)))),
            "{dialect:?}"
        );
    }
}

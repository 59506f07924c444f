//! Shutdown: no claim starts, claims in flight finish and give back what they took, deliveries
//! in work are released or left to their lease, and the broker closes once.

use super::*;

/// "Then it shuts the broker down: the claim loops stop."
#[test]
fn shutdown_starts_no_claim() {
    for desc in [row_lock(), lease(), advisory()] {
        let mut sim = Sim::start(Dialect::Postgres, desc, 1, &[]);
        sim.shutdown(0);
        sim.run();
        let mark = sim.mark();
        sim.insert(0);
        sim.wake(0);
        sim.run();
        sim.advance(Duration::from_secs(60));
        assert!(sim.ops(0, mark).is_empty(), "{:?}", desc.form());
        assert_eq!(sim.timeout(0), None);
        assert!(sim.delivered(0, 0).is_empty());
        assert_eq!(only(sim.closed(0)).1, 0);
    }
}

/// "A claim the runtime cut short ... may still run on the server; shutdown waits until the
/// server has ended it and rolled its transaction back, so the stopped service holds no lock
/// on the table."
#[test]
fn shutdown_lets_a_row_lock_claim_in_flight_finish_and_rolls_it_back() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, row_lock(), 1);
        sim.insert(0);
        sim.spawn();
        let lock = sim.run_until(0, locks_by_id);
        sim.shutdown(0);
        assert!(
            sim.closed(0).is_empty(),
            "{dialect:?}: the claim is in flight"
        );
        let mark = sim.mark();
        sim.run();
        let ops = sim.ops_on(0, lock.conn, mark);
        assert_eq!(
            ops[ops.len() - 2..],
            [Exec(StatementKind::Rollback), Release],
            "{dialect:?}: {ops:?}"
        );
        assert!(sim.delivered(0, 0).is_empty(), "{dialect:?}: not delivered");
        assert!(
            !sim.events(0, 0)
                .iter()
                .any(|e| matches!(e, Event::Returned { .. }))
        );
        assert!(sim.db.row_locks.is_empty());
        assert!(sim.db.held_by(sim.procs[0].process).is_empty());
        assert_eq!(
            sim.row(1).attempt,
            1,
            "{dialect:?}: the attempt was counted and committed before the lock: it is spent"
        );
        assert_eq!(only(sim.closed(0)), (ClosedCounts::default(), 0));
    }
}

/// A claim in flight in the advisory lock form: what it took is unlocked, not delivered.
#[test]
fn shutdown_lets_an_advisory_claim_in_flight_finish_and_unlocks_what_it_took() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, advisory(), 1);
        sim.insert(0);
        sim.spawn();
        let take = sim.run_until(0, |c| kind_of(c) == Some(take_kind(dialect)));
        sim.shutdown(0);
        assert!(sim.closed(0).is_empty());
        let mark = sim.mark();
        sim.run();
        let ops = sim.ops_on(0, take.conn, mark);
        assert_eq!(
            ops[ops.len() - 2..],
            [Exec(StatementKind::Unlock), Release],
            "{dialect:?}: {ops:?}"
        );
        assert!(sim.delivered(0, 0).is_empty(), "{dialect:?}");
        assert!(sim.db.advisory.is_empty(), "{dialect:?}");
        let (counts, held) = only(sim.closed(0));
        assert_eq!(counts.locks_released, 1, "{dialect:?}");
        assert_eq!(held, 0);
    }
}

/// A claim in flight in the lease form: the lease it wrote is released, not delivered.
#[test]
fn shutdown_lets_a_lease_claim_in_flight_finish_and_releases_the_lease() {
    for dialect in ALL {
        let mut sim = Sim::new(dialect, lease(), 1);
        sim.insert(0);
        sim.spawn();
        sim.run_until(0, |c| kind_of(c) == Some(lease_claim_kind(dialect)));
        sim.shutdown(0);
        assert!(sim.closed(0).is_empty());
        let mark = sim.mark();
        sim.run();
        assert!(
            sim.ops(0, mark)
                .contains(&Exec(StatementKind::ReleaseLease)),
            "{dialect:?}: {:?}",
            sim.ops(0, mark)
        );
        assert!(sim.delivered(0, 0).is_empty(), "{dialect:?}");
        assert_eq!(
            sim.row(1).locked_until,
            None,
            "{dialect:?}: the row is free"
        );
        assert_eq!(only(sim.closed(0)), (ClosedCounts::default(), 0));
        let other = sim.spawn();
        sim.run();
        assert_eq!(sim.delivered_rows(other, 0), [1], "{dialect:?}: at once");
    }
}

/// "In the advisory lock form the broker releases the lock of every delivery in work": the
/// counts say how many.
#[test]
fn shutdown_unlocks_advisory_deliveries_in_work_and_counts_them() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 2, &[0, 1]);
        let rows = sim.delivered(0, 0);
        // SQLite has one delivery in work at a time.
        let in_work = if dialect == Dialect::Sqlite { 1 } else { 2 };
        assert_eq!(rows.len(), in_work, "{dialect:?}");
        let mark = sim.mark();
        sim.shutdown(0);
        sim.run();
        for d in &rows {
            let conn = sim.conn_of(0, d.row.expect("a row"));
            let expected = if dialect == Dialect::Sqlite {
                vec![Release]
            } else {
                vec![Exec(StatementKind::Unlock), Release]
            };
            assert_eq!(sim.ops_on(0, conn, mark), expected, "{dialect:?}");
            assert!(sim.events(0, mark).contains(&Event::Returned {
                delivery: d.delivery
            }));
        }
        assert!(sim.db.advisory.is_empty());
        assert!(sim.db.held_by(sim.procs[0].process).is_empty());
        let (counts, held) = only(sim.closed(0));
        assert_eq!(
            counts,
            ClosedCounts {
                locks_released: in_work,
                connections_closed: 0
            },
            "{dialect:?}"
        );
        assert_eq!(held, 0);
    }
}

/// "... whose locks_released and connections_closed count what the shutdown did to the
/// advisory locks": an unlock answering false, or failing, closes the connection.
#[test]
fn shutdown_counts_an_unlock_answering_false_as_a_closed_connection() {
    let answers = [
        bool_reply(false),
        Reply::Failed(DbError::new(ErrorKind::Other, "unlock failed")),
    ];
    for dialect in SERVERS {
        for answer in answers.clone() {
            let mut sim = Sim::start(dialect, advisory(), 2, &[0, 1]);
            let second = sim.conn_of(0, 2);
            let key = lock_arg(dialect, "jobs-1");
            sim.hook(move |_, c| match &c.action {
                Action::Execute { statement, binds }
                    if statement.kind == StatementKind::Unlock && binds[0] == key =>
                {
                    Intercept::Answer(answer.clone())
                }
                _ => Intercept::Run,
            });
            let mark = sim.mark();
            sim.shutdown(0);
            sim.run();
            assert_eq!(
                sim.ops_on(0, second, mark),
                [Exec(StatementKind::Unlock), Close],
                "{dialect:?}"
            );
            assert!(
                sim.db.advisory.is_empty(),
                "{dialect:?}: the close ended the lock"
            );
            let (counts, held) = only(sim.closed(0));
            assert_eq!(
                counts,
                ClosedCounts {
                    locks_released: 1,
                    connections_closed: 1
                },
                "{dialect:?}"
            );
            assert_eq!(held, 0);
        }
    }
    // The service's own unlock answering false counts the same.
    let mut sim = Sim::start(Dialect::Postgres, custom(), 1, &[0]);
    sim.db.custom.clear();
    sim.shutdown(0);
    sim.run();
    assert_eq!(
        only(sim.closed(0)).0,
        ClosedCounts {
            locks_released: 0,
            connections_closed: 1
        }
    );
}

/// "A delivery in work in the lease form keeps its lease, which runs out unless the delivery
/// settles first ... A settlement after the shutdown that needs a new connection, as in the
/// lease form, then fails."
#[test]
fn shutdown_leaves_lease_deliveries_with_their_lease_and_settling_after_fails_closed() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let before = sim.row(1).clone();
        let mark = sim.mark();
        sim.shutdown(0);
        sim.run();
        assert!(
            sim.ops(0, mark).is_empty(),
            "{dialect:?}: no statement runs"
        );
        assert_eq!(only(sim.closed(0)), (ClosedCounts::default(), 0));
        assert!(
            !sim.events(0, mark)
                .iter()
                .any(|e| matches!(e, Event::Returned { .. })),
            "{dialect:?}: the lease keeps the row"
        );
        // The extension stopped too.
        sim.advance(EXTEND * 2);
        assert!(sim.ops(0, mark).is_empty(), "{dialect:?}");
        assert_eq!(sim.row(1), &before, "{dialect:?}: the lease stays");
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.events(0, mark),
            [Event::SettleFailed {
                delivery,
                error: SettleError::Closed
            }],
            "{dialect:?}"
        );
        assert!(sim.ops(0, mark).is_empty());
        assert!(sim.db.rows.contains_key(&1));
        // The row returns when the lease runs out.
        sim.advance_to(T0.plus(LEASE_TIME));
        let other = sim.spawn();
        sim.run();
        assert_eq!(sim.delivered_rows(other, 0), [1], "{dialect:?}");
    }
}

/// Row lock deliveries in work are rolled back at shutdown, and their rows return.
#[test]
fn shutdown_rolls_back_row_lock_deliveries_in_work() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 2, &[0, 1]);
        let mark = sim.mark();
        sim.shutdown(0);
        sim.run();
        for row in [1, 2] {
            let conn = sim.conn_of(0, row);
            assert_eq!(
                sim.ops_on(0, conn, mark),
                [Exec(StatementKind::Rollback), Release],
                "{dialect:?}"
            );
            let delivery = sim.delivery(0, row);
            assert!(sim.events(0, mark).contains(&Event::Returned { delivery }));
        }
        assert!(sim.db.row_locks.is_empty());
        assert!(sim.db.held_by(sim.procs[0].process).is_empty());
        assert_eq!(only(sim.closed(0)), (ClosedCounts::default(), 0));
    }
}

/// "... and waits for the settlements in flight, so no lock of the broker is left": `Closed`
/// comes only after their replies.
#[test]
fn shutdown_waits_for_the_settlements_in_flight() {
    for (dialect, desc) in [
        (Dialect::Postgres, row_lock()),
        (Dialect::MySql, row_lock()),
        (Dialect::Postgres, advisory()),
        (Dialect::MariaDb, advisory()),
        (Dialect::Sqlite, advisory()),
        (Dialect::Postgres, lease()),
        (Dialect::MySql, lease()),
    ] {
        let form = desc.form();
        let mut sim = Sim::start(dialect, desc, 1, &[0]);
        let delivery = sim.delivery(0, 1);
        sim.settle(0, delivery, Outcome::Ack);
        // The settlement's first command is in flight, unanswered.
        assert!(!sim.procs[0].queue.is_empty());
        sim.shutdown(0);
        assert!(sim.closed(0).is_empty(), "{dialect:?} {form:?}: waits");
        sim.run();
        let settled = sim
            .event_index(0, |e| {
                *e == Event::Settled {
                    delivery,
                    outcome: Outcome::Ack,
                }
            })
            .unwrap_or_else(|| panic!("{dialect:?} {form:?}: the settlement took effect"));
        let closed = sim
            .event_index(0, |e| matches!(e, Event::Closed(_)))
            .expect("closed");
        assert!(settled < closed, "{dialect:?} {form:?}");
        assert!(!sim.db.rows.contains_key(&1), "{dialect:?} {form:?}");
        let (counts, held) = only(sim.closed(0));
        assert_eq!(counts, ClosedCounts::default(), "{dialect:?} {form:?}");
        assert_eq!(held, 0);
        assert!(sim.db.held_by(sim.procs[0].process).is_empty());
    }
}

/// "A handle taken before shutdown, such as a repository publisher, refuses every publish
/// afterwards with SqlxBrokerError::Closed, and never writes a row past the shutdown."
#[test]
fn publish_after_shutdown_is_refused_and_writes_nothing() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[]);
        let before_publish = sim.mark();
        let publish = sim.publish(0, 3).expect("publishes before the shutdown");
        sim.run();
        assert_eq!(
            sim.ops(0, before_publish)[..3],
            [Acquire, Exec(StatementKind::Publish), Release],
            "{dialect:?}"
        );
        assert!(sim.events(0, before_publish).contains(&Event::Published {
            publish,
            result: Ok(Published::default())
        }));
        sim.shutdown(0);
        sim.run();
        let rows = sim.db.rows.clone();
        let mark = sim.mark();
        assert_eq!(sim.publish(0, 4), Err(BrokerError::Closed), "{dialect:?}");
        sim.run();
        assert!(sim.ops(0, mark).is_empty(), "{dialect:?}");
        assert_eq!(sim.db.rows, rows, "{dialect:?}: nothing written");
        assert_eq!(sim.executed(StatementKind::Publish), 1);
    }
}

/// A publish taken before the shutdown is waited for: `Closed` follows its end.
#[test]
fn shutdown_waits_for_a_publish_in_flight() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 1, &[]);
        let publish = sim.publish(0, 3).expect("publishes before the shutdown");
        sim.shutdown(0);
        assert!(sim.closed(0).is_empty(), "{dialect:?}");
        sim.run();
        let published = sim
            .event_index(0, |e| {
                *e == Event::Published {
                    publish,
                    result: Ok(Published::default()),
                }
            })
            .expect("published");
        let closed = sim
            .event_index(0, |e| matches!(e, Event::Closed(_)))
            .expect("closed");
        assert!(published < closed, "{dialect:?}");
        assert_eq!(only(sim.closed(0)).1, 0);
        assert!(
            sim.delivered(0, 0).is_empty(),
            "{dialect:?}: no claim for it"
        );
    }
}

/// A shutdown while the subscription's check runs: the check is let finish, and no claim
/// starts after it; nothing announces claims that will never begin.
#[test]
fn shutdown_during_the_check_starts_no_claim_and_announces_none() {
    for dialect in ALL {
        let desc = if dialect == Dialect::Sqlite {
            lease()
        } else {
            row_lock()
        };
        let mut sim = Sim::new(dialect, desc, 1);
        sim.insert(0);
        sim.spawn();
        sim.shutdown(0);
        assert!(
            sim.closed(0).is_empty(),
            "{dialect:?}: the check is in flight"
        );
        sim.run();
        sim.advance(Duration::from_secs(10));
        assert!(sim.delivered(0, 0).is_empty(), "{dialect:?}");
        assert_eq!(only(sim.closed(0)).1, 0);
        let sub = sim.procs[0].sub;
        assert!(
            !sim.events(0, 0).contains(&Event::Ready { sub }),
            "{dialect:?}: {:?}",
            sim.events(0, 0)
        );
    }
}

/// "The shutdown is complete": `Event::Closed` comes once, with no connection held.
#[test]
fn shutdown_closes_exactly_once_with_no_connection_held() {
    for (dialect, desc) in [
        (Dialect::Postgres, row_lock()),
        (Dialect::MariaDb, row_lock()),
        (Dialect::Postgres, lease()),
        (Dialect::Sqlite, lease()),
        (Dialect::MySql, advisory()),
        (Dialect::Sqlite, advisory()),
        (Dialect::Postgres, custom()),
    ] {
        let mut sim = Sim::start(dialect, desc, 2, &[0, 1, 2]);
        assert!(sim.procs[0].broker.held_connections() > 0 || desc.form() == Form::Lease);
        sim.shutdown(0);
        sim.shutdown(0);
        sim.run();
        sim.shutdown(0);
        sim.advance(Duration::from_secs(120));
        sim.shutdown(0);
        sim.run();
        let closed = sim.closed(0);
        assert_eq!(closed.len(), 1, "{dialect:?} {:?}: {closed:?}", desc.form());
        assert_eq!(closed[0].1, 0, "{dialect:?}: no connection held at Closed");
        assert!(sim.procs[0].broker.is_closed());
        assert_eq!(sim.procs[0].broker.held_connections(), 0);
        assert!(sim.db.held_by(sim.procs[0].process).is_empty());
    }
}

/// A settlement of a delivery that the shutdown is releasing (its unlock or rollback still in
/// flight) fails as one after the shutdown does: `Closed`.
#[test]
fn settle_during_the_shutdown_release_fails_closed() {
    for (dialect, desc) in [
        (Dialect::Postgres, row_lock()),
        (Dialect::Postgres, advisory()),
    ] {
        let mut sim = Sim::start(dialect, desc, 1, &[0]);
        let delivery = sim.delivery(0, 1);
        sim.shutdown(0);
        // The rollback or unlock is in flight.
        assert!(!sim.procs[0].queue.is_empty());
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        let failed: Vec<Event<i64>> = sim
            .events(0, mark)
            .into_iter()
            .filter(|e| matches!(e, Event::SettleFailed { .. }))
            .collect();
        assert_eq!(
            failed,
            [Event::SettleFailed {
                delivery,
                error: SettleError::Closed
            }],
            "{dialect:?} {:?}",
            desc.form()
        );
    }
}

/// A settlement after the shutdown ended an advisory or row lock delivery fails `Closed`.
#[test]
fn settle_after_the_shutdown_fails_closed() {
    for (dialect, desc) in [
        (Dialect::Postgres, row_lock()),
        (Dialect::MySql, advisory()),
        (Dialect::Sqlite, advisory()),
    ] {
        let mut sim = Sim::start(dialect, desc, 1, &[0]);
        let delivery = sim.delivery(0, 1);
        sim.shutdown(0);
        sim.run();
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.events(0, mark),
            [Event::SettleFailed {
                delivery,
                error: SettleError::Closed
            }],
            "{dialect:?}"
        );
        assert!(sim.ops(0, mark).is_empty());
        assert!(
            sim.db.rows.contains_key(&1),
            "{dialect:?}: the row returned, unsettled"
        );
    }
}

//! The row lock form: a claim locks its row inside a transaction held while the row is in
//! work; the settlement runs and commits on that connection.

use super::*;

/// "A row lock claim locks each row with FOR UPDATE SKIP LOCKED in a transaction that stays
/// open while the handler runs."
#[test]
fn row_lock_claim_locks_the_row_inside_a_transaction_held_while_in_work() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 1, &[0]);
        let d = only(sim.delivered(0, 0));
        let row = d.row.expect("a row");
        assert_eq!(d.attempt, Some(1), "{dialect:?}");
        let conn = sim.conn_of(0, row);
        // The attempt is counted and committed first, so a crash spends it, under the row's
        // mark; then the row is locked for the handler in a transaction of its own, the lock
        // releasing the count's one mark.
        let expected: Vec<_> = if dialect == Dialect::Postgres {
            vec![
                Acquire,
                Exec(StatementKind::CountRow),
                Exec(StatementKind::Begin),
                Exec(StatementKind::LockRowByIdUnmarking),
            ]
        } else {
            vec![
                Acquire,
                Exec(StatementKind::ReadCommitted),
                Exec(StatementKind::Begin),
                Exec(StatementKind::SelectRowId),
                Exec(StatementKind::MarkRows(1)),
                Exec(StatementKind::CountAttempt),
                Exec(StatementKind::Commit),
                Exec(StatementKind::Begin),
                Exec(StatementKind::LockRowByIdUnmarking),
            ]
        };
        assert_eq!(sim.ops_on(0, conn, 0), expected, "{dialect:?}");
        let lock_row = match &sim.statements(0).form {
            FormStatements::RowLock(f) => match &f.claim {
                RowLockClaim::Count { lock_row_by_id, .. }
                | RowLockClaim::SelectCount { lock_row_by_id, .. } => lock_row_by_id.clone(),
                RowLockClaim::Lock { .. } => panic!("a table with attempts locks by id"),
            },
            other => panic!("the row lock form's statements, not {other:?}"),
        };
        assert!(
            lock_row.sql.ends_with("FOR UPDATE SKIP LOCKED"),
            "{dialect:?}: {}",
            lock_row.sql
        );
        // The handler runs: the transaction is open and holds the row.
        sim.advance(Duration::from_secs(5));
        let sess = sim.sess_of(0, conn);
        assert_eq!(sim.db.row_locks.get(&row), Some(&sess), "{dialect:?}");
        assert!(sim.db.sessions[&sess].in_tx, "{dialect:?}");
        assert_eq!(
            sim.ops_on(0, conn, 0).len(),
            expected.len(),
            "{dialect:?}: nothing more ran"
        );
    }
}

/// "Rows that another claim holds are passed over, so claims of several workers and
/// processes never wait for each other."
#[test]
fn row_lock_rows_another_claim_holds_are_passed_over() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 1, &[0, 0]);
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
        let second = sim.spawn();
        sim.run();
        // The database model records a statement that would wait as a violation, and the
        // driver fails on any.
        assert_eq!(sim.delivered_rows(second, 0), [2], "{dialect:?}");
        assert!(sim.db.violations.is_empty());
        assert_eq!(sim.db.row_locks.len(), 2, "{dialect:?}");
    }
}

/// "The settlement's statement, a delete or the processed_at mark, commits that transaction,
/// so a row and its outcome change together."
#[test]
fn row_lock_ack_runs_the_settle_statement_then_commit_on_the_same_connection() {
    for dialect in SERVERS {
        {
            let outcome = Outcome::Ack;
            let mut sim = Sim::start(dialect, row_lock(), 1, &[0]);
            let delivery = sim.delivery(0, 1);
            let conn = sim.conn_of(0, 1);
            let mark = sim.mark();
            sim.settle(0, delivery, outcome);
            // Before the commit, the delete is inside the claim's transaction, which still
            // holds the row.
            sim.run_until(0, |c| kind_of(c) == Some(StatementKind::Commit));
            let sess = sim.sess_of(0, conn);
            assert!(
                sim.db.sessions[&sess].in_tx,
                "{dialect:?}: not yet committed"
            );
            assert_eq!(sim.db.row_locks.get(&1), Some(&sess), "{dialect:?}");
            sim.run();
            assert_eq!(
                sim.ops_on(0, conn, mark),
                [delete(false), Exec(StatementKind::Commit), Release],
                "{dialect:?} {outcome:?}"
            );
            assert!(
                sim.events(0, mark)
                    .contains(&Event::Settled { delivery, outcome }),
                "{dialect:?} {outcome:?}"
            );
            assert!(
                !sim.db.rows.contains_key(&1),
                "{dialect:?}: the row is deleted"
            );
            assert!(sim.db.row_locks.is_empty());
        }
    }
}

/// "... a delete or the processed_at mark ...": with `processed_at`, the settlement marks the
/// row inside the transaction instead of deleting it, and the row is never claimed again.
#[test]
fn row_lock_ack_marks_processed_at_instead_of_deleting() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock_marked(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let mark = sim.mark();
        sim.advance(Duration::from_millis(1500));
        let at = sim.now;
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(
            sim.ops_on(0, conn, mark),
            [
                Exec(StatementKind::MarkProcessed { fenced: false }),
                Exec(StatementKind::Commit),
                Release
            ],
            "{dialect:?}"
        );
        assert_eq!(sim.row(1).processed_at, Some(at.micros()), "{dialect:?}");
        let mark = sim.mark();
        sim.advance(Duration::from_secs(10));
        assert!(sim.delivered(0, mark).is_empty(), "{dialect:?}");
    }
}

/// "The price is a connection of the pool per message in work, held for the whole handler."
#[test]
fn row_lock_holds_one_connection_per_message_in_work() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 4, &[0, 1, 2, 3, 4, 5]);
        let rows = sim.delivered_rows(0, 0);
        assert_eq!(
            rows,
            [1, 2, 3, 4],
            "{dialect:?}: four workers take four rows"
        );
        assert_eq!(sim.procs[0].broker.held_connections(), 4, "{dialect:?}");
        let conns: BTreeSet<ConnId> = rows.iter().map(|r| sim.conn_of(0, *r)).collect();
        assert_eq!(conns.len(), 4, "{dialect:?}: a connection of its own each");
        let sessions: BTreeSet<SessId> = conns.iter().map(|c| sim.sess_of(0, *c)).collect();
        assert_eq!(sessions.len(), 4, "{dialect:?}");
        for row in &rows {
            let sess = sim.sess_of(0, sim.conn_of(0, *row));
            assert_eq!(sim.db.row_locks.get(row), Some(&sess), "{dialect:?}");
            assert!(sim.db.sessions[&sess].in_tx, "{dialect:?}");
        }
        // Held for the whole handler.
        sim.advance(Duration::from_secs(60));
        assert_eq!(sim.procs[0].broker.held_connections(), 4, "{dialect:?}");
        // A settlement gives its connection back, and the freed worker takes the next row.
        let delivery = sim.delivery(0, 1);
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(sim.delivered_rows(0, 0), [1, 2, 3, 4, 5], "{dialect:?}");
        assert_eq!(sim.procs[0].broker.held_connections(), 4, "{dialect:?}");
    }
}

/// `retry()` in the row lock form commits the transaction with its counted attempt, and the
/// row returns to the queue.
#[test]
fn row_lock_retry_commits_the_counted_attempt_and_the_row_returns() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Retry);
        sim.run();
        assert_eq!(
            sim.ops_on(0, conn, mark)[..2],
            [Exec(StatementKind::Commit), Release],
            "{dialect:?}: no statement but the commit"
        );
        assert!(sim.events(0, mark).contains(&Event::Settled {
            delivery,
            outcome: Outcome::Retry
        }));
        let again = only(sim.delivered(0, mark));
        assert_eq!(again.row, Some(1), "{dialect:?}: the row returns");
        assert_eq!(
            again.attempt,
            Some(2),
            "{dialect:?}: the attempt was committed"
        );
        assert_eq!(sim.row(1).attempt, 2);
    }
}

/// "The rows of a crashed process return at once, when the database rolls its transactions
/// back."
#[test]
fn row_lock_crash_returns_the_row_at_once() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, row_lock(), 1, &[0]);
        assert_eq!(sim.delivered_rows(0, 0), [1]);
        let second = sim.spawn();
        sim.run();
        assert!(
            sim.delivered(second, 0).is_empty(),
            "{dialect:?}: held by the first process"
        );
        sim.crash(0);
        assert!(sim.db.row_locks.is_empty(), "{dialect:?}");
        // At once: the second process's next claim, with no lease to wait for.
        sim.advance(POLL);
        let d = only(sim.delivered(second, 0));
        assert_eq!(d.row, Some(1), "{dialect:?}");
        assert_eq!(sim.delivered_at(second, 0, 1), Some(T0.plus(POLL)));
    }
}

/// "SQLite has no row locks, so a subscription to a SQLite table that names no other form
/// does not compile": at run time the core refuses it.
#[test]
fn row_lock_subscription_on_sqlite_is_refused() {
    let mut broker: Broker<i64> = Broker::new(Dialect::Sqlite);
    let options = SubscribeOptions::default();
    assert_eq!(
        broker.subscribe(row_lock(), options, T0),
        Err(BrokerError::Desc(DescError::NoRowLocks {
            table: "jobs",
            dialect: "SQLite",
        }))
    );
    assert_eq!(broker.poll_command(), None, "nothing runs");
    // The other forms are taken on SQLite.
    assert!(broker.subscribe(lease(), options, T0).is_ok());
    assert!(broker.subscribe(advisory(), options, T0).is_ok());
}

/// "On Postgres read_committed is the practical isolation level for the form: a claim at a
/// stricter level fails with a serialization error": the check refuses a stricter level,
/// and names the setting to change.
#[test]
fn row_lock_postgres_serializable_isolation_fails_the_check() {
    let mut sim = Sim::new(Dialect::Postgres, row_lock(), 1);
    sim.db.isolation = Some("serializable".into());
    sim.insert(0);
    let p = sim.spawn();
    sim.run();
    let sub = sim.procs[p].sub;
    let error = sim
        .events(p, 0)
        .into_iter()
        .find_map(|e| match e {
            Event::CheckFailed { sub: s, error } if s == sub => Some(error),
            _ => None,
        })
        .expect("the check fails");
    assert_eq!(
        error,
        CheckError::Isolation {
            table: "jobs",
            level: "serializable".into()
        }
    );
    assert!(
        error.to_string().contains("default_transaction_isolation"),
        "{error}"
    );
    assert!(!sim.events(p, 0).contains(&Event::Ready { sub }));
    sim.advance(Duration::from_secs(10));
    assert_eq!(sim.executed(StatementKind::LockRow), 0, "no claim");
    assert_eq!(sim.procs[p].broker.held_connections(), 0);
}

/// A claim that fails with a serialization error says which setting to change.
#[test]
fn row_lock_serialization_failure_names_the_isolation_setting() {
    let mut sim = Sim::new(Dialect::Postgres, row_lock(), 1);
    sim.insert(0);
    sim.spawn();
    sim.hook(|_, c| match kind_of(c) {
        Some(StatementKind::CountRow) => Intercept::Answer(Reply::Failed(DbError::new(
            ErrorKind::Serialization,
            "could not serialize access",
        ))),
        _ => Intercept::Run,
    });
    sim.run();
    let message = sim
        .events(0, 0)
        .into_iter()
        .find_map(|e| match e {
            Event::Error { error, .. } if error.kind == ErrorKind::Serialization => {
                Some(error.message)
            }
            _ => None,
        })
        .expect("the claim's error");
    assert!(
        message.contains("default_transaction_isolation"),
        "{message}"
    );
    assert!(
        sim.ops(0, 0).contains(&Close),
        "the failed claim's connection closes"
    );
    assert_eq!(sim.procs[0].broker.held_connections(), 0);
}

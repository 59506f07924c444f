//! The start check: a missing table or column names what is missing, a failure that may pass
//! retries after a wait that doubles, one that cannot fails the start.

use super::*;

/// A described column the table lacks fails the check, naming the table and the column.
#[test]
fn check_missing_column_names_the_table_and_the_column() {
    let cases = [
        (Dialect::Postgres, row_lock(), "attempt", "the attempt"),
        (
            Dialect::MySql,
            lease(),
            "locked_until",
            "the lease's `locked_until`",
        ),
        (
            Dialect::Sqlite,
            advisory(),
            "channel",
            "a part of the advisory lock key",
        ),
        (
            Dialect::MariaDb,
            lease_marked(),
            "processed_at",
            "`processed_at`",
        ),
    ];
    for (dialect, desc, column, role) in cases {
        let mut sim = Sim::new(dialect, desc, 1);
        sim.db.missing_columns = vec![column];
        sim.insert(0);
        let p = sim.spawn();
        sim.run();
        let sub = sim.procs[p].sub;
        let error = CheckError::MissingColumn {
            table: "jobs",
            column,
            role,
        };
        assert_eq!(
            sim.events(p, 0),
            [Event::CheckFailed {
                sub,
                error: error.clone()
            }],
            "{dialect:?}"
        );
        let message = error.to_string();
        assert!(message.contains("`jobs`") && message.contains(&format!("`{column}`")));
        sim.advance(Duration::from_secs(10));
        assert!(sim.delivered(p, 0).is_empty(), "{dialect:?}: no claim");
        assert_eq!(
            sim.ops(p, 0).last(),
            Some(&Release),
            "{dialect:?}: the check's connection goes back"
        );
        assert_eq!(sim.procs[p].broker.held_connections(), 0);
    }
}

/// A table that does not exist fails the check with `MissingTable`, whether the listing finds
/// no column or the database says so.
#[test]
fn check_missing_table() {
    for dialect in ALL {
        let desc = if dialect == Dialect::Sqlite {
            lease()
        } else {
            row_lock()
        };
        // The listing finds no column.
        let mut sim = Sim::new(dialect, desc, 1);
        sim.db.missing_table = true;
        let p = sim.spawn();
        sim.run();
        let sub = sim.procs[p].sub;
        let failed = Event::CheckFailed {
            sub,
            error: CheckError::MissingTable { table: "jobs" },
        };
        assert_eq!(
            sim.events(p, 0),
            std::slice::from_ref(&failed),
            "{dialect:?}"
        );
        // The database answers that the table is undefined.
        let mut sim = Sim::new(dialect, desc, 1);
        sim.hook(|_, c| match kind_of(c) {
            Some(StatementKind::ListColumns) => Intercept::Answer(Reply::Failed(DbError::new(
                ErrorKind::UndefinedTable,
                "no such table",
            ))),
            _ => Intercept::Run,
        });
        let p = sim.spawn();
        sim.run();
        assert_eq!(sim.events(p, 0), [failed], "{dialect:?}");
        sim.advance(Duration::from_secs(10));
        assert_eq!(
            sim.ops(p, 0).len(),
            3,
            "{dialect:?}: and no retry: {:?}",
            sim.ops(p, 0)
        );
        assert_eq!(sim.procs[p].broker.held_connections(), 0);
    }
}

/// A passing failure (the pool gives no connection) is not a verdict: the check runs again
/// after a second, and not before, and each failure in a row doubles the wait.
#[test]
fn check_passing_failure_retries_after_a_wait_that_doubles() {
    for dialect in ALL {
        let desc = if dialect == Dialect::Sqlite {
            advisory()
        } else {
            row_lock()
        };
        let mut sim = Sim::new(dialect, desc, 1);
        sim.insert(0);
        let mut failed = 0;
        sim.hook(move |_, c| {
            if failed < 3 && c.action == Action::Acquire {
                failed += 1;
                Intercept::Answer(Reply::Failed(DbError::new(
                    ErrorKind::PoolClosed,
                    "no connection in time",
                )))
            } else {
                Intercept::Run
            }
        });
        let p = sim.spawn();
        sim.run();
        let sub = sim.procs[p].sub;
        let retries = |sim: &Sim| -> Vec<(u32, Duration)> {
            sim.events(p, 0)
                .into_iter()
                .filter_map(|e| match e {
                    Event::StartRetry {
                        sub: s,
                        error,
                        failures,
                        again_in,
                    } if s == sub && error.kind == ErrorKind::PoolClosed => {
                        Some((failures, again_in))
                    }
                    _ => None,
                })
                .collect()
        };
        assert_eq!(retries(&sim), [(1, Duration::from_secs(1))], "{dialect:?}");
        let first = Duration::from_secs(1);
        assert_eq!(sim.timeout(p), Some(T0.plus(first)), "{dialect:?}");
        sim.advance_to(just_before(T0.plus(first)));
        assert_eq!(sim.ops(p, 0), [Acquire], "{dialect:?}: not before");
        // Tries at 1 s and 3 s fail too; the one at 7 s starts.
        sim.advance_to(T0.plus(Duration::from_secs(7)));
        assert_eq!(
            retries(&sim),
            [
                (1, Duration::from_secs(1)),
                (2, Duration::from_secs(2)),
                (3, Duration::from_secs(4))
            ],
            "{dialect:?}"
        );
        assert!(
            sim.events(p, 0).contains(&Event::Ready { sub }),
            "{dialect:?}"
        );
        let ready = Duration::from_secs(7);
        assert_eq!(sim.delivered_rows(p, 0), [1], "{dialect:?}");
        assert_eq!(sim.delivered_at(p, 0, 1), Some(T0.plus(ready)));
    }
}

/// An error that waiting cannot cure (a refused password, a missing privilege, a prepared
/// statement another client's session holds) fails the start at once, naming the table and
/// the error, and the check does not run again.
#[test]
fn check_failure_that_cannot_pass_fails_the_start_at_once() {
    let cases = [
        (ErrorKind::Authentication, "password authentication failed"),
        (ErrorKind::Privilege, "permission denied for table jobs"),
        (
            ErrorKind::PreparedStatement,
            "prepared statement \"sqlx_s_1\" already exists",
        ),
        (ErrorKind::Config, "database \"nope\" does not exist"),
    ];
    for (kind, message) in cases {
        let mut sim = Sim::new(Dialect::Postgres, row_lock(), 1);
        sim.insert(0);
        sim.hook(move |_, c| match kind_of(c) {
            Some(StatementKind::ListColumns) => {
                Intercept::Answer(Reply::Failed(DbError::new(kind, message)))
            }
            _ => Intercept::Run,
        });
        let p = sim.spawn();
        sim.run();
        let failed: Vec<String> = sim
            .events(p, 0)
            .into_iter()
            .filter_map(|e| match e {
                Event::CheckFailed { error, .. } => Some(error.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(failed.len(), 1, "{kind:?}: {failed:?}");
        assert!(
            failed[0].contains("table `jobs`") && failed[0].contains(message),
            "{kind:?}: {}",
            failed[0]
        );
        if kind == ErrorKind::PreparedStatement {
            assert!(failed[0].contains("transaction pooling"), "{}", failed[0]);
        }
        sim.advance(Duration::from_secs(120));
        assert_eq!(
            sim.runs_of(p, 0, StatementKind::ListColumns).len(),
            1,
            "{kind:?}: no second try"
        );
        assert_eq!(sim.procs[p].broker.held_connections(), 0);
    }
}

/// A check that fails halfway on a passing error closes its connection and runs again.
#[test]
fn check_passing_failure_midway_closes_and_retries() {
    let mut sim = Sim::new(Dialect::MySql, advisory(), 1);
    sim.insert(0);
    let mut failed = false;
    sim.hook(move |_, c| {
        if !failed && kind_of(c) == Some(StatementKind::CurrentDatabase) {
            failed = true;
            Intercept::Answer(Reply::Failed(DbError::new(ErrorKind::Other, "hiccup")))
        } else {
            Intercept::Run
        }
    });
    let p = sim.spawn();
    sim.run();
    assert_eq!(
        sim.ops(p, 0),
        [
            Acquire,
            Exec(StatementKind::ListColumns),
            Exec(StatementKind::ListIndexes),
            Exec(StatementKind::CurrentDatabase),
            Close
        ]
    );
    assert_eq!(sim.procs[p].broker.held_connections(), 0);
    sim.advance(POLL);
    assert_eq!(sim.delivered_rows(p, 0), [1]);
    // The lock name still has the database's name, read by the second check.
    let lock = only(sim.runs_of(p, 0, StatementKind::TryLock));
    assert_eq!(lock.bind(Arg::Key), Value::Text("test.jobs-0".into()));
}

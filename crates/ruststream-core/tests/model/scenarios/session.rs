//! The session check on PostgreSQL of the advisory lock form and of the row lock form with an
//! attempt column (whose counts mark rows with session locks): each connection must be a
//! server session of its own. A second connection that takes a key the first holds, or a
//! first whose unlock finds no lock, reached another client's session: a pooler in
//! transaction pooling. Where the adapter's prepared statements live in the server session
//! (`Broker::set_prepared_statements`), every form on PostgreSQL checks the same.

use super::*;

fn try_locks(sim: &Sim, p: usize) -> usize {
    sim.ops(p, 0)
        .iter()
        .filter(|op| **op == Exec(StatementKind::TryLock))
        .count()
}

/// Directly on the server the probe key's lock is taken on the check's connection and found
/// held on a second one; then it is released, four rounds in all (a busy pooler can pass
/// one), and the subscription is ready. The advisory
/// form on PostgreSQL's own locks and the row lock form with an attempt column check; the
/// other forms and MySQL do not.
#[test]
fn the_session_lock_forms_on_postgres_check_that_each_connection_is_a_session_of_its_own() {
    for desc in [advisory(), row_lock()] {
        let mut sim = Sim::new(Dialect::Postgres, desc, 1);
        let p = sim.spawn();
        sim.run();
        let sub = sim.procs[p].sub;
        assert!(sim.events(p, 0).contains(&Event::Ready { sub }));
        assert_eq!(
            try_locks(&sim, p),
            8,
            "{:?}: the probe on the check's connection and on a second, in each of 4 rounds",
            desc.form()
        );
        assert!(sim.db.advisory.is_empty(), "the probe key is released");
    }
    for (dialect, desc) in [
        (Dialect::MySql, advisory()),
        (Dialect::MySql, row_lock()),
        (Dialect::Postgres, lease()),
        (Dialect::Postgres, row_lock_plain()),
    ] {
        let mut sim = Sim::new(dialect, desc, 1);
        let p = sim.spawn();
        sim.run();
        assert_eq!(try_locks(&sim, p), 0, "{dialect:?} {:?}", desc.form());
    }
}

/// Through transaction pooling the second connection is handed the first one's session and
/// takes the probe key again: the check fails naming transaction pooling, the second
/// connection releases the key, and nothing claims.
#[test]
fn a_second_connection_on_the_first_ones_session_fails_the_check() {
    for (desc, pooled_at) in [
        (advisory(), StatementKind::TryLock),
        (advisory(), StatementKind::Unlock),
        (row_lock(), StatementKind::TryLock),
        (row_lock(), StatementKind::Unlock),
    ] {
        let mut sim = Sim::new(Dialect::Postgres, desc, 1);
        let mut tries = 0;
        sim.hook(move |_, c| match kind_of(c) {
            // The second try takes the key, as the first one's session would.
            Some(StatementKind::TryLock) if pooled_at == StatementKind::TryLock => {
                tries += 1;
                if tries == 2 {
                    Intercept::Answer(Reply::Rows(vec![Row::values(vec![Value::Bool(true)])]))
                } else {
                    Intercept::Run
                }
            }
            // Or the first one's unlock reaches a session that holds nothing.
            Some(StatementKind::Unlock) if pooled_at == StatementKind::Unlock => {
                tries += 1;
                if tries == 1 {
                    Intercept::Answer(Reply::Rows(vec![Row::values(vec![Value::Bool(false)])]))
                } else {
                    Intercept::Run
                }
            }
            _ => Intercept::Run,
        });
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
            .unwrap_or_else(|| panic!("{pooled_at:?}: the check fails"));
        assert_eq!(
            error,
            CheckError::TransactionPooling {
                table: "jobs",
                form: desc.form()
            }
        );
        let message = error.to_string();
        assert!(
            message.contains("transaction pooling") && message.contains("pool_mode = session"),
            "{message}"
        );
        let named = match desc.form() {
            Form::RowLock => "marks each row it counts",
            Form::Advisory | Form::Lease => "holds each key",
        };
        assert!(message.contains(named), "{message}");
        assert!(!sim.events(p, 0).contains(&Event::Ready { sub }));
        sim.advance(Duration::from_secs(10));
        for claiming in [StatementKind::Take, StatementKind::CountRow] {
            assert_eq!(sim.executed(claiming), 0, "{pooled_at:?}: no claim");
        }
        assert_eq!(sim.procs[p].broker.held_connections(), 0, "{pooled_at:?}");
    }
}

/// A pooler busy with other clients may hand the probe's connections sessions that pass the
/// lock test in every round; their server process ids still tell: the check's connection
/// answering another id in a later round, or both connections answering one id, fail the
/// check naming transaction pooling, and nothing claims.
#[test]
fn server_process_ids_that_change_or_are_shared_fail_the_check() {
    // The pings in order: b's, then a's, in each round; `ids` answers the n-th.
    type Ids = fn(usize) -> i64;
    let cases: [(&str, Ids); 3] = [
        ("a's id changes in the third round", |n| match n {
            4 => 30,
            n if n % 2 == 0 => 20,
            _ => 10,
        }),
        ("b's id changes in the second round", |n| match n {
            2 => 40,
            n if n % 2 == 0 => 20,
            _ => 10,
        }),
        ("both connections answer one id", |_| 10),
    ];
    for (case, ids) in cases {
        for desc in [advisory(), row_lock()] {
            let mut sim = Sim::new(Dialect::Postgres, desc, 1);
            let mut pings = 0;
            sim.hook(move |_, c| match kind_of(c) {
                Some(StatementKind::Ping) => {
                    let id = ids(pings);
                    pings += 1;
                    Intercept::Answer(Reply::Rows(vec![Row::values(vec![Value::Int(id)])]))
                }
                _ => Intercept::Run,
            });
            sim.insert(0);
            let p = sim.spawn();
            sim.run();
            let sub = sim.procs[p].sub;
            let failed = sim.events(p, 0).into_iter().any(|e| {
                matches!(e, Event::CheckFailed { sub: s, error: CheckError::TransactionPooling { .. } } if s == sub)
            });
            assert!(failed, "{case}, {:?}: the check fails", desc.form());
            assert!(!sim.events(p, 0).contains(&Event::Ready { sub }), "{case}");
            sim.advance(Duration::from_secs(10));
            for claiming in [StatementKind::Take, StatementKind::CountRow] {
                assert_eq!(sim.executed(claiming), 0, "{case}: no claim");
            }
            assert!(
                sim.db.advisory.is_empty(),
                "{case}: the probe key is released"
            );
        }
    }
}

/// Where the adapter's prepared statements live in the server session, every form on
/// PostgreSQL checks, not only those that lock: the lease form and the row lock form without
/// an attempt column take the probe key on the check's connection and find it held on a
/// second one, taken first and run a first statement before the lock, and are ready. MySQL
/// does not check.
#[test]
fn with_prepared_statements_every_form_on_postgres_checks_its_sessions() {
    for desc in [lease(), row_lock_plain(), advisory(), row_lock()] {
        let mut sim = Sim::new(Dialect::Postgres, desc, 1);
        sim.prepared_statements = true;
        let p = sim.spawn();
        sim.run();
        let sub = sim.procs[p].sub;
        assert!(
            sim.events(p, 0).contains(&Event::Ready { sub }),
            "{:?}",
            desc.form()
        );
        assert_eq!(try_locks(&sim, p), 8, "{:?}: 4 rounds", desc.form());
        assert!(sim.db.advisory.is_empty(), "the probe key is released");
        // The second connection is taken before the first lock: no lock is held while the
        // pool is waited on.
        let ops = sim.ops(p, 0);
        let second = ops
            .iter()
            .enumerate()
            .filter(|(_, op)| **op == Acquire)
            .nth(1)
            .map(|(i, _)| i)
            .expect("a second connection");
        let first_lock = ops
            .iter()
            .position(|op| *op == Exec(StatementKind::TryLock))
            .expect("a lock");
        let ping = ops
            .iter()
            .position(|op| *op == Exec(StatementKind::Ping))
            .expect("the second connection's first statement");
        assert!(
            second < ping && ping < first_lock,
            "{:?}: {ops:?}",
            desc.form()
        );
    }
    for desc in [lease(), row_lock_plain()] {
        let mut sim = Sim::new(Dialect::MySql, desc, 1);
        sim.prepared_statements = true;
        let p = sim.spawn();
        sim.run();
        assert_eq!(try_locks(&sim, p), 0, "MySQL {:?}", desc.form());
    }
}

/// Through transaction pooling, where the adapter's prepared statements live in the server
/// session, the lease form and the row lock form without an attempt column fail the check
/// naming transaction pooling and the simple query protocol; the key is released and nothing
/// claims.
#[test]
fn with_prepared_statements_a_pooled_session_fails_every_form() {
    for desc in [lease(), row_lock_plain()] {
        let mut sim = Sim::new(Dialect::Postgres, desc, 1);
        sim.prepared_statements = true;
        let mut tries = 0;
        sim.hook(move |_, c| match kind_of(c) {
            Some(StatementKind::TryLock) => {
                tries += 1;
                if tries == 2 {
                    Intercept::Answer(Reply::Rows(vec![Row::values(vec![Value::Bool(true)])]))
                } else {
                    Intercept::Run
                }
            }
            _ => Intercept::Run,
        });
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
            .unwrap_or_else(|| panic!("{:?}: the check fails", desc.form()));
        assert_eq!(error, CheckError::PreparedStatements { table: "jobs" });
        let message = error.to_string();
        assert!(
            message.contains("transaction pooling")
                && message.contains("prepared statements")
                && message.contains("simple_query(true)"),
            "{message}"
        );
        assert!(!sim.events(p, 0).contains(&Event::Ready { sub }));
        sim.advance(Duration::from_secs(10));
        for claiming in [
            StatementKind::Take,
            StatementKind::ClaimLease,
            StatementKind::CountRow,
        ] {
            assert_eq!(sim.executed(claiming), 0, "{:?}: no claim", desc.form());
        }
        assert!(sim.db.advisory.is_empty(), "the probe key is released");
        assert_eq!(sim.procs[p].broker.held_connections(), 0);
    }
}

/// A second connection that cannot be had (a pool of one): where the form holds no session
/// lock the start warns and the subscription is ready, no lock taken; where it holds them the
/// check runs again, as after any passing failure.
#[test]
fn a_second_connection_that_cannot_be_had_skips_the_check_only_where_the_form_needs_none() {
    for (desc, needed) in [(lease(), false), (advisory(), true)] {
        let mut sim = Sim::new(Dialect::Postgres, desc, 1);
        sim.prepared_statements = true;
        let mut acquires = 0;
        sim.hook(move |_, c| {
            if c.action == Action::Acquire {
                acquires += 1;
                if acquires == 2 {
                    return Intercept::Answer(Reply::Failed(DbError::new(
                        ErrorKind::PoolClosed,
                        "no connection in time",
                    )));
                }
            }
            Intercept::Run
        });
        let p = sim.spawn();
        sim.run();
        let sub = sim.procs[p].sub;
        let events = sim.events(p, 0);
        let warned = events.iter().any(|e| {
            matches!(e, Event::Warning { message, .. }
                if message.contains("second connection") && message.contains("no connection in time"))
        });
        let retried = events.iter().any(|e| matches!(e, Event::StartRetry { .. }));
        assert_eq!(warned, !needed, "{:?}: {events:?}", desc.form());
        assert_eq!(retried, needed, "{:?}: {events:?}", desc.form());
        assert_eq!(
            events.contains(&Event::Ready { sub }),
            !needed,
            "{:?}: {events:?}",
            desc.form()
        );
        if !needed {
            assert_eq!(try_locks(&sim, p), 0, "no lock without a second connection");
        }
        assert!(sim.db.advisory.is_empty());
    }
}

/// The second connection's try fails with another client's prepared statement (the driver's
/// statement names clash through transaction pooling): the start fails at once naming
/// transaction pooling, and the check's connection releases the probe key before it closes,
/// so no lock stays on a pooled server session.
#[test]
fn a_clash_on_the_second_connection_fails_the_start_and_releases_the_key() {
    for desc in [lease(), advisory(), row_lock()] {
        let mut sim = Sim::new(Dialect::Postgres, desc, 1);
        sim.prepared_statements = true;
        let mut tries = 0;
        sim.hook(move |_, c| match kind_of(c) {
            Some(StatementKind::TryLock) => {
                tries += 1;
                if tries == 2 {
                    Intercept::Answer(Reply::Failed(DbError::new(
                        ErrorKind::PreparedStatement,
                        "prepared statement \"sqlx_s_1\" already exists",
                    )))
                } else {
                    Intercept::Run
                }
            }
            _ => Intercept::Run,
        });
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
            .unwrap_or_else(|| panic!("{:?}: the check fails", desc.form()));
        assert!(
            matches!(error, CheckError::Refused { .. }),
            "{:?}: {error:?}",
            desc.form()
        );
        let message = error.to_string();
        assert!(
            message.contains("transaction pooling") && message.contains("sqlx_s_1"),
            "{message}"
        );
        let ops = sim.ops(p, 0);
        let tail: Vec<&Op> = ops
            .iter()
            .filter(|op| matches!(op, Exec(StatementKind::Unlock) | Close))
            .collect();
        assert_eq!(
            tail,
            [&Close, &Exec(StatementKind::Unlock), &Close],
            "{:?}: the second connection closes, the first releases the key and closes: {ops:?}",
            desc.form()
        );
        assert!(sim.db.advisory.is_empty(), "no probe key left");
        sim.advance(Duration::from_secs(120));
        assert_eq!(try_locks(&sim, p), 2, "{:?}: no second try", desc.form());
        assert_eq!(sim.procs[p].broker.held_connections(), 0);
    }
}

/// The second connection runs a first statement before any lock is taken: where it fails with
/// another client's prepared statement (the driver's first statement name, taken on the pooled
/// server session by the check's own connection), the start fails at once naming transaction
/// pooling, no key is locked, and both connections close.
#[test]
fn a_clash_on_the_second_connections_first_statement_fails_the_start_before_any_lock() {
    for desc in [lease(), advisory(), row_lock()] {
        let mut sim = Sim::new(Dialect::Postgres, desc, 1);
        sim.prepared_statements = true;
        sim.hook(move |_, c| match kind_of(c) {
            Some(StatementKind::Ping) => Intercept::Answer(Reply::Failed(DbError::new(
                ErrorKind::PreparedStatement,
                "prepared statement \"sqlx_s_1\" already exists",
            ))),
            _ => Intercept::Run,
        });
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
            .unwrap_or_else(|| panic!("{:?}: the check fails", desc.form()));
        assert!(
            matches!(error, CheckError::Refused { .. })
                && error.to_string().contains("transaction pooling"),
            "{:?}: {error}",
            desc.form()
        );
        let ops = sim.ops(p, 0);
        assert_eq!(try_locks(&sim, p), 0, "{:?}: no lock: {ops:?}", desc.form());
        assert_eq!(
            ops.iter().filter(|op| **op == Close).count(),
            2,
            "{:?}: both connections close: {ops:?}",
            desc.form()
        );
        assert!(sim.db.advisory.is_empty());
        assert_eq!(sim.procs[p].broker.held_connections(), 0);
    }
}

//! The advisory form: one row of a key in work at a time, the key's lock held by a session of
//! its own while the handler runs, with no transaction open.

use super::*;

/// "A claim selects as many due rows as it may take, in claim order, each with its key."
#[test]
fn advisory_claim_selects_candidates_in_claim_order_with_their_keys() {
    for dialect in SERVERS {
        let sim = Sim::start(dialect, advisory(), 3, &[2, 0, 1, 3, 4]);
        let candidates = only(sim.runs_of(0, 0, StatementKind::Candidates));
        let listed: Vec<Vec<Value>> = match &candidates.reply {
            Reply::Rows(rows) => rows.iter().map(|r| r.values.clone()).collect(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            listed[..3],
            [
                vec![Value::Int(1), Value::Text("jobs-2".into())],
                vec![Value::Int(2), Value::Text("jobs-0".into())],
                vec![Value::Int(3), Value::Text("jobs-1".into())],
            ],
            "{dialect:?}"
        );
        let delivered = sim.delivered(0, 0);
        let got: Vec<(Option<i64>, Option<&str>)> = delivered
            .iter()
            .map(|d| (d.row, d.key.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (Some(1), Some("jobs-2")),
                (Some(2), Some("jobs-0")),
                (Some(3), Some("jobs-1"))
            ],
            "{dialect:?}: in claim order, as many as the workers may take"
        );
        let locked: Vec<Value> = sim
            .runs_of(0, sim.ready_at(0), StatementKind::TryLock)
            .iter()
            .map(|r| r.bind(Arg::Key))
            .collect();
        assert_eq!(
            locked,
            ["jobs-2", "jobs-0", "jobs-1"].map(|k| lock_arg(dialect, k)),
            "{dialect:?}"
        );
    }
}

/// "It locks each key on a connection of its own, without waiting."
#[test]
fn advisory_locks_each_key_on_a_connection_of_its_own_without_waiting() {
    for dialect in SERVERS {
        let sim = Sim::start(dialect, advisory(), 3, &[0, 1, 2]);
        let locks = sim.runs_of(0, sim.ready_at(0), StatementKind::TryLock);
        assert_eq!(locks.len(), 3, "{dialect:?}");
        let conns: BTreeSet<ConnId> = locks.iter().map(|r| r.conn).collect();
        assert_eq!(conns.len(), 3, "{dialect:?}: a connection of its own each");
        for row in [1, 2, 3] {
            assert!(conns.contains(&sim.conn_of(0, row)), "{dialect:?}");
        }
        let holders: BTreeSet<SessId> = sim.db.advisory.values().map(|(s, _)| *s).collect();
        assert_eq!(sim.db.advisory.len(), 3);
        assert_eq!(
            holders.len(),
            3,
            "{dialect:?}: three sessions hold the three keys"
        );
        assert_eq!(sim.procs[0].broker.held_connections(), 3);
        let sql = match &sim.statements(0).form {
            FormStatements::Advisory(f) => match &f.keys {
                KeyLocks::Database { try_lock, .. } => try_lock.sql.clone(),
                other => panic!("the database's locks, not {other:?}"),
            },
            other => panic!("the advisory form's statements, not {other:?}"),
        };
        match dialect {
            Dialect::Postgres => assert!(sql.contains("pg_try_advisory_lock("), "{sql}"),
            _ => assert!(sql.contains("GET_LOCK(?, 0)"), "{sql}"),
        }
    }
}

/// "... and passes over a key held elsewhere": the next candidate is taken.
#[test]
fn advisory_passes_over_a_key_held_elsewhere_and_takes_the_next_candidate() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, advisory(), 1);
        sim.insert(0);
        sim.insert(1);
        let other = sim.hold_elsewhere("jobs-0");
        sim.spawn();
        sim.run();
        let tries: Vec<(Value, Reply<i64>)> = sim
            .runs_of(0, sim.ready_at(0), StatementKind::TryLock)
            .iter()
            .map(|r| (r.bind(Arg::Key), r.reply.clone()))
            .collect();
        assert_eq!(
            tries,
            [
                (lock_arg(dialect, "jobs-0"), bool_reply(false)),
                (lock_arg(dialect, "jobs-1"), bool_reply(true)),
            ],
            "{dialect:?}"
        );
        let d = only(sim.delivered(0, 0));
        assert_eq!(d.row, Some(2), "{dialect:?}");
        assert_eq!(
            sim.row(1).attempt,
            0,
            "{dialect:?}: the passed-over row is untouched"
        );
        // Once the other system lets go, the row is taken.
        sim.db.kill(other);
        sim.settle(0, d.delivery, Outcome::Ack);
        sim.run();
        sim.advance(POLL);
        assert_eq!(sim.delivered_rows(0, 0), [2, 1], "{dialect:?}");
    }
}

/// Several processes on one table: a claim whose first look finds only keys held elsewhere
/// (here, by another process of the service) looks again at once, passing over those keys,
/// and takes the rows of free keys behind them; no claim waits for a poll while they wait.
#[test]
fn advisory_looks_past_keys_held_elsewhere_at_once() {
    for dialect in SERVERS {
        // Keys 0 and 1, then key 2 behind them.
        let mut sim = Sim::start(dialect, advisory(), 2, &[0, 1, 0, 1, 2]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 2], "{dialect:?}");
        let second = sim.spawn();
        sim.run();
        // Its first look reads the first rows (keys 0 and 1, held by the first process), and
        // the next passes over both keys, at the same time.
        let looks = sim.runs_of(second, 0, StatementKind::Candidates);
        assert!(looks.len() >= 2, "{dialect:?}: {} looks", looks.len());
        let second_look = looks[1].statement.as_ref().expect("a statement");
        let excluded: Vec<Value> = looks[1]
            .binds
            .iter()
            .zip(second_look.args.iter())
            .filter(|(_, a)| matches!(a, Arg::ExcludedKey(_)))
            .map(|(v, _)| v.clone())
            .collect();
        for key in ["jobs-0", "jobs-1"] {
            assert!(
                excluded.contains(&Value::Text(key.into())),
                "{dialect:?}: the second look passes over {key}: {excluded:?}"
            );
        }
        assert_eq!(
            sim.delivered_rows(second, 0),
            [5],
            "{dialect:?}: the row of the free key, with no poll"
        );
        assert_eq!(sim.delivered_at(second, 0, 5), Some(T0), "{dialect:?}");
    }
}

/// A settlement that releases a key lets the next claim run at once, even when the last claim
/// found nothing: the next row of the key waits for no poll.
#[test]
fn advisory_a_released_key_is_claimed_again_at_once() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, advisory(), 2, &[0, 0, 0]);
        assert_eq!(sim.delivered_rows(0, 0), [1], "{dialect:?}");
        // The claim found the key in work and nothing else: the next waits for the poll.
        let mark = sim.mark();
        let delivery = sim.delivery(0, 1);
        let settled_at = sim.now;
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        assert_eq!(sim.delivered_rows(0, mark), [2], "{dialect:?}");
        assert_eq!(
            sim.delivered_at(0, mark, 2),
            Some(settled_at),
            "{dialect:?}"
        );
        // A retry and a drop release the key too.
        for end in [Some(Outcome::Retry), None] {
            let mark = sim.mark();
            let delivery = sim.delivery(0, 2);
            match end {
                Some(outcome) => sim.settle(0, delivery, outcome),
                None => sim.drop_delivery(0, delivery),
            }
            sim.run();
            assert_eq!(
                sim.delivered_rows(0, mark),
                [2],
                "{dialect:?}, {end:?}: the row given back is taken again at once"
            );
        }
    }
}

/// A row of a key held by another system waits for that key, however many looks pass over
/// it, and the rows behind it of free keys flow meanwhile.
#[test]
fn advisory_free_keys_flow_while_another_system_holds_one() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, advisory(), 1);
        for channel in [0, 1, 0, 1, 0, 1] {
            sim.insert(channel);
        }
        let other = sim.hold_elsewhere("jobs-0");
        sim.spawn();
        sim.run();
        for expected in [2, 4, 6] {
            assert_eq!(
                sim.delivered_rows(0, 0).last(),
                Some(&expected),
                "{dialect:?}"
            );
            let delivery = sim.delivery(0, expected);
            sim.settle(0, delivery, Outcome::Ack);
            sim.run();
        }
        assert_eq!(
            sim.delivered_rows(0, 0),
            [2, 4, 6],
            "{dialect:?}: no poll between them"
        );
        assert_eq!(sim.now, T0, "{dialect:?}: no time passed");
        // The other system lets go: its rows follow at the next look, in order.
        sim.db.kill(other);
        sim.advance(POLL);
        for expected in [1, 3, 5] {
            let delivery = sim.delivery(0, expected);
            sim.settle(0, delivery, Outcome::Ack);
            sim.run();
        }
        assert_eq!(sim.delivered_rows(0, 0), [2, 4, 6, 1, 3, 5], "{dialect:?}");
    }
}

/// "A key on another column keeps the rows that share it in work one at a time", across
/// processes too.
#[test]
fn advisory_rows_sharing_a_key_go_into_work_one_at_a_time() {
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, advisory(), 3, &[0, 0, 1]);
        assert_eq!(sim.delivered_rows(0, 0), [1, 3], "{dialect:?}");
        let second = sim.spawn();
        sim.run();
        sim.advance(POLL * 3);
        assert!(
            sim.delivered(second, 0).is_empty(),
            "{dialect:?}: the other process passes over the key in work"
        );
        assert_eq!(sim.delivered_rows(0, 0), [1, 3], "{dialect:?}");
        let mark = sim.mark();
        let first = sim.delivery(0, 1);
        sim.settle(0, first, Outcome::Ack);
        sim.run();
        sim.advance(POLL);
        let mut next = sim.delivered_rows(0, mark);
        next.extend(sim.delivered_rows(second, mark));
        assert_eq!(next, [2], "{dialect:?}: the next row of the key, once");
    }
}

/// "A key on the row's id holds each row alone."
#[test]
fn advisory_key_on_the_id_holds_each_row_alone() {
    const ON_ID: &[KeyPart] = &[KeyPart::Literal("jobs-"), KeyPart::Column("id")];
    for dialect in SERVERS {
        let sim = Sim::start(dialect, advisory_keyed(ON_ID), 3, &[0, 0, 0]);
        let keys: Vec<Option<String>> = sim
            .delivered(0, 0)
            .iter()
            .map(|d| d.key.as_deref().map(str::to_owned))
            .collect();
        assert_eq!(
            keys,
            [
                Some("jobs-1".into()),
                Some("jobs-2".into()),
                Some("jobs-3".into())
            ],
            "{dialect:?}"
        );
    }
}

/// "Then it takes the row while the row is still claimable: the take counts the attempt and
/// reads the row, and it commits, so a crash spends an attempt."
#[test]
fn advisory_take_counts_the_attempt_and_commits_before_delivery() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
        let d = only(sim.delivered(0, 0));
        assert_eq!(d.attempt, Some(1), "{dialect:?}");
        let conn = sim.conn_of(0, 1);
        let ops = sim.ops_on(0, conn, 0);
        assert_eq!(
            ops[ops.len() - take_ops(dialect).len()..],
            take_ops(dialect)
        );
        assert_eq!(sim.row(1).attempt, 1, "{dialect:?}: counted");
        assert!(
            !sim.db.sessions.values().any(|s| s.in_tx),
            "{dialect:?}: committed"
        );
        sim.crash(0);
        assert_eq!(
            sim.row(1).attempt,
            1,
            "{dialect:?}: the crash spent the attempt"
        );
        let second = sim.spawn();
        sim.run();
        let again = only(sim.delivered(second, 0));
        assert_eq!(again.row, Some(1), "{dialect:?}: the row returns at once");
        assert_eq!(again.attempt, Some(2), "{dialect:?}");
    }
}

/// "Then it takes the row while the row is still claimable": a candidate settled meanwhile is
/// not taken; its key is unlocked and the next candidate taken.
#[test]
fn advisory_take_passes_over_a_row_no_longer_claimable() {
    for dialect in SERVERS {
        let mut sim = Sim::new(dialect, advisory(), 1);
        sim.insert(0);
        sim.insert(1);
        sim.spawn();
        let take = sim.run_until(0, |c| kind_of(c) == Some(take_kind(dialect)));
        // Another process settled row 1 between the candidates and the take.
        sim.db.rows.remove(&1);
        let mark = sim.mark();
        sim.run();
        let mut expected = vec![Exec(take_kind(dialect)), Exec(StatementKind::Unlock)];
        expected.push(Exec(StatementKind::TryLock));
        expected.extend(take_ops(dialect));
        assert_eq!(sim.ops_on(0, take.conn, mark), expected, "{dialect:?}");
        let unlock = only(sim.runs_of(0, mark, StatementKind::Unlock));
        assert_eq!(unlock.bind(Arg::Key), lock_arg(dialect, "jobs-0"));
        let d = only(sim.delivered(0, 0));
        assert_eq!((d.row, d.attempt), (Some(2), Some(1)), "{dialect:?}");
        assert_eq!(
            sim.db.advisory.keys().cloned().collect::<Vec<_>>(),
            [lock_arg(dialect, "jobs-1")],
            "{dialect:?}: only the taken row's key is held"
        );
    }
}

/// "The connection that holds the delivery keeps the lock, and no transaction stays open while
/// the handler runs."
#[test]
fn advisory_no_transaction_is_open_while_the_handler_runs() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 2, &[0, 1]);
        sim.advance(Duration::from_secs(30));
        let expected: &[i64] = if dialect == Dialect::Sqlite {
            &[1]
        } else {
            &[1, 2]
        };
        assert_eq!(sim.delivered_rows(0, 0), expected, "{dialect:?}");
        assert_eq!(sim.executed(StatementKind::Begin), 0, "{dialect:?}");
        assert!(sim.db.sessions.values().all(|s| !s.in_tx), "{dialect:?}");
        assert!(sim.db.row_locks.is_empty());
        if dialect != Dialect::Sqlite {
            for (row, key) in [(1, "jobs-0"), (2, "jobs-1")] {
                let sess = sim.sess_of(0, sim.conn_of(0, row));
                assert_eq!(
                    sim.db
                        .advisory
                        .get(&lock_arg(dialect, key))
                        .map(|(s, _)| *s),
                    Some(sess),
                    "{dialect:?}: the delivery's connection keeps the lock"
                );
            }
        }
    }
}

/// "A settlement runs its statement on that connection, where it commits on its own; then the
/// lock is released and the connection goes back to the pool."
#[test]
fn advisory_ack_runs_the_settle_statement_then_unlock_then_release() {
    for dialect in ALL {
        {
            let outcome = Outcome::Ack;
            let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
            let delivery = sim.delivery(0, 1);
            let conn = sim.conn_of(0, 1);
            let mark = sim.mark();
            sim.settle(0, delivery, outcome);
            sim.run();
            let expected = if dialect == Dialect::Sqlite {
                vec![delete(false), Release]
            } else {
                vec![delete(false), Exec(StatementKind::Unlock), Release]
            };
            assert_eq!(
                sim.ops_on(0, conn, mark),
                expected,
                "{dialect:?} {outcome:?}"
            );
            if dialect != Dialect::Sqlite {
                let unlock = only(sim.runs_of(0, mark, StatementKind::Unlock));
                assert_eq!(unlock.bind(Arg::Key), lock_arg(dialect, "jobs-0"));
                assert_eq!(unlock.reply, bool_reply(true));
            }
            assert!(
                sim.events(0, mark)
                    .contains(&Event::Settled { delivery, outcome })
            );
            assert!(!sim.db.rows.contains_key(&1), "{dialect:?}");
            assert!(sim.db.advisory.is_empty());
            assert_eq!(sim.procs[0].broker.held_connections(), 0);
        }
    }
}

/// "retry() runs no statement: the claim counted the attempt, and the release returns the
/// row."
#[test]
fn advisory_retry_runs_no_statement_and_the_row_returns() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Retry);
        sim.run();
        let expected = if dialect == Dialect::Sqlite {
            vec![Release]
        } else {
            vec![Exec(StatementKind::Unlock), Release]
        };
        assert_eq!(sim.ops_on(0, conn, mark), expected, "{dialect:?}");
        let sess = sim.procs[0].adapter.conns.get(&conn).copied();
        assert_eq!(sess, None, "{dialect:?}: the connection went back");
        // The row returns (at once where the database holds the keys, after a poll on
        // SQLite), its attempt counted by the claim alone.
        sim.advance(POLL);
        let again = only(sim.delivered(0, mark));
        assert_eq!(again.row, Some(1), "{dialect:?}: the row returns");
        assert_eq!(again.attempt, Some(2), "{dialect:?}");
        assert_eq!(sim.row(1).attempt, 2, "{dialect:?}");
    }
}

/// A retry takes effect (the release returns the row): the runtime hears so, as it does in the
/// row lock and lease forms.
#[test]
fn advisory_retry_is_reported_settled_like_the_other_forms() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Retry);
        sim.run();
        assert!(
            sim.events(0, mark).contains(&Event::Settled {
                delivery,
                outcome: Outcome::Retry
            }),
            "{dialect:?}: {:?}",
            sim.events(0, mark)
        );
    }
}

/// "A delivery dropped unsettled releases its lock and closes its connection ..., and its row
/// returns."
#[test]
fn advisory_dropped_delivery_unlocks_and_closes_its_connection() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let sess = sim.sess_of(0, conn);
        let mark = sim.mark();
        sim.drop_delivery(0, delivery);
        sim.run();
        let expected = if dialect == Dialect::Sqlite {
            vec![Close]
        } else {
            vec![Exec(StatementKind::Unlock), Close]
        };
        assert_eq!(sim.ops_on(0, conn, mark), expected, "{dialect:?}");
        assert!(sim.events(0, mark).contains(&Event::Returned { delivery }));
        assert!(
            !sim.db.sessions[&sess].alive,
            "{dialect:?}: the session ended"
        );
        assert!(sim.db.advisory.values().all(|(s, _)| *s != sess));
        sim.advance(POLL);
        let again = only(sim.delivered(0, mark));
        assert_eq!(
            (again.row, again.attempt),
            (Some(1), Some(2)),
            "{dialect:?}"
        );
    }
}

/// "... within five seconds": an unlock that never answers does not keep the lock; the
/// connection is closed at `DROP_GRACE`, not before.
#[test]
fn advisory_dropped_delivery_whose_unlock_never_answers_is_closed_within_five_seconds() {
    assert_eq!(DROP_GRACE, Duration::from_secs(5));
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
        let delivery = sim.delivery(0, 1);
        let conn = sim.conn_of(0, 1);
        let sess = sim.sess_of(0, conn);
        sim.advance(Duration::from_millis(300));
        let dropped_at = sim.now;
        sim.hook(|_, c| match kind_of(c) {
            Some(StatementKind::Unlock) => Intercept::Hold,
            _ => Intercept::Run,
        });
        let mark = sim.mark();
        sim.drop_delivery(0, delivery);
        sim.run();
        assert_eq!(sim.procs[0].held.len(), 1, "the unlock hangs");
        assert_eq!(
            sim.timeout(0),
            Some(dropped_at.plus(DROP_GRACE)),
            "{dialect:?}"
        );
        sim.advance_to(just_before(dropped_at.plus(DROP_GRACE)));
        assert!(
            sim.ops_on(0, conn, mark).is_empty(),
            "{dialect:?}: not before"
        );
        assert_eq!(sim.db.advisory.len(), 1);
        sim.advance_to(dropped_at.plus(DROP_GRACE));
        assert_eq!(sim.ops_on(0, conn, mark), [Close], "{dialect:?}");
        assert!(
            !sim.db.sessions[&sess].alive,
            "{dialect:?}: the session ended"
        );
        assert!(
            sim.db.advisory.values().all(|(s, _)| *s != sess),
            "{dialect:?}: and its lock with it"
        );
        assert!(sim.events(0, mark).contains(&Event::Returned { delivery }));
        // The hung unlock answers at last, cut short by the close.
        sim.hook = None;
        for command in sim.take_held(0) {
            sim.run_command(0, command);
        }
        sim.run();
        assert!(!sim.procs[0].adapter.conns.contains_key(&conn));
        // The row returns: the freed worker takes it again.
        sim.advance(POLL);
        assert_eq!(sim.procs[0].broker.held_connections(), sim.in_work(0));
        let again = only(sim.delivered(0, mark));
        assert_eq!(
            (again.row, again.attempt),
            (Some(1), Some(2)),
            "{dialect:?}"
        );
    }
}

/// "Each delivery in work holds a connection of its own until it settles, and a batch holds
/// one row per key."
#[test]
fn advisory_batch_holds_one_row_per_key() {
    for dialect in SERVERS {
        let sim = Sim::start(dialect, advisory(), 5, &[0, 0, 1, 1, 2, 0]);
        let delivered = sim.delivered(0, 0);
        let rows: Vec<Option<i64>> = delivered.iter().map(|d| d.row).collect();
        assert_eq!(rows, [Some(1), Some(3), Some(5)], "{dialect:?}");
        let keys: BTreeSet<Option<&str>> = delivered.iter().map(|d| d.key.as_deref()).collect();
        assert_eq!(keys.len(), 3);
        assert_eq!(sim.procs[0].broker.held_connections(), 3, "{dialect:?}");
        assert_eq!(sim.in_work(0), 3);
    }
}

/// "MySQL and MariaDB lock a name with GET_LOCK: the database's name, a dot and the key."
#[test]
fn advisory_mysql_lock_names_are_the_database_dot_the_key() {
    for dialect in [Dialect::MySql, Dialect::MariaDb] {
        let mut sim = Sim::start(dialect, advisory(), 1, &[0]);
        let lock = only(sim.runs_of(0, sim.ready_at(0), StatementKind::TryLock));
        assert_eq!(lock.bind(Arg::Key), Value::Text("test.jobs-0".into()));
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        let unlock = only(sim.runs_of(0, mark, StatementKind::Unlock));
        assert_eq!(unlock.bind(Arg::Key), Value::Text("test.jobs-0".into()));
    }
}

/// "... or its SHA-256 past 64 characters."
#[test]
fn advisory_mysql_lock_names_past_64_characters_are_their_sha256() {
    for dialect in [Dialect::MySql, Dialect::MariaDb] {
        // 64 characters: the name itself.
        let sim = Sim::start(dialect, advisory_keyed(KEY_64), 1, &[7]);
        let key = only(sim.delivered(0, 0)).key.expect("a key").to_string();
        let name = format!("test.{key}");
        assert_eq!(name.chars().count(), 64);
        let lock = only(sim.runs_of(0, sim.ready_at(0), StatementKind::TryLock));
        assert_eq!(lock.bind(Arg::Key), Value::Text(name), "{dialect:?}");
        // 65 characters: its SHA-256, in lowercase hex.
        let mut sim = Sim::start(dialect, advisory_keyed(KEY_65), 1, &[7]);
        let key = only(sim.delivered(0, 0)).key.expect("a key").to_string();
        let name = format!("test.{key}");
        assert_eq!(name.chars().count(), 65);
        let hashed = sha256_hex(&name);
        assert_eq!(hashed.len(), 64);
        let lock = only(sim.runs_of(0, sim.ready_at(0), StatementKind::TryLock));
        assert_eq!(
            lock.bind(Arg::Key),
            Value::Text(hashed.clone()),
            "{dialect:?}"
        );
        let delivery = sim.delivery(0, 1);
        let mark = sim.mark();
        sim.settle(0, delivery, Outcome::Ack);
        sim.run();
        let unlock = only(sim.runs_of(0, mark, StatementKind::Unlock));
        assert_eq!(unlock.bind(Arg::Key), Value::Text(hashed), "{dialect:?}");
        assert!(sim.db.advisory.is_empty());
    }
}

/// "Postgres locks a 64-bit hash of the key, and a lock lives in the session that took it."
#[test]
fn advisory_postgres_locks_a_64_bit_hash_of_the_key_in_the_session() {
    let sim = Sim::start(Dialect::Postgres, advisory(), 1, &[0]);
    let digest = Sha256::digest(b"jobs-0");
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let hash = Value::Int(i64::from_be_bytes(first));
    let lock = only(sim.runs_of(0, sim.ready_at(0), StatementKind::TryLock));
    assert_eq!(lock.bind(Arg::Key), hash);
    let sess = sim.sess_of(0, sim.conn_of(0, 1));
    assert_eq!(sim.db.advisory.get(&hash).map(|(s, _)| *s), Some(sess));
}

/// "SQLite has no locks a session holds, so the process keeps the keys in work ... a
/// subscription has one delivery in work at a time."
#[test]
fn advisory_sqlite_keeps_keys_in_process_with_one_delivery_in_work() {
    let mut sim = Sim::start(Dialect::Sqlite, advisory(), 3, &[0, 1, 2]);
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    assert!(
        matches!(&sim.statements(0).form, FormStatements::Advisory(f) if f.keys == KeyLocks::Registry),
        "SQLite keeps the keys in the process: no lock statements"
    );
    sim.advance(POLL * 5);
    assert_eq!(
        sim.delivered_rows(0, 0),
        [1],
        "one delivery in work at a time"
    );
    assert_eq!(sim.in_work(0), 1);
    assert_eq!(sim.executed(StatementKind::TryLock), 0);
    assert_eq!(sim.executed(StatementKind::Unlock), 0);
    // Each claim reads the first due row alone.
    for claim in sim.runs_of(0, 0, StatementKind::Candidates) {
        assert_eq!(claim.bind(Arg::Limit), Value::Int(1));
    }
    // Still one connection per delivery in work.
    assert_eq!(sim.procs[0].broker.held_connections(), 1);
}

/// "... and with workers(n) each next row waits up to a poll interval." A claim while the first
/// due row is in work takes nothing, and the next waits for the poll; the settlement that
/// releases the key starts the next claim at once, so the next row waits no longer than it must.
#[test]
fn advisory_sqlite_next_row_waits_up_to_a_poll_interval() {
    let mut sim = Sim::start(Dialect::Sqlite, advisory(), 3, &[0, 1, 2]);
    let start = sim.mark();
    sim.advance(Duration::from_millis(2500));
    // While row 1 is in work, the subscription claims nothing: a claim would read row 1 alone
    // and take nothing.
    assert!(sim.runs_of(0, start, StatementKind::Candidates).is_empty());
    assert_eq!(sim.delivered_rows(0, 0), [1]);
    let delivery = sim.delivery(0, 1);
    let mark = sim.mark();
    let settled_at = sim.now;
    sim.settle(0, delivery, Outcome::Ack);
    sim.run();
    assert_eq!(
        sim.delivered_rows(0, mark),
        [2],
        "the release of the key let the next claim take the next row"
    );
    assert_eq!(
        sim.delivered_at(0, mark, 2),
        Some(settled_at),
        "no wait for the poll"
    );
    assert_eq!(sim.in_work(0), 1, "still one delivery in work at a time");
    // Row 2 in work: row 3 waits for its settlement, however many polls pass.
    let mark = sim.mark();
    sim.advance(POLL * 3);
    assert!(sim.delivered_rows(0, mark).is_empty());
    let delivery = sim.delivery(0, 2);
    sim.settle(0, delivery, Outcome::Ack);
    sim.run();
    assert_eq!(sim.delivered_rows(0, mark), [3]);
}

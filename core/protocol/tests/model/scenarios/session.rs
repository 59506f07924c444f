//! The session check on PostgreSQL of the advisory lock form and of the row lock form with an
//! attempt column (whose counts mark rows with session locks): each connection must be a
//! server session of its own. A second connection that takes a key the first holds, or a
//! first whose unlock finds no lock, reached another client's session: a pooler in
//! transaction pooling.

use super::*;

fn try_locks(sim: &Sim, p: usize) -> usize {
    sim.ops(p, 0)
        .iter()
        .filter(|op| **op == Exec(StatementKind::TryLock))
        .count()
}

/// Directly on the server the probe key's lock is taken on the check's connection and found
/// held on a second one; then it is released, and the subscription is ready. The advisory
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
            2,
            "{:?}: the probe on the check's connection and on a second",
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

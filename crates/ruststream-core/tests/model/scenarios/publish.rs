//! Publishing: SQLite gets one statement at a time, and a batch is one insert, or several in
//! one transaction, written whole or not at all.

use super::*;

/// On SQLite the core hands the adapter one statement at a time: a settlement's statement
/// waits while a claim's runs, instead of waiting in SQLite's busy handler for the write lock,
/// and runs as soon as the claim's has answered.
#[test]
fn sqlite_gets_one_statement_at_a_time() {
    let mut sim = Sim::start(Dialect::Sqlite, lease(), 2, &[0, 1, 2, 3, 4, 5]);
    assert_eq!(sim.delivered_rows(0, 0), [1, 2]);
    let claim = lease_claim_kind(Dialect::Sqlite);
    sim.hook(move |_, c| {
        if kind_of(c) == Some(claim) {
            Intercept::Hold
        } else {
            Intercept::Run
        }
    });
    let first = sim.delivery(0, 1);
    sim.settle(0, first, Outcome::Ack);
    sim.run();
    assert_eq!(sim.procs[0].held.len(), 1, "a claim runs");
    let mark = sim.mark();
    let second = sim.delivery(0, 2);
    sim.settle(0, second, Outcome::Ack);
    sim.run();
    let statements: Vec<Op> = sim
        .ops(0, mark)
        .into_iter()
        .filter(|op| matches!(op, Exec(_)))
        .collect();
    assert!(
        statements.is_empty(),
        "no statement runs beside the claim's: {statements:?}"
    );
    assert!(
        sim.procs[0].queue.is_empty(),
        "the settlement's statement is held back"
    );
    assert_eq!(sim.row(2).attempt, 1, "row 2 is not settled yet");
    sim.hook = None;
    for command in sim.take_held(0) {
        sim.run_command(0, command);
    }
    sim.run();
    let ops = sim.ops(0, mark);
    let claim_at = ops
        .iter()
        .position(|op| *op == Exec(claim))
        .expect("the claim answered");
    let delete_at = ops
        .iter()
        .position(|op| matches!(op, Exec(StatementKind::Delete { .. })))
        .expect("then the settlement ran");
    assert!(claim_at < delete_at, "{ops:?}");
    assert!(!sim.db.rows.contains_key(&2), "row 2 settled");
}

/// A batch of up to `PUBLISH_BATCH` rows is one insert, with no transaction around it.
#[test]
fn publish_all_writes_a_small_batch_in_one_insert() {
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[]);
        let mark = sim.mark();
        let id = sim.publish_all(0, 2, 3).expect("publishes");
        sim.run();
        let publishes = sim.runs_of(0, mark, StatementKind::Publish);
        assert_eq!(publishes.len(), 1, "{dialect:?}");
        assert_eq!(
            publishes[0].binds.len(),
            3 * sim.statements(0).publish.args.len()
        );
        assert_eq!(
            sim.ops(0, mark)[..3],
            [Acquire, Exec(StatementKind::Publish), Release],
            "{dialect:?}"
        );
        assert_eq!(sim.db.rows.len(), 3, "{dialect:?}");
        assert_eq!(sim.published(0, mark), [(id, Ok(()))], "{dialect:?}");
    }
    // Each row binds its own values.
    for dialect in SERVERS {
        let mut sim = Sim::start(dialect, advisory(), 1, &[]);
        let publisher = sim.procs[0].publisher;
        let batch = (0..3)
            .map(|channel| Publish {
                payload: b"{}".to_vec(),
                columns: vec![("channel", Value::Int(channel))],
                ..Publish::default()
            })
            .collect();
        sim.procs[0]
            .broker
            .publish_all(publisher, batch, sim.now)
            .expect("publishes");
        sim.poll(0);
        sim.run();
        let channels: Vec<i64> = sim.db.rows.values().map(|r| r.channel).collect();
        assert_eq!(channels, [0, 1, 2], "{dialect:?}");
    }
}

/// More rows than one insert takes run as several inserts in one transaction.
#[test]
fn publish_all_writes_a_large_batch_in_one_transaction() {
    use ruststream_core::PUBLISH_BATCH;
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[]);
        let mark = sim.mark();
        let rows = 2 * PUBLISH_BATCH + PUBLISH_BATCH / 2;
        let id = sim.publish_all(0, 1, rows).expect("publishes");
        sim.run();
        let ops = sim.ops(0, mark);
        let publishing: Vec<Op> = ops
            .iter()
            .take_while(|op| **op != Release)
            .cloned()
            .collect();
        assert_eq!(
            publishing,
            [
                Acquire,
                Exec(StatementKind::Begin),
                Exec(StatementKind::Publish),
                Exec(StatementKind::Publish),
                Exec(StatementKind::Publish),
                Exec(StatementKind::Commit),
            ],
            "{dialect:?}"
        );
        let per_row = sim.statements(0).publish.args.len();
        let sizes: Vec<usize> = sim
            .runs_of(0, mark, StatementKind::Publish)
            .iter()
            .map(|r| r.binds.len() / per_row)
            .collect();
        assert_eq!(sizes, [PUBLISH_BATCH, PUBLISH_BATCH, PUBLISH_BATCH / 2]);
        assert_eq!(sim.db.rows.len(), rows, "{dialect:?}");
        assert_eq!(sim.published(0, mark), [(id, Ok(()))], "{dialect:?}");
    }
}

/// A batch is written whole or not at all: an insert that fails closes the connection, which
/// rolls back the inserts before it, and the publish answers the error.
#[test]
fn publish_all_that_fails_midway_writes_nothing() {
    use ruststream_core::PUBLISH_BATCH;
    for dialect in ALL {
        let mut sim = Sim::start(dialect, lease(), 1, &[]);
        let mut inserts = 0;
        sim.hook(move |_, c| {
            if kind_of(c) == Some(StatementKind::Publish) {
                inserts += 1;
                if inserts == 2 {
                    return Intercept::Answer(Reply::Failed(DbError::new(
                        ErrorKind::Other,
                        "duplicate key",
                    )));
                }
            }
            Intercept::Run
        });
        let mark = sim.mark();
        let id = sim.publish_all(0, 1, 2 * PUBLISH_BATCH).expect("publishes");
        sim.run();
        assert!(sim.db.rows.is_empty(), "{dialect:?}: nothing written");
        let published = sim.published(0, mark);
        assert_eq!(published.len(), 1, "{dialect:?}");
        assert_eq!(published[0].0, id);
        assert!(published[0].1.is_err(), "{dialect:?}: {published:?}");
        assert!(
            sim.ops(0, mark).contains(&Close),
            "{dialect:?}: the session ends"
        );
        assert_eq!(sim.procs[0].broker.held_connections(), 0);
    }
}

/// A row of a batch that lacks a column the table needs refuses the whole batch before
/// anything runs.
#[test]
fn publish_all_with_a_row_missing_a_column_is_refused() {
    let mut sim = Sim::start(Dialect::Postgres, advisory(), 1, &[]);
    let publisher = sim.procs[0].publisher;
    let good = Publish {
        payload: b"{}".to_vec(),
        columns: vec![("channel", Value::Int(1))],
        ..Publish::default()
    };
    let bad = Publish {
        payload: b"{}".to_vec(),
        ..Publish::default()
    };
    let mark = sim.mark();
    let refused = sim.procs[0]
        .broker
        .publish_all(publisher, vec![good, bad], sim.now);
    assert_eq!(
        refused,
        Err(BrokerError::MissingValue {
            table: "jobs",
            column: "channel"
        })
    );
    sim.poll(0);
    sim.run();
    assert!(sim.ops(0, mark).is_empty());
    assert!(sim.db.rows.is_empty());
}

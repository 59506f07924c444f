//! The schema at the start: a table without an index that serves its claims is reported
//! (or refused, or given the index), a table that does not exist is created where the
//! subscription says so; and the reads of a table's state (its counts, its failed rows).

use ruststream_core::{MissingIndex, ReadTable, Stats, TableRead};

use super::*;

/// The advisory form with a due column: its claims read in due order.
fn advisory_due() -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .advisory(KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .due(Column::new("due_at"))
        .desc()
}

/// The warnings about the table's indexes.
fn warnings(sim: &Sim, p: usize) -> Vec<String> {
    all_warnings(sim, p)
        .into_iter()
        .filter(|m| !m.contains("keeps no failed rows"))
        .collect()
}

fn all_warnings(sim: &Sim, p: usize) -> Vec<String> {
    sim.events(p, 0)
        .into_iter()
        .filter_map(|e| match e {
            Event::Warning { message, .. } => Some(message.to_string()),
            _ => None,
        })
        .collect()
}

/// A table without `failed_at` is warned about once, as its subscription starts: its rows
/// that fail are retried forever. A table that keeps failed rows is not.
#[test]
fn a_table_without_failed_at_is_warned_about_once_at_the_start() {
    for dialect in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
        let mut sim = Sim::start(dialect, lease(), 1, &[0, 1]);
        sim.advance(POLL * 3);
        let warned: Vec<String> = all_warnings(&sim, 0)
            .into_iter()
            .filter(|m| m.contains("keeps no failed rows"))
            .collect();
        assert_eq!(warned.len(), 1, "{dialect:?}: {warned:?}");
        assert!(
            warned[0].contains("table `jobs`") && warned[0].contains("failed_at"),
            "{}",
            warned[0]
        );
        let kept = *InboxSpec::new("jobs", Column::new("id").generated())
            .payload(Column::new("payload"))
            .lease(Column::new("locked_until"))
            .failed(Column::new("failed_at"))
            .desc();
        let sim = Sim::start(dialect, kept, 1, &[0]);
        assert!(
            all_warnings(&sim, 0).is_empty(),
            "{dialect:?}: {:?}",
            all_warnings(&sim, 0)
        );
    }
}

/// Without a claim index the subscription starts and says so, naming the table and the
/// index to create; with one it says nothing; a table ordered by its id alone is not checked.
#[test]
fn a_missing_claim_index_warns_naming_the_table_and_the_index() {
    for dialect in [Dialect::Postgres, Dialect::MariaDb, Dialect::Sqlite] {
        for desc in [advisory_due(), lease()] {
            let mut sim = Sim::new(dialect, desc, 1);
            sim.db.missing_claim_index = true;
            sim.insert(0);
            let p = sim.spawn();
            sim.run();
            let sub = sim.procs[p].sub;
            assert!(sim.events(p, 0).contains(&Event::Ready { sub }));
            let warned = warnings(&sim, p);
            assert_eq!(warned.len(), 1, "{dialect:?}: {warned:?}");
            assert!(
                warned[0].contains("table `jobs` has no index that serves its claims")
                    && warned[0].contains("CREATE INDEX")
                    && warned[0].contains("jobs_claim"),
                "{dialect:?}: {}",
                warned[0]
            );
            assert_eq!(
                dialect == Dialect::MariaDb,
                warned[0].contains("locks every row it sorts"),
                "{}",
                warned[0]
            );
            assert_eq!(sim.delivered_rows(p, 0), [1], "it serves all the same");

            let mut indexed = Sim::new(dialect, desc, 1);
            let p = indexed.spawn();
            indexed.run();
            assert!(warnings(&indexed, p).is_empty());
        }
    }
    let mut sim = Sim::new(Dialect::Postgres, advisory(), 1);
    sim.db.missing_claim_index = true;
    let p = sim.spawn();
    sim.run();
    assert!(warnings(&sim, p).is_empty());
}

/// `MissingIndex::Fail` refuses the start, naming the table, the order and the index;
/// `MissingIndex::Ignore` does not look.
#[test]
fn a_missing_claim_index_fails_or_is_ignored_as_the_subscription_says() {
    let mut sim = Sim::new(Dialect::Postgres, row_lock(), 1);
    sim.db.missing_claim_index = true;
    sim.missing_index = MissingIndex::Fail;
    sim.insert(0);
    let p = sim.spawn();
    sim.run();
    let failed = sim.events(p, 0).into_iter().find_map(|e| match e {
        Event::CheckFailed { error, .. } => Some(error.to_string()),
        _ => None,
    });
    let failed = failed.expect("the check fails");
    assert!(
        failed.contains("table `jobs` has no index that serves its claims (ordered by due_at, id)")
            && failed.contains(
                "CREATE INDEX IF NOT EXISTS \"jobs_claim\" ON \"jobs\" (\"due_at\", \"id\")"
            ),
        "{failed}"
    );
    assert!(sim.delivered_rows(p, 0).is_empty());
    assert_eq!(sim.procs[p].broker.held_connections(), 0);

    let mut sim = Sim::new(Dialect::Postgres, row_lock(), 1);
    sim.db.missing_claim_index = true;
    sim.missing_index = MissingIndex::Ignore;
    let p = sim.spawn();
    sim.run();
    assert!(warnings(&sim, p).is_empty());
    assert_eq!(sim.executed(StatementKind::ListIndexes), 0);
}

/// `ensure_schema` creates a missing table (and its indexes) and then checks it; on a table
/// without its claim index it creates the index. Without it a missing table fails the check.
#[test]
fn ensure_schema_creates_the_missing_table_and_index() {
    for dialect in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
        let mut sim = Sim::new(dialect, advisory_due(), 1);
        sim.db.missing_table = true;
        sim.db.missing_claim_index = true;
        sim.ensure_schema = true;
        let p = sim.spawn();
        sim.run();
        let sub = sim.procs[p].sub;
        assert!(
            sim.events(p, 0).contains(&Event::Ready { sub }),
            "{dialect:?}"
        );
        let created: Vec<String> = sim
            .runs_of(p, 0, StatementKind::CreateSchema)
            .iter()
            .map(|r| r.statement.as_ref().unwrap().sql.to_string())
            .collect();
        let expected = ruststream_core::Ddl::new(dialect, &advisory_due()).statements();
        assert_eq!(created, expected, "{dialect:?}");
        assert!(warnings(&sim, p).is_empty());

        let mut sim = Sim::new(dialect, advisory_due(), 1);
        sim.db.missing_claim_index = true;
        sim.ensure_schema = true;
        let p = sim.spawn();
        sim.run();
        let created = sim.runs_of(p, 0, StatementKind::CreateSchema);
        assert_eq!(created.len(), 1, "{dialect:?}");
        assert!(
            created[0]
                .statement
                .as_ref()
                .unwrap()
                .sql
                .contains("jobs_claim")
        );
    }
    let mut sim = Sim::new(Dialect::Postgres, advisory(), 1);
    sim.db.missing_table = true;
    let p = sim.spawn();
    sim.run();
    assert!(sim.events(p, 0).iter().any(|e| matches!(
        e,
        Event::CheckFailed {
            error: ruststream_core::CheckError::MissingTable { table: "jobs" },
            ..
        }
    )));
    assert_eq!(sim.executed(StatementKind::CreateSchema), 0);
}

/// A read of the counts answers what the table holds: rows due, due later, held by a lease,
/// failed; the oldest due time; on a connection given back after.
#[test]
fn the_counts_read_what_the_table_holds() {
    let mut sim = Sim::start(Dialect::Postgres, lease(), 1, &[0, 1, 2]);
    let p = 0;
    // One row is in work (its lease runs), two wait.
    assert_eq!(sim.in_work(p), 1);
    let later = sim.insert(3);
    sim.db.rows.get_mut(&later).unwrap().due = sim.now.plus(Duration::from_secs(60)).micros();
    let publisher = sim.procs[p].publisher;
    let now = sim.now;
    let mark = sim.mark();
    let read = sim.procs[p]
        .broker
        .read_table(publisher, ReadTable::Stats, now)
        .expect("reads");
    sim.poll(p);
    sim.run();
    let result = sim.events(p, mark).into_iter().find_map(|e| match e {
        Event::Read { publish, result } if publish == read => Some(result),
        _ => None,
    });
    let Some(Ok(TableRead::Stats(stats))) = result else {
        panic!("{result:?}")
    };
    let Stats {
        table,
        due,
        scheduled,
        in_work,
        failed,
        processed,
        oldest_due,
        ..
    } = stats;
    assert_eq!(table, "jobs");
    assert_eq!(due.value(), 2);
    assert!(due.is_exact());
    assert_eq!(scheduled.value(), 1);
    assert_eq!(in_work.map(|c| c.value()), Some(1));
    assert_eq!((failed, processed), (None, None));
    assert_eq!(oldest_due, Some(T0));
    assert_eq!(
        sim.procs[p].broker.held_connections(),
        0,
        "the read gave its connection back"
    );
}

/// Reads `what` through `p`'s publisher, runs, and answers the read's result.
fn read_table(sim: &mut Sim, p: usize, what: ReadTable) -> Result<TableRead, DbError> {
    let publisher = sim.procs[p].publisher;
    let now = sim.now;
    let mark = sim.mark();
    let id = sim.procs[p]
        .broker
        .read_table(publisher, what, now)
        .expect("reads");
    sim.poll(p);
    sim.run();
    sim.events(p, mark)
        .into_iter()
        .find_map(|e| match e {
            Event::Read { publish, result } if publish == id => Some(result),
            _ => None,
        })
        .expect("answered")
}

/// The ids of the failed rows a read answered.
fn ids(r: Result<TableRead, DbError>) -> Vec<Value> {
    match r {
        Ok(TableRead::Failed(rows)) => rows.into_iter().map(|r| r.id).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    }
}

/// A read of failed rows pages through them by id; a read of one row finds it; a table that
/// keeps no failed rows refuses the read, naming the column.
#[test]
fn failed_rows_are_read_page_by_page() {
    let desc = *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .due(Column::new("due_at"))
        .failed(Column::new("failed_at"))
        .error(Column::new("error"))
        .desc();
    let mut sim = Sim::new(Dialect::MariaDb, desc, 1);
    for channel in 0..5 {
        let id = sim.insert(channel);
        if id != 3 {
            let row = sim.db.rows.get_mut(&id).unwrap();
            row.failed_at = Some(T0.micros());
            row.error = Some(format!("boom {id}"));
            row.attempt = 5;
        }
    }
    let p = sim.spawn();
    sim.run();
    let read = |sim: &mut Sim, what: ReadTable| read_table(sim, p, what);
    let first = read(
        &mut sim,
        ReadTable::Failed {
            limit: 2,
            after: None,
        },
    );
    let Ok(TableRead::Failed(rows)) = &first else {
        panic!("{first:?}")
    };
    assert_eq!(rows[0].error.as_deref(), Some("boom 1"));
    assert_eq!(rows[0].attempt, Some(5));
    assert_eq!(ids(first), [Value::Int(1), Value::Int(2)]);
    let next = read(
        &mut sim,
        ReadTable::Failed {
            limit: 2,
            after: Some(Value::Int(2)),
        },
    );
    assert_eq!(ids(next), [Value::Int(4), Value::Int(5)]);
    let one = read(&mut sim, ReadTable::FailedRow(Value::Int(4)));
    assert_eq!(ids(one), [Value::Int(4)]);
    let none = read(&mut sim, ReadTable::FailedRow(Value::Int(3)));
    assert_eq!(ids(none), Vec::<Value>::new());

    let mut sim = Sim::new(Dialect::Postgres, lease(), 1);
    let p = sim.spawn();
    sim.run();
    let publisher = sim.procs[p].publisher;
    let now = sim.now;
    let refused = sim.procs[p]
        .broker
        .read_table(
            publisher,
            ReadTable::Failed {
                limit: 1,
                after: None,
            },
            now,
        )
        .unwrap_err();
    assert!(refused.to_string().contains("failed_at"), "{refused}");
}

//! The maintenance machines without a database: the statements retention and periodic jobs
//! hand out, in order, for scripted replies, and their text per dialect.

use std::time::Duration;

use ruststream_core::dialect::{MaintenanceKind, PERIODIC_TABLE, periodic_table_ddl};
use ruststream_core::spec::{Column, ErrorText, Failed, InboxSpec, Lease, Payload, Processed};
use ruststream_core::{
    Action, Broker, BrokerError, Dialect, Event, Maintained, PeriodicJob, Publish, Reply,
    Retention, Row, StatementKind, Statements, Ticks, Time, Value,
};

const SECOND: i64 = 1_000_000;

const MARKED: InboxSpec<(Payload, Lease, Processed, Failed, ErrorText)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .lease(Column::new("locked_until"))
        .processed_at(Column::new("processed_at"))
        .failed(Column::new("failed_at"))
        .error(Column::new("error"));

const DELETING: InboxSpec<(Payload, Lease)> = InboxSpec::new("jobs", Column::new("id").generated())
    .payload(Column::new("payload"))
    .lease(Column::new("locked_until"));

/// What a command did, as the tests compare it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Did {
    Acquire,
    Release,
    Close,
    Run(StatementKind),
}

fn did(action: &Action) -> Did {
    match action {
        Action::Acquire => Did::Acquire,
        Action::Release => Did::Release,
        Action::Close => Did::Close,
        Action::Execute { statement, .. } => Did::Run(statement.kind),
        other => panic!("the maintenance runs no {other:?}"),
    }
}

fn m(kind: MaintenanceKind) -> Did {
    Did::Run(StatementKind::Maintenance(kind))
}

fn rows(values: Vec<Value>) -> Reply<()> {
    Reply::Rows(vec![Row::values(values)])
}

/// Answers every command the broker hands out with `answer` (`Done` where it gives none),
/// until none is left; what ran, in order, and the binds of each statement.
fn run_all(
    broker: &mut Broker<()>,
    now: Time,
    mut answer: impl FnMut(&Action) -> Option<Reply<()>>,
) -> Vec<(Did, Vec<Value>)> {
    let mut seen = Vec::new();
    while let Some(command) = broker.poll_command() {
        let binds = match &command.action {
            Action::Execute { binds, .. } => binds.clone(),
            _ => Vec::new(),
        };
        seen.push((did(&command.action), binds));
        let reply = answer(&command.action).unwrap_or(Reply::Done);
        broker.handle_reply(command.id, reply, now);
    }
    seen
}

fn events(broker: &mut Broker<()>) -> Vec<Maintained> {
    let mut out = Vec::new();
    while let Some(event) = broker.poll_event() {
        if let Event::Maintained(m) = event {
            out.push(m);
        }
    }
    out
}

fn kind(action: &Action) -> Option<MaintenanceKind> {
    match action {
        Action::Execute { statement, .. } => match statement.kind {
            StatementKind::Maintenance(kind) => Some(kind),
            _ => None,
        },
        _ => None,
    }
}

fn retention(batch: usize) -> Retention {
    Retention {
        processed: Some(Duration::from_secs(3600)),
        failed: Some(Duration::from_secs(86_400)),
        every: Duration::from_secs(60),
        batch,
    }
}

#[test]
fn retention_takes_its_lock_deletes_in_batches_until_one_is_short_then_unlocks() {
    let now = Time(100_000 * SECOND);
    let mut broker: Broker<()> = Broker::new(Dialect::Postgres);
    broker.set_connection_linger(Duration::ZERO);
    broker
        .retain(*MARKED.desc(), retention(2), now)
        .expect("the table marks both");
    let mut processed = [2u64, 2, 1].into_iter();
    let seen = run_all(&mut broker, now, |action| match kind(action) {
        Some(MaintenanceKind::TryLock | MaintenanceKind::Unlock) => {
            Some(rows(vec![Value::Bool(true)]))
        }
        Some(MaintenanceKind::DeleteProcessed) => {
            Some(Reply::Affected(processed.next().unwrap_or(0)))
        }
        Some(MaintenanceKind::DeleteFailed) => Some(Reply::Affected(0)),
        _ => None,
    });
    let order: Vec<Did> = seen.iter().map(|(d, _)| d.clone()).collect();
    assert_eq!(
        order,
        [
            Did::Acquire,
            m(MaintenanceKind::TryLock),
            m(MaintenanceKind::DeleteProcessed),
            m(MaintenanceKind::DeleteProcessed),
            m(MaintenanceKind::DeleteProcessed),
            m(MaintenanceKind::DeleteFailed),
            m(MaintenanceKind::Unlock),
            Did::Release,
        ]
    );
    // Each delete binds the mark's age: the database's clock decides what is that old.
    assert_eq!(seen[2].1, [Value::Int(3600 * SECOND)]);
    assert_eq!(seen[5].1, [Value::Int(86_400 * SECOND)]);
    assert_eq!(
        events(&mut broker),
        [Maintained::Retention {
            table: "jobs",
            held_elsewhere: false,
            processed: 5,
            failed: 0,
        }]
    );
    // The next run is one interval later, and not before.
    assert_eq!(
        broker.poll_timeout(),
        Some(now.plus(Duration::from_secs(60)))
    );
    broker.handle_timeout(Time(now.micros() + 59 * SECOND));
    assert!(broker.poll_command().is_none());
    broker.handle_timeout(now.plus(Duration::from_secs(60)));
    assert_eq!(
        broker.poll_command().map(|c| did(&c.action)),
        Some(Did::Acquire)
    );
}

#[test]
fn retention_whose_lock_another_process_holds_deletes_nothing() {
    let now = Time(100_000 * SECOND);
    for dialect in [Dialect::Postgres, Dialect::MariaDb, Dialect::MySql] {
        let mut broker: Broker<()> = Broker::new(dialect);
        broker.set_connection_linger(Duration::ZERO);
        broker.retain(*MARKED.desc(), retention(10), now).unwrap();
        let seen = run_all(&mut broker, now, |action| {
            (kind(action) == Some(MaintenanceKind::TryLock)).then(|| rows(vec![Value::Bool(false)]))
        });
        let order: Vec<Did> = seen.into_iter().map(|(d, _)| d).collect();
        assert_eq!(
            order,
            [Did::Acquire, m(MaintenanceKind::TryLock), Did::Release],
            "{dialect:?}"
        );
        assert_eq!(
            events(&mut broker),
            [Maintained::Retention {
                table: "jobs",
                held_elsewhere: true,
                processed: 0,
                failed: 0,
            }]
        );
    }
}

#[test]
fn retention_on_sqlite_takes_no_lock_and_a_failure_closes_the_connection() {
    let now = Time(100_000 * SECOND);
    let mut broker: Broker<()> = Broker::new(Dialect::Sqlite);
    broker.retain(*MARKED.desc(), retention(10), now).unwrap();
    let seen = run_all(&mut broker, now, |action| match kind(action) {
        Some(MaintenanceKind::DeleteProcessed) => Some(Reply::Affected(3)),
        Some(MaintenanceKind::DeleteFailed) => Some(Reply::Failed(ruststream_core::DbError::new(
            ruststream_core::ErrorKind::Other,
            "disk I/O error",
        ))),
        _ => None,
    });
    let order: Vec<Did> = seen.into_iter().map(|(d, _)| d).collect();
    assert_eq!(
        order,
        [
            Did::Acquire,
            m(MaintenanceKind::DeleteProcessed),
            m(MaintenanceKind::DeleteFailed),
            Did::Close,
        ]
    );
    match events(&mut broker).as_slice() {
        [Maintained::Failed { task, error }] => {
            assert_eq!(&**task, "retention of table `jobs`");
            assert_eq!(error.message, "disk I/O error");
        }
        other => panic!("one failure, not {other:?}"),
    }
}

#[test]
fn retention_of_a_mark_the_table_lacks_is_refused_naming_the_column() {
    let mut broker: Broker<()> = Broker::new(Dialect::Postgres);
    let error = broker
        .retain(*DELETING.desc(), retention(10), Time(0))
        .expect_err("the table deletes its rows");
    assert!(matches!(error, BrokerError::Desc(_)));
    let text = error.to_string();
    assert!(
        text.contains("jobs") && text.contains("processed_at"),
        "{text}"
    );
    assert!(text.contains("retain_processed"), "{text}");
}

#[test]
fn retention_statements_per_dialect() {
    let desc = MARKED.desc();
    let pg = Statements::retention(Dialect::Postgres, desc, 1000);
    assert_eq!(
        &*pg.delete_processed.unwrap().sql,
        "DELETE FROM \"jobs\" WHERE \"id\" IN (SELECT \"id\" FROM \"jobs\" WHERE \"processed_at\" < (statement_timestamp() - CAST($1 AS BIGINT) * INTERVAL '1 microsecond') LIMIT 1000) AND \"processed_at\" < (statement_timestamp() - CAST($1 AS BIGINT) * INTERVAL '1 microsecond')"
    );
    assert_eq!(
        &*pg.try_lock.unwrap().sql,
        "SELECT pg_try_advisory_lock(hashtext('ruststream.retention'), hashtext(current_schema() || '.' || 'jobs')) AS locked"
    );
    let maria = Statements::retention(Dialect::MariaDb, desc, 500);
    assert_eq!(
        &*maria.delete_failed.unwrap().sql,
        "DELETE FROM `jobs` WHERE `failed_at` < TIMESTAMPADD(MICROSECOND, 0 - ?, UTC_TIMESTAMP(6)) ORDER BY `id` LIMIT 500"
    );
    assert!(maria.try_lock.unwrap().sql.starts_with("SELECT GET_LOCK("));
    assert!(
        maria
            .unlock
            .unwrap()
            .sql
            .starts_with("SELECT RELEASE_LOCK(")
    );
    let sqlite = Statements::retention(Dialect::Sqlite, desc, 7);
    assert!(sqlite.try_lock.is_none() && sqlite.unlock.is_none());
    assert_eq!(
        &*sqlite.delete_processed.unwrap().sql,
        "DELETE FROM \"jobs\" WHERE \"id\" IN (SELECT \"id\" FROM \"jobs\" WHERE \"processed_at\" < ((CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000) - ?1) LIMIT 7) AND \"processed_at\" < ((CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000) - ?1)"
    );
    assert!(
        Statements::retention(Dialect::Postgres, DELETING.desc(), 10)
            .delete_processed
            .is_none()
    );
}

#[test]
fn periodic_statements_per_dialect() {
    for dialect in [
        Dialect::Postgres,
        Dialect::MySql,
        Dialect::MariaDb,
        Dialect::Sqlite,
    ] {
        let s = Statements::periodic(dialect);
        assert!(s.create_table.sql.contains(PERIODIC_TABLE));
        assert_eq!(&*s.create_table.sql, periodic_table_ddl(dialect));
        assert!(s.advance.sql.contains("last_tick <"), "{dialect:?}");
    }
    let pg = Statements::periodic(Dialect::Postgres);
    assert_eq!(
        &*pg.advance.sql,
        "UPDATE \"ruststream_periodic\" SET last_tick = (TIMESTAMPTZ 'epoch' + CAST($1 AS BIGINT) * INTERVAL '1 microsecond') WHERE name = $2 AND last_tick < (TIMESTAMPTZ 'epoch' + CAST($1 AS BIGINT) * INTERVAL '1 microsecond')"
    );
    assert!(
        pg.insert_state
            .sql
            .ends_with("ON CONFLICT (name) DO NOTHING")
    );
    assert!(
        Statements::periodic(Dialect::MariaDb)
            .insert_state
            .sql
            .starts_with("INSERT IGNORE INTO `ruststream_periodic`")
    );
    assert!(
        Statements::periodic(Dialect::Sqlite)
            .insert_state
            .sql
            .starts_with("INSERT OR IGNORE INTO")
    );
}

/// A tick every second, each publishing its own time as the payload.
#[derive(Debug)]
struct EverySecond;

impl Ticks for EverySecond {
    fn after(&self, t: Time) -> Option<Time> {
        Some(Time((t.micros().div_euclid(SECOND) + 1) * SECOND))
    }

    fn before(&self, t: Time) -> Option<Time> {
        Some(Time((t.micros() - 1).div_euclid(SECOND) * SECOND))
    }

    fn row(&self, tick: Time) -> Result<Publish, String> {
        Ok(Publish {
            payload: tick.micros().to_string().into_bytes(),
            ..Publish::default()
        })
    }
}

/// The state table's answer: the schedule's last tick and the database's time.
fn state(last_tick: i64, read_at: i64) -> Reply<()> {
    rows(vec![Value::Int(last_tick), Value::Int(read_at)])
}

fn job(catch_up: usize) -> PeriodicJob {
    PeriodicJob {
        name: "report".into(),
        table: *DELETING.desc(),
        ticks: Box::new(EverySecond),
        catch_up,
        create_table: true,
    }
}

#[test]
fn a_periodic_job_reads_its_last_tick_catches_up_then_publishes_each_tick_in_its_transaction() {
    let now = Time(10 * SECOND + SECOND / 2);
    let mut broker: Broker<()> = Broker::new(Dialect::Postgres);
    broker.set_connection_linger(Duration::ZERO);
    broker.periodic(job(2), now).unwrap();
    catches_up_the_missed_ticks(&mut broker, now);
    publishes_the_next_tick_on_its_timer(&mut broker);
}

/// The last tick published was at 7 s: 8, 9 and 10 were missed; two are caught up. Tick 9
/// was published meanwhile by another process: its advance changes no row.
fn catches_up_the_missed_ticks(broker: &mut Broker<()>, now: Time) {
    let mut advanced = Vec::new();
    let seen = run_all(broker, now, |action| match kind(action) {
        Some(MaintenanceKind::ReadState) => Some(rows(vec![Value::Int(7 * SECOND)])),
        Some(MaintenanceKind::Advance) => {
            let Action::Execute { binds, .. } = action else {
                unreachable!()
            };
            advanced.push(binds[0].clone());
            Some(Reply::Affected(u64::from(advanced.len() != 1)))
        }
        _ => None,
    });
    let order: Vec<Did> = seen.iter().map(|(d, _)| d.clone()).collect();
    assert_eq!(
        order,
        [
            Did::Acquire,
            m(MaintenanceKind::CreateStateTable),
            m(MaintenanceKind::InsertState),
            m(MaintenanceKind::ReadState),
            Did::Run(StatementKind::Begin),
            m(MaintenanceKind::Advance),
            Did::Run(StatementKind::Commit),
            Did::Run(StatementKind::Begin),
            m(MaintenanceKind::Advance),
            Did::Run(StatementKind::Publish),
            Did::Run(StatementKind::Commit),
            Did::Release,
        ]
    );
    assert_eq!(
        advanced,
        [Value::Int(9 * SECOND), Value::Int(10 * SECOND)],
        "the latest two missed ticks, earliest first"
    );
    // The state row of a new schedule starts at the start: nothing before it is missed.
    assert_eq!(
        seen[2].1,
        [Value::Text("report".into()), Value::Int(now.micros())]
    );
    assert_eq!(
        events(broker),
        [
            Maintained::Tick {
                schedule: "report".into(),
                tick: Time(9 * SECOND),
                published: false,
            },
            Maintained::Tick {
                schedule: "report".into(),
                tick: Time(10 * SECOND),
                published: true,
            },
        ]
    );
}

/// The next tick, on its timer: the state and the database's time read again, then one
/// transaction.
fn publishes_the_next_tick_on_its_timer(broker: &mut Broker<()>) {
    assert_eq!(broker.poll_timeout(), Some(Time(11 * SECOND)));
    let at = Time(11 * SECOND + 1);
    broker.handle_timeout(at);
    let seen = run_all(broker, at, |action| match kind(action) {
        Some(MaintenanceKind::ReadState) => Some(state(10 * SECOND, at.micros())),
        Some(MaintenanceKind::Advance) => Some(Reply::Affected(1)),
        _ => None,
    });
    let order: Vec<Did> = seen.iter().map(|(d, _)| d.clone()).collect();
    assert_eq!(
        order,
        [
            Did::Acquire,
            m(MaintenanceKind::ReadState),
            Did::Run(StatementKind::Begin),
            m(MaintenanceKind::Advance),
            Did::Run(StatementKind::Publish),
            Did::Run(StatementKind::Commit),
            Did::Release,
        ]
    );
    assert_eq!(seen[3].1[0], Value::Int(11 * SECOND));
    assert_eq!(broker.poll_timeout(), Some(Time(12 * SECOND)));
}

#[test]
fn a_periodic_run_that_fails_closes_its_connection_and_tries_the_tick_again() {
    let now = Time(20 * SECOND);
    let mut broker: Broker<()> = Broker::new(Dialect::MariaDb);
    broker.set_connection_linger(Duration::ZERO);
    let mut job = job(5);
    job.create_table = false;
    broker.periodic(job, now).unwrap();
    let seen = run_all(&mut broker, now, |action| match kind(action) {
        Some(MaintenanceKind::ReadState) => Some(rows(vec![Value::Int(19 * SECOND)])),
        Some(MaintenanceKind::Advance) => Some(Reply::Failed(ruststream_core::DbError::new(
            ruststream_core::ErrorKind::Serialization,
            "deadlock",
        ))),
        _ => None,
    });
    let order: Vec<Did> = seen.into_iter().map(|(d, _)| d).collect();
    assert_eq!(
        order,
        [
            Did::Acquire,
            m(MaintenanceKind::InsertState),
            m(MaintenanceKind::ReadState),
            Did::Run(StatementKind::Begin),
            m(MaintenanceKind::Advance),
            Did::Close,
        ]
    );
    assert!(matches!(
        events(&mut broker).as_slice(),
        [Maintained::Failed { .. }]
    ));
    let retry = broker.poll_timeout().expect("it tries again");
    assert_eq!(retry, Time(21 * SECOND));
    broker.handle_timeout(retry);
    let seen = run_all(&mut broker, retry, |action| match kind(action) {
        Some(MaintenanceKind::ReadState) => Some(state(19 * SECOND, retry.micros())),
        Some(MaintenanceKind::Advance) => Some(Reply::Affected(1)),
        _ => None,
    });
    let advanced: Vec<Value> = seen
        .iter()
        .filter(|(d, _)| *d == m(MaintenanceKind::Advance))
        .map(|(_, binds)| binds[0].clone())
        .collect();
    assert_eq!(
        advanced,
        [Value::Int(20 * SECOND), Value::Int(21 * SECOND)],
        "the failed tick again, then the one due since"
    );
}

#[test]
fn the_shutdown_waits_for_a_run_in_flight_and_starts_no_other() {
    let now = Time(100_000 * SECOND);
    let mut broker: Broker<()> = Broker::new(Dialect::Postgres);
    broker.retain(*MARKED.desc(), retention(2), now).unwrap();
    let acquire = broker.poll_command().expect("the run's acquire");
    broker.handle_reply(acquire.id, Reply::Done, now);
    let lock = broker.poll_command().expect("the lock");
    broker.shutdown(now);
    broker.handle_reply(lock.id, rows(vec![Value::Bool(true)]), now);
    // Locked: no delete starts in the shutdown; the lock is released, the connection given
    // back, then the broker closes.
    let seen = run_all(&mut broker, now, |action| {
        (kind(action) == Some(MaintenanceKind::Unlock)).then(|| rows(vec![Value::Bool(true)]))
    });
    let order: Vec<Did> = seen.into_iter().map(|(d, _)| d).collect();
    assert_eq!(order, [m(MaintenanceKind::Unlock), Did::Release]);
    let mut closed = false;
    while let Some(event) = broker.poll_event() {
        closed |= matches!(event, Event::Closed(_));
    }
    assert!(closed && broker.is_closed());
    assert_eq!(broker.poll_timeout(), None);
}

#[test]
fn on_sqlite_a_ticks_transaction_lets_no_statement_of_another_connection_in() {
    let now = Time(10 * SECOND + SECOND / 2);
    let mut broker: Broker<()> = Broker::new(Dialect::Sqlite);
    broker.set_connection_linger(Duration::ZERO);
    let publisher = broker.publisher(*DELETING.desc()).expect("a publisher");
    broker.periodic(job(3), now).unwrap();
    let mut in_tx = None;
    let mut published = false;
    let mut statements = 0;
    while let Some(command) = broker.poll_command() {
        if let Action::Execute { statement, .. } = &command.action {
            statements += 1;
            if let Some(conn) = in_tx {
                assert_eq!(
                    command.conn, conn,
                    "{:?} ran inside the tick's transaction",
                    statement.kind
                );
            }
            if statement.kind == StatementKind::Begin {
                in_tx = Some(command.conn);
                if !published {
                    published = true;
                    broker
                        .publish(publisher, Publish::default(), now)
                        .expect("publishes");
                }
            }
        }
        let commit = matches!(&command.action,
            Action::Execute { statement, .. } if statement.kind == StatementKind::Commit);
        let reply = match kind(&command.action) {
            Some(MaintenanceKind::ReadState) => rows(vec![Value::Int(7 * SECOND)]),
            Some(MaintenanceKind::Advance) => Reply::Affected(1),
            _ => Reply::Done,
        };
        broker.handle_reply(command.id, reply, now);
        if commit {
            in_tx = None;
        }
    }
    let published_events = std::iter::from_fn(|| broker.poll_event())
        .filter(|e| matches!(e, Event::Published { result: Ok(_), .. }))
        .count();
    assert_eq!(
        published_events, 1,
        "the publish ran once the transaction ended"
    );
    // Three ticks of four statements, the state's three and the publish.
    assert_eq!(statements, 3 * 4 + 3 + 1);
}

#[test]
fn a_periodic_job_without_catch_up_publishes_no_missed_tick_but_each_tick_from_the_start_on() {
    let now = Time(10 * SECOND + SECOND / 2);
    let mut broker: Broker<()> = Broker::new(Dialect::Postgres);
    broker.set_connection_linger(Duration::ZERO);
    broker.periodic(job(0), now).unwrap();
    let seen = run_all(&mut broker, now, |action| {
        (kind(action) == Some(MaintenanceKind::ReadState)).then(|| rows(vec![Value::Int(SECOND)]))
    });
    assert!(
        seen.iter().all(|(d, _)| *d != m(MaintenanceKind::Advance)),
        "nine ticks missed, none published: {seen:?}"
    );
    assert_eq!(broker.poll_timeout(), Some(Time(11 * SECOND)));
    let at = Time(11 * SECOND);
    broker.handle_timeout(at);
    let seen = run_all(&mut broker, at, |action| match kind(action) {
        Some(MaintenanceKind::ReadState) => Some(state(SECOND, at.micros())),
        Some(MaintenanceKind::Advance) => Some(Reply::Affected(1)),
        _ => None,
    });
    let advanced: Vec<Value> = seen
        .iter()
        .filter(|(d, _)| *d == m(MaintenanceKind::Advance))
        .map(|(_, binds)| binds[0].clone())
        .collect();
    assert_eq!(advanced, [Value::Int(11 * SECOND)]);
}

/// The database's clock decides which ticks are due; the process's only when to look. A
/// process whose clock runs 45 s ahead publishes no tick early, and one 45 s behind none
/// late: each looks again when the next tick is due by the database's clock.
#[test]
fn a_periodic_job_publishes_each_tick_by_the_database_clock() {
    let off = 45 * SECOND;
    for skew in [off, -off] {
        // The database's time is 10.5 s; the process's clock reads 10.5 s + skew.
        let db = 10 * SECOND + SECOND / 2;
        let now = Time(db + skew);
        let mut broker: Broker<()> = Broker::new(Dialect::Postgres);
        broker.set_connection_linger(Duration::ZERO);
        broker.periodic(job(5), now).unwrap();
        let mut advanced = Vec::new();
        run_all(&mut broker, now, |action| match kind(action) {
            Some(MaintenanceKind::ReadState) => Some(state(9 * SECOND, db)),
            Some(MaintenanceKind::Advance) => {
                let Action::Execute { binds, .. } = action else {
                    unreachable!()
                };
                advanced.push(binds[0].clone());
                Some(Reply::Affected(1))
            }
            _ => None,
        });
        assert_eq!(
            advanced,
            [Value::Int(10 * SECOND)],
            "skew {skew}: only the tick due by the database's clock"
        );
        // The next tick, 11 s by the database's clock: looked at when the process's clock
        // reads 11 s + skew.
        assert_eq!(broker.poll_timeout(), Some(Time(11 * SECOND + skew)));
    }
}

//! The broker machine of every dialect and form under arbitrary replies in arbitrary order,
//! with settlements, drops, wakes, publishes, timeouts and a shutdown mixed in: it never
//! panics, and once it is shut down and every command is answered it is closed and holds no
//! connection.

#![no_main]

use std::time::Duration;

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use ruststream_core::spec::{
    Advisory, Attempt, Column, Due, InboxSpec, KeyPart, Lease, Payload, Processed, own,
};
use ruststream_core::{
    Action, Broker, ColumnType, Command, DbError, DeliveryId, Dialect, ErrorKind, Event, Outcome,
    Output, Publish, Reply, Row, StatementKind, SubscribeOptions, TableDesc, Time, Value,
};

const DIALECTS: [Dialect; 4] = [
    Dialect::Postgres,
    Dialect::MySql,
    Dialect::MariaDb,
    Dialect::Sqlite,
];

const KEY: &[KeyPart] = &[KeyPart::Literal("jobs-"), KeyPart::Column("channel")];

const ROW_LOCK: InboxSpec<(Payload, Attempt, Processed)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .processed_at(Column::new("processed_at"));
const ROW_LOCK_PLAIN: InboxSpec<(Payload,)> =
    InboxSpec::new("app.jobs", Column::new("id")).payload(Column::new("payload"));
const LEASE: InboxSpec<(Payload, Attempt, Lease, Processed, Due)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"))
        .processed_at(Column::new("processed_at"))
        .due(Column::new("due_at"));
const LEASE_PLAIN: InboxSpec<(Payload, Lease)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .lease(Column::new("locked_until"));
const ADVISORY: InboxSpec<(Advisory, Attempt, Payload)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .advisory(KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"));
const ADVISORY_PLAIN: InboxSpec<(Advisory, Payload, Processed, Due)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .advisory(KEY)
        .payload(Column::new("payload"))
        .processed_at(Column::new("processed_at"))
        .due(Column::new("due_at"));
const CUSTOM: InboxSpec<(Advisory, Payload, own::Lock, own::Unlock)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .advisory(KEY)
        .payload(Column::new("payload"))
        .own::<own::Lock>()
        .own::<own::Unlock>();

fn descs() -> [TableDesc; 7] {
    [
        *ROW_LOCK.desc(),
        *ROW_LOCK_PLAIN.desc(),
        *LEASE.desc(),
        *LEASE_PLAIN.desc(),
        *ADVISORY.desc(),
        *ADVISORY_PLAIN.desc(),
        *CUSTOM.desc(),
    ]
}

const KINDS: [ErrorKind; 9] = [
    ErrorKind::ConnectionLost,
    ErrorKind::PoolClosed,
    ErrorKind::Serialization,
    ErrorKind::UndefinedTable,
    ErrorKind::UndefinedColumn,
    ErrorKind::Timeout,
    ErrorKind::PreparedStatement,
    ErrorKind::SharedSession,
    ErrorKind::Other,
];

const NAMES: [&str; 8] = [
    "id",
    "payload",
    "attempt",
    "locked_until",
    "processed_at",
    "due_at",
    "channel",
    "read committed",
];

fn value(u: &mut Unstructured<'_>) -> Result<Value> {
    Ok(match u.int_in_range(0..=5)? {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 | 3 => Value::Int(u.int_in_range(-2..=6)?),
        4 => Value::Text((*u.choose(&NAMES)?).to_owned()),
        _ => Value::Text(format!("jobs-{}", u.int_in_range(0..=3)?)),
    })
}

/// Any reply at all, whatever the command asked.
fn reply(u: &mut Unstructured<'_>) -> Result<Reply<()>> {
    Ok(match u.int_in_range(0..=5)? {
        0 => Reply::Done,
        1 => Reply::Affected(u.int_in_range(0..=3)?),
        2 | 3 => {
            let n = u.int_in_range(0..=4)?;
            let mut rows = Vec::with_capacity(n);
            for _ in 0..n {
                let width = u.int_in_range(0..=3)?;
                let values = (0..width).map(|_| value(u)).collect::<Result<Vec<_>>>()?;
                rows.push(Row::values(values));
            }
            Reply::Rows(rows)
        }
        4 => Reply::Bool(u.arbitrary()?),
        _ => Reply::Failed(DbError::new(*u.choose(&KINDS)?, "fuzz")),
    })
}

/// A reply of the shape the command asks for, with small arbitrary values: it reaches the
/// deeper states (checks passed, rows delivered, keys locked) more often than any reply.
fn plausible(u: &mut Unstructured<'_>, desc: &TableDesc, command: &Command) -> Result<Reply<()>> {
    if u.ratio(1, 8)? {
        return Ok(Reply::Failed(DbError::new(*u.choose(&KINDS)?, "fuzz")));
    }
    let statement = match &command.action {
        Action::Execute { statement, .. } => statement,
        Action::Lock { .. } | Action::Unlock { .. } => return Ok(Reply::Bool(u.ratio(3, 4)?)),
        Action::Acquire | Action::Release | Action::Close => return Ok(Reply::Done),
    };
    Ok(match (&statement.kind, &statement.output) {
        (StatementKind::ListColumns, _) => Reply::Rows(
            desc.columns()
                .into_iter()
                .filter(|_| !u.ratio(1, 50).unwrap_or(false))
                .map(|c| Row::values(vec![Value::Text(c.to_owned())]))
                .collect(),
        ),
        (StatementKind::CurrentDatabase, _) => {
            Reply::Rows(vec![Row::values(vec![Value::Text("test".into())])])
        }
        (StatementKind::Isolation, _) => Reply::Rows(vec![Row::values(vec![Value::Text(
            (*u.choose(&["read committed", "serializable"])?).to_owned(),
        )])]),
        (_, Output::Nothing) => Reply::Done,
        (_, Output::Affected) => Reply::Affected(u.int_in_range(0..=2)?),
        (_, Output::Rows { columns, .. }) => {
            let n = u.int_in_range(0..=4)?;
            let mut rows = Vec::with_capacity(n);
            for _ in 0..n {
                // Each column of the type the statement declares it, as an adapter reads it.
                let mut values = Vec::with_capacity(columns.len());
                for column in columns.iter() {
                    values.push(match column.ty {
                        ColumnType::Id => Value::Int(u.int_in_range(1..=6)?),
                        ColumnType::Text => Value::Text(format!("jobs-{}", u.int_in_range(0..=3)?)),
                        ColumnType::Bool => Value::Bool(u.ratio(3, 4)?),
                        ColumnType::Int => Value::Int(u.int_in_range(0..=3)?),
                        ColumnType::Bytes => Value::Bytes(b"{}".to_vec()),
                    });
                }
                rows.push(Row::values(values));
            }
            Reply::Rows(rows)
        }
    })
}

/// Whether to print every command, reply and event (`FUZZ_TRACE=1`), to read a crash's run.
fn tracing() -> bool {
    std::env::var_os("FUZZ_TRACE").is_some()
}

struct Run {
    broker: Broker<()>,
    pending: Vec<Command>,
    deliveries: Vec<DeliveryId>,
    now: Time,
    closed_events: usize,
}

impl Run {
    /// Moves every command and event out of the broker.
    fn drain(&mut self) {
        loop {
            let mut any = false;
            while let Some(command) = self.broker.poll_command() {
                assert!(
                    self.pending.iter().all(|c| c.id != command.id),
                    "command id {} handed out twice",
                    command.id
                );
                if tracing() {
                    eprintln!("command {command:?}");
                }
                self.pending.push(command);
                any = true;
            }
            while let Some(event) = self.broker.poll_event() {
                any = true;
                if tracing() {
                    eprintln!("event {event:?}");
                }
                match event {
                    Event::Delivered(d) => self.deliveries.push(d.delivery),
                    Event::Closed(_) => {
                        self.closed_events += 1;
                        assert!(self.broker.is_closed());
                        assert_eq!(self.broker.held_connections(), 0);
                    }
                    _ => {}
                }
            }
            if !any {
                break;
            }
        }
    }

    fn tick(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let step = match u.int_in_range(0..=3)? {
            0 => 0,
            1 => u.int_in_range(1..=1_000)?,
            2 => u.int_in_range(1..=2_000_000)?,
            _ => u.int_in_range(1..=60_000_000)?,
        };
        self.now = Time(self.now.0 + step);
        Ok(())
    }
}

/// The run proper: a subscription and a publisher, then inputs chosen by the fuzz data.
fn play(u: &mut Unstructured<'_>, r: &mut Run) -> Result<()> {
    let dialect = *u.choose(&DIALECTS)?;
    let desc = *u.choose(&descs())?;
    let options = SubscribeOptions {
        workers: u.int_in_range(1..=4)?,
        poll_interval: Duration::from_millis(u.int_in_range(1..=2_000)?),
        lease: Duration::from_secs(u.int_in_range(1..=60)?),
        extend_every: Duration::from_secs(u.int_in_range(1..=30)?),
        prefetch: u.int_in_range(0..=3)?,
        max_attempts: if u.arbitrary()? {
            Some(u.int_in_range(1..=3)?)
        } else {
            None
        },
        row_fields: &[],
        ensure_schema: u.arbitrary()?,
        missing_claim_index: *u.choose(&[
            ruststream_core::MissingIndex::Warn,
            ruststream_core::MissingIndex::Fail,
            ruststream_core::MissingIndex::Ignore,
        ])?,
    };
    if tracing() {
        eprintln!("{dialect:?} {:?} {desc:?} {options:?}", desc.form());
    }
    r.broker = Broker::new(dialect);
    // An adapter whose prepared statements live in the server session: the session check runs
    // in every form on PostgreSQL.
    r.broker.set_prepared_statements(u.arbitrary()?);
    let sub = r.broker.subscribe(desc, options, r.now).ok();
    let publisher = r.broker.publisher(desc).ok();
    r.drain();

    let mut steps = 0;
    while !u.is_empty() && steps < 4_000 {
        steps += 1;
        match u.int_in_range(0..=12)? {
            0..=5 => {
                if !r.pending.is_empty() {
                    let i = u.choose_index(r.pending.len())?;
                    let command = r.pending.swap_remove(i);
                    let reply = if u.ratio(1, 4)? {
                        reply(u)?
                    } else {
                        plausible(u, &desc, &command)?
                    };
                    r.tick(u)?;
                    if tracing() {
                        eprintln!("reply {} {reply:?}", command.id);
                    }
                    r.broker.handle_reply(command.id, reply, r.now);
                }
            }
            6 => {
                if !r.deliveries.is_empty() {
                    let d = r.deliveries[u.choose_index(r.deliveries.len())?];
                    let outcome = *u.choose(&[Outcome::Ack, Outcome::Retry, Outcome::Reject])?;
                    if tracing() {
                        eprintln!("settle {d:?} {outcome:?}");
                    }
                    r.broker.settle(d, outcome, r.now);
                }
            }
            7 => {
                if !r.deliveries.is_empty() {
                    let d = r.deliveries[u.choose_index(r.deliveries.len())?];
                    if tracing() {
                        eprintln!("drop {d:?}");
                    }
                    r.broker.drop_delivery(d, r.now);
                }
            }
            8 | 9 => {
                r.tick(u)?;
                if tracing() {
                    eprintln!("timeout {:?}", r.now);
                }
                r.broker.handle_timeout(r.now);
            }
            10 => {
                if let Some(p) = publisher {
                    let row = Publish {
                        id: Some(Value::Int(u.int_in_range(0..=9)?)),
                        payload: vec![1, 2, 3],
                        columns: vec![("channel", value(u)?)],
                        due: None,
                    };
                    let _ = r.broker.publish(p, row, r.now);
                }
            }
            11 => {
                if let Some(sub) = sub {
                    r.broker.wake(sub, r.now);
                }
            }
            _ => {
                if tracing() {
                    eprintln!("shutdown");
                }
                r.broker.shutdown(r.now)
            }
        }
        r.drain();
    }
    Ok(())
}

/// The end: shut down, then answer every command (arbitrarily while input lasts, then with
/// `Done`) and let time pass, until the broker is closed.
fn finish(u: &mut Unstructured<'_>, mut r: Run) {
    r.broker.shutdown(r.now);
    r.drain();
    let mut rounds = 0;
    while !r.broker.is_closed() {
        rounds += 1;
        assert!(
            rounds < 10_000,
            "the broker does not close: {} commands pending",
            r.pending.len()
        );
        if r.pending.is_empty() {
            r.now = r.now.plus(Duration::from_secs(60));
            r.broker.handle_timeout(r.now);
            r.drain();
            assert!(
                !r.pending.is_empty() || r.broker.is_closed(),
                "shut down, every command answered, and not closed"
            );
            continue;
        }
        let i = u.choose_index(r.pending.len()).unwrap_or(0);
        let command = r.pending.swap_remove(i);
        let reply = reply(u).unwrap_or(Reply::Done);
        let _ = r.tick(u);
        if tracing() {
            eprintln!("reply {} {reply:?}", command.id);
        }
        r.broker.handle_reply(command.id, reply, r.now);
        r.drain();
    }
    assert!(r.pending.is_empty(), "closed with commands unanswered");
    assert_eq!(r.broker.held_connections(), 0, "closed holding connections");
    assert_eq!(r.closed_events, 1, "one Closed event");
    // Inputs after the close change nothing.
    let after = |r: &mut Run, what: &str| {
        r.drain();
        assert!(
            r.pending.is_empty(),
            "a closed broker sends commands after {what}: {:?}",
            r.pending
        );
    };
    for d in r.deliveries.clone() {
        r.broker.settle(d, Outcome::Ack, r.now);
        after(&mut r, "a settle");
        r.broker.drop_delivery(d, r.now);
        after(&mut r, "a drop");
    }
    r.broker
        .handle_timeout(r.now.plus(Duration::from_secs(3600)));
    after(&mut r, "a timeout");
    r.broker.shutdown(r.now);
    after(&mut r, "a shutdown");
    assert!(r.broker.is_closed());
    assert_eq!(r.broker.held_connections(), 0);
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let mut r = Run {
        broker: Broker::new(Dialect::Postgres),
        pending: Vec::new(),
        deliveries: Vec::new(),
        now: Time(1_000_000),
        closed_events: 0,
    };
    // Running out of input ends the play early; the finish runs whatever happened.
    let _ = play(&mut u, &mut r);
    finish(&mut u, r);
});

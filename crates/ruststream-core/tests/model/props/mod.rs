//! Property tests of the broker machine: several processes, each a `Broker`, run against one
//! in-memory database under random interleavings of statements and replies, failed
//! statements, lost connections, crashed processes, dropped deliveries and shutdowns, each
//! process's clock off the database's by up to three leases either way (the database keeps
//! its own). After every step the invariants of the design hold:
//!
//! - a row is in work with at most one delivery (in the lease form, while its lease holds by
//!   the database's clock); in the advisory form, a key is in work with at most one delivery,
//!   across every process;
//! - a delivery is handed out only while its row or key is held, and its attempt is the row's;
//! - every claimed row ends settled or returns to the queue: after the chaos, a clean process
//!   drains every row that was not settled;
//! - no row leaves the table but by an acknowledgement; a row is marked failed only when it was
//!   rejected or its take counted past `max_attempts`; a failed row, a row not yet due and a
//!   row past its budget are never handed; a row's attempts never pass the budget plus one
//!   plus the interruptions (failed statements, crashes, shutdowns, drops, lapsed leases);
//! - after shutdown the broker holds no lock and no transaction, and publishing is refused.
//!
//! A shrunk failure prints the schedule: the list of steps, each readable. With
//! `RUSTSTREAM_MODEL_LOG=1`, each failing run also prints the commands it ran and the events
//! it saw, newest first.

mod invariants;
mod regressions;
mod steps;
mod world;

use std::time::Duration;

use proptest::prelude::*;
use ruststream_core::spec::{
    Advisory, Attempt, Column, Due, ErrorText, Failed, InboxSpec, KeyPart, Lease, Payload,
    Processed, own,
};
use ruststream_core::{Action, CONNECTION_LINGER, Dialect, Outcome, TableDesc};

use crate::sim::LEASE_TIME;
use world::World;

const ROW_LOCK: InboxSpec<(Payload, Attempt, Due, Failed, ErrorText)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .due(Column::new("due_at"))
        .failed(Column::new("failed_at"))
        .error(Column::new("error"));

/// Claimed in id order (no due column): the claims start past the rows taken before them.
const ROW_LOCK_BY_ID: InboxSpec<(Payload, Attempt, Failed, ErrorText)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .failed(Column::new("failed_at"))
        .error(Column::new("error"));

const LEASE: InboxSpec<(Payload, Attempt, Due, Lease, Failed, ErrorText)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .due(Column::new("due_at"))
        .lease(Column::new("locked_until"))
        .failed(Column::new("failed_at"))
        .error(Column::new("error"));

const LEASE_MARKED: InboxSpec<(Payload, Attempt, Lease, Processed)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"))
        .processed_at(Column::new("processed_at"));

const KEY: &[KeyPart] = &[KeyPart::Literal("jobs-"), KeyPart::Column("channel")];

const ADVISORY: InboxSpec<(Advisory, Attempt, Payload, Failed)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .advisory(KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .failed(Column::new("failed_at"));

const CUSTOM: InboxSpec<(Advisory, Attempt, Payload, own::Lock, own::Unlock)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .advisory(KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .own::<own::Lock>()
        .own::<own::Unlock>();

/// A table, a dialect and a number of workers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Config {
    dialect: Dialect,
    table: Table,
    workers: usize,
    processes: usize,
    /// The brokers' connection linger: none, or the default.
    linger: Duration,
    /// Rows claimed ahead beyond the workers.
    prefetch: usize,
    /// The attempt budget, on tables that keep failed rows.
    max_attempts: Option<u32>,
    /// How far each slot's clock runs ahead of the database's (behind where negative), in
    /// microseconds: by more than a lease, so that no process's clock may decide whether a
    /// row is held.
    skew: [i64; 4],
}

/// Every process's clock reads the database's.
const NO_SKEW: [i64; 4] = [0; 4];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Table {
    RowLock,
    RowLockById,
    Lease,
    LeaseMarked,
    Advisory,
    Custom,
}

impl Table {
    fn desc(self) -> TableDesc {
        *match self {
            Table::RowLock => ROW_LOCK.desc(),
            Table::RowLockById => ROW_LOCK_BY_ID.desc(),
            Table::Lease => LEASE.desc(),
            Table::LeaseMarked => LEASE_MARKED.desc(),
            Table::Advisory => ADVISORY.desc(),
            Table::Custom => CUSTOM.desc(),
        }
    }
}

/// One step of a schedule. Indices pick among what exists then, modulo its number.
#[derive(Clone, Debug)]
pub(crate) enum Step {
    /// A process's adapter runs one of its waiting commands on the database.
    Run { process: usize, command: usize },
    /// The same, but the statement fails; `lost` drops the connection too.
    Fail {
        process: usize,
        command: usize,
        lost: bool,
    },
    /// A reply reaches a process's broker.
    Reply { process: usize, reply: usize },
    /// A handler settles its message; a retry waits `delay_ms`.
    Settle {
        process: usize,
        handler: usize,
        outcome: Outcome,
        delay_ms: u64,
    },
    /// A handler is dropped unsettled.
    Drop { process: usize, handler: usize },
    /// A handler asks for its row lock claim's transaction, to write in it.
    Lend { process: usize, handler: usize },
    /// Time passes.
    Advance { millis: u64 },
    /// A process dies (SIGKILL) and starts again.
    Crash { process: usize },
    /// A process shuts down.
    Shutdown { process: usize },
    /// A row is published, with this channel.
    Publish { process: usize, channel: i64 },
    /// Several rows in one publish.
    PublishAll {
        process: usize,
        channel: i64,
        rows: usize,
    },
    /// Another system's session takes a key's lock (the database's lock, as the billing of
    /// the custom lock example would), or releases the one it holds.
    Foreign { channel: i64, hold: bool },
    /// Every process runs what it can at this time, then the liveness invariant holds.
    Check,
}

fn step() -> impl Strategy<Value = Step> {
    let outcome = prop_oneof![
        6 => Just(Outcome::Ack),
        3 => Just(Outcome::Retry),
        1 => Just(Outcome::Reject),
    ];
    prop_oneof![
        30 => (0..4usize, 0..8usize).prop_map(|(process, command)| Step::Run { process, command }),
        3 => (0..4usize, 0..8usize, any::<bool>())
            .prop_map(|(process, command, lost)| Step::Fail { process, command, lost }),
        30 => (0..4usize, 0..8usize).prop_map(|(process, reply)| Step::Reply { process, reply }),
        8 => (0..4usize, 0..8usize, outcome, prop_oneof![Just(0u64), 0..5_000u64])
            .prop_map(|(process, handler, outcome, delay_ms)| {
                Step::Settle { process, handler, outcome, delay_ms }
            }),
        1 => (0..4usize, 0..8usize).prop_map(|(process, handler)| Step::Drop { process, handler }),
        2 => (0..4usize, 0..8usize).prop_map(|(process, handler)| Step::Lend { process, handler }),
        6 => prop_oneof![0..2_000u64, 0..70_000u64].prop_map(|millis| Step::Advance { millis }),
        1 => (0..4usize).prop_map(|process| Step::Crash { process }),
        1 => (0..4usize).prop_map(|process| Step::Shutdown { process }),
        4 => (0..4usize, 0..4i64).prop_map(|(process, channel)| Step::Publish { process, channel }),
        1 => (0..4usize, 0..4i64, 2..6usize)
            .prop_map(|(process, channel, rows)| Step::PublishAll { process, channel, rows }),
    ]
}

/// A command as the log prints it: a statement by its kind and binds.
fn short(action: &Action) -> String {
    match action {
        Action::Execute { statement, binds } => format!("{:?} {binds:?}", statement.kind),
        other => format!("{other:?}"),
    }
}

fn configs(table: Table) -> impl Strategy<Value = Config> {
    let dialects = if matches!(table, Table::RowLock | Table::RowLockById) {
        prop_oneof![
            Just(Dialect::Postgres),
            Just(Dialect::MySql),
            Just(Dialect::MariaDb)
        ]
        .boxed()
    } else {
        prop_oneof![
            Just(Dialect::Postgres),
            Just(Dialect::MySql),
            Just(Dialect::MariaDb),
            Just(Dialect::Sqlite)
        ]
        .boxed()
    };
    (
        dialects,
        1..4usize,
        prop_oneof![1 => Just(1usize), 3 => 2..4usize],
        prop_oneof![Just(Duration::ZERO), Just(CONNECTION_LINGER)],
        prop_oneof![2 => Just(0usize), 1 => 1..4usize],
        prop_oneof![Just(None), (1..4u32).prop_map(Some)],
        skews(),
    )
        .prop_map(
            move |(dialect, workers, processes, linger, prefetch, max_attempts, skew)| Config {
                dialect,
                table,
                workers,
                linger,
                prefetch,
                max_attempts: max_attempts.filter(|_| table.desc().failed_at.is_some()),
                // SQLite's clock is its process's machine's.
                skew: if dialect == Dialect::Sqlite {
                    NO_SKEW
                } else {
                    skew
                },
                // One process serves a SQLite database.
                processes: if dialect == Dialect::Sqlite {
                    1
                } else {
                    processes
                },
            },
        )
}

/// Clocks off the database's by up to three leases either way, or in step.
fn skews() -> impl Strategy<Value = [i64; 4]> {
    let lease = i64::try_from(LEASE_TIME.as_micros()).expect("fits");
    prop_oneof![
        1 => Just(NO_SKEW),
        3 => prop::array::uniform4(-3 * lease..3 * lease),
    ]
}

/// Runs a schedule on a world of `config`, then shuts every process down and drains the
/// table with a clean one.
fn run(config: Config, steps: &[Step]) {
    let mut world = World::new(config);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for step in steps {
            world.apply(step);
        }
        world.finish();
        world.drain();
    }));
    if let Err(panic) = result {
        if std::env::var_os("RUSTSTREAM_MODEL_LOG").is_none() {
            std::panic::resume_unwind(panic);
        }
        let tail: Vec<&String> = world.log.iter().rev().take(400).collect();
        eprintln!("config: {config:?}\nlast steps, newest first:");
        for line in tail {
            eprintln!("{line}");
        }
        std::panic::resume_unwind(panic);
    }
}

fn schedule() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(), 0..150)
}

/// A step of a liveness schedule: no failed statements (a failed claim waits for its poll),
/// keys held by another system, and checks of the liveness invariant.
fn liveness_step() -> impl Strategy<Value = Step> {
    let outcome = prop_oneof![
        6 => Just(Outcome::Ack),
        3 => Just(Outcome::Retry),
        1 => Just(Outcome::Reject),
    ];
    prop_oneof![
        30 => (0..4usize, 0..8usize).prop_map(|(process, command)| Step::Run { process, command }),
        30 => (0..4usize, 0..8usize).prop_map(|(process, reply)| Step::Reply { process, reply }),
        10 => (0..4usize, 0..8usize, outcome)
            .prop_map(|(process, handler, outcome)| {
                Step::Settle { process, handler, outcome, delay_ms: 0 }
            }),
        1 => (0..4usize, 0..8usize).prop_map(|(process, handler)| Step::Drop { process, handler }),
        3 => (0..2_000u64).prop_map(|millis| Step::Advance { millis }),
        1 => (0..4usize).prop_map(|process| Step::Crash { process }),
        5 => (0..4usize, 0..6i64).prop_map(|(process, channel)| Step::Publish { process, channel }),
        1 => (0..4usize, 0..6i64, 2..6usize)
            .prop_map(|(process, channel, rows)| Step::PublishAll { process, channel, rows }),
        2 => (0..6i64, any::<bool>()).prop_map(|(channel, hold)| Step::Foreign { channel, hold }),
        6 => Just(Step::Check),
    ]
}

/// Several processes on the database's locks, sharing keys, some held elsewhere.
fn liveness_configs() -> impl Strategy<Value = Config> {
    (
        prop_oneof![
            Just(Dialect::Postgres),
            Just(Dialect::MySql),
            Just(Dialect::MariaDb)
        ],
        1..4usize,
        1..4usize,
        prop_oneof![Just(Duration::ZERO), Just(CONNECTION_LINGER)],
        prop_oneof![2 => Just(0usize), 1 => 1..3usize],
        skews(),
    )
        .prop_map(
            |(dialect, workers, processes, linger, prefetch, skew)| Config {
                dialect,
                table: Table::Advisory,
                workers,
                processes,
                linger,
                prefetch,
                max_attempts: None,
                skew,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 600,
        max_shrink_iters: 4_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn row_lock(config in configs(Table::RowLock), steps in schedule()) {
        run(config, &steps);
    }

    #[test]
    fn row_lock_in_id_order(config in configs(Table::RowLockById), steps in schedule()) {
        run(config, &steps);
    }

    #[test]
    fn lease(config in configs(Table::Lease), steps in schedule()) {
        run(config, &steps);
    }

    #[test]
    fn lease_marking_processed(config in configs(Table::LeaseMarked), steps in schedule()) {
        run(config, &steps);
    }

    #[test]
    fn advisory(config in configs(Table::Advisory), steps in schedule()) {
        run(config, &steps);
    }

    #[test]
    fn custom_lock(config in configs(Table::Custom), steps in schedule()) {
        run(config, &steps);
    }

    /// Whenever a worker is free and a due row's key is free, a claim takes the row without
    /// waiting for a poll: several processes sharing keys, keys held by another system, long
    /// deliveries, rows claimed ahead.
    #[test]
    fn advisory_liveness(config in liveness_configs(), steps in prop::collection::vec(liveness_step(), 0..150)) {
        run(config, &steps);
    }
}

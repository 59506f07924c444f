//! Deterministic scenarios of the broker: one named test per rule of the forms, the keys,
//! custom locks and shutdown (the guide's forms.md, keys.md and shutdown.md) that the core
//! decides, one file per area, each driven by a [`Sim`].

use std::collections::BTreeSet;
use std::time::Duration;

use ruststream_core::dialect::{FormStatements, KeyLocks, RowLockClaim};
use ruststream_core::spec::own;
use ruststream_core::{
    Action, Arg, Broker, BrokerError, CONNECTION_LINGER, CheckError, ClosedCounts, Column, ConnId,
    DROP_GRACE, DbError, DeliveryId, DescError, Dialect, ErrorKind, Event, Form, Hold, InboxSpec,
    KeyPart, NOTIFY_EVERY, Outcome, PING_AHEAD_AFTER, Publish, Published, Reply, Row, SettleError,
    StatementKind, SubscribeOptions, TableDesc, Time, Value,
};
use sha2::{Digest, Sha256};

use crate::db::{Db, NULL_CHANNEL, SessId, lock_arg};
use crate::sim::*;

mod advisory;
mod check;
mod clock;
mod columns;
mod counts;
mod custom;
mod failures;
mod floors;
mod gather;
mod lease;
mod lend;
mod linger;
mod notify;
mod prefetch;
mod prefetch_lease;
mod publish;
mod row_lock;
mod schema;
mod session;
mod settle_batch;
mod shutdown;
mod wake;

/// Every dialect.
const ALL: [Dialect; 4] = [
    Dialect::Postgres,
    Dialect::MySql,
    Dialect::MariaDb,
    Dialect::Sqlite,
];
/// The dialects with row locks and with advisory locks a session holds.
const SERVERS: [Dialect; 3] = [Dialect::Postgres, Dialect::MySql, Dialect::MariaDb];

const KEY: &[KeyPart] = &[KeyPart::Literal("jobs-"), KeyPart::Column("channel")];
/// `test.` + this + one digit is 64 characters: MySQL's longest lock name.
const KEY_64: &[KeyPart] = &[
    KeyPart::Literal("video_transcoding_jobs_of_the_channel_whose_key_is_long_x-"),
    KeyPart::Column("channel"),
];
/// `test.` + this + one digit is 65 characters: one past MySQL's longest lock name.
const KEY_65: &[KeyPart] = &[
    KeyPart::Literal("video_transcoding_jobs_of_the_channel_whose_key_is_long_xy-"),
    KeyPart::Column("channel"),
];

fn row_lock() -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .due(Column::new("due_at"))
        .desc()
}

/// The row lock form without an attempt column: its claims count nothing, and take no mark.
fn row_lock_plain() -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .due(Column::new("due_at"))
        .desc()
}

fn row_lock_marked() -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .processed_at(Column::new("processed_at"))
        .desc()
}

fn lease() -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .due(Column::new("due_at"))
        .lease(Column::new("locked_until"))
        .desc()
}

fn lease_marked() -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"))
        .processed_at(Column::new("processed_at"))
        .desc()
}

fn advisory_keyed(key: &'static [KeyPart]) -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .advisory(key)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .desc()
}

fn advisory() -> TableDesc {
    advisory_keyed(KEY)
}

fn custom() -> TableDesc {
    *InboxSpec::new("jobs", Column::new("id").generated())
        .advisory(KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .own::<own::Lock>()
        .own::<own::Unlock>()
        .desc()
}

#[track_caller]
fn only<T: std::fmt::Debug>(mut items: Vec<T>) -> T {
    assert_eq!(items.len(), 1, "exactly one: {items:?}");
    items.pop().expect("one")
}

/// A microsecond before `t`.
fn just_before(t: Time) -> Time {
    Time(t.micros() - 1)
}

fn bool_reply(value: bool) -> Reply<i64> {
    Reply::Rows(vec![Row::values(vec![Value::Bool(value)])])
}

/// A settlement's, extension's or release's statement (not a claim's).
fn touches_a_held_row(op: &Op) -> bool {
    matches!(
        op,
        Exec(
            StatementKind::Delete { .. }
                | StatementKind::MarkProcessed { .. }
                | StatementKind::ReleaseLease
                | StatementKind::ExtendLease
                | StatementKind::Unlock
        ) | Op::Unlock(_)
    )
}

fn delete(fenced: bool) -> Op {
    Exec(StatementKind::Delete { fenced })
}

/// The advisory form's take, per dialect: one statement, or a count then a read.
fn take_ops(dialect: Dialect) -> Vec<Op> {
    match dialect {
        Dialect::MySql | Dialect::MariaDb => {
            vec![Exec(StatementKind::TakeCount), Exec(StatementKind::ReadRow)]
        }
        Dialect::Postgres | Dialect::Sqlite => vec![Exec(StatementKind::Take)],
    }
}

fn take_kind(dialect: Dialect) -> StatementKind {
    match dialect {
        Dialect::MySql | Dialect::MariaDb => StatementKind::TakeCount,
        Dialect::Postgres | Dialect::Sqlite => StatementKind::Take,
    }
}

fn lease_claim_kind(dialect: Dialect) -> StatementKind {
    match dialect {
        Dialect::MySql | Dialect::MariaDb => StatementKind::SelectLease,
        Dialect::Postgres | Dialect::Sqlite => StatementKind::ClaimLease,
    }
}

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Holds every statement of `kind` unanswered.
fn hold_kind(sim: &mut Sim, kind: StatementKind) {
    sim.hook(move |_, c| {
        if kind_of(c) == Some(kind) {
            Intercept::Hold
        } else {
            Intercept::Run
        }
    });
}

/// Runs a process's commands, holding back the first lease settlement statement, and
/// answers with it.
fn hold_first_settlement(sim: &mut Sim) {
    let mut held = false;
    sim.hook(move |_, command| match &command.action {
        Action::Execute { statement, .. }
            if !held && matches!(statement.kind, StatementKind::Delete { fenced: true }) =>
        {
            held = true;
            Intercept::Hold
        }
        _ => Intercept::Run,
    });
}

fn count(ops: &[Op], op: &Op) -> usize {
    ops.iter().filter(|o| *o == op).count()
}

/// A table of `form` with a due column (but for the lease form when `due` is off), a
/// `failed_at` and an error column.
fn failing(form: Form, due: bool) -> TableDesc {
    let mut desc = *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .failed(Column::new("failed_at"))
        .error(Column::new("error"))
        .desc();
    if due {
        desc.due = Some(Column::new("due_at"));
    }
    match form {
        Form::RowLock => {}
        Form::Lease => {
            desc.hold = Hold::Lease {
                locked_until: Column::new("locked_until"),
            }
        }
        Form::Advisory => {
            desc.hold = Hold::Advisory {
                key: KEY,
                custom_lock: false,
            }
        }
    }
    desc
}

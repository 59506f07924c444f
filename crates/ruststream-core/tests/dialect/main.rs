//! The statement text of every dialect: exact SQL for a representative set of statements, and
//! properties that hold for every statement of every description in every dialect (quoting,
//! placeholders against `args`, `FOR UPDATE SKIP LOCKED` only where the form calls for it).
//! Then the broker: it renders a subscription's statements once and hands out that text.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ruststream_core::dialect::{
    AdvisoryStatements, AdvisoryTake, FormStatements, KeyLocks, LeaseClaim, LeaseStatements,
    RowLockClaim, RowLockStatements, UNTIL,
};
use ruststream_core::spec::{
    Advisory, Attempt, Column, Due, ErrorText, Failed, InboxSpec, KeyPart, Lease, OrderBy, Payload,
    Processed, own,
};
use ruststream_core::{
    Action, Arg, Broker, ColumnType, Dialect, Event, FailedRows, Form, NOTIFY_CHANNEL, OutColumn,
    Output, Publish, Reply, Row, Statement, StatementKind, Statements, SubscribeOptions, TableDesc,
    Time, Value, notification_names,
};

const DIALECTS: [Dialect; 4] = [
    Dialect::Postgres,
    Dialect::MySql,
    Dialect::MariaDb,
    Dialect::Sqlite,
];

/// The database's clock, as each dialect reads it: every time a statement writes into a row
/// or compares with one.
const PG_NOW: &str = "statement_timestamp()";
const MY_NOW: &str = "UTC_TIMESTAMP(6)";
const LITE_NOW: &str =
    "(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)";

/// A PostgreSQL time as microseconds since the Unix epoch.
fn pg_micros(expr: &str) -> String {
    format!("CAST(EXTRACT(EPOCH FROM {expr}) * 1000000 AS BIGINT)")
}

/// A MySQL or MariaDB time as microseconds since the Unix epoch.
fn my_micros(expr: &str) -> String {
    format!("TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', {expr})")
}

/// A bound time (microseconds since the Unix epoch) as a PostgreSQL `timestamptz`: `$n`.
fn pg_time(n: u32) -> String {
    format!("(TIMESTAMPTZ 'epoch' + CAST(${n} AS BIGINT) * INTERVAL '1 microsecond')")
}

/// The PostgreSQL time `base` plus bound microseconds `$n`.
fn pg_plus(base: &str, n: u32) -> String {
    format!("({base} + CAST(${n} AS BIGINT) * INTERVAL '1 microsecond')")
}

/// A bound time as a MySQL or MariaDB `DATETIME(6)`.
const MY_TIME: &str = "TIMESTAMPADD(MICROSECOND, ?, TIMESTAMP'1970-01-01 00:00:00')";

const ROW_LOCK: InboxSpec<(Payload, Attempt)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated());

const ROW_LOCK_PLAIN: InboxSpec<(Payload,)> =
    InboxSpec::new("jobs", Column::new("id").generated()).payload(Column::new("payload"));

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

const VIDEO_KEY: &[KeyPart] = &[KeyPart::Literal("video_jobs-"), KeyPart::Column("channel")];

const ADVISORY: InboxSpec<(Advisory, Attempt, Payload)> =
    InboxSpec::new("video_jobs", Column::new("id").generated())
        .advisory(VIDEO_KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"));

const ADVISORY_PLAIN: InboxSpec<(Advisory, Payload, Processed, Due)> =
    InboxSpec::new("video_jobs", Column::new("id").generated())
        .advisory(VIDEO_KEY)
        .payload(Column::new("payload"))
        .processed_at(Column::new("processed_at"))
        .due(Column::new("due_at"));

const CUSTOM: InboxSpec<(Advisory, Payload, own::Lock, own::Unlock)> =
    InboxSpec::new("payouts", Column::new("id").generated())
        .advisory(&[KeyPart::Literal("accounts-"), KeyPart::Column("account_id")])
        .payload(Column::new("payload"))
        .own::<own::Lock>()
        .own::<own::Unlock>();

/// A key on the row's generated id: publishing must not write the id.
const ADVISORY_ON_ID: InboxSpec<(Advisory, Payload)> =
    InboxSpec::new("single_jobs", Column::new("id").generated())
        .advisory(&[KeyPart::Literal("single-"), KeyPart::Column("id")])
        .payload(Column::new("payload"));

const SCHEMA: InboxSpec<(Payload,)> =
    InboxSpec::new("app.jobs", Column::new("id")).payload(Column::new("payload"));

const ORDER: InboxSpec<(Payload, Due)> = InboxSpec::new("jobs", Column::new("id").generated())
    .payload(Column::new("payload"))
    .due(Column::new("due_at"))
    .order(&[OrderBy::desc("priority"), OrderBy::asc("due_at")]);

/// Names that hold both quote characters.
const QUOTED: InboxSpec<(Payload, Attempt, Lease)> =
    InboxSpec::new("odd\"na`me", Column::new("i\"d").generated())
        .payload(Column::new("pay`load"))
        .attempt(Column::new("att\"empt"))
        .lease(Column::new("lock`ed"));

const QUOTED_ADVISORY: InboxSpec<(Advisory,)> =
    InboxSpec::new("odd\"na`me", Column::new("i\"d").generated())
        .advisory(&[KeyPart::Literal("it's-\\"), KeyPart::Column("ch`an\"nel")]);

fn descs() -> Vec<(&'static str, TableDesc)> {
    vec![
        ("row lock", *ROW_LOCK.desc()),
        ("lease", *LEASE.desc()),
        ("plain lease", *LEASE_PLAIN.desc()),
        ("advisory", *ADVISORY.desc()),
        ("plain advisory", *ADVISORY_PLAIN.desc()),
        ("custom lock", *CUSTOM.desc()),
        ("advisory on id", *ADVISORY_ON_ID.desc()),
        ("schema.table", *SCHEMA.desc()),
        ("order", *ORDER.desc()),
        ("quoted", *QUOTED.desc()),
        ("quoted advisory", *QUOTED_ADVISORY.desc()),
        ("failing row lock", *FAILING_ROW_LOCK.desc()),
        ("failing lease", *FAILING_LEASE.desc()),
        ("failing advisory", *FAILING_ADVISORY.desc()),
    ]
}

const FAILING_ROW_LOCK: InboxSpec<(Payload, Attempt, Due, Failed, ErrorText)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .due(Column::new("due_at"))
        .failed(Column::new("failed_at"))
        .error(Column::new("error"));

const FAILING_LEASE: InboxSpec<(Payload, Attempt, Lease, Failed, ErrorText)> =
    InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .attempt(Column::new("attempt").generated())
        .lease(Column::new("locked_until"))
        .failed(Column::new("failed_at"))
        .error(Column::new("error"));

const FAILING_ADVISORY: InboxSpec<(Advisory, Attempt, Payload, Failed)> =
    InboxSpec::new("video_jobs", Column::new("id").generated())
        .advisory(VIDEO_KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .failed(Column::new("failed_at"));

mod advisory;
mod args;
mod broker;
mod claims;
mod failed;
mod form;
mod lease;
mod names;
mod publish;
mod row_lock;

fn render(dialect: Dialect, desc: &InboxSpec<impl Sized>) -> Flat {
    Flat::of(Statements::render(dialect, desc.desc(), 2))
}

/// Every statement of a rendering by its role, the form's own as options: the texts are
/// asserted by name whatever form rendered them.
struct Flat {
    statements: Statements,
    dialect: Dialect,
    form: Form,
    begin: Statement,
    commit: Statement,
    rollback: Statement,
    list_columns: Statement,
    current_database: Option<Statement>,
    publish: Statement,
    isolation: Option<Statement>,
    lock_row: Option<Statement>,
    count_row: Option<Statement>,
    select_row_id: Option<Statement>,
    count_attempt: Option<Statement>,
    lock_row_by_id: Option<Statement>,
    mark_rows: Option<Statement>,
    unmark_rows: Option<Statement>,
    claim_lease: Option<Statement>,
    select_lease: Option<Statement>,
    mark_lease: Vec<Statement>,
    extend_lease: Option<Statement>,
    release_lease: Option<Statement>,
    candidates: Option<Statement>,
    try_lock: Option<Statement>,
    unlock: Option<Statement>,
    take: Option<Statement>,
    take_count: Option<Statement>,
    read_row: Option<Statement>,
    settle: Statement,
    ping: Option<Statement>,
}

impl Flat {
    fn of(statements: Statements) -> Self {
        let none = || None::<Statement>;
        let mut flat = Flat {
            dialect: statements.dialect,
            form: statements.form(),
            begin: statements.begin.clone(),
            commit: statements.commit.clone(),
            rollback: statements.rollback.clone(),
            list_columns: statements.list_columns.clone(),
            current_database: statements.current_database.clone(),
            publish: statements.publish.clone(),
            isolation: none(),
            lock_row: none(),
            count_row: none(),
            select_row_id: none(),
            count_attempt: none(),
            lock_row_by_id: none(),
            mark_rows: none(),
            unmark_rows: none(),
            claim_lease: none(),
            select_lease: none(),
            mark_lease: Vec::new(),
            extend_lease: none(),
            release_lease: none(),
            candidates: none(),
            try_lock: none(),
            unlock: none(),
            take: none(),
            take_count: none(),
            read_row: none(),
            settle: statements.publish.clone(),
            ping: none(),
            statements: statements.clone(),
        };
        match &statements.form {
            FormStatements::RowLock(f) => flat.take_row_lock(f),
            FormStatements::Lease(f) => flat.take_lease(f),
            FormStatements::Advisory(f) => flat.take_advisory(f),
        }
        flat
    }

    fn take_row_lock(&mut self, f: &RowLockStatements) {
        self.isolation = f.isolation.clone();
        match &f.claim {
            RowLockClaim::Lock { lock_row } => self.lock_row = Some(lock_row.clone()),
            RowLockClaim::Count {
                count_row,
                lock_row_by_id,
                unmark_rows,
                ..
            } => {
                self.count_row = Some(count_row.clone());
                self.lock_row_by_id = Some(lock_row_by_id.clone());
                self.unmark_rows = unmark_rows.get(1).cloned();
            }
            RowLockClaim::SelectCount {
                select_row_id,
                mark_rows,
                count_attempts,
                lock_row_by_id,
                unmark_rows,
                ..
            } => {
                self.select_row_id = Some(select_row_id.clone());
                self.mark_rows = mark_rows.get(1).cloned();
                self.count_attempt = count_attempts.first().cloned();
                self.lock_row_by_id = Some(lock_row_by_id.clone());
                self.unmark_rows = unmark_rows.get(1).cloned();
            }
        }
        self.settle = f.settle.clone();
        self.ping = Some(f.ping.clone());
    }

    fn take_lease(&mut self, f: &LeaseStatements) {
        match &f.claim {
            LeaseClaim::Returning { claim } => self.claim_lease = Some(claim.clone()),
            LeaseClaim::Locking { select, mark } => {
                self.select_lease = Some(select.clone());
                self.mark_lease = mark.clone();
            }
        }
        self.extend_lease = Some(f.extend.clone());
        self.release_lease = Some(f.release.clone());
        self.settle = f.settle.clone();
    }

    fn take_advisory(&mut self, f: &AdvisoryStatements) {
        self.candidates = Some(f.candidates.clone());
        if let KeyLocks::Database { try_lock, unlock } = &f.keys {
            self.try_lock = Some(try_lock.clone());
            self.unlock = Some(unlock.clone());
        }
        match &f.take {
            AdvisoryTake::Returning { take } => self.take = Some(take.clone()),
            AdvisoryTake::CountThenRead {
                take_count,
                read_row,
            } => {
                self.take_count = Some(take_count.clone());
                self.read_row = Some(read_row.clone());
            }
        }
        self.settle = f.settle.clone();
        self.ping = f.ping.clone();
    }

    fn mark_lease(&self, n: usize) -> Option<&Statement> {
        match &self.statements.form {
            FormStatements::Lease(f) => f.claim.mark(n),
            _ => None,
        }
    }

    fn all(&self) -> Vec<&Statement> {
        self.statements.all()
    }
}

fn sql(statement: &Option<Statement>) -> &str {
    &statement.as_ref().expect("the statement is rendered").sql
}

/// The rows a lease claim reads: the id, the attempt, then the expiry its lease got by the
/// database's clock.
fn claimed_columns(attempt: bool) -> Output {
    let mut columns = vec![OutColumn::new("id", ColumnType::Id)];
    if attempt {
        columns.push(OutColumn::new("attempt", ColumnType::Int));
    }
    columns.push(OutColumn::new("rs_until", ColumnType::Int));
    Output::Rows {
        columns: columns.into(),
        raw: true,
    }
}

/// A placeholder found outside quoted text: `$n`, `?n` or a bare `?`.
#[derive(Debug, PartialEq, Eq)]
enum Mark {
    Dollar(usize),
    Numbered(usize),
    Bare,
}

/// The placeholders of `sql`, skipping string literals and quoted identifiers (a doubled
/// quote inside them is an escaped quote; on MySQL a backslash escapes inside a string).
fn placeholders(dialect: Dialect, sql: &str) -> Vec<Mark> {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let number = |i: &mut usize| {
        let start = *i;
        while *i < chars.len() && chars[*i].is_ascii_digit() {
            *i += 1;
        }
        chars[start..*i]
            .iter()
            .collect::<String>()
            .parse::<usize>()
            .ok()
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\'' | '"' | '`' => {
                i += 1;
                loop {
                    assert!(i < chars.len(), "unterminated {c} in {sql}");
                    if c == '\'' && chars[i] == '\\' && dialect_is_mysql(dialect) {
                        i += 2;
                        continue;
                    }
                    if chars[i] == c {
                        if chars.get(i + 1) == Some(&c) {
                            i += 2;
                            continue;
                        }
                        i += 1;
                        break;
                    }
                    i += 1;
                }
            }
            '$' => {
                i += 1;
                let n = number(&mut i).unwrap_or_else(|| panic!("a bare `$` in {sql}"));
                out.push(Mark::Dollar(n));
            }
            '?' => {
                i += 1;
                match number(&mut i) {
                    Some(n) => out.push(Mark::Numbered(n)),
                    None => out.push(Mark::Bare),
                }
            }
            _ => i += 1,
        }
    }
    out
}

fn dialect_is_mysql(dialect: Dialect) -> bool {
    matches!(dialect, Dialect::MySql | Dialect::MariaDb)
}

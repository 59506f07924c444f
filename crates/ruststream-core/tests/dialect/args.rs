//! Placeholders against `args`, the binds each statement needs, and the database clock.

use super::*;

#[test]
fn placeholders_match_args_in_every_statement() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            let s = Flat::of(Statements::render(dialect, &desc, 3));
            for st in s.all() {
                let marks = placeholders(dialect, &st.sql);
                let what = format!("{name}, {dialect:?}, {:?}: {}", st.kind, st.sql);
                match dialect {
                    Dialect::MySql | Dialect::MariaDb => {
                        assert!(marks.iter().all(|m| *m == Mark::Bare), "{what}");
                        assert_eq!(marks.len(), st.args.len(), "one arg per `?`: {what}");
                    }
                    Dialect::Postgres | Dialect::Sqlite => {
                        let numbers: Vec<usize> = marks
                            .iter()
                            .map(|m| match (dialect, m) {
                                (Dialect::Postgres, Mark::Dollar(n)) => *n,
                                (Dialect::Sqlite, Mark::Numbered(n)) => *n,
                                _ => panic!("wrong placeholder {m:?}: {what}"),
                            })
                            .collect();
                        let mut used: Vec<usize> = numbers.clone();
                        used.sort_unstable();
                        used.dedup();
                        let expected: Vec<usize> = (1..=st.args.len()).collect();
                        assert_eq!(used, expected, "every arg used, none past the last: {what}");
                        for (i, a) in st.args.iter().enumerate() {
                            assert!(
                                !st.args[..i].contains(a),
                                "{a:?} listed twice instead of its number reused: {what}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn args_are_the_ones_each_statement_needs() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            let s = Flat::of(Statements::render(dialect, &desc, 2));
            for st in s.all() {
                let what = format!("{name}, {dialect:?}, {:?}: {}", st.kind, st.sql);
                for arg in st.args.iter() {
                    assert!(arg_allowed(&st.kind, arg), "unexpected {arg:?}: {what}");
                }
                args_name_rows_fences_and_durations(&desc, st, &what);
            }
        }
    }
}

/// Whether a statement of `kind` may bind `arg`.
fn arg_allowed(kind: &StatementKind, arg: &Arg) -> bool {
    match *kind {
        StatementKind::Begin
        | StatementKind::Commit
        | StatementKind::Rollback
        | StatementKind::CurrentDatabase
        | StatementKind::Notify
        | StatementKind::Ping
        | StatementKind::Savepoint
        | StatementKind::RollbackToSavepoint
        | StatementKind::ReadCommitted
        | StatementKind::Isolation
        | StatementKind::Maintenance(_) => false,
        StatementKind::ListColumns => {
            matches!(arg, Arg::TableName | Arg::Schema)
        }
        // The claims compare with the database's clock: they bind no time.
        StatementKind::LockRow => false,
        StatementKind::Candidates => matches!(arg, Arg::Limit | Arg::Floor),
        StatementKind::ClaimLease => {
            matches!(arg, Arg::Limit | Arg::LeaseFor | Arg::Floor)
        }
        StatementKind::SelectLease => matches!(arg, Arg::Limit | Arg::LeaseFor),
        // MySQL and MariaDB write the expiry their locking read read.
        StatementKind::MarkLease(n) => {
            matches!(arg, Arg::Fence) || matches!(arg, Arg::IdAt(i) if *i < n)
        }
        StatementKind::ExtendLease => {
            matches!(arg, Arg::Extend | Arg::Id | Arg::Fence)
        }
        StatementKind::ReleaseLease => matches!(arg, Arg::Id | Arg::Fence),
        StatementKind::TryLock | StatementKind::Unlock => *arg == Arg::Key,
        StatementKind::ReadRow => *arg == Arg::Id,
        StatementKind::CountAttempt => matches!(arg, Arg::IdAt(_)),
        StatementKind::CountRow => {
            matches!(arg, Arg::Limit | Arg::Take | Arg::Floor)
        }
        StatementKind::SelectRowId => *arg == Arg::Limit,
        StatementKind::MarkRows(n) | StatementKind::UnmarkRows(n) => {
            matches!(arg, Arg::MarkAt(i) if *i < n)
        }
        StatementKind::LockRowById => matches!(arg, Arg::Id | Arg::Attempt),
        StatementKind::LockRowByIdUnmarking => {
            matches!(arg, Arg::Id | Arg::Attempt | Arg::MarkAt(0))
        }
        StatementKind::Take | StatementKind::TakeCount => *arg == Arg::Id,
        StatementKind::Delete { fenced } | StatementKind::MarkProcessed { fenced } => {
            *arg == Arg::Id || fenced && *arg == Arg::Fence
        }
        StatementKind::Publish => {
            matches!(arg, Arg::Id | Arg::Payload | Arg::Due | Arg::Column(_))
        }
        StatementKind::SettleLeases(n) => {
            matches!(arg, Arg::IdAt(i) | Arg::FenceAt(i) if *i < n)
        }
        StatementKind::Fail { fenced } => {
            matches!(arg, Arg::Id | Arg::Error) || fenced && *arg == Arg::Fence
        }
        StatementKind::RetryLater { fenced } => {
            matches!(arg, Arg::Id | Arg::RetryIn | Arg::Error) || fenced && *arg == Arg::Fence
        }
        StatementKind::Redrive(_) | StatementKind::DeleteFailed(_) => {
            matches!(arg, Arg::IdAt(_) | Arg::ErrorLike)
        }
        StatementKind::Stats => false,
        StatementKind::ListFailed => {
            matches!(arg, Arg::Id | Arg::Floor | Arg::Limit)
        }
        StatementKind::ListIndexes => {
            matches!(arg, Arg::TableName | Arg::Schema)
        }
        StatementKind::CreateSchema => false,
    }
}

/// A statement binds the row it names, the fence it checks and each duration it adds, once.
fn args_name_rows_fences_and_durations(desc: &TableDesc, st: &Statement, what: &str) {
    if matches!(
        st.kind,
        StatementKind::Delete { .. }
            | StatementKind::MarkProcessed { .. }
            | StatementKind::ReadRow
            | StatementKind::Take
            | StatementKind::TakeCount
            | StatementKind::ExtendLease
            | StatementKind::ReleaseLease
    ) {
        assert!(st.args.contains(&Arg::Id), "names its row: {what}");
    }
    if st.kind == StatementKind::CountAttempt {
        assert!(st.args.contains(&Arg::IdAt(0)), "names its rows: {what}");
    }
    if matches!(
        st.kind,
        StatementKind::Delete { fenced: true }
            | StatementKind::MarkProcessed { fenced: true }
            | StatementKind::ExtendLease
            | StatementKind::ReleaseLease
    ) {
        assert!(st.args.contains(&Arg::Fence), "fenced: {what}");
    }
    // Each duration is bound where the database's time is moved by it.
    let duration = match st.kind {
        StatementKind::ClaimLease | StatementKind::SelectLease => Some(Arg::LeaseFor),
        StatementKind::ExtendLease => Some(Arg::Extend),
        // Without a due column or a lease a retry writes only the error.
        StatementKind::RetryLater { .. } if desc.due.is_some() || desc.locked_until().is_some() => {
            Some(Arg::RetryIn)
        }
        _ => None,
    };
    if let Some(duration) = duration {
        assert_eq!(
            st.args.iter().filter(|a| **a == duration).count(),
            1,
            "binds {duration:?} once: {what}"
        );
    }
    if st.kind == StatementKind::MarkLease(1) {
        assert!(
            st.args.contains(&Arg::Fence),
            "writes the expiry read: {what}"
        );
    }
}

/// Every claim decides whether a row is due and whether its lease ran out by the database's
/// clock; no statement binds a time of the process, only the times a row holds (a fence) or a
/// user gave (a due time).
#[test]
fn times_are_the_database_clock() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            let s = Flat::of(Statements::render(dialect, &desc, 2));
            let now = match dialect {
                Dialect::Postgres => PG_NOW,
                Dialect::MySql | Dialect::MariaDb => MY_NOW,
                Dialect::Sqlite => LITE_NOW,
            };
            for st in s.all() {
                let what = format!("{name}, {dialect:?}, {:?}: {}", st.kind, st.sql);
                let claims = matches!(
                    st.kind,
                    StatementKind::LockRow
                        | StatementKind::CountRow
                        | StatementKind::SelectRowId
                        | StatementKind::LockRowById
                        | StatementKind::LockRowByIdUnmarking
                        | StatementKind::ClaimLease
                        | StatementKind::SelectLease
                        | StatementKind::Candidates
                        | StatementKind::Take
                        | StatementKind::TakeCount
                );
                if claims {
                    if let Some(due) = desc.due {
                        let due = dialect.quote(due.name);
                        assert!(
                            st.sql.contains(&format!("{due} <= {now}")),
                            "due by the database's clock: {what}"
                        );
                    }
                    if let Some(lease) = desc.locked_until() {
                        let lease = dialect.quote(lease.name);
                        assert!(
                            st.sql
                                .contains(&format!("({lease} IS NULL OR {lease} <= {now})")),
                            "a lease run out by the database's clock: {what}"
                        );
                    }
                }
                // A bound time is converted once per placeholder: count the conversions.
                let times = st
                    .args
                    .iter()
                    .filter(|a| matches!(a, Arg::Fence | Arg::FenceAt(_) | Arg::Due | Arg::Tick))
                    .count();
                let conversions = match dialect {
                    Dialect::Postgres => Some(st.sql.matches("(TIMESTAMPTZ 'epoch' + ").count()),
                    Dialect::MySql | Dialect::MariaDb => Some(st.sql.matches(MY_TIME).count()),
                    Dialect::Sqlite => None,
                };
                if let Some(conversions) = conversions {
                    assert_eq!(
                        conversions, times,
                        "only fences and due times bound: {what}"
                    );
                }
                let (marks, writes_now) = match st.kind {
                    StatementKind::MarkProcessed { .. } => (desc.processed_at, true),
                    StatementKind::Fail { .. } => (desc.failed_at, true),
                    _ => (None, false),
                };
                if writes_now {
                    let mark = dialect.quote(marks.expect("the mark's column").name);
                    assert!(
                        st.sql.contains(&format!(" SET {mark} = {now}")),
                        "marked at the database's time: {what}"
                    );
                }
            }
        }
    }
}

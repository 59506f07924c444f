//! Properties over every description and dialect: quoting, `SKIP LOCKED`, the form's statements.

use super::*;

#[test]
fn identifiers_are_quoted_per_dialect() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            let s = Flat::of(Statements::render(dialect, &desc, 2));
            let table = dialect.quote(desc.table);
            let (open, other) = if dialect_is_mysql(dialect) {
                ('`', '"')
            } else {
                ('"', '`')
            };
            assert!(table.starts_with(open) && table.ends_with(open), "{table}");
            for st in s.all() {
                let what = format!("{name}, {dialect:?}, {:?}: {}", st.kind, st.sql);
                let touches_table = !matches!(
                    st.kind,
                    StatementKind::Begin
                        | StatementKind::Commit
                        | StatementKind::Rollback
                        | StatementKind::ListColumns
                        | StatementKind::ListIndexes
                        | StatementKind::CurrentDatabase
                        | StatementKind::Isolation
                        | StatementKind::TryLock
                        | StatementKind::Unlock
                        | StatementKind::MarkRows(_)
                        | StatementKind::UnmarkRows(_)
                        | StatementKind::ReadCommitted
                        | StatementKind::Ping
                        | StatementKind::Savepoint
                        | StatementKind::RollbackToSavepoint
                );
                if touches_table {
                    assert!(st.sql.contains(&table), "quotes the table: {what}");
                    if st.kind != StatementKind::Publish {
                        assert!(
                            st.sql.contains(&dialect.quote(desc.id.name)),
                            "quotes the id: {what}"
                        );
                    }
                }
                // The other dialect's identifier quote appears only inside a quoted name.
                if !desc.table.contains(other) && !desc.columns().iter().any(|c| c.contains(other))
                {
                    assert!(!st.sql.contains(other), "foreign quote: {what}");
                }
            }
            // Every described column is written, quoted, in some statement.
            if desc.form() == Form::RowLock && dialect == Dialect::Sqlite {
                continue;
            }
            for column in desc.columns() {
                let quoted = dialect.quote(column);
                assert!(
                    s.all().iter().any(|st| st.sql.contains(&quoted)),
                    "{name}, {dialect:?}: column {column} is never written as {quoted}"
                );
            }
        }
    }
}

#[test]
fn skip_locked_only_where_the_form_and_dialect_call_for_it() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            if desc.form() == Form::RowLock && dialect == Dialect::Sqlite {
                // Refused before anything renders: SQLite has no row locks.
                continue;
            }
            let s = Flat::of(Statements::render(dialect, &desc, 2));
            for st in s.all() {
                let expected = match (st.kind, dialect) {
                    (_, Dialect::Sqlite) => false,
                    (
                        StatementKind::LockRow
                        | StatementKind::LockRowById
                        | StatementKind::LockRowByIdUnmarking
                        | StatementKind::CountRow
                        | StatementKind::SelectRowId,
                        _,
                    ) => true,
                    (StatementKind::SelectLease, Dialect::MySql | Dialect::MariaDb) => true,
                    (StatementKind::ClaimLease, Dialect::Postgres) => true,
                    _ => false,
                };
                let n = st.sql.matches("FOR UPDATE SKIP LOCKED").count();
                assert_eq!(
                    n,
                    usize::from(expected),
                    "{name}, {dialect:?}, {:?}: {}",
                    st.kind,
                    st.sql
                );
                assert_eq!(
                    st.sql.matches("FOR UPDATE").count(),
                    n,
                    "FOR UPDATE without SKIP LOCKED would wait: {}",
                    st.sql
                );
            }
            let claim = match (desc.form(), dialect) {
                (Form::RowLock, _) => s
                    .lock_row
                    .as_ref()
                    .or(s.count_row.as_ref())
                    .or(s.select_row_id.as_ref()),
                (Form::Lease, Dialect::Postgres | Dialect::Sqlite) => s.claim_lease.as_ref(),
                (Form::Lease, _) => s.select_lease.as_ref(),
                (Form::Advisory, _) => s.candidates.as_ref(),
            };
            assert!(claim.is_some(), "{name}, {dialect:?}: a claim statement");
        }
    }
}

#[test]
fn statements_match_the_form() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            if desc.form() == Form::RowLock && dialect == Dialect::Sqlite {
                // Refused before anything renders: SQLite has no row locks.
                continue;
            }
            let s = Flat::of(Statements::render(dialect, &desc, 2));
            let what = format!("{name}, {dialect:?}");
            statements_of_the_form(&desc, dialect, &s, &what);
            statements_of_their_kind(&s, &what);
            rows_each_statement_reads(&desc, &s, &what);
        }
    }
}

/// Which statements a rendering holds, by form, dialect and the columns described.
fn statements_of_the_form(desc: &TableDesc, dialect: Dialect, s: &Flat, what: &str) {
    let form = desc.form();
    assert_eq!(s.form, form, "{what}");
    assert_eq!(s.dialect, dialect, "{what}");
    let mysql = dialect_is_mysql(dialect);
    assert_eq!(s.current_database.is_some(), mysql, "{what}");
    assert_eq!(
        s.isolation.is_some(),
        dialect == Dialect::Postgres && form == Form::RowLock,
        "{what}"
    );
    assert_eq!(
        s.lock_row.is_some(),
        form == Form::RowLock && desc.attempt.is_none(),
        "{what}"
    );
    let counted_row_lock =
        form == Form::RowLock && dialect != Dialect::Sqlite && desc.attempt.is_some();
    assert_eq!(
        s.count_row.is_some(),
        counted_row_lock && dialect == Dialect::Postgres,
        "{what}"
    );
    assert_eq!(
        s.select_row_id.is_some(),
        counted_row_lock && mysql,
        "{what}"
    );
    assert_eq!(s.lock_row_by_id.is_some(), counted_row_lock, "{what}");
    assert_eq!(
        s.count_attempt.is_some(),
        counted_row_lock && mysql,
        "{what}"
    );
    assert_eq!(
        s.claim_lease.is_some(),
        form == Form::Lease && !mysql,
        "{what}"
    );
    assert_eq!(
        s.select_lease.is_some(),
        form == Form::Lease && mysql,
        "{what}"
    );
    assert_eq!(s.extend_lease.is_some(), form == Form::Lease, "{what}");
    assert_eq!(s.release_lease.is_some(), form == Form::Lease, "{what}");
    assert_eq!(s.candidates.is_some(), form == Form::Advisory, "{what}");
    assert_eq!(
        s.try_lock.is_some(),
        form == Form::Advisory && dialect != Dialect::Sqlite && !desc.custom_lock(),
        "{what}"
    );
    assert_eq!(s.unlock.is_some(), s.try_lock.is_some(), "{what}");
    assert_eq!(
        s.take.is_some() || s.take_count.is_some(),
        form == Form::Advisory,
        "{what}"
    );
    assert_eq!(s.read_row.is_some(), s.take_count.is_some(), "{what}");
    assert!(!(s.take.is_some() && s.take_count.is_some()), "{what}");
    assert_eq!(
        s.settle.kind,
        match (desc.processed_at.is_some(), form == Form::Lease) {
            (true, fenced) => StatementKind::MarkProcessed { fenced },
            (false, fenced) => StatementKind::Delete { fenced },
        },
        "{what}"
    );
}

/// Each statement sits in the field of its kind.
fn statements_of_their_kind(s: &Flat, what: &str) {
    let pairs: [(&Option<Statement>, StatementKind); 4] = [
        (&s.lock_row, StatementKind::LockRow),
        (&s.claim_lease, StatementKind::ClaimLease),
        (&s.candidates, StatementKind::Candidates),
        (&s.try_lock, StatementKind::TryLock),
    ];
    for (statement, kind) in pairs {
        if let Some(statement) = statement {
            assert_eq!(statement.kind, kind, "{what}");
        }
    }
    if let Some(read_row) = &s.read_row {
        assert_eq!(read_row.kind, StatementKind::ReadRow);
    }
    assert_eq!(s.publish.kind, StatementKind::Publish);
    assert_eq!(s.list_columns.kind, StatementKind::ListColumns);
    for (statement, kind) in [
        (&s.count_row, StatementKind::CountRow),
        (&s.select_row_id, StatementKind::SelectRowId),
        (&s.lock_row_by_id, StatementKind::LockRowById),
    ] {
        if let Some(statement) = statement {
            assert_eq!(statement.kind, kind, "{what}");
        }
    }
}

/// Rows of taken rows carry the id, then the attempt, and the driver's row.
fn rows_each_statement_reads(desc: &TableDesc, s: &Flat, what: &str) {
    let row_columns: Vec<OutColumn> = std::iter::once(OutColumn::new(desc.id.name, ColumnType::Id))
        .chain(
            desc.attempt
                .map(|a| OutColumn::new(a.name, ColumnType::Int)),
        )
        .collect();
    // The count reads back the row's id and the attempt it wrote, which the lock then
    // checks, and the row's mark, which keeps other counts off it until the lock.
    let counted = |mark: ColumnType| -> Vec<OutColumn> {
        std::iter::once(OutColumn::new(desc.id.name, ColumnType::Id))
            .chain(
                desc.attempt
                    .map(|a| OutColumn::new(a.name, ColumnType::Int)),
            )
            .chain([OutColumn::new("rs_mark", mark)])
            .collect()
    };
    for (statement, mark) in [
        (&s.count_row, ColumnType::Int),
        (&s.select_row_id, ColumnType::Text),
    ] {
        let Some(statement) = statement else {
            continue;
        };
        assert_eq!(
            statement.output,
            Output::Rows {
                columns: counted(mark).into(),
                raw: false
            },
            "{what}"
        );
    }
    if let Some(lock) = &s.lock_row_by_id {
        assert_eq!(&lock.args[..2], &[Arg::Id, Arg::Attempt], "{what}");
    }
    for st in [&s.lock_row, &s.lock_row_by_id, &s.take, &s.read_row]
        .into_iter()
        .flatten()
    {
        assert_eq!(
            st.output,
            Output::Rows {
                columns: row_columns.clone().into(),
                raw: true
            },
            "{what}, {:?}",
            st.kind
        );
    }
    // A lease claim reads the expiry it gave each row, by the database's clock, last.
    let claimed: Vec<OutColumn> = row_columns
        .iter()
        .copied()
        .chain([OutColumn::new(UNTIL, ColumnType::Int)])
        .collect();
    for st in [&s.claim_lease, &s.select_lease].into_iter().flatten() {
        assert_eq!(
            st.output,
            Output::Rows {
                columns: claimed.clone().into(),
                raw: true
            },
            "{what}, {:?}",
            st.kind
        );
    }
}

#[test]
fn mark_lease_for_each_batch_size_on_mysql_and_mariadb_only() {
    for workers in 1..=6 {
        for dialect in DIALECTS {
            for desc in [LEASE.desc(), LEASE_PLAIN.desc(), QUOTED.desc()] {
                let s = Flat::of(Statements::render(dialect, desc, workers));
                if !dialect_is_mysql(dialect) {
                    assert!(s.mark_lease.is_empty(), "{dialect:?}");
                    assert!(s.mark_lease(1).is_none());
                    continue;
                }
                assert_eq!(s.mark_lease.len(), workers, "{dialect:?}");
                assert!(s.mark_lease(0).is_none());
                assert!(s.mark_lease(workers + 1).is_none());
                for n in 1..=workers {
                    let st = s.mark_lease(n).expect("a statement for every batch size");
                    assert_eq!(st.kind, StatementKind::MarkLease(n));
                    assert_eq!(st.output, Output::Affected);
                    let mut args = vec![Arg::Fence];
                    args.extend((0..n).map(Arg::IdAt));
                    assert_eq!(&*st.args, &args[..], "{}", st.sql);
                    let list = vec!["?"; n].join(", ");
                    assert!(
                        st.sql.ends_with(&format!(" IN ({list})")),
                        "{n} ids: {}",
                        st.sql
                    );
                    assert!(s.all().contains(&st), "listed in all()");
                }
            }
        }
    }
    // A batch of zero workers still renders the one-row statement.
    let s = Flat::of(Statements::render(Dialect::MySql, LEASE.desc(), 0));
    assert_eq!(s.mark_lease.len(), 1);
}

#[test]
fn render_is_deterministic() {
    for (name, desc) in descs() {
        for dialect in DIALECTS {
            let a = Statements::render(dialect, &desc, 4);
            let b = Statements::render(dialect, &desc, 4);
            assert_eq!(a, b, "{name}, {dialect:?}");
            let text = |s: &Statements| {
                s.all()
                    .iter()
                    .map(|st| format!("{:?} {} {:?}", st.kind, st.sql, st.args))
                    .collect::<Vec<_>>()
            };
            assert_eq!(text(&a), text(&b), "{name}, {dialect:?}");
            assert!(
                !Arc::ptr_eq(&a.publish.sql, &b.publish.sql),
                "two renders are two allocations; the broker keeps one"
            );
        }
    }
}

//! The broker renders a subscription's statements once and hands out that text.

use super::*;

/// Answers a command as a table with every described column and no claimable row would.
fn answer(desc: &TableDesc, action: &Action) -> Reply<()> {
    match action {
        Action::Execute { statement, .. } => match statement.kind {
            StatementKind::ListColumns => Reply::Rows(
                desc.columns()
                    .into_iter()
                    .map(|c| Row::values(vec![Value::Text(c.to_owned())]))
                    .collect(),
            ),
            StatementKind::CurrentDatabase => {
                Reply::Rows(vec![Row::values(vec![Value::Text("test".into())])])
            }
            StatementKind::Isolation => Reply::Rows(vec![Row::values(vec![Value::Text(
                "read committed".into(),
            )])]),
            _ => match statement.output {
                Output::Nothing => Reply::Done,
                Output::Affected => Reply::Affected(1),
                Output::Rows { .. } => Reply::Rows(Vec::new()),
            },
        },
        Action::Lock { .. } | Action::Unlock { .. } => Reply::Bool(true),
        Action::Acquire | Action::Release | Action::Close => Reply::Done,
    }
}

#[test]
fn broker_renders_statements_once_per_subscription() {
    let cases = [
        ("row lock", *ROW_LOCK.desc()),
        ("lease", *LEASE.desc()),
        ("advisory", *ADVISORY.desc()),
        ("custom lock", *CUSTOM.desc()),
    ];
    for (name, desc) in cases {
        for dialect in DIALECTS {
            if desc.form() == Form::RowLock && dialect == Dialect::Sqlite {
                continue;
            }
            let mut broker: Broker<()> = Broker::new(dialect);
            let options = SubscribeOptions {
                workers: 2,
                poll_interval: Duration::from_secs(1),
                ..SubscribeOptions::default()
            };
            let sub = broker
                .subscribe(desc, options, Time(1_000_000))
                .expect("the description is valid");
            let publisher = broker.publisher(desc).expect("a publisher");
            let mut seen: BTreeMap<String, Vec<Arc<str>>> = BTreeMap::new();
            let mut now = Time(1_000_000);
            for round in 0..4 {
                while let Some(command) = broker.poll_command() {
                    if let Action::Execute { statement, binds } = &command.action {
                        assert_eq!(binds.len(), statement.args.len(), "{}", statement.sql);
                        seen.entry(format!("{:?}", statement.kind))
                            .or_default()
                            .push(statement.sql.clone());
                    }
                    let reply = answer(&desc, &command.action);
                    broker.handle_reply(command.id, reply, now);
                }
                while let Some(event) = broker.poll_event() {
                    if let Event::CheckFailed { error, .. } = event {
                        panic!("{name}, {dialect:?}: the check failed: {error}");
                    }
                }
                if round < 2 {
                    let row = Publish {
                        payload: b"x".to_vec(),
                        columns: desc
                            .key_columns()
                            .into_iter()
                            .map(|c| (c, Value::Int(7)))
                            .collect(),
                        ..Publish::default()
                    };
                    broker.publish(publisher, row, now).expect("a publish");
                }
                now = now.plus(Duration::from_secs(1));
                broker.handle_timeout(now);
            }
            let statements = Flat::of(
                broker
                    .statements(sub)
                    .expect("the subscription's statements")
                    .clone(),
            );
            claims_and_statements_rendered_once(&statements, &seen, &desc, dialect, name);
            assert!(!broker.is_closed());
        }
    }
}

/// The claim ran, a publisher's insert was rendered once, and every other statement run is
/// the text the subscription rendered (the session check's ping rendered once of its own).
fn claims_and_statements_rendered_once(
    statements: &Flat,
    seen: &BTreeMap<String, Vec<Arc<str>>>,
    desc: &TableDesc,
    dialect: Dialect,
    name: &str,
) {
    let claim = match (desc.form(), dialect) {
        // With an attempt column the row lock claim counts the attempt first.
        (Form::RowLock, _) => statements
            .count_row
            .clone()
            .or_else(|| statements.select_row_id.clone())
            .or_else(|| statements.lock_row.clone()),
        (Form::Lease, Dialect::MySql | Dialect::MariaDb) => statements.select_lease.clone(),
        (Form::Lease, _) => statements.claim_lease.clone(),
        (Form::Advisory, _) => statements.candidates.clone(),
    }
    .expect("a claim statement");
    let claims = seen
        .get(&format!("{:?}", claim.kind))
        .unwrap_or_else(|| panic!("{name}, {dialect:?}: {:?} never ran", claim.kind));
    assert!(
        claims.len() >= 2,
        "{name}, {dialect:?}: the claim ran {} times",
        claims.len()
    );
    let publishes = &seen["Publish"];
    assert_eq!(publishes.len(), 2, "{name}, {dialect:?}");
    assert!(
        Arc::ptr_eq(&publishes[0], &publishes[1]),
        "{name}, {dialect:?}: a publisher renders its statement once"
    );
    for (kind, texts) in seen {
        if kind == "Publish" {
            continue;
        }
        // The start's session check (PostgreSQL) pings its second connection with a
        // statement of its own, rendered once for the process.
        let (session, texts): (Vec<&Arc<str>>, Vec<&Arc<str>>) = texts
            .iter()
            .partition(|t| t.starts_with("SELECT pg_backend_pid()"));
        assert!(
            session.windows(2).all(|w| Arc::ptr_eq(w[0], w[1])),
            "{name}, {dialect:?}: the session check's ping was rendered again"
        );
        if texts.is_empty() {
            continue;
        }
        let rendered = statements
            .all()
            .into_iter()
            .find(|st| format!("{:?}", st.kind) == *kind)
            .unwrap_or_else(|| panic!("{kind} is among the subscription's statements"));
        for text in texts {
            assert!(
                Arc::ptr_eq(text, &rendered.sql),
                "{name}, {dialect:?}: {kind} was rendered again"
            );
        }
    }
}

/// What each statement leaves of the session's transaction, as the adapters track it to roll
/// back a connection given back with a transaction open.
#[test]
fn transaction_after_each_kind_of_statement() {
    use ruststream_core::StatementKind as K;
    assert_eq!(K::Begin.transaction_after(true), Some(true));
    assert_eq!(K::Begin.transaction_after(false), None);
    assert_eq!(K::Commit.transaction_after(true), Some(false));
    assert_eq!(K::Commit.transaction_after(false), None, "in doubt");
    assert_eq!(K::Rollback.transaction_after(true), Some(false));
    assert_eq!(K::Rollback.transaction_after(false), Some(false));
    for kind in [
        K::CountRow,
        K::LockRowById,
        K::ClaimLease,
        K::TryLock,
        K::Candidates,
    ] {
        assert_eq!(kind.transaction_after(true), None, "{kind:?}");
        assert_eq!(kind.transaction_after(false), None, "{kind:?}");
    }
}

/// A batch insert binds every row's values to placeholders of their own, in row order.
#[test]
fn publish_rows_binds_each_row_on_its_own_placeholders() {
    use ruststream_core::{Column, InboxSpec, KeyPart};
    const KEY: &[KeyPart] = &[KeyPart::Literal("jobs-"), KeyPart::Column("channel")];
    let desc = *InboxSpec::new("jobs", Column::new("id").generated())
        .payload(Column::new("payload"))
        .due(Column::new("due_at"))
        .advisory(KEY)
        .desc();
    for dialect in [
        Dialect::Postgres,
        Dialect::MySql,
        Dialect::MariaDb,
        Dialect::Sqlite,
    ] {
        let one = Statements::render(dialect, &desc, 1).publish;
        let three = Statements::publish_rows(dialect, &desc, 3).expect("columns to write");
        assert_eq!(three.kind, StatementKind::Publish);
        assert_eq!(three.args.len(), 3 * one.args.len(), "{dialect:?}");
        assert_eq!(&three.args[..one.args.len()], &one.args[..], "{dialect:?}");
        assert_eq!(
            three.sql.matches("), (").count(),
            2,
            "{dialect:?}: {}",
            three.sql
        );
        match dialect {
            Dialect::Postgres => {
                let last = format!("${}", three.args.len());
                assert!(three.sql.contains(&last), "{}", three.sql);
                assert!(three.sql.starts_with("WITH rs_published AS (INSERT INTO "));
            }
            Dialect::Sqlite => {
                let last = format!("?{}", three.args.len());
                assert!(three.sql.contains(&last), "{}", three.sql);
            }
            _ => assert_eq!(three.sql.matches('?').count(), three.args.len()),
        }
    }
    let empty = *InboxSpec::new("signals", Column::new("id").generated()).desc();
    assert!(
        Statements::publish_rows(Dialect::Postgres, &empty, 3).is_none(),
        "DEFAULT VALUES writes one row"
    );
}

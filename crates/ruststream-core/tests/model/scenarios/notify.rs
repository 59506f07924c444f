//! PostgreSQL notifies subscribers at most every `NOTIFY_EVERY`; other databases never notify.

use super::*;

fn notifies(run: &Ran) -> bool {
    run.statement
        .as_ref()
        .is_some_and(|s| s.sql.contains("pg_notify"))
}

/// A publish within `NOTIFY_EVERY` of the publisher's last notification inserts without
/// notifying; one notification follows once that time has passed, after the insert took
/// effect.
#[test]
fn publishes_close_together_notify_once_then_once_more_after_notify_every() {
    let mut sim = Sim::start(Dialect::Postgres, advisory(), 1, &[]);
    let mark = sim.mark();
    sim.publish(0, 1).expect("publishes");
    sim.run();
    let first = only(sim.runs_of(0, mark, StatementKind::Publish));
    assert!(notifies(first), "the first publish notifies");
    let first_at = first.at;
    let mark = sim.mark();
    sim.publish(0, 2).expect("publishes");
    sim.publish(0, 3).expect("publishes");
    sim.run();
    let quiet = sim.runs_of(0, mark, StatementKind::Publish);
    assert_eq!(quiet.len(), 2);
    assert!(
        quiet.iter().all(|r| !notifies(r)),
        "within NOTIFY_EVERY, no notification"
    );
    assert!(sim.runs_of(0, mark, StatementKind::Notify).is_empty());
    assert_eq!(sim.timeout(0), Some(first_at.plus(NOTIFY_EVERY)));
    sim.advance_to(just_before(first_at.plus(NOTIFY_EVERY)));
    assert!(sim.runs_of(0, mark, StatementKind::Notify).is_empty());
    sim.advance_to(first_at.plus(NOTIFY_EVERY));
    let notify = only(sim.runs_of(0, mark, StatementKind::Notify));
    assert_eq!(
        notify.statement.as_ref().expect("a statement").sql.as_ref(),
        "SELECT pg_notify('ruststream', 'jobs')"
    );
    assert_eq!(notify.at, first_at.plus(NOTIFY_EVERY));
    assert_eq!(sim.db.rows.len(), 3);
    // Nothing more is owed; a publish after NOTIFY_EVERY notifies again.
    sim.advance(NOTIFY_EVERY * 10);
    assert_eq!(sim.runs_of(0, mark, StatementKind::Notify).len(), 1);
    let mark = sim.mark();
    sim.publish(0, 4).expect("publishes");
    sim.run();
    assert!(notifies(only(sim.runs_of(0, mark, StatementKind::Publish))));
}

/// A batch publish within `NOTIFY_EVERY` inserts quietly too, and a failed quiet publish owes
/// no notification.
#[test]
fn a_quiet_publish_that_failed_owes_no_notification() {
    let mut sim = Sim::start(Dialect::Postgres, advisory(), 1, &[]);
    sim.publish(0, 1).expect("publishes");
    sim.run();
    sim.hook(|_, command| match &command.action {
        Action::Execute { statement, .. } if statement.kind == StatementKind::Publish => {
            Intercept::Answer(Reply::Failed(DbError::new(
                ErrorKind::Other,
                "the disk is full",
            )))
        }
        _ => Intercept::Run,
    });
    let mark = sim.mark();
    sim.publish_all(0, 2, 3).expect("publishes");
    sim.run();
    assert!(sim.published(0, mark)[0].1.is_err());
    sim.advance(NOTIFY_EVERY * 10);
    assert!(sim.runs_of(0, mark, StatementKind::Notify).is_empty());
}

/// The shutdown sends the notification still owed before the broker closes.
#[test]
fn the_shutdown_sends_the_notification_owed() {
    let mut sim = Sim::start(Dialect::Postgres, advisory(), 1, &[]);
    sim.publish(0, 1).expect("publishes");
    sim.run();
    sim.publish(0, 2).expect("publishes");
    sim.run();
    let mark = sim.mark();
    sim.shutdown(0);
    sim.run();
    assert_eq!(sim.runs_of(0, mark, StatementKind::Notify).len(), 1);
    assert_eq!(sim.closed(0).len(), 1);
}

/// Only PostgreSQL notifies: elsewhere every publish is the same insert and nothing follows.
#[test]
fn other_databases_never_notify() {
    for dialect in [Dialect::MySql, Dialect::MariaDb, Dialect::Sqlite] {
        let mut sim = Sim::start(dialect, advisory(), 1, &[]);
        let mark = sim.mark();
        for channel in 0..3 {
            sim.publish(0, channel).expect("publishes");
        }
        sim.run();
        sim.advance(NOTIFY_EVERY * 10);
        assert_eq!(sim.runs_of(0, mark, StatementKind::Publish).len(), 3);
        assert!(sim.runs_of(0, mark, StatementKind::Notify).is_empty());
    }
}

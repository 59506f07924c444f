use std::sync::atomic::AtomicU32;

use futures::executor::block_on;

use ruststream_core::{Output, StatementKind};

use super::*;

/// A pool of pretend connections that records what runs on them.
#[derive(Clone, Default)]
struct Pretend {
    log: Arc<Mutex<Vec<String>>>,
    next: Arc<AtomicU32>,
}

impl Pretend {
    fn log(&self) -> Vec<String> {
        lock(&self.log).clone()
    }

    fn note(&self, line: String) {
        lock(&self.log).push(line);
    }
}

impl ConnectionPool for Pretend {
    type Connection = u32;
    type Row = ();
    type Lock = bool;

    fn acquire(&self) -> BoxFuture<Result<u32, DbError>> {
        let conn = self.next.fetch_add(1, Ordering::SeqCst);
        Box::pin(future::ready(Ok(conn)))
    }

    fn execute<'c>(
        &'c self,
        conn: &'c mut u32,
        statement: Statement,
        _binds: Vec<Value>,
        _in_transaction: bool,
    ) -> ConnFuture<'c, Reply<()>> {
        let sql = statement.sql.to_string();
        self.note(format!("{conn}: {sql}"));
        Box::pin(async move {
            match sql.as_str() {
                "HANG" => future::pending().await,
                "PANIC" => panic!("a statement that panics"),
                "LOST" => Reply::Failed(DbError::new(ErrorKind::ConnectionLost, "gone")),
                _ => Reply::Done,
            }
        })
    }

    fn lock<'c>(
        &'c self,
        _conn: &'c mut u32,
        answer: &'c bool,
        _key: &'c str,
        _take: bool,
    ) -> ConnFuture<'c, Result<bool, DbError>> {
        let answer = *answer;
        Box::pin(async move { Ok(answer) })
    }

    fn release(&self, conn: u32) -> BoxFuture<()> {
        self.note(format!("{conn}: released"));
        Box::pin(future::ready(()))
    }

    fn close(&self, conn: u32, ending: Ending) -> BoxFuture<()> {
        self.note(format!("{conn}: closed {ending:?}"));
        Box::pin(future::ready(()))
    }

    fn discard(&self, conn: u32, ending: Ending) {
        self.note(format!("{conn}: discarded {ending:?}"));
    }
}

fn command(conn: u64, action: Action) -> Command {
    Command {
        id: ruststream_core::CommandId(0),
        conn: ConnId(conn),
        action,
    }
}

fn sql(kind: StatementKind, text: &str) -> Action {
    Action::Execute {
        statement: Statement {
            kind,
            sql: text.into(),
            args: Vec::new().into(),
            output: Output::Nothing,
        },
        binds: Vec::new(),
    }
}

fn failed(reply: Reply<()>) -> DbError {
    match reply {
        Reply::Failed(error) => error,
        other => panic!("expected a failure, got {other:?}"),
    }
}

struct Fixture {
    pool: Pretend,
    conns: Arc<Connections<Pretend>>,
}

impl Fixture {
    fn new() -> Self {
        Self {
            pool: Pretend::default(),
            conns: Arc::new(Connections::new()),
        }
    }

    fn issue(&self, conn: u64, action: Action) -> BoxFuture<Reply<()>> {
        self.conns
            .execute(Some(self.pool.clone()), command(conn, action), Some(true))
    }

    fn run(&self, conn: u64, action: Action) -> Reply<()> {
        block_on(self.issue(conn, action))
    }
}

#[test]
fn a_release_gives_back_a_clean_connection_and_closes_one_in_a_transaction() {
    let f = Fixture::new();
    assert_eq!(f.run(1, Action::Acquire), Reply::Done);
    assert_eq!(f.run(1, sql(StatementKind::Begin, "BEGIN")), Reply::Done);
    assert_eq!(f.run(1, sql(StatementKind::Commit, "COMMIT")), Reply::Done);
    assert_eq!(f.run(1, Action::Release), Reply::Done);
    assert_eq!(f.pool.log(), ["0: BEGIN", "0: COMMIT", "0: released"]);
    // The core rolls back before it releases: a connection released inside a transaction
    // never goes back to the pool, and no SQL of the runtime's own runs.
    assert_eq!(f.run(2, Action::Acquire), Reply::Done);
    assert_eq!(f.run(2, sql(StatementKind::Begin, "BEGIN")), Reply::Done);
    assert_eq!(f.run(2, Action::Release), Reply::Done);
    assert_eq!(
        f.pool.log()[3..],
        ["1: BEGIN", "1: closed Clean { in_transaction: true }"]
    );
    assert_eq!(f.conns.held(), 0);
}

#[test]
fn commands_run_in_the_order_they_were_issued() {
    let f = Fixture::new();
    let acquire = f.issue(1, Action::Acquire);
    let first = f.issue(1, sql(StatementKind::ReadRow, "FIRST"));
    let second = f.issue(1, sql(StatementKind::ReadRow, "SECOND"));
    let release = f.issue(1, Action::Release);
    // Polled in the reverse order, run in the order issued.
    let (release, second, first, acquire) =
        block_on(futures::future::join4(release, second, first, acquire));
    assert_eq!(
        [acquire, first, second, release],
        [Reply::Done, Reply::Done, Reply::Done, Reply::Done]
    );
    assert_eq!(f.pool.log(), ["0: FIRST", "0: SECOND", "0: released"]);
}

#[test]
fn a_close_cuts_the_command_in_flight_short_and_fails_the_ones_queued() {
    let f = Fixture::new();
    assert_eq!(f.run(1, Action::Acquire), Reply::Done);
    let mut hang = f.issue(1, sql(StatementKind::ReadRow, "HANG"));
    let queued = f.issue(1, sql(StatementKind::ReadRow, "QUEUED"));
    assert!((&mut hang).now_or_never().is_none(), "the statement runs");
    let close = f.issue(1, Action::Close);
    let (hang, queued, close) = block_on(futures::future::join3(hang, queued, close));
    assert_eq!(close, Reply::Done);
    let hang = failed(hang);
    assert_eq!(hang.kind, ErrorKind::ConnectionLost);
    assert!(hang.message.contains("cut short"), "{hang}");
    assert_eq!(failed(queued).kind, ErrorKind::ConnectionLost);
    assert_eq!(f.pool.log(), ["0: HANG", "0: closed CutShort"]);
    let after = failed(f.run(1, sql(StatementKind::ReadRow, "AFTER")));
    assert_eq!(after.kind, ErrorKind::ConnectionLost, "{after}");
}

#[test]
fn a_connection_lost_closes_instead_of_going_back() {
    let f = Fixture::new();
    assert_eq!(f.run(1, Action::Acquire), Reply::Done);
    assert_eq!(
        failed(f.run(1, sql(StatementKind::ReadRow, "LOST"))).kind,
        ErrorKind::ConnectionLost
    );
    assert_eq!(f.run(1, Action::Release), Reply::Done);
    assert_eq!(f.pool.log(), ["0: LOST", "0: closed Lost"]);
}

#[test]
fn a_panic_discards_the_connection() {
    let f = Fixture::new();
    assert_eq!(f.run(1, Action::Acquire), Reply::Done);
    let panicked = failed(f.run(1, sql(StatementKind::ReadRow, "PANIC")));
    assert!(panicked.message.contains("panicked"), "{panicked}");
    assert_eq!(panicked.kind, ErrorKind::ConnectionLost);
    assert_eq!(
        failed(f.run(1, sql(StatementKind::ReadRow, "AFTER"))).kind,
        ErrorKind::ConnectionLost
    );
    assert_eq!(f.run(1, Action::Release), Reply::Done);
    assert_eq!(f.pool.log(), ["0: PANIC", "0: discarded CutShort"]);
}

#[test]
fn a_command_dropped_midway_discards_its_connection() {
    let f = Fixture::new();
    assert_eq!(f.run(1, Action::Acquire), Reply::Done);
    let mut hang = f.issue(1, sql(StatementKind::ReadRow, "HANG"));
    assert!((&mut hang).now_or_never().is_none());
    drop(hang);
    assert_eq!(f.pool.log(), ["0: HANG", "0: discarded CutShort"]);
    assert_eq!(f.run(1, Action::Release), Reply::Done);
    assert_eq!(f.pool.log().len(), 2, "nothing goes back to the pool");
}

#[test]
fn connections_held_when_the_map_goes_are_discarded() {
    let f = Fixture::new();
    assert_eq!(f.run(1, Action::Acquire), Reply::Done);
    assert_eq!(f.run(1, sql(StatementKind::Begin, "BEGIN")), Reply::Done);
    assert_eq!(f.conns.held(), 1);
    let Fixture { pool, conns } = f;
    drop(conns);
    assert_eq!(
        pool.log(),
        ["0: BEGIN", "0: discarded Clean { in_transaction: true }"]
    );
}

#[test]
fn locks_answer_and_a_closed_broker_lends_nothing() {
    let f = Fixture::new();
    assert_eq!(f.run(1, Action::Acquire), Reply::Done);
    let take = Action::Lock {
        sub: ruststream_core::SubId(0),
        key: "k".into(),
    };
    assert_eq!(f.run(1, take.clone()), Reply::Bool(true));
    let none = failed(block_on(f.conns.execute(None, command(1, take), None)));
    assert!(none.message.contains("no custom lock"), "{none}");
    let closed = failed(block_on(f.conns.execute(
        None,
        command(2, Action::Acquire),
        None,
    )));
    assert_eq!(closed.kind, ErrorKind::PoolClosed);
    assert_eq!(f.run(1, Action::Acquire), {
        Reply::Failed(DbError::new(
            ErrorKind::Other,
            "ConnId#1 holds a connection already",
        ))
    });
    assert_eq!(f.run(1, Action::Close), Reply::Done);
    assert_eq!(f.pool.log(), ["0: closed Clean { in_transaction: false }"]);
}

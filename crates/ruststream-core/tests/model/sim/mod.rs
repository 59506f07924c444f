//! The simulation the scenarios and the property tests share: brokers (processes) whose
//! commands an [`Adapter`] runs on the in-memory [`Db`] as a real adapter would. [`Sim`]
//! drives them in the scenarios; the property tests drive them under random schedules.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ruststream_core::{
    Action, Broker, Command, ConnId, DbError, Dialect, ErrorKind, Publish, PublisherId, Reply,
    SubId, SubscribeOptions, TableDesc, Time, Value,
};

use crate::db::{Db, SessId};

mod driver;
mod journal;

pub(crate) use driver::*;

/// The time every simulation starts at.
pub(crate) const T0: Time = Time(1_700_000_000_000_000);
pub(crate) const POLL: Duration = Duration::from_secs(1);
pub(crate) const LEASE_TIME: Duration = Duration::from_secs(30);
pub(crate) const EXTEND: Duration = Duration::from_secs(10);

/// A process of another system, which holds locks the broker must pass over.
pub(crate) const OTHER_SYSTEM: usize = 99;

/// A process's connections, as its adapter holds them: the session behind each, and those
/// it closed.
#[derive(Debug, Default)]
pub(crate) struct Adapter {
    pub(crate) conns: BTreeMap<ConnId, SessId>,
    pub(crate) closed: BTreeSet<ConnId>,
}

impl Adapter {
    /// Runs a command of `process` on the database at `now`, as an adapter would; with `fail`
    /// it fails instead (`Some(true)`: the connection is lost too).
    pub(crate) fn run(
        &mut self,
        db: &mut Db,
        process: usize,
        table: (Dialect, &TableDesc),
        now: Time,
        command: &Command,
        fail: Option<bool>,
    ) -> Reply<i64> {
        if self.closed.contains(&command.conn) {
            // Closed while this command waited: the adapter cuts it short.
            assert!(
                !matches!(
                    command.action,
                    Action::Acquire | Action::Release | Action::Close
                ),
                "{:?} on {} after it was closed",
                command.action,
                command.conn
            );
            return Reply::Failed(DbError::new(
                ErrorKind::ConnectionLost,
                "the connection was closed",
            ));
        }
        let reply = match (&command.action, fail) {
            (Action::Acquire, Some(_)) => {
                Reply::Failed(DbError::new(ErrorKind::PoolClosed, "no connection"))
            }
            (Action::Acquire, None) => {
                let sess = db.acquire(process);
                self.conns.insert(command.conn, sess);
                Reply::Done
            }
            (Action::Release, _) => {
                let sess = self.conns.remove(&command.conn).expect("a held connection");
                if db.sessions[&sess].alive {
                    db.release(sess);
                }
                Reply::Done
            }
            (Action::Close, _) => {
                self.closed.insert(command.conn);
                let sess = self.conns.remove(&command.conn).expect("a held connection");
                db.kill(sess);
                Reply::Done
            }
            (_, Some(lost)) => self.fail(db, command, lost),
            (_, None) => self.execute(db, table, now, command),
        };
        assert!(db.violations.is_empty(), "{:?}", db.violations);
        reply
    }

    /// A statement that fails: the connection lost, a deadlock (which may run again), or
    /// another error.
    fn fail(&self, db: &mut Db, command: &Command, lost: bool) -> Reply<i64> {
        let sess = self.conns[&command.conn];
        if lost {
            db.kill(sess);
            Reply::Failed(DbError::new(ErrorKind::ConnectionLost, "connection lost"))
        } else if command.id.0.is_multiple_of(2) {
            // A deadlock or serialization failure: the statement rolled back, and it
            // may run again.
            Reply::Failed(DbError::new(ErrorKind::Serialization, "deadlock detected"))
        } else {
            Reply::Failed(DbError::new(ErrorKind::Other, "statement failed"))
        }
    }

    /// A statement, or the service's own lock or unlock, on the connection's session.
    fn execute(
        &self,
        db: &mut Db,
        (dialect, desc): (Dialect, &TableDesc),
        now: Time,
        command: &Command,
    ) -> Reply<i64> {
        match &command.action {
            Action::Execute { statement, binds } => {
                let sess = *self
                    .conns
                    .get(&command.conn)
                    .unwrap_or_else(|| panic!("{} was never acquired", command.conn));
                db.clock = now.micros();
                db.execute(dialect, desc, sess, statement, binds)
            }
            Action::Lock { key, .. } => db.custom_lock(self.conns[&command.conn], key),
            Action::Unlock { key, .. } => db.custom_unlock(self.conns[&command.conn], key),
            Action::Acquire | Action::Release | Action::Close => unreachable!("run answers these"),
        }
    }
}

/// The subscription options of the simulations: a 1 s poll, a 30 s lease extended every
/// 10 s.
pub(crate) fn options(
    workers: usize,
    prefetch: usize,
    max_attempts: Option<u32>,
) -> SubscribeOptions {
    SubscribeOptions {
        workers,
        poll_interval: POLL,
        lease: LEASE_TIME,
        extend_every: EXTEND,
        prefetch,
        max_attempts,
        row_fields: &[],
        ..SubscribeOptions::default()
    }
}

/// A broker of `dialect` with a subscription of `desc` and a publisher, started at `now`.
/// `linger` and `prepared` are its connection linger and whether its adapter's prepared
/// statements live in the server session.
pub(crate) fn start_broker(
    (dialect, desc): (Dialect, TableDesc),
    options: SubscribeOptions,
    (linger, prepared): (Duration, bool),
    now: Time,
) -> (Broker<i64>, SubId, PublisherId) {
    let mut broker = Broker::new(dialect);
    broker.set_connection_linger(linger);
    broker.set_prepared_statements(prepared);
    let sub = broker.subscribe(desc, options, now).expect("subscribes");
    let publisher = broker.publisher(desc).expect("a publisher");
    (broker, sub, publisher)
}

/// A row to publish of `channel`: the key's column where the description's key reads it.
pub(crate) fn message(desc: &TableDesc, channel: i64) -> Publish {
    let columns = if desc.key_columns().contains(&"channel") {
        vec![("channel", Value::Int(channel))]
    } else {
        Vec::new()
    };
    Publish {
        payload: b"{}".to_vec(),
        columns,
        ..Publish::default()
    }
}

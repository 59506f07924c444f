//! The ruststream side of a run: the three row types, a handler that records latencies, and
//! an adapter wrapper that counts statements, connections and settlements.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream::adapter::{Adapter, AdapterError, TakesRows};
use ruststream::core::spec::Described;
use ruststream::core::{Action, Arg, Command, Dialect, Form, Reply, StatementKind, Value};
use ruststream::exec::BoxFuture;
use ruststream::{
    Advisory, Attempt, BrokerHandle, Column, Context, Handle, HandlerOutcome, InboxContext,
    InboxQueue, InboxSpec, InboxTable, IntoSubscription, KeyPart, Lease, Payload, PayloadRow,
    subscriber,
};
use serde::Deserialize;

use crate::stats::{Job, Stats};
use crate::{BoxError, Config, Work};

macro_rules! row_type {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $spec:expr) => {
        $(#[$doc])*
        #[derive(Debug, Deserialize, sqlx::FromRow)]
        pub struct $name {
            id: i64,
            attempt: i64,
            payload: Vec<u8>,
        }

        impl InboxTable for $name {
            type Id = i64;
            type Table = $ty;
            const TABLE: $ty = $spec;

            fn id(&self) -> &i64 {
                &self.id
            }
        }

        impl PayloadRow for $name {
            type Column = Vec<u8>;

            fn payload(&self) -> &[u8] {
                &self.payload
            }
        }

        impl mysql_async::prelude::FromRow for $name {
            fn from_row_opt(
                row: mysql_async::Row,
            ) -> Result<Self, mysql_async::FromRowError> {
                let id = row.get_opt::<i64, _>("id").and_then(Result::ok);
                let attempt = row.get_opt::<i64, _>("attempt").and_then(Result::ok);
                let payload = row.get_opt::<Vec<u8>, _>("payload").and_then(Result::ok);
                match (id, attempt, payload) {
                    (Some(id), Some(attempt), Some(payload)) => Ok(Self {
                        id,
                        attempt,
                        payload,
                    }),
                    _ => Err(mysql_async::FromRowError(row)),
                }
            }
        }

        impl $name {
            /// The attempt the take counted.
            pub fn attempt(&self) -> i64 {
                self.attempt
            }
        }
    };
}

row_type!(
    /// A row of `bench_jobs_row_lock`: the row lock form, with an attempt column.
    RowLockJob,
    InboxSpec<(Attempt, Payload)>,
    InboxSpec::new("bench_jobs_row_lock", Column::new("id").generated())
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
);

row_type!(
    /// A row of `bench_jobs_lease`: the lease form, with an attempt column.
    LeaseJob,
    InboxSpec<(Lease, Attempt, Payload)>,
    InboxSpec::new("bench_jobs_lease", Column::new("id").generated())
        .lease(Column::new("locked_until"))
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
);

/// The advisory key: `bench-{k}`.
pub const KEY: &[KeyPart] = &[KeyPart::Literal("bench-"), KeyPart::Column("k")];

row_type!(
    /// A row of `bench_jobs_advisory`: the advisory lock form on `bench-{k}`, with an attempt
    /// column.
    AdvisoryJob,
    InboxSpec<(Advisory, Attempt, Payload)>,
    InboxSpec::new("bench_jobs_advisory", Column::new("id").generated())
        .advisory(KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
);

/// The handler: records the pickup latency, works `--handler-ms` (`--hot-ms` on a hot key's
/// row), records its end; in the advisory form its start and end go into the order log.
struct Worker {
    stats: Arc<Stats>,
    work: Work,
}

impl Handle<Job, (), (), InboxContext> for Worker {
    async fn handle(
        &self,
        job: &Job,
        _outs: &(),
        ctx: &mut Context<'_, InboxContext>,
    ) -> Result<(), HandlerOutcome> {
        self.stats.pickup(job.t);
        let info = ctx.kind().info();
        let id = info.id.as_int();
        let key = info.key.clone();
        if let (Some(key), Some(id)) = (&key, id) {
            self.stats.order.start(key, id);
        }
        crate::work(self.work.ms(key.as_deref())).await;
        if let (Some(key), Some(id)) = (&key, id) {
            self.stats.order.end(key, id);
        }
        if let Some(id) = id {
            self.stats.handler_end(id);
        }
        Ok(())
    }
}

/// An adapter that counts what the core runs through the adapter it wraps: statements by
/// kind, connections held, and the settlements (the settle statement's reply; in the row lock
/// form, the commit that follows it on the same connection).
pub(crate) struct Counted<A> {
    inner: A,
    stats: Arc<Stats>,
    /// Row lock form: the row whose settle statement ran on a connection, until its commit.
    settling: Arc<Mutex<HashMap<u64, i64>>>,
    /// Whether a commit follows the settle statement (the row lock form).
    commit_settles: bool,
}

impl<A> Counted<A> {
    pub(crate) fn new(inner: A, stats: Arc<Stats>, form: Form) -> Self {
        Self {
            inner,
            stats,
            settling: Arc::new(Mutex::new(HashMap::new())),
            commit_settles: form == Form::RowLock,
        }
    }
}

enum Track {
    Acquire,
    Release,
    Settle(i64),
    /// Several lease settlements in one statement: the ids it settles.
    SettleMany(Vec<i64>),
    Commit,
    Other,
}

impl<A: Adapter> Adapter for Counted<A> {
    type Row = A::Row;
    type Lock = A::Lock;

    fn start(&self) -> BoxFuture<Result<Dialect, AdapterError>> {
        self.inner.start()
    }

    fn prepares_statements(&self) -> bool {
        self.inner.prepares_statements()
    }

    fn execute(&self, command: Command, lock: Option<A::Lock>) -> BoxFuture<Reply<A::Row>> {
        let conn = command.conn.0;
        let kind = match &command.action {
            Action::Acquire => "acquire".to_owned(),
            Action::Release => "release".to_owned(),
            Action::Close => "close".to_owned(),
            Action::Lock { .. } | Action::Unlock { .. } => "custom lock".to_owned(),
            Action::Execute { statement, .. } => format!("{:?}", statement.kind),
        };
        let issued = Instant::now();
        let track = match &command.action {
            Action::Acquire => {
                self.stats.count("acquire");
                Track::Acquire
            }
            Action::Release | Action::Close => {
                self.stats
                    .count(if matches!(command.action, Action::Release) {
                        "release"
                    } else {
                        "close"
                    });
                Track::Release
            }
            Action::Lock { .. } | Action::Unlock { .. } => {
                self.stats.count("custom lock");
                Track::Other
            }
            Action::Execute { statement, binds } => {
                self.stats.count(&format!("{:?}", statement.kind));
                if statement.kind == StatementKind::Candidates {
                    // Whether the look starts past the rows taken before it, or at the start.
                    self.stats.count(if statement.args.contains(&Arg::Floor) {
                        "candidates from the floor"
                    } else {
                        "candidates from the start"
                    });
                }
                match statement.kind {
                    StatementKind::Delete { .. } | StatementKind::MarkProcessed { .. } => {
                        let id = statement
                            .args
                            .iter()
                            .position(|a| *a == Arg::Id)
                            .and_then(|i| binds.get(i))
                            .and_then(Value::as_int)
                            .unwrap_or(-1);
                        Track::Settle(id)
                    }
                    StatementKind::SettleLeases(_) => Track::SettleMany(
                        statement
                            .args
                            .iter()
                            .zip(binds)
                            .filter(|(a, _)| matches!(a, Arg::IdAt(_)))
                            .filter_map(|(_, v)| v.as_int())
                            .collect(),
                    ),
                    StatementKind::Commit => Track::Commit,
                    _ => Track::Other,
                }
            }
        };
        let stats = self.stats.clone();
        let settling = self.settling.clone();
        let commit_settles = self.commit_settles;
        let run = self.inner.execute(command, lock);
        Box::pin(async move {
            let reply = run.await;
            stats.timed(&kind, issued.elapsed());
            let ok = !matches!(reply, Reply::Failed(_));
            match track {
                Track::Acquire if ok => stats.acquired(),
                Track::Release => stats.released(),
                Track::Settle(id) if ok && commit_settles => {
                    // The row lock form settles at the commit that follows on this connection.
                    settling.lock().expect("not poisoned").insert(conn, id);
                }
                Track::Settle(id) if ok => stats.settled_row(id),
                Track::SettleMany(ids) if ok => {
                    for id in ids {
                        stats.settled_row(id);
                    }
                }
                Track::Commit if ok => {
                    let id = settling.lock().expect("not poisoned").remove(&conn);
                    if let Some(id) = id {
                        stats.settled_row(id);
                    }
                }
                _ => {}
            }
            reply
        })
    }

    fn close(&self) -> BoxFuture<()> {
        self.inner.close()
    }
}

impl<A: TakesRows<T>, T> TakesRows<T> for Counted<A> {
    fn decode(row: A::Row) -> Result<T, String> {
        A::decode(row)
    }

    fn custom_lock() -> Option<A::Lock> {
        A::custom_lock()
    }
}

/// Runs the jobs in the table of `T` on `adapter` until `until` completes (in one process:
/// every row the run settles is settled), and shuts the broker down. Answers the time from the
/// start to `until`'s end.
pub(crate) async fn run<A, T>(
    adapter: A,
    config: &Config,
    stats: Arc<Stats>,
    until: impl Future<Output = Result<(), BoxError>>,
) -> Result<Duration, BoxError>
where
    A: TakesRows<T>,
    T: InboxTable + PayloadRow + ruststream::DecodesAs<Job>,
{
    let form = T::TABLE.table_desc().form();
    let counted = Counted::new(adapter, stats.clone(), form);
    let handle = BrokerHandle::new(counted);
    let worker = Worker {
        stats: stats.clone(),
        work: config.work(),
    };
    let jobs = subscriber("bench", worker)
        .map_source(|_| InboxQueue::<T>::new("bench"))
        .workers(NonZeroUsize::new(config.workers.max(1)).expect("at least one"))
        .poll_interval(Duration::from_millis(1))
        .prefetch(config.prefetch);
    let started = Instant::now();
    let running = handle
        .start(vec![jobs.into_subscription()], ruststream::exec::current())
        .await?;
    let result = until.await;
    let elapsed = started.elapsed();
    running.stop();
    running.drained().await;
    running.shutdown().await;
    result.map(|()| elapsed)
}

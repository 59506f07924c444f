//! The boundary between the core and an adapter: ids, commands, replies and events.

use std::sync::Arc;

use crate::dialect::Statement;
use crate::value::{DbError, ErrorKind, Value};

/// An id: the core's own (`pub(crate)` field, so nothing outside it can forge one) or one
/// an adapter or the runtime may name too (`pub` field).
macro_rules! id {
    ($(#[$doc:meta])* $name:ident($vis:vis $inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name($vis $inner);

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}#{}", stringify!($name), self.0)
            }
        }
    };
}

id!(
    /// A command; its reply comes back with the same id.
    CommandId(pub u64)
);
id!(
    /// A connection the core named when it asked for it; the adapter keeps the driver's
    /// connection under this id until the core releases or closes it.
    ConnId(pub u64)
);
id!(
    /// A subscription.
    SubId(pub usize)
);
id!(
    /// A message in work.
    DeliveryId(pub(crate) u64)
);
id!(
    /// A table a publisher writes.
    PublisherId(pub(crate) usize)
);
id!(
    /// A publish in flight.
    PublishId(pub(crate) u64)
);

/// Something the adapter does for the core. Every command gets exactly one reply, through
/// [`crate::Broker::handle_reply`], even when the adapter cut it short.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// Its id.
    pub id: CommandId,
    /// The connection it runs on.
    pub conn: ConnId,
    /// What to do.
    pub action: Action,
}

/// What a command does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Take a connection from the pool and keep it as `conn`. Reply: [`Reply::Done`], or
    /// [`Reply::Failed`] when the pool gives none.
    Acquire,
    /// Run a statement with these binds on `conn`. Reply: as [`Statement::output`] says
    /// ([`Reply::Done`], [`Reply::Affected`] or [`Reply::Rows`]), or [`Reply::Failed`].
    Execute {
        /// The statement.
        statement: Statement,
        /// Its binds, one per placeholder.
        binds: Vec<Value>,
    },
    /// Run the service's own `Lock` for this subscription's table on `conn`. Reply:
    /// [`Reply::Bool`], whether the key was taken, or [`Reply::Failed`].
    Lock {
        /// The subscription whose table's `Lock` runs.
        sub: crate::SubId,
        /// The key.
        key: Arc<str>,
    },
    /// Run the service's own `Unlock` on `conn`. Reply: [`Reply::Bool`], whether the session
    /// held the key, or [`Reply::Failed`].
    Unlock {
        /// The subscription whose table's `Unlock` runs.
        sub: crate::SubId,
        /// The key.
        key: Arc<str>,
    },
    /// Give `conn` back to the pool. Reply: [`Reply::Done`].
    Release,
    /// Close `conn`, ending its session, its locks and its transaction; a command still
    /// running on it is cut short and answers [`Reply::Failed`]. Reply: [`Reply::Done`] once
    /// the connection is closed.
    Close,
}

/// A driver's row: the values the core asked for, and the row itself for the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row<R> {
    /// The values of the statement's `Output::Rows` columns, in that order.
    pub values: Vec<Value>,
    /// The driver's row, when the statement asked for it.
    pub raw: Option<R>,
    /// Why a cell of the row did not read as its column's type (its value is then `NULL`):
    /// the row, not the statement, is at fault, and the machine that reads it decides.
    pub unread: Option<String>,
}

impl<R> Row<R> {
    /// A row of these values without a driver row.
    pub fn values(values: Vec<Value>) -> Self {
        Self {
            values,
            raw: None,
            unread: None,
        }
    }
}

/// The answer to a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply<R> {
    /// Done, with nothing to tell.
    Done,
    /// The rows a statement affected.
    Affected(u64),
    /// The rows a statement returned.
    Rows(Vec<Row<R>>),
    /// The answer of the service's own `Lock` or `Unlock`.
    Bool(bool),
    /// It failed.
    Failed(DbError),
}

/// How a handler settled its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Done: delete the row, or mark its `processed_at`.
    Ack,
    /// Not now: the row returns to the queue, its attempt counted, due again after the
    /// settlement's delay where the table has a due column (or, in the lease form, once the
    /// lease written for the delay runs out).
    Retry,
    /// Never: the row is marked failed (`failed_at`, and its error) and no claim takes it
    /// again. A table that keeps no failed rows returns the row to the queue instead, as a
    /// retry, and reports the failure ([`Event::Failed`] with `kept: false`).
    Reject,
}

/// A settlement: the outcome, how long a retry waits, and the error to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// The outcome.
    pub outcome: Outcome,
    /// A retry: how long the row waits before it is due again. `None` returns it at once.
    pub delay: Option<std::time::Duration>,
    /// The error to write into the row's error column and report with a failure.
    pub error: Option<Arc<str>>,
}

impl Settlement {
    /// A settlement of this outcome, at once and without an error.
    pub const fn new(outcome: Outcome) -> Self {
        Self {
            outcome,
            delay: None,
            error: None,
        }
    }

    /// The same settlement, a retry waiting `delay`.
    pub fn delay(mut self, delay: std::time::Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// The same settlement, recording `error`.
    pub fn error(mut self, error: impl Into<Arc<str>>) -> Self {
        self.error = Some(error.into());
        self
    }
}

impl From<Outcome> for Settlement {
    fn from(outcome: Outcome) -> Self {
        Self::new(outcome)
    }
}

/// A message the core hands to the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered<R> {
    /// The subscription.
    pub sub: crate::SubId,
    /// The delivery, to settle or drop.
    pub delivery: DeliveryId,
    /// The row's id.
    pub id: Value,
    /// The attempt this take counted, where the table has the column.
    pub attempt: Option<i64>,
    /// The advisory lock's key, in that form.
    pub key: Option<Arc<str>>,
    /// The driver's row, to decode the message from.
    pub row: Option<R>,
    /// The connection that holds the job where its handler may take a transaction (the row
    /// lock form's claim, the advisory form's key connection); `None` in the lease form.
    pub transaction: Option<ConnId>,
}

/// Why a subscription's table does not pass its check.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// The table does not exist.
    #[error("table `{table}` does not exist")]
    MissingTable {
        /// The table.
        table: &'static str,
    },
    /// No index of the table serves its claim order, and the subscription's
    /// `missing_claim_index` says to fail ([`crate::MissingIndex::Fail`]).
    #[error(
        "table `{table}` has no index that serves its claims (ordered by {order}); create it: {create}"
    )]
    MissingClaimIndex {
        /// The table.
        table: &'static str,
        /// The claim order's columns.
        order: String,
        /// The statement that creates the index.
        create: String,
    },
    /// A described column does not exist.
    #[error("table `{table}` has no column `{column}`, which its description names as {role}")]
    MissingColumn {
        /// The table.
        table: &'static str,
        /// The missing column.
        column: &'static str,
        /// What the description names it as.
        role: &'static str,
    },
    /// A described column has a type that does not hold what the queue writes into it: a
    /// time, an attempt count, the payload, an error's text.
    #[error(
        "table `{table}`: column `{column}` ({role}) is `{found}`, where the queue needs {expected}; declare it {expected}"
    )]
    ColumnType {
        /// The table.
        table: &'static str,
        /// The column.
        column: &'static str,
        /// What the description names it as.
        role: &'static str,
        /// Its type, as the database names it.
        found: String,
        /// The type it needs.
        expected: &'static str,
    },
    /// A field of the row type cannot decode the column it reads: every row would fail.
    #[error(
        "table `{table}`: field `{field}: {rust}` of the row type reads column `{column}`, which is `{found}`: no row would decode; read it as {hint}, or drop the field and name the column in `#[inbox({role} = \"{column}\")]`"
    )]
    FieldType {
        /// The table.
        table: &'static str,
        /// The column.
        column: &'static str,
        /// The column's role: `locked_until`, `due`, `processed_at`, `failed_at`, `attempt`,
        /// `payload` or `error`.
        role: &'static str,
        /// The field.
        field: &'static str,
        /// The field's Rust type.
        rust: &'static str,
        /// The column's type, as the database names it.
        found: String,
        /// The Rust types that decode the column.
        hint: &'static str,
    },
    /// A statement of the check failed with an error that waiting cannot cure: the server
    /// refused the user, a privilege is missing, a setting names what the server lacks, or a
    /// prepared statement clashed with another client's (a pooler in transaction pooling).
    #[error(
        "table `{table}`: the start's check failed, and trying again cannot help: {error}{}",
        hint(error)
    )]
    Refused {
        /// The table.
        table: &'static str,
        /// The statement's error.
        error: DbError,
    },
    /// PostgreSQL's isolation level is stricter than read committed, where the row lock form
    /// fails with serialization errors.
    #[error(
        "table `{table}`: the row lock form needs the isolation level read committed, but the session runs at {level}; set `default_transaction_isolation` to 'read committed' for the service's connections"
    )]
    Isolation {
        /// The table.
        table: &'static str,
        /// The level found.
        level: String,
    },
    /// Two connections reached one server session: a pooler in transaction pooling stands
    /// between the service and PostgreSQL, and the form's session locks would outlive their
    /// use ([Poolers](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#poolers-and-postgresql-sessions)).
    #[error(
        "table `{table}`: {}, but two of the broker's connections reached one server session (a lock the first took, the second could take too): they go through a pooler in transaction pooling, such as PgBouncer with `pool_mode = transaction`, which hands each transaction to any server connection; connect to PostgreSQL directly, or through a pooler in session pooling (`pool_mode = session`)",
        session_locks_of(*.form)
    )]
    TransactionPooling {
        /// The table.
        table: &'static str,
        /// The table's form, which holds session locks.
        form: crate::spec::Form,
    },
    /// Two connections reached one server session on an adapter that prepares statements: a
    /// pooler in transaction pooling stands between the service and PostgreSQL. The lease form
    /// and the row lock form without an attempt column work there under the simple query protocol.
    #[error(
        "table `{table}`: two of the broker's connections reached one server session (a lock the first took, the second could take too): they go through a pooler in transaction pooling, such as PgBouncer with `pool_mode = transaction`, which hands each transaction to any server connection, where the driver's prepared statements, kept per connection, meet other clients' sessions; run the adapter's statements under the simple query protocol (`simple_query(true)` on the tokio-postgres and sqlx brokers), connect to PostgreSQL directly, or through a pooler in session pooling (`pool_mode = session`)"
    )]
    PreparedStatements {
        /// The table.
        table: &'static str,
    },
    /// The check's statement failed.
    #[error("table `{table}`: the check failed: {error}")]
    Db {
        /// The table.
        table: &'static str,
        /// The error.
        error: DbError,
    },
}

/// Why a settlement did not take effect. The row returns to the queue: at once, or when its
/// lease runs out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SettleError {
    /// The broker is shut down.
    #[error("the broker is shut down; the row returns to the queue")]
    Closed,
    /// The lease ran out and the row went to another delivery.
    #[error("the lease ran out before the settlement; the row went back to the queue")]
    LeaseLost,
    /// The delivery was dropped, or already settled.
    #[error("the delivery is no longer in work")]
    NotInWork,
    /// The settlement's statement failed.
    #[error("the settlement failed: {0}")]
    Db(DbError),
}

/// What the shutdown did to the advisory locks of the deliveries in work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClosedCounts {
    /// Locks the shutdown released with an unlock that answered yes.
    pub locks_released: usize,
    /// Connections the shutdown closed to end their locks, where an unlock answered no or
    /// failed (or the delivery held a transaction it could not roll back).
    pub connections_closed: usize,
}

/// What a publish wrote: every row, but on a table that deduplicates its publishes
/// ([`InboxSpec::unique`](crate::InboxSpec::unique)), the rows already there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// The rows of the publish, by their place in it (from 0), that were already in the table
    /// and so were not written.
    pub skipped: Vec<usize>,
}

impl Published {
    /// Whether every row was written.
    pub fn wrote_all(&self) -> bool {
        self.skipped.is_empty()
    }
}

/// What the core tells the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event<R> {
    /// The subscription's table passed its check; claims begin.
    Ready {
        /// The subscription.
        sub: crate::SubId,
    },
    /// The subscription's table failed its check; the subscription claims nothing.
    CheckFailed {
        /// The subscription.
        sub: crate::SubId,
        /// Why.
        error: CheckError,
    },
    /// A message to hand to a handler.
    Delivered(Delivered<R>),
    /// A settlement took effect.
    Settled {
        /// The delivery.
        delivery: DeliveryId,
        /// How it was settled.
        outcome: Outcome,
    },
    /// A job failed: rejected, past its attempt limit, or not decodable. `kept`: marked failed
    /// and out of the queue (`true`), or returned to it on a table that keeps no failed rows.
    /// Follows the row's [`Event::Settled`] where a handler ran, and stands alone otherwise.
    Failed {
        /// The subscription.
        sub: crate::SubId,
        /// The delivery.
        delivery: DeliveryId,
        /// The row's id.
        id: Value,
        /// The attempt that failed, where the table counts them.
        attempt: Option<i64>,
        /// Why, as recorded.
        error: Option<Arc<str>>,
        /// Whether the row is kept as failed.
        kept: bool,
    },
    /// A settlement did not take effect.
    SettleFailed {
        /// The delivery.
        delivery: DeliveryId,
        /// Why.
        error: SettleError,
    },
    /// A lease ran out while its delivery was in work: another delivery may take the row.
    LeaseLost {
        /// The delivery.
        delivery: DeliveryId,
    },
    /// A delivery left work without a settlement (dropped, or released by the shutdown): its
    /// row returns to the queue.
    Returned {
        /// The delivery.
        delivery: DeliveryId,
    },
    /// Something the start found that does not stop the subscription: a table without an
    /// index that serves its claims ([`crate::MissingIndex::Warn`]).
    Warning {
        /// The subscription.
        sub: crate::SubId,
        /// What, naming the table.
        message: Arc<str>,
    },
    /// A read of a table's state ([`crate::Broker::read_table`]) ended.
    Read {
        /// The read, as its call numbered it.
        publish: PublishId,
        /// What it read, or why it read nothing.
        result: Result<TableRead, DbError>,
    },
    /// A statement of the subscription's check failed with an error that may pass (a
    /// refused or lost connection, a pool that gave none, a time limit): the check runs again
    /// after `again_in`, which grows with each failure.
    StartRetry {
        /// The subscription.
        sub: crate::SubId,
        /// The statement's error.
        error: DbError,
        /// How many times in a row the check failed.
        failures: u32,
        /// When the check runs again.
        again_in: std::time::Duration,
    },
    /// A claim or a release failed; the subscription goes on.
    Error {
        /// The subscription.
        sub: crate::SubId,
        /// The error.
        error: DbError,
    },
    /// A change of failed rows ([`crate::Broker::redrive`], [`crate::Broker::delete_failed`])
    /// ended: how many rows it changed.
    Changed {
        /// The change, as its call numbered it.
        publish: PublishId,
        /// The rows changed, or why nothing changed.
        result: Result<u64, DbError>,
    },
    /// The answer to [`Broker::lend_transaction`](crate::Broker::lend_transaction): the
    /// connection of the delivery's open transaction, marked with a savepoint, for the
    /// runtime to lend to the handler; `None` where there is none to lend.
    Lent {
        /// The delivery.
        delivery: DeliveryId,
        /// Its connection, or `None`.
        conn: Option<ConnId>,
    },
    /// A publish ended.
    Published {
        /// The publish.
        publish: PublishId,
        /// What it wrote, or why it wrote nothing.
        result: Result<Published, DbError>,
    },
    /// The shutdown is complete: nothing of the broker is held on the server.
    Closed(ClosedCounts),
    /// The maintenance ran: a retention, a tick of a periodic job, or a failure of either.
    Maintained(crate::broker::Maintained),
}

/// What a form holds with session locks, for [`CheckError::TransactionPooling`].
fn session_locks_of(form: crate::spec::Form) -> &'static str {
    match form {
        crate::spec::Form::RowLock => {
            "the row lock form marks each row it counts with a session lock on the count's connection until the row is locked"
        }
        crate::spec::Form::Advisory | crate::spec::Form::Lease => {
            "the advisory lock form holds each key with a session lock on the delivery's own connection"
        }
    }
}

/// What a read of a table's state asks for ([`crate::Broker::read_table`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadTable {
    /// The table's counts.
    Stats,
    /// Up to `limit` failed rows, in id order, after the id `after` where it is given.
    Failed {
        /// The most rows.
        limit: u32,
        /// The id the rows follow.
        after: Option<Value>,
    },
    /// The failed row of this id.
    FailedRow(Value),
}

/// What a read of a table's state found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableRead {
    /// The table's counts.
    Stats(crate::stats::Stats),
    /// Failed rows, in id order.
    Failed(Vec<crate::stats::FailedRow>),
}

/// What a refused check's error asks of the operator, where its kind says.
fn hint(error: &DbError) -> &'static str {
    match error.kind {
        ErrorKind::PreparedStatement => {
            " (a pooler in transaction pooling, such as PgBouncer with `pool_mode = transaction`, hands each transaction to any server session, where another client's prepared statements live: run the adapter's statements under the simple query protocol (`simple_query(true)` on the tokio-postgres and sqlx brokers), connect to PostgreSQL directly, or through session pooling)"
        }
        ErrorKind::SharedSession => {
            " (a pooler in transaction pooling, such as PgBouncer with `pool_mode = transaction`, hands each transaction to any server session, where another client's `LISTEN` lives: give the listening session a direct connection (`listen_on`) or turn it off (`without_listener()`), connect to PostgreSQL directly, or through session pooling)"
        }
        ErrorKind::Authentication => " (check the user and password of the URL)",
        ErrorKind::Privilege => " (grant the service's user what the statement needs)",
        _ => "",
    }
}

//! The broker's settings, limits and refusals.

use std::time::Duration;

use crate::spec::{DescError, RowField};
use crate::value::{Time, Value};

/// How long a dropped delivery may take to release its lock before its connection is closed.
pub const DROP_GRACE: Duration = Duration::from_secs(5);

/// How long the broker keeps a connection its flow gave back, for the next flow that needs
/// one, before it returns it to the pool; only a clean session is kept
/// ([Connections kept](https://github.com/ruststream/ruststream/blob/main/docs/src/performance.md#rows-claimed-ahead-and-connections-kept)).
pub const CONNECTION_LINGER: Duration = Duration::from_millis(5);

/// The row lock and advisory forms: a row claimed ahead that waited this long for a free
/// worker is handed only after a `SELECT 1` on its connection answered; a session the server
/// ended meanwhile no longer holds the row, which is then claimed again.
pub const PING_AHEAD_AFTER: Duration = Duration::from_secs(1);

/// The most lease settlements one statement runs: settlements asked for while another of
/// the subscription's runs wait for it, then run together.
pub const SETTLE_BATCH: usize = 64;

/// How many times a lease statement that a deadlock or a serialization failure rolled back
/// runs again at once, on its connection, before its delivery's settlement fails.
pub const DEADLOCK_RERUNS: u8 = 3;

/// PostgreSQL: a publisher's notifying statements start at most this often; a publish within
/// it inserts without notifying, and one notification follows once it has passed
/// ([Wake-up](https://github.com/ruststream/ruststream/blob/main/docs/src/operating.md#wake-up)).
pub const NOTIFY_EVERY: Duration = Duration::from_millis(2);

/// The longest a retry waits: a longer delay is cut to this, so that the due time stays
/// within every database's range of times.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(366 * 24 * 3600);

/// The longest error text a settlement writes into the row: a longer one is cut, on a
/// character boundary, and ends in `…`.
pub const MAX_ERROR_LEN: usize = 4_000;

/// The most rows one insert of a batch publish writes.
pub const PUBLISH_BATCH: usize = 100;

/// The settings of one subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubscribeOptions {
    /// How many messages may be in work at once. In the lease form on the servers up to as
    /// many more rows may be settling: a worker whose handler has ended takes its next row
    /// meanwhile.
    pub workers: usize,
    /// How long a subscription waits between claims that found nothing.
    pub poll_interval: Duration,
    /// The lease form: how long a lease lasts.
    pub lease: Duration,
    /// The lease form: how often a lease in work is extended.
    pub extend_every: Duration,
    /// How many rows a subscription may claim ahead, beyond `workers`, held as rows in work
    /// are and handed as soon as a worker frees ([Rows claimed ahead](https://github.com/ruststream/ruststream/blob/main/docs/src/performance.md#rows-claimed-ahead-and-connections-kept)).
    // By its lease, extended like a lease in work; by its claim's transaction, on a connection
    // of its own, in the row lock form; by its key's lock, on a connection of its own, in the
    // advisory lock form. At most `workers` are in work at once. When the subscription stops
    // or the broker shuts down, the rows still waiting are given back at once. A claim that
    // reads the first due rows alone (SQLite's advisory form, a custom lock) claims none ahead.
    pub prefetch: usize,
    /// The most attempts a job is handed for: a take past it marks the job failed without
    /// running the handler, a crash's take too. Needs the attempt and `failed_at` columns;
    /// `None` hands a job however often it returns.
    pub max_attempts: Option<u32>,
    /// The fields of the row type that decode the description's time columns: the start
    /// check refuses a field whose type cannot decode its column's ([`RowField`]).
    pub row_fields: &'static [RowField],
    /// The start creates what the table's schema lacks ([`Ddl`](crate::Ddl)): the table, when
    /// it does not exist, and its indexes; then checks it as usual.
    pub ensure_schema: bool,
    /// What the start does when no index of the table serves the claim order
    /// ([`serves_claims`](crate::serves_claims)).
    pub missing_claim_index: MissingIndex,
}

/// What the start does about a table without an index that serves its claim order: without
/// one each claim sorts the claimable rows, a cost that grows with the queue (and on MySQL
/// and MariaDB locks every row it sorts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MissingIndex {
    /// The subscription starts, and the start says so ([`Event::Warning`](crate::Event::Warning)),
    /// naming the table and the index to create.
    #[default]
    Warn,
    /// The subscription's check fails ([`CheckError::MissingClaimIndex`](crate::CheckError::MissingClaimIndex)).
    Fail,
    /// Nothing is checked.
    Ignore,
}

impl Default for SubscribeOptions {
    fn default() -> Self {
        Self {
            workers: 1,
            poll_interval: Duration::from_secs(1),
            lease: Duration::from_secs(30),
            extend_every: Duration::from_secs(10),
            prefetch: 0,
            max_attempts: None,
            row_fields: &[],
            ensure_schema: false,
            missing_claim_index: MissingIndex::Warn,
        }
    }
}

/// A row to publish.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Publish {
    /// The id, where the table's id is not generated.
    pub id: Option<Value>,
    /// The encoded message.
    pub payload: Vec<u8>,
    /// The values of the key's columns, by column name.
    pub columns: Vec<(&'static str, Value)>,
    /// When the row becomes due; now when `None`.
    pub due: Option<Time>,
}

/// Which failed rows [`Broker::redrive`](crate::Broker::redrive) and
/// [`Broker::delete_failed`](crate::Broker::delete_failed) change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailedRowsOf {
    /// Every failed row of the table.
    All,
    /// The failed rows among these ids.
    Ids(Vec<Value>),
    /// The failed rows whose error text contains this text (a table without an error column
    /// has none), as the database's `LIKE` compares: by case on PostgreSQL, without case on
    /// SQLite (for ASCII) and on MySQL's and MariaDB's usual collations.
    ErrorContains(String),
}

/// Why a call was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The broker is shutting down or shut down: nothing is written.
    #[error("the broker is shut down")]
    Closed,
    /// The description breaks a rule.
    #[error(transparent)]
    Desc(#[from] DescError),
    /// A publish names no value for a column the table needs.
    #[error("table `{table}`: the publish gives no value for column `{column}`")]
    MissingValue {
        /// The table.
        table: &'static str,
        /// The column.
        column: &'static str,
    },
    /// A publish names a column the table's insert does not write: a misspelt name, or a
    /// column no part of the key reads.
    #[error(
        "table `{table}`: the publish names column `{column}`, which its insert does not write (it writes the key's columns: {writes})"
    )]
    UnknownColumn {
        /// The table.
        table: &'static str,
        /// The column the publish names.
        column: &'static str,
        /// The columns the insert writes from a publish's values, comma-separated.
        writes: String,
    },
    /// No such subscription or publisher.
    #[error("no such {0}")]
    Unknown(&'static str),
    /// A subscription with no worker would take no message.
    #[error("table `{table}`: a subscription needs at least one worker (`.workers(n)`, n ≥ 1)")]
    NoWorkers {
        /// The table.
        table: &'static str,
    },
}

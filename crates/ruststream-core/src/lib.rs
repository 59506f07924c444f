//! The sans-IO core of ruststream: a database table as a message queue.
//!
//! This crate decides everything and does nothing: it performs no IO, reads no clock, never
//! sleeps, spawns nothing, and depends on no async runtime and no database driver. Its outputs
//! are plain data an adapter executes; its inputs carry the time. The same inputs always give
//! the same outputs.
//!
//! - [`spec`]: table descriptions ([`InboxSpec`]) and the rules they keep, checked at compile
//!   time.
//! - [`dialect`]: every SQL text of the queue, per dialect, rendered once per subscription.
//! - [`keys`]: advisory lock keys: templates, PostgreSQL's 64-bit hash, MySQL's lock names.
//! - [`server`]: what a server says about itself: its version as a [`Dialect`] (or why it
//!   does not serve the queue), its error codes as an [`ErrorKind`].
//! - [`Broker`]: the machine of one database's subscriptions, deliveries, publishes and
//!   shutdown, driven by [`Broker::handle_reply`], [`Broker::handle_timeout`],
//!   [`Broker::settle`], [`Broker::drop_delivery`] and [`Broker::shutdown`], and drained
//!   through [`Broker::poll_command`], [`Broker::poll_event`] and [`Broker::poll_timeout`].
//!
//! An adapter's loop: after any input, run each [`Command`] from `poll_command` (a command
//! names the connection it runs on, and its reply comes back with its id), hand each [`Event`]
//! to the runtime, and arm one timer for `poll_timeout`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod broker;
pub mod dialect;
pub mod keys;
mod read;
pub mod server;
pub mod spec;
pub mod stats;
mod types;
mod value;

pub use broker::{
    Broker, BrokerError, CONNECTION_LINGER, DROP_GRACE, FailedRowsOf, Inserts, MAX_ERROR_LEN,
    MAX_RETRY_DELAY, MissingIndex, NOTIFY_EVERY, PING_AHEAD_AFTER, PUBLISH_BATCH, Publish,
    SETTLE_BATCH, SubscribeOptions,
};
pub use broker::{
    MAINTENANCE_RETRY, Maintained, PERIODIC_CATCH_UP, PeriodicJob, RETENTION_BATCH,
    RETENTION_EVERY, Retention, Ticks,
};
pub use broker::{WAITING_MAX, start_retry_delay};
pub use dialect::{
    Arg, ColumnType, Ddl, Dialect, FailedRows, NOTIFY_CHANNEL, OutColumn, Output, Statement,
    StatementKind, Statements, error_like, notification_names, serves_claims,
};
pub use read::{column_position, read_rows};
pub use spec::{
    Column, DescError, ERRORS_KEPT, FieldKind, Form, Hold, InboxSpec, KeyPart, OrderBy, RowField,
    TableDesc,
};
pub use stats::{AttemptError, Count, FailedRow, STATS_CAP, Stats};
pub use types::{
    Action, CheckError, ClosedCounts, Command, CommandId, ConnId, Delivered, DeliveryId, Event,
    Outcome, PublishId, Published, PublisherId, ReadTable, Reply, Row, SettleError, Settlement,
    SubId, TableRead,
};
pub use value::{DbError, ErrorKind, Time, Value};

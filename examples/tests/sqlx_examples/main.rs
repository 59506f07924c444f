//! The eight sqlx examples (the row lock form, the advisory form, a custom lock and shutdown,
//! each by macros and by hand) run as they are written, against the test databases, and do what they claim:
//!
//! - row lock: four workers on PostgreSQL each hold a connection, in an open transaction, while
//!   its invoice is in work, and the acknowledgement deletes the row;
//! - advisory: one video per channel in work at a time; a failed encode is retried, its row
//!   returned with the release of its key and its attempts counted;
//! - lock: a payout waits while billing holds its account's key in `held_keys` and runs once
//!   billing releases it;
//! - shutdown: `run` returns once the handlers have drained and the broker has shut down and
//!   closed the pool it built;
//! - the outbox: an order and its receipt's job commit in one transaction, or neither does.
//!
//! Each test calls the example's `service(..)` on a database of its own (a PostgreSQL schema
//! found by `search_path`, or a SQLite file in a temporary directory) and stops it with
//! `run_until`. PostgreSQL is at `RUSTSTREAM_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); an unreachable server fails the test naming the
//! URL. The tests observe the examples through their tracing events, so they run one at a time
//! within this binary.

mod common;

mod advisory;
mod lock;
mod outbox;
mod row_lock;
mod shutdown;

#[path = "../../sqlx_outbox.rs"]
#[allow(dead_code)]
mod outbox_example;

#[path = "../../sqlx_forms_row_lock.rs"]
#[allow(dead_code)]
mod row_lock_macros;

#[path = "../../manual/sqlx_forms_row_lock.rs"]
#[allow(dead_code)]
mod row_lock_manual;

#[path = "../../sqlx_forms_advisory.rs"]
#[allow(dead_code)]
mod advisory_macros;

#[path = "../../manual/sqlx_forms_advisory.rs"]
#[allow(dead_code)]
mod advisory_manual;

#[path = "../../sqlx_forms_lock.rs"]
#[allow(dead_code)]
mod lock_macros;

#[path = "../../manual/sqlx_forms_lock.rs"]
#[allow(dead_code)]
mod lock_manual;

#[path = "../../sqlx_broker_shutdown.rs"]
#[allow(dead_code)]
mod shutdown_macros;

#[path = "../../manual/sqlx_broker_shutdown.rs"]
#[allow(dead_code)]
mod shutdown_manual;

//! A transaction on the delivery's connection, lent to the handler: [`RusqliteClaim`].

use ruststream::adapter::{Claim, Threads};

use crate::driver::RusqliteDriver;

/// A transaction on the job's connection, lent to its handler in the advisory form: what the
/// handler writes in it commits with the job's acknowledgement and rolls back otherwise. Its
/// [`call`](ruststream::adapter::ThreadConn::call) runs a closure on the connection's thread.
///
/// ```no_run
/// use ruststream_rusqlite::prelude::*;
/// use ruststream_rusqlite::RusqliteClaim;
/// # #[derive(serde::Deserialize, Inbox)]
/// # #[inbox(table = "jobs", advisory_lock = "jobs-{k}")]
/// # struct Job { #[field(id, generated)] id: i64, k: i64, #[field(payload)] payload: Vec<u8> }
/// # #[derive(serde::Deserialize)]
/// # struct Invoice { number: i64 }
///
/// #[subscriber(InboxQueue::<Job>::new("invoices"))]
/// async fn issue(invoice: &Invoice, claim: RusqliteClaim) -> HandlerOutcome {
///     let number = invoice.number;
///     // Written once: it commits with the row's deletion, or neither happens.
///     let written = claim
///         .call(move |conn| conn.execute("INSERT INTO issued (number) VALUES (?1)", [number]))
///         .await;
///     match written {
///         Some(Ok(_)) => HandlerOutcome::ack(),
///         Some(Err(error)) => HandlerOutcome::retry().with_error(error),
///         None => HandlerOutcome::retry().with_error("the connection's thread ended"),
///     }
/// }
/// ```
// `call` runs the closure on the `rusqlite::Connection`, inside the open transaction, and
// answers what it answers (`None` if the connection's thread ended): run statements there, but
// neither commit nor roll it back. SQLite's lease form lends none (SQLite takes one writer at a
// time): a handler of such a table that takes it fails its row, with an error that says so.
pub type RusqliteClaim = Claim<Threads<RusqliteDriver>>;

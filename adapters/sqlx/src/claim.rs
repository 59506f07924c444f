//! A transaction on the delivery's connection, lent to the handler: [`SqlxClaim`].

use ruststream::adapter::{Claim, LendsClaims};
use sqlx::pool::PoolConnection;

use crate::conn::SqlxPool;
use crate::db::SqlxDatabase;

/// A transaction on the job's connection, lent to its handler (`&mut PgConnection`, ..): what
/// the handler writes in it commits with the job's acknowledgement and rolls back otherwise.
/// Run statements on it, but neither commit nor roll it back ([Handler writes](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#a-handlers-writes-with-the-settlement)).
///
/// ```no_run
/// use ruststream_sqlx::prelude::*;
/// use ruststream_sqlx::SqlxClaim;
/// # #[derive(sqlx::FromRow, Inbox)]
/// # #[inbox(table = "invoice_jobs")]
/// # struct IssueInvoice { #[field(id, generated)] id: i64, #[field(payload)] payload: Vec<u8> }
/// # #[derive(serde::Deserialize)]
/// # struct Invoice { number: i64 }
///
/// #[subscriber(InboxQueue::<IssueInvoice>::new("invoices"))]
/// async fn issue(invoice: &Invoice, mut claim: SqlxClaim<Postgres>) -> HandlerOutcome {
///     // Written once: it commits with the row's deletion, or neither happens.
///     let written = sqlx::query("INSERT INTO issued (number) VALUES ($1)")
///         .bind(invoice.number)
///         .execute(&mut *claim)
///         .await;
///     match written {
///         Ok(_) => HandlerOutcome::ack(),
///         Err(error) => HandlerOutcome::retry().with_error(error),
///     }
/// }
/// ```
// In the row lock form it is the claim's open transaction (past a savepoint), in the advisory
// lock form one begun on the connection that holds the key, in the lease form one begun on a
// connection taken for it, whose acknowledgement is fenced by the lease: a lease lost
// meanwhile rolls the handler's writes back, and the settlement fails. SQLite's lease form
// lends none: a handler of such a table that takes it fails its row, with an error that says
// so.
pub type SqlxClaim<DB> = Claim<SqlxPool<DB>>;

impl<DB: SqlxDatabase> LendsClaims for SqlxPool<DB> {
    type Target = DB::Connection;
    const EXTRACTOR: &'static str = "SqlxClaim";

    fn target(conn: &PoolConnection<DB>) -> &DB::Connection {
        conn
    }

    fn target_mut(conn: &mut PoolConnection<DB>) -> &mut DB::Connection {
        conn
    }
}

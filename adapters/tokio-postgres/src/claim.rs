//! A transaction on the delivery's connection, lent to the handler: [`TokioPostgresClaim`].

use ruststream::adapter::{Claim, LendsClaims};
use tokio_postgres::Client;

use crate::conns::{Lender, PgConn};

/// A transaction on the delivery's connection, lent to its handler: in the row lock form the
/// claim's open transaction (past a savepoint), in the advisory lock form one begun on the
/// connection that holds the key, in the lease form one begun on a connection taken for it. What the handler writes in it commits with the
/// acknowledgement, in the same transaction as the row's settlement, and rolls back with a
/// retry, a failure, a crash or the shutdown, so its effects happen once with the
/// settlement. It derefs to the [`Client`] inside the open transaction: run statements on it,
/// but neither commit nor roll it back. (Under the simple query protocol too: a statement the
/// handler runs goes as it writes it.)
///
/// In the lease form the acknowledgement's settlement in the transaction is fenced by the
/// lease: a lease lost meanwhile rolls the handler's writes back, and the settlement fails.
pub type TokioPostgresClaim = Claim<Lender>;

impl LendsClaims for Lender {
    type Target = Client;
    const EXTRACTOR: &'static str = "TokioPostgresClaim";

    fn target(conn: &PgConn) -> &Client {
        &conn.object
    }

    fn target_mut(conn: &mut PgConn) -> &mut Client {
        &mut conn.object
    }
}

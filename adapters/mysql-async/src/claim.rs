//! A transaction on the delivery's connection, lent to the handler: [`MySqlAsyncClaim`].

use mysql_async::Conn;
use ruststream::adapter::{Claim, LendsClaims};

use crate::conn::{Lender, MyConn};

/// A transaction on the delivery's connection, lent to its handler: in the row lock form the
/// claim's open transaction (past a savepoint), in the advisory lock form one begun on the
/// connection that holds the key. What the handler writes in it commits with the
/// acknowledgement, in the same transaction as the row's settlement, and rolls back with a
/// retry, a failure, a crash or the shutdown, so its effects happen once with the
/// settlement. It derefs to the [`Conn`] inside the open transaction (`&mut *claim` for
/// `Queryable`): run statements on it, but neither commit nor roll it back.
///
/// The lease form holds no connection while a row is in work, and lends none: a handler of
/// such a table that takes it fails its row, with an error that says so.
pub type MySqlAsyncClaim = Claim<Lender>;

impl LendsClaims for Lender {
    type Target = Conn;
    const EXTRACTOR: &'static str = "MySqlAsyncClaim";

    fn target(conn: &MyConn) -> &Conn {
        &conn.conn
    }

    fn target_mut(conn: &mut MyConn) -> &mut Conn {
        &mut conn.conn
    }
}

//! A transaction on the delivery's connection, lent to the handler: [`MySqlAsyncClaim`].

use mysql_async::Conn;
use ruststream::adapter::{Claim, LendsClaims};

use crate::conn::{Lender, MyConn};

/// A transaction on the job's connection, lent to its handler (a [`Conn`]; `&mut *claim` for
/// `Queryable`): what the handler writes in it commits with the job's acknowledgement and
/// rolls back otherwise. Run statements on it, but neither commit nor roll it back.
// In the row lock form it is the claim's open transaction (past a savepoint), in the advisory
// lock form one begun on the connection that holds the key, in the lease form one begun on a
// connection taken for it, whose acknowledgement is fenced by the lease: a lease lost
// meanwhile rolls the handler's writes back, and the settlement fails.
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

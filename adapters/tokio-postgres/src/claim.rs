//! A transaction on the delivery's connection, lent to the handler: [`TokioPostgresClaim`].

use ruststream::adapter::{Claim, LendsClaims};
use tokio_postgres::Client;

use crate::conns::{Lender, PgConn};

/// A transaction on the job's connection, lent to its handler (a [`Client`]): what the
/// handler writes in it commits with the job's acknowledgement and rolls back otherwise. Run
/// statements on it, but neither commit nor roll it back ([Handler writes](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#a-handlers-writes-with-the-settlement)).
// In the row lock form it is the claim's open transaction (past a savepoint), in the advisory
// lock form one begun on the connection that holds the key, in the lease form one begun on a
// connection taken for it, whose acknowledgement is fenced by the lease: a lease lost
// meanwhile rolls the handler's writes back, and the settlement fails. Under the simple query
// protocol a statement the handler runs goes as it writes it.
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

//! A transaction on the delivery's connection, lent to the handler: [`TokioPostgresClaim`].

use ruststream::adapter::Lent;
use ruststream::{Context, FromContext, HandlerOutcome};
use tokio_postgres::Client;

use crate::conns::Lender;

/// A transaction on the delivery's connection, lent to its handler: in the row lock form the
/// claim's open transaction (past a savepoint), in the advisory lock form one begun on the
/// connection that holds the key. What the handler writes in it commits with the
/// acknowledgement, in the same transaction as the row's settlement, and rolls back with a
/// retry, a failure, a crash or the shutdown, so its effects happen once with the
/// settlement. It derefs to the [`Client`] inside the open transaction: run statements on it,
/// but neither commit nor roll it back. (Under the simple query protocol too: a statement the
/// handler runs goes as it writes it.)
///
/// The lease form holds no connection while a row is in work, and lends none: a handler of
/// such a table that takes it fails its row, with an error that says so.
pub struct TokioPostgresClaim {
    lent: Lent<Lender>,
}

impl std::fmt::Debug for TokioPostgresClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokioPostgresClaim").finish_non_exhaustive()
    }
}

impl std::ops::Deref for TokioPostgresClaim {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.lent.object
    }
}

impl<C: Send> FromContext<C> for TokioPostgresClaim {
    fn from_context(
        ctx: &mut Context<'_, C>,
    ) -> impl Future<Output = Result<Self, HandlerOutcome>> + Send {
        let lending = ctx.claim_transaction();
        async move {
            let lent = match lending {
                Some(lending) => lending.await,
                None => None,
            };
            lent.and_then(|lent| lent.downcast::<Lent<Lender>>().ok())
                .map(|lent| TokioPostgresClaim { lent: *lent })
                .ok_or_else(|| {
                    let error = "the handler takes the claim's transaction (`TokioPostgresClaim`), but the delivery holds no connection to lend one on: the lease form lends none";
                    tracing::error!("{error}");
                    HandlerOutcome::reject().with_error(error)
                })
        }
    }
}

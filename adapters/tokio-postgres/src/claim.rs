//! The row lock form's open transaction, lent to the handler: [`TokioPostgresClaim`].

use ruststream::adapter::Lent;
use ruststream::{Context, FromContext, HandlerOutcome};
use tokio_postgres::Client;

use crate::conns::Lender;

/// The claim's transaction of a row in the row lock form, lent to its handler: what the
/// handler writes on it commits with the acknowledgement, in the same transaction, and rolls
/// back with a retry, a crash or the shutdown, so its effects happen once with the row's
/// settlement. It derefs to the [`Client`] inside the open transaction: run statements on it,
/// but neither commit nor roll it back. (Under the simple query protocol too: a statement the
/// handler runs goes as it writes it.)
///
/// A handler of a table in another form that takes it fails its row, with an error that says
/// so.
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
                    let error = "the handler takes the claim's transaction (`TokioPostgresClaim`), but its row is not held by one: only a table in the row lock form lends it";
                    tracing::error!("{error}");
                    HandlerOutcome::reject().with_error(error)
                })
        }
    }
}

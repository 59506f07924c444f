//! What each adapter names in its driver's types: a transaction on a delivery's connection,
//! lent to its handler ([`Claim`]), and a table's own lock and unlock ([`CustomLock`]).

use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};

use super::connections::{ConnectionPool, Lent};
use crate::outcome::{Context, FromContext, HandlerOutcome};

/// A pool whose connections a handler can take as its claim's transaction ([`Claim`]).
pub trait LendsClaims: ConnectionPool {
    /// What the handler reaches: the driver's connection inside the transaction.
    type Target: ?Sized;
    /// The adapter's name of the extractor, for errors: `SqlxClaim`.
    const EXTRACTOR: &'static str;

    /// The driver's connection inside the pool's.
    fn target(conn: &Self::Connection) -> &Self::Target;

    /// The driver's connection inside the pool's, to run statements on.
    fn target_mut(conn: &mut Self::Connection) -> &mut Self::Target;
}

/// A transaction on the job's connection, lent to its handler: what the handler writes in it
/// commits with the job's acknowledgement and rolls back otherwise. Run statements on it, but
/// neither commit nor roll it back ([Handler writes](https://github.com/ruststream/ruststream/blob/main/docs/src/forms.md#a-handlers-writes-with-the-settlement)).
// In the row lock form it is the claim's open transaction (past a savepoint), in the advisory
// lock form one begun on the connection that holds the key, in the lease form one on a
// connection taken for it, whose acknowledgement is fenced by the lease (a lease lost
// meanwhile rolls the handler's writes back). SQLite's lease form lends none: a handler of
// such a table that takes it fails its row, with an error that says so.
pub struct Claim<P: LendsClaims> {
    lent: Lent<P>,
}

impl<P: LendsClaims> fmt::Debug for Claim<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(P::EXTRACTOR).finish_non_exhaustive()
    }
}

impl<P: LendsClaims> Deref for Claim<P> {
    type Target = P::Target;

    fn deref(&self) -> &P::Target {
        P::target(&self.lent)
    }
}

impl<P: LendsClaims> DerefMut for Claim<P> {
    fn deref_mut(&mut self) -> &mut P::Target {
        P::target_mut(&mut self.lent)
    }
}

impl<P: LendsClaims, C: Send> FromContext<C> for Claim<P> {
    fn from_context(
        ctx: &mut Context<'_, C>,
    ) -> impl Future<Output = Result<Self, HandlerOutcome>> + Send {
        let lending = ctx.claim_transaction();
        async move {
            let lent = match lending {
                Some(lending) => lending.await,
                None => None,
            };
            lent.and_then(|lent| lent.downcast::<Lent<P>>().ok())
                .map(|lent| Claim { lent: *lent })
                .ok_or_else(|| {
                    let error = format!(
                        "the handler takes the claim's transaction (`{}`), but the broker lent none: its lease was lost, its connection or the transaction's begin failed, or the table is a SQLite table in the lease form, which lends none",
                        P::EXTRACTOR
                    );
                    tracing::error!("{error}");
                    HandlerOutcome::reject().with_error(error)
                })
        }
    }
}

/// A table's own lock and unlock (`custom(lock, unlock)`) as a broker stores them: two
/// functions of the adapter's type `F`, each run on the connection of the command that asks
/// ([Custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)).
// `lock` tries the key without waiting and answers whether it took it; `unlock` answers
// whether the session held the key. Each adapter names `F` for its driver (an async function
// of its connection and the key, or a blocking one) and builds the pair from its `Lock` and
// `Unlock` traits.
pub struct CustomLock<F> {
    lock: F,
    unlock: F,
}

impl<F: Copy> Clone for CustomLock<F> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<F: Copy> Copy for CustomLock<F> {}

impl<F: Copy> CustomLock<F> {
    /// A lock of these two functions.
    pub fn new(lock: F, unlock: F) -> Self {
        Self { lock, unlock }
    }

    /// The lock: it tries a key without waiting.
    pub fn lock(&self) -> F {
        self.lock
    }

    /// The unlock: it releases a key.
    pub fn unlock(&self) -> F {
        self.unlock
    }
}

impl<F> fmt::Debug for CustomLock<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomLock").finish_non_exhaustive()
    }
}

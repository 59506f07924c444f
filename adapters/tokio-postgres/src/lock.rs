//! The service's own lock and unlock of a table's keys ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)), on tokio-postgres's client.

use std::future::Future;

use futures::future::BoxFuture;
use ruststream_core::spec::bits::{False, True};
use tokio_postgres::Client;

/// The service's own lock of a table whose description names `own::Lock`: it tries the key
/// without waiting, on the connection that then holds the job, and answers whether it took
/// it; an error fails the claim and closes the connection ([Custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)).
///
/// ```
/// use ruststream_tokio_postgres::tokio_postgres::{self, Client};
/// use ruststream_tokio_postgres::{Lock, Unlock};
///
/// struct Payout;
///
/// impl Lock for Payout {
///     async fn lock(client: &Client, key: &str) -> Result<bool, tokio_postgres::Error> {
///         let row = client
///             .query_one("SELECT pg_try_advisory_lock(hashtext($1)::bigint)", &[&key])
///             .await?;
///         row.try_get(0)
///     }
/// }
///
/// impl Unlock for Payout {
///     async fn unlock(client: &Client, key: &str) -> Result<bool, tokio_postgres::Error> {
///         let row = client
///             .query_one("SELECT pg_advisory_unlock(hashtext($1)::bigint)", &[&key])
///             .await?;
///         row.try_get(0)
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}`'s description names `own::Lock`, but `{Self}` does not implement `ruststream_tokio_postgres::Lock`",
    label = "implement `ruststream_tokio_postgres::Lock` (and `Unlock`) for `{Self}`, or remove the custom lock from its description"
)]
pub trait Lock {
    /// Tries to take `key` on `client`'s session without waiting: whether it took it.
    fn lock(
        client: &Client,
        key: &str,
    ) -> impl Future<Output = Result<bool, tokio_postgres::Error>> + Send;
}

/// The service's own unlock of a table whose description names `own::Unlock`: it answers
/// whether the session held the key; `false`, or an error, closes the connection, which ends
/// its session and its locks. See [`Lock`].
#[diagnostic::on_unimplemented(
    message = "`{Self}`'s description names `own::Unlock`, but `{Self}` does not implement `ruststream_tokio_postgres::Unlock`",
    label = "implement `ruststream_tokio_postgres::Unlock` (and `Lock`) for `{Self}`, or remove the custom lock from its description"
)]
pub trait Unlock {
    /// Releases `key` on `client`'s session: whether the session held it.
    fn unlock(
        client: &Client,
        key: &str,
    ) -> impl Future<Output = Result<bool, tokio_postgres::Error>> + Send;
}

/// A function of a custom lock, `Lock::lock` or `Unlock::unlock`, as the broker stores it.
pub type LockFn =
    for<'a> fn(&'a Client, &'a str) -> BoxFuture<'a, Result<bool, tokio_postgres::Error>>;

fn lock_of<'a, T: Lock + 'static>(
    client: &'a Client,
    key: &'a str,
) -> BoxFuture<'a, Result<bool, tokio_postgres::Error>> {
    Box::pin(T::lock(client, key))
}

fn unlock_of<'a, T: Unlock + 'static>(
    client: &'a Client,
    key: &'a str,
) -> BoxFuture<'a, Result<bool, tokio_postgres::Error>> {
    Box::pin(T::unlock(client, key))
}

/// A table's custom lock and unlock, as the broker runs them on the command's connection (the
/// adapter's `Adapter::Lock`).
pub type CustomLock = ruststream::adapter::CustomLock<LockFn>;

/// The custom lock of `T`: its [`Lock`] and [`Unlock`].
pub fn custom_lock<T: Lock + Unlock + 'static>() -> CustomLock {
    CustomLock::new(lock_of::<T>, unlock_of::<T>)
}

/// Picks a row type's custom lock by its description's `Lock` bit ([`True`] where it names
/// `own::Lock` and `own::Unlock`, [`False`] otherwise): a table with one must implement both
/// [`Lock`] and [`Unlock`], or it does not compile.
pub trait PickLock<T> {
    /// `T`'s custom lock, where its description names one.
    fn pick() -> Option<CustomLock>;
}

impl<T: Lock + Unlock + 'static> PickLock<T> for True {
    fn pick() -> Option<CustomLock> {
        Some(custom_lock::<T>())
    }
}

impl<T> PickLock<T> for False {
    fn pick() -> Option<CustomLock> {
        None
    }
}

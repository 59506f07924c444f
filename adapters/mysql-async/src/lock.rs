//! The service's own lock and unlock of a table's keys ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)), on mysql_async's connection.

use std::future::Future;
use std::pin::Pin;

use mysql_async::Conn;
use ruststream_core::spec::bits::{False, True};

/// The service's own lock of a table whose description names `own::Lock`: it tries the key
/// without waiting, on the connection that then holds the job, and answers whether it took
/// it; an error fails the claim and closes the connection ([Custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)).
///
/// ```
/// use mysql_async::Conn;
/// use mysql_async::prelude::Queryable;
/// use ruststream_mysql_async::{Lock, Unlock};
///
/// struct Payout;
///
/// impl Lock for Payout {
///     async fn lock(conn: &mut Conn, key: &str) -> Result<bool, mysql_async::Error> {
///         conn.exec_drop("INSERT IGNORE INTO held_keys (k) VALUES (?)", (key,))
///             .await?;
///         Ok(conn.affected_rows() == 1)
///     }
/// }
///
/// impl Unlock for Payout {
///     async fn unlock(conn: &mut Conn, key: &str) -> Result<bool, mysql_async::Error> {
///         conn.exec_drop("DELETE FROM held_keys WHERE k = ?", (key,))
///             .await?;
///         Ok(conn.affected_rows() == 1)
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}`'s description names `own::Lock`, but `{Self}` does not implement `ruststream_mysql_async::Lock`",
    label = "implement `ruststream_mysql_async::Lock` (and `Unlock`) for `{Self}`, or remove the custom lock from its description"
)]
pub trait Lock {
    /// Tries to take `key` on `conn` without waiting: whether it took it.
    fn lock(
        conn: &mut Conn,
        key: &str,
    ) -> impl Future<Output = Result<bool, mysql_async::Error>> + Send;
}

/// The service's own unlock of a table whose description names `own::Unlock`: it answers
/// whether the session held the key; `false`, or an error, closes the connection, which ends
/// its session and its locks. See [`Lock`].
#[diagnostic::on_unimplemented(
    message = "`{Self}`'s description names `own::Unlock`, but `{Self}` does not implement `ruststream_mysql_async::Unlock`",
    label = "implement `ruststream_mysql_async::Unlock` (and `Lock`) for `{Self}`, or remove the custom lock from its description"
)]
pub trait Unlock {
    /// Releases `key` on `conn`: whether the session held it.
    fn unlock(
        conn: &mut Conn,
        key: &str,
    ) -> impl Future<Output = Result<bool, mysql_async::Error>> + Send;
}

/// The future of a custom lock or unlock, boxed.
pub type LockFuture<'a> =
    Pin<Box<dyn Future<Output = Result<bool, mysql_async::Error>> + Send + 'a>>;

/// A function of a custom lock, `Lock::lock` or `Unlock::unlock`, as the broker stores it.
pub type LockFn = for<'a> fn(&'a mut Conn, &'a str) -> LockFuture<'a>;

fn lock_of<'a, T: Lock + 'static>(conn: &'a mut Conn, key: &'a str) -> LockFuture<'a> {
    Box::pin(T::lock(conn, key))
}

fn unlock_of<'a, T: Unlock + 'static>(conn: &'a mut Conn, key: &'a str) -> LockFuture<'a> {
    Box::pin(T::unlock(conn, key))
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

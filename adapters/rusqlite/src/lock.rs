//! The service's own lock and unlock of a table's keys ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)), on rusqlite's connection.

use rusqlite::Connection;
use ruststream_core::spec::bits::{False, True};

/// The service's own lock of a table whose description names `own::Lock`: it tries the key
/// without waiting, on the connection that then holds the job, and answers whether it took
/// it; an error fails the claim and closes the connection ([Custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)).
///
/// ```
/// use ruststream_rusqlite::rusqlite::{self, Connection};
/// use ruststream_rusqlite::{Lock, Unlock};
///
/// struct Payout;
///
/// impl Lock for Payout {
///     fn lock(conn: &Connection, key: &str) -> rusqlite::Result<bool> {
///         let taken = conn.execute("INSERT OR IGNORE INTO held_keys (key) VALUES (?1)", [key])?;
///         Ok(taken == 1)
///     }
/// }
///
/// impl Unlock for Payout {
///     fn unlock(conn: &Connection, key: &str) -> rusqlite::Result<bool> {
///         let released = conn.execute("DELETE FROM held_keys WHERE key = ?1", [key])?;
///         Ok(released == 1)
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}`'s description names `own::Lock`, but `{Self}` does not implement `ruststream_rusqlite::Lock`",
    label = "implement `ruststream_rusqlite::Lock` (and `Unlock`) for `{Self}`, or remove the custom lock from its description"
)]
pub trait Lock {
    /// Tries to take `key` on `conn` without waiting: whether it took it.
    fn lock(conn: &Connection, key: &str) -> rusqlite::Result<bool>;
}

/// The service's own unlock of a table whose description names `own::Unlock`: it answers
/// whether the session held the key; `false`, or an error, closes the connection, which ends
/// its session. See [`Lock`].
#[diagnostic::on_unimplemented(
    message = "`{Self}`'s description names `own::Unlock`, but `{Self}` does not implement `ruststream_rusqlite::Unlock`",
    label = "implement `ruststream_rusqlite::Unlock` (and `Lock`) for `{Self}`, or remove the custom lock from its description"
)]
pub trait Unlock {
    /// Releases `key` on `conn`: whether the session held it.
    fn unlock(conn: &Connection, key: &str) -> rusqlite::Result<bool>;
}

/// A function of a custom lock: `Lock::lock` or `Unlock::unlock`.
pub type LockFn = fn(&Connection, &str) -> rusqlite::Result<bool>;

/// A table's custom lock and unlock, as the broker runs them on the command's connection (the
/// adapter's `Adapter::Lock`).
pub type CustomLock = ruststream::adapter::CustomLock<LockFn>;

/// The custom lock of `T`: its [`Lock`] and [`Unlock`].
pub fn custom_lock<T: Lock + Unlock>() -> CustomLock {
    CustomLock::new(T::lock, T::unlock)
}

/// Picks a row type's custom lock by its description's `Lock` bit ([`True`] where it names
/// `own::Lock` and `own::Unlock`, [`False`] otherwise): a table with one must implement both
/// [`Lock`] and [`Unlock`], or it does not compile.
pub trait PickLock<T> {
    /// `T`'s custom lock, where its description names one.
    fn pick() -> Option<CustomLock>;
}

impl<T: Lock + Unlock> PickLock<T> for True {
    fn pick() -> Option<CustomLock> {
        Some(custom_lock::<T>())
    }
}

impl<T> PickLock<T> for False {
    fn pick() -> Option<CustomLock> {
        None
    }
}

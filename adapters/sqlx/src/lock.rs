//! The service's own lock and unlock of a table's keys ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)), on sqlx's connections.

use std::future::Future;

use futures::future::BoxFuture;
use ruststream_core::spec::bits::{False, True};
use sqlx::Database;

use crate::db::SqlxDatabase;

/// The service's own lock of a table whose description names `own::Lock`, on `DB`: it tries
/// the key without waiting, on the connection that then holds the job, and answers whether it
/// took it; an error fails the claim and closes the connection ([Custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)).
///
/// ```
/// use ruststream_sqlx::{Lock, Unlock};
/// use sqlx::{Sqlite, SqliteConnection};
///
/// struct Payout;
///
/// impl Lock<Sqlite> for Payout {
///     async fn lock(conn: &mut SqliteConnection, key: &str) -> Result<bool, sqlx::Error> {
///         let taken = sqlx::query("INSERT OR IGNORE INTO held_keys (key) VALUES (?)")
///             .bind(key)
///             .execute(conn)
///             .await?;
///         Ok(taken.rows_affected() == 1)
///     }
/// }
///
/// impl Unlock<Sqlite> for Payout {
///     async fn unlock(conn: &mut SqliteConnection, key: &str) -> Result<bool, sqlx::Error> {
///         let released = sqlx::query("DELETE FROM held_keys WHERE key = ?")
///             .bind(key)
///             .execute(conn)
///             .await?;
///         Ok(released.rows_affected() == 1)
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}`'s description names `own::Lock`, but `{Self}` does not implement `ruststream_sqlx::Lock<{DB}>`",
    label = "implement `ruststream_sqlx::Lock<{DB}>` (and `Unlock<{DB}>`) for `{Self}`, or remove the custom lock from its description"
)]
pub trait Lock<DB: Database> {
    /// Tries to take `key` on `conn` without waiting: whether it took it.
    fn lock(
        conn: &mut <DB as Database>::Connection,
        key: &str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
}

/// The service's own unlock of a table whose description names `own::Unlock`, on `DB`: it
/// answers whether the session held the key; `false`, or an error, closes the connection,
/// which ends its session and its locks. See [`Lock`].
#[diagnostic::on_unimplemented(
    message = "`{Self}`'s description names `own::Unlock`, but `{Self}` does not implement `ruststream_sqlx::Unlock<{DB}>`",
    label = "implement `ruststream_sqlx::Unlock<{DB}>` (and `Lock<{DB}>`) for `{Self}`, or remove the custom lock from its description"
)]
pub trait Unlock<DB: Database> {
    /// Releases `key` on `conn`: whether the session held it.
    fn unlock(
        conn: &mut <DB as Database>::Connection,
        key: &str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
}

/// A function of a custom lock, `Lock::lock` or `Unlock::unlock`, as the broker stores it.
pub type LockFn<DB> = for<'a> fn(
    &'a mut <DB as Database>::Connection,
    &'a str,
) -> BoxFuture<'a, Result<bool, sqlx::Error>>;

fn lock_of<'a, DB, T>(
    conn: &'a mut <DB as Database>::Connection,
    key: &'a str,
) -> BoxFuture<'a, Result<bool, sqlx::Error>>
where
    DB: Database,
    T: Lock<DB> + 'static,
{
    Box::pin(T::lock(conn, key))
}

fn unlock_of<'a, DB, T>(
    conn: &'a mut <DB as Database>::Connection,
    key: &'a str,
) -> BoxFuture<'a, Result<bool, sqlx::Error>>
where
    DB: Database,
    T: Unlock<DB> + 'static,
{
    Box::pin(T::unlock(conn, key))
}

/// A table's custom lock and unlock, as the broker runs them on the command's connection (the
/// adapter's `Adapter::Lock`).
pub type CustomLock<DB> = ruststream::adapter::CustomLock<LockFn<DB>>;

/// The custom lock of `T`: its [`Lock`] and [`Unlock`].
pub fn custom_lock<DB: Database, T: Lock<DB> + Unlock<DB> + 'static>() -> CustomLock<DB> {
    CustomLock::<DB>::new(lock_of::<DB, T>, unlock_of::<DB, T>)
}

/// Picks a row type's custom lock by its description's `Lock` bit ([`True`] where it names
/// `own::Lock` and `own::Unlock`, [`False`] otherwise): a table with one must implement both
/// [`Lock<DB>`] and [`Unlock<DB>`], or it does not compile.
pub trait PickLock<T, DB: SqlxDatabase> {
    /// `T`'s custom lock, where its description names one.
    fn pick() -> Option<CustomLock<DB>>;
}

impl<T, DB> PickLock<T, DB> for True
where
    T: Lock<DB> + Unlock<DB> + 'static,
    DB: SqlxDatabase,
{
    fn pick() -> Option<CustomLock<DB>> {
        Some(custom_lock::<DB, T>())
    }
}

impl<T, DB: SqlxDatabase> PickLock<T, DB> for False {
    fn pick() -> Option<CustomLock<DB>> {
        None
    }
}

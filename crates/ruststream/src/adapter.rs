//! The contract between the runtime and a driver adapter: [`Adapter`] and [`TakesRows`], and
//! for an adapter on a pool, the pool's life ([`Pooled`], from the adapter's [`PoolSource`])
//! and the connections the core names ([`Connections`], over the adapter's
//! [`ConnectionPool`]).

use futures::channel::oneshot;
use futures::stream::BoxStream;
use std::any::Any;

use ruststream_core::{Command, ConnId, DbError, Dialect, ErrorKind, Reply};

use crate::exec::BoxFuture;

mod claim;
mod connections;
mod pooled;
mod threads;

pub use claim::{Claim, CustomLock, LendsClaims};
pub use connections::{ConnFuture, ConnectionPool, Connections, Ending, Lent};
pub use pooled::{PoolSource, Pooled};
pub use threads::{Answer, BlockingDriver, ThreadConn, ThreadSettings, Threads};

/// The notifications one listening session hears ([`Adapter::listen`]): the payload of each,
/// the name of a table with new rows. The stream ends, or answers an error and then ends, when
/// the session is lost; dropping it ends the session.
pub type Notifications = BoxStream<'static, Result<String, DbError>>;

/// Why an adapter could not start.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct AdapterError {
    /// What went wrong, naming the URL, the setting or the table at fault.
    pub message: String,
    /// What kind of failure: the start tries again after one that may pass (a refused or
    /// lost connection), and fails at once on one that cannot ([`ErrorKind::is_permanent`]).
    pub kind: ErrorKind,
}

impl AdapterError {
    /// An error of a setting (a URL that does not parse, a server too old): the start fails
    /// at once.
    pub fn new(message: impl Into<String>) -> Self {
        Self::of(ErrorKind::Config, message)
    }

    /// An error of this kind, as the driver's error maps to it.
    pub fn of(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind,
        }
    }
}

/// A driver adapter: it opens connections, runs the core's commands on them, and maps driver
/// rows and errors into the core's types. It holds no queue logic.
pub trait Adapter: Send + Sync + 'static {
    /// The driver's row, carried to the runtime to decode the message from.
    type Row: Send + 'static;
    /// A custom lock and unlock of a table ([custom locks](https://github.com/ruststream/ruststream/blob/main/docs/src/keys.md#custom-locks)), ready to run on the adapter's
    /// connections.
    type Lock: Clone + Send + Sync + 'static;

    /// Opens what the adapter needs (a pool it builds, for one) and answers the database's
    /// dialect.
    fn start(&self) -> BoxFuture<Result<Dialect, AdapterError>>;

    /// Runs one command and answers it: every command gets exactly one reply, and one cut
    /// short answers [`Reply::Failed`]. The runtime polls all futures in flight on the broker's
    /// own task, so a future must not block its thread; one that panics answers as a failure.
    fn execute(&self, command: Command, lock: Option<Self::Lock>) -> BoxFuture<Reply<Self::Row>>;

    /// Closes what `start` opened, listening sessions included; a pool the service passed in
    /// stays open.
    // A pool the adapter built lends no new connection, and a connection still held closes
    // when it comes back. Every listening session has ended on the server when the close
    // completes; the runtime drops their streams before it closes.
    fn close(&self) -> BoxFuture<()>;

    /// Opens a session that hears of rows other processes publish (on PostgreSQL, `LISTEN` on
    /// [`NOTIFY_CHANNEL`](ruststream_core::NOTIFY_CHANNEL)); it is open when the future answers.
    /// The default, `None`: rows of other processes wait for the next poll.
    fn listen(&self) -> Option<BoxFuture<Result<Notifications, DbError>>> {
        // On PostgreSQL: a connection of its own that runs the dialect's `listen_statement`
        // and streams the notifications' payloads (table names). The runtime calls it after
        // `start`, for a broker with subscriptions, and again after a session is lost (with a
        // pause after a failure); after every session it opens it wakes every subscription,
        // since notifications sent while no session listened are lost.
        None
    }

    /// Whether the adapter's statements are prepared statements kept in the server session;
    /// then the start on PostgreSQL refuses a pooler in transaction pooling ([Poolers](https://github.com/ruststream/ruststream/blob/main/docs/src/adapters.md#poolers-and-postgresql-sessions)).
    /// The default, `false`: statements sent whole, or a database without such poolers.
    fn prepares_statements(&self) -> bool {
        false
    }

    /// Lends the connection the core holds under `conn` (the row lock form's open transaction)
    /// to a handler, as the adapter's own type behind `Any`; `None` where nothing is held there.
    /// The default, `None`: the adapter lends nothing.
    fn lend(&self, conn: ConnId) -> Option<BoxFuture<Option<Box<dyn Any + Send>>>> {
        let _ = conn;
        None
    }
}

/// An adapter that can take rows of `T`: it decodes its rows into `T` and knows `T`'s custom
/// lock, if the table has one.
pub trait TakesRows<T>: Adapter {
    /// The row as `T`.
    fn decode(row: Self::Row) -> Result<T, String>;

    /// The table's custom lock, where its description names one.
    fn custom_lock() -> Option<Self::Lock>;
}

/// A database URL as messages show it: its password replaced by `***`. A `key=value`
/// connection string (`host=db user=app password=secret`) has its `password` so replaced; a URL
/// without a password, and anything else, reads as it was.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() && parsed.set_password(Some("***")).is_ok() {
                parsed.to_string()
            } else {
                url.to_owned()
            }
        }
        Err(_) => url
            .split_whitespace()
            .map(|part| match part.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                _ => part.to_owned(),
            })
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// The order of one connection's commands, for an adapter whose command futures run them
/// themselves: each command takes a [`Turn`] when `execute` is called and waits for the turn
/// before it, whatever order the runtime polls the futures in.
#[derive(Debug, Default)]
pub struct Turns {
    tail: Option<oneshot::Receiver<Link>>,
}

/// What a turn hands the next as it ends: nothing once its own wait is over, or, when it ends
/// before that (its future dropped unpolled), the turn it was still waiting for.
#[derive(Debug)]
struct Link(Option<oneshot::Receiver<Link>>);

impl Turns {
    /// No turn taken yet: the first runs at once.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next turn, behind every turn taken before it.
    pub fn take(&mut self) -> Turn {
        let (mine, next) = oneshot::channel();
        Turn {
            before: self.tail.replace(next),
            mine: Some(mine),
        }
    }
}

/// One command's place in its connection's order ([`Turns`]). It ends when it is dropped (its
/// command answered, or its future dropped), and the next turn then runs once every turn
/// before it has ended too.
#[derive(Debug)]
pub struct Turn {
    before: Option<oneshot::Receiver<Link>>,
    mine: Option<oneshot::Sender<Link>>,
}

impl Turn {
    /// Waits until every turn taken before this one has ended.
    pub async fn wait(&mut self) {
        while let Some(before) = self.before.take() {
            // A turn that ended without waiting hands over the one it waited for.
            if let Ok(Link(earlier)) = before.await {
                self.before = earlier;
            }
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(mine) = self.mine.take() {
            let _ = mine.send(Link(self.before.take()));
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::{Turns, redact_url};

    #[test]
    fn urls_lose_their_passwords() {
        let table = [
            (
                "postgres://app:secret@db:5432/app?sslmode=disable",
                "postgres://app:***@db:5432/app?sslmode=disable",
            ),
            (
                "postgres://postgres@127.0.0.1:5432/test",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
            ("postgres://a:b:c@h/d", "postgres://a:***@h/d"),
            ("postgres://u:p@ss@h/d", "postgres://u:***@h/d"),
            (
                "mysql://app:secret@db:3306/app?pool_max=4",
                "mysql://app:***@db:3306/app?pool_max=4",
            ),
            ("mysql://root@127.0.0.1/test", "mysql://root@127.0.0.1/test"),
            ("sqlite:exports.db?mode=rwc", "sqlite:exports.db?mode=rwc"),
            (
                "host=db user=app password=secret dbname=app",
                "host=db user=app password=*** dbname=app",
            ),
            ("not a url", "not a url"),
        ];
        for (url, shown) in table {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn a_turn_waits_for_every_turn_taken_before_it() {
        let mut turns = Turns::new();
        let mut first = turns.take();
        let second = turns.take();
        let mut third = turns.take();
        assert!(
            first.wait().now_or_never().is_some(),
            "the first runs at once"
        );
        let mut waiting = Box::pin(async move { third.wait().await });
        assert!(waiting.as_mut().now_or_never().is_none(), "behind two");
        drop(first);
        assert!(
            waiting.as_mut().now_or_never().is_none(),
            "behind the second"
        );
        drop(second);
        assert!(waiting.as_mut().now_or_never().is_some());
    }

    #[test]
    fn a_turn_dropped_before_it_waited_keeps_the_next_behind_the_one_before_it() {
        let mut turns = Turns::new();
        let first = turns.take();
        let second = turns.take();
        let mut third = turns.take();
        // The second's future is dropped while the first still runs.
        drop(second);
        let mut waiting = Box::pin(async move { third.wait().await });
        assert!(
            waiting.as_mut().now_or_never().is_none(),
            "still behind the first"
        );
        drop(first);
        assert!(waiting.as_mut().now_or_never().is_some());
    }
}

//! The session that hears of rows other processes publish: a connection of its own, apart from
//! the pool, that runs `LISTEN ruststream` and streams the payloads of its notifications.
//!
//! A task drives the session's connection (tokio-postgres hands notifications to whoever polls
//! it). When the runtime drops the session's stream, the client goes with it: the task lets
//! the connection say goodbye and ends. The broker's close waits for every such task.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::oneshot;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use ruststream::adapter::Notifications;
use ruststream_core::{DbError, Dialect, ErrorKind};
use tokio::task::JoinHandle;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Client, Config, Socket};

use crate::error::db_error;

/// How long an opening waits for its connection and its `LISTEN`.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the close waits for a session's connection to end before it drops it.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The messages a connection sends of its own accord: notifications, notices, a fatal error.
type Messages = BoxStream<'static, Result<AsyncMessage, tokio_postgres::Error>>;

/// Opens a connection of the listening session: its client, and its messages, which drive it.
pub(crate) type Connector = Arc<
    dyn Fn() -> BoxFuture<'static, Result<(Client, Messages), tokio_postgres::Error>> + Send + Sync,
>;

/// A connector of `config` over `tls`.
pub(crate) fn connector<T>(config: Config, tls: T) -> Connector
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    Arc::new(move || {
        let config = config.clone();
        let tls = tls.clone();
        Box::pin(async move {
            let (client, mut connection) = config.connect(tls).await?;
            let messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            Ok((client, messages.boxed()))
        })
    })
}

/// The tasks of a broker's listening sessions, for the close to wait for.
#[derive(Default)]
pub(crate) struct Sessions {
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Sessions {
    fn push(&self, task: JoinHandle<()>) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.retain(|task| !task.is_finished());
        tasks.push(task);
    }

    /// Waits until every session's connection has ended, and every opening with it; a task
    /// that outstays [`CLOSE_TIMEOUT`] is dropped.
    pub(crate) async fn close(&self) {
        loop {
            let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
            if tasks.is_empty() {
                return;
            }
            for task in tasks {
                let abort = task.abort_handle();
                if tokio::time::timeout(CLOSE_TIMEOUT, task).await.is_err() {
                    abort.abort();
                }
            }
        }
    }
}

/// Opens a session on a connection of `connect`. The opening and the session's task run on
/// `runtime`, whatever executor polls the answer.
pub(crate) fn open(
    connect: Connector,
    runtime: tokio::runtime::Handle,
    sessions: Arc<Sessions>,
) -> BoxFuture<'static, Result<Notifications, DbError>> {
    let spawner = runtime.clone();
    let registry = sessions.clone();
    let opening = async move {
        let (client, mut messages) = connect().await.map_err(|e| db_error(&e))?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        registry.push(spawner.spawn(async move {
            loop {
                tokio::select! {
                    message = messages.next() => match message {
                        Some(Ok(AsyncMessage::Notification(notification))) => {
                            let _ = tx.send(Ok(notification.payload().to_owned()));
                        }
                        Some(Ok(_)) => {}
                        Some(Err(error)) => {
                            let _ = tx.send(Err(db_error(&error)));
                            return;
                        }
                        None => return,
                    },
                    () = tx.closed() => break,
                }
            }
            // The stream and its client are gone: the connection sends its goodbye and closes.
            while messages.next().await.is_some() {}
        }));
        let listen = Dialect::Postgres
            .listen_statement()
            .expect("PostgreSQL listens");
        client
            .batch_execute(listen)
            .await
            .map_err(|e| db_error(&e))?;
        // The client lives as long as the stream: dropping the stream ends the session.
        let notifications = futures::stream::unfold((client, rx), |(client, mut rx)| async move {
            let notification = rx.recv().await?;
            Some((notification, (client, rx)))
        });
        Ok::<Notifications, DbError>(notifications.boxed())
    };
    // The opening is a task of the sessions too: one the runtime gave up on still completes,
    // its session ends as its stream drops, and the close waits for both.
    let (answer, answered) = oneshot::channel();
    sessions.push(runtime.spawn(async move {
        let opened = tokio::time::timeout(OPEN_TIMEOUT, opening)
            .await
            .unwrap_or_else(|_| {
                Err(DbError::new(
                    ErrorKind::ConnectionLost,
                    format!(
                        "the listening session did not open within {}s",
                        OPEN_TIMEOUT.as_secs()
                    ),
                ))
            });
        let _ = answer.send(opened);
    }));
    Box::pin(answered.map(|opened| {
        opened.unwrap_or_else(|_| {
            Err(DbError::new(
                ErrorKind::ConnectionLost,
                "the listening session's opening was cut short",
            ))
        })
    }))
}

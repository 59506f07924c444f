//! Hearing of rows other processes publish: the adapter's listening sessions
//! ([`Adapter::listen`]), opened again whenever one is lost, as one stream of notices for the
//! driver.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use futures::stream::BoxStream;
use ruststream_core::{
    Action, Command, CommandId, ConnId, DbError, Dialect, ErrorKind, Output, Reply, Statement,
    StatementKind,
};

use crate::adapter::{Adapter, Notifications};
use crate::exec::{BoxFuture, Executor};

/// What the driver hears.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Notice {
    /// Rows were published into the table this payload names.
    Published(String),
    /// A session opened: what was published while none listened went unheard, so every
    /// subscription looks.
    Listening,
}

/// The pause before the first attempt after a failure; each further failure doubles it.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between attempts.
const MAX_PAUSE: Duration = Duration::from_secs(5);
/// A session that lasted this long ended no failure: the next one opens at once.
const STEADY: Duration = Duration::from_secs(1);

/// The pause after `failures` failures in a row.
fn pause(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (FIRST_PAUSE * 2u32.pow(doublings)).min(MAX_PAUSE)
}

struct Listener<A: Adapter> {
    adapter: Arc<A>,
    exec: Arc<dyn Executor>,
    /// The first session's opening, asked for when the stream was built.
    first: Option<BoxFuture<Result<Notifications, DbError>>>,
    /// The first session, opened and heard at the start ([`probe`]): the stream begins with
    /// its [`Notice::Listening`].
    probed: Option<Notifications>,
    /// The open session, and when it opened.
    session: Option<(Notifications, Instant)>,
    /// Failures in a row: openings that failed, sessions lost soon after they opened.
    failures: u32,
    /// Whether the current outage has been logged.
    warned: bool,
}

impl<A: Adapter> Listener<A> {
    /// The next notice; `None` once the adapter opens no more sessions.
    async fn next(&mut self) -> Option<Notice> {
        loop {
            if let Some((session, opened)) = &mut self.session {
                match session.next().await {
                    Some(Ok(payload)) => return Some(Notice::Published(payload)),
                    Some(Err(error)) => {
                        tracing::debug!("the session listening for publishes failed: {error}");
                    }
                    None => tracing::debug!("the session listening for publishes ended"),
                }
                if opened.elapsed() < STEADY {
                    self.failures += 1;
                } else {
                    self.failures = 0;
                }
                self.session = None;
                continue;
            }
            if let Some(session) = self.probed.take() {
                self.session = Some((session, Instant::now()));
                return Some(Notice::Listening);
            }
            if self.failures > 0 {
                self.exec.sleep(pause(self.failures)).await;
            }
            let open = match self.first.take() {
                Some(open) => open,
                None => self.adapter.listen()?,
            };
            match open.await {
                Ok(session) => {
                    if std::mem::take(&mut self.warned) {
                        tracing::info!("listening for other processes' publishes again");
                    }
                    self.session = Some((session, Instant::now()));
                    return Some(Notice::Listening);
                }
                Err(error) => {
                    self.failures += 1;
                    if !std::mem::replace(&mut self.warned, true) {
                        tracing::warn!(
                            "cannot listen for other processes' publishes, retrying; their rows wait for the poll meanwhile: {error}"
                        );
                    }
                }
            }
        }
    }
}

/// How long the start waits to hear its own probe notification.
pub(crate) const PROBE_WAIT: Duration = Duration::from_secs(10);

/// What the start's probe of the listening session found.
pub(crate) enum Probe {
    /// The adapter does not listen.
    NotListening,
    /// The session could not open, or the probe could not be sent: the listener opens it
    /// again as after any failure.
    Later,
    /// The session heard the probe: the listener's first session.
    Heard(Notifications),
    /// The session opened but did not hear a notification sent through the pool.
    Deaf,
    /// The notification came back on the pool's connection that sent it, whose server session
    /// listens too ([`ErrorKind::SharedSession`]).
    Shared(DbError),
}

/// At the start, where the adapter listens: opens the listening session, sends a notification
/// of its own through the pool, and waits up to [`PROBE_WAIT`] to hear it. Through a pooler in
/// transaction pooling the session hears nothing.
pub(crate) async fn probe<A: Adapter>(
    adapter: &A,
    dialect: Dialect,
    exec: &Arc<dyn Executor>,
) -> Probe {
    let Some(open) = adapter.listen() else {
        return Probe::NotListening;
    };
    let mut session = match open.await {
        Ok(session) => session,
        Err(error) => {
            tracing::debug!("the listening session did not open at the start: {error}");
            return Probe::Later;
        }
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let payload = format!("ruststream-listen-check {nanos}.{}", std::process::id());
    let Some(sql) = dialect.notify_statement(&payload) else {
        return Probe::NotListening;
    };
    if let Err(failed) = send_probe(adapter, sql).await {
        return failed;
    }
    let heard = async {
        while let Some(notice) = session.next().await {
            if matches!(&notice, Ok(p) if *p == payload) {
                return true;
            }
        }
        false
    };
    let timeout = exec.sleep(PROBE_WAIT);
    futures::pin_mut!(heard);
    match futures::future::select(heard, timeout).await {
        futures::future::Either::Left((true, _)) => Probe::Heard(session),
        // The session ended before the probe came: it opens again as after a loss.
        futures::future::Either::Left((false, _)) => Probe::Later,
        futures::future::Either::Right(((), _)) => Probe::Deaf,
    }
}

/// Sends the probe's notification (`sql`) through the pool, on a connection of its own;
/// on a failure, what the probe concludes: try later, or the pool's session listens too.
async fn send_probe<A: Adapter>(adapter: &A, sql: String) -> Result<(), Probe> {
    let conn = ConnId(u64::MAX);
    let statement = Statement {
        kind: StatementKind::Notify,
        sql: sql.into(),
        args: Arc::from([]),
        output: Output::Nothing,
    };
    let mut sent = true;
    let mut shared = None;
    for (i, action) in [
        Action::Acquire,
        Action::Execute {
            statement,
            binds: Vec::new(),
        },
        Action::Release,
    ]
    .into_iter()
    .enumerate()
    {
        let acquire = matches!(action, Action::Acquire);
        let command = Command {
            id: CommandId(u64::MAX - i as u64),
            conn,
            action,
        };
        if let Reply::Failed(error) = adapter.execute(command, None).await {
            tracing::debug!("the start's probe notification failed: {error}");
            if acquire {
                return Err(Probe::Later);
            }
            if sent && error.kind == ErrorKind::SharedSession {
                shared = Some(error);
            }
            sent = false;
        }
    }
    if sent {
        return Ok(());
    }
    let close = Command {
        id: CommandId(u64::MAX - 3),
        conn,
        action: Action::Close,
    };
    let _ = adapter.execute(close, None).await;
    Err(shared.map_or(Probe::Later, Probe::Shared))
}

/// The notices of the adapter's listening sessions, or `None` where the adapter does not
/// listen. Dropping the stream ends the session it holds. `probed`: the first session, opened
/// at the start.
pub(crate) fn notices<A: Adapter>(
    adapter: Arc<A>,
    exec: Arc<dyn Executor>,
    probed: Option<Notifications>,
) -> Option<BoxStream<'static, Notice>> {
    let first = match probed {
        Some(_) => None,
        None => Some(adapter.listen()?),
    };
    let listener = Listener {
        adapter,
        exec,
        first,
        probed,
        session: None,
        failures: 0,
        warned: false,
    };
    Some(
        futures::stream::unfold(listener, |mut listener| async move {
            let notice = listener.next().await?;
            Some((notice, listener))
        })
        .boxed(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_limit() {
        assert_eq!(pause(1), Duration::from_millis(100));
        assert_eq!(pause(2), Duration::from_millis(200));
        assert_eq!(pause(4), Duration::from_millis(800));
        assert_eq!(pause(7), MAX_PAUSE);
        assert_eq!(pause(u32::MAX), MAX_PAUSE);
    }
}

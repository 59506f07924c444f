//! Hearing of rows other processes publish: the adapter's listening sessions
//! ([`Adapter::listen`]), opened again whenever one is lost, as one stream of notices for the
//! driver.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use ruststream_core::DbError;

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

/// The notices of the adapter's listening sessions, or `None` where the adapter does not
/// listen. Dropping the stream ends the session it holds.
pub(crate) fn notices<A: Adapter>(
    adapter: Arc<A>,
    exec: Arc<dyn Executor>,
) -> Option<BoxStream<'static, Notice>> {
    let first = adapter.listen()?;
    let listener = Listener {
        adapter,
        exec,
        first: Some(first),
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

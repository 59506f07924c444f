//! What a handler may return: a [`HandlerOutcome`], or a `Result` whose error retries the
//! message (or fails it, where the error says waiting cannot cure it), so `?` works.

use std::fmt;

use crate::app::BoxError;
use crate::outcome::HandlerOutcome;

/// What a `#[subscriber]` function returns: a `HandlerOutcome`, or a `Result` whose `Ok`
/// acknowledges the job and whose `Err(e)` retries it with `e` and its sources as the error
/// ([`Permanent`] fails it; an `e` that is a `HandlerOutcome` settles as that outcome).
#[diagnostic::on_unimplemented(
    message = "a subscriber returns `HandlerOutcome`, `Result<(), E>` or `Result<HandlerOutcome, E>`, not `{Self}`",
    label = "the handler's return type",
    note = "`E` is any error that converts into `Box<dyn Error + Send + Sync>`, so `?` works"
)]
pub trait IntoOutcome {
    /// The outcome the message settles by.
    fn into_outcome(self) -> HandlerOutcome;
}

impl IntoOutcome for HandlerOutcome {
    fn into_outcome(self) -> HandlerOutcome {
        self
    }
}

impl<E: Into<BoxError>> IntoOutcome for Result<(), E> {
    fn into_outcome(self) -> HandlerOutcome {
        match self {
            Ok(()) => HandlerOutcome::ack(),
            Err(error) => outcome_of(error.into()),
        }
    }
}

impl<E: Into<BoxError>> IntoOutcome for Result<HandlerOutcome, E> {
    fn into_outcome(self) -> HandlerOutcome {
        match self {
            Ok(outcome) => outcome,
            Err(error) => outcome_of(error.into()),
        }
    }
}

/// The outcome of a handler's error: the outcome it carries, a rejection for a
/// [`Permanent`] one, a retry otherwise; each with the error's text and its sources'.
fn outcome_of(error: BoxError) -> HandlerOutcome {
    let error = match error.downcast::<HandlerOutcome>() {
        Ok(outcome) => return *outcome,
        Err(error) => error,
    };
    match error.downcast::<Permanent>() {
        Ok(permanent) => HandlerOutcome::reject().with_error(chain(&*permanent.0)),
        Err(error) => HandlerOutcome::retry().with_error(chain(&*error)),
    }
}

/// An error and its sources, as one line: `outer: inner: root`.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        // An error that prints its source already is not repeated.
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

/// An error that waiting cannot cure: a handler that returns it fails its message at once
/// (the row is marked failed where its table keeps failed rows), with the error as the
/// row's error. Make one with [`permanent`], as in `.map_err(ruststream::permanent)?`.
#[derive(Debug)]
pub struct Permanent(BoxError);

impl fmt::Display for Permanent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Permanent {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// `error` as one that fails its message at once: `.map_err(ruststream::permanent)?`.
pub fn permanent(error: impl Into<BoxError>) -> Permanent {
    Permanent(error.into())
}

impl fmt::Display for HandlerOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.outcome() {
            ruststream_core::Outcome::Ack => "acknowledged",
            ruststream_core::Outcome::Retry => "retried",
            ruststream_core::Outcome::Reject => "rejected",
        };
        match self.error() {
            Some(error) => write!(f, "{what}: {error}"),
            None => f.write_str(what),
        }
    }
}

/// A `HandlerOutcome` is an error too, so `Err(HandlerOutcome::reject().with_error(e))?`
/// settles as that outcome in a handler that returns a `Result`.
impl std::error::Error for HandlerOutcome {}

#[cfg(test)]
mod tests {
    use super::*;
    use ruststream_core::Outcome;

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the mail server refused")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn refused() -> Outer {
        Outer(std::io::Error::other("connection reset"))
    }

    #[test]
    fn ok_acknowledges_and_an_error_retries_with_its_sources() {
        assert_eq!(Ok::<(), BoxError>(()).into_outcome(), HandlerOutcome::ack());
        let retried = Err::<(), _>(refused()).into_outcome();
        assert_eq!(retried.outcome(), Outcome::Retry);
        assert_eq!(
            retried.error(),
            Some("the mail server refused: connection reset")
        );
        let kept = Ok::<_, BoxError>(HandlerOutcome::retry_in(std::time::Duration::from_secs(3)));
        assert_eq!(
            kept.into_outcome().delay(),
            Some(std::time::Duration::from_secs(3))
        );
    }

    #[test]
    fn a_permanent_error_or_an_outcome_through_question_mark_settles_as_it_says() {
        fn handler(permanent_error: bool) -> Result<(), BoxError> {
            if permanent_error {
                let sent: Result<(), Outer> = Err(refused());
                sent.map_err(permanent)?;
            }
            Err(HandlerOutcome::reject().with_error("not a customer"))?;
            Ok(())
        }
        let failed = handler(true).into_outcome();
        assert_eq!(failed.outcome(), Outcome::Reject);
        assert_eq!(
            failed.error(),
            Some("the mail server refused: connection reset")
        );
        let rejected = handler(false).into_outcome();
        assert_eq!(rejected.outcome(), Outcome::Reject);
        assert_eq!(rejected.error(), Some("not a customer"));
    }
}

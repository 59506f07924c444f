// Handlers as a Rust developer writes them: a `Result` with `?`, the message by value, every
// option on the subscriber, workers as a plain integer.
use std::time::Duration;

use ruststream::{BoxError, HandlerOutcome, Inbox, InboxQueue, RetryPolicy, permanent, subscriber};

#[derive(Inbox)]
#[inbox(table = "email_jobs")]
struct SendEmail {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

#[derive(Clone, serde::Deserialize)]
struct Email {
    to: String,
}

fn parse(to: &str) -> Result<u32, std::num::ParseIntError> {
    to.parse()
}

#[subscriber(InboxQueue::<SendEmail>::new("emails"))]
async fn send(email: Email) -> Result<(), BoxError> {
    let n = parse(&email.to)?;
    if n == 0 {
        return Err(HandlerOutcome::reject().with_error("no recipient").into());
    }
    parse("x").map_err(permanent)?;
    Ok(())
}

#[subscriber(InboxQueue::<SendEmail>::new("emails"))]
async fn later(email: &Email) -> Result<HandlerOutcome, std::io::Error> {
    let _ = &email.to;
    Ok(HandlerOutcome::retry_in(Duration::from_secs(5)))
}

fn main() {
    let _ = send
        .workers(8)
        .retry_policy(RetryPolicy::fixed(Duration::from_secs(1)))
        .max_attempts(8)
        .timeout(Duration::from_secs(30))
        .prefetch(2);
    let _ = later.workers(std::num::NonZeroUsize::new(2).unwrap()).ensure_schema();
    // Hooks without a placeholder argument, and the spec's form.
    let _ = ruststream::RustStream::new(ruststream::AppInfo::new("mail", "0.1.0"))
        .on_startup(async || Ok::<(), std::io::Error>(()))
        .on_startup(async move |()| Ok::<(), BoxError>(()))
        .on_started(async || Ok::<(), BoxError>(()));
}

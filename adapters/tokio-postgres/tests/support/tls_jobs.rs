//! The message and handler of the TLS tests of both PostgreSQL adapters (this crate's
//! `tests/tls.rs` and ruststream-sqlx's, which pulls this file in by its path).

use std::sync::{Arc, Mutex};

use ruststream::{Context, Handle, HandlerOutcome};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Job {
    pub n: u32,
}

/// Records the messages it handles.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<Vec<u32>>>);

impl Seen {
    /// The messages handled so far, in order of their numbers.
    pub fn all(&self) -> Vec<u32> {
        let mut all = self.0.lock().unwrap().clone();
        all.sort_unstable();
        all
    }
}

impl Handle<Job> for Seen {
    async fn handle(
        &self,
        job: &Job,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        self.0.lock().unwrap().push(job.n);
        Ok(())
    }
}

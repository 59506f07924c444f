//! The scenarios: one `pub async fn` each, generic over the suite's rows ([`Rows`]) and a
//! [`Harness`] that runs the scenario's tables ([`Runs`]), asserting what it names. A failed
//! assertion panics with the scenario, the harness, the form and the table; a scenario that
//! does not apply answers [`NotApplicable`].
//!
//! [`Rows`]: crate::Rows
//!
//! - Settlement (`settle.rs`): [`claim_order`], [`ack_deletes`], [`ack_marks_processed`],
//!   [`retry_counts_the_attempt`].
//! - Failures (`failures.rs`): [`reject_keeps_the_row_failed`], [`undecodable_rows_fail`],
//!   [`delayed_retry_waits`], [`max_attempts_fails_the_row`],
//!   [`crashing_worker_fails_its_row`], [`panics_and_timeouts_retry`],
//!   [`failed_rows_redriven_or_deleted`], [`role_fields_checked_at_start`].
//! - Keys (`keys.rs`): [`key_one_at_a_time`], [`key_held_elsewhere`],
//!   [`custom_lock_answers`], [`workers`].
//! - Leases (`lease.rs`): [`lease_extended_while_in_work`], [`lease_acks_together`],
//!   [`lease_marks_together`].
//! - Rows claimed ahead (`ahead.rs`): [`claims_ahead`].
//! - Shutdown (`shutdown.rs`): [`shutdown_releases_locks`],
//!   [`shutdown_counts_locks_released`], [`lease_kept_past_shutdown`],
//!   [`publisher_closed_after_shutdown`], [`publish_all_writes_every_row`].
//! - Crashes (`crash.rs`): [`panicking_handler_returns_the_row`], [`sigkill_worker`],
//!   [`killed_connection`], [`killed_while_claimed_ahead`].
//! - The claim extractor (`claim.rs`): [`claim_commits_with_the_ack`].
//! - What a start refuses (`start.rs`): [`missing_table_fails_the_start`].
//! - Metrics (`metrics.rs`): [`service_records_its_metrics`], [`brokers_add_their_gauges`].
//! - The outbox (`outbox.rs`): [`outbox_commits_with_the_transaction`].
//! - Deduplicated publishes (`dedup.rs`): [`outbox_skips_rows_already_there`].
//! - Scaling out (`scale.rs`): [`brokers_count_each_take_once`], [`two_brokers_share_keys`],
//!   [`free_keys_flow_past_a_held_key`], [`hot_key_long_handler`].
//! - The core's statements on a session of the harness's own (`statements_lease.rs`,
//!   `statements_keys.rs`, `statements_rows.rs`, `statements_count.rs`):
//!   [`statements_lease_form`],
//!   [`statements_lease_claim_reads_back_the_expiry_it_wrote`],
//!   [`statements_lease_settlements_in_one_statement`],
//!   [`statements_lease_claims_skip_held_rows`], [`statements_advisory_form`],
//!   [`statements_advisory_take_reads_only_claimable_rows`], [`statements_row_lock_form`],
//!   [`statements_row_lock_counts_the_attempt_before_it_locks`].

mod ahead;
mod claim;
mod crash;
mod dedup;
mod failures;
mod keys;
mod lease;
mod metrics;
mod outbox;
mod scale;
mod settle;
mod shutdown;
mod start;
mod statements_count;
mod statements_keys;
mod statements_lease;
mod statements_rows;

pub use ahead::claims_ahead;
pub use claim::claim_commits_with_the_ack;
pub use crash::{
    killed_connection, killed_while_claimed_ahead, panicking_handler_returns_the_row,
    sigkill_worker,
};
pub use dedup::outbox_skips_rows_already_there;
pub use failures::{
    crashing_worker_fails_its_row, delayed_retry_waits, failed_rows_redriven_or_deleted,
    failing_row_waits_its_delay, max_attempts_fails_the_row, panics_and_timeouts_retry,
    reject_keeps_the_row_failed, role_fields_checked_at_start, undecodable_rows_fail,
};
pub use keys::{custom_lock_answers, key_held_elsewhere, key_one_at_a_time, workers};
pub use lease::{lease_acks_together, lease_extended_while_in_work, lease_marks_together};
pub use metrics::{brokers_add_their_gauges, service_records_its_metrics};
pub use outbox::outbox_commits_with_the_transaction;
pub use scale::{
    brokers_count_each_take_once, free_keys_flow_past_a_held_key, hot_key_long_handler,
    two_brokers_share_keys,
};
pub use settle::{ack_deletes, ack_marks_processed, claim_order, retry_counts_the_attempt};
pub use shutdown::{
    lease_kept_past_shutdown, publish_all_writes_every_row, publisher_closed_after_shutdown,
    shutdown_counts_locks_released, shutdown_releases_locks,
};
pub use start::missing_table_fails_the_start;
pub use statements_count::statements_row_lock_counts_the_attempt_before_it_locks;
pub use statements_keys::{
    statements_advisory_form, statements_advisory_take_reads_only_claimable_rows,
};
pub use statements_lease::{
    statements_lease_claim_reads_back_the_expiry_it_wrote, statements_lease_claims_skip_held_rows,
    statements_lease_form, statements_lease_settlements_in_one_statement,
};
pub use statements_rows::statements_row_lock_form;

use crate::harness::{Harness, Runs, Support};
use crate::rows::{Body, Tables};
use crate::schema::TableSpec;
use crate::support::Cx;
use crate::{Form, NotApplicable, TestName, Verdict};

/// Runs `body` on `F`'s table of `form`: checks that the form applies, prepares the database
/// and the tables, runs the body, and cleans up after a pass.
async fn run<H: Runs<F>, F: Tables, B: Body>(
    harness: &H,
    form: Form,
    test: &TestName,
    body: B,
) -> Verdict {
    harness.runs(form)?;
    let cx = Cx::prepare(harness, table::<F>(form), test).await;
    H::on_form(form, body, &cx)?.await;
    if let Err(error) = harness.cleanup(&cx.db).await {
        println!("{cx}: cleaning up failed: {error}");
    }
    Ok(())
}

/// The table of `F` in `form`.
fn table<F: Tables>(form: Form) -> TableSpec {
    TableSpec {
        name: F::table(form),
        form,
        processed: F::PROCESSED,
        failing: F::FAILING,
    }
}

/// `Ok` where the harness supports it, else why not.
fn needs<H: Harness>(harness: &H, support: Support) -> Verdict {
    match support {
        Support::Yes => Ok(()),
        Support::No(reason) => Err(NotApplicable {
            harness: harness.name(),
            reason: reason.to_owned(),
        }),
    }
}

/// Implements [`Body`] for a unit struct by calling a generic async fn.
macro_rules! body {
    ($body:ident => $f:ident) => {
        struct $body;

        impl crate::rows::Body for $body {
            fn run<'a, H: crate::Harness, T: crate::rows::SuiteRow>(
                self,
                cx: &'a crate::support::Cx<'a, H>,
            ) -> futures::future::LocalBoxFuture<'a, ()>
            where
                H::Adapter: ruststream::adapter::TakesRows<T>,
            {
                Box::pin($f::<H, T>(cx))
            }
        }
    };
}

use body;

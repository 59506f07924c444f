//! What a subscriber does with failures: how long a retry waits ([`RetryPolicy`]), and who
//! hears of a failed row ([`Failure`]).

use std::sync::Arc;
use std::time::Duration;

use ruststream_core::Value;

/// How long a retried job waits, by the attempt that failed: `base * 2^(attempt - 1)`, at
/// most `cap`, each delay moved at random by up to `jitter` of itself. The default: 1 s,
/// doubling up to an hour, jitter 20 % ([Retries](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#retries-and-backoff)).
///
/// ```
/// use std::time::Duration;
/// use ruststream::RetryPolicy;
///
/// let policy = RetryPolicy::exponential(Duration::from_millis(100), Duration::from_secs(60)).jitter(0.0);
/// assert_eq!(policy.delay(1), Duration::from_millis(100));
/// assert_eq!(policy.delay(4), Duration::from_millis(800));
/// assert_eq!(policy.delay(30), Duration::from_secs(60));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    base: Duration,
    cap: Duration,
    jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::exponential(Duration::from_secs(1), Duration::from_secs(3600))
    }
}

impl RetryPolicy {
    /// Doubling from `base` after the first attempt, at most `cap`, with a jitter of 20 %.
    pub const fn exponential(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            jitter: 0.2,
        }
    }

    /// The same delay after every attempt, without jitter.
    pub const fn fixed(delay: Duration) -> Self {
        Self {
            base: delay,
            cap: delay,
            jitter: 0.0,
        }
    }

    /// No wait: a retried row is due again at once.
    pub const fn immediate() -> Self {
        Self::fixed(Duration::ZERO)
    }

    /// The same policy, each delay moved at random by up to `fraction` of itself (clamped to
    /// `0.0..=1.0`).
    pub const fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction.clamp(0.0, 1.0);
        self
    }

    /// The delay after attempt `attempt` (1 for the first), jitter included.
    pub fn delay(&self, attempt: i64) -> Duration {
        let doublings = u32::try_from(attempt.saturating_sub(1).clamp(0, 63)).unwrap_or(63);
        let raw = self
            .base
            .checked_mul(1u32.checked_shl(doublings.min(31)).unwrap_or(u32::MAX))
            .unwrap_or(self.cap)
            .min(self.cap);
        if self.jitter == 0.0 || raw.is_zero() {
            return raw;
        }
        let spread = (fastrand::f64() * 2.0 - 1.0) * self.jitter;
        raw.mul_f64((1.0 + spread).max(0.0))
            .min(self.cap.mul_f64(1.0 + self.jitter))
    }
}

/// A row that failed: rejected by its handler, past its attempt budget, or not decodable.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Failure {
    /// The table.
    pub table: &'static str,
    /// The subscription.
    pub subscription: &'static str,
    /// The row's id.
    pub id: Value,
    /// The attempt that failed, where the table counts them.
    pub attempt: Option<i64>,
    /// Why, as recorded in the row's error column.
    pub error: Option<Arc<str>>,
    /// Whether the row is kept, marked failed (`true`); on a table without a `failed_at`
    /// column the row returns to the queue instead (`false`).
    pub kept: bool,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "table `{}`: row {} failed in subscription `{}`",
            self.table, self.id, self.subscription
        )?;
        if let Some(attempt) = self.attempt {
            write!(f, " at attempt {attempt}")?;
        }
        if let Some(error) = &self.error {
            write!(f, ": {error}")?;
        }
        if self.kept {
            write!(f, "; the row is kept, marked failed")
        } else {
            write!(
                f,
                "; the table has no failed_at column, so the row returns to the queue"
            )
        }
    }
}

/// What a subscriber calls with each failed row ([`SubscriberBuilder::on_failure`](crate::SubscriberBuilder::on_failure)).
pub type FailureHook = Arc<dyn Fn(&Failure) + Send + Sync>;

/// A subscriber's handling of failures.
#[derive(Clone, Default)]
pub(crate) struct Failures {
    pub(crate) policy: RetryPolicy,
    pub(crate) timeout: Option<Duration>,
    pub(crate) hook: Option<FailureHook>,
}

impl std::fmt::Debug for Failures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failures")
            .field("policy", &self.policy)
            .field("timeout", &self.timeout)
            .field("hook", &self.hook.is_some())
            .finish()
    }
}

impl Failures {
    /// Reports a failure to the hook where one is set, else as a `tracing` error (and on
    /// standard error where no `tracing` subscriber is installed), so it is never silent.
    // A row that returns to the queue (a table without `failed_at`) and fails again is told
    // of at attempts 1, 2, 4, 8, ..: the rest go to `tracing` at debug level.
    pub(crate) fn report(&self, failure: &Failure) {
        if let Some(hook) = &self.hook {
            hook(failure);
            return;
        }
        if !worth_telling(failure) {
            tracing::debug!(
                table = failure.table,
                subscription = failure.subscription,
                id = %failure.id,
                attempt = failure.attempt,
                "{failure}"
            );
            return;
        }
        tracing::error!(
            table = failure.table,
            subscription = failure.subscription,
            id = %failure.id,
            attempt = failure.attempt,
            kept = failure.kept,
            "{failure}"
        );
        if !tracing::dispatcher::has_been_set() {
            eprintln!("ruststream: {failure}");
        }
    }
}

/// Whether the default report tells of `failure` at error level: every failure of a row
/// that is kept, and a returning row's at its attempts 1, 2, 4, 8, ...
fn worth_telling(failure: &Failure) -> bool {
    failure.kept
        || failure
            .attempt
            .is_none_or(|a| a <= 1 || u64::try_from(a).is_ok_and(u64::is_power_of_two))
}

/// An error a service must see: a `tracing` error, and a line on standard error where no
/// `tracing` subscriber is installed.
pub(crate) fn visible_error(message: &str) {
    tracing::error!("{message}");
    if !tracing::dispatcher::has_been_set() {
        eprintln!("ruststream: {message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_doubles_from_a_second_up_to_an_hour_within_its_jitter() {
        let policy = RetryPolicy::default();
        for (attempt, secs) in [(1, 1.0), (2, 2.0), (3, 4.0), (10, 512.0), (40, 3600.0)] {
            for _ in 0..50 {
                let d = policy.delay(attempt).as_secs_f64();
                assert!(
                    d >= secs * 0.8 - 1e-9 && d <= secs * 1.2 + 1e-9,
                    "attempt {attempt}: {d}"
                );
            }
        }
    }

    #[test]
    fn jitter_spreads_the_delays() {
        let policy = RetryPolicy::fixed(Duration::from_secs(10)).jitter(0.5);
        let delays: std::collections::BTreeSet<u128> =
            (0..20).map(|_| policy.delay(1).as_millis()).collect();
        assert!(delays.len() > 5, "{delays:?}");
        assert!(delays.iter().all(|&d| (5_000..=15_000).contains(&d)));
    }

    #[test]
    fn a_returning_row_is_told_of_at_powers_of_two() {
        let failure = |attempt, kept| Failure {
            table: "jobs",
            subscription: "jobs",
            id: Value::Int(1),
            attempt,
            error: None,
            kept,
        };
        let told: Vec<i64> = (1..=20)
            .filter(|&a| worth_telling(&failure(Some(a), false)))
            .collect();
        assert_eq!(told, [1, 2, 4, 8, 16]);
        assert!(worth_telling(&failure(Some(7), true)));
        assert!(worth_telling(&failure(None, false)));
    }

    #[test]
    fn immediate_and_fixed_do_not_move() {
        assert_eq!(RetryPolicy::immediate().delay(7), Duration::ZERO);
        assert_eq!(
            RetryPolicy::fixed(Duration::from_secs(3)).delay(9),
            Duration::from_secs(3)
        );
        assert!(RetryPolicy::default().delay(0) <= Duration::from_millis(1_200));
    }
}

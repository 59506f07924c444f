//! What a handler answers: a deterministic function of (job, attempt), so the parent can
//! tell from the log alone what each row's end should be.

use std::time::Duration;

use clap::ValueEnum;

/// How the handlers answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// 5 % of the jobs reject, 5 % always retry (so they end failed past the budget), 20 %
    /// retry at their first attempt, the others acknowledge.
    Normal,
    /// retry_storm: 3 % reject, 5 % always retry, 42 % retry at their first two attempts, 40
    /// % at their first, 10 % acknowledge at once.
    Storm,
    /// poison_rows, on a table that keeps no failed rows: 20 % retry at their first attempt,
    /// the others acknowledge (the poison rows never reach the handler).
    Poison,
}

/// The delay of a retry in the normal mode (`RetryPolicy::fixed`).
pub const RETRY_DELAY: Duration = Duration::from_millis(100);
/// The delay of a retry, and of a poison row's next take, in poison_rows.
pub const POISON_DELAY: Duration = Duration::from_secs(1);

impl Mode {
    /// The delay a retried row waits before its next attempt: [`RETRY_DELAY`] in the normal
    /// mode, none in the storm (`RetryPolicy::immediate`), [`POISON_DELAY`] in poison_rows.
    pub fn retry_delay(self) -> Duration {
        match self {
            Mode::Normal => RETRY_DELAY,
            Mode::Storm => Duration::ZERO,
            Mode::Poison => POISON_DELAY,
        }
    }

    /// The name `--mode` takes.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Normal => "normal",
            Mode::Storm => "storm",
            Mode::Poison => "poison",
        }
    }
}

/// A handler's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledge: the row is deleted.
    Ack,
    /// Retry: the row returns for its next attempt.
    Retry,
    /// Reject: the row is marked failed with [`reject_error`].
    Reject,
}

impl Outcome {
    /// The name the log records.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ack => "ack",
            Outcome::Retry => "retry",
            Outcome::Reject => "reject",
        }
    }

    /// The outcome of a name the log recorded.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "ack" => Some(Outcome::Ack),
            "retry" => Some(Outcome::Retry),
            "reject" => Some(Outcome::Reject),
            _ => None,
        }
    }
}

/// The error a rejection writes, and how the check recognizes it.
pub const REJECT_PREFIX: &str = "chaos: rejected";

/// The error text of job `job`'s rejection at `attempt`.
pub fn reject_error(job: i64, attempt: i64) -> String {
    format!("{REJECT_PREFIX} job {job} at attempt {attempt}")
}

/// A well-mixed 64-bit hash (splitmix64's finalizer).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Job `job`'s class, 0..100.
fn class(job: i64) -> u64 {
    mix(job as u64) % 100
}

/// What the handler of `job` answers at `attempt`.
pub fn outcome(mode: Mode, job: i64, attempt: i64) -> Outcome {
    let c = class(job);
    let (reject, always, twice, once) = match mode {
        Mode::Normal => (5, 10, 10, 30),
        Mode::Storm => (3, 8, 50, 90),
        Mode::Poison => (0, 0, 0, 20),
    };
    if c < reject {
        Outcome::Reject
    } else if c < always {
        Outcome::Retry
    } else if c < twice {
        if attempt <= 2 {
            Outcome::Retry
        } else {
            Outcome::Ack
        }
    } else if c < once {
        if attempt <= 1 {
            Outcome::Retry
        } else {
            Outcome::Ack
        }
    } else {
        Outcome::Ack
    }
}

/// How long the handler of `job` works at `attempt`: 50 % to 150 % of `mean_ms`.
pub fn work(mean_ms: u64, job: i64, attempt: i64) -> Duration {
    if mean_ms == 0 {
        return Duration::ZERO;
    }
    let spread = mix((job as u64) ^ ((attempt as u64) << 40)) % (mean_ms * 1000 + 1);
    Duration::from_micros(mean_ms * 500 + spread)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(mode: Mode, pick: impl Fn(i64) -> bool) -> f64 {
        let hits = (1..=10_000).filter(|&job| pick(job)).count();
        let _ = mode;
        hits as f64 / 10_000.0
    }

    #[test]
    fn the_classes_have_about_their_shares() {
        let rejects = share(Mode::Normal, |j| {
            outcome(Mode::Normal, j, 1) == Outcome::Reject
        });
        assert!((0.04..0.06).contains(&rejects), "{rejects}");
        let acks_at_once = share(Mode::Normal, |j| {
            outcome(Mode::Normal, j, 1) == Outcome::Ack
        });
        assert!((0.67..0.73).contains(&acks_at_once), "{acks_at_once}");
        let poison_retries = share(Mode::Poison, |j| {
            outcome(Mode::Poison, j, 1) == Outcome::Retry
        });
        assert!((0.18..0.22).contains(&poison_retries), "{poison_retries}");
        assert!((1..1000).all(|j| outcome(Mode::Poison, j, 2) == Outcome::Ack));
        let storm_retries = share(Mode::Storm, |j| {
            outcome(Mode::Storm, j, 1) == Outcome::Retry
        });
        assert!((0.85..0.89).contains(&storm_retries), "{storm_retries}");
    }

    #[test]
    fn outcomes_are_a_function_of_job_and_attempt() {
        for job in 1..500 {
            for attempt in 1..6 {
                assert_eq!(
                    outcome(Mode::Storm, job, attempt),
                    outcome(Mode::Storm, job, attempt)
                );
            }
            // A job that always retries retries at every attempt; the others end.
            let late = outcome(Mode::Normal, job, 9);
            let first = outcome(Mode::Normal, job, 1);
            if first == Outcome::Retry && late == Outcome::Retry {
                assert!((1..20).all(|a| outcome(Mode::Normal, job, a) == Outcome::Retry));
            }
        }
    }

    #[test]
    fn work_stays_within_half_and_one_and_a_half_of_the_mean() {
        for job in 1..1000 {
            let d = work(20, job, 1);
            assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(30));
        }
        assert_eq!(work(0, 7, 1), Duration::ZERO);
    }
}

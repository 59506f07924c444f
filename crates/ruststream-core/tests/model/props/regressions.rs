//! Schedules the property tests once shrunk to a failure, run again as they were found, each
//! written as its steps in a short text form (see [`steps`]).

use std::time::Duration;

use ruststream_core::{Dialect, Outcome};

use super::{Config, NO_SKEW, Step, Table, run};

/// A config of `dialect` and `table` with `[workers, processes, prefetch]`, a connection
/// linger of `linger_ms`, no attempt budget and every clock in step with the database's.
fn config(dialect: Dialect, table: Table, counts: [usize; 3], linger_ms: u64) -> Config {
    let [workers, processes, prefetch] = counts;
    Config {
        dialect,
        table,
        workers,
        processes,
        linger: Duration::from_millis(linger_ms),
        prefetch,
        max_attempts: None,
        skew: NO_SKEW,
    }
}

/// The steps of a schedule, `;` between them: `run P C`, `fail P C`, `lose P C` (the
/// connection too), `reply P R`, `ack|retry|reject P H`, `drop P H`, `lend P H`,
/// `advance MS`, `crash P`, `shutdown P`, `publish P CH`, `publish_all P CH ROWS`,
/// `hold CH`, `free CH` (another system's lock of a channel's key) and `check`.
fn steps(text: &str) -> Vec<Step> {
    text.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(step)
        .collect()
}

/// One step of [`steps`].
fn step(text: &str) -> Step {
    let words: Vec<&str> = text.split_whitespace().collect();
    let n = |i: usize| -> u64 {
        words
            .get(i)
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("`{text}`: no number at {i}"))
    };
    let (a, b) = (|| n(1) as usize, || n(2) as usize);
    let settle = |outcome| Step::Settle {
        process: a(),
        handler: b(),
        outcome,
        delay_ms: 0,
    };
    match words[0] {
        "run" => Step::Run {
            process: a(),
            command: b(),
        },
        "fail" | "lose" => Step::Fail {
            process: a(),
            command: b(),
            lost: words[0] == "lose",
        },
        "reply" => Step::Reply {
            process: a(),
            reply: b(),
        },
        "ack" => settle(Outcome::Ack),
        "retry" => settle(Outcome::Retry),
        "reject" => settle(Outcome::Reject),
        "drop" => Step::Drop {
            process: a(),
            handler: b(),
        },
        "lend" => Step::Lend {
            process: a(),
            handler: b(),
        },
        "advance" => Step::Advance { millis: n(1) },
        "crash" => Step::Crash { process: a() },
        "shutdown" => Step::Shutdown { process: a() },
        "publish" => Step::Publish {
            process: a(),
            channel: n(2) as i64,
        },
        "publish_all" => Step::PublishAll {
            process: a(),
            channel: n(2) as i64,
            rows: n(3) as usize,
        },
        "hold" | "free" => Step::Foreign {
            channel: n(1) as i64,
            hold: words[0] == "hold",
        },
        "check" => Step::Check,
        other => panic!("no step `{other}`"),
    }
}

/// MySQL, advisory: a claim locks a key whose row was failed by another process since its look,
/// and releases it; a claim beside it had passed over the key, as this process was trying its
/// lock. The key's next row (9, published here) is taken by a claim that runs as soon as they
/// end, not at the poll.
#[test]
fn regression_advisory_take_of_a_row_gone_looks_again_at_once() {
    let config = config(Dialect::MySql, Table::Advisory, [2, 3, 2], 5);
    run(
        config,
        &steps(
            "publish 3 0; check; publish 1 0; run 1 1; ack 3 0; run 0 0; reply 0 0; run 0 0;
             ack 2 0; run 1 0; ack 1 0; reply 1 6; check; publish 3 2; run 0 1; reply 3 0;
             publish 0 0; run 0 2; run 3 5; reply 0 1; ack 0 0; reject 1 0; check",
        ),
    );
}

#[test]
fn regression_row_lock_count_beside_a_failed_leader_keeps_no_mark() {
    let config = config(Dialect::Postgres, Table::RowLock, [3, 1, 0], 5);
    run(
        config,
        &steps(
            "run 0 0; reply 0 0; run 0 0; reply 0 0; run 0 0; reply 0 0; fail 0 0; reply 0 0;
             run 0 0; reply 0 0; advance 1000; run 0 0; publish 0 0; reply 0 0; run 0 1;
             reply 0 0; run 0 2; run 0 0; reply 0 1; reply 0 0; fail 0 3; run 0 5; run 0 0;
             run 0 0; run 0 0",
        ),
    );
}

#[test]
fn regression_row_lock_lock_waiting_for_a_count_keeps_its_mark() {
    let config = config(Dialect::MySql, Table::RowLock, [2, 3, 1], 5);
    run(
        config,
        &steps(
            "run 3 0; reply 0 0; run 3 0; run 2 0; reply 3 0; reply 2 0; run 0 0; run 2 0;
             reply 0 0; shutdown 1; fail 3 0; reply 0 0; run 0 0; reply 3 0; advance 1000;
             run 3 0; reply 0 0; run 3 0; reply 2 0; reply 3 0; run 0 0; run 2 0; run 0 0;
             run 0 0; reply 2 0; run 2 0; reply 3 0; run 3 0; reply 3 0; run 0 0; reply 0 0;
             publish_all 2 0 2; run 3 0; reply 2 0; run 2 0; run 0 0; run 2 0; reply 0 0",
        ),
    );
}

#[test]
fn regression_row_lock_counted_row_taken_in_the_gap() {
    let config = config(Dialect::Postgres, Table::RowLock, [1, 2, 0], 0);
    run(
        config,
        &steps(
            "run 2 0; reply 2 0; run 2 0; reply 2 0; run 1 0; run 0 0; reply 1 0; run 1 0;
             reply 1 0; run 1 0; reply 0 0; reply 1 0; run 1 0; run 0 0; reply 0 0; run 0 0;
             reply 1 0; run 1 0; reply 0 0; reply 1 0; run 0 0; reply 2 0; run 0 0; run 1 0;
             reply 0 0; run 0 0; reply 2 0; retry 0 0; reply 1 0; run 1 0; reply 1 0; run 0 0;
             run 1 0; reply 1 0",
        ),
    );
}

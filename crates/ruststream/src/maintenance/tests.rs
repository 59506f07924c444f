//! Schedules in UTC and in time zones across daylight-saving changes, and periodic jobs
//! that catch up and share ticks across them.

use super::*;

#[test]
fn a_pattern_with_seconds_ticks_every_second_and_a_bad_one_names_itself() {
    let every = Schedule::cron("* * * * * *").expect("parses");
    let t = Time(1_700_000_000_500_000);
    assert_eq!(every.after(t), Some(Time(1_700_000_001_000_000)));
    assert_eq!(every.before(t), Some(Time(1_700_000_000_000_000)));
    assert_eq!(
        every.before(Time(1_700_000_000_000_000)),
        Some(Time(1_699_999_999_000_000)),
        "strictly before"
    );
    let minutes = Schedule::cron("*/5 * * * *").expect("five fields");
    assert_eq!(
        minutes.after(Time(0)),
        Some(Time(300_000_000)),
        "every five minutes from the epoch"
    );
    let error = Schedule::cron("61 * * * *").expect_err("no minute 61");
    assert!(error.to_string().contains("`61 * * * *`"), "{error}");
}

/// The instant of a UTC date and time.
fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> Time {
    use chrono::TimeZone as _;
    let at = chrono::Utc
        .with_ymd_and_hms(y, mo, d, h, mi, 0)
        .single()
        .expect("a UTC time");
    Time(at.timestamp_micros())
}

/// The ticks of `schedule` strictly after `from` up to `to`, walking forward.
fn ticks(schedule: &Schedule, from: Time, to: Time) -> Vec<Time> {
    let mut out = Vec::new();
    let mut t = from;
    while let Some(tick) = schedule.after(t).filter(|tick| *tick <= to) {
        out.push(tick);
        t = tick;
    }
    out
}

/// The same ticks, walking backward from just past `to` as the catch-up does.
fn ticks_back(schedule: &Schedule, from: Time, to: Time) -> Vec<Time> {
    let mut out = Vec::new();
    let mut t = Time(to.micros() + 1);
    while let Some(tick) = schedule.before(t).filter(|tick| *tick > from) {
        out.push(tick);
        t = tick;
    }
    out.reverse();
    out
}

const HOUR: i64 = 3_600_000_000;

/// Every hour on the hour from `from` up to `to`, both included.
fn hours(from: Time, to: Time) -> Vec<Time> {
    (0..)
        .map(|i| Time(from.micros() + i * HOUR))
        .take_while(|t| *t <= to)
        .collect()
}

fn berlin(fields: &str) -> Schedule {
    Schedule::cron(&format!("CRON_TZ=Europe/Berlin {fields}")).expect("parses")
}

#[test]
fn a_zone_prefix_a_zone_argument_and_in_zone_read_the_same_schedule() {
    let from = utc(2026, 1, 1, 0, 0);
    let to = utc(2026, 1, 10, 0, 0);
    let prefixed = berlin("0 3 * * *");
    assert_eq!(
        prefixed.pattern(),
        "0 3 * * *",
        "the fields, without the prefix"
    );
    assert_eq!(prefixed.zone(), Tz::Europe__Berlin);
    assert_eq!(
        format!("{prefixed:?}"),
        r#"Schedule("0 3 * * *", "Europe/Berlin")"#
    );
    let expected = ticks(&prefixed, from, to);
    assert_eq!(expected.len(), 9);
    assert_eq!(expected[0], utc(2026, 1, 1, 2, 0), "03:00 CET is 02:00 UTC");
    let same = [
        Schedule::cron("TZ=Europe/Berlin 0 3 * * *").expect("TZ= too"),
        Schedule::cron("  CRON_TZ=Europe/Berlin   0 3 * * *").expect("spaces"),
        Schedule::cron_in("0 3 * * *", "Europe/Berlin").expect("by name"),
        Schedule::cron_in("CRON_TZ=Asia/Tokyo 0 3 * * *", "Europe/Berlin").expect("wins"),
        Schedule::cron("0 3 * * *")
            .expect("UTC")
            .in_zone(Tz::Europe__Berlin),
    ];
    for schedule in same {
        assert_eq!(ticks(&schedule, from, to), expected, "{schedule:?}");
        assert_eq!(schedule.zone(), Tz::Europe__Berlin);
    }
    let new_york = Schedule::cron("CRON_TZ=America/New_York 0 3 * * *").expect("parses");
    assert_eq!(
        new_york.after(from),
        Some(utc(2026, 1, 1, 8, 0)),
        "EST is UTC-5"
    );
}

#[test]
fn an_unknown_zone_is_an_error_naming_the_zone_and_the_pattern() {
    let error = Schedule::cron("CRON_TZ=Mars/Olympus 0 3 * * *").expect_err("no such zone");
    let text = error.to_string();
    assert!(text.contains("`CRON_TZ=Mars/Olympus 0 3 * * *`"), "{text}");
    assert!(text.contains("`Mars/Olympus`"), "{text}");
    let error = Schedule::cron_in("0 3 * * *", "Europe/Berlinn").expect_err("misspelt");
    assert_eq!(error.pattern, "0 3 * * *");
    assert!(error.why.contains("`Europe/Berlinn`"), "{error}");
    let error = Schedule::cron("CRON_TZ= 0 3 * * *").expect_err("no zone");
    assert!(error.why.contains("empty"), "{error}");
    let error = Schedule::cron("CRON_TZ=Europe/Berlin").expect_err("no fields");
    assert_eq!(error.pattern, "CRON_TZ=Europe/Berlin");
    let error = Schedule::cron("CRON_TZ=Europe/Berlin 61 * * * *").expect_err("no minute 61");
    assert!(error.to_string().contains("61 * * * *"), "{error}");
}

#[test]
fn without_a_zone_a_schedule_reads_utc_as_a_utc_zone_does() {
    let from = utc(2026, 3, 1, 0, 0);
    let to = utc(2026, 4, 1, 0, 0);
    for fields in [
        "30 2 * * *",
        "0 * * * *",
        "0 0 3 * * *",
        "@daily",
        "0 9 * * 1-5",
    ] {
        let plain = Schedule::cron(fields).expect("parses");
        assert_eq!(plain.zone(), Tz::UTC);
        assert_eq!(plain.pattern(), fields);
        assert_eq!(format!("{plain:?}"), format!("Schedule({fields:?})"));
        let zoned = Schedule::cron(&format!("CRON_TZ=UTC {fields}")).expect("parses");
        assert_eq!(ticks(&plain, from, to), ticks(&zoned, from, to), "{fields}");
    }
    let daily = Schedule::cron("30 2 * * *").expect("parses");
    assert_eq!(
        ticks(&daily, utc(2026, 3, 28, 0, 0), utc(2026, 3, 31, 0, 0)),
        [
            utc(2026, 3, 28, 2, 30),
            utc(2026, 3, 29, 2, 30),
            utc(2026, 3, 30, 2, 30)
        ],
        "UTC has no daylight saving"
    );
}

/// Berlin, 2026-03-29: at 02:00 CET (01:00 UTC) the clock skips to 03:00 CEST.
#[test]
fn spring_forward_a_daily_tick_in_the_skipped_hour_fires_once_at_the_first_time_after_it() {
    let from = utc(2026, 3, 27, 0, 0);
    let to = utc(2026, 3, 31, 0, 0);
    let expected = [
        utc(2026, 3, 27, 1, 30), // 02:30 CET
        utc(2026, 3, 28, 1, 30), // 02:30 CET
        utc(2026, 3, 29, 1, 0),  // 02:30 does not exist: 03:00 CEST, once
        utc(2026, 3, 30, 0, 30), // 02:30 CEST
    ];
    for daily in [berlin("30 2 * * *"), berlin("0 30 2 * * *")] {
        assert_eq!(ticks(&daily, from, to), expected, "{daily:?}");
        assert_eq!(ticks_back(&daily, from, to), expected, "{daily:?} backward");
    }
    // A tick just before the skipped hour is not moved.
    let before_gap = berlin("30 1 * * *");
    assert_eq!(
        before_gap.after(utc(2026, 3, 28, 12, 0)),
        Some(utc(2026, 3, 29, 0, 30))
    );
}

#[test]
fn spring_forward_an_hourly_schedule_has_23_ticks_that_day() {
    // Berlin's 2026-03-29 runs from 00:00 CET (23:00 UTC the day before) to 00:00 CEST
    // (22:00 UTC): 23 hours, the ticks of 02:00 skipped.
    let start = utc(2026, 3, 28, 23, 0);
    let end = utc(2026, 3, 29, 22, 0);
    let hourly = berlin("0 * * * *");
    let day = ticks(&hourly, Time(start.micros() - 1), Time(end.micros() - 1));
    assert_eq!(day.len(), 23);
    assert_eq!(
        day,
        hours(start, Time(end.micros() - HOUR)),
        "each hour once"
    );
    assert_eq!(
        ticks_back(&hourly, Time(start.micros() - 1), Time(end.micros() - 1)),
        day
    );
}

/// Berlin, 2026-10-25: at 03:00 CEST (01:00 UTC) the clock goes back to 02:00 CET, so
/// 02:00-02:59 comes twice.
#[test]
fn fall_back_a_daily_tick_in_the_repeated_hour_fires_once_at_its_first_pass() {
    let from = utc(2026, 10, 23, 0, 0);
    let to = utc(2026, 10, 28, 0, 0);
    let expected = [
        utc(2026, 10, 23, 0, 30), // 02:30 CEST
        utc(2026, 10, 24, 0, 30), // 02:30 CEST
        utc(2026, 10, 25, 0, 30), // 02:30 CEST, the first pass; not 01:30 UTC again
        utc(2026, 10, 26, 1, 30), // 02:30 CET
        utc(2026, 10, 27, 1, 30), // 02:30 CET
    ];
    for daily in [berlin("30 2 * * *"), berlin("0 30 2 * * *")] {
        assert_eq!(ticks(&daily, from, to), expected, "{daily:?}");
        assert_eq!(ticks_back(&daily, from, to), expected, "{daily:?} backward");
        // From inside the second pass, the next tick is the next day's.
        assert_eq!(
            daily.after(utc(2026, 10, 25, 1, 15)),
            Some(utc(2026, 10, 26, 1, 30))
        );
    }
}

#[test]
fn fall_back_an_hourly_schedule_has_25_ticks_that_day() {
    // Berlin's 2026-10-25 runs from 00:00 CEST (22:00 UTC the day before) to 00:00 CET
    // (23:00 UTC): 25 hours, 02:00 on both passes.
    let start = utc(2026, 10, 24, 22, 0);
    let end = utc(2026, 10, 25, 23, 0);
    let hourly = berlin("0 * * * *");
    let day = ticks(&hourly, Time(start.micros() - 1), Time(end.micros() - 1));
    assert_eq!(day.len(), 25);
    assert_eq!(
        day,
        hours(start, Time(end.micros() - HOUR)),
        "each UTC hour once"
    );
    assert_eq!(
        ticks_back(&hourly, Time(start.micros() - 1), Time(end.micros() - 1)),
        day
    );
    let quarter = berlin("*/15 2 * * *");
    assert_eq!(
        ticks(&quarter, utc(2026, 10, 24, 12, 0), utc(2026, 10, 25, 12, 0)).len(),
        8,
        "02:00-02:45 on both passes"
    );
}

/// The catch-up walks a schedule backward and the wait for the next tick forward: both must
/// list the same ticks across every change of the clock.
#[test]
fn across_daylight_saving_changes_forward_and_backward_walks_list_the_same_ticks() {
    let windows = [
        (
            "Europe/Berlin",
            utc(2026, 3, 27, 0, 0),
            utc(2026, 3, 31, 0, 0),
        ),
        (
            "Europe/Berlin",
            utc(2026, 10, 23, 0, 0),
            utc(2026, 10, 27, 0, 0),
        ),
        (
            "America/New_York",
            utc(2026, 3, 6, 0, 0),
            utc(2026, 3, 10, 0, 0),
        ),
        (
            "America/New_York",
            utc(2026, 10, 30, 0, 0),
            utc(2026, 11, 3, 0, 0),
        ),
        // Lord Howe Island moves its clock by half an hour.
        (
            "Australia/Lord_Howe",
            utc(2026, 4, 3, 0, 0),
            utc(2026, 4, 7, 0, 0),
        ),
        (
            "Australia/Lord_Howe",
            utc(2026, 10, 2, 0, 0),
            utc(2026, 10, 6, 0, 0),
        ),
    ];
    let patterns = [
        "30 2 * * *",
        "0 2 * * *",
        "45 1 * * *",
        "0 * * * *",
        "*/20 * * * *",
        "15 1-3 * * *",
        "0 30 2 * * *",
    ];
    for (zone, from, to) in windows {
        for fields in patterns {
            let schedule = Schedule::cron_in(fields, zone).expect("parses");
            let forward = ticks(&schedule, from, to);
            assert!(!forward.is_empty(), "{schedule:?}");
            assert!(forward.windows(2).all(|w| w[0] < w[1]), "{schedule:?}");
            assert_eq!(ticks_back(&schedule, from, to), forward, "{schedule:?}");
        }
    }
}

/// One schedule's row in the state table, shared by the processes of a test, and the ticks
/// whose advance moved it (so whose rows were inserted).
struct StateRow {
    last_tick: Time,
    published: Vec<Time>,
}

const JOBS: ruststream_core::spec::InboxSpec<(
    ruststream_core::spec::Payload,
    ruststream_core::spec::Lease,
)> = ruststream_core::spec::InboxSpec::new(
    "jobs",
    ruststream_core::spec::Column::new("id").generated(),
)
.payload(ruststream_core::spec::Column::new("payload"))
.lease(ruststream_core::spec::Column::new("locked_until"));

/// A process that runs `job` from `now` on, against a database with no delay.
fn process(job: Periodic, now: Time) -> ruststream_core::Broker<()> {
    let mut broker = ruststream_core::Broker::new(ruststream_core::Dialect::Postgres);
    broker.set_connection_linger(Duration::ZERO);
    broker
        .periodic(job.into_job(*JOBS.desc()), now)
        .expect("a periodic job");
    broker
}

/// Answers `broker`'s next statement at `now` as a database holding `row` would: the state
/// read gives its last tick, an advance moves it only forward; `tried` gets the advance's
/// tick. Whether there was a statement.
fn step(
    broker: &mut ruststream_core::Broker<()>,
    now: Time,
    row: &mut StateRow,
    tried: &mut Vec<Time>,
) -> bool {
    use ruststream_core::dialect::MaintenanceKind;
    use ruststream_core::{Action, Reply, Row, StatementKind, Value};
    let Some(command) = broker.poll_command() else {
        return false;
    };
    let kind = match &command.action {
        Action::Execute { statement, .. } => Some(statement.kind),
        _ => None,
    };
    let reply = match (kind, &command.action) {
        (Some(StatementKind::Maintenance(MaintenanceKind::ReadState)), _) => {
            let values = vec![Value::Int(row.last_tick.micros()), Value::Int(now.micros())];
            Reply::Rows(vec![Row::values(values)])
        }
        (
            Some(StatementKind::Maintenance(MaintenanceKind::Advance)),
            Action::Execute { binds, .. },
        ) => {
            let tick = binds.iter().find_map(|v| match v {
                Value::Int(micros) => Some(Time(*micros)),
                _ => None,
            });
            let tick = tick.expect("the advance binds its tick");
            tried.push(tick);
            let moved = tick > row.last_tick;
            if moved {
                row.last_tick = tick;
                row.published.push(tick);
            }
            Reply::Affected(u64::from(moved))
        }
        _ => Reply::Done,
    };
    broker.handle_reply(command.id, reply, now);
    true
}

/// Answers every statement `broker` hands out at `now`; the ticks it tried.
fn answer(broker: &mut ruststream_core::Broker<()>, now: Time, row: &mut StateRow) -> Vec<Time> {
    let mut tried = Vec::new();
    while step(broker, now, row, &mut tried) {}
    tried
}

fn hourly_job(fields: &str, catch_up: usize) -> Periodic {
    Periodic::new("report", berlin(fields), |tick| {
        Message::json(&time_of(tick).micros())
    })
    .catch_up(catch_up)
}

#[test]
fn a_catch_up_across_spring_forward_publishes_the_missed_ticks_as_utc_instants() {
    // The last tick was Saturday's 02:30 CET; the process starts on Monday at noon.
    let mut row = StateRow {
        last_tick: utc(2026, 3, 28, 1, 30),
        published: Vec::new(),
    };
    let now = utc(2026, 3, 30, 10, 0);
    let mut broker = process(hourly_job("30 2 * * *", 10), now);
    answer(&mut broker, now, &mut row);
    assert_eq!(
        row.published,
        [utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)],
        "Sunday's tick once, at 03:00 CEST, then Monday's 02:30 CEST"
    );
    assert_eq!(broker.poll_timeout(), Some(utc(2026, 3, 31, 0, 30)));

    // Hourly, down since Saturday 23:00 CET: the 23 ticks of Sunday, the latest 20 of them.
    let mut row = StateRow {
        last_tick: utc(2026, 3, 28, 22, 0),
        published: Vec::new(),
    };
    let now = utc(2026, 3, 29, 21, 30);
    let mut broker = process(hourly_job("0 * * * *", 20), now);
    answer(&mut broker, now, &mut row);
    assert_eq!(
        row.published,
        hours(utc(2026, 3, 29, 2, 0), utc(2026, 3, 29, 21, 0))
    );
}

#[test]
fn a_catch_up_across_fall_back_publishes_a_fixed_tick_once_and_the_repeated_hour_twice() {
    // Down since Saturday: Sunday's 02:30 is missed on both passes of the hour, and caught
    // up once.
    let mut row = StateRow {
        last_tick: utc(2026, 10, 24, 0, 30),
        published: Vec::new(),
    };
    let now = utc(2026, 10, 25, 1, 45);
    let mut broker = process(hourly_job("30 2 * * *", 10), now);
    answer(&mut broker, now, &mut row);
    assert_eq!(row.published, [utc(2026, 10, 25, 0, 30)]);
    assert_eq!(
        broker.poll_timeout(),
        Some(utc(2026, 10, 26, 1, 30)),
        "the next is Monday's 02:30 CET, not the second pass of Sunday's"
    );

    // Hourly, down since Saturday 22:00 UTC (midnight CEST): the 25 ticks of Sunday.
    let mut row = StateRow {
        last_tick: utc(2026, 10, 24, 21, 0),
        published: Vec::new(),
    };
    let now = utc(2026, 10, 25, 22, 30);
    let mut broker = process(hourly_job("0 * * * *", 30), now);
    answer(&mut broker, now, &mut row);
    assert_eq!(row.published.len(), 25);
    assert_eq!(
        row.published,
        hours(utc(2026, 10, 24, 22, 0), utc(2026, 10, 25, 22, 0))
    );
}

/// Two processes run the same zoned job through the night the clock goes back, the second
/// started half an hour after the first, their statements interleaved: both try each tick
/// from then on, at the same UTC instant, and one of them publishes it.
#[test]
fn two_processes_share_the_ticks_of_a_zoned_job_across_fall_back() {
    let mut row = StateRow {
        last_tick: utc(2026, 10, 24, 20, 0),
        published: Vec::new(),
    };
    let start = utc(2026, 10, 24, 20, 10);
    let end = utc(2026, 10, 25, 23, 30);
    let later = Time(start.micros() + HOUR / 2);
    let mut processes = [
        process(hourly_job("0 * * * *", 10), start),
        process(hourly_job("0 * * * *", 10), later),
    ];
    let mut tried = [Vec::new(), Vec::new()];
    tried[0] = answer(&mut processes[0], start, &mut row);
    tried[1] = answer(&mut processes[1], later, &mut row);
    while let Some(at) = processes.iter().filter_map(|p| p.poll_timeout()).min() {
        if at > end {
            break;
        }
        for p in processes
            .iter_mut()
            .filter(|p| p.poll_timeout() == Some(at))
        {
            p.handle_timeout(at);
        }
        let mut busy = true;
        while busy {
            busy = false;
            for (p, tried) in processes.iter_mut().zip(tried.iter_mut()) {
                busy |= step(p, at, &mut row, tried);
            }
        }
    }
    let expected = hours(utc(2026, 10, 24, 21, 0), utc(2026, 10, 25, 23, 0));
    assert_eq!(expected.len(), 27);
    assert_eq!(row.published, expected, "every UTC hour once");
    assert_eq!(tried[0], expected, "the first process tried every tick");
    assert_eq!(
        tried[1], expected,
        "so did the second, at the same instants"
    );
}

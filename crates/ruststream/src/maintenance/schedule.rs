//! Cron schedules: a pattern read in UTC, or in a time zone's wall clock.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use ruststream_core::Time;

use super::{system_time, time_of};

/// A cron schedule: five fields (minute, hour, day of month, month, day of week) or six with
/// seconds first (`*/5 * * * * *`: every five seconds), as the `croner` crate reads them (`L`,
/// `W`, `#` and the nicknames `@hourly`, `@daily`, ... included).
///
/// The fields are read in UTC unless a time zone is given, by a leading `CRON_TZ=<zone> ` (or
/// `TZ=<zone> `) as Vixie cron writes it, by [`Schedule::cron_in`] or by
/// [`Schedule::in_zone`]: then in that zone's wall clock, daylight saving included. Where
/// the clock skips forward, a tick of a fixed time (one second, minute and hour, such as
/// `30 2 * * *`) that falls in the skipped hour fires once, at the first time after it (03:00
/// for 02:30 where 02:00 becomes 03:00), and ticks of ranges, lists, steps and `*` in the
/// skipped hour do not fire. Where the clock goes back and repeats an hour, a fixed-time tick
/// fires once, at its first pass, and the others fire on both passes. Ticks are instants: the
/// state table keeps them, and the processes compare them, in UTC.
///
/// ```
/// # use ruststream::Schedule;
/// let nightly = Schedule::cron("CRON_TZ=Europe/Berlin 30 2 * * *")?;
/// assert_eq!(nightly.zone().name(), "Europe/Berlin");
/// assert_eq!(nightly.pattern(), "30 2 * * *");
/// # Ok::<(), ruststream::ScheduleError>(())
/// ```
#[derive(Clone)]
pub struct Schedule {
    cron: Cron,
    pattern: Arc<str>,
    /// `None` reads the pattern in UTC.
    zone: Option<Tz>,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tuple = f.debug_tuple("Schedule");
        tuple.field(&self.pattern);
        if let Some(zone) = &self.zone {
            tuple.field(&zone.name());
        }
        tuple.finish()
    }
}

/// Why a cron pattern does not parse, or names a time zone that does not exist.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the cron pattern `{pattern}` does not parse: {why}")]
pub struct ScheduleError {
    /// The pattern.
    pub pattern: String,
    /// Why.
    pub why: String,
}

impl ScheduleError {
    fn new(pattern: &str, why: impl Into<String>) -> Self {
        Self {
            pattern: pattern.to_owned(),
            why: why.into(),
        }
    }
}

/// The prefixes that name a pattern's time zone, as Vixie cron, River and Oban write them.
const ZONE_PREFIXES: [&str; 2] = ["CRON_TZ=", "TZ="];

/// The time zone named `name` (an IANA name such as `Europe/Berlin`), or why not, naming the
/// zone and `pattern`.
fn zone_named(name: &str, pattern: &str) -> Result<Tz, ScheduleError> {
    if name.is_empty() {
        return Err(ScheduleError::new(pattern, "the time zone's name is empty"));
    }
    name.parse::<Tz>().map_err(|_| {
        ScheduleError::new(
            pattern,
            format!("`{name}` is not a known IANA time zone (such as `Europe/Berlin`)"),
        )
    })
}

/// `pattern`'s zone prefix and its fields: `(Some(zone), fields)` for `CRON_TZ=zone fields`
/// or `TZ=zone fields`, else `(None, pattern)`.
fn split_zone(pattern: &str) -> (Option<&str>, &str) {
    let trimmed = pattern.trim_start();
    for prefix in ZONE_PREFIXES {
        if let Some(rest) = trimmed.strip_prefix(prefix) {
            let (zone, fields) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            return (Some(zone), fields.trim_start());
        }
    }
    (None, pattern)
}

impl Schedule {
    /// The schedule of a cron pattern, seconds optional, in UTC or in the zone of a leading
    /// `CRON_TZ=<zone> ` or `TZ=<zone> ` (`CRON_TZ=Europe/Berlin 30 2 * * *`); an unknown zone
    /// is an error naming it.
    pub fn cron(pattern: &str) -> Result<Self, ScheduleError> {
        let (zone, fields) = split_zone(pattern);
        let zone = zone.map(|name| zone_named(name, pattern)).transpose()?;
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(fields)
            .map_err(|e| ScheduleError::new(pattern, e.to_string()))?;
        Ok(Self {
            cron,
            pattern: fields.into(),
            zone,
        })
    }

    /// The schedule of a cron pattern read in the time zone named `zone` (an IANA name such
    /// as `Europe/Berlin`), which wins over a `CRON_TZ=` prefix; an unknown zone is an error
    /// naming it and the pattern.
    pub fn cron_in(pattern: &str, zone: &str) -> Result<Self, ScheduleError> {
        let zone = zone_named(zone, pattern)?;
        Ok(Self::cron(pattern)?.in_zone(zone))
    }

    /// The same pattern read in `zone`'s wall clock ([`Tz::Europe__Berlin`](super::Tz), or
    /// `"Europe/Berlin".parse()?`), instead of UTC or an earlier zone.
    pub fn in_zone(mut self, zone: Tz) -> Self {
        self.zone = Some(zone);
        self
    }

    /// The pattern's fields, without a `CRON_TZ=` or `TZ=` prefix.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The time zone the pattern is read in: UTC unless one was given.
    pub fn zone(&self) -> Tz {
        self.zone.unwrap_or(Tz::UTC)
    }

    /// The first tick strictly after `at`.
    pub fn next_after(&self, at: SystemTime) -> Option<SystemTime> {
        self.after(time_of(at)).map(system_time)
    }

    /// `t` cut to its whole second, and whether it had a part of a second: cron ticks fall on
    /// whole seconds, and `croner` reads a time by its whole second.
    fn whole_second(t: Time) -> Option<(DateTime<Utc>, bool)> {
        let micros = t.micros();
        let whole = micros.div_euclid(1_000_000) * 1_000_000;
        Some((
            DateTime::<Utc>::from_timestamp_micros(whole)?,
            whole != micros,
        ))
    }

    /// The first tick strictly after `t`.
    pub(crate) fn after(&self, t: Time) -> Option<Time> {
        let (at, _) = Self::whole_second(t)?;
        match self.zone {
            None => self.next_in(at, false),
            Some(zone) => self.next_in(at.with_timezone(&zone), false),
        }
    }

    /// The last tick strictly before `t`.
    pub(crate) fn before(&self, t: Time) -> Option<Time> {
        // Strictly before `t`: a tick on `t`'s own whole second is before `t` when `t` is
        // past it.
        let (at, past) = Self::whole_second(t)?;
        match self.zone {
            None => self.previous_in(at, past),
            Some(zone) => self.previous_in(at.with_timezone(&zone), past),
        }
    }

    /// The first tick after `at` (or on it, where `inclusive`), read in `at`'s time zone.
    fn next_in<Z: TimeZone>(&self, at: DateTime<Z>, inclusive: bool) -> Option<Time> {
        let next = self.cron.find_next_occurrence(&at, inclusive).ok()?;
        Some(Time(next.timestamp_micros()))
    }

    /// The last tick before `at` (or on it, where `inclusive`), read in `at`'s time zone.
    fn previous_in<Z: TimeZone>(&self, at: DateTime<Z>, inclusive: bool) -> Option<Time> {
        let previous = self.cron.find_previous_occurrence(&at, inclusive).ok()?;
        Some(Time(previous.timestamp_micros()))
    }
}

//! Data intervals, `WHEN` parsing and the expansion of a `--from`/`--to` range into intervals.
//!
//! Rules (see docs/intervals.md):
//! - `--from` is inclusive: the first interval is the first fire time `>= from`.
//! - `--to` is inclusive on the interval start. A date-only `--to` covers the whole local day;
//!   a datetime `--to` is inclusive at that instant.
//! - Times without an offset are wall-clock times in the DAG's timezone.

use std::fmt;

use chrono::{
    DateTime, Days, Duration, NaiveDate, NaiveDateTime, NaiveTime, Offset, SecondsFormat, TimeZone,
    Utc,
};
use chrono_tz::Tz;

use crate::schedule::{Schedule, resolve_local};

/// `[start, end)` between two consecutive fire times of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DataInterval {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

impl DataInterval {
    /// From the earliest start to the latest end of `intervals` (a batch's whole range);
    /// `None` for none.
    pub(crate) fn span(intervals: &[DataInterval]) -> Option<DataInterval> {
        let start = intervals.iter().map(|i| i.start).min()?;
        let end = intervals.iter().map(|i| i.end).max()?;
        Some(DataInterval::new(start, end))
    }

    /// The first day of 1970 (UTC): an interval to prepare statements with.
    pub(crate) const EPOCH_DAY: Self = Self {
        start: DateTime::<Utc>::UNIX_EPOCH,
        end: DateTime::<Utc>::from_timestamp(86_400, 0).expect("a valid instant"),
    };

    pub fn new(start: DateTime<Utc>, end: DateTime<Utc>) -> Self {
        Self { start, end }
    }

    /// Builds an interval from unix seconds as stored in the manifest.
    pub fn from_unix(start: i64, end: i64) -> Self {
        Self {
            start: from_unix(start),
            end: from_unix(end),
        }
    }

    /// The local date of the interval start in `tz` (`ds`), as `YYYY-MM-DD`.
    pub(crate) fn ds(&self, tz: Tz) -> String {
        self.start.with_timezone(&tz).format("%Y-%m-%d").to_string()
    }

    pub(crate) fn duration(&self) -> Duration {
        self.end - self.start
    }
}

impl fmt::Display for DataInterval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} .. {}", rfc3339(self.start), rfc3339(self.end))
    }
}

/// An interval in a JSON document: `{"start", "end"}`, RFC 3339 UTC.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct IntervalDoc {
    pub start: Rfc3339,
    pub end: Rfc3339,
}

impl IntervalDoc {
    pub(crate) fn of(i: DataInterval) -> Self {
        Self {
            start: Rfc3339(i.start),
            end: Rfc3339(i.end),
        }
    }
}

/// RFC 3339 in UTC with a `Z` suffix and whole seconds.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    Rfc3339(t).to_string()
}

/// An instant displayed and serialized as RFC 3339 UTC (`2026-09-01T00:00:00Z`), its digits
/// written directly: chrono's formatter parses its pattern anew for every value, and plans and
/// listings print millions of them.
#[derive(Debug, Clone, Copy)]
pub struct Rfc3339(pub DateTime<Utc>);

impl Rfc3339 {
    /// The 20 ASCII bytes, for years 0 to 9999 (`None` outside).
    pub(crate) fn bytes(self) -> Option<[u8; 20]> {
        use chrono::{Datelike, Timelike};
        let t = self.0;
        let year = u32::try_from(t.year()).ok().filter(|y| *y <= 9999)?;
        let mut b = *b"0000-00-00T00:00:00Z";
        let mut put = |at: usize, value: u32, digits: u32| {
            for i in 0..digits {
                let d = (value / 10u32.pow(digits - 1 - i)) % 10;
                b[at + i as usize] = b'0' + d as u8;
            }
        };
        put(0, year, 4);
        put(5, t.month(), 2);
        put(8, t.day(), 2);
        put(11, t.hour(), 2);
        put(14, t.minute(), 2);
        put(17, t.second(), 2);
        Some(b)
    }
}

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.bytes() {
            Some(b) => f.write_str(std::str::from_utf8(&b).map_err(|_| fmt::Error)?),
            None => f.write_str(&self.0.to_rfc3339_opts(SecondsFormat::Secs, true)),
        }
    }
}

impl serde::Serialize for Rfc3339 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.bytes() {
            Some(b) => s.serialize_str(std::str::from_utf8(&b).map_err(serde::ser::Error::custom)?),
            None => s.collect_str(self),
        }
    }
}

pub(crate) fn from_unix(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(secs, 0).unwrap_or_default()
}

/// A parsed `WHEN` argument, before it is resolved against a timezone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum When {
    /// A calendar date in the DAG timezone (`2026-09-01`, `today`, `yesterday`, `today-7d`).
    Date(NaiveDate),
    /// A wall-clock time in the DAG timezone (`2026-09-01T06:00`).
    Local(NaiveDateTime),
    /// An absolute instant (RFC 3339 with offset, `now`, `now-6h`).
    Instant(DateTime<Utc>),
}

/// The most intervals one backfill may hold: a bound on the memory and time of planning.
pub const MAX_INTERVALS: usize = 1_000_000;

const OUT_OF_RANGE: &str = "out of range";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RangeError {
    #[error(
        "cannot read `{input}` as a time: {reason}; use 2026-09-01, 2026-09-01T06:00, an RFC 3339 instant, today, yesterday, today-7d or now-6h"
    )]
    BadWhen { input: String, reason: String },
    /// Written as a date, but no such day is in the calendar (`2026-09-31`).
    #[error("cannot read `{input}` as a time: {reason}")]
    NoSuchDay { input: String, reason: String },
    #[error("--from {from} is after --to {to}; swap them or pick a later --to")]
    FromAfterTo { from: String, to: String },
    #[error(
        "no interval of schedule `{schedule}` starts between --from {from} and --to {to}; widen the range"
    )]
    Empty {
        schedule: String,
        from: String,
        to: String,
    },
    #[error(
        "the range --from {from} --to {to} holds more than {} intervals of schedule `{schedule}`; split it into several backfills: the first up to --to {}, the next from --from {}",
        crate::words::thousands(i64::try_from(*.limit).unwrap_or(i64::MAX)),
        in_zone(.next_start.checked_sub_signed(Duration::seconds(1)).unwrap_or(*.next_start), *.tz),
        in_zone(*.next_start, *.tz)
    )]
    TooMany {
        schedule: String,
        from: String,
        to: String,
        limit: usize,
        /// The start of the first interval beyond the limit: the first part ends one second
        /// before it, the next one starts with it.
        next_start: DateTime<Utc>,
        /// The DAG timezone, in which the split is shown.
        tz: Tz,
    },
}

/// An instant in RFC 3339 with the offset of `tz` (`Z` for UTC): a `WHEN` a user can paste.
fn in_zone(t: DateTime<Utc>, tz: Tz) -> String {
    t.with_timezone(&tz)
        .to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Parses a `WHEN` argument. `now` is the clock's current instant; `tz` the DAG timezone,
/// which decides what `today` is. Never panics: a time that cannot be represented is an error.
pub(crate) fn parse_when(input: &str, now: DateTime<Utc>, tz: Tz) -> Result<When, RangeError> {
    let bad = |reason: &str| RangeError::BadWhen {
        input: input.to_string(),
        reason: reason.to_string(),
    };
    let s = input.trim();
    let today = || {
        wall_clock(now, tz)
            .map(|t| t.date())
            .ok_or_else(|| bad(OUT_OF_RANGE))
    };
    if let Some(rest) = s.strip_prefix("today") {
        let (forward, days) = parse_day_offset(rest)
            .ok_or_else(|| bad("expected today, today-Nd or today+Nd"))?
            .ok_or_else(|| bad(OUT_OF_RANGE))?;
        let days = Days::new(days);
        let date = if forward {
            today()?.checked_add_days(days)
        } else {
            today()?.checked_sub_days(days)
        };
        return date.map(When::Date).ok_or_else(|| bad(OUT_OF_RANGE));
    }
    if s == "yesterday" {
        return today()?
            .pred_opt()
            .map(When::Date)
            .ok_or_else(|| bad(OUT_OF_RANGE));
    }
    if let Some(rest) = s.strip_prefix("now") {
        if rest.is_empty() {
            return Ok(When::Instant(now));
        }
        let (forward, amount) = match (rest.strip_prefix('+'), rest.strip_prefix('-')) {
            (Some(amount), _) => (true, amount),
            (_, Some(amount)) => (false, amount),
            _ => return Err(bad("expected now, now-6h or now+30m")),
        };
        let d = humantime::parse_duration(amount)
            .map_err(|e| bad(&format!("bad duration `{amount}`: {e}")))?;
        let d = Duration::from_std(d).map_err(|_| bad(OUT_OF_RANGE))?;
        let t = if forward {
            now.checked_add_signed(d)
        } else {
            now.checked_sub_signed(d)
        };
        return t.map(When::Instant).ok_or_else(|| bad(OUT_OF_RANGE));
    }
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(When::Date(d));
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(When::Instant(t.with_timezone(&Utc)));
    }
    for format in [
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, format) {
            return Ok(When::Local(t));
        }
    }
    if let Some(reason) = no_such_day(s) {
        return Err(RangeError::NoSuchDay {
            input: input.to_string(),
            reason,
        });
    }
    Err(bad("not a date, a datetime or a relative time"))
}

/// Why text that starts like a date (`YYYY-MM-DD`, alone or before a time) names no day of the
/// calendar: the month does not exist, or the day is past the month's end. `None` when the
/// date part is a day of the calendar, or does not look like a date at all.
fn no_such_day(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let shaped = b.len() >= 10
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
        && b[8..10].iter().all(u8::is_ascii_digit)
        && matches!(b.get(10), None | Some(b'T' | b' '));
    if !shaped {
        return None;
    }
    let year: i32 = s[..4].parse().ok()?;
    let month: u32 = s[5..7].parse().ok()?;
    let day: u32 = s[8..10].parse().ok()?;
    let Some(named) = u8::try_from(month)
        .ok()
        .and_then(|m| chrono::Month::try_from(m).ok())
    else {
        return Some(format!(
            "there is no month {month:02}; months run from 01 to 12"
        ));
    };
    if day == 0 {
        return Some("there is no day 00; days run from 01".to_string());
    }
    let days = named.num_days(year)?;
    if day <= u32::from(days) {
        return None;
    }
    let name = named.name();
    Some(match (month, days) {
        (2, 28) if day == 29 => {
            format!("{year} is not a leap year: February {year} has 28 days")
        }
        (2, _) => format!("February {year} has {days} days"),
        _ => format!("{name} has {days} days"),
    })
}

/// Reads the `-Nd` / `+Nd` after `today`: `None` when it is not of that form, `Some(None)` when
/// the number is too large to be a count of days.
fn parse_day_offset(rest: &str) -> Option<Option<(bool, u64)>> {
    if rest.is_empty() {
        return Some(Some((true, 0)));
    }
    let (forward, digits) = match (rest.strip_prefix('+'), rest.strip_prefix('-')) {
        (Some(digits), _) => (true, digits),
        (_, Some(digits)) => (false, digits),
        _ => return None,
    };
    let digits = digits.strip_suffix('d')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(digits.parse().ok().map(|days| (forward, days)))
}

/// The wall-clock time of an instant in `tz`; `None` past the edge of what can be represented.
fn wall_clock(t: DateTime<Utc>, tz: Tz) -> Option<NaiveDateTime> {
    let utc = t.naive_utc();
    utc.checked_add_offset(tz.offset_from_utc_datetime(&utc).fix())
}

/// A resolved range: interval starts `s` with `start <= s < end_exclusive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: DateTime<Utc>,
    pub end_exclusive: DateTime<Utc>,
}

impl Range {
    /// The first and the last whole unix second at which an interval of the range can start,
    /// both inclusive: the bounds that select this range's intervals among recorded ones.
    pub(crate) fn unix_start_bounds(&self) -> (i64, i64) {
        let first = self.start.timestamp() + i64::from(self.start.timestamp_subsec_nanos() > 0);
        let end = self.end_exclusive;
        let last = end.timestamp() - i64::from(end.timestamp_subsec_nanos() == 0);
        (first, last)
    }
}

/// Resolves `--from` and `--to` in `tz` into a range of interval starts.
pub(crate) fn resolve_range(from: When, to: When, tz: Tz) -> Result<Range, RangeError> {
    let out_of_range = |w: When| RangeError::BadWhen {
        input: describe_when(w),
        reason: OUT_OF_RANGE.to_string(),
    };
    let just_after = |t: DateTime<Utc>| t.checked_add_signed(Duration::nanoseconds(1));
    let start = match from {
        When::Date(d) => local_midnight(tz, d),
        When::Local(t) => resolve_local(tz, t),
        When::Instant(t) => Some(t),
    }
    .ok_or_else(|| out_of_range(from))?;
    let end_exclusive = match to {
        When::Date(d) => d.succ_opt().and_then(|next| local_midnight(tz, next)),
        When::Local(t) => resolve_local(tz, t).and_then(just_after),
        When::Instant(t) => just_after(t),
    }
    .ok_or_else(|| out_of_range(to))?;
    if start >= end_exclusive {
        return Err(RangeError::FromAfterTo {
            from: describe_when(from),
            to: describe_when(to),
        });
    }
    Ok(Range {
        start,
        end_exclusive,
    })
}

/// Parses and resolves `--from` and `--to` in `tz`, with `now` deciding relative times.
pub(crate) fn resolve_args(
    from: &str,
    to: &str,
    now: DateTime<Utc>,
    tz: Tz,
) -> Result<Range, RangeError> {
    resolve_range(parse_when(from, now, tz)?, parse_when(to, now, tz)?, tz)
}

fn describe_when(w: When) -> String {
    match w {
        When::Date(d) => d.to_string(),
        When::Local(t) => t.format("%Y-%m-%dT%H:%M:%S").to_string(),
        When::Instant(t) => rfc3339(t),
    }
}

/// The first instant of local day `d` in `tz`.
fn local_midnight(tz: Tz, d: NaiveDate) -> Option<DateTime<Utc>> {
    resolve_local(tz, d.and_time(NaiveTime::MIN))
}

/// A range holds more intervals than allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    /// The start of the first interval beyond the limit.
    pub first_excluded: DateTime<Utc>,
}

/// The data intervals of `schedule` whose start lies in `range`, ascending, as long as there are
/// at most `limit`: fire times are computed only up to the one that would exceed it.
pub fn expand(
    schedule: &Schedule,
    range: Range,
    limit: usize,
) -> Result<Vec<DataInterval>, Overflow> {
    let mut out = Vec::new();
    // The fire time after the last start ends the last interval.
    let mut fires = schedule.fire_times(range.start, DateTime::<Utc>::MAX_UTC);
    let Some(mut start) = fires.next() else {
        return Ok(out);
    };
    if start >= range.end_exclusive {
        return Ok(out);
    }
    for end in fires {
        if out.len() == limit {
            return Err(Overflow {
                first_excluded: start,
            });
        }
        out.push(DataInterval::new(start, end));
        if end >= range.end_exclusive {
            break;
        }
        start = end;
    }
    // A last start that the schedule never follows has no interval.
    Ok(out)
}

/// Like [`expand`] with at most [`MAX_INTERVALS`], but an empty result or too many intervals is
/// an error that names the range.
pub(crate) fn expand_nonempty(
    schedule: &Schedule,
    range: Range,
    from: &str,
    to: &str,
) -> Result<Vec<DataInterval>, RangeError> {
    let intervals =
        expand(schedule, range, MAX_INTERVALS).map_err(|overflow| RangeError::TooMany {
            schedule: schedule.expr().to_string(),
            from: from.to_string(),
            to: to.to_string(),
            limit: MAX_INTERVALS,
            next_start: overflow.first_excluded,
            tz: schedule.tz(),
        })?;
    if intervals.is_empty() {
        return Err(RangeError::Empty {
            schedule: schedule.expr().to_string(),
            from: from.to_string(),
            to: to.to_string(),
        });
    }
    Ok(intervals)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn berlin() -> Tz {
        "Europe/Berlin".parse().unwrap()
    }

    fn intervals(expr: &str, tz: Tz, from: &str, to: &str) -> Vec<DataInterval> {
        let now = utc("2026-11-29T12:00:00Z");
        let s = Schedule::parse(expr, tz).unwrap();
        let range = resolve_range(
            parse_when(from, now, tz).unwrap(),
            parse_when(to, now, tz).unwrap(),
            tz,
        )
        .unwrap();
        expand(&s, range, MAX_INTERVALS).unwrap()
    }

    fn hours(i: &DataInterval) -> i64 {
        i.duration().num_hours()
    }

    #[test]
    fn daily_berlin_spring_forward_has_a_23_hour_interval() {
        let got = intervals("0 0 * * *", berlin(), "2026-03-27", "2026-03-31");
        let starts: Vec<_> = got.iter().map(|i| rfc3339(i.start)).collect();
        assert_eq!(
            starts,
            [
                "2026-03-26T23:00:00Z",
                "2026-03-27T23:00:00Z",
                "2026-03-28T23:00:00Z",
                "2026-03-29T22:00:00Z",
                "2026-03-30T22:00:00Z",
            ]
        );
        assert_eq!(
            got.iter().map(hours).collect::<Vec<_>>(),
            [24, 24, 23, 24, 24]
        );
        assert_eq!(got[2].ds(berlin()), "2026-03-29");
        assert_eq!(rfc3339(got[4].end), "2026-03-31T22:00:00Z");
    }

    #[test]
    fn daily_berlin_fall_back_has_a_25_hour_interval() {
        let got = intervals("0 0 * * *", berlin(), "2026-10-23", "2026-10-27");
        assert_eq!(
            got.iter().map(hours).collect::<Vec<_>>(),
            [24, 24, 25, 24, 24]
        );
        assert_eq!(rfc3339(got[2].start), "2026-10-24T22:00:00Z");
        assert_eq!(rfc3339(got[2].end), "2026-10-25T23:00:00Z");
        assert_eq!(got[2].ds(berlin()), "2026-10-25");
    }

    #[test]
    fn hourly_berlin_on_the_25_hour_day_gives_25_intervals() {
        let got = intervals("@hourly", berlin(), "2026-10-25", "2026-10-25");
        assert_eq!(got.len(), 25);
        assert_eq!(rfc3339(got[0].start), "2026-10-24T22:00:00Z");
        assert_eq!(rfc3339(got[24].end), "2026-10-25T23:00:00Z");
        assert!(got.iter().all(|i| hours(i) == 1));
    }

    #[test]
    fn hourly_berlin_on_the_23_hour_day_gives_23_intervals() {
        let got = intervals("@hourly", berlin(), "2026-03-29", "2026-03-29");
        assert_eq!(got.len(), 23);
    }

    #[test]
    fn monthly_utc_from_mid_month_gives_two_intervals() {
        let got = intervals("@monthly", Tz::UTC, "2026-01-15", "2026-03-31");
        assert_eq!(
            got,
            vec![
                DataInterval::new(utc("2026-02-01T00:00:00Z"), utc("2026-03-01T00:00:00Z")),
                DataInterval::new(utc("2026-03-01T00:00:00Z"), utc("2026-04-01T00:00:00Z")),
            ]
        );
    }

    #[test]
    fn datetime_to_is_inclusive_at_that_instant() {
        let got = intervals("@hourly", Tz::UTC, "2026-01-01T03:00", "2026-01-01T05:00");
        assert_eq!(got.len(), 3);
        let got = intervals("@hourly", Tz::UTC, "2026-01-01T03:00", "2026-01-01T04:59");
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn local_times_are_in_the_dag_timezone() {
        let got = intervals("@hourly", berlin(), "2026-01-01T03:00", "2026-01-01T03:00");
        assert_eq!(rfc3339(got[0].start), "2026-01-01T02:00:00Z");
        let got = intervals(
            "@hourly",
            berlin(),
            "2026-01-01T03:00:00Z",
            "2026-01-01T03:00:00+00:00",
        );
        assert_eq!(rfc3339(got[0].start), "2026-01-01T03:00:00Z");
    }

    #[test]
    fn rfc3339_matches_chrono() {
        for t in [
            "2026-09-01T00:00:00Z",
            "1999-12-31T23:59:59Z",
            "2026-03-29T01:00:00Z",
            "0999-01-02T03:04:05Z",
            "9999-12-31T23:59:59Z",
        ] {
            let t = utc(t);
            assert_eq!(rfc3339(t), t.to_rfc3339_opts(SecondsFormat::Secs, true));
        }
    }

    #[test]
    fn relative_whens() {
        let now = utc("2026-11-29T12:34:00Z");
        let tz = Tz::UTC;
        let date = |s: &str| When::Date(NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap());
        assert_eq!(parse_when("today", now, tz), Ok(date("2026-11-29")));
        assert_eq!(parse_when("yesterday", now, tz), Ok(date("2026-11-28")));
        assert_eq!(parse_when("today-7d", now, tz), Ok(date("2026-11-22")));
        assert_eq!(parse_when("today+1d", now, tz), Ok(date("2026-11-30")));
        assert_eq!(
            parse_when("now-6h", now, tz),
            Ok(When::Instant(utc("2026-11-29T06:34:00Z")))
        );
        assert_eq!(parse_when("now", now, tz), Ok(When::Instant(now)));
        // `today` is the DAG's local day: 23:30 UTC is already tomorrow in Tokyo.
        let late = utc("2026-11-29T23:30:00Z");
        let tokyo: Tz = "Asia/Tokyo".parse().unwrap();
        assert_eq!(parse_when("today", late, tokyo), Ok(date("2026-11-30")));
        for bad in [
            "tomorrow",
            "today-7",
            "now-6x",
            "2026-13-01",
            "2026-09-01T25:00",
        ] {
            assert!(parse_when(bad, now, tz).is_err(), "{bad}");
        }
    }

    #[test]
    fn from_after_to_is_an_error() {
        let now = utc("2026-11-29T12:00:00Z");
        let from = parse_when("2026-09-02", now, Tz::UTC).unwrap();
        let to = parse_when("2026-09-01", now, Tz::UTC).unwrap();
        let err = resolve_range(from, to, Tz::UTC).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--from 2026-09-02 is after --to 2026-09-01; swap them or pick a later --to"
        );
    }

    #[test]
    fn a_day_past_the_end_of_its_month_names_the_month_and_its_length() {
        let now = utc("2026-11-29T12:00:00Z");
        let message = |input: &str| parse_when(input, now, Tz::UTC).unwrap_err().to_string();
        for (input, reason) in [
            ("2026-09-31", "September has 30 days"),
            ("2026-04-31T06:00", "April has 30 days"),
            ("2026-01-32", "January has 31 days"),
            (
                "2026-02-29",
                "2026 is not a leap year: February 2026 has 28 days",
            ),
            (
                "1900-02-29 06:00:00",
                "1900 is not a leap year: February 1900 has 28 days",
            ),
            ("2028-02-30", "February 2028 has 29 days"),
            (
                "2026-13-01",
                "there is no month 13; months run from 01 to 12",
            ),
            (
                "2026-00-10",
                "there is no month 00; months run from 01 to 12",
            ),
            ("2026-09-00", "there is no day 00; days run from 01"),
        ] {
            assert_eq!(
                message(input),
                format!("cannot read `{input}` as a time: {reason}"),
                "{input}"
            );
        }
        // The last day of each month is a date, and a leap day in a leap year.
        for input in ["2026-09-30", "2028-02-29", "2000-02-29", "2026-12-31T23:59"] {
            assert!(parse_when(input, now, Tz::UTC).is_ok(), "{input}");
        }
        // Anything else that is not a date is still said to be so.
        assert!(message("2026-09-3x").contains("not a date, a datetime or a relative time"));
    }

    #[test]
    fn empty_range_is_an_error() {
        let s = Schedule::parse("@monthly", Tz::UTC).unwrap();
        let now = utc("2026-11-29T12:00:00Z");
        let range = resolve_range(
            parse_when("2026-01-02", now, Tz::UTC).unwrap(),
            parse_when("2026-01-20", now, Tz::UTC).unwrap(),
            Tz::UTC,
        )
        .unwrap();
        assert!(expand_nonempty(&s, range, "2026-01-02", "2026-01-20").is_err());
    }

    #[test]
    fn whens_that_used_to_panic_are_errors() {
        let now = utc("2026-11-29T12:34:00Z");
        for (input, reason) in [
            ("nowé", "expected now, now-6h or now+30m"),
            ("todayé", "expected today, today-Nd or today+Nd"),
            ("today-éd", "expected today, today-Nd or today+Nd"),
            ("today--5d", "expected today, today-Nd or today+Nd"),
            ("today-99999999999d", "out of range"),
            ("today+99999999999d", "out of range"),
            ("today-9999999999999999d", "out of range"),
            ("today-99999999999999999999999d", "out of range"),
            ("now-500000y", "out of range"),
            ("now+500000y", "out of range"),
        ] {
            assert_eq!(
                parse_when(input, now, Tz::UTC),
                Err(RangeError::BadWhen {
                    input: input.to_string(),
                    reason: reason.to_string(),
                }),
                "{input}"
            );
        }
        let message = parse_when("today-99999999999d", now, Tz::UTC)
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "cannot read `today-99999999999d` as a time: out of range; use 2026-09-01, 2026-09-01T06:00, an RFC 3339 instant, today, yesterday, today-7d or now-6h"
        );
        // At the edges of time, `today` and `yesterday` may not exist.
        let (min, max) = (DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC);
        assert!(parse_when("yesterday", min, Tz::UTC).is_err());
        assert!(parse_when("today", max, berlin()).is_err());
        assert!(parse_when("today+1d", max, Tz::UTC).is_err());
        assert!(parse_when("now+1s", max, Tz::UTC).is_err());
        assert_eq!(parse_when("now", max, berlin()), Ok(When::Instant(max)));
    }

    #[test]
    fn ranges_at_the_edges_of_time_are_errors() {
        let (min, max) = (DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC);
        let out_of_range = |w: When| RangeError::BadWhen {
            input: describe_when(w),
            reason: "out of range".to_string(),
        };
        let from = When::Instant(min);
        for to in [When::Instant(max), When::Date(NaiveDate::MAX)] {
            assert_eq!(resolve_range(from, to, Tz::UTC), Err(out_of_range(to)));
        }
        // West of UTC the last wall-clock time would come after the last instant.
        let west: Tz = "America/New_York".parse().unwrap();
        let to = When::Local(NaiveDateTime::MAX);
        assert_eq!(resolve_range(from, to, west), Err(out_of_range(to)));
        let from = When::Date(NaiveDate::MIN);
        assert_eq!(
            resolve_range(from, When::Instant(min), berlin()),
            Err(out_of_range(from))
        );
        // The widest range that exists is fine, and expanding it stops at the limit.
        let range = resolve_range(When::Instant(min), When::Date(NaiveDate::MIN), Tz::UTC);
        assert!(range.is_ok());
        let range = Range {
            start: min,
            end_exclusive: max,
        };
        let daily = Schedule::parse("@daily", berlin()).unwrap();
        let overflow = expand(&daily, range, 10).unwrap_err();
        assert_eq!(chrono::Datelike::year(&overflow.first_excluded), 1);
    }

    #[test]
    fn unix_start_bounds_are_the_starts_create_runs() {
        let now = utc("2026-11-29T12:00:00Z");
        let bounds = |from: &str, to: &str, tz: Tz| {
            resolve_args(from, to, now, tz).unwrap().unix_start_bounds()
        };
        let secs = |s: &str| utc(s).timestamp();
        // A datetime --to is inclusive at that instant: 05:00 is the start of the last interval.
        assert_eq!(
            bounds("2026-01-01T03:00", "2026-01-01T05:00", Tz::UTC),
            (secs("2026-01-01T03:00:00Z"), secs("2026-01-01T05:00:00Z"))
        );
        // A date --to covers its whole local day.
        assert_eq!(
            bounds("2026-01-01", "2026-01-02", berlin()),
            (secs("2025-12-31T23:00:00Z"), secs("2026-01-02T22:59:59Z"))
        );
        // An RFC 3339 --to is inclusive at that instant too.
        assert_eq!(
            bounds(
                "2026-01-01T00:00:00Z",
                "2026-01-01T05:00:00+02:00",
                berlin()
            ),
            (secs("2026-01-01T00:00:00Z"), secs("2026-01-01T03:00:00Z"))
        );
        // Sub-second bounds round inwards to whole seconds.
        assert_eq!(
            bounds("2026-01-01T00:00:00.5Z", "2026-01-01T00:00:09.5Z", Tz::UTC),
            (secs("2026-01-01T00:00:01Z"), secs("2026-01-01T00:00:09Z"))
        );
        // Exactly the starts that expand gives.
        let s = Schedule::parse("@hourly", Tz::UTC).unwrap();
        let range = resolve_args("2026-01-01T03:00", "2026-01-01T05:00", now, Tz::UTC).unwrap();
        let (first, last) = range.unix_start_bounds();
        let got = expand(&s, range, MAX_INTERVALS).unwrap();
        assert_eq!(got.first().map(|i| i.start.timestamp()), Some(first));
        assert_eq!(got.last().map(|i| i.start.timestamp()), Some(last));
    }

    #[test]
    fn expansion_stops_after_the_limit() {
        let s = Schedule::parse("@hourly", Tz::UTC).unwrap();
        let range = Range {
            start: utc("2026-01-01T00:00:00Z"),
            end_exclusive: utc("2026-01-01T10:00:00Z"),
        };
        assert_eq!(expand(&s, range, 10).map(|v| v.len()), Ok(10));
        assert_eq!(
            expand(&s, range, 9),
            Err(Overflow {
                first_excluded: utc("2026-01-01T09:00:00Z")
            })
        );
    }

    #[test]
    fn a_minutely_range_of_three_centuries_is_too_many() {
        let s = Schedule::parse("* * * * *", Tz::UTC).unwrap();
        let now = utc("2026-11-29T12:00:00Z");
        let range = resolve_args("1900-01-01", "2200-01-01", now, Tz::UTC).unwrap();
        let err = expand_nonempty(&s, range, "1900-01-01", "2200-01-01").unwrap_err();
        // Interval 1,000,001 starts 1,000,000 minutes after the first.
        let next = utc("1900-01-01T00:00:00Z") + Duration::minutes(1_000_000);
        assert_eq!(rfc3339(next), "1901-11-26T10:40:00Z");
        assert_eq!(
            err,
            RangeError::TooMany {
                schedule: "* * * * *".to_string(),
                from: "1900-01-01".to_string(),
                to: "2200-01-01".to_string(),
                limit: MAX_INTERVALS,
                next_start: next,
                tz: Tz::UTC,
            }
        );
        assert_eq!(
            err.to_string(),
            "the range --from 1900-01-01 --to 2200-01-01 holds more than 1,000,000 intervals of schedule `* * * * *`; split it into several backfills: the first up to --to 1901-11-26T10:39:59Z, the next from --from 1901-11-26T10:40:00Z"
        );
        // The suggested --to keeps exactly the first 1,000,000 intervals.
        let first = resolve_args("1900-01-01", "1901-11-26T10:39:59Z", now, Tz::UTC).unwrap();
        let kept = expand_nonempty(&s, first, "1900-01-01", "1901-11-26T10:39:59Z").unwrap();
        assert_eq!(kept.len(), MAX_INTERVALS);
        assert_eq!(kept.last().map(|i| i.end), Some(next));
    }

    #[test]
    fn the_suggested_split_is_in_the_dag_timezone() {
        let s = Schedule::parse("@hourly", berlin()).unwrap();
        let now = utc("2026-11-29T12:00:00Z");
        let range = resolve_args("2000-01-01", "2200-01-01", now, berlin()).unwrap();
        let err = expand_nonempty(&s, range, "2000-01-01", "2200-01-01").unwrap_err();
        let RangeError::TooMany { next_start, .. } = err else {
            panic!("{err}");
        };
        // 2114-01-29T15:00:00Z is 1,000,000 hours after 2000-01-01T00:00+01:00.
        assert_eq!(
            next_start,
            utc("1999-12-31T23:00:00Z") + Duration::hours(1_000_000)
        );
        assert_eq!(
            err.to_string(),
            "the range --from 2000-01-01 --to 2200-01-01 holds more than 1,000,000 intervals of schedule `@hourly`; split it into several backfills: the first up to --to 2114-01-29T15:59:59+01:00, the next from --from 2114-01-29T16:00:00+01:00"
        );
        assert_eq!(
            parse_when("2114-01-29T16:00:00+01:00", now, berlin()),
            Ok(When::Instant(next_start))
        );
    }

    fn arbitrary_now() -> impl Strategy<Value = DateTime<Utc>> {
        prop_oneof![
            Just(utc("2026-11-29T12:34:00Z")),
            (DateTime::<Utc>::MIN_UTC.timestamp()..=DateTime::<Utc>::MAX_UTC.timestamp())
                .prop_map(|s| DateTime::from_timestamp(s, 0).unwrap_or_default()),
        ]
    }

    fn zone() -> impl Strategy<Value = Tz> {
        prop::sample::select(vec![
            Tz::UTC,
            berlin(),
            "Pacific/Kiritimati".parse().unwrap(),
            "Pacific/Pago_Pago".parse().unwrap(),
        ])
    }

    /// Parses and resolves `input` as both ends of a range against fixed and extreme ones.
    fn parse_and_resolve(input: &str, now: DateTime<Utc>, tz: Tz) {
        let Ok(when) = parse_when(input, now, tz) else {
            return;
        };
        for other in [
            When::Instant(DateTime::<Utc>::MIN_UTC),
            When::Instant(DateTime::<Utc>::MAX_UTC),
            When::Date(NaiveDate::MIN),
            When::Date(NaiveDate::MAX),
            When::Local(NaiveDateTime::MIN),
            When::Local(NaiveDateTime::MAX),
            When::Instant(now),
        ] {
            let _ = resolve_range(when, other, tz).map(|r| r.unix_start_bounds());
            let _ = resolve_range(other, when, tz).map(|r| r.unix_start_bounds());
        }
    }

    proptest! {
        #[test]
        fn parse_when_never_panics_on_any_string(input in any::<String>(), now in arbitrary_now(), tz in zone()) {
            parse_and_resolve(&input, now, tz);
        }

        #[test]
        fn parse_when_never_panics_on_near_relative_times(
            input in "(today|now|yesterday)[+-][0-9]{0,25}[a-zé]{0,3}",
            now in arbitrary_now(),
            tz in zone(),
        ) {
            parse_and_resolve(&input, now, tz);
        }

        #[test]
        fn parse_when_never_panics_on_near_dates(
            input in "[+-]?[0-9]{1,6}-[0-9]{1,3}-[0-9]{1,3}(T[0-9:]{0,9})?([+-][0-9]{2}:[0-9]{2}|Z)?",
            now in arbitrary_now(),
            tz in zone(),
        ) {
            parse_and_resolve(&input, now, tz);
        }
    }

    const SCHEDULES: &[&str] = &[
        "@hourly",
        "@daily",
        "@weekly",
        "@monthly",
        "*/20 * * * *",
        "30 2 * * *",
        "15 1,2,3 * * 1-5",
        "0 */6 * * *",
        "0 12 1,15 * 1",
    ];
    const ZONES: &[&str] = &[
        "UTC",
        "Europe/Berlin",
        "America/New_York",
        "Australia/Lord_Howe",
        "Asia/Kolkata",
        "America/Sao_Paulo",
    ];

    /// The oracle's own reading of a 5-field cron expression: one bit per allowed value.
    struct Cron {
        minutes: u64,
        hours: u64,
        days: u64,
        months: u64,
        weekdays: u64,
        any_day: bool,
        any_weekday: bool,
    }

    impl Cron {
        fn parse(expr: &str) -> Self {
            let expr = match expr {
                "@hourly" => "0 * * * *",
                "@daily" => "0 0 * * *",
                "@weekly" => "0 0 * * 0",
                "@monthly" => "0 0 1 * *",
                "@yearly" => "0 0 1 1 *",
                other => other,
            };
            let f: Vec<&str> = expr.split(' ').collect();
            assert_eq!(f.len(), 5, "{expr}");
            let mut weekdays = Self::field(f[4], 0, 7);
            if weekdays & (1 << 7) != 0 {
                weekdays |= 1;
            }
            Self {
                minutes: Self::field(f[0], 0, 59),
                hours: Self::field(f[1], 0, 23),
                days: Self::field(f[2], 1, 31),
                months: Self::field(f[3], 1, 12),
                weekdays,
                any_day: f[2] == "*",
                any_weekday: f[4] == "*",
            }
        }

        /// A list of `*`, `n`, `a-b`, each optionally stepped with `/s`.
        fn field(text: &str, min: u32, max: u32) -> u64 {
            let mut bits = 0;
            for item in text.split(',') {
                let (range, step) = match item.split_once('/') {
                    Some((range, step)) => (range, step.parse::<u32>().unwrap()),
                    None => (item, 1),
                };
                let (lo, hi) = match range.split_once('-') {
                    _ if range == "*" => (min, max),
                    Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                    None => (range.parse().unwrap(), range.parse().unwrap()),
                };
                bits |= (lo..=hi).step_by(step as usize).fold(0, |b, v| b | 1 << v);
            }
            bits
        }

        /// Fires every hour: the documented rule for stepping in absolute time.
        fn hourly(&self) -> bool {
            self.hours == (1 << 24) - 1
        }

        fn matches(&self, t: NaiveDateTime) -> bool {
            use chrono::{Datelike, Timelike};
            let bit = |set: u64, v: u32| set & (1 << v) != 0;
            let day = bit(self.days, t.day());
            let weekday = bit(self.weekdays, t.weekday().num_days_from_sunday());
            // Cron's rule: with both day fields restricted, either one matching is enough.
            let day_ok = if self.any_day || self.any_weekday {
                (self.any_day || day) && (self.any_weekday || weekday)
            } else {
                day || weekday
            };
            bit(self.minutes, t.minute())
                && bit(self.hours, t.hour())
                && bit(self.months, t.month())
                && day_ok
        }
    }

    /// The fire times from `from` on, walking UTC in 5-minute steps (the tested zones' offsets are
    /// multiples of 15 minutes and the tested schedules fire on multiples of 5 minutes) and
    /// applying the README's DST rules to each instant's wall clock, until one at or after
    /// `until` is found.
    fn oracle(
        cron: &Cron,
        tz: Tz,
        from: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Vec<DateTime<Utc>> {
        let step = Duration::minutes(5);
        let wall = |t: DateTime<Utc>| t.with_timezone(&tz).naive_local();
        let mut out = Vec::new();
        let mut t = from;
        // The largest wall-clock time seen so far: a slower schedule fires when the wall clock
        // reaches or passes a matching time for the first time.
        let mut largest = wall(t) - step;
        while out.last().is_none_or(|last| *last < until) {
            let local = wall(t);
            let fires = if cron.hourly() {
                cron.matches(local)
            } else if local > largest {
                let mut minute = largest + Duration::minutes(1);
                let mut any = false;
                while minute <= local && !any {
                    any = cron.matches(minute);
                    minute += Duration::minutes(1);
                }
                largest = local;
                any
            } else {
                false
            };
            if fires {
                out.push(t);
            }
            t += step;
        }
        out
    }

    fn check_against_oracle(expr: &str, zone: &str, range: Range) -> Result<(), TestCaseError> {
        let tz: Tz = zone.parse().unwrap();
        let s = Schedule::parse(expr, tz).unwrap();
        let got = expand(&s, range, MAX_INTERVALS).unwrap();
        // Start the walk two days early, so that the wall clock's past is known at the range start.
        let from = Range {
            start: range.start - Duration::days(2),
            end_exclusive: range.end_exclusive,
        }
        .unix_start_bounds()
        .0;
        let from = from_unix(from - from.rem_euclid(300));
        let fires = oracle(&Cron::parse(expr), tz, from, range.end_exclusive);
        let starts: Vec<_> = fires
            .iter()
            .copied()
            .filter(|t| *t >= range.start && *t < range.end_exclusive)
            .collect();
        prop_assert_eq!(
            got.iter().map(|i| i.start).collect::<Vec<_>>(),
            starts.clone(),
            "{} in {}",
            expr,
            zone
        );
        // Each interval ends where the next one starts, the last one at the next fire time.
        let first = fires
            .iter()
            .position(|t| *t >= range.start)
            .unwrap_or(fires.len());
        let ends: Vec<_> = fires
            .iter()
            .copied()
            .skip(first + 1)
            .take(starts.len())
            .collect();
        prop_assert_eq!(got.iter().map(|i| i.end).collect::<Vec<_>>(), ends);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(150))]
        /// The intervals of any range are exactly those an independent oracle finds.
        #[test]
        fn intervals_match_an_independent_oracle(
            schedule in 0..SCHEDULES.len(),
            zone in 0..ZONES.len(),
            start_minute in 0i64..(3 * 365 * 24 * 60),
            length_minutes in 1i64..(20 * 24 * 60),
        ) {
            let base = utc("2025-01-01T00:00:00Z");
            let range = Range {
                start: base + Duration::minutes(start_minute),
                end_exclusive: base + Duration::minutes(start_minute + length_minutes),
            };
            check_against_oracle(SCHEDULES[schedule], ZONES[zone], range)?;
        }
    }

    /// Every schedule in every zone, over two days around each DST change of 2026.
    #[test]
    fn intervals_around_every_dst_change_match_the_oracle() {
        for zone in ZONES {
            let tz: Tz = zone.parse().unwrap();
            let offset = |t: DateTime<Utc>| tz.offset_from_utc_datetime(&t.naive_utc()).fix();
            let mut t = utc("2026-01-01T00:00:00Z");
            while t < utc("2027-01-01T00:00:00Z") {
                let next = t + Duration::hours(1);
                if offset(t) != offset(next) {
                    let range = Range {
                        start: t - Duration::hours(25),
                        end_exclusive: t + Duration::hours(26),
                    };
                    for expr in SCHEDULES {
                        check_against_oracle(expr, zone, range).unwrap();
                    }
                }
                t = next;
            }
        }
    }
}

//! Schedules: a preset or a 5-field cron expression in an IANA timezone, turned into fire times.
//!
//! Every daylight-saving rule of the project lives in this module:
//!
//! - A schedule that fires less often than hourly (its hour field does not cover every hour) is
//!   evaluated on local wall-clock time. A wall-clock fire time that falls into a DST gap moves to
//!   the first instant after the gap; one in a repeated hour fires once, at its first occurrence.
//!   So a local-midnight daily interval lasts 23 h or 25 h on DST days.
//! - A schedule that fires every hour (or more often) steps in absolute time: every instant whose
//!   local time matches fires, so a 25-hour local day has 25 hourly intervals and a 23-hour day 23.
//!
//! Fire times are enumerated lazily, one local day at a time: croner finds the next day on which
//! the expression matches, every time of day of the expression is mapped to its instants with the
//! rules above, and an instant is handed out once no later day can produce an earlier one. So a
//! range can be walked until a bound is reached without collecting it first.

use std::collections::VecDeque;

use chrono::{
    DateTime, Datelike, Duration, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, Offset,
    TimeZone, Timelike, Utc,
};
use chrono_tz::{GapInfo, Tz};
use croner::Cron;
use croner::parser::{CronParser, Seconds};

/// UTC offsets of the tz database stay under 16 hours either way (the largest is Manila's
/// local mean time before 1845, -15:56), so the instant of a wall-clock time is never earlier than
/// that wall-clock time read as UTC minus 16 hours.
const MAX_UTC_OFFSET: Duration = Duration::hours(16);

/// A wall clock never jumps by more than a day (Samoa skipped 2011-12-30; Alaska repeated a day in
/// 1867), and the tz database that chrono-tz bundles never changes a zone's offset twice within 48
/// hours. So an instant at or after `t` has a wall-clock time no earlier than that of `t` minus
/// this.
const MAX_CLOCK_JUMP: Duration = Duration::hours(25);

/// The last year croner searches; no schedule fires later.
const LAST_YEAR: i32 = croner::YEAR_UPPER_LIMIT;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScheduleError {
    #[error(
        "invalid schedule `{expr}`: {reason}; use a preset (@hourly, @daily, @weekly, @monthly, @yearly) or a 5-field cron expression such as `0 3 * * *`"
    )]
    Invalid { expr: String, reason: String },
}

/// A parsed schedule bound to its timezone.
#[derive(Debug, Clone)]
pub struct Schedule {
    expr: String,
    cron: Cron,
    tz: Tz,
    /// The wall-clock times of day at which it fires on a matching day, ascending.
    times: Vec<NaiveTime>,
    /// Fires every hour: step in absolute time rather than on the wall clock.
    absolute: bool,
}

impl Schedule {
    /// Parses a preset or a 5-field cron expression.
    pub fn parse(expr: &str, tz: Tz) -> Result<Self, ScheduleError> {
        let invalid = |reason: String| ScheduleError::Invalid {
            expr: expr.to_string(),
            reason,
        };
        let pattern = match expr.trim() {
            "@hourly" => "0 * * * *",
            "@daily" | "@midnight" => "0 0 * * *",
            "@weekly" => "0 0 * * 0",
            "@monthly" => "0 0 1 * *",
            "@yearly" | "@annually" => "0 0 1 1 *",
            other if other.starts_with('@') => {
                return Err(invalid("unknown preset".to_string()));
            }
            other => other,
        };
        let fields: Vec<&str> = pattern.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(invalid(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), found {}",
                fields.len()
            )));
        }
        let cron = cron_parser()
            .parse(pattern)
            .map_err(|_| invalid(explain(&fields)))?;
        // Probe that the pattern can ever fire (e.g. `0 0 31 2 *` never does).
        let never = || {
            invalid(
                "the expression never fires: no date matches its day and month fields".to_string(),
            )
        };
        let probe = NaiveDate::from_ymd_opt(2000, 1, 1).ok_or_else(never)?;
        cron.find_next_occurrence(&probe.and_time(NaiveTime::MIN), true)
            .map_err(|_| never())?;
        let hours = cron.pattern.hours.values();
        let minutes = cron.pattern.minutes.values();
        let times: Vec<NaiveTime> = hours
            .iter()
            .flat_map(|h| {
                minutes
                    .iter()
                    .filter_map(move |m| NaiveTime::from_hms_opt(u32::from(*h), u32::from(*m), 0))
            })
            .collect();
        if times.is_empty() {
            return Err(never());
        }
        Ok(Self {
            expr: expr.trim().to_string(),
            absolute: hours.len() == 24,
            cron,
            tz,
            times,
        })
    }

    /// Whether it fires at most once a day (one time of day): its intervals are named by their
    /// date.
    pub(crate) fn at_most_daily(&self) -> bool {
        self.times.len() == 1
    }

    pub(crate) fn expr(&self) -> &str {
        &self.expr
    }

    pub(crate) fn tz(&self) -> Tz {
        self.tz
    }

    /// The fire times `t` with `start <= t < end`, ascending, computed as they are consumed:
    /// taking the first `n` costs `n` fire times and a day or two around them, however long the
    /// range.
    pub(crate) fn fire_times(&self, start: DateTime<Utc>, end: DateTime<Utc>) -> FireTimes<'_> {
        // Every wall-clock time that maps to an instant at or after `start` lies on this day or
        // later: its wall clock is at most a clock jump before that of `start`, which is at most
        // an offset before `start` read as UTC.
        let first_day = start
            .naive_utc()
            .checked_sub_signed(MAX_UTC_OFFSET + MAX_CLOCK_JUMP)
            .map_or(NaiveDate::MIN, |t| t.date())
            .max(first_searchable_day());
        FireTimes {
            schedule: self,
            start,
            end,
            next_day: (start < end).then_some(first_day),
            watermark: earliest_instant_of_day(first_day),
            pending: VecDeque::new(),
            last: None,
        }
    }

    /// The first fire time `>= t`, or `None` when the schedule never fires again.
    #[cfg(test)]
    pub(crate) fn next_at_or_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.fire_times(t, DateTime::<Utc>::MAX_UTC).next()
    }

    /// The first fire time strictly after `t`.
    #[cfg(test)]
    pub(crate) fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.next_at_or_after(t.checked_add_signed(Duration::nanoseconds(1))?)
    }

    /// The first day at or after `day` on which the expression matches.
    fn next_matching_day(&self, day: NaiveDate) -> Option<NaiveDate> {
        if day.year() > LAST_YEAR {
            return None;
        }
        let found = self
            .cron
            .find_next_occurrence(&day.and_time(NaiveTime::MIN), true)
            .ok()?;
        Some(found.date())
    }

    /// Adds the instants at which the wall-clock times of a matching `day` fire to `pending`,
    /// keeping it ascending.
    fn push_day(&self, day: NaiveDate, pending: &mut VecDeque<DateTime<Utc>>) {
        let (Some(first), Some(last)) = (self.times.first(), self.times.last()) else {
            return;
        };
        let offset_at = |t: &NaiveTime| match self.tz.offset_from_local_datetime(&day.and_time(*t))
        {
            LocalResult::Single(o) => Some(o.fix()),
            _ => None,
        };
        // The same offset at the first and the last time of the day means no change in between
        // (no zone changes its offset twice within 48 hours): every time maps to one instant.
        match (offset_at(first), offset_at(last)) {
            (Some(a), Some(b)) if a == b => {
                for t in &self.times {
                    if let Some(utc) = day.and_time(*t).checked_sub_offset(a) {
                        insert_sorted(pending, utc.and_utc());
                    }
                }
            }
            _ => {
                let mut instants = Vec::with_capacity(self.times.len() + 1);
                for t in &self.times {
                    self.push_instants(day.and_time(*t), &mut instants);
                }
                for t in instants {
                    insert_sorted(pending, t);
                }
            }
        }
    }

    /// Maps one wall-clock match to the instants at which it fires.
    fn push_instants(&self, naive: NaiveDateTime, out: &mut Vec<DateTime<Utc>>) {
        match self.tz.from_local_datetime(&naive) {
            LocalResult::Single(t) => out.push(t.with_timezone(&Utc)),
            LocalResult::Ambiguous(first, second) => {
                out.push(first.with_timezone(&Utc));
                if self.absolute {
                    out.push(second.with_timezone(&Utc));
                }
            }
            LocalResult::None => {
                if !self.absolute {
                    out.extend(first_instant_after_gap(self.tz, naive));
                }
            }
        }
    }
}

/// The fire times of a schedule in a range, ascending: see [`Schedule::fire_times`].
#[derive(Debug)]
pub(crate) struct FireTimes<'a> {
    schedule: &'a Schedule,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    /// The next day to look for matches from; `None` once no later day can fire in the range.
    next_day: Option<NaiveDate>,
    /// Every instant not yet in `pending` is at or after this one.
    watermark: DateTime<Utc>,
    /// Instants found but not handed out yet, ascending.
    pending: VecDeque<DateTime<Utc>>,
    last: Option<DateTime<Utc>>,
}

impl Iterator for FireTimes<'_> {
    type Item = DateTime<Utc>;

    fn next(&mut self) -> Option<DateTime<Utc>> {
        loop {
            match self.pending.front().copied() {
                Some(t) if t < self.watermark || self.next_day.is_none() => {
                    self.pending.pop_front();
                    if t >= self.end {
                        // Everything still to come is later.
                        self.pending.clear();
                        self.next_day = None;
                        return None;
                    }
                    // A time in a DST gap moves onto the first time after it: fire once.
                    if t < self.start || self.last == Some(t) {
                        continue;
                    }
                    self.last = Some(t);
                    return Some(t);
                }
                None if self.next_day.is_none() => return None,
                _ => self.advance(),
            }
        }
    }
}

impl FireTimes<'_> {
    /// Maps the next matching day to its instants, or ends the search.
    fn advance(&mut self) {
        let Some(day) = self.next_day.take() else {
            return;
        };
        if self.watermark >= self.end {
            return;
        }
        let Some(day) = self.schedule.next_matching_day(day) else {
            return;
        };
        self.schedule.push_day(day, &mut self.pending);
        if let Some(next) = day.succ_opt() {
            self.next_day = Some(next);
            self.watermark = earliest_instant_of_day(next);
        }
    }
}

/// A lower bound of the instants whose wall-clock time lies on `day` or later, in any zone.
fn earliest_instant_of_day(day: NaiveDate) -> DateTime<Utc> {
    day.and_time(NaiveTime::MIN)
        .and_utc()
        .checked_sub_signed(MAX_UTC_OFFSET)
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Croner searches years 1 to 5000.
fn first_searchable_day() -> NaiveDate {
    NaiveDate::from_ymd_opt(1, 1, 1).unwrap_or(NaiveDate::MIN)
}

fn insert_sorted(pending: &mut VecDeque<DateTime<Utc>>, t: DateTime<Utc>) {
    match pending.back() {
        Some(last) if *last > t => {
            let at = pending.partition_point(|x| *x <= t);
            pending.insert(at, t);
        }
        _ => pending.push_back(t),
    }
}

fn cron_parser() -> CronParser {
    CronParser::builder().seconds(Seconds::Disallowed).build()
}

/// One field of a 5-field cron expression, for error messages.
struct Field {
    name: &'static str,
    min: u16,
    max: u16,
}

const FIELDS: [Field; 5] = [
    Field {
        name: "minute",
        min: 0,
        max: 59,
    },
    Field {
        name: "hour",
        min: 0,
        max: 23,
    },
    Field {
        name: "day-of-month",
        min: 1,
        max: 31,
    },
    Field {
        name: "month",
        min: 1,
        max: 12,
    },
    Field {
        name: "day-of-week",
        min: 0,
        max: 7,
    },
];

/// Says in the project's words why croner rejected a 5-field expression: the first field that
/// is wrong and what is wrong with it.
fn explain(fields: &[&str]) -> String {
    for (field, text) in FIELDS.iter().zip(fields) {
        if let Err(reason) = check_field(field, text) {
            return reason;
        }
    }
    // A field using croner's extensions (L, W, #): find the one croner rejects on its own.
    for (i, (field, text)) in FIELDS.iter().zip(fields).enumerate() {
        let mut alone = ["*"; 5];
        alone[i] = text;
        if cron_parser().parse(&alone.join(" ")).is_err() {
            return not_a_field(field, text);
        }
    }
    "not a valid 5-field cron expression".to_string()
}

fn not_a_field(field: &Field, text: &str) -> String {
    format!(
        "{} `{text}` is not a number ({}-{}), a range (1-5), a step (*/15) or a list of them (1,15)",
        field.name, field.min, field.max
    )
}

/// Checks one field against the standard cron grammar, as croner reads it (names of months and
/// weekdays, `?` for `*`), leaving croner's extensions (L, W, #) alone.
fn check_field(field: &Field, text: &str) -> Result<(), String> {
    let mut value = text.to_uppercase();
    for (name, number) in [
        ("-SUN", "-7"),
        ("SUN", "0"),
        ("MON", "1"),
        ("TUE", "2"),
        ("WED", "3"),
        ("THU", "4"),
        ("FRI", "5"),
        ("SAT", "6"),
        ("JAN", "1"),
        ("FEB", "2"),
        ("MAR", "3"),
        ("APR", "4"),
        ("MAY", "5"),
        ("JUN", "6"),
        ("JUL", "7"),
        ("AUG", "8"),
        ("SEP", "9"),
        ("OCT", "10"),
        ("NOV", "11"),
        ("DEC", "12"),
    ] {
        value = value.replace(name, number);
    }
    let extensions: &[char] = match field.name {
        "day-of-month" => &['L', 'W'],
        "day-of-week" => &['L', '#'],
        _ => &[],
    };
    if !extensions.is_empty() {
        value = value.replace('?', "*");
    }
    if field.name == "day-of-week" {
        value = value.strip_prefix('+').unwrap_or(&value).to_string();
    }
    if value == "*" {
        return Ok(());
    }
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.chars().any(|c| extensions.contains(&c)) {
            continue;
        }
        if !part
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '*' | '/' | '-'))
        {
            return Err(not_a_field(field, text));
        }
        check_part(field, part)?;
    }
    Ok(())
}

/// Checks one item of a list: a number, a range `a-b`, or a step `*/n` or `a-b/n`.
fn check_part(field: &Field, part: &str) -> Result<(), String> {
    let name = field.name;
    let Some((range, step)) = part.split_once('/') else {
        return match part.split_once('-') {
            Some((a, b)) => check_range(field, a, b, part),
            None => check_number(field, part, part).map(|_| ()),
        };
    };
    if step.is_empty() || !step.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{name} `{part}` is not a step; write */15 or 1-30/15"
        ));
    }
    let Ok(step_value) = step.parse::<u16>() else {
        return Err(format!("the step of {name} `{part}` is too large"));
    };
    if step_value == 0 {
        return Err(format!(
            "the step of {name} `{part}` is 0; a step is at least 1"
        ));
    }
    if range == "*" {
        return Ok(());
    }
    if range.is_empty() {
        return Err(format!(
            "{name} `{part}` has nothing before the /; write */{step}"
        ));
    }
    match range.split_once('-') {
        Some((a, b)) => check_range(field, a, b, part),
        None => {
            check_number(field, range, part)?;
            Err(format!(
                "{name} `{part}` steps from a single value; write {range}-{}/{step}, or */{step} to start at {}",
                field.max, field.min
            ))
        }
    }
}

fn check_range(field: &Field, a: &str, b: &str, part: &str) -> Result<(), String> {
    let start = check_number(field, a, part)?;
    let end = check_number(field, b, part)?;
    if start > end {
        return Err(format!(
            "{} range {start}-{end} runs backwards; ranges do not wrap around, so write {start}-{},{}-{end}",
            field.name, field.max, field.min
        ));
    }
    Ok(())
}

fn check_number(field: &Field, text: &str, part: &str) -> Result<u16, String> {
    let name = field.name;
    if text.is_empty() || !text.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!(
            "{name} `{part}` is not a number ({}-{}), a range (1-5) or a step (*/15)",
            field.min, field.max
        ));
    }
    match text.parse::<u16>() {
        Ok(v) if (field.min..=field.max).contains(&v) => Ok(v),
        _ => Err(format!(
            "{name} {text} is out of range {}-{}",
            field.min, field.max
        )),
    }
}

/// Resolves a wall-clock time to an instant with the project's DST rules: the first occurrence of
/// a repeated time, and the first instant after the gap for a time that does not exist. `None`
/// only for a wall-clock time at the edge of the range of instants that can be represented.
pub(crate) fn resolve_local(tz: Tz, naive: NaiveDateTime) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(&naive) {
        LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
        LocalResult::Ambiguous(first, _) => Some(first.with_timezone(&Utc)),
        LocalResult::None => first_instant_after_gap(tz, naive),
    }
}

/// The instant at which the clock jumps over the gap holding `naive`: its wall-clock time is the
/// first one that exists again.
fn first_instant_after_gap(tz: Tz, naive: NaiveDateTime) -> Option<DateTime<Utc>> {
    // Not a gap of the zone: the wall-clock time lies beyond the representable instants.
    let gap = GapInfo::new(&naive, &tz)?;
    if let Some(end) = gap.end {
        return Some(end.with_timezone(&Utc));
    }
    // A gap whose end the zone data does not name: the first minute that exists again.
    let mut probe = naive
        .date()
        .and_hms_opt(naive.time().hour(), naive.time().minute(), 0)?;
    for _ in 0..MAX_CLOCK_JUMP.num_minutes() {
        probe = probe.checked_add_signed(Duration::minutes(1))?;
        match tz.from_local_datetime(&probe) {
            LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => {
                return Some(t.with_timezone(&Utc));
            }
            LocalResult::None => {}
        }
    }
    None
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

    fn fires(expr: &str, from: &str, to: &str) -> Vec<DateTime<Utc>> {
        Schedule::parse(expr, Tz::UTC)
            .unwrap()
            .fire_times(utc(from), utc(to))
            .collect()
    }

    fn every(first: &str, step: Duration, count: i64) -> Vec<DateTime<Utc>> {
        (0..count).map(|i| utc(first) + step * i as i32).collect()
    }

    #[test]
    fn presets_and_cron_fire_when_they_say() {
        let jan = "2026-01-01T00:00:00Z";
        // Every hour on the hour.
        assert_eq!(
            fires("@hourly", jan, "2026-01-03T00:00:00Z"),
            every(jan, Duration::hours(1), 48)
        );
        // Every midnight.
        for daily in ["@daily", "@midnight", "0 0 * * *"] {
            assert_eq!(
                fires(daily, jan, "2026-01-04T00:00:00Z"),
                every(jan, Duration::days(1), 3)
            );
        }
        // Sundays at midnight: 2026-01-04 is the first Sunday of the year.
        assert_eq!(
            fires("@weekly", jan, "2026-02-01T00:00:00Z"),
            every("2026-01-04T00:00:00Z", Duration::weeks(1), 4)
        );
        // The first of every month at midnight.
        let firsts: Vec<_> = (1..=12)
            .map(|m| utc(&format!("2026-{m:02}-01T00:00:00Z")))
            .collect();
        assert_eq!(fires("@monthly", jan, "2027-01-01T00:00:00Z"), firsts);
        // January 1st at midnight.
        for yearly in ["@yearly", "@annually"] {
            assert_eq!(
                fires(yearly, "2025-06-01T00:00:00Z", "2029-01-01T00:00:00Z"),
                [
                    utc("2026-01-01T00:00:00Z"),
                    utc("2027-01-01T00:00:00Z"),
                    utc("2028-01-01T00:00:00Z"),
                ]
            );
        }
        assert_eq!(
            fires("*/15 * * * *", jan, "2026-01-01T02:00:00Z"),
            every(jan, Duration::minutes(15), 8)
        );
        // Weekdays at 03:00: Monday 2026-01-05 to Friday 2026-01-09, not the weekends around.
        assert_eq!(
            fires(
                "0 3 * * 1-5",
                "2026-01-03T00:00:00Z",
                "2026-01-12T00:00:00Z"
            ),
            every("2026-01-05T03:00:00Z", Duration::days(1), 5)
        );
        // Day of month and day of week both restricted: either matches (cron's rule).
        assert_eq!(
            fires(
                "0 12 13 * 5",
                "2026-03-01T00:00:00Z",
                "2026-03-21T00:00:00Z"
            ),
            [
                utc("2026-03-06T12:00:00Z"),
                utc("2026-03-13T12:00:00Z"),
                utc("2026-03-20T12:00:00Z"),
            ]
        );
        assert_eq!(
            fires(
                "0 12 14 * 5",
                "2026-03-01T00:00:00Z",
                "2026-03-21T00:00:00Z"
            ),
            [
                utc("2026-03-06T12:00:00Z"),
                utc("2026-03-13T12:00:00Z"),
                utc("2026-03-14T12:00:00Z"),
                utc("2026-03-20T12:00:00Z"),
            ]
        );
    }

    #[test]
    fn invalid_expressions_are_rejected_with_the_reason() {
        for (expr, reason) in [
            ("@fortnightly", "unknown preset"),
            (
                "0 0 * *",
                "expected 5 fields (minute hour day-of-month month day-of-week), found 4",
            ),
            (
                "0 0 0 * * *",
                "expected 5 fields (minute hour day-of-month month day-of-week), found 6",
            ),
            (
                "banana",
                "expected 5 fields (minute hour day-of-month month day-of-week), found 1",
            ),
            ("61 * * * *", "minute 61 is out of range 0-59"),
            ("0 24 * * *", "hour 24 is out of range 0-23"),
            ("0 0 0 * *", "day-of-month 0 is out of range 1-31"),
            ("0 0 1 13 *", "month 13 is out of range 1-12"),
            ("0 0 * * 8", "day-of-week 8 is out of range 0-7"),
            ("0 0 * * 1-9", "day-of-week 9 is out of range 0-7"),
            (
                "0 0 * JAN-FOO *",
                "month `JAN-FOO` is not a number (1-12), a range (1-5), a step (*/15) or a list of them (1,15)",
            ),
            (
                "0 0 * JAN-DEC/0 *",
                "the step of month `1-12/0` is 0; a step is at least 1",
            ),
            (
                "0 0 * * FRI-MON",
                "day-of-week range 5-1 runs backwards; ranges do not wrap around, so write 5-7,0-1",
            ),
            ("99999 * * * *", "minute 99999 is out of range 0-59"),
            (
                "0 22-2 * * *",
                "hour range 22-2 runs backwards; ranges do not wrap around, so write 22-23,0-2",
            ),
            (
                "*/0 * * * *",
                "the step of minute `*/0` is 0; a step is at least 1",
            ),
            (
                "*/ * * * *",
                "minute `*/` is not a step; write */15 or 1-30/15",
            ),
            (
                "*/5/5 * * * *",
                "minute `*/5/5` is not a step; write */15 or 1-30/15",
            ),
            (
                "*/-5 * * * *",
                "minute `*/-5` is not a step; write */15 or 1-30/15",
            ),
            (
                "*/99999 * * * *",
                "the step of minute `*/99999` is too large",
            ),
            (
                "/5 * * * *",
                "minute `/5` has nothing before the /; write */5",
            ),
            (
                "5/15 * * * *",
                "minute `5/15` steps from a single value; write 5-59/15, or */15 to start at 0",
            ),
            (
                "x * * * *",
                "minute `x` is not a number (0-59), a range (1-5), a step (*/15) or a list of them (1,15)",
            ),
            (
                "0 L * * *",
                "hour `L` is not a number (0-23), a range (1-5), a step (*/15) or a list of them (1,15)",
            ),
            (
                "0 0 * * 1#9",
                "day-of-week `1#9` is not a number (0-7), a range (1-5), a step (*/15) or a list of them (1,15)",
            ),
            (
                "0 0 31 2 *",
                "the expression never fires: no date matches its day and month fields",
            ),
        ] {
            match Schedule::parse(expr, Tz::UTC) {
                Err(ScheduleError::Invalid {
                    expr: echoed,
                    reason: got,
                }) => {
                    assert_eq!(echoed, expr);
                    assert_eq!(got, reason, "{expr}");
                }
                Ok(_) => panic!("`{expr}` was accepted"),
            }
        }
        let message = Schedule::parse("61 * * * *", Tz::UTC)
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "invalid schedule `61 * * * *`: minute 61 is out of range 0-59; use a preset (@hourly, @daily, @weekly, @monthly, @yearly) or a 5-field cron expression such as `0 3 * * *`"
        );
    }

    #[test]
    fn spring_forward_gap_moves_to_first_instant_after_gap() {
        // 02:30 does not exist in Berlin on 2026-03-29: it fires at 03:00 CEST = 01:00 UTC.
        let s = Schedule::parse("30 2 * * *", berlin()).unwrap();
        let fires = s
            .fire_times(utc("2026-03-28T00:00:00Z"), utc("2026-03-31T00:00:00Z"))
            .collect::<Vec<_>>();
        assert_eq!(
            fires,
            vec![
                utc("2026-03-28T01:30:00Z"),
                utc("2026-03-29T01:00:00Z"),
                utc("2026-03-30T00:30:00Z"),
            ]
        );
    }

    #[test]
    fn repeated_hour_fires_once_at_first_occurrence() {
        // 02:30 happens twice in Berlin on 2026-10-25: fire at the first (CEST, 00:30 UTC).
        let s = Schedule::parse("30 2 * * *", berlin()).unwrap();
        let fires = s
            .fire_times(utc("2026-10-24T12:00:00Z"), utc("2026-10-26T12:00:00Z"))
            .collect::<Vec<_>>();
        assert_eq!(
            fires,
            vec![utc("2026-10-25T00:30:00Z"), utc("2026-10-26T01:30:00Z")]
        );
    }

    #[test]
    fn hourly_steps_in_absolute_time_across_dst() {
        let s = Schedule::parse("@hourly", berlin()).unwrap();
        // Local 2026-10-25 lasts 25 hours: 22:00Z on the 24th to 23:00Z on the 25th.
        let fall = s
            .fire_times(utc("2026-10-24T22:00:00Z"), utc("2026-10-25T23:00:00Z"))
            .collect::<Vec<_>>();
        assert_eq!(fall.len(), 25);
        assert!(fall.windows(2).all(|w| w[1] - w[0] == Duration::hours(1)));
        // Local 2026-03-29 lasts 23 hours.
        let spring = s
            .fire_times(utc("2026-03-28T23:00:00Z"), utc("2026-03-29T22:00:00Z"))
            .collect::<Vec<_>>();
        assert_eq!(spring.len(), 23);
        assert!(spring.windows(2).all(|w| w[1] - w[0] == Duration::hours(1)));
    }

    #[test]
    fn next_at_or_after_finds_sparse_fires() {
        let s = Schedule::parse("@yearly", berlin()).unwrap();
        assert_eq!(
            s.next_at_or_after(utc("2026-01-01T00:00:00Z")),
            Some(utc("2026-12-31T23:00:00Z"))
        );
        assert_eq!(
            s.next_after(utc("2026-12-31T23:00:00Z")),
            Some(utc("2027-12-31T23:00:00Z"))
        );
        let s = Schedule::parse("0 0 29 2 *", Tz::UTC).unwrap();
        assert_eq!(
            s.next_at_or_after(utc("2026-03-01T00:00:00Z")),
            Some(utc("2028-02-29T00:00:00Z"))
        );
    }

    #[test]
    fn resolve_local_gap_and_fold() {
        let naive = |s: &str| NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M").unwrap();
        assert_eq!(
            resolve_local(berlin(), naive("2026-03-29 02:15")),
            Some(utc("2026-03-29T01:00:00Z"))
        );
        assert_eq!(
            resolve_local(berlin(), naive("2026-10-25 02:15")),
            Some(utc("2026-10-25T00:15:00Z"))
        );
    }

    #[test]
    fn wall_clock_edges_of_the_representable_range() {
        let naive = |s: &str| NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M").unwrap();
        // The last wall-clock time east of UTC is an hour before the last instant; west of
        // UTC it would come after it.
        let west: Tz = "America/New_York".parse().unwrap();
        assert_eq!(
            resolve_local(berlin(), NaiveDateTime::MAX),
            NaiveDateTime::MAX
                .and_utc()
                .checked_sub_signed(Duration::hours(1))
        );
        assert_eq!(resolve_local(west, NaiveDateTime::MAX), None);
        assert_eq!(resolve_local(berlin(), NaiveDateTime::MIN), None);
        assert_eq!(
            resolve_local(Tz::UTC, NaiveDateTime::MIN),
            Some(NaiveDateTime::MIN.and_utc())
        );
        assert_eq!(
            resolve_local(berlin(), naive("2026-06-01 12:00")),
            Some(utc("2026-06-01T10:00:00Z"))
        );
    }

    #[test]
    fn a_skipped_day_fires_once_right_after_it() {
        // Samoa skipped 2011-12-30: the 29th ended at 10:00 UTC (-10:00) and the 31st began
        // (+14:00). The 30th's noon fires when the 31st begins.
        let apia: Tz = "Pacific/Apia".parse().unwrap();
        let s = Schedule::parse("0 12 * * *", apia).unwrap();
        let fires: Vec<_> = s
            .fire_times(utc("2011-12-28T00:00:00Z"), utc("2011-12-31T00:00:00Z"))
            .collect();
        assert_eq!(
            fires,
            [
                utc("2011-12-28T22:00:00Z"),
                utc("2011-12-29T22:00:00Z"),
                utc("2011-12-30T10:00:00Z"),
                utc("2011-12-30T22:00:00Z"),
            ]
        );
        // Hourly steps in absolute time: the skipped day has no hour at all.
        let s = Schedule::parse("@hourly", apia).unwrap();
        let hours: Vec<_> = s
            .fire_times(utc("2011-12-30T08:00:00Z"), utc("2011-12-30T12:00:00Z"))
            .collect();
        assert_eq!(hours, every("2011-12-30T08:00:00Z", Duration::hours(1), 4));
    }

    #[test]
    fn a_repeated_day_fires_once_at_its_first_occurrence() {
        // Sitka moved from Russian to American time in 1867: the wall clock went back a day
        // (+14:58:47 to -09:01:13), so most of 1867-10-19 happened twice.
        let sitka: Tz = "America/Sitka".parse().unwrap();
        let s = Schedule::parse("0 12 * * *", sitka).unwrap();
        let fires: Vec<_> = s
            .fire_times(utc("1867-10-17T00:00:00Z"), utc("1867-10-21T00:00:00Z"))
            .map(|t| t.with_timezone(&sitka).naive_local().to_string())
            .collect();
        assert_eq!(
            fires,
            [
                "1867-10-18 12:00:00",
                "1867-10-19 12:00:00",
                "1867-10-20 12:00:00",
            ]
        );
        // The noon of the 19th repeated after the change does not fire again.
        let daily = s
            .fire_times(utc("1867-10-17T00:00:00Z"), utc("1867-10-21T00:00:00Z"))
            .collect::<Vec<_>>();
        assert_eq!(daily[2] - daily[1], Duration::hours(48));
        // Hourly steps in absolute time: a day later by the calendar, an hour later by the clock.
        let s = Schedule::parse("@hourly", sitka).unwrap();
        let hours: Vec<_> = s
            .fire_times(utc("1867-10-18T12:00:00Z"), utc("1867-10-19T12:00:00Z"))
            .collect();
        assert_eq!(hours, every("1867-10-18T12:01:13Z", Duration::hours(1), 24));
        // The same east of UTC: Samoa lived 1892-07-04 twice, going from +12:33 to -11:26.
        let apia: Tz = "Pacific/Apia".parse().unwrap();
        let s = Schedule::parse("@hourly", apia).unwrap();
        let hours: Vec<_> = s
            .fire_times(utc("1892-07-03T00:00:00Z"), utc("1892-07-06T00:00:00Z"))
            .collect();
        assert_eq!(hours.len(), 72);
        assert!(hours.windows(2).all(|w| w[1] - w[0] == Duration::hours(1)));
    }

    #[test]
    fn fire_times_at_the_edges_of_time() {
        let (min, max) = (DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC);
        for tz in [Tz::UTC, berlin(), "Pacific/Kiritimati".parse().unwrap()] {
            let s = Schedule::parse("@hourly", tz).unwrap();
            // Croner searches the years 1 to 5000.
            let first = s.next_at_or_after(min).unwrap();
            assert!(first.year() <= 1, "{first}");
            assert_eq!(s.fire_times(min, max).take(3).count(), 3);
            let last = s.next_at_or_after(utc("5000-12-31T00:00:00Z")).unwrap();
            assert!(last.year() >= 5000, "{last}");
            assert_eq!(s.next_at_or_after(utc("5002-01-01T00:00:00Z")), None);
            assert_eq!(s.next_at_or_after(max), None);
            assert_eq!(s.next_after(max), None);
            assert_eq!(s.fire_times(max, min).next(), None);
        }
    }

    fn check_parse(expr: &str) -> Result<(), TestCaseError> {
        match Schedule::parse(expr, berlin()) {
            Ok(s) => {
                let from = utc("2026-03-28T00:00:00Z");
                let fires: Vec<_> = s.fire_times(from, from + Duration::days(3)).collect();
                prop_assert!(fires.windows(2).all(|w| w[0] < w[1]));
                let next = s.next_after(from);
                prop_assert!(next.is_some());
            }
            Err(e) => {
                let message = e.to_string();
                for croner in [
                    "Component error",
                    "CronPattern",
                    "CronScheduler",
                    "Invalid pattern",
                    "Pattern ",
                    "out of bounds",
                    "Nth specifier",
                    "Invalid ",
                ] {
                    prop_assert!(!message.contains(croner), "{}", message);
                }
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn parse_never_panics_on_any_string(expr in any::<String>()) {
            check_parse(&expr)?;
        }

        #[test]
        fn parse_never_panics_on_near_cron(
            expr in "[0-9*/,-]{1,6} [0-9*/,-]{1,6} [0-9*/,-]{1,6} [0-9*/,-]{1,6} [0-9*/,-]{1,6}",
        ) {
            check_parse(&expr)?;
        }

        #[test]
        fn parse_never_panics_on_cron_with_names_and_extensions(
            expr in "[0-9*/,?LW#+A-Z-]{1,7} [0-9*/,?LW#+A-Z-]{1,7} [0-9*/,?LW#+A-Z-]{1,7} [0-9*/,?LW#+A-Z-]{1,7} [0-9*/,?LW#+A-Za-z-]{1,7}",
        ) {
            check_parse(&expr)?;
        }

        #[test]
        fn fire_times_never_panic_on_any_instant(
            seconds in prop_oneof![
                DateTime::<Utc>::MIN_UTC.timestamp()..=DateTime::<Utc>::MAX_UTC.timestamp(),
                // The years croner searches, and a little around them.
                -62_200_000_000i64..95_700_000_000,
            ],
            expr in prop::sample::select(vec!["@hourly", "@daily", "30 2 * * *", "*/20 * * * *", "0 0 29 2 *"]),
            zone in prop::sample::select(vec!["UTC", "Europe/Berlin", "Pacific/Apia", "America/Sitka", "Asia/Manila"]),
        ) {
            let tz: Tz = zone.parse().unwrap();
            let s = Schedule::parse(expr, tz).unwrap();
            let t = DateTime::from_timestamp(seconds, 0).unwrap();
            let soon = t.checked_add_signed(Duration::days(2)).unwrap_or(DateTime::<Utc>::MAX_UTC);
            let fires: Vec<_> = s.fire_times(t, soon).collect();
            prop_assert!(fires.iter().all(|f| *f >= t && *f < soon));
            // The first fire time of the range is the next one; without one, the next is later.
            match (fires.first(), s.next_at_or_after(t)) {
                (Some(first), next) => prop_assert_eq!(Some(*first), next),
                (None, Some(next)) => prop_assert!(next >= soon),
                (None, None) => {}
            }
            if let Some(after) = s.next_after(t) {
                prop_assert!(after > t);
            }
            let _ = resolve_local(tz, t.naive_utc());
        }
    }
}

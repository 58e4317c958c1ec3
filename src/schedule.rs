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
//! Fire times are computed by enumerating wall-clock matches with croner over a window that is
//! padded by a few hours on both sides, mapping them to instants with the rules above, then sorting
//! and trimming to the requested range. The padding makes the result exact at the window edges.

use chrono::{DateTime, Duration, LocalResult, NaiveDateTime, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds};

/// Padding around a search window: larger than any UTC offset change.
const PAD_HOURS: i64 = 3;

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
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .build()
            .parse(pattern)
            .map_err(|e| invalid(e.to_string()))?;
        // Probe that the pattern can ever fire (e.g. `0 0 31 2 *` never does).
        let probe = NaiveDateTime::parse_from_str("2000-01-01 00:00", "%Y-%m-%d %H:%M")
            .map_err(|e| invalid(e.to_string()))?;
        cron.find_next_occurrence(&probe, true)
            .map_err(|_| invalid("the expression never fires".to_string()))?;
        let absolute = matches!(fields[1], "*" | "*/1" | "0-23");
        Ok(Self {
            expr: expr.trim().to_string(),
            cron,
            tz,
            absolute,
        })
    }

    pub fn expr(&self) -> &str {
        &self.expr
    }

    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// All fire times `t` with `start <= t < end`, ascending.
    pub fn fire_times(&self, start: DateTime<Utc>, end: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        if start >= end {
            return Vec::new();
        }
        let pad = Duration::hours(PAD_HOURS);
        let lo = self.naive_local(start) - pad;
        let hi = self.naive_local(end) + pad;
        let mut out = Vec::new();
        let mut cursor = lo;
        let mut inclusive = true;
        while let Ok(naive) = self.cron.find_next_occurrence(&cursor, inclusive) {
            if naive > hi {
                break;
            }
            self.push_instants(naive, &mut out);
            cursor = naive;
            inclusive = false;
        }
        out.sort_unstable();
        out.dedup();
        out.retain(|t| *t >= start && *t < end);
        out
    }

    /// The first fire time `>= t`, or `None` when the schedule never fires again.
    pub fn next_at_or_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut lo = t;
        // Each step advances by at least a day, and croner jumps straight to the next wall-clock
        // match, so sparse schedules (yearly) need few iterations.
        for _ in 0..10_000 {
            let from = self.naive_local(lo) - Duration::hours(PAD_HOURS);
            let next = self.cron.find_next_occurrence(&from, true).ok()?;
            let guess = Utc.from_utc_datetime(&next) - Duration::hours(PAD_HOURS * 10);
            let hi = guess.max(lo) + Duration::days(2);
            if let Some(first) = self.fire_times(lo, hi).first() {
                return Some(*first);
            }
            lo = hi;
        }
        None
    }

    /// The first fire time strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.next_at_or_after(t + Duration::nanoseconds(1))
    }

    /// Wall-clock time of an instant in this schedule's timezone.
    fn naive_local(&self, t: DateTime<Utc>) -> NaiveDateTime {
        t.with_timezone(&self.tz).naive_local()
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
                    out.push(resolve_local(self.tz, naive));
                }
            }
        }
    }
}

/// Resolves a wall-clock time to an instant with the project's DST rules: the first occurrence of
/// a repeated time, and the first instant after the gap for a time that does not exist.
pub fn resolve_local(tz: Tz, naive: NaiveDateTime) -> DateTime<Utc> {
    match tz.from_local_datetime(&naive) {
        LocalResult::Single(t) => t.with_timezone(&Utc),
        LocalResult::Ambiguous(first, _) => first.with_timezone(&Utc),
        LocalResult::None => {
            // The first instant after the gap is the transition itself, whose wall-clock time is
            // the first minute that exists again. Gaps last at most a few hours.
            let mut probe = naive
                .with_second(0)
                .unwrap_or(naive)
                .with_nanosecond(0)
                .unwrap_or(naive);
            for _ in 0..(24 * 60) {
                probe += Duration::minutes(1);
                match tz.from_local_datetime(&probe) {
                    LocalResult::Single(t) => return t.with_timezone(&Utc),
                    LocalResult::Ambiguous(first, _) => return first.with_timezone(&Utc),
                    LocalResult::None => {}
                }
            }
            // Unreachable with real timezone data; read the time as UTC rather than fail.
            Utc.from_utc_datetime(&naive)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn berlin() -> Tz {
        "Europe/Berlin".parse().unwrap()
    }

    #[test]
    fn presets_and_cron_parse() {
        for expr in [
            "@hourly",
            "@daily",
            "@weekly",
            "@monthly",
            "@yearly",
            "*/15 * * * *",
            "0 3 * * 1-5",
        ] {
            Schedule::parse(expr, Tz::UTC).unwrap();
        }
    }

    #[test]
    fn invalid_expressions_are_rejected_with_the_reason() {
        for expr in [
            "@fortnightly",
            "0 0 * *",
            "0 0 0 * * *",
            "61 * * * *",
            "0 0 31 2 *",
            "banana",
        ] {
            let err = Schedule::parse(expr, Tz::UTC).unwrap_err().to_string();
            assert!(err.contains(expr), "{err}");
        }
    }

    #[test]
    fn spring_forward_gap_moves_to_first_instant_after_gap() {
        // 02:30 does not exist in Berlin on 2026-03-29: it fires at 03:00 CEST = 01:00 UTC.
        let s = Schedule::parse("30 2 * * *", berlin()).unwrap();
        let fires = s.fire_times(utc("2026-03-28T00:00:00Z"), utc("2026-03-31T00:00:00Z"));
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
        let fires = s.fire_times(utc("2026-10-24T12:00:00Z"), utc("2026-10-26T12:00:00Z"));
        assert_eq!(
            fires,
            vec![utc("2026-10-25T00:30:00Z"), utc("2026-10-26T01:30:00Z")]
        );
    }

    #[test]
    fn hourly_steps_in_absolute_time_across_dst() {
        let s = Schedule::parse("@hourly", berlin()).unwrap();
        // Local 2026-10-25 lasts 25 hours: 22:00Z on the 24th to 23:00Z on the 25th.
        let fall = s.fire_times(utc("2026-10-24T22:00:00Z"), utc("2026-10-25T23:00:00Z"));
        assert_eq!(fall.len(), 25);
        assert!(fall.windows(2).all(|w| w[1] - w[0] == Duration::hours(1)));
        // Local 2026-03-29 lasts 23 hours.
        let spring = s.fire_times(utc("2026-03-28T23:00:00Z"), utc("2026-03-29T22:00:00Z"));
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
            utc("2026-03-29T01:00:00Z")
        );
        assert_eq!(
            resolve_local(berlin(), naive("2026-10-25 02:15")),
            utc("2026-10-25T00:15:00Z")
        );
    }
}

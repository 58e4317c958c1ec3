//! `create --sample N`: which N intervals of a range rehearse it. Pure and deterministic: the
//! same intervals, time zone and history give the same choice.
//!
//! Always the first and the last interval; then the intervals the history or the calendar make
//! worth a look (one whose latest run failed or was rejected, one across a DST change); then
//! intervals spread evenly over the range. Where the calendar gives variety, a spread pick moves
//! to the nearest interval that brings it: for schedules of a day or shorter, a weekend day and
//! a weekday, and the last day of a month.

use std::collections::{BTreeMap, HashSet};

use chrono::{Datelike, Offset, TimeZone, Weekday};
use chrono_tz::Tz;

use crate::interval::DataInterval;

/// Why an interval is in the sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    First,
    Last,
    /// Its latest run failed or was rejected.
    Failed,
    /// A DST change falls inside it (or it is a 23- or 25-hour day).
    DstChange,
    Weekend,
    Weekday,
    MonthEnd,
    Spread,
}

impl Reason {
    /// As the dry run shows it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::First => "sample: first",
            Self::Last => "sample: last",
            Self::Failed => "sample: latest run failed",
            Self::DstChange => "sample: DST change",
            Self::Weekend => "sample: weekend",
            Self::Weekday => "sample: weekday",
            Self::MonthEnd => "sample: month end",
            Self::Spread => "sample: spread",
        }
    }
}

/// Picks `n` (at least 1) of `intervals` (ascending): by index, with why. `unsuccessful` holds
/// the starts (unix seconds) of the intervals whose latest run failed or was rejected. All of
/// them when `n` is at least their number.
pub(crate) fn pick(
    intervals: &[DataInterval],
    n: usize,
    tz: Tz,
    unsuccessful: &HashSet<i64>,
) -> BTreeMap<usize, Reason> {
    let len = intervals.len();
    let mut chosen = BTreeMap::new();
    if len == 0 || n == 0 {
        return chosen;
    }
    if n >= len {
        for i in 0..len {
            chosen.insert(i, Reason::Spread);
        }
        chosen.insert(0, Reason::First);
        chosen.insert(len - 1, Reason::Last);
        return chosen;
    }
    chosen.insert(0, Reason::First);
    if n >= 2 {
        chosen.insert(len - 1, Reason::Last);
    }
    let room = |c: &BTreeMap<usize, Reason>| c.len() < n;
    // What the history says first: an interval that failed is the one most worth rehearsing.
    if room(&chosen)
        && let Some(i) = (0..len).find(|i| {
            !chosen.contains_key(i) && unsuccessful.contains(&intervals[*i].start.timestamp())
        })
    {
        chosen.insert(i, Reason::Failed);
    }
    if room(&chosen)
        && let Some(i) =
            (0..len).find(|i| !chosen.contains_key(i) && dst_change(&intervals[*i], tz))
    {
        chosen.insert(i, Reason::DstChange);
    }
    // The rest spread evenly: the free indexes nearest to evenly spaced points.
    let spread = n - chosen.len();
    for k in 1..=spread {
        let target = (k * (len - 1) + spread.div_ceil(2)) / (spread + 1);
        if let Some(i) = nearest_free(&chosen, len, target, |_| true) {
            chosen.insert(i, Reason::Spread);
        }
    }
    // Variety, where the calendar gives it: a spread pick moves to the nearest interval that
    // brings what the sample lacks.
    if at_most_a_day(intervals) {
        let weekend = |i: usize| is_weekend(&intervals[i], tz);
        let month_end = |i: usize| is_month_end(&intervals[i], tz);
        let wants: [(Reason, &dyn Fn(usize) -> bool); 3] = [
            (Reason::Weekend, &weekend),
            (Reason::Weekday, &|i| !weekend(i)),
            (Reason::MonthEnd, &month_end),
        ];
        for (reason, has) in wants {
            if chosen.keys().any(|&i| has(i)) {
                continue;
            }
            // The spread pick nearest to an interval that has it moves there.
            let best = chosen
                .iter()
                .filter(|(_, r)| **r == Reason::Spread)
                .filter_map(|(&from, _)| {
                    nearest_free(&chosen, len, from, has).map(|to| (from.abs_diff(to), from, to))
                })
                .min();
            if let Some((_, from, to)) = best {
                chosen.remove(&from);
                chosen.insert(to, reason);
            }
        }
    }
    chosen
}

/// The free index nearest to `target` for which `ok` holds (the earlier one on a tie).
fn nearest_free(
    chosen: &BTreeMap<usize, Reason>,
    len: usize,
    target: usize,
    ok: impl Fn(usize) -> bool,
) -> Option<usize> {
    (0..len)
        .filter(|i| !chosen.contains_key(i) && ok(*i))
        .min_by_key(|i| (i.abs_diff(target), *i))
}

/// Whether the intervals are a day long or shorter (weekends and month ends mean something).
fn at_most_a_day(intervals: &[DataInterval]) -> bool {
    intervals
        .iter()
        .all(|i| i.end - i.start <= chrono::Duration::hours(25))
}

/// Whether the UTC offset at the interval's end differs from that at its start.
fn dst_change(i: &DataInterval, tz: Tz) -> bool {
    let offset = |t| tz.offset_from_utc_datetime(&t).fix();
    offset(i.start.naive_utc()) != offset(i.end.naive_utc())
}

fn is_weekend(i: &DataInterval, tz: Tz) -> bool {
    matches!(
        i.start.with_timezone(&tz).weekday(),
        Weekday::Sat | Weekday::Sun
    )
}

/// Whether the interval covers the last day of a month (it starts on it).
fn is_month_end(i: &DataInterval, tz: Tz) -> bool {
    let day = i.start.with_timezone(&tz).date_naive();
    day.succ_opt()
        .is_some_and(|next| next.month() != day.month())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interval::{Range, expand};
    use crate::schedule::Schedule;

    fn intervals(schedule: &str, tz: &str, from: &str, to: &str) -> (Vec<DataInterval>, Tz) {
        let tz: Tz = tz.parse().unwrap();
        let s = Schedule::parse(schedule, tz).unwrap();
        let at = |t: &str| chrono::DateTime::parse_from_rfc3339(t).unwrap().to_utc();
        // Inclusive of an interval starting at `to`.
        let range = Range {
            start: at(from),
            end_exclusive: at(to) + chrono::Duration::seconds(1),
        };
        (expand(&s, range, 1_000_000).unwrap(), tz)
    }

    fn show(ivs: &[DataInterval], tz: Tz, picked: &BTreeMap<usize, Reason>) -> Vec<String> {
        picked
            .iter()
            .map(|(i, r)| {
                format!(
                    "{} {}",
                    ivs[*i].start.with_timezone(&tz).format("%Y-%m-%d %a %H:%M"),
                    r.as_str()
                )
            })
            .collect()
    }

    #[test]
    fn a_daily_sample_has_the_ends_a_weekend_a_weekday_and_a_month_end() {
        // Tuesday 1 September to Thursday 29 October: neither end is a weekend or a month end.
        let (ivs, tz) = intervals(
            "@daily",
            "UTC",
            "2026-09-01T00:00:00Z",
            "2026-10-29T00:00:00Z",
        );
        let picked = pick(&ivs, 5, tz, &HashSet::new());
        assert_eq!(
            show(&ivs, tz, &picked),
            [
                "2026-09-01 Tue 00:00 sample: first",
                "2026-09-16 Wed 00:00 sample: spread",
                // A month end by the spread already: nothing moves for it.
                "2026-09-30 Wed 00:00 sample: spread",
                // The spread pick of Thursday 15 October moved to the nearest weekend day.
                "2026-10-17 Sat 00:00 sample: weekend",
                "2026-10-29 Thu 00:00 sample: last",
            ]
        );
        // The same range and history: the same choice.
        assert_eq!(pick(&ivs, 5, tz, &HashSet::new()), picked);
    }

    #[test]
    fn a_failed_interval_and_a_dst_day_come_before_the_spread() {
        let (ivs, tz) = intervals(
            "@daily",
            "Europe/Berlin",
            "2026-10-01T00:00:00+02:00",
            "2026-10-31T00:00:00+01:00",
        );
        let failed: HashSet<i64> = [ivs[11].start.timestamp()].into();
        let picked = pick(&ivs, 4, tz, &failed);
        assert_eq!(
            show(&ivs, tz, &picked),
            [
                "2026-10-01 Thu 00:00 sample: first",
                "2026-10-12 Mon 00:00 sample: latest run failed",
                "2026-10-25 Sun 00:00 sample: DST change",
                "2026-10-31 Sat 00:00 sample: last",
            ]
        );
    }

    #[test]
    fn an_hourly_sample_finds_the_hour_of_the_dst_change() {
        let (ivs, tz) = intervals(
            "@hourly",
            "Europe/Berlin",
            "2026-03-28T00:00:00+01:00",
            "2026-03-30T23:00:00+02:00",
        );
        let picked = pick(&ivs, 3, tz, &HashSet::new());
        let shown = show(&ivs, tz, &picked);
        assert_eq!(shown[0], "2026-03-28 Sat 00:00 sample: first");
        // 02:00 does not exist that night: the hour starting at 01:00 UTC+1 ends at 03:00 UTC+2.
        assert_eq!(shown[1], "2026-03-29 Sun 01:00 sample: DST change");
        assert_eq!(shown[2], "2026-03-30 Mon 23:00 sample: last");
    }

    #[test]
    fn a_monthly_sample_spreads_without_calendar_variety() {
        let (ivs, tz) = intervals(
            "@monthly",
            "UTC",
            "2025-01-01T00:00:00Z",
            "2026-12-01T00:00:00Z",
        );
        assert_eq!(ivs.len(), 24);
        let picked = pick(&ivs, 4, tz, &HashSet::new());
        assert_eq!(
            show(&ivs, tz, &picked),
            [
                "2025-01-01 Wed 00:00 sample: first",
                "2025-09-01 Mon 00:00 sample: spread",
                "2026-04-01 Wed 00:00 sample: spread",
                "2026-12-01 Tue 00:00 sample: last",
            ]
        );
    }

    #[test]
    fn small_ranges_and_samples() {
        let (ivs, tz) = intervals(
            "@daily",
            "UTC",
            "2026-09-01T00:00:00Z",
            "2026-09-03T00:00:00Z",
        );
        assert_eq!(pick(&ivs, 1, tz, &HashSet::new()).len(), 1);
        assert_eq!(pick(&ivs, 3, tz, &HashSet::new()).len(), 3);
        assert_eq!(pick(&ivs, 10, tz, &HashSet::new()).len(), 3);
        assert!(pick(&[], 3, tz, &HashSet::new()).is_empty());
    }
}

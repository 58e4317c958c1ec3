//! One way to write an interval in human output: in the DAG's timezone, as a date for schedules
//! that fire at most once a day, and as `YYYY-MM-DD HH:MM` otherwise, with the offset when that
//! wall time happens twice (a repeated hour). JSON keeps RFC 3339 UTC. The same module writes
//! the `--from`/`--to` values that select an interval again, for hints the user can paste.

use chrono::{DateTime, LocalResult, TimeZone, Utc};
use chrono_tz::Tz;

use crate::project::Dag;

/// How a DAG's intervals are written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Labeler {
    tz: Tz,
    daily: bool,
}

impl Labeler {
    pub(crate) fn new(dag: &Dag) -> Self {
        Self {
            tz: dag.tz,
            daily: dag.schedule.at_most_daily(),
        }
    }

    /// For intervals whose DAG is no longer in the project: UTC, with the time.
    pub(crate) fn utc() -> Self {
        Self {
            tz: Tz::UTC,
            daily: false,
        }
    }

    /// Labels in `tz`, as dates when `daily`.
    #[cfg(test)]
    pub(crate) fn in_zone(tz: Tz, daily: bool) -> Self {
        Self { tz, daily }
    }

    pub(crate) fn of(dag: Option<&Dag>) -> Self {
        dag.map_or_else(Self::utc, Self::new)
    }

    /// Whether a wall time of this interval start happens twice in the timezone.
    fn repeated(&self, start: DateTime<Utc>) -> bool {
        let local = start.with_timezone(&self.tz).naive_local();
        matches!(
            self.tz.from_local_datetime(&local),
            LocalResult::Ambiguous(..)
        )
    }

    /// The interval's name for humans.
    pub(crate) fn label(&self, start: DateTime<Utc>) -> String {
        let local = start.with_timezone(&self.tz);
        if self.daily {
            local.format("%Y-%m-%d").to_string()
        } else if self.repeated(start) {
            local.format("%Y-%m-%d %H:%M%:z").to_string()
        } else {
            local.format("%Y-%m-%d %H:%M").to_string()
        }
    }

    /// A `WHEN` that selects this interval start as `--from` or `--to`, as a user would type it.
    pub(crate) fn when(&self, start: DateTime<Utc>) -> String {
        let local = start.with_timezone(&self.tz);
        if self.daily {
            local.format("%Y-%m-%d").to_string()
        } else if self.repeated(start) {
            local.format("%Y-%m-%dT%H:%M:%S%:z").to_string()
        } else {
            local.format("%Y-%m-%dT%H:%M").to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn labels_follow_the_schedule_and_the_timezone() {
        let berlin: Tz = "Europe/Berlin".parse().unwrap();
        let daily = Labeler {
            tz: berlin,
            daily: true,
        };
        assert_eq!(daily.label(utc("2026-09-30T22:00:00Z")), "2026-10-01");
        assert_eq!(daily.when(utc("2026-09-30T22:00:00Z")), "2026-10-01");
        let hourly = Labeler {
            tz: berlin,
            daily: false,
        };
        assert_eq!(
            hourly.label(utc("2026-09-30T22:00:00Z")),
            "2026-10-01 00:00"
        );
        assert_eq!(hourly.when(utc("2026-09-30T22:00:00Z")), "2026-10-01T00:00");
        // 02:30 happens twice on 2026-10-25: the offset tells them apart.
        assert_eq!(
            hourly.label(utc("2026-10-25T00:30:00Z")),
            "2026-10-25 02:30+02:00"
        );
        assert_eq!(
            hourly.label(utc("2026-10-25T01:30:00Z")),
            "2026-10-25 02:30+01:00"
        );
        assert_eq!(
            hourly.when(utc("2026-10-25T01:30:00Z")),
            "2026-10-25T02:30:00+01:00"
        );
        assert_eq!(
            Labeler::utc().label(utc("2026-10-25T01:30:00Z")),
            "2026-10-25 01:30"
        );
    }
}

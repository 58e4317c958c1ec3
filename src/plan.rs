//! Planning, as a pure function: intervals + the latest run state of each + options -> a plan
//! (run, or skip with a reason), in execution order.
//!
//! | latest run of the interval | none | failed | completed | changed |
//! |---|---|---|---|---|
//! | none yet | run | run | run | run |
//! | queued or running (live lease) | skip: in flight | skip: in flight | skip: in flight | skip: in flight |
//! | succeeded | skip: already exists | skip: already exists | run | run if its source changed, else skip: source unchanged |
//! | failed, rejected or cancelled | skip: already exists | run | run | run |
//!
//! Intervals whose end is in the future are skipped as `not yet complete`. With
//! `depends_on_past`, an interval runs only if the previous one succeeded or runs before it in
//! this plan; otherwise it is skipped as `previous interval not successful`.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};

use crate::interval::DataInterval;
pub use crate::state::RunState;

/// Which earlier runs a backfill reprocesses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reprocess {
    /// Only intervals that never ran.
    #[default]
    None,
    /// Also intervals whose latest run failed, was rejected or cancelled.
    Failed,
    /// Every interval, even those that succeeded.
    Completed,
    /// As `failed`, and also intervals that succeeded whose source changed since.
    Changed,
}

impl Reprocess {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Failed => "failed",
            Self::Completed => "completed",
            Self::Changed => "changed",
        }
    }
}

impl fmt::Display for Reprocess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Reprocess {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl FromStr for Reprocess {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "failed" => Ok(Self::Failed),
            "completed" => Ok(Self::Completed),
            "changed" => Ok(Self::Changed),
            other => Err(format!("unknown reprocess behavior `{other}`")),
        }
    }
}

/// Why an interval is not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    AlreadyExists,
    InFlight,
    NotYetComplete,
    PreviousNotSuccessful,
    SourceUnchanged,
    /// A promote: nothing of the interval is staged any more (promoted or discarded since).
    NothingStaged,
    /// A cascade: an upstream interval it depends on did not succeed.
    UpstreamNotSuccessful,
    /// A cascade with `changed`: no upstream output it depends on changed.
    UpstreamUnchanged,
    /// `[tasks.ready]`: its sources were still not ready when its wait ran out.
    NotReady,
}

impl SkipReason {
    pub(crate) const ALL: [SkipReason; 9] = [
        Self::AlreadyExists,
        Self::InFlight,
        Self::NotYetComplete,
        Self::PreviousNotSuccessful,
        Self::SourceUnchanged,
        Self::NothingStaged,
        Self::UpstreamNotSuccessful,
        Self::UpstreamUnchanged,
        Self::NotReady,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::AlreadyExists => "already exists",
            Self::InFlight => "in flight",
            Self::NotYetComplete => "not yet complete",
            Self::PreviousNotSuccessful => "previous interval not successful",
            Self::SourceUnchanged => "source unchanged",
            Self::NothingStaged => "nothing staged",
            Self::UpstreamNotSuccessful => "upstream not successful",
            Self::UpstreamUnchanged => "upstream unchanged",
            Self::NotReady => "not ready",
        }
    }
}

impl FromStr for SkipReason {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown skip reason `{s}`"))
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Run,
    Skip(SkipReason),
}

/// What the manifest knows about an interval before planning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prior {
    /// State of the latest run of the interval, if any.
    pub latest: Option<RunState>,
    /// Another backfill holds a live lease on the interval.
    pub in_flight: bool,
    /// The source of the interval changed since its latest run succeeded (for `changed`).
    pub source_changed: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub reprocess: Reprocess,
    pub run_backwards: bool,
    pub depends_on_past: bool,
    pub now: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanRow {
    pub interval: DataInterval,
    pub action: Action,
}

/// Plans intervals one at a time, ascending, so that a large plan can be written in chunks:
/// it carries what `depends_on_past` needs from one interval to the next.
#[derive(Debug, Clone)]
pub(crate) struct Planner {
    opts: Options,
    /// Whether the previous interval has succeeded or will run earlier in this plan.
    previous_ok: bool,
}

impl Planner {
    /// `before_range` is the latest state of the interval just before the first one.
    pub(crate) fn new(before_range: Option<RunState>, opts: Options) -> Self {
        Self {
            opts,
            previous_ok: matches!(before_range, None | Some(RunState::Succeeded)),
        }
    }

    /// The action for the next interval (ascending).
    /// [`Planner::next`], with the interval skipped for `forced` (a cascade's upstream) where it
    /// would run: with `depends_on_past`, the intervals after it then wait for it as for a
    /// failure.
    pub(crate) fn next_forced(
        &mut self,
        interval: &DataInterval,
        p: Prior,
        forced: Option<SkipReason>,
    ) -> Action {
        match (self.next(interval, p), forced) {
            (Action::Run, Some(reason)) => {
                self.previous_ok = false;
                Action::Skip(reason)
            }
            (action, _) => action,
        }
    }

    pub(crate) fn next(&mut self, interval: &DataInterval, p: Prior) -> Action {
        let mut action = judge(interval, p, self.opts);
        if self.opts.depends_on_past {
            match action {
                Action::Run if !self.previous_ok => {
                    action = Action::Skip(SkipReason::PreviousNotSuccessful);
                }
                Action::Run => {}
                Action::Skip(_) => {
                    self.previous_ok = p.latest == Some(RunState::Succeeded) && !p.in_flight;
                }
            }
        }
        action
    }
}

/// The position of the `index`-th interval (ascending) of `total` in execution order.
pub(crate) fn ord(index: usize, total: usize, run_backwards: bool) -> usize {
    if run_backwards {
        total - 1 - index
    } else {
        index
    }
}

/// Plans `intervals` (ascending) given `prior[i]` for each and the latest state of the interval
/// just before the range (for `depends_on_past`). Returns rows in execution order.
pub fn plan(
    intervals: &[DataInterval],
    prior: &[Prior],
    before_range: Option<RunState>,
    opts: Options,
) -> Vec<PlanRow> {
    debug_assert_eq!(intervals.len(), prior.len());
    let mut planner = Planner::new(before_range, opts);
    let mut rows: Vec<PlanRow> = intervals
        .iter()
        .zip(prior)
        .map(|(interval, p)| PlanRow {
            interval: *interval,
            action: planner.next(interval, *p),
        })
        .collect();
    if opts.run_backwards {
        rows.reverse();
    }
    rows
}

/// The reprocess table for one interval.
fn judge(interval: &DataInterval, p: Prior, opts: Options) -> Action {
    if interval.end > opts.now {
        return Action::Skip(SkipReason::NotYetComplete);
    }
    if p.in_flight {
        return Action::Skip(SkipReason::InFlight);
    }
    let run_again = match p.latest {
        None => true,
        Some(RunState::Succeeded) => match opts.reprocess {
            Reprocess::Completed => true,
            Reprocess::Changed if p.source_changed => true,
            Reprocess::Changed => return Action::Skip(SkipReason::SourceUnchanged),
            Reprocess::None | Reprocess::Failed => false,
        },
        // A queued or running run without a live lease was abandoned: it counts as cancelled.
        Some(
            RunState::Failed
            | RunState::Rejected
            | RunState::Cancelled
            | RunState::Queued
            | RunState::Running,
        ) => opts.reprocess != Reprocess::None,
    };
    if run_again {
        Action::Run
    } else {
        Action::Skip(SkipReason::AlreadyExists)
    }
}

/// The batches of intervals to run (in plan order): at most `size` consecutive intervals each,
/// never across an interval the plan leaves out (each batch's intervals meet end to start, in
/// the plan's direction).
pub(crate) fn batches(intervals: &[DataInterval], size: u32) -> Vec<std::ops::Range<usize>> {
    let size = size.max(1) as usize;
    let mut out = Vec::new();
    let mut first = 0;
    for i in 1..=intervals.len() {
        let meets = i < intervals.len() && {
            let (a, b) = (&intervals[i - 1], &intervals[i]);
            a.end == b.start || b.end == a.start
        };
        if i == intervals.len() || i - first == size || !meets {
            out.push(first..i);
            first = i;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    fn day(n: i64) -> DataInterval {
        let base = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        DataInterval::new(base + Duration::days(n), base + Duration::days(n + 1))
    }

    fn opts(reprocess: Reprocess) -> Options {
        Options {
            reprocess,
            run_backwards: false,
            depends_on_past: false,
            now: DateTime::parse_from_rfc3339("2026-11-29T00:00:00Z")
                .unwrap()
                .with_timezone(&Utc),
        }
    }

    fn prior(latest: Option<RunState>, in_flight: bool) -> Prior {
        Prior {
            latest,
            in_flight,
            source_changed: false,
        }
    }

    #[test]
    fn batches_are_consecutive_planned_intervals_and_stop_at_a_gap() {
        // Days 0-6, 8-9 planned (7 skipped): batches of 3 never cross the gap.
        let planned: Vec<_> = [0, 1, 2, 3, 4, 5, 6, 8, 9].map(day).to_vec();
        assert_eq!(batches(&planned, 3), vec![0..3, 3..6, 6..7, 7..9]);
        assert_eq!(batches(&planned, 1).len(), 9);
        assert_eq!(batches(&planned, 100), vec![0..7, 7..9]);
        // Backwards, the same days newest first.
        let back: Vec<_> = planned.iter().rev().copied().collect();
        assert_eq!(batches(&back, 3), vec![0..2, 2..5, 5..8, 8..9]);
        assert!(batches(&[], 3).is_empty());
    }

    #[test]
    fn the_reprocess_table() {
        use Action::*;
        use SkipReason::*;
        let exists = Skip(AlreadyExists);
        let unchanged = Skip(SourceUnchanged);
        let changed = Prior {
            source_changed: true,
            ..prior(Some(RunState::Succeeded), false)
        };
        // Columns: none, failed, completed, changed.
        let cases = [
            (prior(None, false), [Run, Run, Run, Run]),
            (prior(Some(RunState::Running), true), [Skip(InFlight); 4]),
            (prior(Some(RunState::Queued), true), [Skip(InFlight); 4]),
            (prior(None, true), [Skip(InFlight); 4]),
            (
                prior(Some(RunState::Succeeded), false),
                [exists, exists, Run, unchanged],
            ),
            (changed, [exists, exists, Run, Run]),
            (
                Prior {
                    in_flight: true,
                    ..changed
                },
                [Skip(InFlight); 4],
            ),
            (
                prior(Some(RunState::Failed), false),
                [exists, Run, Run, Run],
            ),
            (
                prior(Some(RunState::Rejected), false),
                [exists, Run, Run, Run],
            ),
            (
                prior(Some(RunState::Cancelled), false),
                [exists, Run, Run, Run],
            ),
            (
                prior(Some(RunState::Running), false),
                [exists, Run, Run, Run],
            ),
        ];
        for (p, expected) in cases {
            for (reprocess, want) in [
                Reprocess::None,
                Reprocess::Failed,
                Reprocess::Completed,
                Reprocess::Changed,
            ]
            .into_iter()
            .zip(expected)
            {
                let got = plan(&[day(0)], &[p], None, opts(reprocess));
                assert_eq!(got[0].action, want, "{p:?} with {reprocess:?}");
            }
        }
    }

    #[test]
    fn future_intervals_are_not_yet_complete() {
        let mut o = opts(Reprocess::Completed);
        o.now = day(3).start + Duration::hours(1);
        let intervals = [day(1), day(2), day(3)];
        let got = plan(&intervals, &[Prior::default(); 3], None, o);
        let actions: Vec<_> = got.iter().map(|r| r.action).collect();
        assert_eq!(
            actions,
            [
                Action::Run,
                Action::Run,
                Action::Skip(SkipReason::NotYetComplete)
            ]
        );
    }

    #[test]
    fn backwards_reverses_the_order() {
        let mut o = opts(Reprocess::None);
        o.run_backwards = true;
        let intervals = [day(1), day(2), day(3)];
        let got = plan(&intervals, &[Prior::default(); 3], None, o);
        let starts: Vec<_> = got.iter().map(|r| r.interval).collect();
        assert_eq!(starts, [day(3), day(2), day(1)]);
    }

    #[test]
    fn depends_on_past_skips_after_an_unsuccessful_interval() {
        let mut o = opts(Reprocess::None);
        o.depends_on_past = true;
        let intervals = [day(1), day(2), day(3), day(4), day(5)];
        let priors = [
            Prior::default(),
            prior(Some(RunState::Succeeded), false),
            prior(Some(RunState::Failed), false),
            Prior::default(),
            Prior::default(),
        ];
        let got: Vec<_> = plan(&intervals, &priors, None, o)
            .iter()
            .map(|r| r.action)
            .collect();
        let not_ok = Action::Skip(SkipReason::PreviousNotSuccessful);
        assert_eq!(
            got,
            [
                Action::Run,
                Action::Skip(SkipReason::AlreadyExists),
                Action::Skip(SkipReason::AlreadyExists),
                not_ok,
                not_ok
            ]
        );
        // The interval before the range decides the first one.
        let got = plan(&[day(1)], &[Prior::default()], Some(RunState::Failed), o);
        assert_eq!(got[0].action, not_ok);
        let got = plan(&[day(1)], &[Prior::default()], Some(RunState::Succeeded), o);
        assert_eq!(got[0].action, Action::Run);
    }

    #[test]
    fn names_round_trip() {
        for r in SkipReason::ALL {
            assert_eq!(r.as_str().parse::<SkipReason>(), Ok(r));
        }
    }
}

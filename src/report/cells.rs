//! One cell per interval: what an interval of a backfill came to, by the state of its latest run
//! and its gate verdict. `show --grid` draws the cells in the terminal; the status page of
//! `backfill serve` draws the same cells, with the same names.

use super::Labeler;
use super::out::{Sink, plural};
use crate::exit::Error;
use crate::manifest::queries::{BackfillDetail, IntervalDetail};
use crate::state::{IntervalState, PlanAction, RunState, Verdict};

/// What an interval came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Cell {
    /// Published with rows.
    Succeeded,
    /// Published with the gate's warnings (a `warn` rule, too little history).
    Warned,
    /// Published as an empty partition (`allow_empty`).
    Empty,
    /// Computed and kept aside by `create --stage`, not published yet.
    Staged,
    Rejected,
    Failed,
    Cancelled,
    /// Queued or running now.
    Running,
    /// Planned, not started yet.
    Pending,
    /// Left out by the plan (its reason says why).
    Skipped,
}

impl Cell {
    /// Every kind, in the order a legend lists them.
    pub(crate) const ALL: [Cell; 10] = [
        Cell::Succeeded,
        Cell::Warned,
        Cell::Empty,
        Cell::Staged,
        Cell::Rejected,
        Cell::Failed,
        Cell::Cancelled,
        Cell::Running,
        Cell::Pending,
        Cell::Skipped,
    ];

    /// The interval's cell.
    pub(crate) fn of(i: &IntervalDetail) -> Self {
        if i.action == PlanAction::Skip {
            return Self::Skipped;
        }
        // Waiting for its sources, it has not started.
        if let Some(IntervalState::WaitingForSources(_)) = i.state {
            return Self::Pending;
        }
        Self::of_run(
            i.state.as_ref().map(IntervalState::run_state),
            i.verdict.map(|v| v.verdict),
            i.warned,
        )
    }

    /// The cell of an interval whose latest run is in `state` (`None`: no run yet) with the
    /// gate's `verdict`; `warned` when one of its tries published with the gate's warnings.
    pub(crate) fn of_run(state: Option<RunState>, verdict: Option<Verdict>, warned: bool) -> Self {
        match state {
            None => Self::Pending,
            Some(RunState::Queued | RunState::Running) => Self::Running,
            Some(RunState::Succeeded) => match verdict {
                Some(Verdict::PublishedEmpty) => Self::Empty,
                Some(Verdict::Staged) => Self::Staged,
                _ if warned => Self::Warned,
                _ => Self::Succeeded,
            },
            Some(RunState::Rejected) => Self::Rejected,
            Some(RunState::Failed) => Self::Failed,
            Some(RunState::Cancelled) => Self::Cancelled,
        }
    }

    /// Its name: the `data-state` of the status page's cells and the words of the legends.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Warned => "warned",
            Self::Empty => "empty",
            Self::Staged => "staged",
            Self::Rejected => "rejected",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Running => "running",
            Self::Pending => "pending",
            Self::Skipped => "skipped",
        }
    }

    /// What a legend says of it.
    pub(crate) fn words(self) -> &'static str {
        match self {
            Self::Succeeded => "published",
            Self::Warned => "published with warnings",
            Self::Empty => "published empty",
            Self::Staged => "staged",
            Self::Rejected => "rejected",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Running => "in flight",
            Self::Pending => "not started",
            Self::Skipped => "skipped",
        }
    }

    /// Its character in the terminal: distinct without colour too.
    pub(crate) fn symbol(self) -> char {
        match self {
            Self::Succeeded => '#',
            Self::Warned => 'W',
            Self::Empty => '0',
            Self::Staged => 's',
            Self::Rejected => 'R',
            Self::Failed => 'F',
            Self::Cancelled => 'C',
            Self::Running => '>',
            Self::Pending => '.',
            Self::Skipped => '-',
        }
    }

    /// Its ANSI colour (SGR parameters).
    fn sgr(self) -> &'static str {
        match self {
            Self::Succeeded => "32",
            Self::Warned => "1;33",
            Self::Empty => "36",
            Self::Staged => "34",
            Self::Rejected => "1;35",
            Self::Failed => "1;31",
            Self::Cancelled => "33",
            Self::Running => "1;37",
            Self::Pending | Self::Skipped => "2",
        }
    }
}

/// How many of a backfill's intervals came to each kind, in legend order, leaving out none.
pub(crate) fn tally<'a>(
    intervals: impl IntoIterator<Item = &'a IntervalDetail>,
) -> Vec<(Cell, usize)> {
    let mut counts = [0usize; Cell::ALL.len()];
    for i in intervals {
        let c = Cell::of(i);
        if let Some(k) = Cell::ALL.iter().position(|x| *x == c) {
            counts[k] += 1;
        }
    }
    Cell::ALL.iter().copied().zip(counts).collect()
}

/// `show --grid`: a line about the backfill, then its intervals as cells in run order, each
/// line of cells headed by the label of its first interval and as long as the width allows,
/// then a legend with the count of each kind. Colour when `colour`.
pub(crate) fn write(
    out: &mut Sink<'_>,
    detail: &BackfillDetail,
    labels: &Labeler,
    width: Option<u16>,
    colour: bool,
) -> Result<(), Error> {
    let b = &detail.backfill;
    let mut intervals: Vec<&IntervalDetail> = detail.interval_details.iter().collect();
    // Time order reads as a calendar, whatever the order they ran in.
    intervals.sort_by_key(|i| i.start.0);
    out.line(&format!(
        "backfill {} of {}: {} · {}",
        b.id,
        b.dag_id,
        b.state,
        plural(
            i64::try_from(intervals.len()).unwrap_or(i64::MAX),
            "interval",
            "intervals"
        )
    ))?;
    let label_width = intervals
        .iter()
        .map(|i| labels.label(i.start.0).chars().count())
        .max()
        .unwrap_or(10);
    // Cells in groups of `group`, a space between groups: a week of days, a day of hours.
    let width = usize::from(width.unwrap_or(120)).max(label_width + 10);
    let room = width - label_width - 2;
    let group = natural_group(&intervals);
    let groups_per_line = (room + 1) / (group + 1);
    let per_line = if groups_per_line == 0 {
        room
    } else {
        groups_per_line * group
    };
    for line in intervals.chunks(per_line.max(1)) {
        let mut text = format!(
            "{:<label_width$}  ",
            labels.label(line[0].start.0),
            label_width = label_width
        );
        for (k, i) in line.iter().enumerate() {
            if k > 0 && groups_per_line > 0 && k % group == 0 {
                text.push(' ');
            }
            text.push_str(&paint(Cell::of(i), colour));
        }
        out.line(text.trim_end())?;
    }
    let mut legend: Vec<String> = Vec::new();
    for (cell, n) in tally(intervals.iter().copied()) {
        if n > 0 {
            legend.push(format!("{} {} {n}", paint(cell, colour), cell.words()));
        }
    }
    out.line(&wrap_items(&legend, width))?;
    Ok(())
}

/// A cell's character, coloured when `colour`.
fn paint(cell: Cell, colour: bool) -> String {
    if colour {
        format!("\x1b[{}m{}\x1b[0m", cell.sgr(), cell.symbol())
    } else {
        cell.symbol().to_string()
    }
}

/// How many cells make a group: 7 days, 24 hours, 12 months, else 10.
pub(crate) fn natural_group(intervals: &[&IntervalDetail]) -> usize {
    let Some(first) = intervals.first() else {
        return 10;
    };
    let secs = (first.end.0 - first.start.0).num_seconds();
    match secs {
        86_400 => 7,
        3_600 => 24,
        2_419_200..=2_678_400 => 12,
        _ => 10,
    }
}

/// Items separated by two spaces, wrapped to `width` (measured without colour codes).
fn wrap_items(items: &[String], width: usize) -> String {
    let mut out = String::new();
    let mut line = 0;
    for item in items {
        let w = super::out::visible_width(item);
        if line > 0 && line + 2 + w > width {
            out.push('\n');
            line = 0;
        } else if line > 0 {
            out.push_str("  ");
            line += 2;
        }
        out.push_str(item);
        line += w;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legend_items_wrap_by_their_visible_width() {
        let items: Vec<String> = ["aaaa", "bbbb", "cccc"].map(String::from).to_vec();
        assert_eq!(wrap_items(&items, 10), "aaaa  bbbb\ncccc");
        let coloured: Vec<String> = items
            .iter()
            .map(|s| format!("\x1b[32m{s}\x1b[0m"))
            .collect();
        assert_eq!(wrap_items(&coloured, 10).matches('\n').count(), 1);
    }
}

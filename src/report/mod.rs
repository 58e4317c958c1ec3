//! Turns runner events into what people and programs read: a progress bar on a terminal
//! (done/total, running, failed, ETA), one plain line per finished interval otherwise, and a
//! summary at the end (a table on stderr, or one JSON document on stdout).

pub mod tables;

use std::io::{IsTerminal, Write};
use std::time::Duration;

use chrono::{DateTime, NaiveTime, Utc};
use chrono_tz::Tz;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use crate::manifest::queries::{Counts, FailedInterval, Outcome};
use crate::plan::RunState;
use crate::runner::Event;

/// A human label for an interval start: its local date for midnight starts, else local date
/// and time with the offset.
pub fn label(start: DateTime<Utc>, tz: Tz) -> String {
    let local = start.with_timezone(&tz);
    if local.time() == NaiveTime::MIN {
        local.format("%Y-%m-%d").to_string()
    } else {
        local.format("%Y-%m-%d %H:%M%:z").to_string()
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

enum Mode {
    Bar(ProgressBar),
    Lines,
    Quiet,
}

/// Renders events as they come.
pub struct Reporter {
    mode: Mode,
    tz: Tz,
    verbose: bool,
    running: u64,
    failed: u64,
}

impl Reporter {
    /// `total` is the number of intervals to run; `quiet` suppresses per-interval output.
    pub fn new(total: u64, tz: Tz, quiet: bool, verbose: bool) -> Self {
        let mode = if quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30.cyan/blue} {pos}/{len} intervals · {msg} · {elapsed_precise} elapsed · ETA {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            Mode::Bar(bar)
        } else {
            Mode::Lines
        };
        let reporter = Self {
            mode,
            tz,
            verbose,
            running: 0,
            failed: 0,
        };
        reporter.update_message();
        reporter
    }

    fn line(&self, text: &str) {
        match &self.mode {
            Mode::Bar(bar) => bar.println(text),
            Mode::Lines => {
                let mut err = std::io::stderr().lock();
                let _ = writeln!(err, "{text}");
            }
            Mode::Quiet => {}
        }
    }

    fn update_message(&self) {
        if let Mode::Bar(bar) = &self.mode {
            bar.set_message(format!("{} running · {} failed", self.running, self.failed));
        }
    }

    pub fn handle(&mut self, event: &Event) {
        match event {
            Event::IntervalStarted { interval, run_id } => {
                self.running += 1;
                if self.verbose {
                    self.line(&format!(
                        "started    {} (run {run_id})",
                        label(interval.start, self.tz)
                    ));
                }
            }
            Event::TryFailed {
                interval,
                task_id,
                try_number,
                error,
                will_retry,
                log_path,
                log_tail,
            } => {
                let then = if *will_retry {
                    "will retry"
                } else {
                    "no retries left"
                };
                let mut text = format!(
                    "try {try_number} of task `{task_id}` for {} failed: {error} ({then})\n  log: {log_path}",
                    label(interval.start, self.tz)
                );
                if !*will_retry && !log_tail.is_empty() {
                    for l in log_tail.lines() {
                        text.push_str("\n  | ");
                        text.push_str(l);
                    }
                }
                self.line(&text);
            }
            Event::IntervalFinished {
                interval,
                state,
                elapsed,
                error,
                ..
            } => {
                self.running = self.running.saturating_sub(1);
                if matches!(state, RunState::Failed | RunState::Rejected) {
                    self.failed += 1;
                }
                let mut text = format!(
                    "{:<10} {} ({})",
                    state.as_str(),
                    label(interval.start, self.tz),
                    seconds(*elapsed)
                );
                if let Some(e) = error {
                    text.push_str(": ");
                    text.push_str(e);
                }
                self.line(&text);
                if let Mode::Bar(bar) = &self.mode {
                    bar.inc(1);
                }
            }
            Event::IntervalSkipped { interval, reason } => {
                self.line(&format!(
                    "{:<10} {} ({reason})",
                    "skipped",
                    label(interval.start, self.tz)
                ));
                if let Mode::Bar(bar) = &self.mode {
                    bar.inc(1);
                }
            }
            Event::Stopping { hard, why } => {
                let how = if *hard {
                    "killing running tasks now"
                } else {
                    "stopping: no new intervals; running tasks get SIGTERM (Ctrl-C again to kill now)"
                };
                self.line(&format!("{why}: {how}"));
            }
        }
        self.update_message();
    }

    pub fn finish(&self) {
        if let Mode::Bar(bar) = &self.mode {
            bar.finish_and_clear();
        }
    }
}

/// The document `create` and `resume` print with `--output json`.
#[derive(Debug, Serialize)]
pub struct Summary<'a> {
    pub backfill_id: i64,
    pub dag_id: &'a str,
    pub state: &'a str,
    pub exit_code: u8,
    pub intervals: &'a Counts,
    pub skipped: &'a std::collections::BTreeMap<String, i64>,
    pub failed: &'a [FailedInterval],
    pub elapsed_seconds: f64,
}

/// Builds the summary of a finished (or stopped) backfill from its outcome in the manifest.
pub fn summary<'a>(outcome: &'a Outcome, exit_code: u8, elapsed: Duration) -> Summary<'a> {
    Summary {
        backfill_id: outcome.backfill.id,
        dag_id: &outcome.backfill.dag_id,
        state: &outcome.backfill.state,
        exit_code,
        intervals: &outcome.backfill.intervals,
        skipped: &outcome.skipped,
        failed: &outcome.failed,
        elapsed_seconds: elapsed.as_secs_f64(),
    }
}

/// Prints the summary: a table for humans on stderr, or JSON on stdout.
pub fn print_summary(s: &Summary<'_>, json: bool, quiet: bool) {
    if json {
        tables::print_json(s);
        return;
    }
    let c = s.intervals;
    let mut err = std::io::stderr().lock();
    if !quiet {
        let mut table = Table::new();
        table.load_style(UTF8_FULL_CONDENSED);
        table.set_header(vec!["intervals", "count"]);
        for (name, n) in [
            ("succeeded", c.succeeded),
            ("failed", c.failed),
            ("rejected", c.rejected),
            ("cancelled", c.cancelled),
            ("not started", c.pending),
        ] {
            if n > 0 {
                table.add_row(vec![name.to_string(), n.to_string()]);
            }
        }
        for (reason, n) in s.skipped {
            table.add_row(vec![format!("skipped: {reason}"), n.to_string()]);
        }
        let _ = writeln!(err, "{table}");
        for f in s.failed {
            let _ = writeln!(
                err,
                "{} {}: {}{}",
                f.state,
                f.start,
                f.error.as_deref().unwrap_or("-"),
                f.log
                    .as_ref()
                    .map(|l| format!("\n  log: {l}"))
                    .unwrap_or_default()
            );
        }
    }
    let next = match s.exit_code {
        crate::exit::INTERRUPTED => format!("; continue with `backfill resume {}`", s.backfill_id),
        crate::exit::FAILED => format!(
            "; rerun the failures with `backfill create --dag {} ... --reprocess-behavior failed`",
            s.dag_id
        ),
        _ => String::new(),
    };
    let _ = writeln!(
        err,
        "backfill {} of {}: {} — {} succeeded, {} failed, {} rejected, {} cancelled, {} skipped in {:.1}s{next}",
        s.backfill_id,
        s.dag_id,
        s.state,
        c.succeeded,
        c.failed,
        c.rejected,
        c.cancelled,
        c.skipped,
        s.elapsed_seconds
    );
}

//! What a backfill shows while it runs, on stderr, from the runner's events and the counts the
//! dispatcher keeps ([`Stats`]):
//!
//! - on a terminal that can draw one, a progress bar (done/total, running, failed, ETA); above
//!   it only what needs attention: a failed try with its log, an interval that failed or was
//!   rejected, a stop. `-v` adds a line when an interval starts, ends or waits for a pool.
//! - otherwise (cron, CI, a pipe, `TERM=dumb`), one plain line per finished interval and per
//!   failed try; `-v` adds a line when an interval starts or waits for a pool.
//! - with `-q`, only a stop and `--max-failures`: the exit code alone does not say why.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::Labeler;
use super::out::plural;
use crate::plan::RunState;
use crate::runner::{Event, Stats};

fn seconds(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

/// How progress is shown.
pub enum Progress {
    /// A bar; lines go above it.
    Bar(ProgressBar),
    Lines,
    Quiet,
}

impl Progress {
    /// For stderr: quiet with `quiet`, a bar when stderr is a terminal that can redraw one, plain
    /// lines otherwise.
    pub fn for_stderr(total: u64, quiet: bool) -> Self {
        if quiet {
            Self::Quiet
        } else if can_draw() {
            Self::Bar(bar(total, ProgressDrawTarget::stderr()))
        } else {
            Self::Lines
        }
    }
}

/// Whether stderr is a terminal that can redraw a progress bar: `TERM=dumb` (or no `TERM`)
/// gets plain lines.
fn can_draw() -> bool {
    std::io::stderr().is_terminal()
        && std::env::var("TERM").is_ok_and(|t| !t.is_empty() && t != "dumb")
}

/// The progress bar of `total` intervals, drawn on `target`.
pub fn bar(total: u64, target: ProgressDrawTarget) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), target);
    let template = if std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()) {
        "{bar:30} {pos}/{len} intervals · {msg} · {elapsed_precise} elapsed · ETA {eta}"
    } else {
        "{bar:30.cyan/blue} {pos}/{len} intervals · {msg} · {elapsed_precise} elapsed · ETA {eta}"
    };
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// The bar's message: what runs and what failed.
fn message(stats: &Stats) -> String {
    let waiting = if stats.waiting > 0 {
        format!(" ({} waiting for a pool)", stats.waiting)
    } else {
        String::new()
    };
    format!(
        "{} running{waiting} · {} failed",
        stats.running,
        stats.failures()
    )
}

/// Renders events as they come, into `out` (stderr for a backfill; a buffer in tests).
pub struct Reporter<W: Write> {
    out: W,
    progress: Progress,
    labels: Labeler,
    verbose: bool,
}

impl Reporter<std::io::Stderr> {
    /// Progress of `total` intervals on stderr (see [`Progress::for_stderr`]).
    pub fn stderr(total: u64, labels: Labeler, quiet: bool, verbose: bool) -> Self {
        Self::new(
            std::io::stderr(),
            Progress::for_stderr(total, quiet),
            labels,
            verbose,
        )
    }
}

impl<W: Write> Reporter<W> {
    pub fn new(out: W, progress: Progress, labels: Labeler, verbose: bool) -> Self {
        if let Progress::Bar(bar) = &progress {
            bar.set_message(message(&Stats::new(bar.length().unwrap_or(0))));
        }
        Self {
            out,
            progress,
            labels,
            verbose,
        }
    }

    /// Writes a line (above the bar when there is one), unless quiet. A closed stderr is
    /// ignored.
    fn line(&mut self, text: &str) {
        match &self.progress {
            Progress::Bar(bar) => bar.suspend(|| {
                let _ = writeln!(self.out, "{text}");
            }),
            Progress::Lines => {
                let _ = writeln!(self.out, "{text}");
            }
            Progress::Quiet => {}
        }
    }

    /// Writes a line also when quiet.
    fn always(&mut self, text: &str) {
        match &self.progress {
            Progress::Quiet => {
                let _ = writeln!(self.out, "{text}");
            }
            _ => self.line(text),
        }
    }

    /// Whether a line that only says how things go is shown: always as plain lines, with `-v`
    /// above a bar.
    fn routine(&self) -> bool {
        matches!(self.progress, Progress::Lines) || self.verbose
    }

    /// Shows `event`; `stats` are the counts with the event recorded.
    pub fn handle(&mut self, event: &Event, stats: &Stats) {
        match event {
            Event::IntervalStarted { interval, run_id } => {
                if self.verbose {
                    let text = format!(
                        "started    {} (run {run_id})",
                        self.labels.label(interval.start)
                    );
                    self.line(&text);
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
                // A try that printed nothing leaves no log file.
                let log = if std::path::Path::new(log_path).exists() {
                    log_path.clone()
                } else {
                    "none (the try printed nothing)".to_string()
                };
                let mut text = format!(
                    "try {try_number} of task `{task_id}` for {} failed: {error} ({then})\n  log: {log}",
                    self.labels.label(interval.start)
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
                let failed = matches!(state, RunState::Failed | RunState::Rejected);
                if failed || self.routine() {
                    let mut text = format!(
                        "{:<10} {} ({})",
                        state.as_str(),
                        self.labels.label(interval.start),
                        seconds(*elapsed)
                    );
                    if let Some(e) = error {
                        text.push_str(": ");
                        text.push_str(e);
                    }
                    self.line(&text);
                }
            }
            Event::IntervalSkipped { interval, reason } => {
                if self.routine() {
                    let text = format!(
                        "{:<10} {} ({reason})",
                        "skipped",
                        self.labels.label(interval.start)
                    );
                    self.line(&text);
                }
            }
            Event::PoolWait {
                interval,
                task_id,
                pool,
                waiting,
            } => {
                if *waiting && self.verbose {
                    let text = format!(
                        "waiting    {} task `{task_id}` for a slot of pool `{pool}`",
                        self.labels.label(interval.start)
                    );
                    self.line(&text);
                }
            }
            Event::MaxFailures { failed } => {
                self.always(&format!(
                    "{} (--max-failures {failed}): no new intervals; the running ones finish",
                    plural(i64::from(*failed), "interval failed", "intervals failed")
                ));
            }
            Event::Stopping { hard, why } => {
                let how = if *hard {
                    "killing running tasks now"
                } else {
                    "stopping: no new intervals; running tasks get SIGTERM (Ctrl-C again to kill now)"
                };
                self.always(&format!("{why}: {how}"));
            }
        }
        if let Progress::Bar(bar) = &self.progress {
            bar.set_position(stats.finished);
            bar.set_message(message(stats));
        }
    }

    /// Clears the bar.
    pub fn finish(&mut self) {
        if let Progress::Bar(bar) = &self.progress {
            bar.finish_and_clear();
        }
        let _ = self.out.flush();
    }
}

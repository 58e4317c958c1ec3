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
pub(crate) enum Progress {
    /// A bar; lines go above it.
    Bar(ProgressBar),
    Lines,
    Quiet,
}

impl Progress {
    /// For stderr: quiet with `quiet`, a bar when stderr is a terminal that can redraw one, plain
    /// lines otherwise.
    pub(crate) fn for_stderr(total: u64, quiet: bool) -> Self {
        if quiet {
            Self::Quiet
        } else if can_draw() {
            // As the lines are wrapped: `COLUMNS`, else the terminal's width.
            let width = super::out::Fit::stderr(false).width.map(usize::from);
            Self::Bar(bar(total, ProgressDrawTarget::stderr(), width))
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

/// The progress bar of `total` intervals, drawn on `target`, as fits its width.
pub(crate) fn bar(total: u64, target: ProgressDrawTarget, width: Option<usize>) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), target);
    let colour = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    bar.set_style(
        ProgressStyle::with_template(&template(width, colour))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// A terminal this wide (or wider) gets the bar's every word.
const WIDE: usize = 120;

/// The bar's template for a terminal `width` columns wide (`None`: unknown): the bar takes what
/// the words leave, and the words are fewer on a narrower terminal, so that the line does not
/// wrap (a test checks the widest counts at 60 columns and more).
fn template(width: Option<usize>, colour: bool) -> String {
    let words = match width {
        Some(w) if w < 60 => "{pos}/{len}",
        Some(w) if w < 70 => "{pos}/{len} · {msg}",
        Some(w) if w < WIDE => "{pos}/{len} · {msg} · {elapsed_precise}",
        _ => "{pos}/{len} intervals · {msg} · {elapsed_precise} elapsed · ETA {eta}",
    };
    let bar = if colour {
        "{wide_bar:.cyan/blue}"
    } else {
        "{wide_bar}"
    };
    format!("{bar} {words}")
}

/// The bar's message: what runs and what failed.
fn message(stats: &Stats, width: Option<usize>) -> String {
    let waiting = if stats.waiting > 0 && width.is_some_and(|w| w < WIDE) {
        format!(" ({} waiting)", stats.waiting)
    } else if stats.waiting > 0 {
        format!(" ({} waiting for a pool)", stats.waiting)
    } else {
        String::new()
    };
    let ready = match stats.waiting_ready {
        0 => String::new(),
        n if width.is_some_and(|w| w < WIDE) => format!(" · {n} not ready"),
        n => format!(" · {n} waiting for sources"),
    };
    format!(
        "{} running{waiting}{ready} · {} failed",
        stats.running,
        stats.failures()
    )
}

/// Renders events as they come, into `out` (stderr for a backfill; a buffer in tests).
pub(crate) struct Reporter<W: Write> {
    out: W,
    progress: Progress,
    labels: Labeler,
    verbose: bool,
    /// The width lines are wrapped to (see [`super::out::wrap`]); `None`: as they are.
    width: Option<usize>,
    /// The intervals (by start) whose failure or rejection it wrote, reason and all.
    written: std::collections::HashSet<i64>,
    /// The error of the last try of an interval (by start) that it wrote, until the interval's
    /// end is written.
    failed_with: std::collections::HashMap<i64, String>,
}

/// Whether a log line only says `error` again (the line a try writes of why it failed).
fn says_again(line: &str, error: &str) -> bool {
    let line = line.trim();
    line.len() >= 12 && error.contains(line)
}

impl Reporter<std::io::Stderr> {
    /// Progress of `total` intervals on stderr (see [`Progress::for_stderr`]).
    pub(crate) fn stderr(total: u64, labels: Labeler, quiet: bool, verbose: bool) -> Self {
        let mut reporter = Self::new(
            std::io::stderr(),
            Progress::for_stderr(total, quiet),
            labels,
            verbose,
        );
        reporter.width = super::out::Fit::stderr(false).width.map(usize::from);
        reporter
    }
}

impl<W: Write> Reporter<W> {
    pub(crate) fn new(out: W, progress: Progress, labels: Labeler, verbose: bool) -> Self {
        if let Progress::Bar(bar) = &progress {
            bar.set_message(message(&Stats::new(bar.length().unwrap_or(0)), None));
        }
        Self {
            out,
            progress,
            labels,
            verbose,
            width: None,
            written: std::collections::HashSet::new(),
            failed_with: std::collections::HashMap::new(),
        }
    }

    /// Writes a line (above the bar when there is one), unless quiet, wrapped to the width. A
    /// closed stderr is ignored.
    fn line(&mut self, text: &str) {
        let text = super::out::fitted(text, self.width);
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
                let _ = writeln!(self.out, "{}", super::out::fitted(text, self.width));
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
    pub(crate) fn handle(&mut self, event: &Event, stats: &Stats) {
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
                    // A line that only says the error again is left out.
                    for l in log_tail.lines().filter(|l| !says_again(l, error)) {
                        text.push_str("\n  | ");
                        text.push_str(l);
                    }
                    self.failed_with
                        .insert(interval.start.timestamp(), error.clone());
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
                if failed && !matches!(self.progress, Progress::Quiet) {
                    self.written.insert(interval.start.timestamp());
                }
                if failed || self.routine() {
                    let mut text = format!(
                        "{:<10} {} ({})",
                        state.as_str(),
                        self.labels.label(interval.start),
                        seconds(*elapsed)
                    );
                    // Its last try's line, just above, gave the error.
                    let said = self.failed_with.remove(&interval.start.timestamp());
                    if let Some(e) = error {
                        match said {
                            Some(s) if e.ends_with(&s) => text.push_str(": as written above"),
                            _ => {
                                text.push_str(": ");
                                text.push_str(e);
                            }
                        }
                    }
                    self.line(&text);
                }
            }
            Event::GateWarned {
                interval,
                task_id,
                warning,
            } => {
                let text = format!(
                    "warning    {} task `{task_id}`: {warning}",
                    self.labels.label(interval.start)
                );
                self.line(&text);
            }
            Event::Warning { warning } => self.always(&format!("warning: {warning}")),
            Event::IntervalSkipped { interval, reason } => {
                // Sources not ready is said above a bar too: the interval was not run.
                if self.routine() || *reason == crate::plan::SkipReason::NotReady {
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
                rate,
            } => {
                if *waiting && self.verbose {
                    let what = if *rate { "the rate" } else { "a slot" };
                    let text = format!(
                        "waiting    {} task `{task_id}` for {what} of pool `{pool}`",
                        self.labels.label(interval.start)
                    );
                    self.line(&text);
                }
            }
            Event::ReadyWait {
                interval,
                task_id,
                waiting,
                left,
            } => {
                if *waiting && self.routine() {
                    let text = format!(
                        "waiting    {} task `{task_id}` for its sources ({} left)",
                        self.labels.label(interval.start),
                        crate::words::duration_left(*left)
                    );
                    self.line(&text);
                }
            }
            Event::ReadyCheckFailed {
                interval,
                task_id,
                error,
            } => {
                let text = format!(
                    "warning: {} task `{task_id}`: the readiness check failed (counted as not ready): {error}",
                    self.labels.label(interval.start)
                );
                self.always(&text);
            }
            Event::MaxFailures { failed } => {
                self.always(&format!(
                    "{} (--max-failures {failed}): no new intervals; the running ones finish",
                    plural(i64::from(*failed), "interval failed", "intervals failed")
                ));
            }
            Event::OwnerGone {
                backfill_id,
                worker,
                owner,
                refused,
            } => {
                let text = match refused {
                    None => format!(
                        "backfill {backfill_id}'s owner ({owner}) is gone: worker {worker} takes the backfill over and finishes it"
                    ),
                    Some(why) => format!(
                        "backfill {backfill_id}'s owner ({owner}) is gone, and worker {worker} cannot take its place ({why}): it starts no more intervals, ends its runs in flight and stops; `{}` runs the rest",
                        crate::words::hint(&format!("resume {backfill_id}"))
                    ),
                };
                self.always(&text);
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
            bar.set_message(message(stats, self.width));
        }
    }

    /// The intervals (by start) whose failure or rejection it wrote with its reason: the
    /// summary need not say it again.
    pub(crate) fn written(&self) -> &std::collections::HashSet<i64> {
        &self.written
    }

    /// Clears the bar.
    pub(crate) fn finish(&mut self) {
        if let Progress::Bar(bar) = &self.progress {
            bar.finish_and_clear();
        }
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::SkipReason;
    use crate::report::fixtures::{self, FAILED, REJECTED, Shared, day};

    /// A run of January 1 to 5: the 2nd is rejected, the 3rd fails after a retry and prints
    /// its log's tail, the 5th is skipped. `log` is the failed try's log file.
    fn events(log: &str) -> Vec<Event> {
        let ms = Duration::from_millis;
        let finished = |d, _run: i64, state, error: Option<&str>| Event::IntervalFinished {
            interval: day(d),
            state,
            elapsed: ms(1250),
            error: error.map(String::from),
        };
        let failed_try =
            |try_number, will_retry, log_path: &str, log_tail: &str| Event::TryFailed {
                interval: day(3),
                task_id: "export".into(),
                try_number,
                error: "exit code 2".into(),
                will_retry,
                log_path: log_path.into(),
                log_tail: log_tail.into(),
            };
        vec![
            Event::IntervalStarted {
                interval: day(1),
                run_id: 1,
            },
            finished(1, 1, RunState::Succeeded, None),
            Event::IntervalStarted {
                interval: day(2),
                run_id: 2,
            },
            finished(2, 2, RunState::Rejected, Some(REJECTED)),
            Event::IntervalStarted {
                interval: day(3),
                run_id: 3,
            },
            Event::PoolWait {
                interval: day(3),
                task_id: "export".into(),
                pool: "warehouse".into(),
                waiting: true,
                rate: false,
            },
            Event::PoolWait {
                interval: day(3),
                task_id: "export".into(),
                pool: "warehouse".into(),
                waiting: false,
                rate: false,
            },
            failed_try(1, true, "/nowhere/try1.log", ""),
            failed_try(2, false, log, "connecting to upstream\nupstream missing"),
            finished(3, 3, RunState::Failed, Some(FAILED)),
            Event::MaxFailures { failed: 2 },
            Event::IntervalSkipped {
                interval: day(5),
                reason: SkipReason::PreviousNotSuccessful,
            },
            Event::Stopping {
                hard: false,
                why: "interrupted (SIGINT)".into(),
            },
        ]
    }

    /// What a reporter writes for [`events`], with the counts the dispatcher would hand it;
    /// also the counts at the end.
    fn render(progress: impl FnOnce() -> Progress, verbose: bool) -> (String, Stats) {
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("try2.log");
        std::fs::write(&log, "upstream missing\n").unwrap();
        let out = Shared::default();
        let mut reporter = Reporter::new(out.clone(), progress(), fixtures::labels(), verbose);
        let mut stats = Stats::new(5);
        for event in events(&log.display().to_string()) {
            stats.record(&event);
            reporter.handle(&event, &stats);
        }
        reporter.finish();
        let text = out
            .text()
            .replace(&logs.path().display().to_string(), "[logs]");
        (text, stats)
    }

    fn hidden_bar() -> Progress {
        Progress::Bar(bar(5, ProgressDrawTarget::hidden(), Some(120)))
    }

    #[test]
    fn plain_lines_say_every_finished_interval_and_every_failed_try() {
        let (text, stats) = render(|| Progress::Lines, false);
        insta::assert_snapshot!("lines", text);
        assert_eq!((stats.finished, stats.failures(), stats.running), (4, 2, 0));
    }

    #[test]
    fn verbose_plain_lines_also_say_when_an_interval_starts_or_waits() {
        let (text, _) = render(|| Progress::Lines, true);
        insta::assert_snapshot!("lines_verbose", text);
    }

    #[test]
    fn above_a_bar_only_what_needs_attention_is_written() {
        let (text, _) = render(hidden_bar, false);
        insta::assert_snapshot!("bar", text);
        assert!(!text.contains("succeeded  2026-01-01"), "{text}");
        assert!(!text.contains("skipped    2026-01-05"), "{text}");
    }

    #[test]
    fn above_a_bar_verbose_writes_what_plain_lines_write_and_the_starts() {
        let (bar, _) = render(hidden_bar, true);
        let (lines, _) = render(|| Progress::Lines, true);
        assert_eq!(bar, lines);
    }

    #[test]
    fn quiet_says_only_why_the_run_stops() {
        let (text, _) = render(|| Progress::Quiet, false);
        assert_eq!(
            text,
            "2 intervals failed (--max-failures 2): no new intervals; the running ones finish\n\
             interrupted (SIGINT): stopping: no new intervals; running tasks get SIGTERM (Ctrl-C again to kill now)\n"
        );
    }

    #[test]
    fn a_worker_says_when_it_found_its_owner_gone_also_when_quiet() {
        let gone = |refused: Option<&str>| Event::OwnerGone {
            backfill_id: 7,
            worker: 2,
            owner: "pid 41, host hosta".into(),
            refused: refused.map(String::from),
        };
        for progress in [Progress::Lines, Progress::Quiet] {
            let out = Shared::default();
            let mut reporter = Reporter::new(out.clone(), progress, fixtures::labels(), false);
            let stats = Stats::new(5);
            reporter.handle(&gone(None), &stats);
            reporter.handle(&gone(Some("it is a cascade's backfill")), &stats);
            reporter.finish();
            assert_eq!(
                out.text(),
                "backfill 7's owner (pid 41, host hosta) is gone: worker 2 takes the backfill over and finishes it\n\
                 backfill 7's owner (pid 41, host hosta) is gone, and worker 2 cannot take its place (it is a cascade's backfill): it starts no more intervals, ends its runs in flight and stops; `backfill resume 7` runs the rest\n"
            );
        }
    }

    #[test]
    fn the_bar_line_fits_its_terminal() {
        // Wide values: ten years of hours, 16 running and waiting for a pool, an hour elapsed.
        let stats = Stats {
            total: 99_999,
            running: 16,
            waiting: 16,
            failed: 999,
            ..Stats::default()
        };
        for width in [40, 59, 60, 70, 80, 100, 119, 120, 200] {
            let msg = message(&stats, Some(width));
            let words = template(Some(width), false)
                .replace("{wide_bar} ", "")
                .replace("{pos}", "99999")
                .replace("{len}", "99999")
                .replace("{msg}", &msg)
                .replace("{elapsed_precise}", "01:00:00")
                .replace("{eta}", "59m");
            // At least five columns of bar are left.
            assert!(words.chars().count() + 6 <= width, "{width}: {words}");
        }
    }

    #[test]
    fn the_bar_shows_the_counts_it_is_handed() {
        let bar = bar(5, ProgressDrawTarget::hidden(), Some(80));
        let mut reporter = Reporter::new(
            Shared::default(),
            Progress::Bar(bar.clone()),
            fixtures::labels(),
            false,
        );
        let stats = Stats {
            total: 5,
            running: 2,
            waiting: 1,
            finished: 3,
            failed: 1,
            rejected: 1,
            succeeded: 1,
            ..Stats::default()
        };
        reporter.handle(&Event::MaxFailures { failed: 2 }, &stats);
        assert_eq!(bar.position(), 3);
        assert_eq!(bar.message(), "2 running (1 waiting for a pool) · 2 failed");
    }
}

//! Turns runner events into what people and programs read, on stderr while a backfill runs: a
//! progress bar on a terminal that can draw one (done/total, running, failed, ETA), one plain
//! line per finished interval otherwise (cron, CI, a pipe, `TERM=dumb`), nothing with `-q`.
//! At the end, a summary: a table and a line for humans (stderr), or one JSON document
//! (stdout); a failed backfill always lists its failures and the command that reruns them on
//! stderr, with `-q` and `--output json` too.

pub mod label;
pub mod out;
pub mod tables;

use std::io::{IsTerminal, Write};
use std::time::Duration;

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

pub use label::Labeler;

use crate::exit::{self, Error};
use crate::manifest::queries::{Counts, FailedInterval, Outcome};
use crate::plan::RunState;
use crate::runner::Event;

fn seconds(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

/// How progress is shown.
enum Mode {
    Bar(ProgressBar),
    Lines,
    Quiet,
}

/// Whether stderr is a terminal that can redraw a progress bar: `TERM=dumb` (or no `TERM`)
/// gets plain lines.
fn can_draw() -> bool {
    std::io::stderr().is_terminal()
        && std::env::var("TERM").is_ok_and(|t| !t.is_empty() && t != "dumb")
}

/// Renders events as they come.
pub struct Reporter {
    mode: Mode,
    labels: Labeler,
    verbose: bool,
    running: u64,
    /// Tries waiting for a pool slot.
    waiting: u64,
    failed: u64,
}

impl Reporter {
    /// `total` is the number of intervals to run; `quiet` suppresses per-interval output.
    pub fn new(total: u64, labels: Labeler, quiet: bool, verbose: bool) -> Self {
        let mode = if quiet {
            Mode::Quiet
        } else if can_draw() {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let template = if std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()) {
                "{bar:30} {pos}/{len} intervals · {msg} · {elapsed_precise} elapsed · ETA {eta}"
            } else {
                "{bar:30.cyan/blue} {pos}/{len} intervals · {msg} · {elapsed_precise} elapsed · ETA {eta}"
            };
            bar.set_style(
                ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            Mode::Bar(bar)
        } else {
            Mode::Lines
        };
        let reporter = Self {
            mode,
            labels,
            verbose,
            running: 0,
            waiting: 0,
            failed: 0,
        };
        reporter.update_message();
        reporter
    }

    fn line(&self, text: &str) {
        match &self.mode {
            Mode::Bar(bar) => bar.println(text),
            Mode::Lines => out::note(text),
            Mode::Quiet => {}
        }
    }

    fn update_message(&self) {
        if let Mode::Bar(bar) = &self.mode {
            let waiting = if self.waiting > 0 {
                format!(" ({} waiting for a pool)", self.waiting)
            } else {
                String::new()
            };
            bar.set_message(format!(
                "{} running{waiting} · {} failed",
                self.running, self.failed
            ));
        }
    }

    pub fn handle(&mut self, event: &Event) {
        match event {
            Event::IntervalStarted { interval, run_id } => {
                self.running += 1;
                if self.verbose {
                    self.line(&format!(
                        "started    {} (run {run_id})",
                        self.labels.label(interval.start)
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
                self.running = self.running.saturating_sub(1);
                if matches!(state, RunState::Failed | RunState::Rejected) {
                    self.failed += 1;
                }
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
                if let Mode::Bar(bar) = &self.mode {
                    bar.inc(1);
                }
            }
            Event::IntervalSkipped { interval, reason } => {
                self.line(&format!(
                    "{:<10} {} ({reason})",
                    "skipped",
                    self.labels.label(interval.start)
                ));
                if let Mode::Bar(bar) = &self.mode {
                    bar.inc(1);
                }
            }
            Event::PoolWait {
                interval,
                task_id,
                pool,
                waiting,
            } => {
                if *waiting {
                    self.waiting += 1;
                    if self.verbose {
                        self.line(&format!(
                            "waiting    {} task `{task_id}` for a slot of pool `{pool}`",
                            self.labels.label(interval.start)
                        ));
                    }
                } else {
                    self.waiting = self.waiting.saturating_sub(1);
                }
            }
            Event::MaxFailures { failed } => {
                let text = format!(
                    "{} (--max-failures {failed}): no new intervals; the running ones finish",
                    out::plural(i64::from(*failed), "interval failed", "intervals failed")
                );
                match &self.mode {
                    Mode::Quiet => out::note(&text),
                    _ => self.line(&text),
                }
            }
            Event::Stopping { hard, why } => {
                let how = if *hard {
                    "killing running tasks now"
                } else {
                    "stopping: no new intervals; running tasks get SIGTERM (Ctrl-C again to kill now)"
                };
                // Stopping is always said, also with -q: the exit code alone does not say why.
                let text = format!("{why}: {how}");
                match &self.mode {
                    Mode::Quiet => out::note(&text),
                    _ => self.line(&text),
                }
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
    /// The command that reruns the failed and rejected intervals, when there are any.
    pub rerun: Option<String>,
}

/// What a rerun hint needs to know about the command that ran.
pub struct Rerun<'a> {
    pub conf: &'a serde_json::Value,
    pub allow_drift: bool,
    /// `--tasks` of the backfill.
    pub tasks: Option<&'a [String]>,
}

use out::shell_word;

/// The complete command that reruns exactly the failed and rejected intervals of a backfill.
pub fn rerun_command(outcome: &Outcome, labels: &Labeler, how: &Rerun<'_>) -> Option<String> {
    let first = outcome.failed.iter().map(|f| f.start.0).min()?;
    let last = outcome.failed.iter().map(|f| f.start.0).max()?;
    let mut words: Vec<String> = Vec::new();
    words.extend(
        [
            "create",
            "--dag",
            &shell_word(&outcome.backfill.dag_id),
            "--from",
            &shell_word(&labels.when(first)),
            "--to",
            &shell_word(&labels.when(last)),
            "--reprocess-behavior",
            "failed",
        ]
        .map(String::from),
    );
    if how.conf.as_object().is_some_and(|o| !o.is_empty()) {
        words.push("--conf".into());
        words.push(shell_word(&how.conf.to_string()));
    }
    if how.allow_drift {
        words.push("--allow-drift".into());
    }
    if let Some(tasks) = how.tasks {
        words.push("--tasks".into());
        words.push(shell_word(&tasks.join(",")));
    }
    Some(out::hint(&words.join(" ")))
}

/// Builds the summary of a finished (or stopped) backfill from its outcome in the manifest.
pub fn summary<'a>(
    outcome: &'a Outcome,
    exit_code: u8,
    elapsed: Duration,
    rerun: Option<String>,
) -> Summary<'a> {
    Summary {
        backfill_id: outcome.backfill.id,
        dag_id: &outcome.backfill.dag_id,
        state: outcome.backfill.state.as_str(),
        exit_code,
        intervals: &outcome.backfill.intervals,
        skipped: &outcome.skipped,
        failed: &outcome.failed,
        elapsed_seconds: elapsed.as_secs_f64(),
        rerun,
    }
}

/// Prints the summary: JSON on stdout with `--output json`, else a table and a line on stderr
/// (nothing on success with `-q`). Failures are always listed on stderr, with the command that
/// reruns them.
pub fn print_summary(
    s: &Summary<'_>,
    labels: &Labeler,
    json: bool,
    quiet: bool,
) -> Result<(), Error> {
    if json {
        out::json(s)?;
    }
    let c = s.intervals;
    let mut err = std::io::stderr().lock();
    if !json && !quiet {
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
    }
    for f in s.failed {
        let _ = writeln!(
            err,
            "{} {}: {}{}",
            f.state,
            labels.label(f.start.0),
            f.error.as_deref().unwrap_or("-"),
            f.log.as_ref().map_or_else(
                || "\n  log: none (the try printed nothing)".to_string(),
                |l| format!("\n  log: {l}")
            )
        );
    }
    let next = match (s.exit_code, &s.rerun) {
        (exit::INTERRUPTED, _) => format!(
            "; continue with `{}`",
            out::hint(&format!("resume {}", s.backfill_id))
        ),
        (exit::FAILED, _) if c.pending > 0 => format!(
            "; {} not started: continue with `{}`{}",
            out::plural(c.pending, "interval", "intervals"),
            out::hint(&format!("resume {}", s.backfill_id)),
            s.rerun
                .as_ref()
                .map(|r| format!(", or rerun the failures with `{r}`"))
                .unwrap_or_default()
        ),
        (exit::FAILED, Some(rerun)) => format!("; rerun the failures with `{rerun}`"),
        _ => String::new(),
    };
    if !json && (!quiet || s.exit_code != exit::OK) {
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
    } else if json && !next.is_empty() {
        let _ = writeln!(err, "backfill {}: {}{next}", s.backfill_id, s.state);
    }
    Ok(())
}

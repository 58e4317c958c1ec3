//! Runs a backfill that this process owns (after `create` or `resume`): the dispatcher that
//! owns the outside world. It watches signals and the manifest's cancel flag, sends the
//! heartbeat, feeds runner events to the reporter, and records how the backfill ended.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

use super::Global;
use crate::exit::{self, Error};
use crate::interval::DataInterval;
use crate::manifest::writer::Writer;
use crate::manifest::{self, BackfillState, Heartbeat, lease};
use crate::project::{Dag, Project};
use crate::report::{self, Reporter};
use crate::runner::{self, Event, RunSpec, Stop};

/// How often the owner's heartbeat is written and the cancel flag read.
const HEARTBEAT: Duration = Duration::from_millis(250);

pub struct Execution {
    pub backfill_id: i64,
    pub dag: Dag,
    pub conf: serde_json::Value,
    pub max_active_runs: u32,
    pub intervals: Vec<DataInterval>,
    pub allow_drift: bool,
}

/// Runs the intervals, then prints the summary and returns the exit code.
pub fn execute(g: &Global, project: &Project, e: Execution, writer: Writer) -> Result<u8, Error> {
    let began = Instant::now();
    let backfill_id = e.backfill_id;
    let tz = e.dag.tz;
    let total = e.intervals.len() as u64;
    let spec = RunSpec {
        backfill_id,
        dag: Arc::new(e.dag),
        conf: e.conf,
        project_root: project.root.clone(),
        logs_dir: project.logs_dir.clone(),
        host: lease::hostname(),
        max_active_runs: e.max_active_runs as usize,
        intervals: e.intervals,
        allow_drift: e.allow_drift,
        fault: std::env::var("BACKFILL_FAULT").ok(),
    };
    // Two workers: spawning a task blocks its thread until the child has exec'd (vfork), and
    // the other worker keeps reaping, recording and dispatching meanwhile.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Internal(e.into()))?;
    let (quiet, verbose) = (g.quiet || g.json, g.verbose);
    let stopped = runtime.block_on(async {
        let (stop_tx, stop_rx) = watch::channel(Stop::Run);
        let (events_tx, mut events_rx) = mpsc::unbounded_channel::<Event>();
        let signals = tokio::spawn(watch_signals(stop_tx.clone(), events_tx.clone()));
        let heartbeat = tokio::spawn(keep_alive(
            writer.clone(),
            backfill_id,
            stop_tx.clone(),
            events_tx.clone(),
        ));
        let reporter = tokio::spawn(async move {
            let mut reporter = Reporter::new(total, tz, quiet, verbose);
            while let Some(event) = events_rx.recv().await {
                reporter.handle(&event);
            }
            reporter.finish();
        });
        let result = runner::run(spec, writer.clone(), events_tx, stop_rx).await;
        signals.abort();
        heartbeat.abort();
        let _ = signals.await;
        let _ = heartbeat.await;
        let _ = reporter.await;
        result?;
        let stopped = *stop_tx.borrow() != Stop::Run;
        Ok::<bool, anyhow::Error>(stopped)
    })?;
    // How the backfill ended, judged on its own runs in the manifest. The outcome holds counts
    // and the failed intervals only, so memory does not grow with the number of intervals.
    let mut outcome = writer.call_blocking(move |c| {
        manifest::queries::outcome(c, backfill_id)?
            .ok_or_else(|| anyhow::anyhow!("backfill {backfill_id} vanished from the manifest"))
    })?;
    let counts = &outcome.backfill.intervals;
    let (state, code) = if stopped || counts.pending > 0 || counts.cancelled > 0 {
        (BackfillState::Cancelled, exit::INTERRUPTED)
    } else if counts.failed + counts.rejected > 0 {
        (BackfillState::Failed, exit::FAILED)
    } else {
        (BackfillState::Completed, exit::OK)
    };
    let recorded = writer.call_blocking(move |c| {
        manifest::finish_backfill(c, backfill_id, state, lease::now_ms())?;
        Ok(manifest::get_backfill(c, backfill_id)?.map(|b| b.state))
    })?;
    // A fenced backfill was already recorded as cancelled by the process that took it over.
    let state = recorded.unwrap_or(state);
    let code = if state == BackfillState::Cancelled {
        exit::INTERRUPTED
    } else {
        code
    };
    outcome.backfill.state = state.as_str().to_string();
    report::print_summary(
        &report::summary(&outcome, code, began.elapsed()),
        g.json,
        g.quiet,
    );
    Ok(code)
}

/// First SIGINT or SIGTERM: stop gracefully. A second one: kill now.
async fn watch_signals(stop: watch::Sender<Stop>, events: mpsc::UnboundedSender<Event>) {
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    loop {
        let name = tokio::select! {
            _ = int.recv() => "interrupted (SIGINT)",
            _ = term.recv() => "terminated (SIGTERM)",
        };
        let hard = *stop.borrow() != Stop::Run;
        let _ = stop.send(if hard { Stop::Kill } else { Stop::Graceful });
        let _ = events.send(Event::Stopping {
            hard,
            why: name.to_string(),
        });
    }
}

/// Writes the heartbeat and reacts to `backfill cancel` from another process.
async fn keep_alive(
    writer: Writer,
    backfill_id: i64,
    stop: watch::Sender<Stop>,
    events: mpsc::UnboundedSender<Event>,
) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let beat = writer
            .call(move |c| manifest::heartbeat(c, backfill_id, lease::now_ms()))
            .await;
        let why = match beat {
            Ok(Heartbeat::CancelRequested) => "cancelled by `backfill cancel`",
            Ok(Heartbeat::Fenced) => {
                "another backfill took the intervals over (no heartbeat within lease_timeout)"
            }
            Ok(Heartbeat::Carry) | Err(_) => continue,
        };
        if *stop.borrow() == Stop::Run {
            let _ = stop.send(Stop::Graceful);
            let _ = events.send(Event::Stopping {
                hard: false,
                why: why.to_string(),
            });
        }
    }
}

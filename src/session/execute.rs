//! Runs a backfill that this process owns (after `create` or `resume`) or helps run (`join`):
//! the dispatcher that owns the outside world. It watches signals (SIGINT, SIGTERM, SIGHUP) and
//! the manifest's cancel flag, sends the heartbeat, feeds runner events to the reporter, records
//! how the backfill ended and runs its notify hooks. Signals are listened to from the start to
//! the end of the hooks: one during the hooks stops them, and the exit code is then 130.
//!
//! A worker also watches its owner (see [`super::succession`]): one that took the backfill over
//! runs the rest of it here once its runs in flight ended, as the owner, with the same signals,
//! writer and hooks.
//!
//! An owner that cannot write its heartbeat stops by itself before its lease could be judged
//! stale: another process would otherwise take its intervals over while its tries still run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::End as Ended;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{mpsc, oneshot, watch};

use super::Global;
use super::succession::Found;
use crate::clock::HEARTBEAT;
use crate::exit::{self, Error};
use crate::interval::DataInterval;
use crate::manifest::backfills::Heartbeat;
use crate::manifest::writer::Writer;
use crate::manifest::{self, Owner};
use crate::project::{Dag, Project};
use crate::report::out::{Fit, Sink};
use crate::report::{self, Reporter};
use crate::runner::{self, Event, RunSpec, Stats, Stop};
use crate::warehouse::Repr;

pub(crate) struct Execution {
    pub owner: Owner,
    pub dag: Dag,
    pub conf: serde_json::Value,
    pub max_active_runs: u32,
    pub intervals: Vec<DataInterval>,
    pub allow_drift: bool,
    pub reprs: HashMap<String, Option<Repr>>,
    pub mode: runner::Mode,
    pub max_failures: Option<u32>,
    /// `--tasks`: only these tasks run (the DAG holds only them).
    pub tasks: Option<Vec<String>>,
    /// A cascade's downstream backfill: the DAGs its intervals read (see [`RunSpec::upstream`]).
    pub upstream: Vec<Dag>,
    /// When this process created the backfill, on the monotonic clock (`None`: another one
    /// did): its end is recorded as its creation plus the time since.
    pub created: Option<crate::clock::Mark>,
    /// `--wait-ready` and `--require-ready`, as the backfill recorded them.
    pub ready: Readiness,
}

/// How a backfill treats intervals whose sources are not ready (`[tasks.ready]`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Readiness {
    /// `--wait-ready`: how long an interval may wait, for every task (`None`: each task's
    /// `wait`).
    pub wait: Option<std::time::Duration>,
    /// `--require-ready`: an interval not ready makes the exit code [`crate::exit::NOT_READY`].
    pub require: bool,
}

impl Readiness {
    /// As a backfill's record holds it.
    pub(crate) fn of(b: &crate::manifest::Backfill) -> Self {
        Self::recorded(b.wait_ready, b.require_ready)
    }

    /// From the recorded `wait_ready` (milliseconds) and `require_ready`.
    pub(crate) fn recorded(wait_ms: Option<i64>, require: bool) -> Self {
        Self {
            wait: wait_ms
                .and_then(|ms| u64::try_from(ms).ok())
                .map(std::time::Duration::from_millis),
            require,
        }
    }
}

/// Runs the intervals, then prints the summary and returns the exit code. The writer is closed
/// (its WAL checkpointed) before returning.
pub(crate) fn execute(
    g: &Global,
    project: &Project,
    e: Execution,
    writer: Writer,
) -> Result<u8, Error> {
    let owners_notify = e.dag.notify.over(&project.notify);
    // A worker's end is not the backfill's: its owner runs the hooks. A worker that took the
    // backfill over ends as its owner.
    let mut as_owner = e.owner.worker.is_none();
    let (backfill_id, dag_id) = (e.owner.backfill_id, e.dag.id.clone());
    // Two workers when tries are processes: spawning one blocks its thread until the child has
    // exec'd (vfork), and the other worker keeps reaping, recording and dispatching meanwhile.
    // Tries of SQL tasks whose work runs in the warehouse's server (PostgreSQL) wait for it on
    // threads of their own, so one worker dispatches them all; a second only wakes to find
    // nothing to do, taking the CPU from the database server on a small machine (5% of the
    // wall time of a one-at-a-time PostgreSQL backfill on two cores). SQLite's audits run in
    // this process: not measured to gain, they keep two.
    let all_in_servers = e.dag.tasks.iter().all(|t| {
        matches!(&t.kind, crate::project::TaskKind::Sql(s)
            if crate::warehouse::backend_of(&s.warehouse).holding()
                == crate::warehouse::Holding::OwnTransaction)
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(if all_in_servers { 1 } else { 2 })
        .enable_all()
        .build()
        .map_err(|e| Error::io("cannot start the async runtime", e))?;
    let mut signals = runtime.block_on(async { Signals::listen() });
    let result = run(
        g,
        project,
        e,
        &writer,
        (&runtime, &mut signals),
        (false, &mut as_owner),
    );
    let notify = if as_owner {
        owners_notify
    } else {
        crate::project::Notify::default()
    };
    crate::warehouse::close_all();
    crate::manifest::close_readers();
    writer.close();
    let ended = match &result {
        Ok(end) => crate::notify::Ended {
            backfill_id,
            dag_id: &dag_id,
            state: end.state.as_str(),
            exit_code: end.code,
            not_ready: end.not_ready,
            summary: end.summary.clone(),
        },
        Err(e) => crate::notify::Ended {
            backfill_id,
            dag_id: &dag_id,
            state: crate::state::BackfillState::Failed.as_str(),
            exit_code: e.exit_code(),
            not_ready: 0,
            summary: serde_json::json!({
                "backfill_id": backfill_id,
                "dag_id": dag_id,
                "state": "failed",
                "exit_code": e.exit_code(),
                "error": {"kind": e.kind(), "message": e.to_string()},
            })
            .to_string(),
        },
    };
    // A stop of its own: the signals that stopped the runner do not stop the hooks.
    let (stop_tx, mut stop) = watch::channel(Stop::Run);
    let warnings = runtime.block_on(async {
        let (done, watching) = oneshot::channel();
        let watcher = tokio::spawn(watch_signals(signals, stop_tx.clone(), None, watching));
        let warnings =
            crate::notify::run(&notify, &project.root, &project.logs_dir, &ended, &mut stop).await;
        let _ = done.send(());
        let _ = watcher.await;
        warnings
    });
    for warning in warnings {
        super::warn(g, &warning);
    }
    // Everything the run waits for has ended; a readiness query that never answered (left on
    // its thread, see `runner::ready`) does not hold the process.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    let interrupted = *stop_tx.borrow() != Stop::Run;
    result.map(|end| {
        if interrupted {
            exit::INTERRUPTED
        } else {
            end.code
        }
    })
}

impl Execution {
    /// The same backfill with no intervals: what a worker that took it over runs as its owner
    /// (see [`super::succession`]).
    fn rest(&self) -> Self {
        Self {
            owner: self.owner,
            dag: self.dag.clone(),
            conf: self.conf.clone(),
            max_active_runs: self.max_active_runs,
            intervals: Vec::new(),
            allow_drift: self.allow_drift,
            reprs: self.reprs.clone(),
            mode: self.mode.clone(),
            max_failures: self.max_failures,
            tasks: self.tasks.clone(),
            upstream: self.upstream.clone(),
            created: None,
            ready: self.ready,
        }
    }
}

/// Failed intervals whose log's last lines the summary shows.
const SUMMARY_LOG_TAILS: usize = 20;

/// How a backfill ended: its exit code, state and JSON summary.
struct End {
    code: u8,
    state: crate::state::BackfillState,
    summary: String,
    /// Intervals whose sources were not ready (`[tasks.ready]`).
    not_ready: i64,
}

/// Runs the backfill's intervals as `e.owner` (its owner, or a worker), then records and says
/// how it ended. `stopped_before`: stopped before it began (a worker that took the backfill
/// over and was stopped while its runs in flight ended), so it runs nothing and is judged
/// interrupted. `as_owner` is set when the process goes on as the backfill's owner.
fn run(
    g: &Global,
    project: &Project,
    e: Execution,
    writer: &Writer,
    (runtime, signals): (&tokio::runtime::Runtime, &mut Option<Signals>),
    (stopped_before, as_owner): (bool, &mut bool),
) -> Result<End, Error> {
    let began = Instant::now();
    let owner = e.owner;
    let worker = owner.worker.is_some();
    // What a worker that takes the backfill over runs as its owner.
    let rest = worker.then(|| e.rest());
    let after = After {
        created: e.created,
        labels: crate::report::Labeler::new(&e.dag),
        conf: e.conf.clone(),
        allow_drift: e.allow_drift,
        staging: matches!(e.mode, runner::Mode::Stage),
        // A failed promote or rollback is not rerun by `create`: its lines say what failed.
        reruns: matches!(e.mode, runner::Mode::Run | runner::Mode::Stage),
        only_tasks: e.tasks.clone(),
        ready: e.ready,
        began,
    };
    let watch = Watch::default();
    let total = e.intervals.len() as u64;
    let (spec, tend, wind_down) = spec_of(project, e, writer, &watch);
    let (quiet, verbose) = (g.quiet || g.json, g.verbose);
    let driven = Driven {
        writer,
        project,
        owner,
        stopped_before,
        total,
        labels: after.labels,
        quiet,
        verbose,
    };
    let (result, stopped, stats, found) =
        runtime.block_on(drive(driven, spec, signals, (tend, wind_down), &watch));
    if let Some(e) = heartbeat_failure(g, writer, owner, &watch.heartbeat_error) {
        return Err(e);
    }
    let runner::Ran { halted, fault } = result?;
    if worker {
        use super::worker::WorkerEnd;
        // A worker whose backfill ended while it had nothing in flight was not interrupted.
        let ended = watch.ended.load(std::sync::atomic::Ordering::Relaxed) && stats.cancelled == 0;
        let stopped = stopped && !ended;
        let end = match &found {
            Found::Nothing => WorkerEnd::Usual,
            Found::TookOver(_) => WorkerEnd::TookOver,
            Found::Refused => WorkerEnd::OwnerGone,
        };
        let (code, state, summary) = super::worker::finish_worker(
            g,
            writer,
            owner,
            stats,
            (stopped, end, fault.as_ref()),
            began,
        )?;
        // Recorded as ended, it goes on as the backfill's owner no more.
        if let Some(e) = gone_error(writer, &watch.gone, owner.backfill_id, None) {
            return Err(e);
        }
        if let (Found::TookOver(successor), Some(rest)) = (found, rest) {
            *as_owner = true;
            return go_on_as_owner(
                g, project, rest, successor, stopped, writer, runtime, signals,
            );
        }
        return Ok(End {
            code,
            state,
            summary,
            not_ready: 0,
        });
    }
    finish_owner(g, writer, owner, &watch, (halted, fault, stopped), after)
}

/// What the end of a backfill's run needs to know of how it began, to record and say it.
struct After {
    created: Option<crate::clock::Mark>,
    labels: crate::report::Labeler,
    /// What a rerun command repeats.
    conf: serde_json::Value,
    allow_drift: bool,
    only_tasks: Option<Vec<String>>,
    staging: bool,
    /// Whether the summary offers a command that reruns the failures.
    reruns: bool,
    ready: Readiness,
    began: Instant,
}

/// What the run's helpers saw, shared with them.
#[derive(Default)]
struct Watch {
    /// Why the heartbeat could not be written.
    heartbeat_error: Arc<Mutex<Option<Error>>>,
    /// What the heartbeat saw gone of the project folder or the manifest's file.
    gone: Arc<Mutex<Option<String>>>,
    /// A worker told by its heartbeat that the backfill no longer runs.
    ended: Arc<std::sync::atomic::AtomicBool>,
    /// A worker whose queue ran dry waits while the backfill runs (see `worker::linger`).
    lingering: Arc<std::sync::atomic::AtomicBool>,
    /// The intervals (by start) whose failure the reporter wrote with its reason.
    written: Arc<Mutex<std::collections::HashSet<i64>>>,
}

/// What the runner is handed; with what the owner tends (its gone workers' intervals, see
/// `worker::refill`) and, for a worker, the sender that winds its runner down.
fn spec_of(
    project: &Project,
    e: Execution,
    writer: &Writer,
    watch: &Watch,
) -> (RunSpec, Option<runner::Refill>, watch::Sender<bool>) {
    let owner = e.owner;
    let worker = owner.worker.is_some();
    let refill = if worker {
        super::worker::linger(
            writer.path().to_path_buf(),
            owner.backfill_id,
            watch.lingering.clone(),
        )
    } else {
        super::worker::refill(project, &e.dag.id, writer, owner)
    };
    let tend = (!worker).then(|| refill.clone());
    // A worker's runner winds down when its watch over the owner finds it gone.
    let (wind_down, wound_down) = watch::channel(false);
    let spec = RunSpec {
        owner,
        dag: Arc::new(e.dag),
        conf: e.conf,
        project_root: project.root.clone(),
        logs_dir: project.logs_dir.clone(),
        manifest_path: writer.path().to_path_buf(),
        host: crate::liveness::Host::name(&crate::process::LOCAL),
        max_active_runs: e.max_active_runs as usize,
        intervals: e.intervals,
        allow_drift: e.allow_drift,
        reprs: e.reprs,
        mode: e.mode,
        max_failures: e.max_failures,
        pools: project.pools.clone(),
        pool_rates: project.pool_rates.clone(),
        lease_timeout: project.lease_timeout,
        upstream: e.upstream,
        wait_ready: e.ready.wait,
        refill: Some(refill),
        wind_down: worker.then_some(wound_down),
    };
    (spec, tend, wind_down)
}

/// What [`drive`] runs with, besides the runner's spec.
struct Driven<'a> {
    writer: &'a Writer,
    project: &'a Project,
    owner: Owner,
    stopped_before: bool,
    total: u64,
    labels: crate::report::Labeler,
    quiet: bool,
    verbose: bool,
}

/// The runner's result, whether it was stopped, its counts, and what a worker's watch over
/// its owner found.
type Drove = (Result<runner::Ran, Error>, bool, Stats, Found);

/// Runs the runner with its company: the signal watcher, the heartbeat, a worker's watch over
/// its owner, the owner's tending of its gone workers, and the reporter of its events; then
/// stops them all.
async fn drive(
    d: Driven<'_>,
    spec: RunSpec,
    signals: &mut Option<Signals>,
    (tend, wind_down): (Option<runner::Refill>, watch::Sender<bool>),
    watch: &Watch,
) -> Drove {
    let Driven {
        writer,
        project,
        owner,
        stopped_before,
        total,
        labels,
        quiet,
        verbose,
    } = d;
    let lease_timeout = project.lease_timeout;
    let (stop_tx, _) = watch::channel(if stopped_before {
        Stop::Graceful
    } else {
        Stop::Run
    });
    let (events_tx, mut events_rx) = mpsc::unbounded_channel::<Event>();
    let (done, watching) = oneshot::channel();
    let watcher = tokio::spawn(watch_signals(
        signals.take(),
        stop_tx.clone(),
        Some(events_tx.clone()),
        watching,
    ));
    let heartbeat = tokio::spawn(keep_alive(
        writer.clone(),
        owner,
        lease_timeout,
        stop_tx.clone(),
        events_tx.clone(),
        watch.heartbeat_error.clone(),
        (watch.ended.clone(), watch.lingering.clone()),
        watch.gone.clone(),
    ));
    let watching = owner.worker.is_some().then(|| {
        super::succession::Watching::start(project, writer, owner, events_tx.clone(), wind_down)
    });
    // The owner recovers gone workers as their leases expire, not only once its own queue
    // ran dry: their runs in flight would hold places of max_active_runs meanwhile.
    let tending = tend.map(|refill| {
        tokio::spawn(async move {
            let every = (lease_timeout / 2).max(HEARTBEAT);
            loop {
                tokio::time::sleep(every).await;
                let r = refill.clone();
                let _ = tokio::task::spawn_blocking(move || r(false)).await;
            }
        })
    });
    let written = watch.written.clone();
    let reporter = tokio::spawn(async move {
        let mut reporter = Reporter::stderr(total, labels, quiet, verbose);
        let mut stats = Stats::new(total);
        while let Some(event) = events_rx.recv().await {
            stats.record(&event);
            reporter.handle(&event, &stats);
        }
        reporter.finish();
        if let Ok(mut w) = written.lock() {
            w.clone_from(reporter.written());
        }
        stats
    });
    let result = runner::run(spec, writer.clone(), events_tx, stop_tx.clone()).await;
    // A takeover under way is finished before the worker ends.
    let found = match watching {
        Some(w) => w.end().await,
        None => Found::Nothing,
    };
    let _ = done.send(());
    heartbeat.abort();
    if let Some(t) = tending {
        t.abort();
    }
    *signals = watcher.await.ok().flatten();
    let _ = heartbeat.await;
    let stats = reporter.await.unwrap_or_default();
    let stopped = *stop_tx.borrow() != Stop::Run;
    (result, stopped, stats, found)
}

/// Why the run stopped when its heartbeat could not be written: a heartbeat that could not be
/// written is why whatever else failed did. One that failed while this process was being
/// taken over (frozen past its lease, then thawed behind a lock or a connection made again)
/// is not: once the manifest answers, being taken over is what happened, and the end says so.
fn heartbeat_failure(
    g: &Global,
    writer: &Writer,
    owner: Owner,
    heartbeat_error: &Mutex<Option<Error>>,
) -> Option<Error> {
    if heartbeat_error.lock().is_ok_and(|h| h.is_some()) {
        let asked = writer.call_blocking(move |c| c.heartbeat(owner, crate::clock::now_ms()));
        if let Err(manifest::Error::Fenced { .. }) = asked
            && let Ok(mut h) = heartbeat_error.lock()
        {
            h.take();
        }
    }
    let e = heartbeat_error.lock().ok().and_then(|mut h| h.take())?;
    if owner.worker.is_none() {
        super::warn(
            g,
            &format!(
                "backfill {id} stays resumable: `backfill resume {id}` takes it up again once the manifest answers",
                id = owner.backfill_id
            ),
        );
    }
    Some(e)
}

/// The owner's end of a run: how the backfill ended, judged on its own runs in the manifest
/// (`halted`, the environment's `fault`, whether it was `stopped`), recorded, and said in the
/// summary.
fn finish_owner(
    g: &Global,
    writer: &Writer,
    owner: Owner,
    watch: &Watch,
    (halted, fault, stopped): (bool, Option<crate::environment::Fault>, bool),
    after: After,
) -> Result<End, Error> {
    let backfill_id = owner.backfill_id;
    // The outcome holds counts and the failed intervals only, so memory does not grow with
    // the number of intervals.
    let mut outcome = writer.call_blocking(move |c| {
        c.outcome(backfill_id)?.ok_or_else(|| {
            manifest::Error::Invalid(format!("backfill {backfill_id} vanished from the manifest"))
        })
    })?;
    let counts = &outcome.backfill.intervals;
    let judged =
        super::outcome::Outcome::judge(fault.is_some(), halted, stopped, counts, after.staging);
    let (state, mut code) = (judged.state(), judged.exit_code());
    let not_ready = outcome
        .skipped
        .get(crate::plan::SkipReason::NotReady.as_str())
        .copied()
        .unwrap_or(0);
    if after.ready.require && not_ready > 0 && code == crate::exit::OK {
        code = crate::exit::NOT_READY;
    }
    let created = after.created;
    let recorded =
        writer.call_blocking(move |c| c.finish_backfill(owner, state, Ended::since(created)));
    let (state, code, taken_over) = match recorded {
        Ok(()) => (state, code, false),
        // Taken over: the process that took it over recorded it; this one was interrupted.
        Err(manifest::Error::Fenced { .. }) => {
            let taken = super::outcome::Outcome::Interrupted;
            (taken.state(), taken.exit_code(), true)
        }
        Err(e) => return Err(e.into()),
    };
    outcome.backfill.state = state;
    // Its surroundings gone, what it recorded says little (its manifest may be lost with its
    // file): the error says what happened and what it came to, instead of a summary.
    if let Some(e) = gone_error(
        writer,
        &watch.gone,
        backfill_id,
        Some(&outcome.backfill.intervals),
    ) {
        return Err(e);
    }
    // The end of each failed interval's log, for the summary (the first ones only: a run with
    // thousands of failures says how many and names them, it does not print every log).
    for f in outcome.failed.iter_mut().take(SUMMARY_LOG_TAILS) {
        if let Some(log) = &f.log {
            let tail = crate::task::command::log_tail(std::path::Path::new(log), 10);
            f.log_tail = Some(tail).filter(|t| !t.is_empty());
        }
    }
    let rerun = report::rerun_command(
        &outcome,
        &after.labels,
        &report::Rerun {
            conf: &after.conf,
            allow_drift: after.allow_drift,
            tasks: after.only_tasks.as_deref(),
        },
    )
    .filter(|_| after.reruns);
    let mut summary = report::summary(&outcome, code, after.began.elapsed(), rerun);
    summary.taken_over = taken_over;
    summary.stopped_by = fault.as_ref().filter(|_| !taken_over);
    let json = serde_json::to_string(&summary)
        .map_err(|e| Error::Internal(format!("cannot write the summary: {e}")))?;
    let mut out = Sink::new(
        std::io::stdout().lock(),
        std::io::stderr(),
        g.json,
        Fit::stderr(g.verbose),
    );
    let written = watch.written.lock().map(|w| w.clone()).unwrap_or_default();
    match report::summary::write(&mut out, &summary, &after.labels, g.quiet, &written) {
        Ok(()) | Err(Error::ClosedPipe) => {}
        Err(e) => return Err(e),
    }
    Ok(End {
        code,
        state,
        summary: json,
        not_ready,
    })
}

/// A worker that took the backfill over (see [`super::succession`]) goes on as its owner once
/// its runs in flight ended: it says what recovering the old owner warned of, releases what
/// other dead backfills hold of the DAG's intervals, leases the backfill's unfinished intervals
/// and runs them, as `resume` would. Stopped meanwhile (a signal, `backfill cancel`), it runs
/// nothing and records the backfill as interrupted.
#[expect(
    clippy::too_many_arguments,
    reason = "the owner's run takes what the worker's had: the same session, one step on"
)]
fn go_on_as_owner(
    g: &Global,
    project: &Project,
    rest: Execution,
    successor: super::succession::Successor,
    stopped: bool,
    writer: &Writer,
    runtime: &tokio::runtime::Runtime,
    signals: &mut Option<Signals>,
) -> Result<End, Error> {
    let owner = successor.owner;
    let (id, worker) = (owner.backfill_id, rest.owner.worker.unwrap_or_default());
    let dag_id = rest.dag.id.clone();
    let ctx = crate::manifest::leases::LeaseCtx::new(project.lease_timeout, &crate::process::LOCAL);
    let beat = successor.beat;
    let prepared = (|| {
        for w in successor.recovered? {
            super::warn(g, w.as_str());
        }
        if stopped {
            return Ok((Vec::new(), None));
        }
        let dags = crate::recovery::Dags::of(project);
        let stale =
            crate::recovery::release_stale(writer, &dags, &dag_id, &ctx.refreshed(), Some(id))?;
        for w in &stale.warnings {
            super::warn(g, w);
        }
        let (dag_id, c) = (dag_id.clone(), ctx.refreshed());
        Ok::<_, Error>(writer.call_blocking(move |conn| {
            // At most the backfill's max_active_runs, as any owner: a worker may have asked
            // for more, which the manifest capped.
            let max = conn.backfill(id)?.map(|b| b.max_active_runs);
            Ok((
                crate::recovery::lease_remaining(conn, owner, &dag_id, &c)?,
                max,
            ))
        })?)
    })();
    // The owner's own heartbeat starts with its run.
    drop(beat);
    let (intervals, max) = match prepared {
        Ok(prepared) => prepared,
        // Taken over in turn (this process froze past its lease meanwhile, say).
        Err(Error::Manifest(manifest::Error::Fenced { .. })) => {
            crate::report::out::say(&format!(
                "backfill {id} was taken over by another process while worker {worker} made ready to run it as its owner; `{}` tells what it did",
                crate::report::out::hint(&format!("show {id}"))
            ));
            let (code, state) = (exit::INTERRUPTED, crate::state::BackfillState::Cancelled);
            return Ok(End {
                code,
                state,
                not_ready: 0,
                summary: serde_json::json!({
                    "backfill_id": id,
                    "dag_id": dag_id,
                    "state": state.as_str(),
                    "exit_code": code,
                    "taken_over": true,
                })
                .to_string(),
            });
        }
        Err(e) => return Err(e),
    };
    if !g.quiet && !g.json {
        crate::report::out::say(&format!(
            "worker {worker} goes on with backfill {id} of {dag_id} as its owner: {} left to run",
            crate::report::out::plural(intervals.len() as i64, "interval", "intervals")
        ));
    }
    let e = Execution {
        owner,
        max_active_runs: max.map_or(rest.max_active_runs, |m| m.min(rest.max_active_runs)),
        intervals,
        ..rest
    };
    let mut as_owner = true;
    run(
        g,
        project,
        e,
        writer,
        (runtime, signals),
        (stopped, &mut as_owner),
    )
}

/// SIGINT, SIGTERM and SIGHUP (the terminal closed), listened to from a backfill's start to the
/// end of its hooks, so that none is lost between the two.
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    /// `None` when they cannot be listened to. Must be called inside the async runtime.
    fn listen() -> Option<Self> {
        Some(Self {
            int: signal(SignalKind::interrupt()).ok()?,
            term: signal(SignalKind::terminate()).ok()?,
            hup: signal(SignalKind::hangup()).ok()?,
        })
    }

    /// Waits for the next one and says what it was. Cancel-safe: a signal that arrives while
    /// nobody waits is kept for the next call.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "interrupted (SIGINT)",
            _ = self.term.recv() => "terminated (SIGTERM)",
            _ = self.hup.recv() => "hung up (SIGHUP)",
        }
    }
}

/// First signal: stop gracefully. A second one: kill now. Until `done`, then gives the signals
/// back (one that arrives meanwhile stays pending for whoever listens next).
async fn watch_signals(
    signals: Option<Signals>,
    stop: watch::Sender<Stop>,
    events: Option<mpsc::UnboundedSender<Event>>,
    mut done: oneshot::Receiver<()>,
) -> Option<Signals> {
    let Some(mut signals) = signals else {
        let _ = done.await;
        return None;
    };
    loop {
        let name = tokio::select! {
            biased;
            _ = &mut done => return Some(signals),
            name = signals.next() => name,
        };
        let hard = *stop.borrow() != Stop::Run;
        let _ = stop.send(if hard { Stop::Kill } else { Stop::Graceful });
        if let Some(events) = &events {
            let _ = events.send(Event::Stopping {
                hard,
                why: name.to_string(),
            });
        }
    }
}

/// What `call` answers within `bound` of this process's own running time: a bound whose timer
/// fired a whole heartbeat late ran out while this process was frozen (the manifest may have
/// answered the moment it was thawed), so the call gets the bound again, once.
async fn answered_within(
    call: impl std::future::Future<Output = manifest::Result<Heartbeat>>,
    bound: Duration,
) -> manifest::Result<Heartbeat> {
    let mut call = std::pin::pin!(call);
    let mut deadline = Instant::now() + bound;
    let mut again = true;
    loop {
        match tokio::time::timeout_at(deadline.into(), &mut call).await {
            Ok(beat) => return beat,
            Err(_) if again && deadline.elapsed() > HEARTBEAT => {
                again = false;
                deadline = Instant::now() + bound;
            }
            Err(_) => {
                return Err(manifest::Error::Invalid(format!(
                    "the manifest did not answer within {} (half the lease timeout)",
                    humantime::format_duration(bound)
                )));
            }
        }
    }
}

/// What of this backfill's surroundings is gone: the project folder (removed, moved or
/// replaced), or the manifest's file (removed or replaced), each said once.
fn vanished(writer: &Writer) -> Option<String> {
    use crate::process::folders;
    match (folders::project_gone(), writer.removed()) {
        (None, None) => None,
        (Some(project), None) => Some(project),
        (None, Some(manifest)) => Some(manifest),
        (Some(project), Some(_))
            if folders::project_root().is_some_and(|root| writer.path().starts_with(root)) =>
        {
            Some(format!(
                "{project}, and its manifest {} with it: what the manifest recorded is lost with the file",
                writer.path().display()
            ))
        }
        (Some(project), Some(manifest)) => Some(format!("{project}; {manifest}")),
    }
}

/// The error a backfill ends with when its project folder or its manifest's file went while it
/// ran (`seen` by its heartbeat, or now), with what its intervals came to: exit 1. `None` when
/// nothing went.
fn gone_error(
    writer: &Writer,
    seen: &Mutex<Option<String>>,
    id: i64,
    counts: Option<&crate::manifest::queries::Counts>,
) -> Option<Error> {
    let why = seen
        .lock()
        .ok()
        .and_then(|g| g.clone())
        .or_else(|| vanished(writer))?;
    let came_to = counts.map_or(String::new(), |c| {
        format!(
            " ({} of {} succeeded, {} failed, {} stopped, {} not started)",
            c.succeeded,
            c.planned,
            c.failed + c.rejected,
            c.cancelled + c.running,
            c.pending
        )
    });
    let then = if writer.removed().is_some() {
        "restore the manifest from a backup to keep its history".to_string()
    } else {
        format!("`backfill resume {id}` goes on with it once the project is back")
    };
    Some(Error::Gone(format!(
        "{why}. Backfill {id} stopped starting intervals{came_to}; {then}"
    )))
}

/// Writes the heartbeat, reacts to `backfill cancel` from another process and to being taken
/// over, and stops the backfill when the heartbeat cannot be written for half the lease
/// timeout, or when its project folder or its manifest's file is gone.
#[expect(
    clippy::too_many_arguments,
    reason = "what the heartbeat watches and where it says what it saw, each its own"
)]
async fn keep_alive(
    writer: Writer,
    owner: Owner,
    lease_timeout: Duration,
    stop: watch::Sender<Stop>,
    events: mpsc::UnboundedSender<Event>,
    failure: Arc<Mutex<Option<Error>>>,
    (ended, lingering): (
        Arc<std::sync::atomic::AtomicBool>,
        Arc<std::sync::atomic::AtomicBool>,
    ),
    gone: Arc<Mutex<Option<String>>>,
) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_ok = Instant::now();
    loop {
        let due = tick.tick().await.into_std();
        // The project folder or the manifest's file removed: no interval is started any more
        // (their logs and records would go nowhere), and the end says why.
        if let Some(why) = vanished(&writer) {
            let first = gone.lock().is_ok_and(|mut g| {
                let first = g.is_none();
                g.get_or_insert(why.clone());
                first
            });
            if first && *stop.borrow() == Stop::Run {
                let _ = stop.send(Stop::Graceful);
                let _ = events.send(Event::Stopping { hard: false, why });
            }
        }
        // A tick a whole heartbeat late: this process did not run (frozen, then thawed), which
        // says nothing of the manifest; it gets half a lease from now, as a new owner would.
        if due.elapsed() > HEARTBEAT {
            last_ok = Instant::now();
        }
        // A heartbeat that has not answered within half the lease timeout (the manifest's
        // server unreachable, its connection being made again) counts as failed: the tries stop
        // before another host may take their intervals over. Each call gets that long: an owner
        // thawed after a freeze hears first whether it was taken over.
        let call = writer.call(move |c| c.heartbeat(owner, crate::clock::now_ms()));
        let beat = answered_within(call, lease_timeout / 2).await;
        let why = match beat {
            Ok(Heartbeat::Carry) => {
                last_ok = Instant::now();
                continue;
            }
            Ok(Heartbeat::CancelRequested) => "cancelled by `backfill cancel`".to_string(),
            Ok(Heartbeat::Ended) => {
                ended.store(true, std::sync::atomic::Ordering::Relaxed);
                // A worker that waits for the backfill's end has nothing to stop: it ends at
                // its next look (see `worker::linger`), without a word.
                if lingering.load(std::sync::atomic::Ordering::Relaxed) {
                    continue;
                }
                format!(
                    "backfill {} is no longer running: this worker stops",
                    owner.backfill_id
                )
            }
            Err(manifest::Error::Fenced { .. }) => {
                tracing::warn!(
                    backfill = owner.backfill_id,
                    epoch = owner.epoch,
                    "fenced by a newer owner"
                );
                runner::fenced_why(owner)
            }
            Err(e) if last_ok.elapsed() >= lease_timeout / 2 => {
                tracing::error!(backfill = owner.backfill_id, error = %e, "the heartbeat cannot be written");
                let why = format!("cannot write the heartbeat: {e}");
                if let Ok(mut slot) = failure.lock() {
                    slot.get_or_insert(Error::Manifest(e));
                }
                why
            }
            Err(_) => continue,
        };
        if *stop.borrow() == Stop::Run {
            let _ = stop.send(Stop::Graceful);
            let _ = events.send(Event::Stopping { hard: false, why });
        }
    }
}

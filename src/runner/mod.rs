//! The runner: runs the planned intervals of one backfill with at most `max_active_runs` in
//! flight, the tasks of an interval in `depends_on` order, retries with exponential backoff,
//! per-task timeouts, and a stop signal (graceful or hard).
//!
//! It talks to the manifest only through the writer and to the outside world only through
//! [`Event`]s; it never prints. Signals and the cancel flag are watched by the caller, which
//! turns them into [`Stop`] levels. The runner stops by itself, the same way, when it learns
//! that another process took the backfill over (fenced) or when a manifest write fails: then it
//! waits for every running try to stop before it returns, so nothing is left running.
//!
//! It stops the same way on an environment fault (see [`crate::environment`]): a try that
//! meets a full disk, no descriptors or memory, a folder it may not write or a warehouse out of
//! reach ends interrupted (`cancelled`, its error `interrupted: CAUSE`), not failed; no interval
//! starts after it, the running ones are interrupted, and the fault is returned in [`Ran`] for
//! the session to say, so that `resume` runs them all once the cause is gone.

mod atomic;
mod batch;
pub(crate) mod events;
mod interval;
mod outcome;
mod promote;
mod ready;
mod record;
mod rollback;
mod sql_try;
mod step;
mod tries;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

pub(crate) use crate::process::Stop;
pub(crate) use events::{Event, Stats};
pub(crate) use sql_try::{Step, blocking_step};

use crate::environment::Fault;
use crate::exit::Error;
use crate::interval::DataInterval;
use crate::manifest::{Owner, writer::Writer};
use crate::plan::{RunState, SkipReason};
use crate::project::Dag;
use crate::warehouse::Repr;

/// What the runner does with each interval's tasks.
#[derive(Debug, Clone, Default)]
pub(crate) enum Mode {
    /// Compute, audit and publish.
    #[default]
    Run,
    /// Compute and audit; keep what passed the gate, unpublished, for `promote`.
    Stage,
    /// Publish the staged outputs of another backfill, by interval start and task.
    Promote(HashMap<(i64, String), StagedTry>),
    /// Publish them all in one warehouse transaction, or none (`promote --atomic`).
    PromoteAtomic(HashMap<(i64, String), StagedTry>),
    /// Put back the partitions that the current publishes replaced: every SQL task, or the
    /// named ones.
    Rollback(Option<Vec<String>>),
}

/// A staged output, to promote.
#[derive(Debug, Clone)]
pub(crate) struct StagedTry {
    pub try_id: i64,
    /// Its run and try number: a command task's `publish` is rendered as for the staged try.
    pub run_id: i64,
    pub try_number: u32,
    /// Its recorded measures: rows, fingerprint, source rows and fingerprint.
    pub record: crate::manifest::TryRecord,
    /// The audit file (SQL) or result file (command) that holds it.
    pub path: String,
}

/// Everything the runner needs for one backfill.
pub(crate) struct RunSpec {
    pub owner: Owner,
    pub dag: Arc<Dag>,
    pub conf: serde_json::Value,
    pub project_root: PathBuf,
    pub logs_dir: PathBuf,
    /// The manifest: SQL tries keep their audit files next to it and ask it before publishing.
    pub manifest_path: PathBuf,
    pub host: String,
    pub max_active_runs: usize,
    /// Intervals to run, in plan order (moved into the runner's queue).
    pub intervals: Vec<DataInterval>,
    /// `--allow-drift`: the gate skips its drift check.
    pub allow_drift: bool,
    /// The partition column's representation of each SQL task, as decided before the start
    /// (`None`: decided by the first output).
    pub reprs: HashMap<String, Option<Repr>>,
    pub mode: Mode,
    /// `--max-failures`: stop dispatching after this many failed or rejected intervals.
    pub max_failures: Option<u32>,
    /// `[pools]` sizes and rates, and the lease timeout that judges whether a slot's owner is
    /// gone.
    pub pools: std::collections::BTreeMap<String, u32>,
    pub pool_rates: std::collections::BTreeMap<String, crate::project::Rate>,
    pub lease_timeout: std::time::Duration,
    /// The DAGs whose output an interval reads, for a cascade's downstream backfill (empty
    /// otherwise): an interval starts only if, in the commit that starts its run, no other
    /// backfill runs an upstream interval it overlaps and none's latest run failed; else it is
    /// skipped as `upstream not successful`.
    pub upstream: Vec<Dag>,
    /// Asked, once this process's queue ran dry and its intervals ended, what is left to do:
    /// for the owner of a backfill that other processes may have joined (`backfill join`), the
    /// intervals of gone workers and the wait for live ones; for a worker, the wait while the
    /// backfill runs, so that it is there to take the backfill over should its owner die.
    pub refill: Option<Refill>,
    /// `--wait-ready`: how long an interval may wait for its sources, for every task's
    /// `[tasks.ready]` (`None`: each task's own `wait`).
    pub wait_ready: Option<std::time::Duration>,
    /// For a worker: once `true`, no run starts any more (its interval stays planned) and the
    /// runner returns when the runs in flight have ended. Its process took the backfill over
    /// (it goes on as the owner), or found the owner gone and cannot take its place.
    pub wind_down: Option<watch::Receiver<bool>>,
}

/// What an owner whose queue ran dry does next (see [`RunSpec::refill`]).
pub(crate) enum Left {
    /// Run these intervals (a gone worker's, leased again).
    Run(Vec<DataInterval>),
    /// Wait, and ask again: for an owner, workers still run intervals of the backfill; for a
    /// worker, the backfill still runs.
    Wait,
    /// Nothing is left.
    Done,
}

/// Asks the manifest what is left (blocking: run off the async workers); with `false`, only
/// whether to wait (nothing more is to run: the backfill reached its `--max-failures`).
pub(crate) type Refill = Arc<dyn Fn(bool) -> Result<Left, Error> + Send + Sync>;

/// Shared by the interval tasks of one backfill.
struct Shared {
    spec: RunSpec,
    writer: Writer,
    events: mpsc::UnboundedSender<Event>,
    conf_text: String,
    stop: watch::Sender<Stop>,
    reprs: Mutex<HashMap<String, Option<Repr>>>,
    /// Told by an interval (its start) that frees its slot before its task ends.
    freed: mpsc::UnboundedSender<i64>,
    /// An interval that succeeded frees its slot as soon as its last publish committed, so the
    /// next one starts while its end is being recorded (the writer keeps the two in order).
    /// Not with `depends_on_past`, whose next interval needs this one's recorded outcome.
    free_early: bool,
    /// The manifest refused to start a run: the backfill reached its `--max-failures`, counted
    /// across its processes.
    halted: std::sync::atomic::AtomicBool,
    /// Intervals of this process that failed or were rejected: a batch stops taking its next
    /// interval once they reach `--max-failures`.
    failed: std::sync::atomic::AtomicU32,
    /// The PostgreSQL warehouses in the manifest's own database (see
    /// [`sql_try::one_database`]).
    one_database: std::collections::HashSet<String>,
    /// Run ids reserved for starts that spawn their first try's process first (see
    /// [`tries`] (`early_start`)); `None` once the manifest said it reserves none (SQLite).
    run_ids: tokio::sync::Mutex<Option<VecDeque<i64>>>,
    /// Batches of this process formed (holding their intervals) whose first run has not
    /// started yet: while one waits for a place of `max_active_runs`, no other is formed, so
    /// that this process holds no intervals it has no room to run (the backfill's other
    /// processes, `backfill join`, may run them).
    unstarted_batches: std::sync::atomic::AtomicUsize,
    /// Told when a batch's first run started, or it ended without one.
    batch_began: tokio::sync::Notify,
    /// The first environment fault met: it stopped the backfill (see [`Shared::stop_for`]).
    fault: Mutex<Option<Fault>>,
    /// When this process recorded the starts of its runs and tries, to record their ends.
    marks: record::Marks,
}

impl Shared {
    /// Whether no run may start any more in this process (see [`RunSpec::wind_down`]).
    fn winding_down(&self) -> bool {
        self.spec.wind_down.as_ref().is_some_and(|w| *w.borrow())
    }

    /// Notes that a run of `batch` started, or that it ended: the first time, it no longer
    /// counts as unstarted (see [`Shared::unstarted_batches`]).
    fn batch_began(&self, batch: &batch::Batch) {
        if batch.begin() {
            self.unstarted_batches
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            self.batch_began.notify_one();
        }
    }
}

/// An interval's place among the `max_active_runs`, which it may give back before its task
/// ends (see [`Shared::free_early`]); otherwise the dispatcher takes it back when the task's
/// outcome is in (a failure must be counted for `--max-failures` before the next interval
/// starts).
struct Slot {
    freed: Option<mpsc::UnboundedSender<i64>>,
    start: i64,
}

impl Slot {
    fn free(&mut self) {
        if let Some(tx) = self.freed.take() {
            let _ = tx.send(self.start);
        }
    }
}

/// How many run ids are reserved at once (see [`Shared::reserved_run_id`]): one round trip per
/// this many starts.
const RESERVED_RUN_IDS: u32 = 32;

impl Shared {
    /// A run id reserved for a start that needs it first (see [`tries`]), reserving more when
    /// none is left; `None` on a manifest that reserves none (SQLite).
    async fn reserved_run_id(&self) -> Result<Option<i64>, Error> {
        // Held across the reservation: the starts that find none left wait for its one round
        // trip instead of each reserving more.
        let mut ids = self.run_ids.lock().await;
        let Some(queue) = ids.as_mut() else {
            return Ok(None);
        };
        if queue.is_empty() {
            let reserved = self
                .writer
                .call(|c| c.reserve_run_ids(RESERVED_RUN_IDS))
                .await?;
            queue.extend(reserved);
        }
        let id = queue.pop_front();
        if id.is_none() {
            *ids = None;
        }
        Ok(id)
    }

    /// Drops the reserved run ids: one was stale, and the others are no younger.
    async fn forget_reserved_run_ids(&self) {
        if let Some(ids) = self.run_ids.lock().await.as_mut() {
            ids.clear();
        }
    }

    /// Whether a publish of `sql` records itself in the manifest, in its own transaction.
    fn in_manifest(&self, sql: &crate::project::SqlTask) -> bool {
        self.one_database.contains(&sql.warehouse.name)
    }

    /// The manifest's record of a publish of `task` (see [`Shared::in_manifest`]).
    fn record_in_manifest(
        &self,
        task: &crate::project::Task,
        record: &crate::manifest::TryRecord,
    ) -> crate::warehouse::backend::InManifest {
        crate::warehouse::backend::InManifest {
            statement: crate::manifest::publishes::IN_PUBLISH,
            refused: crate::manifest::publishes::PUBLISH_REFUSED,
            fingerprint: record.fingerprint.clone(),
            source_rows: record.source_rows,
            previous_rows: record.previous_rows,
            verdict: record.verdict.map(|v| v.as_str().to_string()),
            reasons: record.reasons.clone(),
            source_fingerprint: record.source_fingerprint.clone(),
            dag_id: self.spec.dag.id.clone(),
            task_id: task.id.clone(),
            promoted_from: record.promoted_from,
            merged: [
                record.rows_inserted,
                record.rows_updated,
                record.rows_deleted,
                record.rows_unchanged,
            ],
        }
    }

    /// Stops the backfill because its environment failed (see [`crate::environment`]): as a
    /// signal would, keeping the first fault for the outcome.
    fn stop_for(&self, fault: &Fault) {
        if let Ok(mut first) = self.fault.lock()
            && first.is_none()
        {
            *first = Some(fault.clone());
        }
        tracing::error!(backfill = self.spec.owner.backfill_id, %fault, "stopping: the environment failed");
        self.stop_because(fault.cause.clone());
    }

    /// The environment fault that stopped the backfill, if one did.
    fn fault(&self) -> Option<Fault> {
        self.fault.lock().ok().and_then(|f| f.clone())
    }

    /// Stops the backfill for `fault` and ends a try as interrupted by it: `cancelled`, its
    /// error `interrupted: CAUSE` (`resume` runs it again).
    fn interrupted(&self, fault: &Fault) -> outcome::Outcome {
        self.stop_for(fault);
        outcome::cancelled(&interrupted_by(fault))
    }

    /// How a try that met `fault` ends: failed with `error`, to be retried, when the fault may
    /// pass by itself and `may_retry`; else interrupted (see [`Shared::interrupted`]).
    fn met(&self, fault: &Fault, may_retry: bool, error: String) -> outcome::Outcome {
        if fault.transient && may_retry {
            return outcome::failed(error, None);
        }
        self.interrupted(fault)
    }

    /// Stops the backfill from inside (fenced, or a manifest write failed), as a signal would.
    fn stop_because(&self, why: String) {
        if *self.stop.borrow() == Stop::Run {
            let _ = self.stop.send(Stop::Graceful);
            let _ = self.events.send(Event::Stopping { hard: false, why });
        }
    }
}

/// What a try interrupted by `fault` records as its error.
fn interrupted_by(fault: &Fault) -> String {
    format!("interrupted: {}", fault.cause)
}

/// How a run of the backfill's intervals ended, without an error.
#[derive(Debug, Default)]
pub(crate) struct Ran {
    /// `--max-failures` was reached.
    pub halted: bool,
    /// An environment fault stopped it.
    pub fault: Option<Fault>,
}

/// Runs the backfill until every interval finished, a stop was requested, `--max-failures`
/// was reached, or an environment fault stopped it (see [`Ran`]). On an error, stops the
/// running tries as for Ctrl-C, waits for them, and returns the first error.
pub(crate) async fn run(
    mut spec: RunSpec,
    writer: Writer,
    events: mpsc::UnboundedSender<Event>,
    stop_tx: watch::Sender<Stop>,
) -> Result<Ran, Error> {
    let stop = stop_tx.subscribe();
    // Promotes and rollbacks put back what was computed already: no interval waits for another.
    let depends_on_past = spec.dag.depends_on_past && matches!(spec.mode, Mode::Run | Mode::Stage);
    let no_logs = log_folders(&spec)?;
    let queue: VecDeque<DataInterval> = std::mem::take(&mut spec.intervals).into();
    let reprs = Mutex::new(spec.reprs.clone());
    let (freed, freed_rx) = mpsc::unbounded_channel();
    let (one_database, said) = sql_try::one_database(&spec).await;
    for warning in said {
        let _ = events.send(Event::Warning { warning });
    }
    let shared = Arc::new(Shared {
        conf_text: spec.conf.to_string(),
        spec,
        writer,
        events,
        stop: stop_tx,
        reprs,
        freed,
        free_early: !depends_on_past,
        halted: std::sync::atomic::AtomicBool::new(false),
        failed: std::sync::atomic::AtomicU32::new(0),
        one_database,
        run_ids: tokio::sync::Mutex::new(Some(VecDeque::new())),
        unstarted_batches: std::sync::atomic::AtomicUsize::new(0),
        batch_began: tokio::sync::Notify::new(),
        fault: Mutex::new(None),
        marks: record::Marks::default(),
    });
    if let Some(fault) = &no_logs {
        shared.stop_for(fault);
    }
    if matches!(shared.spec.mode, Mode::PromoteAtomic(_)) {
        // One group, claimed, judged and published together by this process.
        let intervals: Vec<DataInterval> = queue.into_iter().collect();
        if no_logs.is_none()
            && let Err(e) = atomic::run(&shared, intervals, &stop).await
        {
            // Fenced, or a fault of the environment: the backfill stops as any would.
            let mut first_error = None;
            fail(&shared, &mut first_error, e);
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        return Ok(Ran {
            halted: false,
            fault: shared.fault(),
        });
    }
    let mut d = Dispatch::new(shared, queue, stop, freed_rx, depends_on_past).await?;
    loop {
        d.note_freed();
        d.start_more().await;
        if d.running.is_empty() && d.readying.is_empty() {
            if d.refill().await {
                continue;
            }
            break;
        }
        d.wait().await;
    }
    match d.first_error {
        Some(e) => Err(e),
        None => Ok(Ran {
            halted: d.halted,
            fault: d.shared.fault(),
        }),
    }
}

/// Makes each task's folder for logs and result files, once: tries only add files to it. One
/// that cannot be made for want of space or permission stops the backfill before it starts
/// (the fault); any other failure is an error.
fn log_folders(spec: &RunSpec) -> Result<Option<Fault>, Error> {
    let mut no_logs = None;
    for task in &spec.dag.tasks {
        let dir = spec.logs_dir.join(&spec.dag.id).join(&task.id);
        if let Err(e) = crate::process::private_dir(&dir) {
            let what = format!("the log folder {}", dir.display());
            match Fault::of_io(&e, &what, &dir) {
                Some(fault) => {
                    no_logs.get_or_insert(fault);
                }
                None => return Err(Error::io(format!("cannot create {what}"), e)),
            }
        }
    }
    Ok(no_logs)
}

/// The dispatcher of a run: the intervals left, the ones that hold a slot, and how the run
/// stands (failures, halted, its first error).
struct Dispatch {
    shared: Arc<Shared>,
    queue: VecDeque<DataInterval>,
    stop: watch::Receiver<Stop>,
    stop_rx: watch::Receiver<Stop>,
    wind_down: Option<watch::Receiver<bool>>,
    freed_rx: mpsc::UnboundedReceiver<i64>,
    depends_on_past: bool,
    /// How many intervals run at once.
    max: usize,
    batch_size: usize,
    /// For depends_on_past: whether the interval ending at this instant succeeded here.
    succeeded_by_end: HashMap<i64, bool>,
    /// Each spawned task runs an interval, or a batch of them one after the other; it holds
    /// one slot, named by its first interval's start.
    running: JoinSet<Result<Ended, Error>>,
    /// The intervals (by start) that hold a slot: spawned, and neither freed nor joined.
    holding: std::collections::HashSet<i64>,
    /// Whether intervals wait for their sources before they start (`[tasks.ready]`).
    asks_ready: bool,
    /// Intervals waiting for their sources (see [`ready`]), each with its place in the queue;
    /// they hold no slot.
    readying: JoinSet<Result<(usize, DataInterval, ready::Waited), Error>>,
    /// Intervals whose sources are ready, by their place in the queue, with when they were
    /// found ready: they start before the queue's next, in the queue's order (see
    /// [`ORDER_GRACE`]).
    ready: std::collections::BTreeMap<usize, (DataInterval, tokio::time::Instant)>,
    /// When the first ready interval may start even though an interval before it has not
    /// answered yet (see [`ORDER_GRACE`]).
    order_wait: Option<tokio::time::Instant>,
    /// The place in the queue of the next interval that waits for its sources.
    asked: usize,
    /// Bounds how many readiness checks run at once.
    asking: Arc<tokio::sync::Semaphore>,
    /// The places of the intervals whose first readiness answer is not in yet: one found ready
    /// starts only once those before it answered (see [`ready::FirstAnswer`]).
    unanswered: std::collections::BTreeSet<usize>,
    answered: (mpsc::UnboundedSender<usize>, mpsc::UnboundedReceiver<usize>),
    first_error: Option<Error>,
    failures: u32,
    halted: bool,
}

impl Dispatch {
    async fn new(
        shared: Arc<Shared>,
        queue: VecDeque<DataInterval>,
        stop: watch::Receiver<Stop>,
        freed_rx: mpsc::UnboundedReceiver<i64>,
        depends_on_past: bool,
    ) -> Result<Self, Error> {
        let max = if depends_on_past {
            1
        } else {
            shared.spec.max_active_runs.max(1)
        };
        let succeeded_by_end = if depends_on_past {
            failed_predecessors(&shared, &queue).await?
        } else {
            HashMap::new()
        };
        let batch_size = match shared.spec.mode {
            Mode::Run | Mode::Stage if !depends_on_past => {
                shared.spec.dag.batch_size.max(1) as usize
            }
            _ => 1,
        };
        let asks_ready = matches!(shared.spec.mode, Mode::Run | Mode::Stage)
            && ready::asks(&shared.spec.dag.tasks);
        Ok(Self {
            asks_ready,
            readying: JoinSet::new(),
            ready: std::collections::BTreeMap::new(),
            order_wait: None,
            asked: 0,
            unanswered: std::collections::BTreeSet::new(),
            answered: mpsc::unbounded_channel(),
            asking: Arc::new(tokio::sync::Semaphore::new(max)),
            stop_rx: stop.clone(),
            wind_down: shared.spec.wind_down.clone(),
            shared,
            queue,
            stop,
            freed_rx,
            depends_on_past,
            max,
            batch_size,
            succeeded_by_end,
            running: JoinSet::new(),
            holding: std::collections::HashSet::new(),
            first_error: None,
            failures: 0,
            halted: false,
        })
    }

    /// Frees the slots of the intervals that said so, and halts once another process's
    /// failures (or this one's, counted in the manifest) reached `--max-failures`.
    fn note_freed(&mut self) {
        while let Ok(start) = self.freed_rx.try_recv() {
            self.holding.remove(&start);
        }
        if !self.halted
            && self
                .shared
                .halted
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            self.halted = true;
            self.readying.abort_all();
            let failed = self
                .shared
                .spec
                .max_failures
                .unwrap_or(self.failures)
                .max(self.failures);
            let _ = self.shared.events.send(Event::MaxFailures { failed });
        }
    }

    /// Starts intervals (or batches) while slots are free and the run goes on.
    async fn start_more(&mut self) {
        while self.holding.len() < self.max
            && *self.stop.borrow() == Stop::Run
            && !self.halted
            && !self.shared.winding_down()
        {
            if self.batch_size > 1
                && self
                    .shared
                    .unstarted_batches
                    .load(std::sync::atomic::Ordering::Relaxed)
                    > 0
            {
                break;
            }
            while let Ok(place) = self.answered.1.try_recv() {
                self.unanswered.remove(&place);
            }
            self.order_wait = None;
            if let Some((&place, &(_, since))) = self.ready.first_key_value() {
                let before = self.unanswered.first().is_some_and(|&b| b < place);
                if !before || since.elapsed() >= ORDER_GRACE {
                    if let Some((_, (interval, _))) = self.ready.pop_first() {
                        self.spawn_interval(interval);
                    }
                    continue;
                }
                self.order_wait = Some(since + ORDER_GRACE);
            }
            // In order, with `depends_on_past`: one interval at a time.
            if self.depends_on_past && !self.readying.is_empty() {
                break;
            }
            let Some(interval) = self.queue.pop_front() else {
                break;
            };
            if self.depends_on_past
                && self.succeeded_by_end.get(&interval.start.timestamp()) == Some(&false)
            {
                if let Err(e) =
                    skip(&self.shared, interval, SkipReason::PreviousNotSuccessful).await
                {
                    fail(&self.shared, &mut self.first_error, e);
                    break;
                }
                self.succeeded_by_end
                    .insert(interval.end.timestamp(), false);
                continue;
            }
            if self.batch_size > 1 {
                if !self.start_batch(interval).await {
                    break;
                }
                continue;
            }
            if self.asks_ready {
                // It takes its slot once its sources are ready.
                let (shared, stop) = (self.shared.clone(), self.stop.clone());
                let (asking, place) = (self.asking.clone(), self.asked);
                self.asked += 1;
                self.unanswered.insert(place);
                let first = ready::FirstAnswer::new(place, self.answered.0.clone());
                self.readying.spawn(async move {
                    let waited =
                        ready::wait_until_ready(shared, interval, stop, asking, first).await?;
                    Ok((place, interval, waited))
                });
                continue;
            }
            self.spawn_interval(interval);
        }
    }

    /// Runs one interval, which holds a slot until it frees it or ends.
    fn spawn_interval(&mut self, interval: DataInterval) {
        let key = interval.start.timestamp();
        self.holding.insert(key);
        let slot = Slot {
            freed: Some(self.shared.freed.clone()),
            start: key,
        };
        let (shared, stop) = (self.shared.clone(), self.stop.clone());
        self.running.spawn(async move {
            let ended = interval::run(shared.clone(), interval, stop, slot, None).await?;
            count_failure(&shared, ended.1);
            Ok((key, vec![ended]))
        });
    }

    /// Takes in how an interval's wait for its sources ended.
    fn readied(
        &mut self,
        joined: Result<Result<(usize, DataInterval, ready::Waited), Error>, tokio::task::JoinError>,
    ) {
        if let Ok(Ok((place, _, _))) = &joined {
            self.unanswered.remove(place);
        }
        match joined {
            Ok(Ok((place, interval, ready::Waited::Ready))) => {
                self.ready
                    .insert(place, (interval, tokio::time::Instant::now()));
            }
            Ok(Ok((_, interval, ready::Waited::NotReady))) => {
                if self.depends_on_past {
                    self.succeeded_by_end
                        .insert(interval.end.timestamp(), false);
                }
            }
            // It stays planned, for `resume` (stopped, halted at `--max-failures`, or another
            // process's now).
            Ok(Ok((_, _, ready::Waited::Stopped))) => {}
            Err(e) if e.is_cancelled() => {}
            Ok(Err(e)) => fail(&self.shared, &mut self.first_error, e),
            Err(e) => fail(
                &self.shared,
                &mut self.first_error,
                Error::Internal(format!("an interval's wait for its sources panicked: {e}")),
            ),
        }
    }

    /// Starts a batch from `interval` and the adjacent ones queued after it; `false` when the
    /// run failed meanwhile.
    async fn start_batch(&mut self, interval: DataInterval) -> bool {
        // Candidates beyond the batch's size, in case the batches of the backfill's other
        // processes hold the first: theirs are theirs to run.
        let mut intervals = vec![interval];
        while intervals.len() < self.batch_size * CANDIDATES
            && let (Some(last), Some(next)) = (intervals.last(), self.queue.front())
            && (last.end == next.start || next.end == last.start)
        {
            intervals.extend(self.queue.pop_front());
        }
        let intervals =
            match hold_batch(&self.shared, intervals, self.batch_size, &mut self.queue).await {
                Ok(held) => held,
                Err(e) => {
                    fail(&self.shared, &mut self.first_error, e);
                    return false;
                }
            };
        if let Some(first) = intervals.first() {
            self.holding.insert(first.start.timestamp());
            self.shared
                .unstarted_batches
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.running
                .spawn(run_batch(self.shared.clone(), intervals, self.stop.clone()));
        }
        true
    }

    /// With nothing running: whether there is more to do. Halted, the owner runs nothing more
    /// but still waits for its workers' runs (the outcome is judged on every interval); wound
    /// down, what is left is another process's to run.
    async fn refill(&mut self) -> bool {
        let idle = ((self.queue.is_empty() && self.ready.is_empty()) || self.halted)
            && *self.stop.borrow() == Stop::Run
            && !self.shared.winding_down();
        let Some(refill) = &self.shared.spec.refill else {
            return false;
        };
        if !idle || self.first_error.is_some() {
            return false;
        }
        let (refill, more) = (refill.clone(), !self.halted);
        let left = tokio::task::spawn_blocking(move || refill(more))
            .await
            .map_err(|e| Error::Internal(format!("reading the manifest panicked: {e}")))
            .and_then(|left| left);
        match left {
            Ok(Left::Run(more)) => {
                self.queue.extend(more);
                true
            }
            Ok(Left::Wait) => {
                tokio::select! {
                    () = tokio::time::sleep(crate::clock::HEARTBEAT) => {}
                    _ = self.stop_rx.changed() => {}
                }
                true
            }
            Ok(Left::Done) => false,
            Err(e) => {
                fail(&self.shared, &mut self.first_error, e);
                false
            }
        }
    }

    /// Waits for the next thing that may let more run: a slot joined or freed, a batch begun, a
    /// stop, or a wind-down.
    async fn wait(&mut self) {
        tokio::select! {
            Some(joined) = self.running.join_next() => self.joined(Some(joined)),
            Some(readied) = self.readying.join_next() => self.readied(readied),
            Some(place) = self.answered.1.recv() => {
                self.unanswered.remove(&place);
            }
            () = tokio::time::sleep_until(self.order_wait.unwrap_or_else(tokio::time::Instant::now)),
                if self.order_wait.is_some() => {}
            Some(start) = self.freed_rx.recv() => {
                self.holding.remove(&start);
            }
            () = self.shared.batch_began.notified() => {}
            _ = self.stop_rx.changed() => {}
            () = wound_down(&mut self.wind_down) => {}
        }
    }

    /// Counts what a joined slot ended with, halting at `--max-failures`.
    fn joined(&mut self, joined: Option<Result<Result<Ended, Error>, tokio::task::JoinError>>) {
        if let Some(Ok(Ok((key, ended)))) = &joined {
            self.holding.remove(key);
            for (_, state) in ended {
                if matches!(state, RunState::Failed | RunState::Rejected) {
                    self.failures += 1;
                }
            }
            let left =
                !self.queue.is_empty() || !self.readying.is_empty() || !self.ready.is_empty();
            if self
                .shared
                .spec
                .max_failures
                .is_some_and(|m| self.failures >= m)
                && !self.halted
                && left
            {
                self.halted = true;
                // The intervals waiting for their sources stop waiting: they stay planned.
                self.readying.abort_all();
                let _ = self.shared.events.send(Event::MaxFailures {
                    failed: self.failures,
                });
            }
        }
        match joined {
            Some(Ok(Ok((_, ended)))) if self.depends_on_past => {
                for (interval, state) in ended {
                    self.succeeded_by_end
                        .insert(interval.end.timestamp(), state == RunState::Succeeded);
                }
            }
            Some(Ok(Err(e))) => fail(&self.shared, &mut self.first_error, e),
            Some(Err(e)) => fail(
                &self.shared,
                &mut self.first_error,
                Error::Internal(format!("an interval's task panicked: {e}")),
            ),
            Some(Ok(Ok(_))) | None => {}
        }
    }
}

/// Resolves when the wind-down flag (see [`RunSpec::wind_down`]) changes; never without one.
async fn wound_down(flag: &mut Option<watch::Receiver<bool>>) {
    let changed = match flag {
        Some(f) => f.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await;
    }
}

/// What a spawned interval or batch gives back: the start that names its slot, and how each
/// interval it ran ended.
type Ended = (i64, Vec<(DataInterval, RunState)>);

/// Counts an interval that failed or was rejected (see [`Shared::failed`]).
fn count_failure(shared: &Shared, state: RunState) {
    if matches!(state, RunState::Failed | RunState::Rejected) {
        shared
            .failed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How long an interval found ready waits for the first answers of the intervals before it in
/// the queue, so that ready intervals start in the queue's order: not longer, so that a check
/// that hangs on one interval does not hold the others back.
const ORDER_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// How many batches' worth of consecutive intervals a batch is chosen from.
const CANDIDATES: usize = 4;

/// Makes a batch of up to `want` of `intervals` (consecutive, in run order) hold those that no
/// batch of another live process of the backfill holds (see
/// [`crate::manifest::leases::reserve_batch`]): those it holds, to run. Those another holds are
/// dropped from this process's queue; the others go back to its front.
async fn hold_batch(
    shared: &Shared,
    intervals: Vec<DataInterval>,
    want: usize,
    queue: &mut VecDeque<DataInterval>,
) -> Result<Vec<DataInterval>, Error> {
    let (owner, dag_id) = (shared.spec.owner, shared.spec.dag.id.clone());
    let starts: Vec<i64> = intervals.iter().map(|i| i.start.timestamp()).collect();
    let ctx =
        crate::manifest::leases::LeaseCtx::new(shared.spec.lease_timeout, &crate::process::LOCAL);
    let reserved = shared
        .writer
        .call(move |c| c.reserve_batch(c.fence(owner)?, &dag_id, &starts, want, &ctx))
        .await?;
    tracing::debug!(
        backfill = owner.backfill_id,
        held = ?reserved.held,
        others = ?reserved.others,
        left = ?reserved.left,
        "a batch holds what the batches of the backfill's other processes do not"
    );
    let (held, left): (HashSet<i64>, HashSet<i64>) = (
        reserved.held.into_iter().collect(),
        reserved.left.into_iter().collect(),
    );
    for i in intervals.iter().rev() {
        if left.contains(&i.start.timestamp()) {
            queue.push_front(*i);
        }
    }
    Ok(intervals
        .into_iter()
        .filter(|i| held.contains(&i.start.timestamp()))
        .collect())
}

/// Runs a batch's intervals one after the other (see [`batch`]), holding one slot: the first
/// that needs the batch's rows computes them with one query, each takes its share. Stops
/// taking intervals once the backfill stops or reached `--max-failures`; those left stay
/// planned.
async fn run_batch(
    shared: Arc<Shared>,
    intervals: Vec<DataInterval>,
    stop: watch::Receiver<Stop>,
) -> Result<Ended, Error> {
    let key = intervals.first().map_or(0, |i| i.start.timestamp());
    let batch = batch::Batch::new(intervals.clone());
    let mut ended = Vec::with_capacity(intervals.len());
    let result = run_batch_intervals(&shared, intervals, &stop, &batch, &mut ended).await;
    shared.batch_began(&batch);
    // What holds the batch's rows is let go of on a blocking thread: a PostgreSQL batch drops
    // its table there.
    let _ = tokio::task::spawn_blocking(move || drop(batch)).await;
    result.map(|()| (key, ended))
}

/// The intervals of [`run_batch`], one after the other.
async fn run_batch_intervals(
    shared: &Arc<Shared>,
    intervals: Vec<DataInterval>,
    stop: &watch::Receiver<Stop>,
    batch: &Arc<batch::Batch>,
    ended: &mut Vec<(DataInterval, RunState)>,
) -> Result<(), Error> {
    for interval in intervals {
        let reached = shared
            .spec
            .max_failures
            .is_some_and(|m| shared.failed.load(std::sync::atomic::Ordering::Relaxed) >= m);
        if reached {
            // The intervals left stay planned, as those of the queue do: the backfill halted.
            shared
                .halted
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if *stop.borrow() != Stop::Run
            || reached
            || shared.halted.load(std::sync::atomic::Ordering::Relaxed)
            || shared.winding_down()
        {
            break;
        }
        let slot = Slot {
            freed: None,
            start: interval.start.timestamp(),
        };
        let end = interval::run(shared.clone(), interval, stop.clone(), slot, Some(batch)).await?;
        count_failure(shared, end.1);
        ended.push(end);
    }
    Ok(())
}

/// For `depends_on_past`: the queued intervals whose predecessor is not queued (the first, or
/// any after a resume) and did not succeed, as the manifest says, by their start: they must
/// not run.
async fn failed_predecessors(
    shared: &Shared,
    queue: &VecDeque<DataInterval>,
) -> Result<HashMap<i64, bool>, Error> {
    let ends: std::collections::HashSet<i64> = queue.iter().map(|i| i.end.timestamp()).collect();
    let orphans: Vec<i64> = queue
        .iter()
        .map(|i| i.start.timestamp())
        .filter(|s| !ends.contains(s))
        .collect();
    let (path, dag_id) = (
        shared.spec.manifest_path.clone(),
        shared.spec.dag.id.clone(),
    );
    let before = tokio::task::spawn_blocking(move || {
        let reader = crate::manifest::Reader::take(&path)?;
        orphans
            .into_iter()
            .map(|s| Ok((s, reader.state_before(&dag_id, s)?)))
            .collect::<Result<Vec<_>, crate::manifest::Error>>()
    })
    .await
    .map_err(|e| Error::Internal(format!("reading the manifest panicked: {e}")))??;
    Ok(before
        .into_iter()
        .filter(|(_, state)| state.is_some_and(|s| s != RunState::Succeeded))
        .map(|(start, _)| (start, false))
        .collect())
}

/// Records a skip decided while running (`depends_on_past`, nothing left to promote).
async fn skip(shared: &Shared, interval: DataInterval, reason: SkipReason) -> Result<(), Error> {
    let dag_id = shared.spec.dag.id.clone();
    let owner = shared.spec.owner;
    let start = interval.start.timestamp();
    shared
        .writer
        .call(move |c| c.skip_planned(c.fence(owner)?, &dag_id, start, reason))
        .await?;
    let _ = shared
        .events
        .send(Event::IntervalSkipped { interval, reason });
    Ok(())
}

/// Why a process stops once it finds itself fenced.
pub(crate) fn fenced_why(owner: Owner) -> String {
    match owner.worker {
        None => {
            "another backfill took the intervals over (no heartbeat within lease_timeout)".into()
        }
        Some(w) => format!(
            "worker {w} was taken over: its intervals went back to backfill {} (no heartbeat within lease_timeout)",
            owner.backfill_id
        ),
    }
}

/// An interval ended in an error: being fenced stops the backfill as a cancel would, and so
/// does an environment fault (kept for the outcome); anything else is kept (the first one is
/// returned) and stops it too.
fn fail(shared: &Shared, first_error: &mut Option<Error>, e: Error) {
    if let Some(fault) = e.environment() {
        shared.stop_for(&fault);
        return;
    }
    if let Error::Manifest(m) = &e
        && m.is_fenced()
    {
        tracing::warn!(
            backfill = shared.spec.owner.backfill_id,
            "fenced: another process took this backfill over"
        );
        shared.stop_because(fenced_why(shared.spec.owner));
        return;
    }
    tracing::error!(backfill = shared.spec.owner.backfill_id, error = %e, "stopping after an internal error");
    shared.stop_because(format!("internal error: {e}"));
    if first_error.is_none() {
        *first_error = Some(e);
    }
}

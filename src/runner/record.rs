//! The runner's writes to the manifest for tries and runs, each fenced by the owner's epoch.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use super::Shared;
use crate::clock::{End, Mark, now_ms};
use crate::exit::Error;
use crate::interval::DataInterval;
use crate::manifest::db::Step;
use crate::manifest::leases::{Judge, LeaseCtx};
use crate::manifest::{Publication, TryRecord, publishes, runs};
use crate::plan::{RunState, SkipReason};
use crate::project::{Task, TaskKind};
use crate::task::command;
use crate::warehouse;

/// What a published try wrote.
pub(super) struct Published {
    pub rows: i64,
    pub fingerprint: Option<String>,
    /// Recorded in the manifest by the publish's own transaction (a PostgreSQL warehouse in the
    /// manifest's database): the try's end and its publication are there already.
    pub recorded: bool,
}

/// When this process recorded the starts of its runs and tries, on the monotonic clock: their
/// ends are recorded as their starts plus the time since, whatever the wall clock did meanwhile
/// (see [`End`]).
#[derive(Default)]
pub(super) struct Marks {
    runs: Mutex<HashMap<i64, Mark>>,
    tries: Mutex<HashMap<i64, Mark>>,
}

impl Marks {
    /// Notes the start of a try, and of its run when it started with it.
    fn started(&self, run: Option<i64>, try_id: i64, at: Mark) {
        if let Some(run) = run {
            self.runs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(run, at);
        }
        self.tries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(try_id, at);
    }

    /// The mark of a try's start, forgotten: its end is being recorded.
    pub(super) fn try_end(&self, try_id: i64) -> Option<Mark> {
        self.tries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&try_id)
    }

    /// The mark of a run's start, forgotten: its end is being recorded.
    fn run_end(&self, run_id: i64) -> Option<Mark> {
        self.runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&run_id)
    }
}

/// A try's end, not yet recorded: it is committed together with the end of its run when it is
/// the run's last.
pub(super) struct LastTry {
    pub try_id: i64,
    pub task_id: String,
    pub interval: DataInterval,
    pub record: TryRecord,
    pub published: Option<Published>,
}

/// Records a try's end in the caller's manifest transaction and, when it published, its
/// publication (and a promoted output's new state); nothing when its publish's own
/// transaction recorded it.
fn end_try(
    c: &dyn crate::manifest::Store,
    f: crate::manifest::backfills::Fenced,
    t: &LastTry,
    dag_id: &str,
    (end, now): (End, i64),
) -> crate::manifest::Result<()> {
    if t.published.as_ref().is_some_and(|p| p.recorded) {
        return Ok(());
    }
    c.finish_try(f, t.try_id, &t.record, end)?;
    if let Some(p) = &t.published {
        let publication = Publication {
            try_id: t.try_id,
            dag_id,
            task_id: &t.task_id,
            interval: t.interval,
            rows: p.rows,
            fingerprint: p.fingerprint.as_deref(),
        };
        c.mark_published(&publication, now)?;
        if let Some(staged) = t.record.promoted_from {
            c.set_staged(staged, crate::state::StagedState::Promoted)?;
        }
    }
    Ok(())
}

/// A run's end: the run, its tries' ends, and its state and error.
pub(super) type RunEnd = (i64, Vec<LastTry>, (RunState, Option<String>));

/// The ends of several runs, each with its tries, recorded in one manifest transaction: a
/// `promote --atomic`, whose runs end together (a kill between two of them would leave some
/// runs to be promoted again on their own).
pub(super) async fn record_ends(shared: &Shared, runs: Vec<RunEnd>) -> Result<(), Error> {
    if crate::fault::point("record-end") {
        return Err(Error::Manifest(crate::manifest::Error::Invalid(
            "disk I/O error (injected)".into(),
        )));
    }
    let dag_id = shared.spec.dag.id.clone();
    let owner = shared.spec.owner;
    let runs: Vec<_> = runs
        .into_iter()
        .map(|(run_id, tries, end)| {
            let tries: Vec<_> = tries
                .into_iter()
                .map(|t| {
                    let began = shared.marks.try_end(t.try_id);
                    (t, began)
                })
                .collect();
            (run_id, tries, end, shared.marks.run_end(run_id))
        })
        .collect();
    shared
        .writer
        .call(move |c| {
            let now = now_ms();
            let f = c.fence(owner)?;
            for (run_id, tries, (state, error), run_began) in &runs {
                for (t, began) in tries {
                    end_try(c, f, t, &dag_id, (End::since(*began), now))?;
                }
                c.finish_run(f, *run_id, *state, error.as_deref(), End::since(*run_began))?;
            }
            Ok(())
        })
        .await?;
    Ok(())
}

/// Records the end of a task's last try and, when given, of the run, in one commit. `slot`, when
/// given, is freed once the commit is queued: the next interval's first commit queues behind it.
pub(super) async fn record_end(
    shared: &Shared,
    run_id: i64,
    last_try: Option<LastTry>,
    run_end: Option<(RunState, Option<String>)>,
    slot: Option<&mut super::Slot>,
) -> Result<(), Error> {
    if crate::fault::point("record-end") {
        return Err(Error::Manifest(crate::manifest::Error::Invalid(
            "disk I/O error (injected)".into(),
        )));
    }
    let dag_id = shared.spec.dag.id.clone();
    let owner = shared.spec.owner;
    let try_began = last_try
        .as_ref()
        .and_then(|t| shared.marks.try_end(t.try_id));
    let run_began = run_end.as_ref().and_then(|_| shared.marks.run_end(run_id));
    let committed = shared.writer.submit_step(move |c| {
        let now = now_ms();
        let (try_end, run_end_at) = (End::since(try_began), End::since(run_began));
        let f = c.fence(owner)?;
        // The common end, in one statement (deferred: sent with the batch's others): a last try
        // that published nothing, and its run.
        if let (Some(t), Some((state, error))) = (&last_try, &run_end)
            && t.published.as_ref().is_none_or(|p| p.recorded)
        {
            return c.finish_try_and_run(
                f,
                t.try_id,
                &t.record,
                run_id,
                *state,
                error.as_deref(),
                (try_end, run_end_at),
            );
        }
        if let Some(t) = &last_try {
            end_try(c, f, t, &dag_id, (try_end, now))?;
        }
        if let Some((state, error)) = &run_end {
            c.finish_run(f, run_id, *state, error.as_deref(), run_end_at)?;
        }
        Ok(Step::Done(()))
    });
    if let Some(slot) = slot {
        slot.free();
    }
    committed
        .await
        .map_err(|_| crate::manifest::Error::WriterGone)??;
    Ok(())
}

/// A started try: its run, its id, its log and result paths, and (SQL tasks) its audit file.
pub(super) struct Started {
    pub run_id: i64,
    pub try_id: i64,
    /// When its start was recorded, on the monotonic clock.
    pub began: Mark,
    pub log: PathBuf,
    pub result: PathBuf,
    pub audit: Option<PathBuf>,
}

/// How starting a try that claims a staged output went.
pub(super) enum Claimed {
    Started(Started),
    TakenOver,
    /// The backfill runs `max_active_runs` intervals already across its processes: the run
    /// could not start yet.
    Busy,
    /// The backfill reached its `--max-failures` (in any of its processes): no run starts.
    Halted,
    /// The staged output was promoted or discarded meanwhile: nothing to do.
    Gone,
    /// A cascade's downstream interval whose upstream cannot be read now (another backfill
    /// runs an upstream interval it overlaps, or one's latest run failed): it was recorded as
    /// skipped (`upstream not successful`) instead of started.
    UpstreamNotReady,
    /// The run's reserved id is no longer the interval's largest (see [`runs::Start::Stale`]):
    /// nothing was recorded.
    Stale,
}

/// Records a try as started, and the run too for the interval's first try: one commit. For a
/// promote, in the same commit, checks that the staged try `claim` is still staged and records
/// the new try as its promote (`promoted_from`), so that no other promote or discard acts on it
/// meanwhile; for a cascade's downstream interval, that its upstream can be read.
///
/// A run that cannot start yet because the backfill's other processes (`backfill join`) run
/// `max_active_runs` intervals already waits here for a place; a stop or a wind-down (see
/// [`super::RunSpec::wind_down`]) meanwhile leaves the interval planned.
pub(super) async fn start_claiming(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
    run_id: Option<i64>,
    try_number: u32,
    claim: Option<i64>,
    early: Option<runs::Early>,
) -> Result<Claimed, Error> {
    let mut stop = shared.stop.subscribe();
    loop {
        if run_id.is_none() && shared.winding_down() {
            return Ok(Claimed::TakenOver);
        }
        match start_once(shared, task, interval, run_id, try_number, claim, early).await? {
            Claimed::Halted => {
                shared
                    .halted
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                return Ok(Claimed::Halted);
            }
            // A process spawned for the start (see `early_start`) is not kept at its gate
            // meanwhile: until it `exec`s, it holds a thread of the blocking pool (the one that
            // cloned it waits for the exec), for as long as the backfill has no room.
            Claimed::Busy if early.is_some() => return Ok(Claimed::Busy),
            Claimed::Busy => {
                if *stop.borrow() != super::Stop::Run {
                    return Ok(Claimed::TakenOver);
                }
                tokio::select! {
                    () = tokio::time::sleep(crate::clock::HEARTBEAT) => {}
                    _ = stop.changed() => {}
                }
            }
            claimed => return Ok(claimed),
        }
    }
}

async fn start_once(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
    run_id: Option<i64>,
    try_number: u32,
    claim: Option<i64>,
    early: Option<runs::Early>,
) -> Result<Claimed, Error> {
    let spec = &shared.spec;
    let (owner, dag_id, task_id) = (spec.owner, spec.dag.id.clone(), task.id.clone());
    let logs_dir = spec.logs_dir.clone();
    // A try that computes SQL output writes it into an audit file of its own; a promote or
    // rollback try publishes what exists already.
    let computes = matches!(spec.mode, super::Mode::Run | super::Mode::Stage);
    let audit_dir = (computes && matches!(task.kind, TaskKind::Sql(_)))
        .then(|| warehouse::audit_dir(&spec.manifest_path));
    // A run that starts here must find its upstream readable in the same commit.
    let upstream: Vec<(String, Vec<DataInterval>)> = if run_id.is_none() && computes {
        spec.upstream
            .iter()
            .map(|u| {
                crate::cascade::overlapping(u, &[interval])
                    .map(|ups| (u.id.clone(), ups))
                    .map_err(Error::Internal)
            })
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    let ctx = LeaseCtx::new(spec.lease_timeout, &crate::process::LOCAL);
    let claimed = shared
        .writer
        .call_step(move |c| {
            let now = now_ms();
            let began = Mark::now();
            let f = c.fence(owner)?;
            if let Some(staged) = claim
                && !c.is_staged(staged)?
            {
                return Ok(Step::Done(Claimed::Gone));
            }
            for (up, ups) in &upstream {
                if crate::cascade::readable(c, up, ups, &ctx, Judge::Strict)?.contains(&false) {
                    c.skip_planned(
                        f,
                        &dag_id,
                        interval.start.timestamp(),
                        SkipReason::UpstreamNotSuccessful,
                    )?;
                    return Ok(Step::Done(Claimed::UpstreamNotReady));
                }
            }
            let (run_id, try_id) = match run_id {
                Some(id) => {
                    let (log, _) = command::try_paths(
                        &logs_dir,
                        &dag_id,
                        interval.start,
                        &task_id,
                        id,
                        try_number,
                    );
                    let log = log.display().to_string();
                    match c.start_try(f, id, &task_id, try_number, &log, now)? {
                        Some(try_id) => (id, try_id),
                        None => return Ok(Step::Done(Claimed::TakenOver)),
                    }
                }
                // The run and its first try, in one statement: the run's id is in the log path.
                None => {
                    let (before, after) = command::log_path_around_run(
                        &logs_dir,
                        &dag_id,
                        interval.start,
                        &task_id,
                        try_number,
                    );
                    let begun = c.start_run_and_try(
                        f,
                        &dag_id,
                        interval,
                        now,
                        ctx.timeout_ms,
                        &task_id,
                        try_number,
                        (&before, &after),
                        early,
                    )?;
                    // With nothing more to record, the statement is deferred (sent with the
                    // batch's others) and the try's paths are made from its answer.
                    if claim.is_none() && audit_dir.is_none() {
                        let (logs_dir, dag_id, task_id) =
                            (logs_dir.clone(), dag_id.clone(), task_id.clone());
                        return begun.map(move |begun| {
                            Ok(match started_ids(begun) {
                                Ok((run_id, try_id)) => Claimed::Started(started(
                                    (&logs_dir, &dag_id, &task_id),
                                    interval,
                                    (run_id, try_id, try_number),
                                    None,
                                    began,
                                )),
                                Err(refused) => refused,
                            })
                        });
                    }
                    match started_ids(begun.now(c)?) {
                        Ok(ids) => ids,
                        Err(refused) => return Ok(Step::Done(refused)),
                    }
                }
            };
            if let Some(staged) = claim {
                c.set_promoted_from(try_id, staged)?;
            }
            let audit = audit_dir
                .as_ref()
                .map(|dir| dir.join(warehouse::audit::try_file(try_id)));
            if let Some(path) = &audit {
                c.set_try_audit(f, try_id, &path.display().to_string())?;
            }
            Ok(Step::Done(Claimed::Started(started(
                (&logs_dir, &dag_id, &task_id),
                interval,
                (run_id, try_id, try_number),
                audit,
                began,
            ))))
        })
        .await?;
    if let Claimed::Started(s) = &claimed {
        shared
            .marks
            .started(run_id.is_none().then_some(s.run_id), s.try_id, s.began);
    }
    Ok(claimed)
}

/// The run's and the try's ids of a start, or why none started.
fn started_ids(begun: (runs::Start, Option<i64>)) -> Result<(i64, i64), Claimed> {
    match begun {
        (runs::Start::Run(run), Some(try_id)) => Ok((run, try_id)),
        (runs::Start::Busy, _) => Err(Claimed::Busy),
        (runs::Start::Halted, _) => Err(Claimed::Halted),
        (runs::Start::Stale, _) => Err(Claimed::Stale),
        _ => Err(Claimed::TakenOver),
    }
}

/// A started try, its log and result paths made from its run's id.
fn started(
    (logs_dir, dag_id, task_id): (&std::path::Path, &str, &str),
    interval: DataInterval,
    (run_id, try_id, try_number): (i64, i64, u32),
    audit: Option<PathBuf>,
    began: Mark,
) -> Started {
    let (log, result) = command::try_paths(
        logs_dir,
        dag_id,
        interval.start,
        task_id,
        run_id,
        try_number,
    );
    Started {
        run_id,
        try_id,
        began,
        log,
        result,
        audit,
    }
}

/// A read of the manifest outside the writer (a read needs no write transaction), on the
/// blocking pool.
async fn read<T: Send + 'static>(
    shared: &Shared,
    f: impl FnOnce(&dyn crate::manifest::Reads) -> crate::manifest::Result<T> + Send + 'static,
) -> Result<T, Error> {
    let path = shared.spec.manifest_path.clone();
    let read = tokio::task::spawn_blocking(move || {
        let reader = crate::manifest::Reader::take(&path)?;
        f(&*reader).map_err(|e| e.at(&path))
    })
    .await
    .map_err(|e| Error::Internal(format!("reading the manifest panicked: {e}")))?;
    // A reader that cannot be opened for want of descriptors or memory stops the backfill as
    // a fault of the machine; the manifest's own failures stay internal errors.
    read.map_err(|e| match environment_of_manifest(&e) {
        Some(fault) => Error::Environment(fault),
        None => e.into(),
    })
}

/// The environment fault a failure to read the manifest is (a reader that cannot be opened for
/// want of descriptors or memory), if it is one.
pub(super) fn environment_of_manifest(
    e: &crate::manifest::Error,
) -> Option<crate::environment::Fault> {
    match e {
        crate::manifest::Error::Db { path, source } => crate::environment::Fault::of_sqlite(
            source,
            &format!("manifest {}", path.display()),
            path,
        ),
        _ => None,
    }
}

/// The currently published try of a task and interval, its rows and content.
pub(super) async fn published_try(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
) -> Result<Option<publishes::Current>, Error> {
    let (dag_id, task_id) = (shared.spec.dag.id.clone(), task.id.clone());
    read(shared, move |r| {
        r.current_publication(&dag_id, &task_id, interval.start.timestamp())
    })
    .await
}

/// What a try's gate compares with, in one read: the currently published try of the task and
/// interval, and with the gate's `history` the rows of the task's published partitions before
/// the interval, newest first (as many as asked when there are that many).
pub(super) async fn published_and_history(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
) -> Result<(Option<publishes::Current>, Option<Vec<i64>>), Error> {
    let (dag_id, task_id) = (shared.spec.dag.id.clone(), task.id.clone());
    let asked = task
        .gate
        .as_ref()
        .and_then(|g| g.history)
        .map(|h| h.partitions);
    let start = interval.start.timestamp();
    read(shared, move |r| {
        let current = r.current_publication(&dag_id, &task_id, start)?;
        let history = match asked {
            Some(n) => Some(r.published_history(&dag_id, &task_id, start, i64::from(n))?),
            None => None,
        };
        Ok((current, history))
    })
    .await
}

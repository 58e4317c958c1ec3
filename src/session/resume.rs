//! Resuming a backfill whose process is gone (crash, kill) or that was interrupted or
//! cancelled. Refuses while the owner process is alive. Taking it over gives it a new epoch, so
//! that its old process, should it wake up, is refused everything.

use std::collections::{HashMap, HashSet};

use super::beat::Beating;
use super::execute::{Execution, execute};
use super::launch::{taken_over, write_plan};
use super::tasks::check_tasks;
use super::{Global, find_backfill, unknown_backfill, warn};
use crate::clock;
use crate::exit::{self, Error};
use crate::interval::{DataInterval, Range, expand_nonempty};
use crate::manifest::leases::LeaseCtx;
use crate::manifest::writer::Writer;
use crate::manifest::{self, Reads};
use crate::plan;
use crate::recovery::{self, Dags};

/// Resumes backfill `id` alone.
pub(crate) fn resume_one(g: &Global, id: i64) -> Result<u8, Error> {
    let (project, manifest_path, conn, backfill) = find_backfill(g, id)?;
    resume_found(g, &project, &manifest_path, conn, backfill, false)
}

/// Resumes a backfill read from the manifest (`conn`, read-only); with `wait`, once the lease
/// its owner still holds has expired.
pub(crate) fn resume_found(
    g: &Global,
    project: &crate::project::Project,
    manifest_path: &std::path::Path,
    conn: Box<dyn Reads>,
    backfill: manifest::Backfill,
    wait: bool,
) -> Result<u8, Error> {
    let id = backfill.id;
    crate::limits::room_for_runs(backfill.max_active_runs, None)?;
    crate::crash::running(id);
    // Another project's backfill is neither taken over nor run into this project's warehouses;
    // nor is this one run beside another project's backfills of its DAG.
    super::belonging::check_backfill(project, manifest_path, &backfill, "resume")?;
    if let Ok(dag) = project.dag(&backfill.dag_id) {
        super::belonging::check_dag(project, manifest_path, &*conn, &dag)?;
    }
    let pending = conn
        .unfinished_intervals(id)
        .map_err(|e| e.at(manifest_path))?;
    drop(conn);
    let dag = dag_of(g, project, &backfill)?;
    let conf = backfill.conf_json()?;
    let now = clock::now()?;
    let (intervals, upstream_skips) = to_plan(project, manifest_path, &backfill, &dag, now)?;
    let mut window = if backfill.planning {
        intervals.clone()
    } else {
        pending
    };
    window.sort_unstable();
    let reprs = check_tasks(&dag, &conf, &window)?;
    let writer = Writer::open(manifest_path, project.durability)?;
    let ctx = LeaseCtx::new(project.lease_timeout, &crate::process::LOCAL);
    let taken = match take_over(g, &writer, project, manifest_path, id, wait, &ctx) {
        Ok(taken) => taken,
        Err(e) => {
            writer.close();
            return Err(e);
        }
    };
    let owner = taken.owner;
    // The heartbeat runs while the old owner's leftovers are recovered and the plan finished.
    let beat = Beating::start(&writer, owner);
    let prepared = (|| {
        let dags = Dags::of(project);
        recover(g, &writer, &dags, taken, &ctx, &dag, id)?;
        record_definition(g, &writer, owner, &backfill, &dag)?;
        if backfill.planning {
            let left = Planned {
                intervals: &intervals,
                upstream_skips: &upstream_skips,
                conf: &conf,
                now,
            };
            finish_plan(
                g,
                &writer,
                project,
                manifest_path,
                owner,
                &backfill,
                &dag,
                left,
                &ctx,
            )?;
        }
        let (dag_id, c) = (dag.id.clone(), ctx.refreshed());
        Ok::<_, Error>(
            writer
                .call_blocking(move |conn| recovery::lease_remaining(conn, owner, &dag_id, &c))?,
        )
    })();
    drop(beat);
    let intervals: Vec<DataInterval> = match prepared {
        Ok(v) => v,
        Err(e) => {
            writer.close();
            return taken_over(e);
        }
    };
    if !g.quiet && !g.json {
        crate::report::out::say(&format!(
            "resuming backfill {id} of {}: {} left to run",
            dag.id,
            crate::report::out::plural(intervals.len() as i64, "interval", "intervals")
        ));
    }
    let upstream = super::tasks::upstream_dags(project, &dag, backfill.cascade_of.is_some());
    let code = execute(
        g,
        project,
        Execution {
            owner,
            dag,
            conf,
            max_active_runs: backfill.max_active_runs,
            intervals,
            allow_drift: backfill.allow_drift,
            reprs,
            max_failures: backfill.max_failures,
            tasks: backfill.tasks.clone().filter(|_| {
                matches!(
                    backfill.kind,
                    crate::state::BackfillKind::Run | crate::state::BackfillKind::Stage
                )
            }),
            mode: super::staged::mode_of(&backfill, manifest_path)?,
            upstream,
            created: None,
            ready: super::execute::Readiness::of(&backfill),
        },
        writer,
    )?;
    Ok(if code == exit::OK { exit::OK } else { code })
}

/// The DAG a backfill runs on: its `--tasks` only (for a run or a staging), with the batch
/// size it was created with.
fn dag_of(
    g: &Global,
    project: &crate::project::Project,
    backfill: &manifest::Backfill,
) -> Result<crate::project::Dag, Error> {
    let mut dag = match (&backfill.tasks, backfill.kind) {
        (Some(tasks), crate::state::BackfillKind::Run | crate::state::BackfillKind::Stage) => {
            super::tasks::only_tasks(project.dag(&backfill.dag_id)?, tasks)?
        }
        _ => project.dag(&backfill.dag_id)?,
    };
    super::tasks::keep_batch_size(g, &mut dag, backfill);
    Ok(dag)
}

/// The intervals a backfill whose planning was cut short plans, with the ones skipped for their
/// upstream; nothing when its plan is whole.
fn to_plan(
    project: &crate::project::Project,
    manifest_path: &std::path::Path,
    backfill: &manifest::Backfill,
    dag: &crate::project::Dag,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(Vec<DataInterval>, UpstreamSkips), Error> {
    // The range as recorded: interval starts in [range_start, range_end).
    let range = Range {
        start: crate::interval::from_unix(backfill.range_start),
        end_exclusive: crate::interval::from_unix(backfill.range_end),
    };
    match (backfill.planning, backfill.cascade_of) {
        // A downstream backfill of a cascade plans the intervals its upstream backfills
        // decided, each skipped or not for its upstream, as when it was created.
        (true, Some(root)) => {
            let conn = manifest::open_read_only(manifest_path)?;
            let first = conn
                .backfill(root)
                .map_err(|e| e.at(manifest_path))?
                .ok_or_else(|| Error::Internal(format!("cascade backfill {root} vanished")))?;
            let mode = first
                .cascade
                .as_deref()
                .and_then(crate::cascade::Mode::parse)
                .unwrap_or(crate::cascade::Mode::All);
            let (map, _) = super::chain::backfills_of(&*conn, root, &first.dag_id)?;
            let dags = super::chain::all_dags(project)?;
            super::chain::plan_member(&*conn, project, &dags, dag, &map, mode)
        }
        (true, None) => {
            let all = expand_nonempty(&dag.schedule, range, &backfill.from_arg, &backfill.to_arg)?;
            // A sample whose planning was cut short picks its intervals again, as create did
            // (the same range; the history of the intervals picked before is its own).
            let intervals = match backfill.sample {
                Some(n) => {
                    let conn = manifest::open_read_only(manifest_path)?;
                    super::launch::sample_of(Some(&*conn), manifest_path, dag, &all, n, now)?
                        .map_or(all, |(picked, _)| picked)
                }
                None => all,
            };
            Ok((intervals, HashMap::new()))
        }
        _ => Ok((Vec::new(), HashMap::new())),
    }
}

/// The intervals of a downstream backfill skipped for their upstream, by start.
type UpstreamSkips = HashMap<i64, plan::SkipReason>;

/// Makes this process the backfill's owner once its owner is gone; with `wait`, after the
/// lease its owner still holds has expired (its heartbeat, unchanged for a whole lease timeout
/// on this process's clock, is stale whatever its time says). Refused while the owner lives.
fn take_over(
    g: &Global,
    writer: &Writer,
    project: &crate::project::Project,
    manifest_path: &std::path::Path,
    id: i64,
    wait: bool,
    ctx: &LeaseCtx,
) -> Result<recovery::TakenOver, Error> {
    let lease_ms = i64::try_from(project.lease_timeout.as_millis()).unwrap_or(i64::MAX);
    // With `wait`: the owner's heartbeat as first seen, and when (this process's monotonic
    // clock).
    let mut watched: Option<(Option<i64>, std::time::Instant)> = None;
    loop {
        let judge = match watched {
            Some((heartbeat, since)) if since.elapsed() >= project.lease_timeout => {
                ctx.refreshed().with_silent(heartbeat)
            }
            _ => ctx.refreshed(),
        };
        if let Some(taken) = recovery::take_over(writer, id, &judge)? {
            return Ok(taken);
        }
        let reader = manifest::open_read_only(manifest_path)?;
        let current = reader.backfill(id).map_err(|e| e.at(manifest_path))?;
        let Some(b) = current else {
            return Err(unknown_backfill(id, manifest_path));
        };
        // The lease left, by the manifest's clock: what another host judges it by. Never more
        // than a lease timeout: a heartbeat from the future is a clock that was set back.
        let now = reader
            .clock_ms(clock::now_ms())
            .map_err(|e| e.at(manifest_path))?;
        let left = b
            .heartbeat_at
            .map_or(0, |h| h.saturating_add(lease_ms).saturating_sub(now))
            .clamp(0, lease_ms);
        if wait && watched.is_none() && b.state == crate::state::BackfillState::Running {
            watched = Some((b.heartbeat_at, std::time::Instant::now()));
            let left = std::time::Duration::from_millis(u64::try_from(left).unwrap_or(0));
            let ahead = b.heartbeat_at.map_or(0, |h| h.saturating_sub(now)).max(0);
            say_waiting(g, &b, left, ahead);
            std::thread::sleep(left + std::time::Duration::from_millis(200));
            continue;
        }
        let beat_again = watched.is_some_and(|(heartbeat, _)| heartbeat != b.heartbeat_at);
        return Err(Error::Usage(format!(
            "backfill {id} is still running (pid {}, host {}){}; wait for it, or stop it with `{}`",
            b.owner_pid.map_or("?".to_string(), |p| p.to_string()),
            b.owner_host
                .as_deref()
                .map_or("?", crate::liveness::host_name),
            if beat_again {
                ": its owner beat again while this waited"
            } else {
                ""
            },
            crate::report::out::hint(&format!("cancel {id}"))
        )));
    }
}

/// What `resume --wait` says while it waits `left` for backfill `b`'s lease to expire (`ahead`:
/// how far its last heartbeat is ahead of this host's clock, in milliseconds).
fn say_waiting(g: &Global, b: &manifest::Backfill, left: std::time::Duration, ahead: i64) {
    super::note(
        g,
        &format!(
            "backfill {}'s owner (pid {}, host {}) holds its lease for {} more unless it beats again: waiting for it to expire{}",
            b.id,
            b.owner_pid.map_or("?".to_string(), |p| p.to_string()),
            b.owner_host
                .as_deref()
                .map_or("?", crate::liveness::host_name),
            humantime::format_duration(std::time::Duration::from_millis(
                u64::try_from(left.as_millis() / 100 * 100).unwrap_or(0)
            )),
            if ahead > 1000 {
                format!(
                    " (its last heartbeat is {} ahead of this host's clock, which was set back since: it counts as written now)",
                    humantime::format_duration(std::time::Duration::from_secs(
                        u64::try_from(ahead / 1000).unwrap_or(0)
                    ))
                )
            } else {
                String::new()
            }
        ),
    );
}

/// Recovers what the gone owner left (its runs, tries and publishes), and the stale leases of
/// the DAG, saying what needs saying.
fn recover(
    g: &Global,
    writer: &Writer,
    dags: &Dags,
    taken: recovery::TakenOver,
    ctx: &LeaseCtx,
    dag: &crate::project::Dag,
    id: i64,
) -> Result<(), Error> {
    let report = recovery::finish_takeover(writer, dags, taken, ctx)?;
    for w in &report.warnings {
        warn(g, w);
    }
    let stale = recovery::release_stale(writer, dags, &dag.id, &ctx.refreshed(), Some(id))?;
    for w in &stale.warnings {
        warn(g, w);
    }
    Ok(())
}

/// The definition the backfill runs from now on is the one found here: said when it changed,
/// and recorded, so that workers that join check against it.
fn record_definition(
    g: &Global,
    writer: &Writer,
    owner: manifest::Owner,
    backfill: &manifest::Backfill,
    dag: &crate::project::Dag,
) -> Result<(), Error> {
    let changes = super::tasks::definition_changes(backfill.definition.as_deref(), dag);
    if let Some(changes) = changes.as_ref().filter(|c| !c.is_empty()) {
        warn(
            g,
            &format!(
                "DAG `{}` in {} changed since backfill {} last ran ({}): the rest of it runs this definition",
                dag.id,
                dag.file,
                backfill.id,
                changes.join(", ")
            ),
        );
    }
    if changes.is_none_or(|c| !c.is_empty()) {
        let definition = super::tasks::definition_json(dag);
        writer.call_blocking(move |c| c.record_definition(owner, &definition))?;
    }
    Ok(())
}

/// What is left to plan of a backfill whose owner died while it wrote the plan.
struct Planned<'a> {
    intervals: &'a [DataInterval],
    upstream_skips: &'a UpstreamSkips,
    conf: &'a serde_json::Value,
    now: chrono::DateTime<chrono::Utc>,
}

/// Finishes the plan the gone owner was writing: the intervals it had not planned yet.
#[expect(
    clippy::too_many_arguments,
    reason = "the owner, the backfill and its DAG as resume found them, and the context to judge leases by"
)]
fn finish_plan(
    g: &Global,
    writer: &Writer,
    project: &crate::project::Project,
    manifest_path: &std::path::Path,
    owner: manifest::Owner,
    backfill: &manifest::Backfill,
    dag: &crate::project::Dag,
    left: Planned<'_>,
    ctx: &LeaseCtx,
) -> Result<(), Error> {
    let id = backfill.id;
    let already: HashSet<i64> = writer.call_blocking(move |c| c.planned_starts(id))?;
    let options = plan::Options {
        reprocess: backfill.reprocess,
        run_backwards: backfill.run_backwards,
        depends_on_past: dag.depends_on_past,
        now: left.now,
    };
    let changed = match backfill.reprocess {
        plan::Reprocess::Changed => super::launch::source_changes(
            g,
            project,
            dag,
            left.conf,
            left.intervals,
            manifest_path,
        )?,
        _ => HashSet::new(),
    };
    write_plan(
        writer,
        owner,
        dag,
        left.intervals,
        options,
        super::launch::Marks {
            already: &already,
            changed: &changed,
            upstream: left.upstream_skips,
        },
        &ctx.refreshed(),
    )?;
    Ok(())
}

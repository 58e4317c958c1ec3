//! A worker's watch over its backfill's owner (`backfill join`). Every heartbeat the worker
//! judges the owner as `resume` does: by the manifest's lease rule and clock (its heartbeat
//! older than the lease timeout, or, on this host, its process gone). When the owner is gone,
//! the worker takes the whole backfill over and finishes it; where that is not safe, it says so
//! and leaves the backfill to `backfill resume`.
//!
//! **Taking over.** The worker claims the backfill as `resume` does ([`recovery::take_over_running`]:
//! a new epoch, so that the old owner, should it wake up, is refused everything), in one
//! manifest transaction that also checks that the backfill still runs and nobody asked to
//! cancel it. The writers take turns on the manifest, so of two workers that find the owner
//! gone the first claim wins and the second finds a live owner: it goes on as a worker of the
//! new one. The winner then writes the owner's heartbeat, starts no more runs as a worker
//! (the runner winds down: see [`crate::runner::RunSpec::wind_down`]), recovers what the old
//! owner left (its tries' process groups killed on this host first, its runs recorded
//! `cancelled`, its decided publishes finished), and once its own runs in flight have ended it
//! records its end as a worker and runs the rest of the backfill as its owner: the old owner's
//! intervals, those nobody started, gone workers' ones, the wait for live workers, the
//! backfill's outcome judged on every interval, its summary, its exit code and its notify
//! hooks. A worker finishes the backfill, rather than only freeing the places for `resume` to
//! judge later, because a backfill whose owner is dead stays `running`, its outcome unjudged and
//! its hooks silent, until someone resumes it; the worker, already running its definition
//! (checked when it joined), is what `resume` would be, minus the wait for a person.
//!
//! **Across hosts** the old owner's tries cannot be killed from here: they count as stopped
//! once its lease has expired, as they do for `resume` and for an owner that recovers a gone
//! worker (an owner that cannot renew its lease stops its tries itself; a host that dies takes
//! them with it). An owner process killed alone on another host, its tries left running
//! there, is not seen from here.
//!
//! **Not taken over**: a backfill of a cascade (`resume` goes on with the DAGs downstream,
//! which a worker of one DAG neither checked nor was asked to run), and one whose plan was
//! still being written (`resume` finishes planning it as `create` would have). Then the worker
//! says why, starts no more intervals, ends its runs in flight and exits 130 (interrupted;
//! resumable with `backfill resume ID`). It does not wait for the resume: it has nothing to do
//! until then, and a process that exits says to whatever runs it (a terminal, cron, a
//! scheduler) that the backfill needs a person, where one that waits says nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};

use super::beat::Beating;
use crate::clock::HEARTBEAT;
use crate::exit::Error;
use crate::manifest::leases::LeaseCtx;
use crate::manifest::writer::Writer;
use crate::manifest::{self, Backfill, Owner};
use crate::project::Project;
use crate::recovery::{self, Dags};
use crate::runner::Event;
use crate::state::BackfillState;

/// What a worker's watch found, once it ended.
pub(super) enum Found {
    /// The owner lives, or the backfill no longer runs: the worker ends as workers do.
    Nothing,
    /// This process took the backfill over: it goes on as the owner.
    TookOver(Successor),
    /// The owner is gone and this worker cannot take its place: `resume` can.
    Refused,
}

/// This process as the backfill's new owner, until it runs the rest of the backfill.
pub(super) struct Successor {
    pub owner: Owner,
    /// The owner's heartbeat while the worker's runs in flight end, until the owner's run
    /// writes its own.
    pub beat: Beating,
    /// What recovering the old owner's leftovers warned of, or the error that stopped it.
    pub recovered: Result<Vec<String>, Error>,
}

/// A worker's watch over its owner, running beside its runner.
pub(super) struct Watching {
    done: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Found>,
}

impl Watching {
    /// Starts watching the owner of the backfill that `worker` joined: `events` hears what it
    /// finds, and `wind_down` tells the worker's runner to start no more runs.
    pub(crate) fn start(
        project: &Project,
        writer: &Writer,
        worker: Owner,
        events: mpsc::UnboundedSender<Event>,
        wind_down: watch::Sender<bool>,
    ) -> Self {
        let (done, stopped) = oneshot::channel();
        let watch = Watch {
            writer: writer.clone(),
            path: writer.path().to_path_buf(),
            worker,
            ctx: LeaseCtx::new(project.lease_timeout, &crate::process::LOCAL),
            dags: Arc::new(Dags::of(project)),
            events,
            wind_down,
        };
        Self {
            done,
            task: tokio::spawn(watch.run(stopped)),
        }
    }

    /// Ends the watch (a takeover under way is finished first) and says what it found.
    pub(crate) async fn end(self) -> Found {
        let _ = self.done.send(());
        self.task.await.unwrap_or(Found::Nothing)
    }
}

struct Watch {
    writer: Writer,
    path: PathBuf,
    worker: Owner,
    ctx: LeaseCtx,
    dags: Arc<Dags>,
    events: mpsc::UnboundedSender<Event>,
    wind_down: watch::Sender<bool>,
}

/// An owner found gone: who it was, and why this worker may not take its place, if it may not.
struct Gone {
    owner: String,
    refused: Option<String>,
}

impl Watch {
    async fn run(self, mut done: oneshot::Receiver<()>) -> Found {
        let id = self.worker.backfill_id;
        let mut tick = tokio::time::interval(HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = &mut done => return Found::Nothing,
                _ = tick.tick() => {}
            }
            let (path, ctx) = (self.path.clone(), self.ctx.refreshed());
            let gone = match tokio::task::spawn_blocking(move || owner_gone(&path, id, &ctx)).await
            {
                Ok(Ok(Some(gone))) => gone,
                Ok(Err(e)) => {
                    // The heartbeat stops the worker when the manifest cannot be reached.
                    tracing::debug!(backfill = id, error = %e, "cannot judge the owner");
                    continue;
                }
                Ok(Ok(None)) | Err(_) => continue,
            };
            let gone_event = |refused: Option<String>| Event::OwnerGone {
                backfill_id: id,
                worker: self.worker.worker.unwrap_or_default(),
                owner: gone.owner.clone(),
                refused,
            };
            if let Some(why) = gone.refused.clone() {
                tracing::warn!(
                    backfill = id,
                    "the owner is gone; this worker cannot take its place: {why}"
                );
                let _ = self.wind_down.send(true);
                let _ = self.events.send(gone_event(Some(why)));
                return Found::Refused;
            }
            let (writer, worker, ctx) = (self.writer.clone(), self.worker, self.ctx.refreshed());
            let taken = tokio::task::spawn_blocking(move || {
                recovery::take_over_running(&writer, worker, &ctx)
            })
            .await;
            let taken = match taken {
                Ok(Ok(Some(taken))) => taken,
                // Another process took it over first, or the owner beat again: carry on.
                Ok(Ok(None)) | Err(_) => continue,
                // This worker was taken over itself: its heartbeat stops it.
                Ok(Err(Error::Manifest(e))) if e.is_fenced() => return Found::Nothing,
                Ok(Err(e)) => {
                    tracing::warn!(backfill = id, error = %e, "cannot take the backfill over");
                    continue;
                }
            };
            let owner = taken.owner;
            tracing::info!(
                backfill = id,
                worker = self.worker.worker,
                epoch = owner.epoch,
                "the owner is gone: this worker took the backfill over"
            );
            let beat = Beating::start(&self.writer, owner);
            let _ = self.wind_down.send(true);
            let _ = self.events.send(gone_event(None));
            let (writer, dags, ctx) =
                (self.writer.clone(), self.dags.clone(), self.ctx.refreshed());
            let recovered = tokio::task::spawn_blocking(move || {
                recovery::finish_takeover(&writer, &dags, taken, &ctx).map(|r| r.warnings)
            })
            .await
            .unwrap_or_else(|e| {
                Err(Error::Internal(format!(
                    "recovering what the owner left panicked: {e}"
                )))
            });
            return Found::TookOver(Successor {
                owner,
                beat,
                recovered,
            });
        }
    }
}

/// Backfill `id`'s owner, when it is gone while the backfill runs (judged on the manifest's
/// clock, as `resume` judges it); `None` while it lives, or once the backfill no longer runs
/// or was asked to stop (the worker's heartbeat hears of that).
fn owner_gone(path: &Path, id: i64, ctx: &LeaseCtx) -> manifest::Result<Option<Gone>> {
    let reader = manifest::Reader::take(path)?;
    let ctx = ctx.clone().at_manifest(&*reader)?;
    let Some(b) = reader.backfill(id)? else {
        return Ok(None);
    };
    if b.state != BackfillState::Running || b.cancel_requested || b.owner_alive(&ctx) {
        return Ok(None);
    }
    Ok(Some(Gone {
        owner: format!(
            "pid {}, host {}",
            b.owner_pid.map_or("?".to_string(), |p| p.to_string()),
            b.owner_host
                .as_deref()
                .map_or("?", crate::liveness::host_name)
        ),
        refused: refusal(&b),
    }))
}

/// Why a worker may not take backfill `b` over: what `resume` does for it beyond running its
/// planned intervals.
fn refusal(b: &Backfill) -> Option<String> {
    if b.cascade.is_some() || b.cascade_of.is_some() {
        Some("it is a cascade's backfill: `resume` goes on with the DAGs downstream".into())
    } else if b.planning {
        Some("its plan was still being written: `resume` finishes it".into())
    } else {
        None
    }
}

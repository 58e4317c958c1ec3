//! The manifest's typed interface: every read and write the rest of the program makes, by
//! name, with typed ids, states and verdicts, grouped by role as the callers use them:
//! [`Reads`], [`Ownership`] (the backfill, its epoch, workers and leases), [`Planning`],
//! [`Running`] (runs, tries, pool slots), [`Publishing`] and [`Staging`]. [`Store`] is all of
//! them: what the writer's jobs and an opened manifest hold. A read-only handle
//! ([`super::Reader`], [`super::open_read_only`]) is a `dyn Reads`, so it cannot write.
//!
//! One implementation serves both engines: [`Conn`](super::db::Conn) (in [`conn`]), over the dialect layer of
//! [`super::db`]. The manifest's statements are the same on SQLite and PostgreSQL but for a
//! handful (multi-row inserts, the lease and plan writes that PostgreSQL sends in one round trip,
//! the clock), which branch on the engine where they are written. Two implementations would
//! repeat some three thousand lines of SQL whose meaning must not drift apart: the guarantees
//! (fencing, leases, the publish protocol) are written once and tested on both engines.
//! What differs is kept below the statements: their `$N` parameters are taken as written by
//! both engines (SQLite binds them by number, see [`super::db`]), and PostgreSQL's own types
//! for flags (`boolean`) and documents (`json`) are met by its value layer, which converts a
//! value to the type the server asks for as it binds it.
//!
//! Every write that a backfill's owner makes carries its [`Fenced`] proof (from
//! [`Ownership::fence`] in the same transaction), so that an owner that lost its claim writes
//! nothing.

use std::collections::{HashMap, HashSet};

use super::backfills::{Backfill, Fenced, Heartbeat, NewBackfill, Owner};
use super::cascades::{PlanOutcome, SucceededTry};
use super::db::Step;
use super::forgets::{Busy, Forget, Scope, Span};
use super::leases::{Judge, LeaseCtx};
use super::pools::{Limits, Take};
use super::publishes::{Current, PendingPublish, Publication};
use super::queries::{BackfillDetail, BackfillSummary, Outcome, Recorded, RunHistory};
use super::runs::{Staged, TryRecord, UnfinishedTry};
use super::status;
use super::workers::Worker;
use super::{Result, backfills, leases, runs};
use crate::clock::End;
use crate::interval::DataInterval;
use crate::liveness::Group;
use crate::plan::{PlanRow, Prior, RunState, SkipReason};
use crate::state::{BackfillKind, BackfillState};

/// The manifest, as a backfill's owner and its writer see it: every role. Commands that only
/// read hold a [`Reads`], which cannot write.
pub trait Store:
    Reads + Ownership + Planning + Running + Publishing + Staging + Forgetting
{
}

impl<T: Reads + Ownership + Planning + Running + Publishing + Staging + Forgetting + ?Sized> Store
    for T
{
}

/// What a backfill and its history hold, read without writing: every command's reads, the checks a writer makes inside its transaction, and all a read-only handle ([`super::Reader`], [`super::open_read_only`]) offers.
pub trait Reads {
    // Backfills and their workers.
    fn backfill(&self, id: i64) -> Result<Option<Backfill>>;
    /// The id of the newest backfill, or of the newest of `kind`; `None` when there is none.
    fn latest_backfill(&self, kind: Option<BackfillKind>) -> Result<Option<i64>>;
    /// The manifest's identity (see [`super::identity`]).
    fn identity(&self) -> Result<String>;
    /// What removing `dag_id`'s history over `range` would take away (see
    /// [`Forgetting::forget`]).
    fn forget_scope(&self, dag_id: &str, range: Option<(i64, i64)>) -> Result<Scope>;
    /// The removals whose warehouse clean-up is not done, oldest first.
    fn unfinished_forgets(&self) -> Result<Vec<Forget>>;
    /// The removals of `dag_id`'s history, oldest first.
    fn forgets_of(&self, dag_id: &str) -> Result<Vec<Forget>>;
    /// The projects whose backfills of `dag_id` the manifest holds (see
    /// [`backfills::dag_projects`]).
    fn dag_projects(&self, dag_id: &str) -> Result<Vec<backfills::DagProject>>;
    /// Which database holds the manifest, when it is PostgreSQL (see [`super::database_key`]).
    fn database_key(&self) -> Result<Option<String>>;
    /// "Now" for judging leases (unix milliseconds): `local`, the caller's clock, on SQLite; the
    /// database's clock on PostgreSQL, which every host shares.
    fn clock_ms(&self, local: i64) -> Result<i64>;
    /// The workers of a backfill (`backfill join`), oldest first.
    fn workers(&self, backfill_id: i64) -> Result<Vec<Worker>>;
    /// Whether a backfill has ever had a worker.
    fn has_workers(&self, backfill_id: i64) -> Result<bool>;
    /// The interval starts that a worker still running holds: its runs in progress, and the
    /// intervals its batches hold (see [`leases::reserve_batch`]).
    fn worker_starts_in_flight(&self, backfill_id: i64) -> Result<HashSet<i64>>;
    /// Whether a run of backfill `backfill_id` succeeded.
    fn any_succeeded(&self, backfill_id: i64) -> Result<bool>;
    /// The running promote backfill of staged backfill `staged`, if any.
    fn promoting(&self, staged: i64) -> Result<Option<i64>>;

    // Leases and plans.
    /// Interval starts of `dag_id` in `[lo, hi]` whose lease is held, as `judge` says.
    fn held_leases(
        &self,
        dag_id: &str,
        lo: i64,
        hi: i64,
        ctx: &LeaseCtx,
        judge: Judge,
    ) -> Result<HashSet<i64>>;
    /// The leases of `dag_id` whose owner is gone: `(interval_start, owner backfill)`. Their owners
    /// are to be recovered (a lease whose run's try is still running after that stays live, see
    /// [`live`]).
    fn stale_leases(&self, dag_id: &str, ctx: &LeaseCtx) -> Result<Vec<(i64, i64)>>;
    /// Whether `backfill_id` still holds the lease of an interval.
    fn holds_lease(&self, backfill_id: i64, dag_id: &str, interval_start: i64) -> Result<bool>;
    /// What the manifest knows about each interval (ascending), for planning: the latest run, and
    /// whether a lease is held as `judge` says. Staged runs publish nothing and rollbacks put back
    /// what earlier runs computed: only the runs of other backfills tell what was computed.
    fn priors(
        &self,
        dag_id: &str,
        intervals: &[DataInterval],
        ctx: &LeaseCtx,
        judge: leases::Judge,
    ) -> Result<Vec<Prior>>;
    /// The latest state of the interval that ends where `start` begins, if any (for
    /// `depends_on_past`).
    fn state_before(&self, dag_id: &str, start: i64) -> Result<Option<RunState>>;
    /// Interval starts that already have a plan row in a backfill.
    fn planned_starts(&self, backfill_id: i64) -> Result<std::collections::HashSet<i64>>;
    /// The planned intervals of a backfill that have not finished (`succeeded`, `failed` or
    /// `rejected`) in it, in plan order.
    fn unfinished_intervals(&self, backfill_id: i64) -> Result<Vec<DataInterval>>;
    /// The latest run of each interval of `dag_id` starting in `[lo, hi]`: its state, backfill and
    /// start time (unix milliseconds).
    fn latest_runs(
        &self,
        dag_id: &str,
        lo: i64,
        hi: i64,
    ) -> Result<HashMap<i64, (RunState, i64, i64)>>;
    /// Whether try `try_id` holds a slot of a pool (none once pool cleanup gave it away).
    fn holds_pool_slot(&self, try_id: i64) -> Result<bool>;

    // Runs and tries.
    /// Whether the backfill of a try's run still holds that interval's lease: a try whose interval
    /// was taken over may neither be let go nor publish.
    fn try_holds_lease(&self, try_id: i64) -> Result<bool>;
    /// Whether a run is still in progress (not abandoned by a taker).
    fn run_in_progress(&self, run_id: i64) -> Result<bool>;
    /// The tries of a backfill's runs that are still running or publishing.
    fn unfinished_tries(&self, claimed: Owner) -> Result<Vec<UnfinishedTry>>;
    /// The runs of a backfill still in progress.
    fn runs_in_progress(&self, claimed: Owner) -> Result<Vec<i64>>;
    /// The interval starts of backfill `backfill_id` whose runs are still queued or running.
    fn starts_in_progress(&self, backfill_id: i64) -> Result<std::collections::HashSet<i64>>;
    /// The lowest id of a try still running or publishing, else one above every try.
    fn first_unfinished_try(&self) -> Result<i64>;
    /// How long (ms) the latest `limit` successful tries of a task took, newest first.
    fn recent_durations_ms(&self, dag_id: &str, task_id: &str, limit: i64) -> Result<Vec<i64>>;

    // Publishes and staged outputs.
    /// The currently published try of a task and interval: `(try_id, rows, fingerprint)`.
    fn published(
        &self,
        dag_id: &str,
        task_id: &str,
        interval_start: i64,
    ) -> Result<Option<(i64, i64, Option<String>)>>;
    /// Tries of a backfill's runs that recorded a publish intent and never finished it.
    fn pending_publishes(&self, claimed: Owner) -> Result<Vec<PendingPublish>>;
    /// Whether a try still has an unfinished publish intent.
    fn is_publishing(&self, try_id: i64) -> Result<bool>;
    /// Whether a try may publish now (see [`super::publishes::may_publish`]).
    fn may_publish(&self, try_id: i64, owner: Option<Owner>, intent: bool) -> Result<bool>;
    /// The staged outputs of a backfill, whatever became of them since, by interval then try.
    fn staged_outputs(&self, backfill_id: i64) -> Result<Vec<Staged>>;
    /// The currently published try of a task and interval, with its rows and content.
    fn current_publication(
        &self,
        dag_id: &str,
        task_id: &str,
        interval_start: i64,
    ) -> Result<Option<Current>>;
    /// The rows of a task's published partitions before an interval, newest first, at most
    /// `limit` (the gate's `history`).
    fn published_history(
        &self,
        dag_id: &str,
        task_id: &str,
        before: i64,
        limit: i64,
    ) -> Result<Vec<i64>>;
    /// Whether a staged try's output still awaits promotion.
    fn is_staged(&self, staged_try: i64) -> Result<bool>;
    /// The tries whose audit files must stay: publishes that were decided (a recovery redoes
    /// them) and staged outputs, kept until promoted or discarded.
    fn needing_audit_files(&self) -> Result<std::collections::HashSet<i64>>;
    /// The tries whose staged tables in a warehouse must stay: staged outputs, and tries still
    /// running (one may have just committed its staged table and not yet recorded it).
    fn keeping_staged_tables(&self) -> Result<std::collections::HashSet<i64>>;

    // Cascades.
    /// Every row of the plan of backfill `backfill_id`, by interval start.
    fn plan_outcomes(&self, backfill_id: i64) -> Result<Vec<PlanOutcome>>;
    /// The state of the latest run of an interval that computed it (staged, rollback and
    /// partial `--tasks` runs left out).
    fn latest_computing_state(&self, dag_id: &str, start: i64) -> Result<Option<RunState>>;
    /// When the latest successful run of an interval of `dag_id` started (unix ms), staged runs
    /// left out: what it read of its upstream is what was published then.
    fn last_success(&self, dag_id: &str, start: i64) -> Result<Option<i64>>;
    /// The succeeded, unstaged tries of an interval in the order they were made: task, fingerprint
    /// and when it ended (unix ms).
    fn succeeded_tries(&self, dag_id: &str, start: i64) -> Result<Vec<SucceededTry>>;
    /// The backfills of the cascade of `root` after `root` itself, oldest first.
    fn cascade_members(&self, root: i64) -> Result<Vec<Backfill>>;
    /// How many planned intervals of backfill `id` have not ended (not started, or cancelled):
    /// a cascade goes on past it only once it has none.
    fn unfinished_count(&self, id: i64) -> Result<i64>;
    /// The running backfill of the cascade of `root` (`root` itself or one of its members), the
    /// newest if several.
    fn running_member(&self, root: i64) -> Result<Option<i64>>;

    // Reports.
    /// Backfills, newest last, optionally of one DAG and/or only the running ones.
    fn list_backfills(
        &self,
        dag_id: Option<&str>,
        active_only: bool,
    ) -> Result<Vec<BackfillSummary>>;
    fn outcome(&self, id: i64) -> Result<Option<Outcome>>;
    /// A backfill and every interval of its plan; `None` when there is no such backfill.
    ///
    /// Three ordered range scans whatever the size, merged here: the backfill's runs in
    /// `(interval_start, id)` index order, their tries in `run_id` index order, and the plan by
    /// primary key. No per-row lookups and no sorts.
    fn show_backfill(&self, id: i64) -> Result<Option<BackfillDetail>>;
    /// A backfill with `limit` of its intervals in time order from the `offset`-th, and the
    /// counts of all of them (a page of the status page).
    fn show_backfill_page(
        &self,
        id: i64,
        offset: i64,
        limit: i64,
    ) -> Result<Option<BackfillDetail>>;
    /// Every run of a DAG whose interval starts in `[lo, hi]`, by interval then attempt: the runs
    /// in index order and their tries in `run_id` order, merged here.
    fn run_history(&self, dag_id: &str, lo: i64, hi: i64) -> Result<Vec<RunHistory>>;
    /// What the succeeded tries of each interval's latest run recorded about the source, for the
    /// intervals of a DAG starting in `[lo, hi]` whose latest run succeeded.
    fn recorded_sources(&self, dag_id: &str, lo: i64, hi: i64) -> Result<Recorded>;
    /// How many intervals between two starts have a latest run that did not succeed, by state.
    fn unsettled(&self, dag_id: &str, lo: i64, hi: i64) -> Result<Vec<(String, i64)>>;

    // The status page (`backfill serve`).
    /// Every try of a backfill's interval starting at `start`, in the order they ran.
    fn interval_tries(&self, backfill_id: i64, start: i64) -> Result<Vec<status::TryView>>;
    /// The pools' slots in use.
    fn pool_slots(&self) -> Result<Vec<status::SlotView>>;
    /// The leases held, by backfill.
    fn lease_views(&self) -> Result<Vec<status::LeaseView>>;
    /// The DAGs with runs, and how many interval starts each has.
    fn run_dags(&self) -> Result<Vec<(String, i64)>>;
    /// Every backfill's id, DAG and state, oldest first.
    fn backfill_heads(&self) -> Result<Vec<(i64, String, crate::state::BackfillState)>>;
    /// One backfill as `list` shows it, with its counts.
    fn backfill_summary(&self, id: i64) -> Result<Option<BackfillSummary>>;
    /// A page of the starts of a DAG's intervals with runs, newest first.
    fn dag_starts(&self, dag_id: &str, limit: i64, skip: i64) -> Result<Vec<i64>>;
    /// The published partitions of a DAG's tasks between two starts (unix seconds, both
    /// included), by task then start.
    fn published_partitions(
        &self,
        dag_id: &str,
        lo: i64,
        hi: i64,
    ) -> Result<Vec<super::publishes::Recorded>>;
    /// The published partitions of a DAG between two starts: `(start, rows)`.
    fn published_starts(&self, dag_id: &str, lo: i64, hi: i64) -> Result<Vec<(i64, i64)>>;
    /// The figures of `/metrics`.
    fn figures(&self) -> Result<status::Figures>;
}

/// Owning a backfill: its record, its epoch (the fence every owner's write carries), heartbeats, workers, takeovers and the leases of its intervals.
pub trait Ownership {
    /// Checks, inside the caller's transaction, that `owner` may still act: its epoch is current
    /// and the backfill is running.
    fn fence(&self, owner: Owner) -> Result<Fenced>;
    /// Records a new backfill owned by this process, its plan still to be written.
    fn insert_backfill(&self, b: &NewBackfill, ctx: &LeaseCtx) -> Result<Owner>;
    /// Records that the plan is complete.
    fn mark_planned(&self, owner: Owner) -> Result<()>;
    /// Records what the backfill's DAG computes now (JSON, see `project::Dag::definition`):
    /// `resume` runs the definition it finds.
    fn record_definition(&self, owner: Owner, definition: &str) -> Result<()>;
    /// Refreshes the owner heartbeat and reads what the owner must do; [`Error::Fenced`] when
    /// another process took the backfill over.
    fn heartbeat(&self, owner: Owner, now_ms: i64) -> Result<Heartbeat>;
    /// Records the end of a backfill by its owner and releases whatever leases it still holds
    /// (`end`: see [`crate::clock::End`]).
    fn finish_backfill(&self, owner: Owner, state: BackfillState, end: End) -> Result<()>;
    /// Asks the process running a backfill to stop (it polls the flag with its heartbeat).
    fn request_cancel(&self, backfill_id: i64) -> Result<()>;
    /// Records this process as a worker of `backfill_id` (found running, its owner alive).
    fn join_backfill(
        &self,
        backfill_id: i64,
        max_active_runs: u32,
        ctx: &LeaseCtx,
    ) -> Result<Owner>;
    /// Takes the leases of a backfill's gone workers away (a new epoch each); returns them.
    fn take_gone_workers(&self, backfill_id: i64, ctx: &LeaseCtx) -> Result<Vec<Owner>>;
    /// Takes the ownership of a backfill whose owner is gone away from it: a new epoch, so that
    /// the old owner, should it wake up, is refused everything. With `me`, this process becomes
    /// the owner and the backfill runs again; without, the backfill ends as `cancelled`. Returns
    /// the new [`Owner`], or `None` when the backfill's owner is alive after all (nothing changed).
    fn take_ownership(&self, backfill_id: i64, ctx: &LeaseCtx, me: bool) -> Result<Option<Owner>>;
    /// Leases `intervals` for `backfill_id`. The caller has checked (in this transaction, with
    /// [`Judge::Strict`]) that no other backfill holds them; a lease of a finished or recovered
    /// backfill is replaced.
    fn take_leases(
        &self,
        backfill_id: i64,
        dag_id: &str,
        intervals: &mut dyn Iterator<Item = DataInterval>,
        ctx: &LeaseCtx,
    ) -> Result<()>;
    /// Releases one lease if `backfill_id` holds it.
    fn release_lease(&self, backfill_id: i64, dag_id: &str, interval_start: i64) -> Result<()>;
    /// Releases every lease of backfill `backfill_id` but those of its runs still queued or
    /// running (tries that could not be stopped keep their intervals in flight).
    fn release_all_but_running(&self, backfill_id: i64) -> Result<()>;
}

/// Writing a backfill's plan.
pub trait Planning {
    /// Writes plan rows (`(ord, row)`) and leases the intervals to run, for the owner.
    fn insert_plan_chunk(
        &self,
        f: Fenced,
        dag_id: &str,
        rows: &[(i64, PlanRow)],
        ctx: &LeaseCtx,
    ) -> Result<()>;
    /// Changes a planned interval to a skip (decided while running, e.g. `depends_on_past`) and
    /// releases its lease.
    fn skip_planned(
        &self,
        f: Fenced,
        dag_id: &str,
        interval_start: i64,
        reason: SkipReason,
    ) -> Result<()>;
    /// Records a planned interval as skipped.
    fn mark_skipped(&self, backfill_id: i64, interval_start: i64, reason: SkipReason)
    -> Result<()>;
    /// Records what an interval's readiness check answered; skips the interval when it is
    /// `not ready` (see [`super::readiness`]).
    fn note_readiness(&self, f: Fenced, asked: &super::readiness::Asked) -> Result<bool>;
}

/// Runs and their tries, from a pool slot to the recorded end, and the repair of those a gone owner left.
pub trait Running: super::db::Answers {
    /// Makes this process's next batch hold what it may of intervals `starts` (see
    /// [`leases::reserve_batch`]).
    fn reserve_batch(
        &self,
        f: Fenced,
        dag_id: &str,
        starts: &[i64],
        want: usize,
        ctx: &LeaseCtx,
    ) -> Result<leases::Reserved>;
    /// Takes a slot of `pool` (of `size`) for try `try_id` if one is free; records that the try
    /// waits for the pool when none is.
    fn take_pool_slot(
        &self,
        f: Fenced,
        pool: &str,
        limits: Limits,
        try_id: i64,
        ctx: &LeaseCtx,
    ) -> Result<Take>;
    /// Records that an interval's run started and its first try (see
    /// [`runs::start_run_and_try`]).
    #[expect(
        clippy::too_many_arguments,
        reason = "a run and its first try, started in one statement batch: the parts of both"
    )]
    fn start_run_and_try(
        &self,
        fenced: Fenced,
        dag_id: &str,
        interval: DataInterval,
        now_ms: i64,
        lease_timeout_ms: i64,
        task_id: &str,
        try_number: u32,
        log: (&str, &str),
        early: Option<runs::Early>,
    ) -> Result<Step<(runs::Start, Option<i64>)>>;
    /// Reserves run ids for starts that need their id first (see [`runs::reserve_run_ids`]).
    fn reserve_run_ids(&self, n: u32) -> Result<Vec<i64>>;
    /// Records a finished run and releases its lease.
    fn finish_run(
        &self,
        _fenced: Fenced,
        run_id: i64,
        state: RunState,
        error: Option<&str>,
        end: End,
    ) -> Result<()>;
    /// Records that a try started; returns its id, or `None` when its run was abandoned or its
    /// interval taken over.
    fn start_try(
        &self,
        fenced: Fenced,
        run_id: i64,
        task_id: &str,
        try_number: u32,
        log_path: &str,
        now_ms: i64,
    ) -> Result<Option<i64>>;
    /// Records the process group of a try before it is let go; `false` when the try is no longer
    /// running (it must then never be let go).
    fn set_try_group(
        &self,
        _fenced: Fenced,
        try_id: i64,
        group: Group,
        host: &str,
    ) -> Result<Step<bool>>;
    /// Records the audit file of a SQL try, so that it can be removed should the owner die.
    fn set_try_audit(&self, _fenced: Fenced, try_id: i64, path: &str) -> Result<()>;
    /// Records the end of a try of the owner.
    fn finish_try(&self, _fenced: Fenced, try_id: i64, rec: &TryRecord, end: End) -> Result<()>;
    /// Records a try's end and its run's end (see [`runs::finish_try_and_run`]).
    #[expect(
        clippy::too_many_arguments,
        reason = "a run's last try and the run, ended in one statement batch: the parts of both"
    )]
    fn finish_try_and_run(
        &self,
        fenced: Fenced,
        try_id: i64,
        rec: &TryRecord,
        run_id: i64,
        state: RunState,
        error: Option<&str>,
        ends: (End, End),
    ) -> Result<Step<()>>;
    /// Records the end of a try that is still running or publishing.
    fn end_try(&self, try_id: i64, rec: &TryRecord, end: End) -> Result<()>;
    /// Records the end of a try of a dead owner (killed, never started, or its publish finished by
    /// the recoverer). Only a try still unfinished changes; returns whether it did.
    fn end_abandoned_try(&self, try_id: i64, rec: &TryRecord, now_ms: i64) -> Result<bool>;
    /// Ends runs of a dead backfill that are still in progress (from `runs`, as claimed): a run
    /// whose every task has a succeeded try succeeded (a crash after its last publish); the others
    /// are cancelled, except those whose interval is still held by a try that could not be stopped
    /// (`keep`). Releases their leases.
    fn end_abandoned_runs(
        &self,
        runs: &[i64],
        task_counts: &dyn Fn(&str) -> Option<usize>,
        keep: &[i64],
        why: &str,
        now_ms: i64,
    ) -> Result<()>;
}

/// Publishing an output: the intent before the warehouse commits, the record after.
pub trait Publishing {
    /// Records the gate's decision to publish before the warehouse is touched: a crash between this
    /// and [`mark_published`] is repaired by redoing the publish from the audit file.
    fn record_publish_intent(
        &self,
        _fenced: Fenced,
        try_id: i64,
        audit_path: Option<&str>,
        rec: &TryRecord,
    ) -> Result<bool>;
    /// Records the decision to publish a group of outputs in one warehouse transaction: every
    /// intent (try id, file, record), or none (`false`).
    fn record_group_intent(
        &self,
        _fenced: Fenced,
        group: &[(i64, Option<String>, TryRecord)],
    ) -> Result<bool>;
    /// Makes a try the published try of its task and interval.
    fn mark_published(&self, p: &Publication<'_>, now_ms: i64) -> Result<()>;
    /// Records that try `try_id` promotes the staged try `staged_try`.
    fn set_promoted_from(&self, try_id: i64, staged_try: i64) -> Result<()>;
}

/// Staged outputs awaiting promotion or discard.
pub trait Staging {
    /// Records what became of a staged output (promoted or discarded); `false` when it was no
    /// longer staged.
    fn set_staged(&self, staged_try: i64, to: crate::state::StagedState) -> Result<bool>;
    /// Discards a staged output unless a promote of it is running: `false` when it was not
    /// discarded.
    fn discard_staged(&self, staged_try: i64) -> Result<bool>;
    /// Once no output of staged backfill `id` awaits promotion, it is complete.
    fn settle_staged(&self, id: i64) -> Result<()>;
}

/// `backfill forget`: a DAG's history removed, and each removal recorded (see
/// [`super::forgets`]).
pub trait Forgetting {
    /// Removes `dag_id`'s history over `range` (`--from` and `--to` as typed, and the interval
    /// starts they select in unix seconds, both included; `None`: all of it) and records the
    /// removal, its warehouse clean-up to do; nothing when a backfill of the DAG runs or holds
    /// staged outputs of the range.
    fn forget(
        &self,
        dag_id: &str,
        range: Span<'_>,
        by: (&str, i64),
        now_ms: i64,
    ) -> Result<std::result::Result<Forget, Busy>>;
    /// Records that removal `id`'s warehouse clean-up is done, `versions` kept versions gone.
    fn finish_forget(&self, id: i64, versions: i64, now_ms: i64) -> Result<()>;
}

mod conn;

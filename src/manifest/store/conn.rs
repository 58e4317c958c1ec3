//! The one implementation of the store's roles: [`Conn`], over the dialect layer of
//! [`super::super::db`], for SQLite and PostgreSQL alike (see the module above for why one).

use std::collections::{HashMap, HashSet};

use super::super::backfills::{Backfill, Fenced, Heartbeat, NewBackfill, Owner};
use super::super::cascades::{PlanOutcome, SucceededTry};
use super::super::db::{Conn, Step};
use super::super::forgets::{self, Busy, Forget, Scope, Span};
use super::super::leases::{Judge, LeaseCtx};
use super::super::pools::{Limits, Take};
use super::super::publishes::{Current, PendingPublish, Publication};
use super::super::queries::{BackfillDetail, BackfillSummary, Outcome, Recorded, RunHistory};
use super::super::runs::{Staged, TryRecord, UnfinishedTry};
use super::super::status;
use super::super::workers::{self, Worker};
use super::super::{Result, backfills, cascades, leases, plans, pools, publishes, queries, runs};
use super::{Forgetting, Ownership, Planning, Publishing, Reads, Running, Staging};
use crate::clock::End;
use crate::interval::DataInterval;
use crate::liveness::Group;
use crate::plan::{PlanRow, Prior, RunState, SkipReason};
use crate::state::{BackfillKind, BackfillState};

impl Conn {
    /// `ctx` at the manifest's "now" (see [`Conn::now_ms`]).
    fn at<'a>(&self, ctx: &'a LeaseCtx) -> Result<std::borrow::Cow<'a, LeaseCtx>> {
        Ok(if self.is_postgres() {
            std::borrow::Cow::Owned(ctx.clone().at_manifest(self)?)
        } else {
            std::borrow::Cow::Borrowed(ctx)
        })
    }
}

// The manifest: a connection inside the writer's transaction, or a read-only one. Times the
// callers pass are replaced by the database's on PostgreSQL (see [`Conn::now_ms`]).
impl Reads for Conn {
    fn backfill(&self, id: i64) -> Result<Option<Backfill>> {
        backfills::get(self, id)
    }
    fn latest_backfill(&self, kind: Option<BackfillKind>) -> Result<Option<i64>> {
        backfills::latest(self, kind)
    }
    fn identity(&self) -> Result<String> {
        Ok(self.query_row("SELECT id FROM identity", [], |r| r.get(0))?)
    }
    fn forget_scope(&self, dag_id: &str, range: Option<(i64, i64)>) -> Result<Scope> {
        forgets::scope(self, dag_id, range)
    }
    fn unfinished_forgets(&self) -> Result<Vec<Forget>> {
        forgets::unfinished(self)
    }
    fn forgets_of(&self, dag_id: &str) -> Result<Vec<Forget>> {
        forgets::of_dag(self, dag_id)
    }
    fn dag_projects(&self, dag_id: &str) -> Result<Vec<backfills::DagProject>> {
        backfills::dag_projects(self, dag_id)
    }
    fn database_key(&self) -> Result<Option<String>> {
        if !self.is_postgres() {
            return Ok(None);
        }
        Ok(Some(
            self.query_row(crate::pg::DATABASE_KEY, [], |r| r.get(0))?,
        ))
    }
    fn clock_ms(&self, local: i64) -> Result<i64> {
        Ok(self.now_ms(local)?)
    }
    fn workers(&self, backfill_id: i64) -> Result<Vec<Worker>> {
        workers::of(self, backfill_id)
    }
    fn has_workers(&self, backfill_id: i64) -> Result<bool> {
        workers::any(self, backfill_id)
    }
    fn worker_starts_in_flight(&self, backfill_id: i64) -> Result<HashSet<i64>> {
        workers::starts_in_flight(self, backfill_id)
    }
    fn any_succeeded(&self, backfill_id: i64) -> Result<bool> {
        runs::any_succeeded(self, backfill_id)
    }
    fn promoting(&self, staged: i64) -> Result<Option<i64>> {
        backfills::promoting(self, staged)
    }
    fn held_leases(
        &self,
        dag_id: &str,
        lo: i64,
        hi: i64,
        ctx: &LeaseCtx,
        judge: Judge,
    ) -> Result<HashSet<i64>> {
        let ctx = &*self.at(ctx)?;
        leases::held(self, dag_id, lo, hi, ctx, judge)
    }
    fn stale_leases(&self, dag_id: &str, ctx: &LeaseCtx) -> Result<Vec<(i64, i64)>> {
        let ctx = &*self.at(ctx)?;
        leases::stale(self, dag_id, ctx)
    }
    fn holds_lease(&self, backfill_id: i64, dag_id: &str, interval_start: i64) -> Result<bool> {
        leases::holds(self, backfill_id, dag_id, interval_start)
    }
    fn priors(
        &self,
        dag_id: &str,
        intervals: &[DataInterval],
        ctx: &LeaseCtx,
        judge: leases::Judge,
    ) -> Result<Vec<Prior>> {
        let ctx = &*self.at(ctx)?;
        plans::priors(self, dag_id, intervals, ctx, judge)
    }
    fn state_before(&self, dag_id: &str, start: i64) -> Result<Option<RunState>> {
        plans::state_before(self, dag_id, start)
    }
    fn planned_starts(&self, backfill_id: i64) -> Result<std::collections::HashSet<i64>> {
        plans::planned_starts(self, backfill_id)
    }
    fn unfinished_intervals(&self, backfill_id: i64) -> Result<Vec<DataInterval>> {
        plans::unfinished(self, backfill_id)
    }
    fn latest_runs(
        &self,
        dag_id: &str,
        lo: i64,
        hi: i64,
    ) -> Result<HashMap<i64, (RunState, i64, i64)>> {
        plans::latest_runs(self, dag_id, lo, hi)
    }
    fn holds_pool_slot(&self, try_id: i64) -> Result<bool> {
        pools::holds(self, try_id)
    }
    fn try_holds_lease(&self, try_id: i64) -> Result<bool> {
        runs::try_holds_lease(self, try_id)
    }
    fn run_in_progress(&self, run_id: i64) -> Result<bool> {
        runs::in_progress(self, run_id)
    }
    fn unfinished_tries(&self, claimed: Owner) -> Result<Vec<UnfinishedTry>> {
        runs::unfinished_tries(self, claimed)
    }
    fn runs_in_progress(&self, claimed: Owner) -> Result<Vec<i64>> {
        runs::runs_in_progress(self, claimed)
    }
    fn starts_in_progress(&self, backfill_id: i64) -> Result<std::collections::HashSet<i64>> {
        runs::starts_in_progress(self, backfill_id)
    }
    fn first_unfinished_try(&self) -> Result<i64> {
        runs::first_unfinished_try(self)
    }
    fn recent_durations_ms(&self, dag_id: &str, task_id: &str, limit: i64) -> Result<Vec<i64>> {
        queries::recent_durations_ms(self, dag_id, task_id, limit)
    }
    fn published(
        &self,
        dag_id: &str,
        task_id: &str,
        interval_start: i64,
    ) -> Result<Option<(i64, i64, Option<String>)>> {
        publishes::published(self, dag_id, task_id, interval_start)
    }
    fn pending_publishes(&self, claimed: Owner) -> Result<Vec<PendingPublish>> {
        publishes::pending_publishes(self, claimed)
    }
    fn is_publishing(&self, try_id: i64) -> Result<bool> {
        publishes::publishing(self, try_id)
    }
    fn may_publish(&self, try_id: i64, owner: Option<Owner>, intent: bool) -> Result<bool> {
        publishes::may_publish(self, try_id, owner, intent)
    }
    fn staged_outputs(&self, backfill_id: i64) -> Result<Vec<Staged>> {
        runs::staged(self, backfill_id)
    }
    fn current_publication(
        &self,
        dag_id: &str,
        task_id: &str,
        interval_start: i64,
    ) -> Result<Option<Current>> {
        publishes::current(self, dag_id, task_id, interval_start)
    }
    fn published_history(
        &self,
        dag_id: &str,
        task_id: &str,
        before: i64,
        limit: i64,
    ) -> Result<Vec<i64>> {
        publishes::history(self, dag_id, task_id, before, limit)
    }
    fn is_staged(&self, staged_try: i64) -> Result<bool> {
        runs::is_staged(self, staged_try)
    }
    fn needing_audit_files(&self) -> Result<std::collections::HashSet<i64>> {
        runs::needing_audit_files(self)
    }
    fn keeping_staged_tables(&self) -> Result<std::collections::HashSet<i64>> {
        runs::keeping_staged_tables(self)
    }
    fn plan_outcomes(&self, backfill_id: i64) -> Result<Vec<PlanOutcome>> {
        cascades::plan_outcomes(self, backfill_id)
    }
    fn latest_computing_state(&self, dag_id: &str, start: i64) -> Result<Option<RunState>> {
        Ok(cascades::latest_state(self, dag_id, start)?)
    }
    fn last_success(&self, dag_id: &str, start: i64) -> Result<Option<i64>> {
        Ok(cascades::last_success(self, dag_id, start)?)
    }
    fn succeeded_tries(&self, dag_id: &str, start: i64) -> Result<Vec<SucceededTry>> {
        Ok(cascades::succeeded_tries(self, dag_id, start)?)
    }
    fn cascade_members(&self, root: i64) -> Result<Vec<Backfill>> {
        cascades::members(self, root)
    }
    fn unfinished_count(&self, id: i64) -> Result<i64> {
        cascades::unfinished(self, id)
    }
    fn running_member(&self, root: i64) -> Result<Option<i64>> {
        cascades::running_member(self, root)
    }
    fn list_backfills(
        &self,
        dag_id: Option<&str>,
        active_only: bool,
    ) -> Result<Vec<BackfillSummary>> {
        queries::list(self, dag_id, active_only)
    }
    fn outcome(&self, id: i64) -> Result<Option<Outcome>> {
        queries::outcome(self, id)
    }
    fn show_backfill(&self, id: i64) -> Result<Option<BackfillDetail>> {
        queries::show(self, id)
    }
    fn show_backfill_page(
        &self,
        id: i64,
        offset: i64,
        limit: i64,
    ) -> Result<Option<BackfillDetail>> {
        queries::show_page(self, id, offset, limit)
    }
    fn run_history(&self, dag_id: &str, lo: i64, hi: i64) -> Result<Vec<RunHistory>> {
        queries::runs(self, dag_id, lo, hi)
    }
    fn recorded_sources(&self, dag_id: &str, lo: i64, hi: i64) -> Result<Recorded> {
        queries::recorded_sources(self, dag_id, lo, hi)
    }
    fn unsettled(&self, dag_id: &str, lo: i64, hi: i64) -> Result<Vec<(String, i64)>> {
        queries::unsettled(self, dag_id, lo, hi)
    }
    fn interval_tries(&self, backfill_id: i64, start: i64) -> Result<Vec<status::TryView>> {
        status::interval_tries(self, backfill_id, start)
    }
    fn pool_slots(&self) -> Result<Vec<status::SlotView>> {
        status::pool_slots(self)
    }
    fn lease_views(&self) -> Result<Vec<status::LeaseView>> {
        status::leases(self)
    }
    fn run_dags(&self) -> Result<Vec<(String, i64)>> {
        status::dags(self)
    }
    fn backfill_heads(&self) -> Result<Vec<(i64, String, crate::state::BackfillState)>> {
        status::heads(self)
    }
    fn backfill_summary(&self, id: i64) -> Result<Option<BackfillSummary>> {
        queries::list_one(self, id)
    }
    fn dag_starts(&self, dag_id: &str, limit: i64, skip: i64) -> Result<Vec<i64>> {
        status::dag_starts(self, dag_id, limit, skip)
    }
    fn published_partitions(
        &self,
        dag_id: &str,
        lo: i64,
        hi: i64,
    ) -> Result<Vec<publishes::Recorded>> {
        publishes::partitions(self, dag_id, lo, hi)
    }
    fn published_starts(&self, dag_id: &str, lo: i64, hi: i64) -> Result<Vec<(i64, i64)>> {
        status::published(self, dag_id, lo, hi)
    }
    fn figures(&self) -> Result<status::Figures> {
        status::figures(self)
    }
}

impl Ownership for Conn {
    fn fence(&self, owner: Owner) -> Result<Fenced> {
        backfills::fence(self, owner)
    }
    fn insert_backfill(&self, b: &NewBackfill, ctx: &LeaseCtx) -> Result<Owner> {
        let ctx = &*self.at(ctx)?;
        backfills::insert(self, b, ctx)
    }
    fn mark_planned(&self, owner: Owner) -> Result<()> {
        backfills::planned(self, owner)
    }
    fn record_definition(&self, owner: Owner, definition: &str) -> Result<()> {
        backfills::record_definition(self, owner, definition)
    }
    fn heartbeat(&self, owner: Owner, now_ms: i64) -> Result<Heartbeat> {
        let now_ms = self.now_ms(now_ms)?;
        let fenced = backfills::fence(self, owner)?;
        match owner.worker {
            Some(worker) => workers::heartbeat(self, owner.backfill_id, worker, now_ms),
            None => backfills::heartbeat(self, fenced, now_ms),
        }
    }
    fn finish_backfill(&self, owner: Owner, state: BackfillState, end: End) -> Result<()> {
        let end = self.at_manifest(end)?;
        let fenced = backfills::fence(self, owner)?;
        match owner.worker {
            Some(worker) => workers::finish(self, worker, state, end.now_ms),
            None => backfills::finish(self, fenced, state, end),
        }
    }
    fn request_cancel(&self, backfill_id: i64) -> Result<()> {
        backfills::request_cancel(self, backfill_id)
    }
    fn join_backfill(
        &self,
        backfill_id: i64,
        max_active_runs: u32,
        ctx: &LeaseCtx,
    ) -> Result<Owner> {
        let ctx = &*self.at(ctx)?;
        workers::join(self, backfill_id, max_active_runs, ctx)
    }
    fn take_gone_workers(&self, backfill_id: i64, ctx: &LeaseCtx) -> Result<Vec<Owner>> {
        let ctx = &*self.at(ctx)?;
        workers::take_gone(self, backfill_id, ctx)
    }
    fn take_ownership(&self, backfill_id: i64, ctx: &LeaseCtx, me: bool) -> Result<Option<Owner>> {
        let ctx = &*self.at(ctx)?;
        backfills::take_ownership(self, backfill_id, ctx, me)
    }
    fn take_leases(
        &self,
        backfill_id: i64,
        dag_id: &str,
        intervals: &mut dyn Iterator<Item = DataInterval>,
        ctx: &LeaseCtx,
    ) -> Result<()> {
        let ctx = &*self.at(ctx)?;
        leases::take(self, backfill_id, dag_id, intervals, ctx)
    }
    fn release_lease(&self, backfill_id: i64, dag_id: &str, interval_start: i64) -> Result<()> {
        leases::release(self, backfill_id, dag_id, interval_start)
    }
    fn release_all_but_running(&self, backfill_id: i64) -> Result<()> {
        leases::release_all_but_running(self, backfill_id)
    }
}

impl Planning for Conn {
    fn insert_plan_chunk(
        &self,
        f: Fenced,
        dag_id: &str,
        rows: &[(i64, PlanRow)],
        ctx: &LeaseCtx,
    ) -> Result<()> {
        let ctx = &*self.at(ctx)?;
        plans::insert_chunk(self, f, dag_id, rows, ctx)
    }
    fn skip_planned(
        &self,
        f: Fenced,
        dag_id: &str,
        interval_start: i64,
        reason: SkipReason,
    ) -> Result<()> {
        plans::skip_planned(self, f, dag_id, interval_start, reason)
    }
    fn mark_skipped(
        &self,
        backfill_id: i64,
        interval_start: i64,
        reason: SkipReason,
    ) -> Result<()> {
        plans::mark_skipped(self, backfill_id, interval_start, reason)
    }
    fn note_readiness(&self, f: Fenced, asked: &super::super::readiness::Asked) -> Result<bool> {
        super::super::readiness::note(self, f, asked)
    }
}

impl Running for Conn {
    fn reserve_batch(
        &self,
        f: Fenced,
        dag_id: &str,
        starts: &[i64],
        want: usize,
        ctx: &LeaseCtx,
    ) -> Result<leases::Reserved> {
        let holder = f.owner().worker.unwrap_or(0);
        let ctx = &*self.at(ctx)?;
        leases::reserve_batch(self, (f.backfill_id(), holder), dag_id, starts, want, ctx)
    }
    fn take_pool_slot(
        &self,
        f: Fenced,
        pool: &str,
        limits: Limits,
        try_id: i64,
        ctx: &LeaseCtx,
    ) -> Result<Take> {
        let ctx = &*self.at(ctx)?;
        pools::take(self, f, pool, limits, try_id, ctx)
    }
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
    ) -> Result<Step<(runs::Start, Option<i64>)>> {
        let now_ms = self.now_ms(now_ms)?;
        runs::start_run_and_try(
            self,
            fenced,
            dag_id,
            interval,
            now_ms,
            lease_timeout_ms,
            task_id,
            try_number,
            log,
            early,
        )
    }
    fn reserve_run_ids(&self, n: u32) -> Result<Vec<i64>> {
        runs::reserve_run_ids(self, n)
    }
    fn finish_run(
        &self,
        _fenced: Fenced,
        run_id: i64,
        state: RunState,
        error: Option<&str>,
        end: End,
    ) -> Result<()> {
        let end = self.at_manifest(end)?;
        runs::finish_run(self, _fenced, run_id, state, error, end)
    }
    fn start_try(
        &self,
        fenced: Fenced,
        run_id: i64,
        task_id: &str,
        try_number: u32,
        log_path: &str,
        now_ms: i64,
    ) -> Result<Option<i64>> {
        let now_ms = self.now_ms(now_ms)?;
        runs::start_try(self, fenced, run_id, task_id, try_number, log_path, now_ms)
    }
    fn set_try_group(
        &self,
        _fenced: Fenced,
        try_id: i64,
        group: Group,
        host: &str,
    ) -> Result<Step<bool>> {
        runs::set_try_group(self, _fenced, try_id, group, host)
    }
    fn set_try_audit(&self, _fenced: Fenced, try_id: i64, path: &str) -> Result<()> {
        runs::set_try_audit(self, _fenced, try_id, path)
    }
    fn finish_try(&self, _fenced: Fenced, try_id: i64, rec: &TryRecord, end: End) -> Result<()> {
        let end = self.at_manifest(end)?;
        runs::finish_try(self, _fenced, try_id, rec, end)
    }
    fn finish_try_and_run(
        &self,
        fenced: Fenced,
        try_id: i64,
        rec: &TryRecord,
        run_id: i64,
        state: RunState,
        error: Option<&str>,
        (try_end, run_end): (End, End),
    ) -> Result<Step<()>> {
        let ends = (self.at_manifest(try_end)?, self.at_manifest(run_end)?);
        runs::finish_try_and_run(self, fenced, try_id, rec, run_id, state, error, ends)
    }
    fn end_try(&self, try_id: i64, rec: &TryRecord, end: End) -> Result<()> {
        let end = self.at_manifest(end)?;
        runs::end_try(self, try_id, rec, end)
    }
    fn end_abandoned_try(&self, try_id: i64, rec: &TryRecord, now_ms: i64) -> Result<bool> {
        let now_ms = self.now_ms(now_ms)?;
        runs::end_abandoned_try(self, try_id, rec, now_ms)
    }
    fn end_abandoned_runs(
        &self,
        runs: &[i64],
        task_counts: &dyn Fn(&str) -> Option<usize>,
        keep: &[i64],
        why: &str,
        now_ms: i64,
    ) -> Result<()> {
        let now_ms = self.now_ms(now_ms)?;
        runs::end_abandoned_runs(self, runs, task_counts, keep, why, now_ms)
    }
}

impl Publishing for Conn {
    fn record_publish_intent(
        &self,
        _fenced: Fenced,
        try_id: i64,
        audit_path: Option<&str>,
        rec: &TryRecord,
    ) -> Result<bool> {
        publishes::record_publish_intent(self, _fenced, try_id, audit_path, rec)
    }
    fn record_group_intent(
        &self,
        fenced: Fenced,
        group: &[(i64, Option<String>, TryRecord)],
    ) -> Result<bool> {
        publishes::record_group_intent(self, fenced, group)
    }
    fn mark_published(&self, p: &Publication<'_>, now_ms: i64) -> Result<()> {
        let now_ms = self.now_ms(now_ms)?;
        publishes::mark_published(self, p, now_ms)
    }
    fn set_promoted_from(&self, try_id: i64, staged_try: i64) -> Result<()> {
        runs::set_promoted_from(self, try_id, staged_try)
    }
}

impl Forgetting for Conn {
    fn forget(
        &self,
        dag_id: &str,
        range: Span<'_>,
        by: (&str, i64),
        now_ms: i64,
    ) -> Result<std::result::Result<Forget, Busy>> {
        forgets::forget(self, dag_id, range, by, now_ms)
    }
    fn finish_forget(&self, id: i64, versions: i64, now_ms: i64) -> Result<()> {
        forgets::finish(self, id, versions, now_ms)
    }
}

impl Staging for Conn {
    fn set_staged(&self, staged_try: i64, to: crate::state::StagedState) -> Result<bool> {
        runs::set_staged(self, staged_try, to)
    }
    fn discard_staged(&self, staged_try: i64) -> Result<bool> {
        runs::discard_staged(self, staged_try)
    }
    fn settle_staged(&self, id: i64) -> Result<()> {
        backfills::settle_staged(self, id)
    }
}

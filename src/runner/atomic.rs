//! `promote --atomic`: every staged output of a promote published in one warehouse
//! transaction, or none. Each output is claimed and judged again by the gate as by a promote of
//! its own; the decision to publish them all is recorded in one manifest transaction; one
//! warehouse transaction publishes them (see [`crate::warehouse::publish_group`]);
//! then each try's end is recorded. A crash after the decision is finished by recovery, all
//! outputs together; before it, nothing was published, and `resume` promotes them again.

use std::sync::Arc;

use tokio::sync::watch;

use super::outcome::{Outcome, cancelled, failed, settle, start_single};
use super::promote::judge_again;
use super::record::{Claimed, LastTry, Published, Started, published_try, record_ends};
use super::sql_try::TryLog;
use super::{Event, Mode, Shared, StagedTry, Stop};
use crate::exit::Error;
use crate::gate::Verdict;
use crate::interval::DataInterval;
use crate::manifest::{self, TryRecord};
use crate::plan::RunState;
use crate::project::{Task, TaskKind};
use crate::state::TryState;
use crate::warehouse::{self, backend};

/// One staged output of the group, claimed by its promoting try.
struct Member {
    /// Its task, by index in the DAG.
    task: usize,
    interval: DataInterval,
    started: Started,
    staged: StagedTry,
    /// Judged: its record, whether it publishes an empty partition, its reopened output and
    /// what is published now. `None` until judged, or when it did not pass.
    judged: Option<Judged>,
    /// How it ended, once decided.
    outcome: Option<Outcome>,
}

struct Judged {
    record: TryRecord,
    empty: bool,
    output: Box<dyn backend::Pending>,
    current: Option<manifest::publishes::Current>,
}

/// Promotes the staged outputs of `intervals` all at once; records every run's end.
pub(super) async fn run(
    shared: &Arc<Shared>,
    intervals: Vec<DataInterval>,
    stop: &watch::Receiver<Stop>,
) -> Result<(), Error> {
    let Mode::PromoteAtomic(staged) = &shared.spec.mode else {
        return Err(Error::Internal(
            "an atomic promote without staged outputs".into(),
        ));
    };
    let began = tokio::time::Instant::now();
    let tz = shared.spec.dag.tz;
    let tasks = &shared.spec.dag.tasks;
    let mut members: Vec<Member> = Vec::new();
    // Runs by interval: (interval, run id, its members' indexes).
    let mut runs: Vec<(DataInterval, i64, Vec<usize>)> = Vec::new();
    // Why the group cannot publish, once known.
    let mut trouble: Option<Trouble> = None;
    'claim: for interval in intervals {
        let mut run_id = None;
        let mut here = Vec::new();
        for (i, task) in tasks.iter().enumerate() {
            let Some(s) = staged.get(&(interval.start.timestamp(), task.id.clone())) else {
                continue;
            };
            if *stop.borrow() != Stop::Run {
                trouble = Some(Trouble::Stopped("cancelled".into()));
            } else if !matches!(task.kind, TaskKind::Sql(_)) {
                trouble = Some(Trouble::Refused(format!(
                    "task `{}` is not a SQL task: its publish cannot share a transaction",
                    task.id
                )));
            } else {
                match start_single(shared, task, interval, &mut run_id, Some(s.try_id)).await? {
                    Claimed::Started(started) => {
                        here.push(members.len());
                        members.push(Member {
                            task: i,
                            interval,
                            started,
                            staged: s.clone(),
                            judged: None,
                            outcome: None,
                        });
                    }
                    // Promoted or discarded since: nothing of it to publish.
                    Claimed::Gone => {}
                    // Cancelled, or another process's now: what was claimed is let go, to be
                    // promoted again (all of it) by `resume`.
                    Claimed::TakenOver | Claimed::Busy | Claimed::Halted | Claimed::Stale => {
                        trouble = Some(Trouble::Stopped(format!(
                            "{} of task `{}` could not be claimed (cancelled, or another process's now)",
                            label(interval, tz),
                            task.id
                        )));
                    }
                    Claimed::UpstreamNotReady => {
                        trouble = Some(Trouble::Stopped(format!(
                            "{} of task `{}` waits for its upstream",
                            label(interval, tz),
                            task.id
                        )));
                    }
                }
            }
            if trouble.is_some() {
                if let Some(run) = run_id {
                    runs.push((interval, run, here));
                }
                break 'claim;
            }
        }
        match run_id {
            Some(run) => runs.push((interval, run, here)),
            None => super::skip(shared, interval, crate::plan::SkipReason::NothingStaged).await?,
        }
    }
    if trouble.is_none() {
        trouble = judge(shared, &mut members).await?.map(Trouble::Refused);
    }
    if trouble.is_none() && *stop.borrow() != Stop::Run {
        // Stopped while it judged: nothing is decided yet.
        trouble = Some(Trouble::Stopped("cancelled".into()));
    }
    match trouble {
        Some(why) => refuse(&mut members, &why),
        None => publish(shared, &mut members).await?,
    }
    // Every run's end, with its members' tries, in one manifest transaction.
    let mut ends = Vec::with_capacity(runs.len());
    let mut finished = Vec::with_capacity(runs.len());
    for (interval, run_id, here) in runs {
        let mut state = RunState::Succeeded;
        let mut error = None;
        let mut tries: Vec<LastTry> = Vec::new();
        for &m in &here {
            let member = &mut members[m];
            let task = &tasks[member.task];
            let outcome = member
                .outcome
                .take()
                .unwrap_or_else(|| cancelled("cancelled"));
            let (end, last) = settle(shared, outcome, &member.started, task, interval);
            let (s, e) = match end.run_end(&task.id, shared.fault()) {
                Some((s, e)) => (s, Some(e)),
                None => (RunState::Succeeded, None),
            };
            if rank(s) > rank(state) {
                (state, error) = (s, e);
            }
            tries.extend(last);
        }
        finished.push((interval, state, error.clone()));
        ends.push((run_id, tries, (state, error)));
    }
    record_ends(shared, ends).await?;
    for (interval, state, error) in finished {
        let _ = shared.events.send(Event::IntervalFinished {
            interval,
            state,
            elapsed: began.elapsed(),
            error,
        });
    }
    Ok(())
}

/// Which of two run states a run with both ends in.
fn rank(s: RunState) -> u8 {
    match s {
        RunState::Rejected => 3,
        RunState::Failed => 2,
        RunState::Cancelled => 1,
        _ => 0,
    }
}

/// Judges every member again, against what is published now (each one, so that every
/// rejection is told): why the group cannot publish, if it cannot.
async fn judge(shared: &Arc<Shared>, members: &mut [Member]) -> Result<Option<String>, Error> {
    let manifest = crate::manifest::identity(&shared.spec.manifest_path)?;
    let tz = shared.spec.dag.tz;
    let mut trouble = None;
    for m in members.iter_mut() {
        let task = &shared.spec.dag.tasks[m.task];
        let TaskKind::Sql(sql) = &task.kind else {
            continue;
        };
        let mut log = TryLog::open(&m.started.log);
        log.line(&format!(
            "promoting the output staged by try {} ({}), with every other staged output of the promote at once",
            m.staged.try_id, m.staged.path
        ));
        let reopened = warehouse::backend_of(&sql.warehouse).staged(
            sql,
            &m.staged.path,
            &manifest,
            m.started.try_id,
        );
        // A member that cannot be judged fails, and so does the group.
        let mut fail = |m: &mut Member, why: String| {
            log.line(&why);
            trouble.get_or_insert(format!(
                "task `{}`, {}: {why}",
                task.id,
                label(m.interval, tz)
            ));
            m.outcome = Some(failed(why, None));
        };
        let Some(output) = reopened else {
            fail(
                m,
                format!(
                    "the staged output {} is gone; stage the interval again",
                    m.staged.path
                ),
            );
            continue;
        };
        let current = published_try(shared, task, m.interval).await?;
        let repr = shared
            .reprs
            .lock()
            .ok()
            .and_then(|r| r.get(&task.id).copied().flatten());
        let (output, planned) =
            super::promote::plan_now(shared, task, sql, m.interval, repr, output).await?;
        let planned = match planned {
            Ok(planned) => planned,
            Err(why) => {
                output.keep();
                fail(m, why);
                continue;
            }
        };
        match judge_again(
            shared,
            task,
            &m.staged,
            current.as_ref().map(|c| c.rows),
            planned,
        ) {
            Ok((record, verdict)) => {
                log.line(&format!(
                    "rows {} (published {}): {verdict}",
                    record.rows.unwrap_or(0),
                    current.as_ref().map_or("-".into(), |c| c.rows.to_string()),
                ));
                m.judged = Some(Judged {
                    record,
                    empty: verdict == Verdict::PublishEmpty,
                    output,
                    current,
                });
            }
            Err(outcome) => {
                output.keep();
                let why = match outcome.as_ref() {
                    Outcome::Rejected(_, why) => format!("rejected: {why}"),
                    Outcome::Failed(TryRecord {
                        error: Some(why), ..
                    }) => why.clone(),
                    _ => "not judged".into(),
                };
                log.line(&why);
                trouble.get_or_insert(format!(
                    "task `{}`, {}: {why}",
                    task.id,
                    label(m.interval, tz)
                ));
                m.outcome = Some(*outcome);
            }
        }
    }
    Ok(trouble)
}

/// Why a group publishes nothing.
enum Trouble {
    /// Stopped before it could decide (cancelled, taken over, an interval it could not claim):
    /// its members end `cancelled`, and `resume` promotes them again, all at once.
    Stopped(String),
    /// Decided against: an output was rejected, is gone, or was refused by the target. Its
    /// members end `failed` (the outputs stay staged, for a later `promote`).
    Refused(String),
}

/// Nothing publishes: every member that has no outcome of its own yet ends as not published,
/// saying why; its staged output stays, for `diff` and a later `promote`.
fn refuse(members: &mut [Member], trouble: &Trouble) {
    let (state, why) = match trouble {
        Trouble::Stopped(why) => (TryState::Cancelled, why),
        Trouble::Refused(why) => (TryState::Failed, why),
    };
    for m in members.iter_mut() {
        if let Some(j) = m.judged.take() {
            j.output.keep();
        }
        if m.outcome.is_none() {
            let text = format!("not published: {why}; `promote --atomic` publishes all or none");
            TryLog::open(&m.started.log).line(&text);
            let mut rec = TryRecord::new(state);
            rec.error = Some(text);
            rec.promoted_from = Some(m.staged.try_id);
            m.outcome = Some(match state {
                TryState::Cancelled => Outcome::Cancelled(rec),
                _ => Outcome::Failed(rec),
            });
        }
    }
}

/// Records the decision to publish every member, publishes them in one warehouse
/// transaction, and sets each one's outcome.
async fn publish(shared: &Arc<Shared>, members: &mut [Member]) -> Result<(), Error> {
    if !record_intents(shared, members).await? {
        return Ok(());
    }
    crate::fault::point("before-publish");
    // What the blocking publish takes: each output and how to publish it.
    // Its record stays here, by member: what was judged is what its try records.
    let mut group: Group = Vec::new();
    let mut records: Vec<Option<TryRecord>> = vec![None; members.len()];
    for (k, m) in members.iter_mut().enumerate() {
        if let Some(j) = m.judged.take() {
            let prepared = Prepared::of(shared, m, &j);
            records[k] = Some(j.record);
            group.push((k, j.output, prepared));
        }
    }
    let (group, result) = publish_blocking(shared, members, group).await?;
    match result {
        Ok(rows) => {
            published(shared, members, group, rows, records);
            Ok(())
        }
        Err(warehouse::Error::Refused) => {
            for (_, output, _) in group {
                output.keep();
            }
            refuse(
                members,
                &Trouble::Stopped("taken over by another process before publishing".into()),
            );
            Ok(())
        }
        Err(e) => not_published(shared, members, group, &e).await,
    }
}

/// The members' outputs, each with its member's place and how to publish it.
type Group = Vec<(usize, Box<dyn backend::Pending>, Prepared)>;

/// Records the decision to publish every judged member, in one manifest transaction: whether
/// it stands (refused, the members say why).
async fn record_intents(shared: &Arc<Shared>, members: &mut [Member]) -> Result<bool, Error> {
    let owner = shared.spec.owner;
    let intents: Vec<(i64, Option<String>, TryRecord)> = members
        .iter()
        .filter_map(|m| {
            let j = m.judged.as_ref()?;
            Some((
                m.started.try_id,
                j.output.file().map(|p| p.display().to_string()),
                j.record.clone(),
            ))
        })
        .collect();
    if intents.is_empty() {
        return Ok(false);
    }
    crate::fault::point("before-intent");
    let decided = shared
        .writer
        .call(move |c| c.record_group_intent(c.fence(owner)?, &intents))
        .await;
    match decided {
        Ok(true) => Ok(true),
        Ok(false) => {
            refuse(
                members,
                &Trouble::Stopped("taken over by another process".into()),
            );
            Ok(false)
        }
        Err(e) => {
            refuse(
                members,
                &Trouble::Stopped(format!("cannot record the decision: {e}")),
            );
            Err(e.into())
        }
    }
}

/// Publishes the group in one warehouse transaction that the manifest must still allow for
/// every member, on the blocking pool: the group back, with each one's rows or why none.
async fn publish_blocking(
    shared: &Arc<Shared>,
    members: &[Member],
    mut group: Group,
) -> Result<(Group, Result<Vec<i64>, warehouse::Error>), Error> {
    let owner = shared.spec.owner;
    let tries: Vec<i64> = group
        .iter()
        .map(|(k, _, _)| members[*k].started.try_id)
        .collect();
    let first_log = members[group[0].0].started.log.clone();
    let spawned = Arc::clone(shared);
    tokio::task::spawn_blocking(move || {
        let shared = spawned;
        let result = match manifest::Reader::take(&shared.spec.manifest_path) {
            Ok(reader) => {
                let allowed = || {
                    for t in &tries {
                        if !reader
                            .may_publish(*t, Some(owner), true)
                            .map_err(crate::warehouse::AskError::from)?
                        {
                            return Ok(false);
                        }
                    }
                    Ok(true)
                };
                let mut pairs: Vec<(
                    &mut (dyn backend::Pending + 'static),
                    backend::PublishAs<'_>,
                )> = group
                    .iter_mut()
                    .map(|(_, output, p)| (output.as_mut(), p.publish_as(&shared)))
                    .collect();
                let mut noted = false;
                let mut waiting = || {
                    if !std::mem::replace(&mut noted, true) {
                        TryLog::open(&first_log)
                            .line("the warehouse is locked by another writer; waiting for it");
                    }
                };
                warehouse::publish_group(&mut pairs, &allowed, &mut waiting)
            }
            Err(e) => Err(match super::record::environment_of_manifest(&e) {
                Some(fault) => warehouse::Error::Environment(fault),
                None => warehouse::Error::Message(format!("cannot read the manifest: {e}")),
            }),
        };
        (group, result)
    })
    .await
    .map_err(|e| Error::Internal(format!("publish panicked: {e}")))
}

/// The group committed: each member succeeded with its `rows`, its output removed.
fn published(
    shared: &Arc<Shared>,
    members: &mut [Member],
    group: Group,
    rows: Vec<i64>,
    mut records: Vec<Option<TryRecord>>,
) {
    crate::fault::point("after-publish");
    let others = group.len().saturating_sub(1);
    for ((k, output, _), rows) in group.into_iter().zip(rows) {
        let m = &mut members[k];
        let task = &shared.spec.dag.tasks[m.task];
        let Some(mut record) = records[k].take() else {
            continue;
        };
        if let Some(merged) = output.merged().or(output.measures().merge) {
            record.set_merge(&merged);
        }
        output.remove();
        if let TaskKind::Sql(sql) = &task.kind {
            TryLog::open(&m.started.log).line(&format!(
                "published {} into {}, in one transaction with {}",
                crate::words::plural(rows, "row", "rows"),
                sql.target,
                crate::words::plural(
                    i64::try_from(others).unwrap_or(i64::MAX),
                    "other output",
                    "other outputs"
                ),
            ));
        }
        let fingerprint = record.fingerprint.clone();
        m.outcome = Some(Outcome::Succeeded(
            record,
            Some(Published {
                rows,
                fingerprint,
                recorded: false,
            }),
        ));
    }
}

/// The group's transaction failed with `e`: nothing was published; every member's try ends
/// failed (or interrupted, for a fault of the environment), its staged output kept, and every
/// intent ends in one manifest transaction, so that a recoverer never finds part of the group
/// still decided.
async fn not_published(
    shared: &Arc<Shared>,
    members: &mut [Member],
    group: Group,
    e: &warehouse::Error,
) -> Result<(), Error> {
    let owner = shared.spec.owner;
    let fault = e.environment();
    let why = format!("not published: {e}; `promote --atomic` publishes all or none");
    let mut ended = Vec::new();
    for (k, output, _) in group {
        output.keep();
        let m = &mut members[k];
        TryLog::open(&m.started.log).line(&why);
        let mut rec = match &fault {
            Some(f) => {
                let mut rec = TryRecord::new(TryState::Cancelled);
                rec.error = Some(super::interrupted_by(f));
                rec
            }
            None => {
                let mut rec = TryRecord::new(TryState::Failed);
                rec.error = Some(why.clone());
                rec
            }
        };
        rec.promoted_from = Some(m.staged.try_id);
        ended.push((m.started.try_id, rec.clone()));
        m.outcome = Some(match fault {
            Some(_) => Outcome::Cancelled(rec),
            None => Outcome::Failed(rec),
        });
    }
    if let Some(f) = &fault {
        shared.stop_for(f);
    }
    let ends: Vec<_> = ended
        .into_iter()
        .map(|(t, rec)| (t, rec, shared.marks.try_end(t)))
        .collect();
    shared
        .writer
        .call(move |c| {
            let f = c.fence(owner)?;
            for (t, rec, began) in &ends {
                c.finish_try(f, *t, rec, crate::clock::End::since(*began))?;
            }
            Ok(())
        })
        .await?;
    Ok(())
}

/// How to publish one member, owned, for the blocking publish.
struct Prepared {
    task: usize,
    interval: DataInterval,
    repr: Option<warehouse::Repr>,
    empty: bool,
    expect: Option<String>,
    keep: warehouse::versions::Keep,
    table_keys: Option<Vec<String>>,
    judged: String,
}

impl Prepared {
    fn of(shared: &Shared, m: &Member, j: &Judged) -> Self {
        let task = &shared.spec.dag.tasks[m.task];
        let keep_versions = match &task.kind {
            TaskKind::Sql(sql) => sql.keep_versions,
            TaskKind::Command(_) => 0,
        };
        let current = j.current.as_ref();
        Self {
            task: m.task,
            interval: m.interval,
            repr: shared
                .reprs
                .lock()
                .ok()
                .and_then(|r| r.get(&task.id).copied().flatten()),
            empty: j.empty,
            expect: j.record.fingerprint.clone(),
            keep: warehouse::versions::Keep {
                by_try: m.started.try_id,
                version_of: current.and_then(|c| c.content),
                keep: keep_versions,
                same_content: current.is_some_and(|c| {
                    c.fingerprint.is_some() && c.fingerprint == j.record.fingerprint
                }),
            },
            table_keys: task
                .gate
                .as_ref()
                .filter(|g| g.unique_key_table)
                .map(|g| g.unique_key.clone()),
            judged: j.record.judged(),
        }
    }

    fn publish_as<'a>(&'a self, shared: &'a Shared) -> backend::PublishAs<'a> {
        let task: &Task = &shared.spec.dag.tasks[self.task];
        let TaskKind::Sql(sql) = &task.kind else {
            unreachable!("only SQL tasks are members of a group")
        };
        backend::PublishAs {
            task: sql,
            interval: self.interval,
            tz: shared.spec.dag.tz,
            repr: self.repr,
            empty: self.empty,
            expect_fingerprint: self.expect.as_deref(),
            keep: Some(self.keep),
            table_keys: self.table_keys.as_deref(),
            judged: Some(&self.judged),
            in_manifest: None,
            planned: None,
        }
    }
}

/// An interval as messages name it: its day for a daily or longer interval, else its start.
fn label(i: DataInterval, tz: chrono_tz::Tz) -> String {
    if i.duration() >= chrono::Duration::days(1) {
        i.ds(tz)
    } else {
        crate::interval::rfc3339(i.start)
    }
}

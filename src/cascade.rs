//! Cascades across DAGs: which DAGs lie downstream of one, which of their intervals depend on
//! which upstream intervals, and whether a downstream interval should run.
//!
//! An interval of a downstream DAG depends on every interval of each upstream DAG that
//! overlaps it in time: a daily DAG over an hourly one depends on its 24 hours (23 or 25 on a
//! DST day), a weekly one on its 7 days.

use std::collections::{HashMap, HashSet};

use chrono::{Duration, Utc};

use crate::interval::{DataInterval, Range, expand};
use crate::manifest::Reads;
use crate::manifest::cascades;
use crate::plan::{Action, RunState, SkipReason};
use crate::project::Dag;

/// How a cascade decides whether a downstream interval runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Whenever all of its upstream intervals succeeded.
    All,
    /// Only when, moreover, the output of one of them changed.
    Changed,
}

impl Mode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Changed => "changed",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "all" => Some(Self::All),
            "changed" => Some(Self::Changed),
            _ => None,
        }
    }
}

/// The DAGs downstream of `root`, transitively, each after every upstream of it among them.
pub(crate) fn downstream<'a>(dags: &'a [Dag], root: &str) -> Vec<&'a Dag> {
    let mut members: HashSet<&str> = HashSet::from([root]);
    loop {
        let before = members.len();
        for d in dags {
            if d.upstream.iter().any(|(u, _)| members.contains(u.as_str())) {
                members.insert(d.id.as_str());
            }
        }
        if members.len() == before {
            break;
        }
    }
    let mut placed: HashSet<&str> = HashSet::from([root]);
    let mut order = Vec::new();
    let mut rest: Vec<&Dag> = dags
        .iter()
        .filter(|d| d.id != root && members.contains(d.id.as_str()))
        .collect();
    rest.sort_by(|a, b| a.id.cmp(&b.id));
    while !rest.is_empty() {
        let Some(i) = rest.iter().position(|d| {
            d.upstream
                .iter()
                .all(|(u, _)| !members.contains(u.as_str()) || placed.contains(u.as_str()))
        }) else {
            // A cycle: validation refuses it before a cascade starts.
            break;
        };
        let d = rest.remove(i);
        placed.insert(d.id.as_str());
        order.push(d);
    }
    order
}

/// The intervals of `dag` that overlap any of `upstream` (ascending, any order in); an error
/// when they are more than [`crate::interval::MAX_INTERVALS`].
pub(crate) fn overlapping(
    dag: &Dag,
    upstream: &[DataInterval],
) -> Result<Vec<DataInterval>, String> {
    let (Some(lo), Some(hi)) = (
        upstream.iter().map(|i| i.start).min(),
        upstream.iter().map(|i| i.end).max(),
    ) else {
        return Ok(Vec::new());
    };
    // The interval that contains `lo` starts at most one period before it: look back further
    // until one starts at or before it.
    let mut found = Vec::new();
    for days in [2, 40, 400, 4000] {
        let start = lo
            .checked_sub_signed(Duration::days(days))
            .unwrap_or(chrono::DateTime::<Utc>::MIN_UTC);
        let range = Range {
            start,
            end_exclusive: hi,
        };
        found = expand(&dag.schedule, range, crate::interval::MAX_INTERVALS).map_err(|o| {
            format!(
                "DAG `{}` has more than {} intervals ({}) between {} and {}, more than one backfill may plan; cascade over a shorter range (the intervals from {} on are over the limit)",
                dag.id,
                crate::interval::MAX_INTERVALS,
                dag.schedule.expr(),
                crate::interval::rfc3339(lo),
                crate::interval::rfc3339(hi),
                crate::interval::rfc3339(o.first_excluded),
            )
        })?;
        if found.first().is_some_and(|f| f.start <= lo) {
            break;
        }
    }
    let mut ups: Vec<DataInterval> = upstream.to_vec();
    ups.sort_unstable();
    Ok(found
        .into_iter()
        .filter(|d| depends(d, &ups).next().is_some())
        .collect())
}

/// The intervals of `upstream` (ascending) that `interval` depends on: those overlapping it.
pub(crate) fn depends<'a>(
    interval: &'a DataInterval,
    upstream: &'a [DataInterval],
) -> impl Iterator<Item = &'a DataInterval> + 'a {
    let first = upstream.partition_point(|u| u.end <= interval.start);
    upstream[first..]
        .iter()
        .take_while(move |u| u.start < interval.end)
}

/// What a cascade's backfill of an upstream DAG did with one interval of its plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Upstream {
    pub dag: String,
    pub interval: DataInterval,
    /// Its output is there to read: it ran and succeeded here, or it was skipped because what
    /// was published before still stands.
    pub succeeded: bool,
    /// The cascade acted on it: ran it, or skipped it for its own upstream. Downstream
    /// intervals are planned over these.
    pub touched: bool,
}

/// Every interval of the plan of backfill `backfill_id` (of DAG `dag_id`, in a cascade), with
/// whether its output can be read and whether the cascade acted on it. An interval skipped as
/// `in flight` (another backfill runs it), `not yet complete`, or after a failure does not
/// count as succeeded; one skipped as `already exists` counts as succeeded only if its latest
/// run did.
pub(crate) fn upstream_outcomes(
    conn: &dyn Reads,
    dag_id: &str,
    backfill_id: i64,
) -> crate::manifest::Result<Vec<Upstream>> {
    let rows = conn.plan_outcomes(backfill_id)?;
    let mut out = Vec::with_capacity(rows.len());
    for cascades::PlanOutcome {
        start,
        end,
        action,
        state,
    } in rows
    {
        let (succeeded, touched) = match action {
            Action::Run => (state == Some(RunState::Succeeded), true),
            Action::Skip(reason) => match reason {
                SkipReason::UpstreamUnchanged => (true, true),
                SkipReason::UpstreamNotSuccessful => (false, true),
                SkipReason::SourceUnchanged => (true, false),
                SkipReason::AlreadyExists => (
                    conn.latest_computing_state(dag_id, start)? == Some(RunState::Succeeded),
                    false,
                ),
                _ => (false, false),
            },
        };
        out.push(Upstream {
            dag: dag_id.to_string(),
            interval: DataInterval::from_unix(start, end),
            succeeded,
            touched,
        });
    }
    Ok(out)
}

/// The intervals of upstream DAG `upstream` that overlap `intervals`, other than those whose
/// outcome the cascade knows already (`known`, by start), with whether each can be read: not
/// while another backfill runs it, nor when its latest run did not succeed (one that never ran
/// has nothing to wait for).
pub(crate) fn outside_outcomes(
    conn: &dyn Reads,
    upstream: &Dag,
    intervals: &[DataInterval],
    ctx: &crate::manifest::leases::LeaseCtx,
    known: &HashSet<i64>,
) -> Result<Vec<Upstream>, String> {
    let ups: Vec<DataInterval> = overlapping(upstream, intervals)?
        .into_iter()
        .filter(|u| !known.contains(&u.start.timestamp()))
        .collect();
    let ok = readable(
        conn,
        &upstream.id,
        &ups,
        ctx,
        crate::manifest::leases::Judge::Predict,
    )
    .map_err(|e| e.to_string())?;
    Ok(ups
        .into_iter()
        .zip(ok)
        .map(|(u, succeeded)| Upstream {
            dag: upstream.id.clone(),
            interval: u,
            succeeded,
            touched: false,
        })
        .collect())
}

/// For each of `ups` (intervals of DAG `dag_id`, ascending): whether its output can be read
/// now: no other backfill holds its lease (as `judge` says), and its latest computing run
/// succeeded (or it never ran).
pub(crate) fn readable(
    conn: &dyn Reads,
    dag_id: &str,
    ups: &[DataInterval],
    ctx: &crate::manifest::leases::LeaseCtx,
    judge: crate::manifest::leases::Judge,
) -> crate::manifest::Result<Vec<bool>> {
    let (Some(first), Some(last)) = (ups.first(), ups.last()) else {
        return Ok(Vec::new());
    };
    let in_flight = conn.held_leases(
        dag_id,
        first.start.timestamp(),
        last.start.timestamp(),
        ctx,
        judge,
    )?;
    let mut out = Vec::with_capacity(ups.len());
    for u in ups {
        let start = u.start.timestamp();
        let latest = conn.latest_computing_state(dag_id, start)?;
        out.push(!in_flight.contains(&start) && latest.is_none_or(|s| s == RunState::Succeeded));
    }
    Ok(out)
}

/// Whether the output of an upstream interval changed since `since` (unix ms): for any of its
/// tasks, the fingerprint of its latest successful try differs from that of the latest one
/// that had ended by then. A task that reports no fingerprint, or had not succeeded by then,
/// counts as changed: nothing can say it is the same. An interval that never succeeded has
/// nothing to read, and so has not changed.
pub(crate) fn changed_since(
    conn: &dyn Reads,
    dag_id: &str,
    start: i64,
    since: i64,
) -> crate::manifest::Result<bool> {
    let tries = conn.succeeded_tries(dag_id, start)?;
    let mut now: HashMap<&str, Option<&str>> = HashMap::new();
    let mut then: HashMap<&str, Option<&str>> = HashMap::new();
    for (task, fingerprint, ended) in &tries {
        now.insert(task, fingerprint.as_deref());
        if ended.is_some_and(|e| e <= since) {
            then.insert(task, fingerprint.as_deref());
        }
    }
    // Nothing published at all: nothing changed.
    Ok(now
        .iter()
        .any(|(task, f)| f.is_none() || then.get(task).copied().flatten() != *f))
}

/// For each interval of a downstream DAG, whether it is skipped for its upstream intervals in
/// the cascade: one that did not succeed skips it (`upstream not successful`); with `changed`,
/// it runs only if `changed(interval, upstream)` says so of one of them (else `upstream
/// unchanged`).
pub(crate) fn decide<E>(
    intervals: &[DataInterval],
    upstream: &[Upstream],
    mode: Mode,
    changed: &mut dyn FnMut(&DataInterval, &Upstream) -> Result<bool, E>,
) -> Result<HashMap<i64, SkipReason>, E> {
    let mut ups: Vec<&Upstream> = upstream.iter().collect();
    ups.sort_unstable_by_key(|u| u.interval);
    let mut out = HashMap::new();
    for i in intervals {
        let first = ups.partition_point(|u| u.interval.end <= i.start);
        let deps: Vec<&Upstream> = ups[first..]
            .iter()
            .copied()
            .filter(|u| u.interval.start < i.end && u.interval.end > i.start)
            .collect();
        let reason = if deps.iter().any(|u| !u.succeeded) {
            Some(SkipReason::UpstreamNotSuccessful)
        } else if mode == Mode::Changed {
            let mut any = false;
            for u in &deps {
                if changed(i, u)? {
                    any = true;
                    break;
                }
            }
            (!any).then_some(SkipReason::UpstreamUnchanged)
        } else {
            None
        };
        if let Some(r) = reason {
            out.insert(i.start.timestamp(), r);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn dag(id: &str, schedule: &str, upstream: &[&str]) -> Dag {
        let ups = upstream
            .iter()
            .map(|u| format!("\"{u}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let text = format!(
            "schedule = \"{schedule}\"\ntimezone = \"Europe/Berlin\"\nupstream = [{ups}]\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n"
        );
        Dag::parse(&text, &format!("dags/{id}.toml"), id, &BTreeMap::new())
            .dag
            .expect("a valid DAG")
    }

    fn at(s: &str) -> chrono::DateTime<Utc> {
        chrono::DateTime::parse_from_rfc3339(s)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn downstream_dags_come_after_their_upstreams() {
        let dags = vec![
            dag("report", "@daily", &["daily", "monthly"]),
            dag("monthly", "@monthly", &["daily"]),
            dag("daily", "@daily", &["hourly"]),
            dag("hourly", "@hourly", &[]),
            dag("other", "@daily", &[]),
        ];
        let ids: Vec<&str> = downstream(&dags, "hourly")
            .iter()
            .map(|d| d.id.as_str())
            .collect();
        assert_eq!(ids, ["daily", "monthly", "report"]);
        assert!(downstream(&dags, "other").is_empty());
    }

    #[test]
    fn a_day_depends_on_its_23_24_or_25_hours() {
        let hourly = dag("hourly", "@hourly", &[]);
        let daily = dag("daily", "@daily", &["hourly"]);
        // Three Berlin days around the change to summer time (2026-03-29 has 23 hours).
        let range = Range {
            start: at("2026-03-27T23:00:00Z"),
            end_exclusive: at("2026-03-30T22:00:00Z"),
        };
        let hours = expand(&hourly.schedule, range, 1000).unwrap();
        let days = overlapping(&daily, &hours).unwrap();
        assert_eq!(days.len(), 3);
        let per_day: Vec<usize> = days.iter().map(|d| depends(d, &hours).count()).collect();
        assert_eq!(per_day, [24, 23, 24]);
        // Hours of one day only: that day, not its neighbours.
        let one: Vec<DataInterval> = hours
            .iter()
            .copied()
            .filter(|h| h.start >= days[1].start && h.end <= days[1].end)
            .collect();
        assert_eq!(overlapping(&daily, &one).unwrap(), [days[1]]);
    }

    #[test]
    fn a_failed_upstream_skips_and_changed_needs_a_change() {
        let d = DataInterval::from_unix(0, 86_400);
        let h = |n: i64, succeeded: bool| Upstream {
            dag: "hourly".into(),
            interval: DataInterval::from_unix(n * 3600, (n + 1) * 3600),
            succeeded,
            touched: true,
        };
        let all_ok: Vec<Upstream> = (0..24).map(|n| h(n, true)).collect();
        let never = &mut |_: &DataInterval, _: &Upstream| Ok::<_, ()>(false);
        assert_eq!(decide(&[d], &all_ok, Mode::All, never), Ok(HashMap::new()));
        assert_eq!(
            decide(&[d], &all_ok, Mode::Changed, never).unwrap().get(&0),
            Some(&SkipReason::UpstreamUnchanged)
        );
        let hour_5 = &mut |_: &DataInterval, u: &Upstream| {
            Ok::<_, ()>(u.interval.start.timestamp() == 5 * 3600)
        };
        assert_eq!(
            decide(&[d], &all_ok, Mode::Changed, hour_5),
            Ok(HashMap::new())
        );
        let mut one_failed = all_ok.clone();
        one_failed[7].succeeded = false;
        assert_eq!(
            decide(&[d], &one_failed, Mode::All, never).unwrap().get(&0),
            Some(&SkipReason::UpstreamNotSuccessful)
        );
        // The next day depends on none of these hours.
        let next = DataInterval::from_unix(86_400, 2 * 86_400);
        assert_eq!(
            decide(&[next], &one_failed, Mode::Changed, never)
                .unwrap()
                .get(&86_400),
            Some(&SkipReason::UpstreamUnchanged)
        );
    }
}

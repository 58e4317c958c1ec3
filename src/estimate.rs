//! How long a plan will take, from the manifest's history: the median duration of each task
//! over its recent successful tries, the plan's concurrency and its tasks' pools.

use std::collections::BTreeMap;

use crate::manifest::Reads;
use crate::project::Dag;

/// Tries per task the median is taken over: recent ones say most about the next.
pub(crate) const RECENT_TRIES: i64 = 20;

/// An estimate: `seconds` is `None` when some task has no successful try yet.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Estimate {
    pub seconds: Option<f64>,
    /// How many tries the medians come from.
    pub tries: i64,
    /// Tasks with no history.
    pub unknown: Vec<String>,
    /// Intervals at once the estimate assumes (one with `depends_on_past`).
    pub lanes: u32,
    /// The slowest pool rate the DAG's tasks start under, and the least time (seconds) it
    /// alone gives the plan, known without any history.
    pub rate: Option<(String, crate::project::Rate, f64)>,
}

/// The median duration (seconds) of each task's recent successful tries, and their number.
pub(crate) fn history(
    conn: &dyn Reads,
    dag: &Dag,
) -> crate::manifest::Result<BTreeMap<String, (f64, i64)>> {
    let mut out = BTreeMap::new();
    for task in &dag.tasks {
        let ms = conn.recent_durations_ms(&dag.id, &task.id, RECENT_TRIES)?;
        if ms.is_empty() {
            continue;
        }
        let median = crate::gate::median(&ms).unwrap_or(0.0);
        out.insert(task.id.clone(), (median.max(0.0) / 1000.0, ms.len() as i64));
    }
    Ok(out)
}

/// The wall time of `to_run` intervals: each interval runs its tasks one after the other, at
/// most `concurrency` intervals at once, and a pooled task's tries at most the pool's size at
/// once (whichever bound is slower decides).
pub(crate) fn estimate(
    dag: &Dag,
    history: &BTreeMap<String, (f64, i64)>,
    to_run: usize,
    concurrency: u32,
    (pools, rates): (
        &BTreeMap<String, u32>,
        &BTreeMap<String, crate::project::Rate>,
    ),
) -> Estimate {
    let rate = rate_floor(dag, to_run, rates);
    let unknown: Vec<String> = dag
        .tasks
        .iter()
        .filter(|t| !history.contains_key(&t.id))
        .map(|t| t.id.clone())
        .collect();
    let tries = history.values().map(|(_, n)| n).sum();
    let lanes = if dag.depends_on_past {
        1
    } else {
        concurrency.max(1)
    };
    if !unknown.is_empty() {
        return Estimate {
            seconds: None,
            tries,
            unknown,
            lanes,
            rate,
        };
    }
    #[expect(
        clippy::cast_precision_loss,
        reason = "a count of intervals, far below 2^52"
    )]
    let n = to_run as f64;
    let concurrency = f64::from(lanes).min(n.max(1.0));
    let per_interval: f64 = dag.tasks.iter().map(|t| history[&t.id].0).sum();
    let mut seconds = n * per_interval / concurrency;
    for t in &dag.tasks {
        if let Some(size) = t.pool.as_ref().and_then(|p| pools.get(p)) {
            let lanes = f64::from(*size).min(concurrency);
            seconds = seconds.max(n * history[&t.id].0 / lanes);
        }
    }
    if let Some((_, _, floor)) = &rate {
        seconds = seconds.max(*floor);
    }
    Estimate {
        seconds: Some(seconds),
        tries,
        unknown,
        lanes,
        rate,
    }
}

/// The least time the pools' rates give `to_run` intervals: a pooled task starts once an
/// interval (once a batch), the first `N` of a rate's starts at once, then `N` a period.
fn rate_floor(
    dag: &Dag,
    to_run: usize,
    rates: &BTreeMap<String, crate::project::Rate>,
) -> Option<(String, crate::project::Rate, f64)> {
    let batches = to_run.div_ceil(usize::try_from(dag.batch_size.max(1)).unwrap_or(1));
    let mut starts: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &dag.tasks {
        if let Some(pool) = t.pool.as_deref().filter(|p| rates.contains_key(*p)) {
            *starts.entry(pool).or_default() += batches;
        }
    }
    starts
        .into_iter()
        .map(|(pool, n)| {
            let rate = rates[pool];
            let periods = n
                .div_ceil(usize::try_from(rate.starts).unwrap_or(1))
                .saturating_sub(1);
            #[expect(
                clippy::cast_precision_loss,
                reason = "a count of periods, far below 2^52"
            )]
            let floor = periods as f64 * rate.per.as_secs_f64();
            (pool.to_string(), rate, floor)
        })
        .max_by(|a, b| a.2.total_cmp(&b.2))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dag(toml: &str) -> Dag {
        Dag::parse(toml, "dags/d.toml", "d", &BTreeMap::new())
            .dag
            .expect("a valid DAG")
    }

    #[test]
    fn concurrency_and_pools_bound_the_estimate() {
        let d = dag(
            "schedule = \"@daily\"\n[[tasks]]\nid = \"a\"\ncommand = \"true\"\n[[tasks]]\nid = \"b\"\ncommand = \"true\"\npool = \"api\"\n",
        );
        let history: BTreeMap<String, (f64, i64)> =
            [("a".to_string(), (2.0, 5)), ("b".to_string(), (1.0, 7))].into();
        let mut pools = BTreeMap::new();
        pools.insert("api".to_string(), 4);
        // 12 intervals of 3 s, 4 at a time: 9 s; the pool of 4 allows it.
        let e = estimate(&d, &history, 12, 4, (&pools, &BTreeMap::new()));
        assert_eq!(e.seconds, Some(9.0));
        assert_eq!(e.tries, 12);
        // A pool of 1: 12 tries of `b` one at a time take 12 s.
        pools.insert("api".to_string(), 1);
        assert_eq!(
            estimate(&d, &history, 12, 4, (&pools, &BTreeMap::new())).seconds,
            Some(12.0)
        );
        // Fewer intervals than lanes: they all run at once.
        pools.insert("api".to_string(), 4);
        assert_eq!(
            estimate(&d, &history, 2, 8, (&pools, &BTreeMap::new())).seconds,
            Some(3.0)
        );
        // Without history for a task, no estimate.
        let partial: BTreeMap<String, (f64, i64)> = [("a".to_string(), (2.0, 5))].into();
        let e = estimate(&d, &partial, 12, 4, (&pools, &BTreeMap::new()));
        assert_eq!((e.seconds, e.unknown), (None, vec!["b".to_string()]));
        // A rate of 3 starts a minute: 12 starts are 4 windows, the last starting 3 minutes
        // after the first; known without history too.
        let rates = [(
            "api".to_string(),
            crate::project::Rate::parse("3/min").unwrap(),
        )]
        .into();
        assert_eq!(
            estimate(&d, &history, 12, 4, (&pools, &rates)).seconds,
            Some(180.0)
        );
        let e = estimate(&d, &partial, 12, 4, (&pools, &rates));
        assert_eq!(e.seconds, None);
        assert_eq!(e.rate.map(|r| (r.0, r.2)), Some(("api".to_string(), 180.0)));
    }

    #[test]
    fn rates_read_as_starts_per_period() {
        let r = |t: &str| crate::project::Rate::parse(t).map(|r| (r.starts, r.per.as_millis()));
        assert_eq!(r("100/min"), Ok((100, 60_000)));
        assert_eq!(r("5/s"), Ok((5, 1_000)));
        assert_eq!(r("1000/hour"), Ok((1000, 3_600_000)));
        assert_eq!(r("30/10s"), Ok((30, 10_000)));
        assert_eq!(r(" 2 / 1m30s"), Ok((2, 90_000)));
        for bad in ["100", "0/min", "x/min", "5/fortnight", "5/10ms", "5/2days"] {
            assert!(r(bad).is_err(), "{bad}");
        }
    }
}

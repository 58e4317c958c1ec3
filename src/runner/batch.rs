//! Batches: one query for several consecutive intervals of a SQL task (`batch_size`), and still
//! one verdict per partition.
//!
//! The runner takes a batch's intervals one after the other, each with a run and tries of its
//! own, as it would without batches; only the first try of each takes its rows from the batch's
//! one query (or one run of a command task's command) instead of running its own. The first interval that needs the
//! batch computes it ([`Batch::share_of`]); the others take their share of what it computed.
//! Each share is an interval's own output (on SQLite an audit file of its own, as a try writes),
//! so the gate, the publish, its record and a crash's recovery are those of a single try. A
//! batch whose query fails or times out is split in halves, each computed when an interval of
//! it needs it, down to the single interval, which then runs its own query as its try: one
//! poisoned interval never fails its neighbours, and only its own tries count against its
//! retries.

use std::sync::{Arc, OnceLock};

use tokio::sync::OnceCell;

use crate::interval::{DataInterval, Rfc3339};
use crate::warehouse::backend::Batched;

/// Consecutive intervals whose rows one query computes.
pub(super) struct Batch {
    intervals: Vec<DataInterval>,
    computed: OnceCell<Computed>,
    halves: OnceLock<[Arc<Batch>; 2]>,
    /// Which batch (`START/END`) each interval took its share of, by start.
    took: std::sync::Mutex<std::collections::HashMap<i64, String>>,
    /// A run of it started, or it ended (see [`Batch::begin`]).
    began: std::sync::atomic::AtomicBool,
}

/// A batch's query or command, once it ran.
#[derive(Clone)]
pub(super) enum Computed {
    Done(Rows),
    Failed(String),
    Cancelled,
}

/// What a computed batch holds for its intervals.
#[derive(Clone)]
pub(super) enum Rows {
    /// A SQL task's rows, kept by the warehouse.
    Sql(Arc<dyn Batched>),
    /// What a command task reported for each interval, and what its gate's source commands
    /// gave for each before the command ran.
    Command(Arc<CommandRows>),
}

/// A command task's batch, by interval (its index in the batch).
pub(super) struct CommandRows {
    /// What the command reported (`None`: nothing).
    pub reported: Vec<Option<crate::task::command::TaskResult>>,
    /// The source before the command ran, as each interval's try measures it before its own
    /// command (`None` without a gate).
    pub before: Vec<Option<crate::manifest::queries::Seen>>,
}

/// What an interval's first try takes its rows from.
pub(super) enum Share {
    /// Interval `k` of a computed batch.
    Of(Rows, usize),
    /// The interval's own query (a batch of one, or the last half of failed batches).
    Own,
    /// Stopped while the batch was computed.
    Cancelled,
}

impl Batch {
    pub(super) fn new(intervals: Vec<DataInterval>) -> Arc<Self> {
        Arc::new(Self {
            intervals,
            computed: OnceCell::new(),
            halves: OnceLock::new(),
            took: std::sync::Mutex::default(),
            began: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Notes that a run of the batch started (or that it ended): true the first time only.
    pub(super) fn begin(&self) -> bool {
        !self.began.swap(true, std::sync::atomic::Ordering::Relaxed)
    }

    /// The batch (`START/END`) whose one query or command computed `interval`'s share, once it
    /// took it.
    pub(super) fn took(&self, interval: DataInterval) -> Option<String> {
        self.took
            .lock()
            .ok()
            .and_then(|t| t.get(&interval.start.timestamp()).cloned())
    }

    /// `[first start, last end)` of the batch, as its log lines show it.
    fn range(&self) -> String {
        DataInterval::span(&self.intervals).map_or_else(
            || "[]".into(),
            |w| format!("[{}, {})", Rfc3339(w.start), Rfc3339(w.end)),
        )
    }

    /// The half of this batch that holds `interval` (the first half takes the odd one).
    fn half_with(&self, interval: DataInterval) -> Arc<Batch> {
        let halves = self.halves.get_or_init(|| {
            let mid = self.intervals.len().div_ceil(2);
            [
                Batch::new(self.intervals[..mid].to_vec()),
                Batch::new(self.intervals[mid..].to_vec()),
            ]
        });
        if halves[0].intervals.contains(&interval) {
            halves[0].clone()
        } else {
            halves[1].clone()
        }
    }

    /// Where `interval`'s first try takes its rows from: its share of this batch, computing it
    /// (`compute`, given the batch's intervals in order) if no interval did yet; of the half
    /// that holds it when the batch failed, and so on down to its own query or command. What
    /// happened on the way goes to `notes`, for the try's log.
    pub(super) async fn share_of<F, Fut>(
        self: &Arc<Self>,
        interval: DataInterval,
        notes: &mut Vec<String>,
        mut compute: F,
    ) -> Share
    where
        F: FnMut(Vec<DataInterval>) -> Fut,
        Fut: std::future::Future<Output = Computed>,
    {
        let mut batch = self.clone();
        loop {
            let Some(k) = batch.intervals.iter().position(|i| *i == interval) else {
                return Share::Own;
            };
            if batch.intervals.len() < 2 {
                return Share::Own;
            }
            let mut computed_here = false;
            let computed = batch
                .computed
                .get_or_init(|| {
                    computed_here = true;
                    compute(batch.intervals.clone())
                })
                .await
                .clone();
            match computed {
                Computed::Done(rows) => {
                    if computed_here {
                        notes.push(format!(
                            "computed the batch of {} intervals {} with {}",
                            batch.intervals.len(),
                            batch.range(),
                            match rows {
                                Rows::Sql(_) => "one query",
                                Rows::Command(_) => "one run of its command",
                            }
                        ));
                    }
                    notes.push(format!(
                        "took interval {} of {} of the batch {}",
                        k + 1,
                        batch.intervals.len(),
                        batch.range()
                    ));
                    if let (Some(whole), Ok(mut took)) =
                        (DataInterval::span(&batch.intervals), self.took.lock())
                    {
                        took.insert(
                            interval.start.timestamp(),
                            format!("{}/{}", Rfc3339(whole.start), Rfc3339(whole.end)),
                        );
                    }
                    return Share::Of(rows, k);
                }
                Computed::Cancelled => return Share::Cancelled,
                Computed::Failed(error) => {
                    let half = batch.half_with(interval);
                    notes.push(format!(
                        "the batch of {} intervals {} failed: {error}; split in halves, this interval's is {}",
                        batch.intervals.len(),
                        batch.range(),
                        half.range()
                    ));
                    batch = half;
                }
            }
        }
    }
}

/// The JSON of `BACKFILL_BATCH`: the batch's intervals, in order, each with its start, end (RFC
/// 3339, UTC) and `ds`.
pub(super) fn intervals_json(intervals: &[DataInterval], tz: chrono_tz::Tz) -> String {
    let mut sorted = intervals.to_vec();
    sorted.sort();
    serde_json::Value::Array(
        sorted
            .iter()
            .map(|i| {
                serde_json::json!({
                    "start": Rfc3339(i.start).to_string(),
                    "end": Rfc3339(i.end).to_string(),
                    "ds": i.start.with_timezone(&tz).date_naive().to_string(),
                })
            })
            .collect(),
    )
    .to_string()
}

/// What a command task of a batch reports in its result file: `{"intervals": {KEY: result}}`,
/// KEY an interval's start (RFC 3339, as `BACKFILL_BATCH` gives it) or its `ds` when no other
/// interval of the batch has the same.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Reported {
    intervals: std::collections::BTreeMap<String, crate::task::command::TaskResult>,
}

/// Reads a batch's result file into each interval's result (`intervals` in the batch's
/// order): it must report each of them (a command that knows nothing of batches then fails
/// the batch, which is split down to single intervals, each run on its own).
pub(super) fn read_reported(
    path: &std::path::Path,
    intervals: &[DataInterval],
    tz: chrono_tz::Tz,
) -> Result<Vec<Option<crate::task::command::TaskResult>>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "the batch's command wrote no result file {}; a command run for a batch (BACKFILL_BATCH set) reports each of its intervals: {{\"intervals\": {{\"START or ds\": {{\"rows\": N}}, ...}}}}",
                path.display()
            ));
        }
        Err(e) => {
            return Err(format!(
                "cannot read the result file {}: {e}",
                path.display()
            ));
        }
    };
    let reported: Reported = serde_json::from_str(&text).map_err(|e| {
        format!(
            "the batch's result file {} is not valid: {e}; expected {{\"intervals\": {{\"START or ds\": {{\"rows\": N, ...}}, ...}}}}",
            path.display()
        )
    })?;
    let ds = |i: &DataInterval| i.start.with_timezone(&tz).date_naive().to_string();
    let mut out = Vec::with_capacity(intervals.len());
    let mut used = std::collections::BTreeSet::new();
    for i in intervals {
        let start = Rfc3339(i.start).to_string();
        let unique_ds = intervals.iter().filter(|j| ds(j) == ds(i)).count() == 1;
        let keys: Vec<String> = std::iter::once(start)
            .chain(unique_ds.then(|| ds(i)))
            .filter(|k| reported.intervals.contains_key(k))
            .collect();
        if keys.len() > 1 {
            return Err(format!(
                "the batch's result file {} reports interval {} twice, as {}",
                path.display(),
                keys[0],
                keys.join(" and ")
            ));
        }
        let Some(result) = keys.first().and_then(|k| reported.intervals.get(k)) else {
            return Err(format!(
                "the batch's result file {} reports nothing for interval {} (by its start or its ds); a command run for a batch reports each of its intervals",
                path.display(),
                Rfc3339(i.start)
            ));
        };
        out.push(Some(result.clone()));
        used.extend(keys);
    }
    let stray: Vec<&String> = reported
        .intervals
        .keys()
        .filter(|k| !used.contains(*k))
        .take(3)
        .collect();
    if !stray.is_empty() {
        return Err(format!(
            "the batch's result file {} reports intervals that are not in the batch: {}",
            path.display(),
            stray
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(out)
}

//! Batches: one query for several consecutive intervals of a SQL task (`batch_size`), and still
//! one verdict per partition.
//!
//! The runner takes a batch's intervals one after the other, each with a run and tries of its
//! own, as it would without batches; only the first try of each takes its rows from the batch's
//! one query instead of running the task's query itself. The first interval that needs the
//! batch computes it ([`Batch::share_of`]); the others take their share of what it computed.
//! Each share is an interval's own output (on SQLite an audit file of its own, as a try writes),
//! so the gate, the publish, its record and a crash's recovery are those of a single try. A
//! batch whose query fails or times out is split in halves, each computed when an interval of
//! it needs it, down to the single interval, which then runs its own query as its try: one
//! poisoned interval never fails its neighbours, and only its own tries count against its
//! retries.

use std::sync::{Arc, OnceLock};

use tokio::sync::{OnceCell, watch};

use super::sql_try::{Step, blocking_step};
use super::{Shared, Stop};
use crate::interval::DataInterval;
use crate::project::{SqlTask, Task};
use crate::warehouse::backend::Batched;

/// Consecutive intervals whose rows one query computes.
pub(super) struct Batch {
    intervals: Vec<DataInterval>,
    computed: OnceCell<Computed>,
    halves: OnceLock<[Arc<Batch>; 2]>,
}

#[derive(Clone)]
enum Computed {
    Done(Arc<dyn Batched>),
    Failed(String),
    Cancelled,
}

/// What an interval's first try takes its rows from.
pub(super) enum Share {
    /// Interval `k` of a computed batch.
    Of(Arc<dyn Batched>, usize),
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
        })
    }

    /// `[first start, last end)` of the batch, as its log lines show it.
    fn range(&self) -> String {
        let start = self.intervals.iter().map(|i| i.start).min();
        let end = self.intervals.iter().map(|i| i.end).max();
        match (start, end) {
            (Some(s), Some(e)) => format!("[{}, {})", s.to_rfc3339(), e.to_rfc3339()),
            _ => "[]".into(),
        }
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
    /// if no interval did yet; of the half that holds it when the batch failed, and so on down
    /// to its own query. What happened on the way goes to `notes`, for the try's log.
    pub(super) async fn share_of(
        self: &Arc<Self>,
        shared: &Shared,
        task: &Task,
        sql: &SqlTask,
        interval: DataInterval,
        stop: &mut watch::Receiver<Stop>,
        notes: &mut Vec<String>,
    ) -> Share {
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
                    compute(shared, task, sql, &batch.intervals, stop)
                })
                .await
                .clone();
            match computed {
                Computed::Done(rows) => {
                    if computed_here {
                        notes.push(format!(
                            "computed the batch of {} intervals {} with one query",
                            batch.intervals.len(),
                            batch.range()
                        ));
                    }
                    notes.push(format!(
                        "took interval {} of {} of the batch {}",
                        k + 1,
                        batch.intervals.len(),
                        batch.range()
                    ));
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

/// Runs a batch's query, bounded by the task's timeout and stopped as a try is.
async fn compute(
    shared: &Shared,
    task: &Task,
    sql: &SqlTask,
    intervals: &[DataInterval],
    stop: &mut watch::Receiver<Stop>,
) -> Computed {
    let (s, g, ivs, tz) = (
        sql.clone(),
        task.gate.clone(),
        intervals.to_vec(),
        shared.spec.dag.tz,
    );
    let audit_dir = crate::warehouse::audit_dir(&shared.spec.manifest_path);
    let step = blocking_step(task.timeout, stop, move |cancel| {
        crate::warehouse::backend_of(&s.warehouse).write_batch(
            &s,
            g.as_ref(),
            &ivs,
            tz,
            &audit_dir,
            cancel,
        )
    })
    .await;
    match step {
        Step::Done(Ok(rows)) => Computed::Done(Arc::from(rows)),
        Step::Done(Err(e)) => Computed::Failed(e.to_string()),
        Step::TimedOut(_) => Computed::Failed(super::outcome::timed_out(task)),
        Step::Cancelled(_) => Computed::Cancelled,
    }
}

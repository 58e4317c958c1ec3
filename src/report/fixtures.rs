//! Synthetic events and read models for the views' snapshot tests: a daily DAG `sales` in
//! Europe/Berlin over the first days of 2026, one interval succeeded, one rejected, one failed.

use std::io::Write;
use std::sync::{Arc, Mutex};

use chrono::{TimeZone, Utc};

use super::Labeler;
use super::out::{Fit, Sink};
use crate::interval::{DataInterval, Rfc3339};
use crate::manifest::queries::{BackfillSummary, Counts};

pub(crate) const REJECTED: &str = "task `export` rejected: row count 5 differs from the source count 10 by 50.0% (tolerance 0.0%)";
pub(crate) const FAILED: &str = "task `export` failed: exit code 2";

pub(crate) fn labels() -> Labeler {
    Labeler::in_zone(chrono_tz::Europe::Berlin, true)
}

/// The interval of local day `d` of January 2026 in Berlin (starts at 23:00 UTC the day before).
pub(crate) fn day(d: u32) -> DataInterval {
    let start = Utc.with_ymd_and_hms(2026, 1, d, 0, 0, 0).unwrap() - chrono::Duration::hours(1);
    DataInterval {
        start,
        end: start + chrono::Duration::days(1),
    }
}

pub(crate) fn at(d: u32) -> Rfc3339 {
    Rfc3339(day(d).start)
}

/// Backfill 1 of `sales` over January 1 to 4: 2 succeeded, 1 failed, 1 rejected.
pub(crate) fn backfill() -> BackfillSummary {
    BackfillSummary {
        id: 1,
        dag_id: "sales".into(),
        state: crate::state::BackfillState::Failed,
        from: Some(at(1)),
        to: Some(at(4)),
        from_arg: "2026-01-01".into(),
        to_arg: "2026-01-04".into(),
        reprocess_behavior: crate::plan::Reprocess::None,
        max_active_runs: 1,
        batch_size: None,
        run_backwards: false,
        allow_drift: false,
        conf: serde_json::json!({}),
        created_at: "2026-02-01T09:30:00Z".into(),
        finished_at: Some("2026-02-01T09:31:05Z".into()),
        owner_pid: None,
        owner_start: None,
        owner_host: None,
        owner_alive: false,
        heartbeat_at: None,
        intervals: Counts {
            total: 4,
            planned: 4,
            succeeded: 2,
            failed: 1,
            rejected: 1,
            ..Counts::default()
        },
        kind: crate::state::BackfillKind::Run,
        source_backfill: None,
        atomic: false,
        tasks: None,
        max_failures: None,
        cascade: None,
        cascade_of: None,
        sample: None,
    }
}

/// A writer whose bytes can be read while it is held by a sink.
#[derive(Clone, Default)]
pub(crate) struct Shared(Arc<Mutex<Vec<u8>>>);

impl Shared {
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A sink into buffers, and the buffers: (data, notes).
pub(crate) fn sink(json: bool, fit: Fit) -> (Sink<'static>, Shared, Shared) {
    let (data, notes) = (Shared::default(), Shared::default());
    (
        Sink::new(data.clone(), notes.clone(), json, fit),
        data,
        notes,
    )
}

/// The widest line of `text`, in characters.
pub(crate) fn widest(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

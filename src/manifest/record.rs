//! What a finished task try recorded ([`TryRecord`]): its end, the gate's verdict and reasons,
//! what a merge did, a staged output; and the judged part of it ([`Judged`]) that a PostgreSQL
//! warehouse keeps with its booking of a publish.

use crate::state::TryState;

/// What a finished try recorded.
#[derive(Debug, Clone)]
pub struct TryRecord {
    pub state: TryState,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub rows: Option<i64>,
    pub partitions: Option<String>,
    pub inputs: Option<String>,
    pub fingerprint: Option<String>,
    /// Gate: source rows, rows of the published try compared with, verdict and reasons.
    pub source_rows: Option<i64>,
    pub previous_rows: Option<i64>,
    pub verdict: Option<crate::state::Verdict>,
    pub reasons: Option<String>,
    /// What the gate's `source_fingerprint` gave.
    pub source_fingerprint: Option<String>,
    /// A staged output: kept unpublished at `staged_path` (the audit file of a SQL try, the
    /// result file of a command try).
    pub staged: Option<crate::state::StagedState>,
    pub staged_path: Option<String>,
    /// A promoting try: the staged try whose output it publishes.
    pub promoted_from: Option<i64>,
    /// A rollback try: the try whose rows it put back (`None` when they predate the manifest).
    pub restored_from: Option<i64>,
    /// A rollback try: the kept version it puts back.
    pub restore_key: Option<i64>,
    /// The batch whose one query or command computed the output (`START/END`).
    pub batch: Option<String>,
    /// A merge's rows inserted, updated, deleted and left unchanged (`write = "merge"`).
    pub rows_inserted: Option<i64>,
    pub rows_updated: Option<i64>,
    pub rows_deleted: Option<i64>,
    pub rows_unchanged: Option<i64>,
}

/// What the gate judged of a try, as JSON: kept with a PostgreSQL warehouse's booking of the
/// publish, for the recovery of a publish that committed before the manifest recorded it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Judged {
    pub source_rows: Option<i64>,
    pub previous_rows: Option<i64>,
    pub verdict: Option<crate::state::Verdict>,
    pub reasons: Option<String>,
    pub source_fingerprint: Option<String>,
    /// A merge's counts: inserted, updated, deleted, unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged: Option<[i64; 4]>,
}

impl TryRecord {
    /// Records what a merge did.
    pub(crate) fn set_merge(&mut self, m: &crate::gate::Merge) {
        self.rows_inserted = Some(m.inserted);
        self.rows_updated = Some(m.updated);
        self.rows_deleted = Some(m.deleted);
        self.rows_unchanged = Some(m.unchanged);
    }

    /// Forgets what a merge would have done: it did not happen (the try was rejected).
    pub(crate) fn clear_merge(&mut self) {
        self.rows_inserted = None;
        self.rows_updated = None;
        self.rows_deleted = None;
        self.rows_unchanged = None;
    }

    /// A merge's counts, when recorded: inserted, updated, deleted, unchanged.
    pub fn merged(&self) -> Option<[i64; 4]> {
        Some([
            self.rows_inserted?,
            self.rows_updated?,
            self.rows_deleted?,
            self.rows_unchanged?,
        ])
    }

    /// What the gate judged, as JSON.
    pub(crate) fn judged(&self) -> String {
        serde_json::to_string(&Judged {
            source_rows: self.source_rows,
            previous_rows: self.previous_rows,
            verdict: self.verdict,
            reasons: self.reasons.clone(),
            source_fingerprint: self.source_fingerprint.clone(),
            merged: self.merged(),
        })
        .unwrap_or_default()
    }

    /// Fills what this record lacks from a [`TryRecord::judged`] (unreadable JSON fills nothing).
    pub(crate) fn fill_judged(&mut self, json: &str) {
        let j: Judged = serde_json::from_str(json).unwrap_or_default();
        self.source_rows = self.source_rows.or(j.source_rows);
        self.previous_rows = self.previous_rows.or(j.previous_rows);
        self.verdict = self.verdict.take().or(j.verdict);
        self.reasons = self.reasons.take().or(j.reasons);
        self.source_fingerprint = self.source_fingerprint.take().or(j.source_fingerprint);
        if let (None, Some([i, u, d, n])) = (self.merged(), j.merged) {
            (self.rows_inserted, self.rows_updated) = (Some(i), Some(u));
            (self.rows_deleted, self.rows_unchanged) = (Some(d), Some(n));
        }
    }

    pub fn new(state: TryState) -> Self {
        Self {
            state,
            exit_code: None,
            error: None,
            rows: None,
            partitions: None,
            inputs: None,
            fingerprint: None,
            source_rows: None,
            source_fingerprint: None,
            staged: None,
            staged_path: None,
            promoted_from: None,
            restored_from: None,
            restore_key: None,
            batch: None,
            rows_inserted: None,
            rows_updated: None,
            rows_deleted: None,
            rows_unchanged: None,
            previous_rows: None,
            verdict: None,
            reasons: None,
        }
    }
}

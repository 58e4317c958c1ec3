//! Command tasks: rendering a command for one try, the `BACKFILL_*` environment, where a try's
//! log and result file live, and reading the result file. Running the process is
//! [`crate::process`]'s job.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::process::Program;
use crate::project::CommandSpec;
use crate::task::template::{self, Context};

/// Renders a command for one try: each element of an argument vector on its own (each stays
/// one argument), or a shell line whose inserted values are quoted as one shell word each.
pub(crate) fn render(spec: &CommandSpec, ctx: &Context<'_>) -> Result<Program, String> {
    match spec {
        CommandSpec::Argv(args) => args
            .iter()
            .map(|a| template::render(a, ctx))
            .collect::<Result<_, _>>()
            .map(Program::Argv),
        CommandSpec::Shell(line) => template::render_shell(line, ctx).map(Program::Shell),
    }
}

/// What a task may report in the file named by `BACKFILL_RESULT`.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partitions: Option<Vec<serde_json::Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Vec<serde_json::Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

/// Reads the result JSON if the task wrote one.
pub(crate) fn read_result(path: &Path) -> Result<Option<TaskResult>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
            format!(
                "the result file {} is not valid: {e}; expected {{\"rows\": N, \"partitions\": [...], \"inputs\": [...], \"fingerprint\": \"...\"}}",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read the result file {}: {e}", path.display())),
    }
}

/// The last `lines` lines of a log file.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(16 * 1024);
    if f.seek(SeekFrom::Start(from)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Where a try's log and result file live: `LOGS/DAG/TASK/INTERVAL.runR.tryN.log`. Run ids are
/// never reused, so the result file of a new try cannot exist yet.
pub(crate) fn try_paths(
    logs_dir: &Path,
    dag_id: &str,
    interval_start: chrono::DateTime<chrono::Utc>,
    task_id: &str,
    run_id: i64,
    try_number: u32,
) -> (PathBuf, PathBuf) {
    interval_files(
        logs_dir,
        dag_id,
        interval_start,
        task_id,
        &format!("run{run_id}.try{try_number}"),
    )
}

/// `LOGS/DAG/TASK/INTERVAL.WHAT.log` and `.result.json`: one folder per task, created once (a
/// folder per interval would cost two inodes a try).
fn interval_files(
    logs_dir: &Path,
    dag_id: &str,
    interval_start: chrono::DateTime<chrono::Utc>,
    task_id: &str,
    what: &str,
) -> (PathBuf, PathBuf) {
    let dir = logs_dir.join(dag_id).join(task_id);
    let stem = format!("{}.{what}", interval_start.format("%Y%m%dT%H%M%SZ"));
    (
        dir.join(format!("{stem}.log")),
        dir.join(format!("{stem}.result.json")),
    )
}

/// Where an interval's readiness check (`[tasks.ready]`, a command) writes:
/// `LOGS/DAG/TASK/INTERVAL.ready.log` and its result file beside it. One pair an interval,
/// rewritten by each ask: its last line is the last ask's answer.
pub(crate) fn ready_paths(
    logs_dir: &Path,
    dag_id: &str,
    interval_start: chrono::DateTime<chrono::Utc>,
    task_id: &str,
) -> (PathBuf, PathBuf) {
    interval_files(logs_dir, dag_id, interval_start, task_id, "ready")
}

/// A try's log path as the text before and after its run's id (for the manifest to record it
/// in the statement that makes the run).
pub(crate) fn log_path_around_run(
    logs_dir: &Path,
    dag_id: &str,
    interval_start: chrono::DateTime<chrono::Utc>,
    task_id: &str,
    try_number: u32,
) -> (String, String) {
    let dir = logs_dir.join(dag_id).join(task_id);
    let before = dir.join(format!("{}.run", interval_start.format("%Y%m%dT%H%M%SZ")));
    (
        before.display().to_string(),
        format!(".try{try_number}.log"),
    )
}

/// The `BACKFILL_*` environment of a try.
pub(crate) fn environment(
    ctx: &Context<'_>,
    conf: &str,
    result_path: &Path,
) -> Vec<(String, String)> {
    vec![
        ("BACKFILL_DAG_ID".into(), ctx.dag_id.into()),
        ("BACKFILL_TASK_ID".into(), ctx.task_id.into()),
        ("BACKFILL_RUN_ID".into(), ctx.run_id.into()),
        ("BACKFILL_TRY_NUMBER".into(), ctx.try_number.to_string()),
        (
            "BACKFILL_DATA_INTERVAL_START".into(),
            ctx.data_interval_start.into(),
        ),
        (
            "BACKFILL_DATA_INTERVAL_END".into(),
            ctx.data_interval_end.into(),
        ),
        ("BACKFILL_DS".into(), ctx.ds.into()),
        ("BACKFILL_DS_NODASH".into(), ctx.ds_nodash.into()),
        ("BACKFILL_CONF".into(), conf.into()),
        ("BACKFILL_RESULT".into(), result_path.display().to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_path_around_a_run_id_is_the_try_s_log_path() {
        let start = chrono::DateTime::from_timestamp(1_767_225_600, 0).unwrap();
        let dir = Path::new("/p/logs");
        let (log, _) = try_paths(dir, "d", start, "t", 42, 3);
        let (before, after) = log_path_around_run(dir, "d", start, "t", 3);
        assert_eq!(format!("{before}42{after}"), log.display().to_string());
    }
}

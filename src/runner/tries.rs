//! The tries of one task: command tasks, gated command tasks, and SQL tasks with
//! write-audit-publish. Each try is recorded before it starts and when it ends; a try that
//! decided to publish records that intent first, so that a crash mid-publish is repaired by
//! redoing the publish.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::InterruptHandle;
use tokio::sync::watch;

use super::{Event, Shared, Stop};
use crate::gate::{self, Measures, Rules, Verdict};
use crate::interval::DataInterval;
use crate::manifest::{self, TryRecord, lease::now_ms};
use crate::plan::RunState;
use crate::project::{CommandSpec, Gate, SourceCount, SqlTask, Task, TaskKind};
use crate::task::command::{self, Ended, TaskResult};
use crate::task::template::{Context, IntervalValues};
use crate::warehouse::{self, Binds, Cancel};

/// Longest wait between two tries, whatever the backoff computes.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(3600);

/// How a task ended for its run.
pub(super) enum TaskEnd {
    Succeeded,
    Failed(String),
    Rejected(String),
    Cancelled,
}

/// What a published try wrote.
struct Published {
    rows: i64,
    fingerprint: Option<String>,
}

/// How one try ended.
enum Outcome {
    Succeeded(TryRecord, Option<Published>),
    Rejected(TryRecord, String),
    /// May be retried.
    Failed(TryRecord),
    Cancelled(TryRecord),
}

fn failed(error: String, exit_code: Option<i32>) -> Outcome {
    Outcome::Failed(TryRecord {
        state: "failed".into(),
        exit_code,
        error: Some(error),
        ..TryRecord::default()
    })
}

fn cancelled() -> Outcome {
    Outcome::Cancelled(TryRecord {
        state: "cancelled".into(),
        error: Some("cancelled".into()),
        ..TryRecord::default()
    })
}

/// One try's fixed inputs.
struct TryInput<'a> {
    try_id: i64,
    interval: DataInterval,
    ctx: Context<'a>,
    env: Vec<(String, String)>,
    log_path: PathBuf,
    result_path: PathBuf,
}

/// A try's end, not yet recorded: it is committed together with the end of its run when it is
/// the run's last.
pub(super) struct LastTry {
    try_id: i64,
    task_id: String,
    interval: DataInterval,
    record: TryRecord,
    published: Option<Published>,
}

/// Records the end of a task's last try and, when given, of the run, in one commit.
pub(super) async fn record_end(
    shared: &Shared,
    run_id: i64,
    last_try: Option<LastTry>,
    run_end: Option<(RunState, Option<String>)>,
) -> anyhow::Result<()> {
    let dag_id = shared.spec.dag.id.clone();
    shared
        .writer
        .call(move |c| {
            let now = now_ms();
            if let Some(t) = last_try {
                manifest::finish_try(c, t.try_id, &t.record, now)?;
                if let Some(p) = t.published {
                    let publication = manifest::Publication {
                        try_id: t.try_id,
                        dag_id: &dag_id,
                        task_id: &t.task_id,
                        interval: t.interval,
                        rows: p.rows,
                        fingerprint: p.fingerprint.as_deref(),
                    };
                    manifest::mark_published(c, &publication, now)?;
                }
            }
            if let Some((state, error)) = run_end {
                manifest::finish_run(c, run_id, state, error.as_deref(), now)?;
            }
            Ok(())
        })
        .await
}

/// Records a try as started, and the run too for the interval's first try: one commit. `None`
/// when this backfill was fenced: its lease (or its run) was taken over by another process.
async fn start_try(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
    run_id: Option<i64>,
    try_number: u32,
) -> anyhow::Result<Option<(i64, i64, PathBuf, PathBuf)>> {
    let spec = &shared.spec;
    let (backfill_id, dag_id, task_id) = (spec.backfill_id, spec.dag.id.clone(), task.id.clone());
    let logs_dir = spec.logs_dir.clone();
    shared
        .writer
        .call(move |c| {
            let now = now_ms();
            let run_id = match run_id {
                Some(id) if manifest::run_in_progress(c, id)? => id,
                None if manifest::holds_lease(
                    c,
                    backfill_id,
                    &dag_id,
                    interval.start.timestamp(),
                )? =>
                {
                    manifest::start_run(c, backfill_id, &dag_id, interval, now)?
                }
                _ => return Ok(None),
            };
            let (log, result) = command::try_paths(
                &logs_dir,
                &dag_id,
                interval.start,
                &task_id,
                run_id,
                try_number,
            );
            let log_text = log.display().to_string();
            let try_id = manifest::start_try(c, run_id, &task_id, try_number, &log_text, now)?;
            Ok(Some((run_id, try_id, log, result)))
        })
        .await
}

/// Runs the tries of one task until one succeeds, is rejected, the retries are used up, or a
/// stop. Starts the run with the first try when `run_id` is `None`. The final try is returned
/// unrecorded, for [`record_end`].
pub(super) async fn run_task(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
    run_id: &mut Option<i64>,
    stop: &mut watch::Receiver<Stop>,
) -> anyhow::Result<(TaskEnd, Option<LastTry>)> {
    let spec = &shared.spec;
    let values = IntervalValues::new(interval, spec.dag.tz);
    let attempts = task.retries + 1;
    let mut last_error = String::new();
    for try_number in 1..=attempts {
        if *stop.borrow() != Stop::Run {
            return Ok((TaskEnd::Cancelled, None));
        }
        let Some((run, try_id, log_path, result_path)) =
            start_try(shared, task, interval, *run_id, try_number).await?
        else {
            return Ok((TaskEnd::Cancelled, None));
        };
        if run_id.is_none() {
            *run_id = Some(run);
            let _ = shared.events.send(Event::IntervalStarted {
                interval,
                run_id: run,
            });
        }
        let log_text = log_path.display().to_string();
        let run_id_text = run.to_string();
        let ctx = values.context(&spec.dag.id, &task.id, &run_id_text, try_number, &spec.conf);
        let input = TryInput {
            try_id,
            interval,
            env: command::environment(&ctx, &shared.conf_text, &result_path),
            ctx,
            log_path,
            result_path,
        };
        let outcome = match &task.kind {
            TaskKind::Command(command_spec) => {
                command_try(shared, task, command_spec, &input, stop).await?
            }
            TaskKind::Sql(sql) => sql_try(shared, task, sql, &input, stop).await?,
        };
        let (record, end, published) = match outcome {
            Outcome::Succeeded(r, p) => (r, Some(TaskEnd::Succeeded), p),
            Outcome::Rejected(r, reason) => (r, Some(TaskEnd::Rejected(reason)), None),
            Outcome::Cancelled(r) => (r, Some(TaskEnd::Cancelled), None),
            Outcome::Failed(r) => {
                last_error = r.error.clone().unwrap_or_default();
                (r, None, None)
            }
        };
        let last = LastTry {
            try_id,
            task_id: task.id.clone(),
            interval,
            record,
            published,
        };
        if let Some(end) = end {
            return Ok((end, Some(last)));
        }
        let will_retry = try_number < attempts;
        let _ = shared.events.send(Event::TryFailed {
            interval,
            task_id: task.id.clone(),
            try_number,
            error: last_error.clone(),
            will_retry,
            log_path: log_text,
            log_tail: command::log_tail(&input.log_path, 20),
        });
        if !will_retry {
            return Ok((TaskEnd::Failed(last_error), Some(last)));
        }
        let (try_id, record) = (last.try_id, last.record);
        shared
            .writer
            .call(move |c| manifest::finish_try(c, try_id, &record, now_ms()))
            .await?;
        if !wait_before_retry(task.retry_delay, try_number, stop).await {
            return Ok((TaskEnd::Cancelled, None));
        }
    }
    Ok((TaskEnd::Failed(last_error), None))
}

/// Runs a command to its end; `Err` describes a failure to start it.
async fn run_process(
    shared: &Shared,
    try_id: i64,
    argv: &[String],
    env: &[(String, String)],
    stdout_log: &Path,
    task: &Task,
    stop: &mut watch::Receiver<Stop>,
) -> anyhow::Result<Result<Ended, String>> {
    let spawned = match command::spawn(argv, env, &shared.spec.project_root, stdout_log) {
        Ok(s) => s,
        Err(e) => return Ok(Err(format!("cannot start `{}`: {e}", argv[0]))),
    };
    let (pgid, host) = (spawned.pgid, shared.spec.host.clone());
    // Not awaited: the group is recorded with the next commit, while the try already runs.
    drop(
        shared
            .writer
            .submit(move |c| manifest::set_try_group(c, try_id, pgid, &host)),
    );
    Ok(Ok(command::supervise(
        spawned,
        task.timeout,
        task.grace_period,
        stop,
    )
    .await?))
}

/// Maps how a process ended to a failure, or `None` when it succeeded.
fn unsuccessful(ended: &Ended, task: &Task) -> Option<Outcome> {
    match ended {
        Ended::Exited(status) if status.success() => None,
        Ended::Exited(status) => Some(failed(command::describe_exit(*status), status.code())),
        Ended::TimedOut => Some(failed(timed_out(task), None)),
        Ended::Cancelled => Some(cancelled()),
    }
}

fn timed_out(task: &Task) -> String {
    format!(
        "timed out after {}",
        humantime::format_duration(task.timeout.unwrap_or_default())
    )
}

/// Renders and runs one command of a try (the task's own, `publish` or `source_count`) with its
/// output in `log`; `Err` is the outcome when it did not succeed, its error prefixed by `what`.
async fn run_step(
    shared: &Shared,
    task: &Task,
    spec: &CommandSpec,
    input: &TryInput<'_>,
    log: &Path,
    what: Option<&str>,
    stop: &mut watch::Receiver<Stop>,
) -> anyhow::Result<Result<(), Outcome>> {
    let argv = match command::render(spec, &input.ctx) {
        Ok(argv) => argv,
        Err(e) => return Ok(Err(failed(e, None))),
    };
    let ended = match run_process(shared, input.try_id, &argv, &input.env, log, task, stop).await? {
        Ok(ended) => ended,
        Err(e) => return Ok(Err(failed(e, None))),
    };
    Ok(match (unsuccessful(&ended, task), what) {
        (None, _) => Ok(()),
        (Some(Outcome::Failed(mut r)), Some(what)) => {
            r.error = r.error.map(|e| format!("{what} failed: {e}"));
            Err(Outcome::Failed(r))
        }
        (Some(other), _) => Err(other),
    })
}

async fn command_try(
    shared: &Shared,
    task: &Task,
    spec: &CommandSpec,
    input: &TryInput<'_>,
    stop: &mut watch::Receiver<Stop>,
) -> anyhow::Result<Outcome> {
    if let Err(outcome) = run_step(shared, task, spec, input, &input.log_path, None, stop).await? {
        return Ok(outcome);
    }
    let result = match command::read_result(&input.result_path) {
        Ok(r) => r,
        Err(e) => return Ok(failed(e, Some(0))),
    };
    let mut record = TryRecord {
        state: "succeeded".into(),
        exit_code: Some(0),
        ..TryRecord::default()
    };
    if let Some(r) = &result {
        let json = |v: &Option<Vec<serde_json::Value>>| {
            v.as_ref()
                .map(|v| serde_json::Value::Array(v.clone()).to_string())
        };
        record.rows = r.rows;
        record.partitions = json(&r.partitions);
        record.inputs = json(&r.inputs);
        record.fingerprint = r.fingerprint.clone();
    }
    let Some(gate) = &task.gate else {
        return Ok(Outcome::Succeeded(record, None));
    };
    gated_command(shared, task, gate, input, result, record, stop).await
}

/// The gate of a command task: rows from the result file, the source from `source_count`,
/// then the optional `publish` command.
async fn gated_command(
    shared: &Shared,
    task: &Task,
    gate: &Gate,
    input: &TryInput<'_>,
    result: Option<TaskResult>,
    mut record: TryRecord,
    stop: &mut watch::Receiver<Stop>,
) -> anyhow::Result<Outcome> {
    let Some(rows) = result.and_then(|r| r.rows) else {
        return Ok(failed(
            format!(
                "task `{}` has a gate but reported no row count; write {{\"rows\": N}} to $BACKFILL_RESULT",
                task.id
            ),
            Some(0),
        ));
    };
    let source = match &gate.source_count {
        Some(SourceCount::Command(spec)) => {
            match count_command(shared, task, spec, input, stop).await? {
                Ok(n) => Some(n),
                Err(outcome) => return Ok(outcome),
            }
        }
        Some(SourceCount::Sql(_)) | None => None,
    };
    let published = published_rows(shared, task, input.interval).await?;
    let verdict = gate::judge(
        &Measures {
            rows,
            outside: None,
            duplicate_keys: None,
            source,
            published,
        },
        &rules(Some(gate), shared.spec.allow_drift),
    );
    apply_verdict(&mut record, &verdict, source, published);
    if let Verdict::Reject(reason) = verdict {
        record.state = "rejected".into();
        return Ok(Outcome::Rejected(record, reason));
    }
    if let Some(publish) = &task.publish
        && let Err(outcome) = run_step(
            shared,
            task,
            publish,
            input,
            &input.log_path,
            Some("publish command"),
            stop,
        )
        .await?
    {
        return Ok(outcome);
    }
    let fingerprint = record.fingerprint.clone();
    Ok(Outcome::Succeeded(
        record,
        Some(Published { rows, fingerprint }),
    ))
}

/// Runs a `source_count` command and reads the one integer it prints.
async fn count_command(
    shared: &Shared,
    task: &Task,
    spec: &CommandSpec,
    input: &TryInput<'_>,
    stop: &mut watch::Receiver<Stop>,
) -> anyhow::Result<Result<i64, Outcome>> {
    let out = input.log_path.with_extension("source_count.out");
    let _ = std::fs::remove_file(&out);
    if let Err(outcome) = run_step(
        shared,
        task,
        spec,
        input,
        &out,
        Some("source_count command"),
        stop,
    )
    .await?
    {
        return Ok(Err(outcome));
    }
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    Ok(text.trim().parse::<i64>().map_err(|_| {
        failed(
            format!(
                "source_count command printed `{}`, not one integer",
                text.trim()
            ),
            Some(0),
        )
    }))
}

async fn published_rows(
    shared: &Shared,
    task: &Task,
    interval: DataInterval,
) -> anyhow::Result<Option<i64>> {
    let (dag_id, task_id) = (shared.spec.dag.id.clone(), task.id.clone());
    Ok(shared
        .writer
        .call(move |c| manifest::published(c, &dag_id, &task_id, interval.start.timestamp()))
        .await?
        .map(|(_, rows)| rows))
}

/// Gate rules of a task. Without a gate only the boundary check applies (SQL tasks): publishing
/// replaces exactly the interval, so rows outside it would survive a rerun twice.
fn rules(gate: Option<&Gate>, allow_drift: bool) -> Rules {
    match gate {
        Some(g) => Rules {
            tolerance: g.tolerance,
            allow_empty: g.allow_empty,
            allow_drift,
        },
        None => Rules {
            tolerance: f64::INFINITY,
            allow_empty: true,
            allow_drift: true,
        },
    }
}

fn apply_verdict(
    record: &mut TryRecord,
    verdict: &Verdict,
    source: Option<i64>,
    published: Option<i64>,
) {
    record.source_rows = source;
    record.previous_rows = published;
    record.verdict = Some(verdict.as_str().to_string());
    record.reasons = verdict.reason().map(str::to_string);
}

/// A blocking warehouse step that can be cancelled or timed out.
enum Step<T> {
    Done(anyhow::Result<T>),
    TimedOut,
    Cancelled,
}

type Interrupt = Arc<Mutex<Option<InterruptHandle>>>;

async fn blocking_step<T: Send + 'static>(
    timeout: Option<Duration>,
    stop: &mut watch::Receiver<Stop>,
    f: impl FnOnce(&Cancel, &Interrupt) -> anyhow::Result<T> + Send + 'static,
) -> Step<T> {
    let cancel = Cancel::default();
    let interrupt: Interrupt = Arc::default();
    let (c, i) = (cancel.clone(), interrupt.clone());
    let mut job = tokio::task::spawn_blocking(move || f(&c, &i));
    let deadline = tokio::time::sleep(timeout.unwrap_or(Duration::MAX / 4));
    tokio::pin!(deadline);
    let mut stop_open = true;
    let why = loop {
        if *stop.borrow() != Stop::Run {
            break Step::Cancelled;
        }
        tokio::select! {
            joined = &mut job => {
                return Step::Done(joined.unwrap_or_else(|e| Err(anyhow::anyhow!("warehouse step panicked: {e}"))));
            }
            () = &mut deadline, if timeout.is_some() => break Step::TimedOut,
            changed = stop.changed(), if stop_open => {
                if changed.is_err() {
                    stop_open = false;
                }
            }
        }
    };
    cancel.set();
    if let Ok(slot) = interrupt.lock()
        && let Some(handle) = slot.as_ref()
    {
        handle.interrupt();
    }
    let _ = job.await;
    why
}

async fn sql_try(
    shared: &Shared,
    task: &Task,
    sql: &SqlTask,
    input: &TryInput<'_>,
    stop: &mut watch::Receiver<Stop>,
) -> anyhow::Result<Outcome> {
    let binds = Binds::new(input.interval, shared.spec.dag.tz);
    let audit = warehouse::audit_table(sql, input.try_id);
    let mut log = TryLog::open(&input.log_path);
    log.line(&format!(
        "warehouse `{}`: computing {} for [{}, {}) into {audit}",
        sql.warehouse.name, sql.target, binds.data_interval_start, binds.data_interval_end
    ));
    let (s, g, a, b) = (sql.clone(), task.gate.clone(), audit.clone(), binds.clone());
    let step = blocking_step(task.timeout, stop, move |cancel, interrupt| {
        let conn = warehouse::open(&s.warehouse)?;
        if let Ok(mut slot) = interrupt.lock() {
            *slot = Some(conn.get_interrupt_handle());
        }
        warehouse::write_audit(&conn, &s, &a, &b, Some(cancel.flag()))?;
        let measures = warehouse::measure(&conn, &s, g.as_ref(), &a, &b)?;
        let source = match g.as_ref().and_then(|g| g.source_count.as_ref()) {
            Some(SourceCount::Sql(q)) => Some(warehouse::source_count(&conn, q, &b)?),
            _ => None,
        };
        Ok((measures, source))
    })
    .await;
    let (measures, source) = match step {
        Step::Done(Ok(v)) => v,
        unfinished => {
            drop_audit(sql, &audit).await;
            let error = match unfinished {
                Step::Done(Err(e)) => format!("{e:#}"),
                Step::TimedOut => timed_out(task),
                Step::Done(Ok(_)) | Step::Cancelled => return Ok(cancelled()),
            };
            log.line(&error);
            return Ok(failed(error, None));
        }
    };
    let published = published_rows(shared, task, input.interval).await?;
    let verdict = gate::judge(
        &Measures {
            rows: measures.rows,
            outside: Some(measures.outside),
            duplicate_keys: measures.duplicate_keys,
            source,
            published,
        },
        &rules(task.gate.as_ref(), shared.spec.allow_drift),
    );
    log.line(&format!(
        "rows {} (source {}, published {}), fingerprint {}: {verdict}",
        measures.rows,
        source.map_or("-".into(), |n| n.to_string()),
        published.map_or("-".into(), |n| n.to_string()),
        measures.fingerprint
    ));
    let mut record = TryRecord {
        state: "succeeded".into(),
        rows: Some(measures.rows),
        fingerprint: Some(measures.fingerprint.clone()),
        ..TryRecord::default()
    };
    apply_verdict(&mut record, &verdict, source, published);
    if let Verdict::Reject(reason) = verdict {
        drop_audit(sql, &audit).await;
        record.state = "rejected".into();
        return Ok(Outcome::Rejected(record, reason));
    }
    let (intent, audit_name) = (record.clone(), audit.clone());
    let try_id = input.try_id;
    let may_publish = shared
        .writer
        .call(move |c| manifest::record_publish_intent(c, try_id, Some(&audit_name), &intent))
        .await?;
    if !may_publish {
        // Fenced: another process took this interval over; its result stands.
        drop_audit(sql, &audit).await;
        return Ok(cancelled());
    }
    fault_point(shared, "before-publish");
    // A started publish is short and always finished: stopping halfway would help nobody.
    let (s, a, b) = (sql.clone(), audit.clone(), binds.clone());
    let rows = tokio::task::spawn_blocking(move || {
        let conn = warehouse::open(&s.warehouse)?;
        warehouse::publish(&conn, &s, Some(&a), &b, None)
    })
    .await
    .map_err(|e| anyhow::anyhow!("publish panicked: {e}"))?;
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => {
            log.line(&format!("publish failed: {e:#}"));
            return Ok(failed(format!("publish failed: {e:#}"), None));
        }
    };
    fault_point(shared, "after-publish");
    log.line(&format!("published {rows} rows into {}", sql.target));
    Ok(Outcome::Succeeded(
        record,
        Some(Published {
            rows,
            fingerprint: Some(measures.fingerprint),
        }),
    ))
}

async fn drop_audit(sql: &SqlTask, audit: &str) {
    let (w, a) = (sql.warehouse.clone(), audit.to_string());
    let _ = tokio::task::spawn_blocking(move || {
        warehouse::open(&w).and_then(|c| warehouse::drop_audit(&c, &a))
    })
    .await;
}

/// Crash injection for tests: `BACKFILL_FAULT=before-publish|after-publish` aborts the process
/// at that point, as a power cut or `kill -9` would.
fn fault_point(shared: &Shared, point: &str) {
    if shared.spec.fault.as_deref() == Some(point) {
        std::process::abort();
    }
}

/// The log file of a SQL try.
struct TryLog(Option<std::fs::File>);

impl TryLog {
    fn open(path: &Path) -> Self {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        Self(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .ok(),
        )
    }

    fn line(&mut self, text: &str) {
        use std::io::Write;
        if let Some(f) = &mut self.0 {
            let _ = writeln!(f, "{text}");
        }
    }
}

/// `retry_delay * 2^(try_number - 1)`, capped.
pub fn retry_delay(base: Duration, try_number: u32) -> Duration {
    let factor = 2u32.saturating_pow(try_number.saturating_sub(1));
    base.checked_mul(factor)
        .unwrap_or(MAX_RETRY_DELAY)
        .min(MAX_RETRY_DELAY)
}

/// Sleeps before the next try; returns false when a stop came first.
async fn wait_before_retry(
    base: Duration,
    try_number: u32,
    stop: &mut watch::Receiver<Stop>,
) -> bool {
    let sleep = tokio::time::sleep(retry_delay(base, try_number));
    tokio::pin!(sleep);
    loop {
        if *stop.borrow() != Stop::Run {
            return false;
        }
        tokio::select! {
            () = &mut sleep => return true,
            changed = stop.changed() => {
                if changed.is_err() {
                    (&mut sleep).await;
                    return true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let base = Duration::from_secs(5);
        assert_eq!(retry_delay(base, 1), Duration::from_secs(5));
        assert_eq!(retry_delay(base, 2), Duration::from_secs(10));
        assert_eq!(retry_delay(base, 3), Duration::from_secs(20));
        assert_eq!(retry_delay(base, 40), MAX_RETRY_DELAY);
    }
}

//! Readiness (`[tasks.ready]`): before an interval's run starts, each of its tasks that has a
//! readiness check is asked, in `depends_on` order, whether the interval's sources are there.
//! The interval waits, asking again every `every`, until all answer ready or one's `wait` runs
//! out: then it is not run, and its plan row says `not ready`. A waiting interval holds no place
//! of `max_active_runs` and no slot of a pool (the dispatcher starts it once it is ready), and
//! each answer is recorded in the manifest, so that `show` and the status page see the wait.
//!
//! A check that fails (a query error, a command that exits with neither 0 nor 1, or runs out of
//! time) counts as not ready, its error as the answer, and is said once as a warning: a source
//! that is not there yet can make a query fail (a table not created yet).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Event, Shared, Stop};
use crate::exit::Error;
use crate::interval::DataInterval;
use crate::manifest::readiness::Asked;
use crate::project::{Gate, ReadyCheck, SourceCount, Task, TaskKind};
use crate::state::ReadyState;
use crate::task::command;
use crate::task::template::IntervalValues;

/// How an interval's wait for its sources ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waited {
    /// Every check answered ready: the run may start.
    Ready,
    /// A check was still not ready when its wait ran out (recorded: the interval is skipped).
    NotReady,
    /// A stop came first: the interval stays planned, for `resume`.
    Stopped,
}

/// How long a readiness check may take to answer, at least and at most (else its `every`).
const LEAST_COMMAND_TIME: Duration = Duration::from_secs(30);
const MOST_COMMAND_TIME: Duration = Duration::from_secs(600);

/// Whether a DAG of `tasks` asks readiness before its intervals.
pub(super) fn asks(tasks: &[Task]) -> bool {
    tasks.iter().any(|t| t.ready.is_some())
}

/// Waits until the interval's sources are ready (see the module's doc). `asking` bounds how
/// many checks run at once.
pub(super) async fn wait_until_ready(
    shared: Arc<Shared>,
    interval: DataInterval,
    mut stop: watch::Receiver<Stop>,
    asking: Arc<tokio::sync::Semaphore>,
    first: FirstAnswer,
) -> Result<Waited, Error> {
    wait(&shared, interval, &mut stop, &asking, &first).await
}

/// Tells the dispatcher that an interval's first answer was not ready: the intervals found
/// ready start in the plan's order, so one found ready waits for the first answers of those
/// before it (an interval's end, ready or not, the dispatcher learns when it joins its wait).
pub(super) struct FirstAnswer {
    place: usize,
    to: tokio::sync::mpsc::UnboundedSender<usize>,
}

impl FirstAnswer {
    pub(super) fn new(place: usize, to: tokio::sync::mpsc::UnboundedSender<usize>) -> Self {
        Self { place, to }
    }

    /// Said again after the first time, it changes nothing.
    fn said(&self) {
        let _ = self.to.send(self.place);
    }
}

async fn wait(
    shared: &Arc<Shared>,
    interval: DataInterval,
    stop: &mut watch::Receiver<Stop>,
    asking: &tokio::sync::Semaphore,
    first: &FirstAnswer,
) -> Result<Waited, Error> {
    let spec = &shared.spec;
    let mut said_waiting = false;
    let mut held = false;
    let mut warned = false;
    let mut ended = Waited::Ready;
    // A worker that winds down starts no run: it stops waiting too.
    let mut wind_down = spec.wind_down.clone();
    // One wait for the interval, whichever of its tasks it waits for.
    let began = Instant::now();
    for task in &spec.dag.tasks {
        let Some(ready) = &task.ready else { continue };
        let wait = spec.wait_ready.unwrap_or(ready.wait);
        let mut asks = 0u32;
        loop {
            if *stop.borrow() != Stop::Run || shared.winding_down() {
                ended = Waited::Stopped;
                break;
            }
            let answer = {
                let _permit = asking.acquire().await;
                ask(shared, task, &ready.check, interval, ready.every, stop).await
            };
            // Stopped while it asked: no answer counts, the interval stays planned.
            if *stop.borrow() != Stop::Run || shared.winding_down() {
                ended = Waited::Stopped;
                break;
            }
            asks += 1;
            let waited = began.elapsed();
            let (state, text) = match answer {
                Ok(Answer::Ready(text)) => (ReadyState::Ready, text),
                Ok(Answer::NotReady(text)) => (ReadyState::Waiting, text),
                Err(error) => {
                    if !warned {
                        warned = true;
                        let _ = shared.events.send(Event::ReadyCheckFailed {
                            interval,
                            task_id: task.id.clone(),
                            error: error.clone(),
                        });
                    }
                    (
                        ReadyState::Waiting,
                        Some(format!("the check failed: {error}")),
                    )
                }
            };
            // Asked a last time when the wait runs out.
            let state = match state {
                ReadyState::Waiting if waited >= wait => ReadyState::NotReady,
                s => s,
            };
            // One process of the backfill waits for an interval (`backfill join`): it holds
            // it as a batch holds its intervals, and the others leave it alone. (One found
            // ready at once is claimed as any interval is: by the commit that starts its run.)
            if state != ReadyState::Ready && !held {
                if !hold(shared, interval).await? {
                    ended = Waited::Stopped;
                    break;
                }
                held = true;
            }
            let asked = Asked {
                dag_id: spec.dag.id.clone(),
                interval,
                task_id: task.id.clone(),
                state,
                asks,
                answer: text.filter(|t| !t.is_empty()).map(|t| shortened(&t)),
                waited_ms: i64::try_from(waited.as_millis()).unwrap_or(i64::MAX),
                wait_ms: i64::try_from(wait.as_millis()).unwrap_or(i64::MAX),
            };
            let owner = spec.owner;
            let noted = shared
                .writer
                .call(move |c| c.note_readiness(c.fence(owner)?, &asked))
                .await?;
            if !noted {
                // Started or given up on by another process of the backfill meanwhile.
                ended = Waited::Stopped;
                break;
            }
            match state {
                ReadyState::Ready => break,
                ReadyState::NotReady => {
                    let _ = shared.events.send(Event::IntervalSkipped {
                        interval,
                        reason: crate::plan::SkipReason::NotReady,
                    });
                    ended = Waited::NotReady;
                    break;
                }
                ReadyState::Waiting => first.said(),
            }
            if !said_waiting {
                said_waiting = true;
                let _ = shared.events.send(Event::ReadyWait {
                    interval,
                    task_id: task.id.clone(),
                    waiting: true,
                    left: wait.saturating_sub(waited),
                });
            }
            let sleep = tokio::time::sleep(ready.every.min(wait.saturating_sub(waited)));
            tokio::pin!(sleep);
            tokio::select! {
                () = &mut sleep => {}
                _ = stop.changed() => {}
                () = super::wound_down(&mut wind_down) => {}
            }
        }
        if ended != Waited::Ready {
            break;
        }
    }
    if said_waiting {
        let _ = shared.events.send(Event::ReadyWait {
            interval,
            task_id: String::new(),
            waiting: false,
            left: Duration::ZERO,
        });
    }
    Ok(ended)
}

/// The longest answer recorded, in characters: what a check says is a line, not a report.
const LONGEST_ANSWER: usize = 500;

/// An answer as it is recorded: at most [`LONGEST_ANSWER`] characters, control characters
/// (a terminal's colours) left out.
fn shortened(answer: &str) -> String {
    // A terminal's escape sequence (`ESC [ ... letter`) goes whole.
    let mut kept = String::with_capacity(answer.len());
    let mut chars = answer.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for e in chars.by_ref() {
                if e.is_ascii_alphabetic() {
                    break;
                }
            }
        } else if !c.is_control() {
            kept.push(c);
        }
    }
    match kept.char_indices().nth(LONGEST_ANSWER) {
        Some((at, _)) => format!("{}...", &kept[..at]),
        None => kept,
    }
}

/// Makes this process hold `interval` while it waits for its sources (see
/// [`crate::manifest::leases::reserve_batch`]); `false` when another live process of the
/// backfill holds it.
async fn hold(shared: &Shared, interval: DataInterval) -> Result<bool, Error> {
    let (owner, dag_id) = (shared.spec.owner, shared.spec.dag.id.clone());
    let ctx =
        crate::manifest::leases::LeaseCtx::new(shared.spec.lease_timeout, &crate::process::LOCAL);
    let start = interval.start.timestamp();
    let reserved = shared
        .writer
        .call(move |c| c.reserve_batch(c.fence(owner)?, &dag_id, &[start], 1, &ctx))
        .await?;
    Ok(!reserved.held.is_empty())
}

/// What a readiness check answered, with what it said (the query's value, or the command's
/// last line of output).
enum Answer {
    Ready(Option<String>),
    NotReady(Option<String>),
}

/// Asks a task's readiness check once for `interval`; `Err` when the check itself failed.
async fn ask(
    shared: &Shared,
    task: &Task,
    check: &ReadyCheck,
    interval: DataInterval,
    every: Duration,
    stop: &mut watch::Receiver<Stop>,
) -> Result<Answer, String> {
    let time = answer_time(every);
    match (check, &task.kind) {
        (ReadyCheck::Sql(sql), TaskKind::Sql(s)) => {
            let (s, sql, tz) = (s.clone(), sql.clone(), shared.spec.dag.tz);
            let query = tokio::task::spawn_blocking(move || ask_sql(&s, &sql, interval, tz));
            // A query that does not answer in time, or a stop, is not waited for: it is left
            // to end on its thread (the process ends without waiting for it).
            tokio::select! {
                answered = query => answered.map_err(|e| format!("the check panicked: {e}"))?,
                () = tokio::time::sleep(time) => Err(format!(
                    "it did not answer within {}",
                    humantime::format_duration(time)
                )),
                _ = stop.changed() => Err("stopped".into()),
            }
        }
        (ReadyCheck::Sql(_), TaskKind::Command(_)) => {
            Err("a command task has no warehouse to run `sql` on".into())
        }
        (ReadyCheck::Command(spec), _) => {
            ask_command(shared, task, spec, interval, time, stop).await
        }
    }
}

/// How long a check may take to answer: its `every`, at least 30 s and at most 10 minutes.
fn answer_time(every: Duration) -> Duration {
    every.clamp(LEAST_COMMAND_TIME, MOST_COMMAND_TIME)
}

/// Runs the query in the task's warehouse: its one value (no row is NULL) says ready when it
/// is true or a number other than 0.
fn ask_sql(
    task: &crate::project::SqlTask,
    sql: &str,
    interval: DataInterval,
    tz: chrono_tz::Tz,
) -> Result<Answer, String> {
    // One row always: the query's first value, or NULL when it has none.
    let one = format!("SELECT (\n{}\n)", crate::warehouse::strip(sql));
    let gate = Gate {
        source_fingerprint: Some(SourceCount::Sql(one)),
        ..Gate::default()
    };
    let binds = crate::warehouse::Binds::new(interval, tz);
    let (_, value) = crate::warehouse::backend_of(&task.warehouse)
        .look(task, &gate, &binds, tz)
        .map_err(|e| e.to_string())?;
    let value = value.unwrap_or_else(|| "NULL".into());
    Ok(if truthy(&value) {
        Answer::Ready(Some(value))
    } else {
        Answer::NotReady(Some(value))
    })
}

/// Whether a query's value says ready: true, or a number other than 0.
fn truthy(value: &str) -> bool {
    let v = value.trim().to_ascii_lowercase();
    match v.as_str() {
        "t" | "true" => true,
        _ => v.parse::<f64>().is_ok_and(|n| n.is_finite() && n != 0.0),
    }
}

/// Runs the command (rendered as a try's, in the project folder), its output appended to the
/// interval's readiness log: exit 0 is ready, 1 not ready; its last line of output is the
/// answer.
async fn ask_command(
    shared: &Shared,
    task: &Task,
    spec: &crate::project::CommandSpec,
    interval: DataInterval,
    time: Duration,
    stop: &mut watch::Receiver<Stop>,
) -> Result<Answer, String> {
    let s = &shared.spec;
    let values = IntervalValues::new(interval, s.dag.tz);
    let ctx = values.context(&s.dag.id, &task.id, "", 0, &s.conf);
    let (log, result) = command::ready_paths(&s.logs_dir, &s.dag.id, interval.start, &task.id);
    let env = command::environment(&ctx, &shared.conf_text, &result);
    let program = command::render(spec, &ctx)?;
    // The log holds this ask's output only: its last line is this ask's answer.
    let _ = std::fs::remove_file(&log);
    crate::process::open_log(&log).map_err(|e| format!("cannot open its log: {e}"))?;
    let spawned = crate::process::start(crate::process::Command {
        program: &program,
        env: &env,
        cwd: &s.project_root,
        input: crate::process::Input::Null,
        output: crate::process::Output::Log(log.clone()),
    })
    .await
    .map_err(|e| format!("cannot start: {e}"))?;
    // Stopped (SIGTERM, then SIGKILL after the task's grace period) by a stop of the backfill.
    let finished = crate::process::finish(spawned, Some(time), task.grace_period, stop)
        .await
        .map_err(|e| format!("cannot be waited for: {e}"))?;
    let said = Some(command::log_tail(&log, 1).trim().to_string()).filter(|l| !l.is_empty());
    match finished.ended {
        crate::process::Ended::Exited(status) if status.success() => Ok(Answer::Ready(said)),
        crate::process::Ended::Exited(status) if status.code() == Some(1) => {
            Ok(Answer::NotReady(said))
        }
        crate::process::Ended::Exited(status) => Err(format!(
            "{} (0 is ready, 1 not ready; see {})",
            crate::process::describe_exit(status),
            log.display()
        )),
        crate::process::Ended::TimedOut => Err(format!(
            "it did not answer within {} and was stopped",
            humantime::format_duration(time)
        )),
        crate::process::Ended::Cancelled => Err("stopped".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::truthy;

    #[test]
    fn answers_are_one_short_line() {
        assert_eq!(
            super::shortened("\u{1b}[31mno file\u{1b}[0m\u{7}"),
            "no file"
        );
        let long = "x".repeat(2000);
        assert_eq!(super::shortened(&long).len(), super::LONGEST_ANSWER + 3);
    }

    #[test]
    fn true_and_numbers_other_than_zero_are_ready() {
        for ready in ["t", "true", "TRUE", "1", "42", "0.5", "-1"] {
            assert!(truthy(ready), "{ready}");
        }
        for not in [
            "f",
            "false",
            "0",
            "0.0",
            "NULL",
            "",
            "yes",
            "landed",
            "nan",
            "inf",
            "-infinity",
        ] {
            assert!(!truthy(not), "{not}");
        }
    }
}

//! Chaos: backfills of a command DAG and of a SQL DAG are killed (`kill -9`), frozen
//! (SIGSTOP/SIGCONT), crashed at fault points, taken over and resumed at random moments, with
//! concurrent backfills over overlapping ranges and processes that join them (`backfill join`). After each iteration, once everything is left
//! to finish, the invariants the README promises must hold:
//!
//! - every interval of the range succeeded exactly once in the final state;
//! - no two copies of an interval ever ran at once (the tasks detect it with `flock -n`);
//! - the warehouse equals a direct computation: no duplicate and no missing partition;
//! - nothing is left behind: no audit file or table, temporary file, lease or process;
//! - the manifest and the warehouse pass `PRAGMA integrity_check`.
//!
//! A second test attacks staging, promote and rollback of the SQL DAG, and cascades from the
//! command DAG to one downstream of it, the same way: one staged output per task and interval
//! awaits promotion and each is published once, every partition holds what the manifest says
//! it holds, and no downstream day runs before its upstream day succeeded.
//!
//! `cargo test` runs a few iterations; `examples/chaos/run.sh ITERATIONS SEED` runs many
//! (`CHAOS_ITERATIONS`, `CHAOS_SEED`).

#[path = "parts/mod.rs"]
mod parts;
#[path = "pg/mod.rs"]
mod pg;
#[path = "cli/support.rs"]
#[expect(
    dead_code,
    reason = "the chaos suite uses part of the end-to-end helpers"
)]
mod support;

use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::{Out, Project, alive, signal};

/// A small seeded generator (xorshift64*): the same seed replays the same choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const CMD_DAG: &str = r#"
schedule = "@daily"
max_active_runs = 3
retries = 1
retry_delay = "10ms"
grace_period = "500ms"
[[tasks]]
id = "work"
command = '''
mkdir -p locks out
exec 9> "locks/{{ ds }}"
if ! flock -n 9; then echo "{{ ds }} $BACKFILL_RUN_ID" >> overlaps.txt; exit 1; fi
echo $$ >> pids.txt
sleep 0.$(( {{ ds_nodash }} % 3 + 1 ))
printf '%s\n' "{{ ds }}" > "out/{{ ds }}.tmp" && mv "out/{{ ds }}.tmp" "out/{{ ds }}"
'''
"#;

/// Downstream of `cmd` (for cascades): each day copies what `cmd` wrote for it, and records
/// a violation when that output is missing (the day ran before its upstream day succeeded) or
/// when another copy of the same day runs at once.
const ROLLUP_DAG: &str = r#"
schedule = "@daily"
upstream = ["cmd"]
max_active_runs = 3
retries = 1
retry_delay = "10ms"
grace_period = "500ms"
[[tasks]]
id = "roll"
command = '''
mkdir -p locks rolled
exec 9> "locks/roll-{{ ds }}"
if ! flock -n 9; then echo "roll {{ ds }} $BACKFILL_RUN_ID" >> overlaps.txt; exit 1; fi
echo $$ >> pids.txt
if [ ! -e "out/{{ ds }}" ]; then echo "roll {{ ds }} before its upstream" >> overlaps.txt; exit 1; fi
sleep 0.1
cp "out/{{ ds }}" "rolled/{{ ds }}.tmp" && mv "rolled/{{ ds }}.tmp" "rolled/{{ ds }}"
'''
"#;

const SQL_DAG: &str = r#"
schedule = "@daily"
max_active_runs = 3
retries = 2
retry_delay = "10ms"
[[tasks]]
id = "totals"
warehouse = "w"
target = "daily_totals"
partition_column = "day"
sql = """
SELECT date(ts) AS day, region, COUNT(*) AS n, SUM(amount) AS total
FROM raw WHERE ts >= :data_interval_start AND ts < :data_interval_end
GROUP BY 1, 2
"""
[tasks.gate]
unique_key = ["day", "region"]
source_count = """
SELECT COUNT(DISTINCT region) FROM raw
WHERE ts >= :data_interval_start AND ts < :data_interval_end
"""
"#;

const INIT_SQL: &str = "
CREATE TABLE raw (ts TEXT NOT NULL, region TEXT NOT NULL, amount INTEGER NOT NULL);
CREATE INDEX raw_ts ON raw (ts);
INSERT INTO raw
  WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 5999)
  SELECT datetime('2026-01-01', '+' || (i * 211) || ' seconds'),
         CASE i % 4 WHEN 0 THEN 'eu' WHEN 1 THEN 'us' WHEN 2 THEN 'apac' ELSE 'latam' END,
         (i * 37) % 1000
  FROM n;
CREATE TABLE daily_totals (day TEXT NOT NULL, region TEXT NOT NULL, n INTEGER, total INTEGER);
CREATE INDEX daily_totals_day ON daily_totals (day);
CREATE UNIQUE INDEX daily_totals_key ON daily_totals (day, region);
";

/// The range every backfill of an iteration works on: 2026-01-01 .. 2026-01-12.
const FROM: &str = "2026-01-01";
const TO: &str = "2026-01-12";
const DAYS: usize = 12;

fn project() -> Project {
    let p = Project::new()
        .dag("cmd", CMD_DAG)
        .dag("sql", SQL_DAG)
        .dag("rollup", ROLLUP_DAG);
    p.write(
        "backfill.toml",
        "lease_timeout = \"1s\"\n[warehouse.w]\npath = \"w.db\"\ninit = [\"init.sql\"]\n",
    );
    p.write("init.sql", INIT_SQL);
    p
}

/// Fault points a process may be started with (at most one each).
const FAULTS: &[&str] = &[
    "",
    "",
    "",
    "after-spawn@2",
    "before-release@3:stop",
    "after-audit@2",
    "before-publish@2",
    "after-publish@3",
    "publish@1:fail",
    "slow-commit:15ms",
    "record-end@2:fail",
    "before-commit@2",
    "before-commit@1:stop",
];

struct Chaos {
    p: Project,
    rng: Rng,
    /// Every process started, with its name and fault; all must have exited at the end.
    procs: Vec<(String, Child)>,
    faults: Vec<&'static str>,
    log: Vec<String>,
    seq: usize,
}

impl Chaos {
    fn start(&mut self, args: &[&str]) -> usize {
        let fault = *self.rng.pick(FAULTS);
        self.seq += 1;
        let name = format!("p{}", self.seq);
        let child = self.p.spawn_with(&name, args, &[("BACKFILL_FAULT", fault)]);
        self.log.push(format!(
            "{name} pid {} {args:?} fault {fault:?}",
            child.id()
        ));
        self.procs.push((name, child));
        self.faults.push(fault);
        self.procs.len() - 1
    }

    fn sleep(&mut self, max_ms: u64) {
        std::thread::sleep(Duration::from_millis(self.rng.below(max_ms)));
    }

    /// The id of the newest backfill of `dag`, once it exists.
    fn newest(&self, dag: &str) -> Option<i64> {
        if !self.p.has_manifest() {
            return None;
        }
        let id = self.p.count(&format!(
            "SELECT COALESCE(MAX(id), 0) FROM backfills WHERE dag_id = '{dag}'"
        ));
        (id > 0).then_some(id)
    }

    fn running(&mut self, i: usize) -> bool {
        matches!(self.procs[i].1.try_wait(), Ok(None))
    }

    /// One round of disruption of the process `i`.
    fn disrupt(&mut self, i: usize, dag: &str) {
        let action = self.rng.below(5);
        self.sleep(700);
        if !self.running(i) {
            return;
        }
        match action {
            0 => {
                self.log.push(format!("kill -9 {}", self.procs[i].0));
                signal(&self.procs[i].1, Signal::SIGKILL);
                let _ = self.procs[i].1.wait();
                if let Some(id) = self.newest(dag) {
                    self.start(&["resume", &id.to_string()]);
                }
            }
            1 => {
                self.log.push(format!("freeze {}", self.procs[i].0));
                signal(&self.procs[i].1, Signal::SIGSTOP);
                self.sleep(1800);
                if self.rng.below(2) == 0
                    && let Some(id) = self.newest(dag)
                {
                    self.start(&["resume", &id.to_string()]);
                    self.sleep(1200);
                }
                self.log.push(format!("thaw {}", self.procs[i].0));
                signal(&self.procs[i].1, Signal::SIGCONT);
            }
            // Another process joins the newest backfill (refused when it is not running).
            4 => {
                if let Some(id) = self.newest(dag) {
                    self.start(&["join", &id.to_string()]);
                }
            }
            _ => {
                let behavior = *self.rng.pick(&["none", "failed"]);
                self.start(&[
                    "create",
                    "--dag",
                    dag,
                    "--from",
                    FROM,
                    "--to",
                    TO,
                    "--reprocess-behavior",
                    behavior,
                ]);
            }
        }
    }

    /// The id of the newest backfill that `condition` (SQL on `backfills`) selects.
    fn newest_where(&self, condition: &str) -> Option<i64> {
        if !self.p.has_manifest() {
            return None;
        }
        let id = self.p.count(&format!(
            "SELECT COALESCE(MAX(id), 0) FROM backfills WHERE {condition}"
        ));
        (id > 0).then_some(id)
    }

    /// One round of disruption of the process `i`, whose backfill is the newest that `which`
    /// selects: kill -9 then resume it, or freeze it (while a taker resumes or cancels it) then
    /// thaw it, or start `concurrent` beside it.
    fn disrupt_any(&mut self, i: usize, which: &str, concurrent: &[&str]) {
        let action = self.rng.below(3);
        self.sleep(700);
        if !self.running(i) {
            return;
        }
        match action {
            0 => {
                self.log.push(format!("kill -9 {}", self.procs[i].0));
                signal(&self.procs[i].1, Signal::SIGKILL);
                let _ = self.procs[i].1.wait();
                if let Some(id) = self.newest_where(which) {
                    self.start(&["resume", &id.to_string()]);
                }
            }
            1 => {
                self.log.push(format!("freeze {}", self.procs[i].0));
                signal(&self.procs[i].1, Signal::SIGSTOP);
                self.sleep(1800);
                if let Some(id) = self.newest_where(which) {
                    let taker = *self.rng.pick(&["resume", "cancel", "wait"]);
                    if taker != "wait" {
                        self.start(&[taker, &id.to_string()]);
                        self.sleep(1200);
                    }
                }
                self.log.push(format!("thaw {}", self.procs[i].0));
                signal(&self.procs[i].1, Signal::SIGCONT);
            }
            _ => {
                self.start(concurrent);
            }
        }
    }

    /// Starts `args`, disrupts it (and whatever it or its takers started) for a few rounds,
    /// then lets everything finish.
    fn attack(&mut self, args: &[&str], which: &str, concurrent: &[&str]) {
        let first = self.start(args);
        for _ in 0..1 + self.rng.below(3) {
            let target = (0..self.procs.len())
                .rev()
                .find(|&i| self.running(i))
                .unwrap_or(first);
            self.disrupt_any(target, which, concurrent);
        }
        self.settle();
    }

    /// Resumes every backfill that `condition` selects and that has not ended, without faults.
    fn resume_unfinished(&mut self, condition: &str) {
        for _ in 0..4 {
            if !self.p.has_manifest() {
                return;
            }
            let open = self.p.rows(&format!(
                "SELECT id FROM backfills WHERE ({condition}) AND state IN ('running', 'cancelled') ORDER BY id"
            ));
            if open.is_empty() {
                return;
            }
            for row in open {
                let out = self.run(&["resume", &row[0]]);
                self.log
                    .push(format!("resume {}: exit {}", row[0], out.code));
                assert_ne!(out.code, 1, "resume hit an internal error:\n{}", out.stderr);
            }
        }
    }

    /// Lets every process finish: thaws them all and waits. A process that does not end in
    /// time fails the iteration.
    fn settle(&mut self) {
        for (_, child) in &self.procs {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                Signal::SIGCONT,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        for k in 0..self.procs.len() {
            loop {
                match self.procs[k].1.try_wait() {
                    Ok(Some(status)) => {
                        let name = self.procs[k].0.clone();
                        let out = self.p.read(&format!("{name}.err"));
                        self.log.push(format!("{name} ended: {status}"));
                        // A failing manifest write is an internal error by design.
                        let injected = self.faults[k].starts_with("record-end");
                        assert!(
                            status.code() != Some(1) || injected,
                            "{name} hit an internal error:\n{out}\n{}",
                            self.log.join("\n")
                        );
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        // A process may freeze itself at a fault point after it was thawed
                        // (and another may wait for it).
                        for (_, child) in &self.procs {
                            if support::stopped(child.id()) {
                                signal(child, Signal::SIGCONT);
                            }
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    _ => panic!("{} did not end:\n{}", self.procs[k].0, self.log.join("\n")),
                }
            }
        }
    }

    fn run(&self, args: &[&str]) -> Out {
        self.p.run(args)
    }
}

/// Finishes everything that is unfinished, without faults: resumes what can be resumed, then
/// reruns what failed or was cancelled.
fn converge(c: &mut Chaos, dag: &str) {
    for _ in 0..4 {
        if c.p.has_manifest() {
            let open: Vec<Vec<String>> = c.p.rows(&format!(
                "SELECT id FROM backfills WHERE dag_id = '{dag}' AND state != 'completed' ORDER BY id"
            ));
            for row in open {
                let out = c.run(&["resume", &row[0]]);
                c.log.push(format!("resume {}: exit {}", row[0], out.code));
                assert_ne!(out.code, 1, "resume hit an internal error:\n{}", out.stderr);
            }
        }
        let out = c.run(&[
            "create",
            "--dag",
            dag,
            "--from",
            FROM,
            "--to",
            TO,
            "--reprocess-behavior",
            "failed",
        ]);
        c.log.push(format!("final create: exit {}", out.code));
        assert_ne!(out.code, 1, "create hit an internal error:\n{}", out.stderr);
        if out.code == 0 {
            return;
        }
    }
    panic!("{dag} did not converge:\n{}", c.log.join("\n"));
}

/// Processes whose working folder is the project: tries left running.
fn processes_in(dir: &std::path::Path) -> Vec<i64> {
    let Ok(dir) = dir.canonicalize() else {
        return Vec::new();
    };
    let me = i64::from(std::process::id());
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i64>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == dir)
                && alive(*pid as i32)
        })
        .collect()
}

fn check(c: &Chaos, dag: &str) {
    let p = &c.p;
    let why = || c.log.join("\n");
    // Every interval succeeded exactly once.
    let succeeded = p.rows(&format!(
        "SELECT interval_start, COUNT(*) FROM runs WHERE dag_id = '{dag}' AND state = 'succeeded'
         GROUP BY interval_start ORDER BY interval_start"
    ));
    assert_eq!(succeeded.len(), DAYS, "{}", why());
    assert!(
        succeeded.iter().all(|r| r[1] == "1"),
        "an interval succeeded twice: {succeeded:?}\n{}",
        why()
    );
    let latest_not_ok = p.count(&format!(
        "SELECT COUNT(*) FROM runs r JOIN (SELECT MAX(id) id FROM runs WHERE dag_id = '{dag}'
           GROUP BY interval_start) m ON m.id = r.id WHERE r.state != 'succeeded'"
    ));
    assert_eq!(latest_not_ok, 0, "{}", why());
    // No two copies at once, nothing left behind, an intact manifest.
    check_clean(c);
    let temp: Vec<String> = std::fs::read_dir(p.path(""))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".init-") || n.ends_with(".tmp"))
        .collect();
    assert!(temp.is_empty(), "temporary files left: {temp:?}\n{}", why());
    for pid in p
        .read("pids.txt")
        .lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
    {
        assert!(!alive(pid), "try process {pid} left\n{}", why());
    }
    match dag {
        "cmd" => {
            let mut out: Vec<String> = std::fs::read_dir(p.path("out"))
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            out.sort();
            let expected: Vec<String> = (1..=DAYS).map(|d| format!("2026-01-{d:02}")).collect();
            assert_eq!(out, expected, "{}", why());
        }
        _ => {
            let wh = rusqlite::Connection::open(p.path("w.db")).unwrap();
            let rows = |sql: &str| -> Vec<String> {
                let mut stmt = wh.prepare(sql).unwrap();
                let n = stmt.column_count();
                stmt.query_map([], |r| {
                    Ok((0..n)
                        .map(|i| format!("{:?}", r.get::<_, rusqlite::types::Value>(i).unwrap()))
                        .collect::<Vec<_>>()
                        .join("|"))
                })
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
            };
            let published = rows("SELECT day, region, n, total FROM daily_totals ORDER BY 1, 2");
            let direct = rows(
                "SELECT date(ts), region, COUNT(*), SUM(amount) FROM raw
                 WHERE ts >= '2026-01-01' AND ts < '2026-01-13' GROUP BY 1, 2 ORDER BY 1, 2",
            );
            assert_eq!(
                published,
                direct,
                "the warehouse differs from a direct computation\n{}",
                why()
            );
            assert_eq!(rows("PRAGMA integrity_check"), ["Text(\"ok\")"]);
            assert_eq!(
                rows(
                    "SELECT name FROM sqlite_master WHERE name LIKE '_backfill_audit%' OR name LIKE '_backfill_verify%'"
                ),
                Vec::<String>::new()
            );
            // One published try per day, and it is a succeeded one.
            assert_eq!(
                p.count(
                    "SELECT COUNT(*) FROM published pb JOIN task_tries t ON t.id = pb.try_id
                     WHERE t.state = 'succeeded'"
                ),
                DAYS as i64,
                "{}",
                why()
            );
        }
    }
}

/// Nothing left behind: no lease, unfinished try, running backfill, audit file or process, and
/// an intact manifest.
fn check_clean(c: &Chaos) {
    let p = &c.p;
    let why = || c.log.join("\n");
    assert_eq!(p.read("overlaps.txt"), "", "{}", why());
    assert_eq!(
        p.count("SELECT COUNT(*) FROM leases"),
        0,
        "leases left\n{}",
        why()
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE state = 'running' OR publishing = TRUE"),
        0,
        "unfinished tries\n{}",
        why()
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM backfills WHERE state = 'running'"),
        0,
        "{}",
        why()
    );
    let audit: Vec<String> = std::fs::read_dir(p.path(".backfill/audit"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(audit.is_empty(), "audit files left: {audit:?}\n{}", why());
    let left = processes_in(&p.path(""));
    assert!(left.is_empty(), "processes left: {left:?}\n{}", why());
    // PostgreSQL checks its own pages and constraints as it writes.
    if p.manifest_db().is_none() {
        assert_eq!(p.rows("PRAGMA integrity_check"), [["ok"]], "{}", why());
    }
}

/// The SQL DAG's partitions, as published and as computed from `raw` with `amount + delta`.
fn totals(c: &Chaos, delta: i64) -> (Vec<String>, Vec<String>) {
    let wh = rusqlite::Connection::open(c.p.path("w.db")).unwrap();
    let rows = |sql: &str| -> Vec<String> {
        let mut stmt = wh.prepare(sql).unwrap();
        stmt.query_map([], |r| {
            Ok(format!(
                "{}|{}|{}|{}",
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    };
    (
        rows("SELECT day, region, n, total FROM daily_totals ORDER BY 1, 2"),
        rows(&format!(
            "SELECT date(ts), region, COUNT(*), SUM(amount + {delta}) FROM raw
             WHERE ts >= '2026-01-01' AND ts < '2026-01-13' GROUP BY 1, 2 ORDER BY 1, 2"
        )),
    )
}

/// How many days of the SQL DAG hold the staged (promoted) totals: the source's amounts as
/// they are now, one more than what the first publish saw.
fn promoted_days(c: &Chaos) -> usize {
    let wh = rusqlite::Connection::open(c.p.path("w.db")).unwrap();
    let mut stmt = wh
        .prepare(
            "SELECT COUNT(*) FROM (SELECT date(ts) AS day, SUM(amount) AS want FROM raw
               WHERE ts >= '2026-01-01' AND ts < '2026-01-13' GROUP BY 1) r
             WHERE r.want = (SELECT SUM(total) FROM daily_totals d WHERE d.day = r.day)",
        )
        .unwrap();
    let n: i64 = stmt.query_row([], |r| r.get(0)).unwrap();
    usize::try_from(n).unwrap()
}

/// Stage a rerun of the SQL DAG over a changed source, promote it, roll it back, each under
/// kills and freezes; after each step the warehouse must be what the manifest says.
fn stage_promote_rollback(c: &mut Chaos) {
    let range = ["--dag", "sql", "--from", FROM, "--to", TO];
    let mut create = vec!["create"];
    create.extend(range);
    c.run(&create).code(0);
    rusqlite::Connection::open(c.p.path("w.db"))
        .unwrap()
        .execute_batch("UPDATE raw SET amount = amount + 1")
        .unwrap();
    let mut stage = create.clone();
    stage.extend(["--stage", "--reprocess-behavior", "completed"]);
    c.attack(&stage, "kind = 'stage'", &["list"]);
    c.resume_unfinished("kind = 'stage'");
    if c.newest_where("kind = 'stage'").is_none() {
        // Killed before its backfill was written: nothing to resume, stage again.
        c.run(&stage).code(0);
    }
    let staged = c
        .newest_where("kind = 'stage'")
        .expect("a staging backfill");
    let id = staged.to_string();
    // Every interval staged once more if the attack left some unstaged.
    let staged_days = c.p.count(&format!(
        "SELECT COUNT(DISTINCT r.interval_start) FROM runs r JOIN task_tries t ON t.run_id = r.id
         WHERE r.backfill_id = {staged} AND t.staged = 'staged'"
    ));
    assert_eq!(staged_days, DAYS as i64, "{}", c.log.join("\n"));
    assert_eq!(
        c.p.count(&format!(
            "SELECT COUNT(*) FROM (SELECT 1 FROM runs r JOIN task_tries t ON t.run_id = r.id
             WHERE r.backfill_id = {staged} AND t.staged = 'staged'
             GROUP BY r.interval_start, t.task_id HAVING COUNT(*) > 1) AS twice"
        )),
        0,
        "one staged output per task and interval\n{}",
        c.log.join("\n")
    );
    // Half the iterations promote with --atomic: then, whatever was killed or frozen, the
    // range is published whole or not at all each time every process has ended.
    let atomic = c.rng.below(2) == 0;
    let mut promote = vec!["promote", id.as_str()];
    if atomic {
        promote.push("--atomic");
    }
    c.log.push(format!("promote atomic: {atomic}"));
    c.attack(&promote, "kind = 'promote'", &promote);
    if atomic {
        let promoted = promoted_days(c);
        assert!(
            promoted == 0 || promoted == DAYS,
            "an atomic promote published {promoted} of {DAYS} days\n{}",
            c.log.join("\n")
        );
    }
    c.resume_unfinished("kind = 'promote'");
    let out = c.run(&promote);
    assert_eq!(out.code, 0, "{}\n{}", out.stderr, c.log.join("\n"));
    let (published, direct) = totals(c, 0);
    assert_eq!(published, direct, "promoted\n{}", c.log.join("\n"));
    assert_eq!(
        c.p.count(&format!(
            "SELECT COUNT(*) FROM task_tries WHERE promoted_from IS NOT NULL AND state = 'succeeded'
               AND promoted_from IN (SELECT t.id FROM task_tries t JOIN runs r ON r.id = t.run_id
                                     WHERE r.backfill_id = {staged})"
        )),
        DAYS as i64,
        "each staged output published once\n{}",
        c.log.join("\n")
    );
    check_clean(c);
    let mut rollback = vec!["rollback"];
    rollback.extend(range);
    c.attack(&rollback, "kind = 'rollback'", &["list"]);
    c.resume_unfinished("kind = 'rollback'");
    // Each day is what the manifest says it is: rolled back to the first publish, or still
    // the promoted rows.
    let wh = rusqlite::Connection::open(c.p.path("w.db")).unwrap();
    for day in 1..=DAYS {
        let start = format!("2026-01-{day:02}");
        let verdict = c.p.rows(&format!(
            "SELECT verdict FROM report_published JOIN report_tries USING (try_id)
             WHERE report_published.dag_id = 'sql'
               AND report_published.interval_start = '{start}T00:00:00Z'"
        ));
        let delta = if verdict == [["rolled back"]] { -1 } else { 0 };
        let (now, want): (i64, i64) = wh
            .query_row(
                &format!(
                    "SELECT (SELECT COALESCE(SUM(total), 0) FROM daily_totals WHERE day = '{start}'),
                            (SELECT COALESCE(SUM(amount + {delta}), 0) FROM raw WHERE date(ts) = '{start}')"
                ),
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(
            now,
            want,
            "{start}: the warehouse is not what the manifest says ({verdict:?})\n{}",
            c.log.join("\n")
        );
    }
    check_clean(c);
}

/// A cascade from `cmd` to `rollup` under kills, freezes and concurrent reruns of `cmd`: no
/// day of `rollup` runs before its upstream day succeeded, and each ends with `cmd`'s output.
fn cascade(c: &mut Chaos) {
    let mut args = vec!["create", "--dag", "cmd", "--from", FROM, "--to", TO];
    args.extend(["--cascade", "all"]);
    let rerun = [
        "create",
        "--dag",
        "cmd",
        "--from",
        FROM,
        "--to",
        TO,
        "--reprocess-behavior",
        "completed",
    ];
    c.attack(&args, "dag_id IN ('cmd', 'rollup')", &rerun);
    c.resume_unfinished("dag_id IN ('cmd', 'rollup')");
    converge(c, "cmd");
    converge(c, "rollup");
    let mut rolled: Vec<String> = std::fs::read_dir(c.p.path("rolled"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    rolled.sort();
    let expected: Vec<String> = (1..=DAYS).map(|d| format!("2026-01-{d:02}")).collect();
    assert_eq!(rolled, expected, "{}", c.log.join("\n"));
    for day in &expected {
        assert_eq!(
            c.p.read(&format!("rolled/{day}")),
            c.p.read(&format!("out/{day}")),
            "{}",
            c.log.join("\n")
        );
    }
    check_clean(c);
}

fn review_iteration(seed: u64, n: u64) {
    let mut c = Chaos {
        p: project(),
        rng: Rng(seed.wrapping_mul(2862933555777941757).wrapping_add(n) | 1),
        procs: Vec::new(),
        faults: Vec::new(),
        log: Vec::new(),
        seq: 0,
    };
    // In turn, so that the default two iterations cover both on each manifest.
    if n.is_multiple_of(2) {
        c.log.push(format!(
            "seed {seed} iteration {n}: stage, promote, rollback"
        ));
        stage_promote_rollback(&mut c);
    } else {
        c.log.push(format!("seed {seed} iteration {n}: cascade"));
        cascade(&mut c);
    }
}

fn iteration(seed: u64, n: u64) {
    let mut c = Chaos {
        p: project(),
        rng: Rng(seed.wrapping_mul(6364136223846793005).wrapping_add(n) | 1),
        procs: Vec::new(),
        faults: Vec::new(),
        log: Vec::new(),
        seq: 0,
    };
    // The SQL DAG one interval per query, in batches of four (one query each), or merged by
    // its key: each kind in turn, so that any four iterations in a row cover all four.
    let (dag, batched, merged) = match n % 4 {
        0 => ("cmd", false, false),
        1 => ("sql", false, false),
        2 => ("sql", true, false),
        _ => ("sql", false, true),
    };
    if batched {
        c.p.write(
            "dags/sql.toml",
            &SQL_DAG.replace(
                "max_active_runs = 3\n",
                "max_active_runs = 3\nbatch_size = 4\n",
            ),
        );
    }
    if merged {
        c.p.write(
            "dags/sql.toml",
            &SQL_DAG.replace(
                "partition_column = \"day\"\n",
                "partition_column = \"day\"\nwrite = \"merge\"\n",
            ),
        );
    }
    c.log.push(format!(
        "seed {seed} iteration {n}: {dag}{}",
        if batched {
            " in batches of 4"
        } else if merged {
            " merged by its key"
        } else {
            ""
        }
    ));
    let first = c.start(&["create", "--dag", dag, "--from", FROM, "--to", TO]);
    let rounds = 1 + c.rng.below(3);
    for _ in 0..rounds {
        // Disrupt whichever process is still running, newest first.
        let target = (0..c.procs.len())
            .rev()
            .find(|&i| c.running(i))
            .unwrap_or(first);
        c.disrupt(target, dag);
    }
    c.settle();
    converge(&mut c, dag);
    check(&c, dag);
}

#[test]
fn staging_promotes_rollbacks_and_cascades_survive_kills_and_freezes() {
    let iterations: u64 = std::env::var("CHAOS_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20261130);
    let began = Instant::now();
    for n in 0..iterations {
        review_iteration(seed, n);
        if iterations > 10 && (n + 1) % 10 == 0 {
            eprintln!(
                "chaos (review, cascade): {} of {iterations} iterations passed ({:.0}s)",
                n + 1,
                began.elapsed().as_secs_f64()
            );
        }
    }
    eprintln!(
        "chaos (review, cascade): {iterations} iterations with seed {seed} passed in {:.0}s",
        began.elapsed().as_secs_f64()
    );
}

#[test]
fn kills_freezes_and_crashes_never_break_the_guarantees() {
    let iterations: u64 = std::env::var("CHAOS_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20261130);
    let began = Instant::now();
    for n in 0..iterations {
        iteration(seed, n);
        if iterations > 10 && (n + 1) % 10 == 0 {
            eprintln!(
                "chaos: {} of {iterations} iterations passed ({:.0}s)",
                n + 1,
                began.elapsed().as_secs_f64()
            );
        }
    }
    eprintln!(
        "chaos: {iterations} iterations with seed {seed} passed in {:.0}s",
        began.elapsed().as_secs_f64()
    );
}

//! Batches (`batch_size`): one query for several consecutive intervals of a SQL task, and still
//! one verdict, one publish and one record per partition, against the shop's warehouse.

use crate::gate::{shop, wh};
use crate::support::{Out, Project};

/// `orders_fact` of the shop, with two ways to poison one day: an order listed in `dupes` is
/// output twice (a duplicate key), and an order with a `notes` row that is not JSON makes the
/// query itself fail (SQLite's `json_extract` raises an error on it).
const ORDERS: &str = r#"
schedule = "@daily"
timezone = "UTC"
max_active_runs = 2
batch_size = 7

[[tasks]]
id = "load"
warehouse = "shop"
target = "orders_fact"
partition_column = "order_day"
sql = """
SELECT order_id, date(order_ts) AS order_day, order_ts, region, amount_cents
FROM raw_orders LEFT JOIN notes USING (order_id)
WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end
  AND (notes.note IS NULL OR json_extract(notes.note, '$.ok') IS NOT NULL)
UNION ALL
SELECT order_id, date(order_ts), order_ts, region, amount_cents
FROM raw_orders JOIN dupes USING (order_id)
WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end
"""

[tasks.gate]
unique_key = ["order_id"]
source_count = """
SELECT COUNT(*) FROM raw_orders
WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end
"""
"#;

fn project() -> Project {
    let p = shop().dag("orders_fact", ORDERS);
    wh(&p)
        .execute_batch(
            "CREATE TABLE notes (order_id INTEGER, note TEXT); CREATE TABLE dupes (order_id INTEGER);",
        )
        .unwrap();
    p
}

/// The first order of `day`.
fn order_of(p: &Project, day: &str) -> i64 {
    wh(p)
        .query_row(
            "SELECT MIN(order_id) FROM raw_orders WHERE date(order_ts) = ?1",
            [day],
            |r| r.get(0),
        )
        .unwrap()
}

/// The rows `sql` gives for `day` (`?1`): order id, region and amount.
fn orders(p: &Project, sql: &str, day: &str) -> Vec<(i64, String, i64)> {
    let c = wh(p);
    let mut stmt = c.prepare(sql).unwrap();
    stmt.query_map([day], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// What `orders_fact` holds for `day`: its rows, in order.
fn published(p: &Project, day: &str) -> Vec<(i64, String, i64)> {
    orders(
        p,
        "SELECT order_id, region, amount_cents FROM orders_fact WHERE order_day = ?1 ORDER BY order_id, rowid",
        day,
    )
}

/// What `raw_orders` holds for `day`, as `orders_fact` should.
fn raw(p: &Project, day: &str) -> Vec<(i64, String, i64)> {
    orders(
        p,
        "SELECT order_id, region, amount_cents FROM raw_orders WHERE date(order_ts) = ?1 ORDER BY order_id",
        day,
    )
}

fn day(n: u32) -> String {
    format!("2026-03-{n:02}")
}

/// The latest run's state of each day, in order.
fn states(p: &Project) -> Vec<String> {
    p.rows(
        "SELECT r.state FROM runs r JOIN (SELECT MAX(id) id FROM runs GROUP BY interval_start) m
         ON m.id = r.id ORDER BY r.interval_start",
    )
    .into_iter()
    .map(|r| r[0].clone())
    .collect()
}

/// The log of the first try of `day`'s latest run.
fn first_log(p: &Project, day: &str) -> String {
    let dir = p.path(".backfill/logs/orders_fact/load");
    let stamp = format!("{}T000000Z.", day.replace('-', ""));
    let mut logs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.starts_with(&stamp) && n.ends_with(".try1.log"))
        .collect();
    // By run id: `...run12.try1.log` is newer than `...run9.try1.log`.
    let run = |n: &String| -> u64 {
        n.split(".run")
            .nth(1)
            .and_then(|r| r.split('.').next())
            .and_then(|r| r.parse().ok())
            .unwrap_or(0)
    };
    logs.sort_by_key(run);
    std::fs::read_to_string(dir.join(logs.last().expect("a log"))).unwrap()
}

/// What the audit folder holds: nothing once every try and batch ended.
fn audit_files(p: &Project) -> Vec<String> {
    std::fs::read_dir(p.path(".backfill/audit"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect()
}

fn week(p: &Project, extra: &[&str]) -> Out {
    p.create("orders_fact", "2026-03-01", "2026-03-07", extra)
}

#[test]
fn a_batch_publishes_what_one_query_a_day_publishes() {
    let p = project();
    week(&p, &["-q"]).code(0);
    for n in 1..=7 {
        assert_eq!(published(&p, &day(n)), raw(&p, &day(n)), "{}", day(n));
    }
    assert_eq!(states(&p), vec!["succeeded"; 7]);
    // One run, one try and one publish per day; the first try computed the batch.
    assert_eq!(p.count("SELECT COUNT(*) FROM task_tries"), 7);
    assert_eq!(p.count("SELECT COUNT(*) FROM published"), 7);
    assert!(
        first_log(&p, &day(1)).contains(
            "computed the batch of 7 intervals [2026-03-01T00:00:00Z, 2026-03-08T00:00:00Z) with one query"
        ),
        "{}",
        first_log(&p, &day(1))
    );
    assert!(first_log(&p, &day(5)).contains("took interval 5 of 7 of the batch"));
    // The manifest names each interval's batch.
    let show = p.run(&["show", "1", "--output", "json"]);
    show.code(0);
    let doc = show.json();
    let batches: Vec<&str> = doc["interval_details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["batch"].as_str().unwrap_or("none"))
        .collect();
    assert_eq!(
        batches,
        vec!["2026-03-01T00:00:00Z/2026-03-08T00:00:00Z"; 7]
    );
    // Nothing of the batch is left behind.
    assert_eq!(audit_files(&p), Vec::<String>::new());
}

#[test]
fn a_poisoned_day_in_a_batch_is_rejected_alone_and_its_published_partition_stays() {
    let p = project();
    week(&p, &["-q", "--batch-size", "1"]).code(0);
    let before = published(&p, &day(4));
    wh(&p)
        .execute("INSERT INTO dupes VALUES (?1)", [order_of(&p, &day(4))])
        .unwrap();
    let out = week(&p, &["--reprocess-behavior", "completed"]);
    out.code(3);
    out.stderr_has("1 key value occurs more than once");
    let mut expected = vec!["succeeded"; 7];
    expected[3] = "rejected";
    assert_eq!(states(&p), expected);
    assert_eq!(
        published(&p, &day(4)),
        before,
        "the rejected day keeps what it had"
    );
    for n in [1, 2, 3, 5, 6, 7] {
        assert_eq!(published(&p, &day(n)), raw(&p, &day(n)), "{}", day(n));
    }
    assert!(first_log(&p, &day(1)).contains("computed the batch of 7 intervals"));
    // The six neighbours were published again, by the second backfill.
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE backfill_id = 2 AND state = 'succeeded'"),
        6
    );
}

#[test]
fn a_query_that_fails_on_one_days_data_splits_the_batch_and_fails_that_day_only() {
    let p = project();
    wh(&p)
        .execute(
            "INSERT INTO notes VALUES (?1, 'not json')",
            [order_of(&p, &day(5))],
        )
        .unwrap();
    let out = week(&p, &[]);
    out.code(3);
    let mut expected = vec!["succeeded"; 7];
    expected[4] = "failed";
    assert_eq!(states(&p), expected);
    for n in [1, 2, 3, 4, 6, 7] {
        assert_eq!(published(&p, &day(n)), raw(&p, &day(n)), "{}", day(n));
    }
    assert_eq!(published(&p, &day(5)), vec![]);
    // Halves of 7 are 4 and 3; 3 splits into 2 and 1, 2 into 1 and 1: day 5 ran its own query,
    // once (retries = 0), and only its own failure counts.
    let log = first_log(&p, &day(5));
    for line in [
        "the batch of 7 intervals [2026-03-01T00:00:00Z, 2026-03-08T00:00:00Z) failed: ",
        "split in halves, this interval's is [2026-03-05T00:00:00Z, 2026-03-08T00:00:00Z)",
        "the batch of 3 intervals [2026-03-05T00:00:00Z, 2026-03-08T00:00:00Z) failed: ",
        "the batch of 2 intervals [2026-03-05T00:00:00Z, 2026-03-07T00:00:00Z) failed: ",
        "malformed JSON",
    ] {
        assert!(log.contains(line), "{line:?} not in:\n{log}");
    }
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE state = 'failed'"),
        1
    );
    assert!(first_log(&p, &day(2)).contains("took interval 2 of 4 of the batch"));
    // Each interval names the batch it took its share of; day 5 computed its own.
    let doc = p.run(&["show", "1", "--output", "json"]).json();
    let batches: Vec<Option<&str>> = doc["interval_details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["batch"].as_str())
        .collect();
    let first = Some("2026-03-01T00:00:00Z/2026-03-05T00:00:00Z");
    assert_eq!(batches, [first, first, first, first, None, None, None]);
}

#[test]
fn a_kill_in_the_middle_of_a_batch_is_resumed_with_each_day_published_once() {
    let p = project();
    // Killed right after the third day's publish committed, before the manifest recorded it;
    // in batches of two, one at a time, which `resume` keeps (the DAG file says seven).
    let crashed = p.run_with(
        &[
            "create",
            "--dag",
            "orders_fact",
            "--from",
            "2026-03-01",
            "--to",
            "2026-03-07",
            "--batch-size",
            "2",
            "--max-active-runs",
            "1",
        ],
        &[("BACKFILL_FAULT", "after-publish@3")],
    );
    assert_eq!(crashed.code, -1, "aborted: {}", crashed.stderr);
    p.run(&["resume", "1", "-q"]).code(0);
    p.run(&["show", "1"]).code(0).stdout_has(" · batch size 2");
    assert_eq!(
        p.run(&["show", "1", "--output", "json"]).json()["batch_size"],
        2
    );
    for n in 1..=7 {
        assert_eq!(published(&p, &day(n)), raw(&p, &day(n)), "{}", day(n));
    }
    // Each day succeeded once: one succeeded try and one publish each.
    assert_eq!(
        p.rows(
            "SELECT r.interval_start, COUNT(*) FROM runs r JOIN task_tries t ON t.run_id = r.id
             WHERE t.state = 'succeeded' GROUP BY r.interval_start ORDER BY 1"
        )
        .into_iter()
        .map(|r| r[1].clone())
        .collect::<Vec<_>>(),
        vec!["1"; 7]
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM published"), 7);
    // The crashed backfill's first batch; the resumed backfill ran the last four days in
    // batches of two again.
    assert!(
        first_log(&p, &day(2)).contains("took interval 2 of 2 of the batch [2026-03-01T00:00:00Z"),
        "{}",
        first_log(&p, &day(2))
    );
    assert!(
        first_log(&p, &day(7)).contains("took interval 2 of 2 of the batch [2026-03-06T00:00:00Z"),
        "{}",
        first_log(&p, &day(7))
    );
    assert_eq!(audit_files(&p), Vec::<String>::new());
}

#[test]
fn a_staged_batch_is_promoted_per_day() {
    let p = project();
    let out = week(&p, &["--stage"]);
    out.code(0);
    assert_eq!(published(&p, &day(1)), vec![]);
    assert!(first_log(&p, &day(3)).contains("took interval 3 of 7 of the batch"));
    p.run(&["promote", "1", "-q"]).code(0);
    for n in 1..=7 {
        assert_eq!(published(&p, &day(n)), raw(&p, &day(n)), "{}", day(n));
    }
}

#[test]
fn an_hourly_batch_across_the_fall_back_covers_each_of_the_25_hours_once() {
    let p = Project::new();
    p.write(
        "backfill.toml",
        "[warehouse.w]\npath = \"w.db\"\ninit = [\"init.sql\"]\n",
    );
    // One event every 10 minutes of 2026-10-25 (UTC), 25 hours in Berlin.
    p.write(
        "init.sql",
        "CREATE TABLE events (ts TEXT NOT NULL);
         WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < 200)
         INSERT INTO events SELECT strftime('%Y-%m-%d %H:%M:%S', '2026-10-24 21:00:00', '+' || (i * 10) || ' minutes') FROM s;
         CREATE TABLE hourly (hour TEXT NOT NULL, n INTEGER NOT NULL);",
    );
    let dag = |batch: u32| {
        format!(
            r#"schedule = "@hourly"
timezone = "Europe/Berlin"
batch_size = {batch}
[[tasks]]
id = "count"
warehouse = "w"
target = "hourly"
partition_column = "hour"
sql = """
SELECT strftime('%Y-%m-%dT%H:00:00Z', ts) AS hour, COUNT(*) AS n FROM events
WHERE ts >= :data_interval_start AND ts < :data_interval_end GROUP BY 1
"""
[tasks.gate]
unique_key = ["hour"]
source_count = "SELECT COUNT(*) FROM (SELECT DISTINCT strftime('%H', ts) FROM events WHERE ts >= :data_interval_start AND ts < :data_interval_end)"
"#
        )
    };
    p.write("dags/h.toml", &dag(24));
    let all = |p: &Project| -> Vec<(String, i64)> {
        let c = rusqlite::Connection::open(p.path("w.db")).unwrap();
        let mut s = c
            .prepare("SELECT hour, n FROM hourly ORDER BY hour")
            .unwrap();
        s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    p.run(&[
        "create",
        "--dag",
        "h",
        "--from",
        "2026-10-25",
        "--to",
        "2026-10-25",
        "-q",
    ])
    .code(0);
    let batched = all(&p);
    assert_eq!(batched.len(), 25, "{batched:?}");
    assert!(batched.iter().all(|(_, n)| *n == 6), "{batched:?}");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        25
    );
    let logs: String = std::fs::read_dir(p.path(".backfill/logs/h/count"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(
        logs.matches(
            "computed the batch of 24 intervals [2026-10-24T22:00:00Z, 2026-10-25T22:00:00Z)"
        )
        .count(),
        1,
        "{logs}"
    );
    // The same hours one query each.
    p.write("dags/h.toml", &dag(1));
    p.run(&[
        "create",
        "--dag",
        "h",
        "--from",
        "2026-10-25",
        "--to",
        "2026-10-25",
        "--reprocess-behavior",
        "completed",
        "-q",
    ])
    .code(0);
    assert_eq!(all(&p), batched);
}

#[test]
fn batch_sizes_that_cannot_run_are_refused_before_anything_is_written() {
    let p = project();
    let wrong = ORDERS.replace("batch_size = 7", "batch_size = 0");
    p.write("dags/orders_fact.toml", &wrong);
    let out = week(&p, &[]);
    out.code(2);
    out.stderr_has(
        "dags/orders_fact.toml:5:14: key `batch_size` must be a whole number from 1 to 1000",
    );
    assert!(!p.has_manifest());
    // A query that labels its rows with `:ds` would put all of them in one interval, however
    // it hides it from another dialect's reading (SQLite ends a comment at its first `*/`,
    // and reads a backquoted name as a name).
    p.write(
        "dags/orders_fact.toml",
        &ORDERS
            .replace(
                "SELECT order_id, date(order_ts) AS order_day, order_ts,",
                "/* from exports/orders/*.csv */ SELECT order_id, :ds AS order_day, order_ts,",
            )
            .replace(
                "FROM raw_orders LEFT JOIN notes",
                "FROM raw_orders AS `r:o` LEFT JOIN notes",
            ),
    );
    let why = "task `load`'s query uses `:ds`, which a batch binds once for all its intervals, so rows labelled with it would all land in one interval; compute `order_day` from the rows themselves (and filter with :data_interval_start and :data_interval_end)";
    let out = week(&p, &[]);
    out.code(2);
    out.stderr_has(&format!(
        "dags/orders_fact.toml: `batch_size = 7` cannot be used: {why}; remove `batch_size`"
    ));
    assert!(!p.has_manifest());
    let out = p.run(&["dags", "validate"]);
    out.code(2);
    out.stderr_has(&format!(
        "dags/orders_fact.toml:12:7: `batch_size = 7` cannot be used: {why}; remove `batch_size`"
    ));
    // Two tasks: batches run DAGs of one task so far.
    let two = "[[tasks]]\nid = \"a\"\ncommand = \"true\"\n[[tasks]]\nid = \"b\"\ncommand = \"true\"\ndepends_on = [\"a\"]\n";
    let p = Project::new().dag(
        "c",
        &format!("schedule = \"@daily\"\nbatch_size = 3\n{two}"),
    );
    let out = p.create("c", "2026-01-01", "2026-01-03", &[]);
    out.code(2);
    out.stderr_has("dags/c.toml:2:14: key `batch_size` = 3 cannot be used here: batches run DAGs of one task so far, and this one has 2 tasks; remove `batch_size`");
    let p = Project::new().dag("c", &format!("schedule = \"@daily\"\n{two}"));
    let out = p.create("c", "2026-01-01", "2026-01-03", &["--batch-size", "3"]);
    out.code(2);
    out.stderr_has("--batch-size 3 cannot be used with DAG `c` (dags/c.toml): batches run DAGs of one task so far, and this one has 2 tasks; drop --batch-size");
    p.create("c", "2026-01-01", "2026-01-03", &["--batch-size", "0"])
        .code(2);
    assert!(!p.has_manifest());
}

#[test]
fn the_dry_run_shows_each_batch_and_a_skipped_interval_ends_one() {
    let p = project();
    p.create("orders_fact", "2026-03-04", "2026-03-04", &["-q"])
        .code(0);
    let batches = |extra: &[&str]| -> Vec<serde_json::Value> {
        let mut args = vec!["--dry-run", "--batch-size", "3", "--output", "json"];
        args.extend_from_slice(extra);
        let out = week(&p, &args);
        out.code(0);
        let doc = out.json();
        assert_eq!(doc["batch_size"], 3);
        // By start, whatever order the plan lists them in.
        let mut items: Vec<(String, serde_json::Value)> = doc["intervals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| (i["start"].as_str().unwrap().to_string(), i["batch"].clone()))
            .collect();
        items.sort_by(|a, b| a.0.cmp(&b.0));
        items.into_iter().map(|(_, b)| b).collect()
    };
    let n = |v: i64| serde_json::json!(v);
    let none = serde_json::Value::Null;
    assert_eq!(
        batches(&[]),
        [n(1), n(1), n(1), none.clone(), n(2), n(2), n(2)]
    );
    // Newest first: the batches are taken from the end.
    assert_eq!(
        batches(&["--run-backwards"]),
        [n(2), n(2), n(2), none, n(1), n(1), n(1)]
    );
    let out = week(&p, &["--dry-run", "--batch-size", "2"]);
    out.code(0);
    out.stdout_has("--batch-size 2 (4 batches of one query each)");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs"),
        1,
        "a dry run writes nothing"
    );
}

/// A command task of batches: one run of the command per batch, with the batch's range and
/// `BACKFILL_BATCH`; it reports rows per interval in its result file, and the gate judges each
/// interval against its own source count. The day named in `poison` reports a wrong count; the
/// command fails on the day named in `fail`.
const COMMAND_DAG: &str = r#"
schedule = "@daily"
batch_size = 3
[[tasks]]
id = "work"
command = '''
if [ -n "$BACKFILL_BATCH" ]; then
  echo "batch {{ data_interval_start }} {{ data_interval_end }}" >> calls.txt
  days=$(printf '%s' "$BACKFILL_BATCH" | grep -o '"ds":"[0-9-]*"' | cut -d'"' -f4)
else
  echo "one {{ ds }}" >> calls.txt
  days="{{ ds }}"
fi
for d in $days; do
  if [ "$d" = "$(cat fail 2>/dev/null)" ]; then echo "cannot do $d" >&2; exit 1; fi
done
report() {
  n=$(echo "$1" | cut -c9-10 | sed 's/^0//')
  if [ "$1" = "$(cat poison 2>/dev/null)" ]; then n=99; fi
  printf '{"rows": %d}' "$n"
}
if [ -n "$BACKFILL_BATCH" ]; then
  sep=""; out=""
  for d in $days; do out="$out$sep\"$d\": $(report "$d")"; sep=", "; done
  printf '{"intervals": { %s }}' "$out" > "$BACKFILL_RESULT"
else
  report "{{ ds }}" > "$BACKFILL_RESULT"
fi
'''
[tasks.gate]
source_count = "echo {{ ds }} | cut -c9-10 | sed 's/^0//'"
"#;

#[test]
fn a_command_task_runs_once_per_batch_and_each_day_is_judged_on_its_own() {
    let p = Project::new().dag("c", COMMAND_DAG);
    p.write("poison", "2026-01-05");
    let out = p.create("c", "2026-01-01", "2026-01-06", &[]);
    out.code(3);
    out.stderr_has("2026-01-05");
    assert_eq!(
        p.read("calls.txt"),
        "batch 2026-01-01T00:00:00Z 2026-01-04T00:00:00Z\n\
         batch 2026-01-04T00:00:00Z 2026-01-07T00:00:00Z\n"
    );
    assert_eq!(
        p.rows(
            "SELECT r.state, t.rows, t.source_rows FROM runs r JOIN task_tries t ON t.run_id = r.id ORDER BY r.interval_start"
        ),
        [
            ["succeeded", "1", "1"],
            ["succeeded", "2", "2"],
            ["succeeded", "3", "3"],
            ["succeeded", "4", "4"],
            ["rejected", "99", "5"],
            ["succeeded", "6", "6"],
        ]
    );
    // Each try's result file holds what was reported for its own interval.
    let day2 = std::fs::read_dir(p.path(".backfill/logs/c/work"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|f| {
            let n = f.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with("20260102T000000Z.") && n.ends_with(".result.json")
        })
        .expect("the result file of 2026-01-02");
    assert_eq!(std::fs::read_to_string(day2).unwrap(), r#"{"rows":2}"#);
}

#[test]
fn a_command_that_fails_on_one_day_splits_its_batch_and_fails_that_day_only() {
    let p = Project::new().dag(
        "c",
        &COMMAND_DAG.replace("batch_size = 3", "batch_size = 4").replace(
            "[tasks.gate]",
            "cleanup = 'echo \"$BACKFILL_CLEANUP {{ data_interval_start }} {{ data_interval_end }}\" >> cleanups.txt'\n[tasks.gate]",
        ),
    );
    p.write("fail", "2026-01-02");
    let out = p.create("c", "2026-01-01", "2026-01-04", &[]);
    out.code(3);
    // Each failed batch's command was cleaned up with the batch's values, then the failed day's.
    assert_eq!(
        p.read("cleanups.txt"),
        "failed 2026-01-01T00:00:00Z 2026-01-05T00:00:00Z\n\
         failed 2026-01-01T00:00:00Z 2026-01-03T00:00:00Z\n\
         failed 2026-01-02T00:00:00Z 2026-01-03T00:00:00Z\n"
    );
    // [1, 4] fails, its half [1, 2] fails, 1 and 2 run alone; the other half [3, 4] runs once.
    assert_eq!(
        p.read("calls.txt"),
        "batch 2026-01-01T00:00:00Z 2026-01-05T00:00:00Z\n\
         batch 2026-01-01T00:00:00Z 2026-01-03T00:00:00Z\n\
         one 2026-01-01\n\
         one 2026-01-02\n\
         batch 2026-01-03T00:00:00Z 2026-01-05T00:00:00Z\n"
    );
    assert_eq!(
        p.rows("SELECT r.state FROM runs r ORDER BY r.interval_start"),
        [["succeeded"], ["failed"], ["succeeded"], ["succeeded"]]
    );
}

/// A batch holds one slot of its task's pool at a time, as one interval does: with a pool of one,
/// two batches in flight never run their commands at once. A pool with a rate takes none.
#[test]
fn a_pool_counts_batches_in_flight() {
    let p = Project::new().dag(
        "c",
        r#"
schedule = "@daily"
batch_size = 3
max_active_runs = 2
[[tasks]]
id = "work"
pool = "api"
command = '''
mkdir inflight 2>/dev/null || echo "overlap {{ ds }}" >> overlaps.txt
echo "{{ ds }}" >> calls.txt
sleep 0.3
rmdir inflight
days=$(printf '%s' "$BACKFILL_BATCH" | grep -o '"ds":"[0-9-]*"' | cut -d'"' -f4)
out=""; sep=""
for d in $days; do out="$out$sep\"$d\": {}"; sep=", "; done
printf '{"intervals": { %s }}' "$out" > "$BACKFILL_RESULT"
'''
"#,
    );
    // A pool with a rate takes no batches: a batch that fails runs again in halves, starts
    // the rate could not count.
    p.write(
        "backfill.toml",
        "[pools]\napi = { slots = 1, rate = \"100/min\" }\n",
    );
    p.create("c", "2026-01-01", "2026-01-06", &["-q"])
        .code(2)
        .stderr_has("dags/c.toml:7:8: task `work`: pool `api` has a rate, and this DAG's batch_size = 3 would run its intervals in batches");
    p.write("backfill.toml", "[pools]\napi = 1\n");
    p.create("c", "2026-01-01", "2026-01-06", &["-q"]).code(0);
    let mut calls: Vec<String> = p.read("calls.txt").lines().map(String::from).collect();
    calls.sort();
    assert_eq!(
        calls,
        ["2026-01-01", "2026-01-04"],
        "one run of the command per batch"
    );
    assert_eq!(p.read("overlaps.txt"), "");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        6
    );
}

/// A command task's gate measures each interval's source before the batch's one run of the
/// command, as before a try's own: a source that changes while the batch runs is caught for
/// every interval, not only the first, and the interval runs again.
#[test]
fn a_source_that_changes_while_a_batch_command_runs_is_caught_for_every_interval() {
    let p = Project::new().dag(
        "c",
        r#"
schedule = "@daily"
batch_size = 3
retries = 1
retry_delay = "10ms"
[[tasks]]
id = "copy"
command = '''
if [ -n "$BACKFILL_BATCH" ]; then
  days=$(printf '%s' "$BACKFILL_BATCH" | grep -o '"ds":"[0-9-]*"' | cut -d'"' -f4)
  sep=""; out=""
  for d in $days; do out="$out$sep\"$d\": {\"rows\": $(wc -l < src/$d.txt)}"; sep=", "; done
  printf '{"intervals": { %s }}' "$out" > "$BACKFILL_RESULT"
  # A late row of the second day arrives once the batch has read it.
  echo late >> src/2026-01-02.txt
else
  printf '{"rows": %d}' "$(wc -l < src/{{ ds }}.txt)" > "$BACKFILL_RESULT"
fi
'''
[tasks.gate]
source_fingerprint = "cat src/{{ ds }}.txt"
"#,
    );
    for d in 1..=3 {
        p.write(
            &format!("src/2026-01-0{d}.txt"),
            &"row\n".repeat(d as usize),
        );
    }
    p.create("c", "2026-01-01", "2026-01-03", &["-q"]).code(0);
    assert_eq!(
        p.rows(
            "SELECT r.interval_start, t.state, t.rows, substr(coalesce(t.error, ''), 1, 37) FROM runs r JOIN task_tries t ON t.run_id = r.id ORDER BY t.id"
        )
        .into_iter()
        .map(|r| r[1..].join(" "))
        .collect::<Vec<_>>(),
        [
            "succeeded 1 ",
            "failed NULL the source changed while the task ran",
            "succeeded 3 ",
            "succeeded 3 ",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
    );
}

/// A row of no interval of the batch (here a timestamp that is no date) fails the batch, which
/// is split: only the interval whose own query makes it is rejected.
#[test]
fn a_row_of_no_interval_splits_the_batch_and_rejects_only_its_own_interval() {
    let p = project();
    wh(&p)
        .execute(
            "UPDATE raw_orders SET order_ts = order_ts || ' bad' WHERE order_id = ?1",
            [order_of(&p, &day(3))],
        )
        .unwrap();
    week(&p, &[]).code(3);
    let mut expected = vec!["succeeded"; 7];
    expected[2] = "rejected";
    assert_eq!(states(&p), expected);
    let log = first_log(&p, &day(3));
    assert!(
        log.contains("1 row of the batch's output lies in none of its intervals (`order_day` outside the batch, NULL or not a date or timestamp)"),
        "{log}"
    );
}

/// `--max-failures` reached inside a batch stops it there: the rest stay planned, and the
/// backfill ends as halted, not as interrupted.
#[test]
fn max_failures_reached_inside_a_batch_halts_the_backfill() {
    let p = project();
    wh(&p)
        .execute("INSERT INTO dupes VALUES (?1)", [order_of(&p, &day(1))])
        .unwrap();
    let out = week(&p, &["--max-failures", "1"]);
    out.code(3);
    out.stderr_has("(--max-failures 1): no new intervals");
    assert_eq!(states(&p), ["rejected"]);
    assert_eq!(p.count("SELECT COUNT(*) FROM runs"), 1);
}

/// A command that knows nothing of batches (it writes `{{ ds }}`'s output and reports nothing)
/// fails each batch, which is split down to single intervals: each interval's output is written
/// by its own run, none is recorded as done without it.
#[test]
fn a_command_that_knows_nothing_of_batches_still_runs_each_interval() {
    let p = Project::new().dag(
        "plain",
        "schedule = \"@daily\"\nbatch_size = 3\n[[tasks]]\nid = \"write\"\ncommand = \"mkdir -p plain && echo {{ ds }} > plain/{{ ds }}.csv\"\n",
    );
    p.create("plain", "2026-09-01", "2026-09-06", &["-q"])
        .code(0);
    for d in 1..=6 {
        assert_eq!(
            p.read(&format!("plain/2026-09-0{d}.csv")),
            format!("2026-09-0{d}\n")
        );
    }
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state = 'succeeded'"),
        6
    );
    // None of them took a batch's share: each ran its own command.
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE batch IS NOT NULL"),
        0
    );
}

/// Sixteen days in batches of four, two at once: each batch's command notes its range and the
/// process that ran it, and waits for `go` (or `go-PID`, for the process PID alone) before it
/// reports each day.
const JOINED_DAG: &str = r#"
schedule = "@daily"
batch_size = 4
max_active_runs = 2
[[tasks]]
id = "work"
command = '''
echo "{{ data_interval_start }} {{ data_interval_end }} $PPID" >> calls.txt
while [ ! -f go ] && [ ! -f "go-$PPID" ]; do sleep 0.05; done
if [ -z "$BACKFILL_BATCH" ]; then echo '{"rows": 1}' > "$BACKFILL_RESULT"; exit 0; fi
days=$(printf '%s' "$BACKFILL_BATCH" | grep -o '"ds":"[0-9-]*"' | cut -d'"' -f4)
sep=""; out=""
for d in $days; do out="$out$sep\"$d\": {\"rows\": 1}"; sep=", "; done
printf '{"intervals": { %s }}' "$out" > "$BACKFILL_RESULT"
'''
"#;

/// The batches' commands noted in `calls.txt`: `(start, end, pid)`, sorted.
fn calls(p: &Project) -> Vec<(String, String, u32)> {
    let mut calls: Vec<(String, String, u32)> = std::fs::read_to_string(p.path("calls.txt"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            (w[0].to_string(), w[1].to_string(), w[2].parse().unwrap())
        })
        .collect();
    calls.sort();
    calls
}

/// Starts the owner of the sixteen days, waits for its two batches, then a worker (`join`),
/// whose first batch holds the four days after them (it has no room to start it yet, so it
/// holds no other); returns both, their batches not yet let go.
fn owner_and_worker_in_batches(p: &Project) -> (std::process::Child, std::process::Child) {
    let owner = p.spawn("owner", crate::join::SIXTEEN_DAYS);
    crate::support::wait_until(
        "the owner's two batches",
        std::time::Duration::from_secs(20),
        || calls(p).len() == 2,
    );
    let worker = p.spawn("worker", &["join", "1"]);
    crate::support::wait_until(
        "the worker to hold a batch",
        std::time::Duration::from_secs(20),
        || {
            p.count(
                "SELECT COUNT(*) FROM leases WHERE batch_holder IS NOT NULL AND batch_holder <> 0",
            ) == 4
        },
    );
    (owner, worker)
}

const FOUR_BATCHES: [(&str, &str); 4] = [
    ("2026-01-01T00:00:00Z", "2026-01-05T00:00:00Z"),
    ("2026-01-05T00:00:00Z", "2026-01-09T00:00:00Z"),
    ("2026-01-09T00:00:00Z", "2026-01-13T00:00:00Z"),
    ("2026-01-13T00:00:00Z", "2026-01-17T00:00:00Z"),
];

fn each_of_sixteen_days_succeeded_once(p: &Project) {
    assert_eq!(
        p.count(
            "SELECT COUNT(*) FROM (SELECT interval_start FROM runs WHERE state = 'succeeded'
             GROUP BY interval_start HAVING COUNT(*) = 1) AS once"
        ),
        16
    );
}

#[test]
fn a_worker_that_joins_a_backfill_of_batches_never_computes_an_interval_its_owner_holds() {
    let p = Project::new().dag("c", JOINED_DAG);
    let (owner, worker) = owner_and_worker_in_batches(&p);
    p.write("go", "");
    let (owner_pid, worker_pid) = (owner.id(), worker.id());
    let limit = std::time::Duration::from_secs(60);
    crate::support::wait_within(&p, "worker", worker, limit).code(0);
    crate::support::wait_within(&p, "owner", owner, limit).code(0);
    // Each day's rows were computed once: the owner's first two batches, the worker's first,
    // and the last by whichever of them formed it first.
    let ran = calls(&p);
    assert_eq!(
        ran.iter()
            .map(|c| (c.0.as_str(), c.1.as_str()))
            .collect::<Vec<_>>(),
        FOUR_BATCHES
    );
    assert_eq!(
        ran[..3].iter().map(|c| c.2).collect::<Vec<_>>(),
        [owner_pid, owner_pid, worker_pid]
    );
    assert!([owner_pid, worker_pid].contains(&ran[3].2));
    each_of_sixteen_days_succeeded_once(&p);
    assert_eq!(
        p.count("SELECT COUNT(*) FROM runs WHERE state <> 'succeeded'"),
        0
    );
    assert_eq!(p.count("SELECT COUNT(*) FROM leases"), 0);
}

#[test]
fn the_owner_runs_the_batches_a_killed_worker_held() {
    let p = Project::new().dag("c", JOINED_DAG);
    p.write("backfill.toml", "lease_timeout = \"2s\"\n");
    let (owner, mut worker) = owner_and_worker_in_batches(&p);
    let (owner_pid, worker_pid) = (owner.id(), worker.id());
    // The owner's batches end; the worker's first starts once they made room, and waits.
    p.write(&format!("go-{owner_pid}"), "");
    crate::support::wait_until(
        "the worker's first batch",
        std::time::Duration::from_secs(20),
        || calls(&p).iter().any(|c| c.2 == worker_pid),
    );
    worker.kill().unwrap();
    worker.wait().unwrap();
    crate::support::wait_within(&p, "owner", owner, std::time::Duration::from_secs(60)).code(0);
    // The killed worker's batch was computed again by the owner once it recovered the worker;
    // every other batch by the owner (or by the worker, before it was killed, and again by the
    // owner).
    let ran = calls(&p);
    let is = |c: &(String, String, u32), b: (&str, &str), pid: u32| {
        (c.0.as_str(), c.1.as_str()) == b && c.2 == pid
    };
    for (k, b) in FOUR_BATCHES.into_iter().enumerate() {
        assert!(
            ran.iter().any(|c| is(c, b, owner_pid)),
            "batch {k} by the owner: {ran:?}"
        );
    }
    assert!(ran.iter().any(|c| is(c, FOUR_BATCHES[2], worker_pid)));
    each_of_sixteen_days_succeeded_once(&p);
}

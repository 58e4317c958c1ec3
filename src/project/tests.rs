//! Loading DAG files and `backfill.toml`: what is accepted, every error with its location, the
//! rules between files, and (property tests) that no input makes loading panic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::*;

use super::dag::TaskLocations;
use super::*;

fn load_with(
    text: &str,
    warehouses: &BTreeMap<String, Warehouse>,
) -> Result<Dag, Vec<ConfigError>> {
    Dag::parse(text, "dags/demo.toml", "demo", warehouses).dag
}

fn load(text: &str) -> Result<Dag, Vec<ConfigError>> {
    load_with(text, &BTreeMap::new())
}

fn errors(text: &str) -> Vec<String> {
    match load(text) {
        Ok(dag) => panic!("expected errors, loaded {}", dag.id),
        Err(e) => e.iter().map(ToString::to_string).collect(),
    }
}

fn first_error(text: &str) -> String {
    errors(text).remove(0)
}

fn shop() -> BTreeMap<String, Warehouse> {
    BTreeMap::from([(
        "shop".to_string(),
        Warehouse {
            name: "shop".into(),
            kind: WarehouseKind::Sqlite,
            path: PathBuf::from("/nonexistent/warehouse.db"),
            init: Vec::new(),
            busy_timeout: crate::project::DEFAULT_BUSY_TIMEOUT,
            keep_versions: crate::project::DEFAULT_KEEP_VERSIONS,
        },
    )])
}

#[test]
fn a_full_dag_loads_with_defaults_and_overrides() {
    let dag = load(
        r#"
schedule = "@daily"
timezone = "Europe/Berlin"
max_active_runs = 4
retries = 2
retry_delay = "5s"
timeout = "10m"

[[tasks]]
id = "load"
depends_on = ["extract"]
command = "echo {{ ds }}"
publish = ["true"]
retries = 0
[tasks.gate]
source_count = "echo 2"

[[tasks]]
id = "extract"
command = ["echo", "{{ data_interval_start }}", "{{ conf.region }}"]
"#,
    )
    .unwrap();
    assert_eq!(dag.id, "demo");
    assert_eq!(dag.max_active_runs, Some(4));
    let ids: Vec<_> = dag.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["extract", "load"]);
    assert_eq!(dag.tasks[0].retries, 2);
    assert_eq!(dag.tasks[1].retries, 0);
    assert_eq!(dag.tasks[0].retry_delay, Duration::from_secs(5));
    assert_eq!(dag.tasks[0].timeout, Some(Duration::from_secs(600)));
    assert_eq!(dag.tasks[0].grace_period, Duration::from_secs(10));
    assert_eq!(
        dag.tasks[1].locations,
        TaskLocations {
            id: "dags/demo.toml:10:6".into(),
            command: Some("dags/demo.toml:12:11".into()),
            publish: Some("dags/demo.toml:13:11".into()),
            cleanup: None,
            source_count: Some("dags/demo.toml:16:16".into()),
            source_fingerprint: None,
            target: None,
            sql: None,
            pool: None,
            ready: None,
            rules: Vec::new(),
        }
    );
    assert_eq!(
        dag.tasks[0].locations.command.as_deref(),
        Some("dags/demo.toml:20:11")
    );
}

#[test]
fn errors_name_file_line_and_key() {
    let base = "schedule = \"@daily\"\n[[tasks]]\nid = \"a\"\ncommand = \"true\"\n";
    assert_eq!(
        first_error(&format!("{base}retires = 3\n")),
        "dags/demo.toml:5:1: unknown key `retires` in [[tasks]]; did you mean `retries`?"
    );
    assert_eq!(
        first_error(&format!("colour = 3\n{base}")),
        "dags/demo.toml:1:1: unknown key `colour`; remove it or use one of: id, description, schedule, timezone, max_active_runs, batch_size, retries, retry_delay, timeout, grace_period, depends_on_past, notify, upstream, tasks"
    );
    assert!(first_error("schedule = \"@daily\"\ntimezone = \"Mars/Olympus\"\n[[tasks]]\nid = \"a\"\ncommand = \"true\"\n")
        .starts_with("dags/demo.toml:2:12: unknown timezone `Mars/Olympus`"));
    assert!(
        first_error("schedule = \"0 25 * * *\"\n[[tasks]]\nid = \"a\"\ncommand = \"true\"\n")
            .starts_with("dags/demo.toml:1:12: key `schedule`: invalid schedule `0 25 * * *`")
    );
    assert_eq!(
        first_error("[[tasks]]\nid = \"a\"\ncommand = \"true\"\n"),
        "dags/demo.toml: missing key `schedule`; add one such as schedule = \"@daily\" or a 5-field cron such as schedule = \"15 3 * * 1-5\""
    );
    assert_eq!(
        first_error(&format!("{base}depends_on = [\"b\"]\n")),
        "dags/demo.toml:5:15: task `a` depends on unknown task `b`; known tasks: a"
    );
    assert_eq!(
        first_error(&format!("{base}timeout = \"soon\"\n")),
        "dags/demo.toml:5:11: key `timeout`: cannot read `soon` as a duration: expected a whole number followed by a unit; write it like \"30s\", \"5m\" or \"1h 30m\" (units: ms, s, m, h, d)"
    );
    assert!(
        first_error("schedule = \"@daily\"\n[[tasks]]\nid = \"a\"\ncommand = \"echo {{ dss }}\"\n")
            .starts_with("dags/demo.toml:4:20: key `command`: unknown template variable `dss`; did you mean `ds`?")
    );
    assert_eq!(
        first_error(&format!("{base}retries = \"2\"\n")),
        "dags/demo.toml:5:11: key `retries` must be a whole number such as 2, not a string"
    );
    assert_eq!(
        first_error("schedule = \"@daily\"\n[[tasks]]\ncommand = \"true\"\n"),
        "dags/demo.toml:2:1: a [[tasks]] table needs an `id`; add one such as id = \"extract\""
    );
    // An array command's template error points at its element.
    assert!(
        first_error(
            "schedule = \"@daily\"\n[[tasks]]\nid = \"a\"\ncommand = [\"echo\", \"{{ nope }}\"]\n"
        )
        .starts_with("dags/demo.toml:4:24: key `command`: unknown template variable `nope`")
    );
}

/// A template error points at the line of the mistake inside a multi-line command, and says
/// what is wrong without repeating the command.
#[test]
fn a_template_error_points_at_its_line_inside_the_command() {
    let dag = |command: &str| {
        format!("schedule = \"@daily\"\n[[tasks]]\nid = \"a\"\ncommand = {command}\n")
    };
    let known = "known: ds, ds_nodash, data_interval_start, data_interval_end, dag_id, task_id, run_id, try_number, conf";
    assert_eq!(
        errors(&dag("\"\"\"\necho start\necho {{ dss }}\necho end\n\"\"\"")),
        [format!(
            "dags/demo.toml:6:9: key `command`: unknown template variable `dss`; did you mean `ds`? {known}"
        )]
    );
    // Escapes and a line-ending backslash in a basic string, a literal string, two mistakes.
    assert_eq!(
        errors(&dag(
            "\"\"\"\necho \\\"a\\\" \\\n   {{ dss }}\necho {{ ds }} \\t {{ try }}\n\"\"\""
        )),
        [
            format!(
                "dags/demo.toml:6:7: key `command`: unknown template variable `dss`; did you mean `ds`? {known}"
            ),
            format!("dags/demo.toml:7:21: key `command`: unknown template variable `try`; {known}"),
        ]
    );
    assert_eq!(
        errors(&dag(
            "\'\'\'\nrun \\n\n  --day {{ ds }} {{ conf.x | upper }} {{ data_interval_stat }}\n\'\'\'"
        )),
        [format!(
            "dags/demo.toml:6:42: key `command`: unknown template variable `data_interval_stat`; did you mean `data_interval_start`? {known}"
        )]
    );
    // A syntax error points at its line.
    let e = first_error(&dag("\"\"\"\necho start\necho {{ ds \n\"\"\""));
    assert!(
        e.starts_with("dags/demo.toml:6:1: key `command`: cannot read the template ("),
        "{e}"
    );
    assert!(!e.contains("echo start"), "{e}");
}

#[test]
fn a_dependency_cycle_is_reported_with_its_path() {
    let err = first_error(
        "schedule = \"@daily\"\n[[tasks]]\nid = \"a\"\ncommand = \"true\"\ndepends_on = [\"b\"]\n[[tasks]]\nid = \"b\"\ncommand = \"true\"\ndepends_on = [\"a\"]\n",
    );
    assert_eq!(
        err,
        "dags/demo.toml:3:6: the tasks' depends_on form a cycle: a -> b -> a; remove one of these edges"
    );
}

#[test]
fn one_file_with_five_mistakes_reports_all_five_in_file_order() {
    let found = errors(
        r#"schedule = "@daily"
timezone = "Europe/Atlantis"
retry_delay = "5 parsecs"
colour = "blue"

[[tasks]]
id = "extract"
command = "true"

[[tasks]]
id = "load"
depends_on = ["extrakt"]
command = "true"
retries = -1
"#,
    );
    assert_eq!(
        found,
        [
            "dags/demo.toml:2:12: unknown timezone `Europe/Atlantis` in key `timezone`; use an IANA name such as `UTC` or `Europe/Berlin`",
            "dags/demo.toml:3:15: key `retry_delay`: cannot read `5 parsecs` as a duration: `parsecs` is not a unit of time; write it like \"30s\", \"5m\" or \"1h 30m\" (units: ms, s, m, h, d)",
            "dags/demo.toml:4:1: unknown key `colour`; remove it or use one of: id, description, schedule, timezone, max_active_runs, batch_size, retries, retry_delay, timeout, grace_period, depends_on_past, notify, upstream, tasks",
            "dags/demo.toml:12:15: task `load` depends on unknown task `extrakt`; did you mean `extract`? known tasks: extract, load",
            "dags/demo.toml:14:11: key `retries` must be a whole number from 0 to 1000",
        ]
    );
}

#[test]
fn every_syntax_error_is_reported_in_words() {
    let found = errors("schedule = @daily\nschedule = \"@hourly\"\n[[tasks]\n");
    assert!(found.len() >= 2, "{found:?}");
    assert_eq!(
        found[0],
        "dags/demo.toml:1:12: not valid TOML: a text value needs double quotes, as in timezone = \"Europe/Berlin\""
    );
    assert!(
        found.iter().all(|e| e.starts_with("dags/demo.toml:")),
        "{found:?}"
    );
    assert_eq!(
        first_error("a = 1\na = 2\n"),
        "dags/demo.toml:2:1: key `a` is set twice in one table; keep one of them"
    );
}

#[test]
fn ids_are_plain_names_that_cannot_leave_the_logs_folder() {
    let dag = |id: &str| {
        format!("id = \"{id}\"\nschedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n")
    };
    let task =
        |id: &str| format!("schedule = \"@daily\"\n[[tasks]]\nid = \"{id}\"\ncommand = \"true\"\n");
    let long = "a".repeat(100);
    for ok in ["daily_orders", "v1.2", "_x", "9am", "a-b", long.as_str()] {
        assert!(load(&dag(ok)).is_ok(), "DAG id {ok}");
        assert!(load(&task(ok)).is_ok(), "task id {ok}");
    }
    let too_long = "a".repeat(101);
    for bad in [
        ".",
        "..",
        "",
        ".hidden",
        "-x",
        "a/b",
        "a b",
        "é",
        too_long.as_str(),
    ] {
        assert_eq!(
            first_error(&dag(bad)),
            format!(
                "dags/demo.toml:1:6: invalid DAG id `{bad}`: start with a letter, digit or `_`, then use letters, digits, `_`, `-` and `.` only; at most 100 characters"
            )
        );
        assert!(
            first_error(&task(bad)).starts_with(&format!(
                "dags/demo.toml:3:6: invalid task id `{bad}`: start with a letter"
            )),
            "task id {bad}"
        );
    }
    // The id from the file name is checked too.
    let from_stem = Dag::parse(&task("t"), "dags/...toml", "..", &BTreeMap::new()).dag;
    assert!(
        from_stem.unwrap_err()[0]
            .to_string()
            .contains("invalid DAG id `..`")
    );
}

#[test]
fn numbers_out_of_range_are_errors_with_the_range() {
    let base = "schedule = \"@daily\"\n[[tasks]]\nid = \"a\"\ncommand = \"true\"\n";
    for (line, message) in [
        (
            "retries = 1001",
            "key `retries` must be a whole number from 0 to 1000",
        ),
        (
            "retries = 99999999999999999999999999999999999999999",
            "key `retries`: the number is too large",
        ),
        (
            "retries = 1e30",
            "key `retries` must be a whole number such as 2, not a fraction",
        ),
        (
            "max_active_runs = 0",
            "key `max_active_runs` must be a whole number from 1 to",
        ),
        ("timeout = \"0s\"", "key `timeout` must be longer than 0s"),
        ("grace_period = \"400d\"", "`400d` is longer than a year"),
    ] {
        let found = first_error(&format!("{line}\n{base}"));
        assert!(found.contains(message), "{line}: {found}");
    }
}

#[test]
fn sql_tasks_and_gates_are_checked_key_by_key() {
    let dag = load_with(
        r#"schedule = "@daily"
[[tasks]]
id = "aggregate"
warehouse = "shop"
target = "daily_orders"
partition_column = "day"
sql = "SELECT 1 AS day"
[tasks.gate]
unique_key = ["day"]
source_count = "SELECT 1"
tolerance = 1
"#,
        &shop(),
    )
    .unwrap();
    let t = &dag.tasks[0];
    assert_eq!(t.locations.target.as_deref(), Some("dags/demo.toml:5:10"));
    let sql = t.locations.sql.as_ref().map(|s| (s.start(), s.at(7)));
    assert_eq!(
        sql,
        Some(("dags/demo.toml:7:7".into(), "dags/demo.toml:7:15".into()))
    );
    assert_eq!(
        t.locations.source_count.as_deref(),
        Some("dags/demo.toml:10:16")
    );
    assert_eq!(t.locations.command, None);
    assert_eq!(t.gate.as_ref().map(|g| g.tolerance), Some(1.0));

    let found = match load_with(
        r#"schedule = "@daily"
[[tasks]]
id = "aggregate"
warehouse = "shopp"
target = "daily orders"
partition_column = "day"
sql = "SELECT 1 AS day"
publish = "true"
[tasks.gate]
unique_key = ["day", 3]
tolerance = -1
"#,
        &shop(),
    ) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.iter().map(ToString::to_string).collect::<Vec<_>>(),
    };
    let expected = [
        "dags/demo.toml:4:13: unknown warehouse `shopp`",
        "dags/demo.toml:5:10: key `target`: `daily orders` is not a plain SQL name",
        "dags/demo.toml:8:11: key `publish`: a SQL task publishes its audited rows itself",
        "dags/demo.toml:10:22: key `unique_key`: every element must be a string",
        "dags/demo.toml:11:13: key `tolerance` must be a fraction of at least 0",
    ];
    assert_eq!(found.len(), expected.len(), "{found:#?}");
    for (found, expected) in found.iter().zip(expected) {
        assert!(found.starts_with(expected), "{found}");
    }
}

#[test]
fn a_publish_without_a_gate_is_refused_at_its_line() {
    // It would never run: `publish` runs once the gate passed.
    let e = first_error(
        r#"schedule = "@daily"
[[tasks]]
id = "export"
command = "export {{ ds }}"
publish = "move {{ ds }}"
"#,
    );
    assert!(
        e.starts_with("dags/demo.toml:5:11: key `publish`: it runs once the task's gate passed, and this task has no `[tasks.gate]`"),
        "{e}"
    );
}

#[test]
fn missing_conf_names_each_key_at_its_command() {
    let dag = load(
        r#"schedule = "@daily"
[[tasks]]
id = "t"
command = "load --region {{ conf.region }} --db {{ conf.db.host }} {{ conf.x | upper }}"
publish = ["publish", "{{ conf.region }}"]
[tasks.gate]
source_count = "echo 2"
"#,
    )
    .unwrap();
    let task = &dag.tasks[0];
    let found: Vec<String> = missing_conf(task, &serde_json::json!({"x": "a", "db": {}}))
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        found,
        [
            "dags/demo.toml:4:11: task `t`: template uses `conf.db.host`, which --conf does not give; pass it with --conf '{\"db\": {\"host\": ...}}'",
            "dags/demo.toml:4:11: task `t`: template uses `conf.region`, which --conf does not give; pass it with --conf '{\"region\": ...}'",
            "dags/demo.toml:5:11: task `t`: template uses `conf.region`, which --conf does not give; pass it with --conf '{\"region\": ...}'",
        ]
    );
    let all = serde_json::json!({"x": "a", "db": {"host": "h"}, "region": "eu"});
    assert!(missing_conf(task, &all).is_empty());
}

/// A project folder with `backfill.toml` and DAG files.
fn project(settings: &str, dags: &[(&str, &str)]) -> (tempfile::TempDir, Project) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(PROJECT_FILE), settings).unwrap();
    std::fs::create_dir(dir.path().join(DAGS_DIR)).unwrap();
    for (name, text) in dags {
        std::fs::write(dir.path().join(DAGS_DIR).join(format!("{name}.toml")), text).unwrap();
    }
    let p = Project::discover(Some(dir.path())).unwrap();
    (dir, p)
}

fn sql_dag(task: &str, target: &str) -> String {
    format!(
        "schedule = \"@daily\"\n[[tasks]]\nid = \"{task}\"\nwarehouse = \"shop\"\ntarget = \"{target}\"\npartition_column = \"day\"\nsql = \"SELECT 1 AS day\"\n"
    )
}

const SHOP: &str = "[warehouse.shop]\npath = \"warehouse.db\"\n";

#[test]
fn a_table_has_one_producer_across_dags() {
    let (_dir, p) = project(
        SHOP,
        &[
            ("a_orders", &sql_dag("aggregate", "daily_orders")),
            ("b_orders", &sql_dag("recount", "Daily_Orders")),
            ("c_other", &sql_dag("other", "weekly_orders")),
        ],
    );
    let (dags, errors) = p.load_all();
    let ids: Vec<_> = dags.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["c_other"]);
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [
            "dags/a_orders.toml:5:10: table `Daily_Orders` of warehouse `shop` is also the target of task `recount` in dags/b_orders.toml:5:10; a table has one producer",
            "dags/b_orders.toml:5:10: table `Daily_Orders` of warehouse `shop` is already the target of task `aggregate` in dags/a_orders.toml:5:10; a table has one producer",
        ]
    );
    for id in ["a_orders", "b_orders"] {
        match p.dag(id) {
            Err(ProjectError::Config(e)) => assert!(e[0].message.contains("one producer")),
            other => panic!("{id}: {other:?}"),
        }
    }
    assert!(p.dag("c_other").is_ok());
}

#[test]
fn a_table_has_one_producer_within_a_dag() {
    let two = format!(
        "{}[[tasks]]\nid = \"again\"\nwarehouse = \"shop\"\ntarget = \"daily_orders\"\npartition_column = \"day\"\nsql = \"SELECT 2 AS day\"\n",
        sql_dag("aggregate", "daily_orders")
    );
    let (_dir, p) = project(SHOP, &[("orders", &two)]);
    let (dags, errors) = p.load_all();
    assert!(dags.is_empty());
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "dags/orders.toml:11:10: table `daily_orders` of warehouse `shop` is already the target of task `aggregate` in dags/orders.toml:5:10; a table has one producer"
        ]
    );
}

#[test]
fn a_broken_dag_does_not_prevent_another() {
    let good = "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n";
    let (_dir, p) = project(
        "",
        &[
            ("good", good),
            ("broken", "schedule = \"@daily\"\nretires = 3\n"),
            ("named", "id = \"other name\"\nschedule = \"@daily\"\n"),
        ],
    );
    assert!(p.dag("good").is_ok());
    match p.dag("broken") {
        Err(ProjectError::Config(e)) => assert_eq!(e.len(), 2, "{e:?}"),
        other => panic!("{other:?}"),
    }
    // A broken file is found by the id it declares or by its file name.
    assert!(matches!(p.dag("other name"), Err(ProjectError::Config(_))));
    assert!(matches!(p.dag("named"), Err(ProjectError::Config(_))));
    match p.dag("nope") {
        Err(ProjectError::UnknownDag { known, .. }) => assert_eq!(known, ["good"]),
        other => panic!("{other:?}"),
    }
}

fn settings(text: &str) -> Result<Project, Vec<String>> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("schema.sql"), "").unwrap();
    Project::parse(dir.path().to_path_buf(), text)
        .map_err(|e| e.iter().map(ToString::to_string).collect())
}

#[test]
fn a_project_is_named_by_backfill_toml_else_by_its_folder() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("etl");
    std::fs::create_dir(&root).unwrap();
    let p = Project::parse(root.clone(), "").unwrap();
    assert_eq!((p.name.as_str(), p.named), ("etl", false));
    // As reached: `.` and `..` do not name it.
    let p = Project::parse(root.join("sub/.."), "").unwrap();
    assert_eq!(p.name, "etl");
    let p = Project::parse(root.join("."), "").unwrap();
    assert_eq!(p.name, "etl");
    let p = Project::parse(root.clone(), "project = \" shop \"\n").unwrap();
    assert_eq!((p.name.as_str(), p.named), ("shop", true));
    let found: Vec<String> = Project::parse(root, "project = \"\"\n")
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        found,
        [
            "backfill.toml:1:11: key `project` is empty; name the project (\"shop\"), or leave the key out to name it after its folder (`etl`)"
        ]
    );
}

#[test]
fn backfill_toml_defaults_and_every_error() {
    let p = settings("").unwrap();
    assert_eq!(p.lease_timeout, Duration::from_secs(30));
    assert!(p.manifest_path.ends_with(".backfill/manifest.db"));
    let p = settings("lease_timeout = \"1s\"\ndurability = \"full\"\n[warehouse.shop]\npath = \"w.db\"\ninit = [\"schema.sql\"]\n").unwrap();
    assert_eq!(p.lease_timeout, MIN_LEASE_TIMEOUT);
    assert_eq!(p.durability, Durability::Full);
    assert_eq!(p.warehouses["shop"].init.len(), 1);

    let found = settings(
        "lease_timout = \"5s\"\ndurability = \"fast\"\n[warehouse.\"my shop\"]\npath = \"w.db\"\ninit = [\"missing.sql\"]\n[warehouse.copy]\npath = \"./w.db\"\n[warehouse.nopath]\n",
    )
    .unwrap_err();
    assert_eq!(
        found,
        [
            "backfill.toml:1:1: unknown key `lease_timout`; did you mean `lease_timeout`?",
            "backfill.toml:2:14: key `durability`: `fast` is neither \"normal\" (survives kill -9) nor \"full\" (also survives a power cut)",
            "backfill.toml:3:12: invalid warehouse name `my shop`: use letters, digits and `_`, starting with a letter or `_`",
            "backfill.toml:5:9: warehouse `my shop`: init file `missing.sql` does not exist (paths are relative to the project folder)",
            "backfill.toml:7:8: warehouse `copy` uses the same file as warehouse `my shop`; give each warehouse its own file",
            "backfill.toml:8:12: warehouse `nopath` needs `path`, its SQLite database file, such as path = \"warehouse.db\"",
        ]
    );
}

#[test]
fn a_lease_timeout_shorter_than_a_second_is_refused() {
    for short in ["0s", "100ms", "999ms"] {
        let found = settings(&format!("lease_timeout = \"{short}\"\n")).unwrap_err();
        assert_eq!(
            found,
            [format!(
                "backfill.toml:1:17: key `lease_timeout`: `{short}` is too short; a running backfill writes a heartbeat every 250ms, and a shorter timeout would judge a live one dead; use at least \"1s\" (the default is \"30s\")"
            )]
        );
    }
    assert!(
        settings("lease_timeout = 30\n").unwrap_err()[0]
            .contains("key `lease_timeout` must be a string such as \"30s\", not an integer")
    );
}

// Property tests: no input makes loading panic, and a failure always says where.

fn any_value() -> impl Strategy<Value = String> {
    prop_oneof![
        // Arbitrary text, quoted as a TOML string.
        any::<String>().prop_map(|s| toml_string(&s)),
        "[ -~]{0,12}".prop_map(|s| toml_string(&s)),
        // Numbers out of every range.
        any::<i64>().prop_map(|n| n.to_string()),
        Just("-1".to_string()),
        Just("1e30".to_string()),
        Just("99999999999999999999999999999999".to_string()),
        Just("nan".to_string()),
        Just("-inf".to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        Just("true".to_string()),
        Just("[]".to_string()),
        Just("[1, \"a\"]".to_string()),
        Just("{}".to_string()),
        Just("2026-01-01".to_string()),
        // Durations.
        "[0-9]{1,25}(ns|ms|s|m|h|d|w|y|M|x|)( [0-9]{1,3}[a-z]{0,2})?".prop_map(|s| toml_string(&s)),
        // Cron expressions with random fields.
        cron().prop_map(|s| toml_string(&s)),
    ]
}

fn cron() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        Just("*".to_string()),
        "[0-9]{1,3}".prop_map(|s| s),
        "[0-9]{1,2}-[0-9]{1,2}".prop_map(|s| s),
        "\\*/[0-9]{1,3}".prop_map(|s| s),
        "[0-9]{1,2}(,[0-9]{1,2}){1,3}".prop_map(|s| s),
        "[A-Za-z?L#W]{1,4}".prop_map(|s| s),
        any::<String>(),
    ];
    prop::collection::vec(field, 0..8).prop_map(|f| f.join(" "))
}

fn toml_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

fn check_outcome<T>(result: Result<T, Vec<ConfigError>>, file: &str) -> Result<(), TestCaseError> {
    if let Err(errors) = result {
        prop_assert!(!errors.is_empty());
        for e in errors {
            prop_assert!(e.location.starts_with(file), "{e}");
            prop_assert!(!e.message.is_empty());
        }
    }
    Ok(())
}

const DAG_KEYS: &[&str] = &[
    "id",
    "schedule",
    "timezone",
    "max_active_runs",
    "batch_size",
    "retries",
    "retry_delay",
    "timeout",
    "grace_period",
    "depends_on_past",
    "description",
];
const TASK_KEYS: &[&str] = &[
    "id",
    "depends_on",
    "command",
    "retries",
    "retry_delay",
    "timeout",
    "grace_period",
    "publish",
    "warehouse",
    "target",
    "partition_column",
    "sql",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn a_dag_file_with_any_values_loads_or_says_where(
        top in prop::collection::vec((prop::sample::select(DAG_KEYS), any_value()), 0..8),
        tasks in prop::collection::vec(
            prop::collection::vec((prop::sample::select(TASK_KEYS), any_value()), 0..6),
            0..3,
        ),
        gate in prop::option::of(any_value()),
    ) {
        let mut text = String::new();
        let mut seen = std::collections::HashSet::new();
        for (k, v) in &top {
            if seen.insert(*k) {
                text.push_str(&format!("{k} = {v}\n"));
            }
        }
        for task in &tasks {
            text.push_str("[[tasks]]\n");
            let mut seen = std::collections::HashSet::new();
            for (k, v) in task {
                if seen.insert(*k) {
                    text.push_str(&format!("{k} = {v}\n"));
                }
            }
            if let Some(g) = &gate {
                text.push_str(&format!("[tasks.gate]\ntolerance = {g}\nsource_count = {g}\n"));
            }
        }
        check_outcome(load_with(&text, &shop()), "dags/demo.toml")?;
    }

    #[test]
    fn any_text_as_a_dag_file_loads_or_says_where(text in any::<String>()) {
        check_outcome(load(&text), "dags/demo.toml")?;
    }

    #[test]
    fn backfill_toml_with_any_values_loads_or_says_where(
        lease_timeout in prop::option::of(any_value()),
        durability in prop::option::of(any_value()),
        manifest in prop::option::of(any_value()),
        warehouse in prop::option::of((any::<String>(), any_value(), any_value())),
    ) {
        let mut text = String::new();
        for (k, v) in [("lease_timeout", &lease_timeout), ("durability", &durability), ("manifest", &manifest)] {
            if let Some(v) = v {
                text.push_str(&format!("{k} = {v}\n"));
            }
        }
        if let Some((name, path, init)) = &warehouse {
            text.push_str(&format!("[warehouse.{}]\npath = {path}\ninit = {init}\n", toml_string(name)));
        }
        let root = Path::new("/nonexistent-project").to_path_buf();
        check_outcome(Project::parse(root, &text), PROJECT_FILE)?;
    }
}

#[test]
fn urls_are_shown_without_their_password() {
    for (url, shown) in [
        (
            "postgresql://etl:hunter2@db.internal:5432/analytics?sslmode=require",
            "postgresql://etl@db.internal:5432/analytics?sslmode=require",
        ),
        ("postgresql://etl:se/cret@db/x", "postgresql://etl@db/x"),
        (
            "postgresql://etl:se?cret@db/x?a=b",
            "postgresql://etl@db/x?a=b",
        ),
        ("postgresql://etl:p@ss@db/x", "postgresql://etl@db/x"),
        (
            "postgresql://db/x?user=etl&password=hunter2",
            "postgresql://db/x?user=etl&password=***",
        ),
        ("postgresql://etl@db/x", "postgresql://etl@db/x"),
        // The driver decodes keys as it decodes values.
        (
            "postgresql://etl@db/x?pass%77ord=hunter2",
            "postgresql://etl@db/x?pass%77ord=***",
        ),
        (
            "postgresql://etl@db/x?%70assword=hunter2&sslmode=require",
            "postgresql://etl@db/x?%70assword=***&sslmode=require",
        ),
        (
            "postgresql://etl@db/x?sslpassword=hunter2",
            "postgresql://etl@db/x?sslpassword=***",
        ),
    ] {
        assert_eq!(redact_url(url), shown, "{url}");
    }
}

#[test]
fn a_postgres_table_has_one_producer_whatever_its_schema_is_written() {
    // `dup` is `public.dup` on PostgreSQL; `Dup` (quoted as written) is another table.
    let pg =
        "[warehouse.shop]\nkind = \"postgres\"\nurl = \"postgresql://etl@db.internal/analytics\"\n";
    let (_dir, p) = project(
        pg,
        &[
            ("a_orders", &sql_dag("aggregate", "dup")),
            ("b_orders", &sql_dag("recount", "public.dup")),
            ("c_other", &sql_dag("other", "Dup")),
        ],
    );
    let (dags, errors) = p.load_all();
    let ids: Vec<_> = dags.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["c_other"]);
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [
            "dags/a_orders.toml:5:10: table `public.dup` of warehouse `shop` is also the target of task `recount` in dags/b_orders.toml:5:10; a table has one producer",
            "dags/b_orders.toml:5:10: table `public.dup` of warehouse `shop` is already the target of task `aggregate` in dags/a_orders.toml:5:10; a table has one producer",
        ]
    );
}

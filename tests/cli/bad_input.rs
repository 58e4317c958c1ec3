//! Bad input: exit code 2, a message that names the problem, and the manifest unchanged.
//! Also the other exit codes that are not covered elsewhere (0 nothing to do, 1 internal).

use crate::support::Project;

const GOOD: &str = "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n";

/// A project with a manifest that already holds one backfill, plus broken DAG files.
fn project() -> Project {
    let p = Project::new()
        .dag("good", GOOD)
        .dag(
            "past",
            "schedule = \"@daily\"\ndepends_on_past = true\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
        )
        .dag(
            "badtz",
            "schedule = \"@daily\"\ntimezone = \"Europe/Atlantis\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
        )
        .dag(
            "badcron",
            "schedule = \"0 0 * * * *\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
        )
        .dag(
            "badkey",
            "schedule = \"@daily\"\nretires = 3\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
        )
        .dag(
            "cycle",
            "schedule = \"@daily\"\n[[tasks]]\nid = \"a\"\ndepends_on = [\"b\"]\ncommand = \"true\"\n[[tasks]]\nid = \"b\"\ndepends_on = [\"a\"]\ncommand = \"true\"\n",
        )
        .dag(
            "unknowndep",
            "schedule = \"@daily\"\n[[tasks]]\nid = \"a\"\ndepends_on = [\"nope\"]\ncommand = \"true\"\n",
        );
    p.run(&[
        "create",
        "--dag",
        "good",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ])
    .code(0);
    p
}

fn create(extra: &[&str]) -> Vec<String> {
    let mut args = vec!["create"];
    args.extend_from_slice(extra);
    args.into_iter().map(str::to_string).collect()
}

#[test]
fn bad_input_exits_2_names_the_problem_and_writes_nothing() {
    let p = project();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            create(&[
                "--dag",
                "good",
                "--from",
                "2026-01-05",
                "--to",
                "2026-01-01",
            ]),
            "--from 2026-01-05 is after --to 2026-01-01",
        ),
        (
            create(&[
                "--dag",
                "nope",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
            ]),
            "unknown DAG `nope`; known DAGs: good, past",
        ),
        (
            create(&[
                "--dag",
                "badtz",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
            ]),
            "dags/badtz.toml:2:12: unknown timezone `Europe/Atlantis`",
        ),
        (
            create(&[
                "--dag",
                "badcron",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
            ]),
            "dags/badcron.toml:1:12: key `schedule`: invalid schedule `0 0 * * * *`",
        ),
        (
            create(&[
                "--dag",
                "badkey",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
            ]),
            "dags/badkey.toml:2:1: unknown key `retires`; did you mean `retries`?",
        ),
        (
            create(&[
                "--dag",
                "cycle",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
            ]),
            "dags/cycle.toml:3:6: the tasks' depends_on form a cycle: a -> b -> a",
        ),
        (
            create(&[
                "--dag",
                "unknowndep",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
            ]),
            "task `a` depends on unknown task `nope`",
        ),
        (
            create(&[
                "--dag",
                "good",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
                "--conf",
                "{region: eu}",
            ]),
            "--conf is not valid JSON",
        ),
        (
            create(&[
                "--dag",
                "good",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
                "--conf",
                "[1]",
            ]),
            "--conf must be a JSON object",
        ),
        (
            create(&[
                "--dag",
                "past",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
                "--run-backwards",
            ]),
            "--run-backwards cannot be used with DAG `past`: it sets depends_on_past = true",
        ),
        (
            create(&[
                "--dag",
                "good",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
                "--max-active-runs",
                "0",
            ]),
            "invalid value '0' for '--max-active-runs <N>'",
        ),
        (
            create(&[
                "--dag",
                "good",
                "--from",
                "yesterdayish",
                "--to",
                "2026-01-02",
            ]),
            "cannot read `yesterdayish` as a time",
        ),
        (
            create(&[
                "--dag",
                "good",
                "--from",
                "2026-09-31",
                "--to",
                "2026-10-02",
            ]),
            "cannot read `2026-09-31` as a time: September has 30 days",
        ),
        (
            create(&[
                "--dag",
                "good",
                "--from",
                "2026-02-01",
                "--to",
                "2026-02-29",
            ]),
            "cannot read `2026-02-29` as a time: 2026 is not a leap year: February 2026 has 28 days",
        ),
        (
            create(&[
                "--dag",
                "good",
                "--from",
                "2026-01-01T10:00",
                "--to",
                "2026-01-01T20:00",
            ]),
            "no interval of schedule `@daily` starts between --from 2026-01-01T10:00 and --to 2026-01-01T20:00",
        ),
        (
            create(&[
                "--dag",
                "good",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
                "--reprocess-behavior",
                "all",
            ]),
            "invalid value 'all' for '--reprocess-behavior",
        ),
        (
            vec!["resume".into(), "42".into()],
            "no backfill 42 in the manifest",
        ),
        (
            vec!["cancel".into(), "42".into()],
            "no backfill 42 in the manifest",
        ),
        (
            vec!["show".into(), "42".into()],
            "no backfill 42 in the manifest",
        ),
        (
            vec!["promote".into(), "1".into()],
            "backfill 1 is a `run` backfill, not a staged one: `backfill promote` takes the id of a `backfill create --stage` backfill",
        ),
        (
            vec!["discard".into(), "1".into()],
            "backfill 1 is a `run` backfill, not a staged one: `backfill discard` takes the id",
        ),
        (
            vec!["diff".into(), "42".into()],
            "no backfill 42 in the manifest",
        ),
        (
            vec!["promote".into(), "abc".into()],
            "invalid value 'abc' for '<ID>'",
        ),
        (
            [
                "rollback",
                "--dag",
                "good",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
            ]
            .map(String::from)
            .to_vec(),
            "DAG `good` has no SQL task: only SQL tasks keep the rows a publish replaces",
        ),
        (
            [
                "rollback",
                "--dag",
                "good",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
                "--task",
                "nope",
            ]
            .map(String::from)
            .to_vec(),
            "--task nope: DAG `good` has no task `nope` (its tasks: t)",
        ),
        (
            create(&[
                "--dag",
                "good",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
                "--tasks",
                "t,nope",
            ]),
            "--tasks t,nope: DAG `good` has no task `nope` (its tasks: t)",
        ),
        (
            create(&[
                "--dag",
                "good",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
                "--max-failures",
                "0",
            ]),
            "invalid value '0' for '--max-failures <N>'",
        ),
        (
            create(&[
                "--dag",
                "good",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
                "--stage",
                "--cascade",
                "all",
            ]),
            "the argument '--stage' cannot be used with '--cascade <WHICH>'",
        ),
        (
            create(&[
                "--dag",
                "good",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
                "--cascade",
                "some",
            ]),
            "invalid value 'some' for '--cascade <WHICH>'",
        ),
    ];
    for (args, message) in cases {
        let before = p.dump();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        p.run(&args).code(2).stderr_has(message);
        assert_eq!(p.dump(), before, "{args:?} changed the manifest");
    }
}

#[test]
fn bad_input_on_a_fresh_project_creates_no_manifest() {
    let p = Project::new().dag("good", GOOD);
    p.run(&[
        "create",
        "--dag",
        "good",
        "--from",
        "2026-01-05",
        "--to",
        "2026-01-01",
    ])
    .code(2);
    p.run(&[
        "create",
        "--dag",
        "good",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
        "--dry-run",
    ])
    .code(0);
    p.run(&["list"]).code(0);
    assert!(!p.manifest_path().exists());
}

#[test]
fn dags_validate_lists_every_error_and_exits_2() {
    let p = project();
    let out = p.run(&["dags", "validate"]);
    out.code(2).stderr_has("5 errors in DAG files");
    for file in ["badcron", "badkey", "badtz", "cycle", "unknowndep"] {
        out.stderr_has(&format!("dags/{file}.toml:"));
    }
}

#[test]
fn a_template_typo_in_a_multi_line_command_points_at_its_line_once() {
    let p = Project::new().dag(
        "typo",
        "schedule = \"@daily\"\n\n[[tasks]]\nid = \"a\"\ncommand = \"\"\"\necho start\necho {{ dss }}\necho end\n\"\"\"\n",
    );
    let expected = "error: dags/typo.toml:7:9: key `command`: unknown template variable `dss`; did you mean `ds`?";
    let create = [
        "create",
        "--dag",
        "typo",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ];
    for args in [&["dags", "validate"][..], &create] {
        let out = p.run(args);
        out.code(2).stderr_has(expected);
        assert_eq!(out.stderr.matches("error:").count(), 1, "{}", out.stderr);
        assert!(!out.stderr.contains("echo start"), "{}", out.stderr);
    }
    assert!(!p.manifest_path().exists());
}

/// A DAG file with one SQL task into `target` whose `sql` (from line 7) is `query`.
fn sql_dag(target: &str, query: &str) -> String {
    format!(
        "schedule = \"@daily\"\n[[tasks]]\nid = \"agg\"\nwarehouse = \"shop\"\ntarget = \"{target}\"\npartition_column = \"day\"\nsql = \"\"\"\n{query}\n\"\"\"\n"
    )
}

const TABLES: &str = "CREATE TABLE raw (ts TEXT);\nCREATE TABLE daily_a (day TEXT, n INTEGER);\nCREATE TABLE daily_b (day TEXT, n INTEGER);\nCREATE TABLE daily_c (day TEXT, n INTEGER);\n";

#[test]
fn dags_validate_prepares_every_sql_task_against_its_fixture_warehouse() {
    let p = Project::new()
        .dag(
            "good",
            &sql_dag("daily_a", "SELECT date(ts) AS day, COUNT(*) AS n FROM raw\nWHERE ts >= :data_interval_start AND ts < :data_interval_end\nGROUP BY 1"),
        )
        .dag(
            "missing",
            &sql_dag("daily_b", "SELECT date(ts) AS day, COUNT(*) AS n\nFROM raw_orders\nGROUP BY 1"),
        )
        .dag(
            "syntax",
            &sql_dag("daily_c", "SELECT date(ts) AS day, COUNT(*) AS n\nFROM raw\nWHERE WHERE ts >= :ds\nGROUP BY 1"),
        );
    p.write(
        "backfill.toml",
        "[warehouse.shop]\npath = \"warehouse.db\"\ninit = [\"schema.sql\"]\n",
    );
    p.write("schema.sql", TABLES);
    let out = p.run(&["dags", "validate"]);
    out.code(2)
        .stderr_has("error: dags/missing.toml:7:7: task `agg`: key `sql` does not prepare: no such table: raw_orders\n")
        .stderr_has("error: dags/syntax.toml:10:13: key `sql` cannot be read as one SQLite query (Expected: end of statement, found: ts); what a query does must be known before it runs, see docs/gate.md#what-a-query-may-do\n")
        .stderr_has("2 errors in DAG files");
    assert_eq!(out.stderr.matches("error:").count(), 2, "{}", out.stderr);
    assert!(
        p.path("warehouse.db").exists(),
        "the fixture warehouse is created"
    );
    let json = p.run(&["--output", "json", "dags", "validate"]);
    json.code(2);
    let doc = json.json();
    assert_eq!(doc["valid"], false);
    assert_eq!(doc["errors"].as_array().map(Vec::len), Some(2), "{doc}");
    // What loading the DAG files refuses comes first, then what the warehouse does not prepare.
    assert_eq!(doc["errors"][0]["location"], "dags/syntax.toml:10:13");
    assert_eq!(doc["errors"][1]["location"], "dags/missing.toml:7:7");
    assert!(!p.manifest_path().exists());
    // Fixed, the same project validates.
    p.write(
        "schema.sql",
        &format!("{TABLES}CREATE TABLE raw_orders (ts TEXT);\n"),
    );
    std::fs::remove_file(p.path("warehouse.db")).unwrap();
    std::fs::remove_file(p.path("dags/syntax.toml")).unwrap();
    p.run(&["dags", "validate"])
        .code(0)
        .stderr_has("2 DAG files OK");
}

#[test]
fn no_project_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_backfill"))
        .args(["-C", dir.path().to_str().unwrap(), "dags"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no backfill.toml in"));
}

#[test]
fn nothing_to_do_exits_0_and_running_twice_is_safe() {
    let p = project();
    let out = p.run(&[
        "create",
        "--dag",
        "good",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
        "--output",
        "json",
    ]);
    out.code(0);
    let doc = out.json();
    assert_eq!(doc["intervals"]["skipped"], 2);
    assert_eq!(doc["intervals"]["succeeded"], 0);
    assert_eq!(p.count("SELECT COUNT(*) FROM runs"), 2, "nothing ran again");
}

#[test]
fn an_unreadable_manifest_is_an_internal_error_exit_1() {
    let p = Project::new().sqlite().dag("good", GOOD);
    p.write(
        ".backfill/manifest.db",
        "this is not a database, it is a text file that is long enough to have a header",
    );
    p.run(&[
        "create",
        "--dag",
        "good",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ])
    .code(1)
    .stderr_has("manifest");
}

#[test]
fn ids_are_plain_names_so_logs_stay_in_their_folder() {
    let p = Project::new().dag(
        "dots",
        "id = \"..\"\nschedule = \"@daily\"\n[[tasks]]\nid = \".\"\ncommand = \"true\"\n",
    );
    let out = p.run(&["dags", "validate"]);
    out.code(2)
        .stderr_has("dags/dots.toml:1:6: invalid DAG id `..`")
        .stderr_has("dags/dots.toml:4:6: invalid task id `.`");
    assert!(!p.path(".backfill").exists());
}

#[test]
fn a_lease_timeout_below_the_minimum_is_refused() {
    let p = Project::new().dag("good", GOOD);
    p.write("backfill.toml", "lease_timeout = \"100ms\"\n");
    p.run(&[
        "create",
        "--dag",
        "good",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ])
    .code(2)
    .stderr_has("backfill.toml:1:17: key `lease_timeout`")
    .stderr_has("use at least \"1s\"");
    assert!(!p.manifest_path().exists());
}

#[test]
fn two_tasks_publishing_into_one_table_are_refused() {
    let sql = |target: &str| {
        format!(
            "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\nwarehouse = \"w\"\ntarget = \"{target}\"\npartition_column = \"day\"\nsql = \"SELECT :ds AS day\"\n"
        )
    };
    let p = Project::new()
        .dag("a", &sql("daily"))
        .dag("b", &sql("daily"));
    p.write(
        "backfill.toml",
        "[warehouse.w]\npath = \"w.db\"\ninit = [\"init.sql\"]\n",
    );
    p.write("init.sql", "CREATE TABLE daily (day TEXT);");
    let out = p.run(&[
        "create",
        "--dag",
        "b",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
    ]);
    out.code(2)
        .stderr_has("dags/b.toml:5:10: table `daily` of warehouse `w` is already the target of task `t` in dags/a.toml:5:10");
    assert!(!p.manifest_path().exists());
}

#[test]
fn conf_values_cannot_inject_shell_commands() {
    let p = Project::new().dag(
        "q",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"echo {{ conf.x }} > said.txt\"\n",
    );
    p.run(&[
        "create",
        "--dag",
        "q",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-01",
        "--conf",
        r#"{"x": "a; touch PWNED #"}"#,
    ])
    .code(0);
    assert!(!p.path("PWNED").exists(), "the value ran as a command");
    assert_eq!(p.read("said.txt"), "a; touch PWNED #\n");
    // `| safe` is the explicit way to insert shell text.
    p.write(
        "dags/q.toml",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"echo {{ conf.x | safe }} > said.txt\"\n",
    );
    p.run(&[
        "create",
        "--dag",
        "q",
        "--from",
        "2026-01-02",
        "--to",
        "2026-01-02",
        "--conf",
        r#"{"x": "one; echo two"}"#,
    ])
    .code(0);
    assert_eq!(p.read("said.txt"), "two\n");
}

#[test]
fn no_input_panics() {
    let p = Project::new().dag("good", GOOD);
    for when in [
        "nowé",
        "today-99999999999d",
        "today-9999999999999999d",
        "now-500000y",
        "now+é",
        "9999999-01-01",
    ] {
        let out = p.run(&["create", "--dag", "good", "--from", when, "--to", "today"]);
        out.code(2)
            .stderr_has(&format!("cannot read `{when}` as a time"));
        let out = p.run(&[
            "runs",
            "--dag",
            "good",
            "--from",
            "2026-01-01",
            "--to",
            when,
        ]);
        assert_eq!(out.code, 2, "runs --to {when}: {}", out.stderr);
    }
    assert!(!p.manifest_path().exists());
}

#[test]
fn a_range_of_more_than_a_million_intervals_is_refused_with_a_split() {
    let p = Project::new().dag(
        "minutely",
        "schedule = \"* * * * *\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    p.run(&[
        "create",
        "--dag",
        "minutely",
        "--from",
        "1900-01-01",
        "--to",
        "2200-01-01",
    ])
    .code(2)
    .stderr_has("error: the range --from 1900-01-01 --to 2200-01-01 holds more than 1,000,000 intervals of schedule `* * * * *`; split it into several backfills: the first up to --to 1901-11-26T10:39:59Z, the next from --from 1901-11-26T10:40:00Z");
    assert!(!p.manifest_path().exists());
}

#[test]
fn runs_selects_the_interval_starts_that_create_runs() {
    let p = Project::new().dag(
        "hourly",
        "schedule = \"@hourly\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    let range = ["--from", "2026-01-01T03:00", "--to", "2026-01-01T05:00"];
    let mut create = vec!["create", "--dag", "hourly"];
    create.extend(range);
    p.run(&create).code(0);
    let mut runs = vec!["runs", "--dag", "hourly", "--output", "json"];
    runs.extend(range);
    let out = p.run(&runs);
    out.code(0);
    let starts: Vec<String> = out
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["start"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        starts,
        [
            "2026-01-01T03:00:00Z",
            "2026-01-01T04:00:00Z",
            "2026-01-01T05:00:00Z"
        ]
    );
}

/// A project whose only DAG file is broken has DAG files: an unknown id says that they do not
/// load and how to see why, not that there are none.
#[test]
fn an_unknown_dag_among_broken_files_points_at_dags_validate() {
    let p = Project::new().dag(
        "daily_report",
        "schedule = \"@daily\"\nretires = 3\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    p.run(&["create", "--dag", "daily_reprt", "--from", "2026-01-01", "--to", "2026-01-01"])
        .code(2)
        .stderr_has("unknown DAG `daily_reprt`; no DAG file loads; 1 file in dags/ has errors: `backfill dags validate` lists them");
    assert!(!p.has_manifest());
}

#[test]
fn an_unreachable_postgresql_manifest_is_named_without_its_password_and_nothing_is_written() {
    // A URL must never become a SQLite file under a folder named `postgresql:`, and an error
    // must not repeat the password.
    let p = Project::new().dag("good", GOOD);
    let create = [
        "create",
        "--dag",
        "good",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ];
    let flag = [
        &[
            "--manifest",
            "postgresql://etl:hunter2@127.0.0.1:1/backfill",
        ],
        &create[..],
    ]
    .concat();
    let out = p.run(&flag);
    out.code(1)
        .stderr_has("manifest postgresql://etl@127.0.0.1:1/backfill: cannot connect");
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
    // A URL libpq would not take is bad input; so is a keyword/value string, which must not
    // become a file name with its password.
    for (manifest, message) in [
        (
            "postgresql://etl:hunter2@127.0.0.1:1/backfill?sslmode=sometimes",
            "sslmode `sometimes` is none of",
        ),
        (
            "host=127.0.0.1 port=1 user=etl password=hunter2 dbname=x",
            "a libpq keyword/value string is not taken: write the manifest as a URL",
        ),
    ] {
        let flag = [&["--manifest", manifest][..], &create[..]].concat();
        let out = p.run(&flag);
        out.code(2).stderr_has(message);
        assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
    }
    p.write(
        "backfill.toml",
        "manifest = \"${BACKFILL_TEST_UNSET_URL}\"\n",
    );
    p.run(&create).code(2).stderr_has(
        "backfill.toml:1:12: key `manifest`: environment variable `BACKFILL_TEST_UNSET_URL` is not set; export it",
    );
    let left: Vec<String> = std::fs::read_dir(p.path("."))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("postgres") || n.starts_with("host=") || n == ".backfill")
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(!p.manifest_path().exists());
}

/// A warehouse's `${VAR}` is needed only by a command that uses the warehouse: reading the
/// manifest, and running a DAG of another warehouse, work without it; a command that needs the
/// warehouse says which variable, where it is named, and exits 2 having written nothing for it.
#[test]
fn a_warehouse_secret_is_needed_only_where_the_warehouse_is_used() {
    let p = Project::new()
        .dag(
            "report",
            "schedule = \"@daily\"\n[[tasks]]\nid = \"r\"\ncommand = \"true\"\n",
        )
        .dag(
            "sales",
            "schedule = \"@daily\"\n[[tasks]]\nid = \"load\"\nwarehouse = \"sales\"\ntarget = \"t\"\npartition_column = \"day\"\nsql = \"SELECT 1 AS day\"\n",
        );
    p.write(
        "backfill.toml",
        "[warehouse.sales]\nkind = \"postgres\"\nurl = \"postgresql://etl:${BACKFILL_TEST_UNSET_SALES_PASSWORD}@127.0.0.1:1/sales\"\n",
    );
    let unset = "backfill.toml:3:7: warehouse `sales`: key `url`: environment variable `BACKFILL_TEST_UNSET_SALES_PASSWORD` is not set; export it, or write the value here";
    p.create("report", "2026-01-01", "2026-01-02", &[]).code(0);
    p.run(&["list"]).code(0).stdout_has("report");
    p.run(&["show", "1"]).code(0);
    p.run(&["dags"]).code(0).stdout_has("sales");
    p.run(&["dags", "validate"]).code(2).stderr_has(unset);
    let out = p.create("sales", "2026-01-01", "2026-01-02", &[]);
    out.code(2).stderr_has(unset);
    assert_eq!(
        p.count("SELECT COUNT(*) FROM backfills"),
        1,
        "only report's"
    );
    // Set, but to what makes no URL: judged where the warehouse is used, as an unset one is.
    p.write(
        "backfill.toml",
        "[warehouse.sales]\nkind = \"postgres\"\nurl = \"${BACKFILL_TEST_UNSET_SALES_PASSWORD}\"\n",
    );
    let empty = [("BACKFILL_TEST_UNSET_SALES_PASSWORD", "")];
    p.run_with(&["list"], &empty).code(0);
    p.run_with(
        &["create", "--dag", "sales", "--from", "2026-01-01", "--to", "2026-01-02"],
        &empty,
    )
    .code(2)
    .stderr_has("backfill.toml:3:7: warehouse `sales`: key `url`: the environment variables it names do not make a PostgreSQL URL");
}

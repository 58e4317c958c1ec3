//! The documentation's recipes, run as a user would paste them: the cron line with cron's
//! environment, every `backfill` step of the CI job, the notification example, and every
//! command block of the README and the guide (a test below checks that each is run).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{
    NOW, Out, Project, block_with, command_blocks, copy_dir, readme_block, wait_until, wait_within,
};

fn bin_dir() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_backfill")).parent().unwrap()
}

fn output(c: &mut Command) -> Out {
    Out::of(&c.stdin(Stdio::null()).output().expect("run"))
}

const DAILY_ORDERS: &str = r#"
schedule = "@daily"

[[tasks]]
id = "load"
command = "test ! -e fail-{{ ds }} && echo '{\"rows\": 1}' > $BACKFILL_RESULT"
[tasks.gate]
source_fingerprint = "cat source/{{ ds }} 2>/dev/null || echo none"
"#;

/// The README's crontab line, run as cron runs it in project `p`: `sh -c` with the crontab's
/// variables, HOME, LOGNAME and SHELL, from `/`.
fn cron_job(p: &Project) -> impl Fn() -> Out {
    let block = readme_block("## Nightly reruns from cron", "cron");
    let var = |name: &str| {
        block
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("the recipe sets {name}"))
            .to_string()
    };
    assert!(var("MAILTO").contains('@'), "failures are mailed");
    let path = var("PATH");
    assert!(
        path.starts_with("/home/etl/.cargo/bin:"),
        "the recipe puts cargo's bin folder on PATH: {path}"
    );
    let path = path.replace("/home/etl/.cargo/bin", &bin_dir().display().to_string());
    let job = block
        .lines()
        .find(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .expect("a crontab line");
    assert!(!job.contains('%'), "cron turns % into a newline: {job}");
    let command = job.split_whitespace().skip(5).collect::<Vec<_>>().join(" ");
    let project = p.path("");
    let command = command.replace("/srv/pipelines", &project.display().to_string());
    let manifest_env = p.manifest_env();
    move || {
        let mut c = Command::new("/bin/sh");
        c.arg("-c")
            .arg(&command)
            .current_dir("/")
            .env_clear()
            // A crontab line sets BACKFILL_MANIFEST as it sets PATH.
            .envs(manifest_env.clone())
            .env("PATH", &path)
            .env("HOME", &project)
            .env("LOGNAME", "etl")
            .env("SHELL", "/bin/sh")
            .env("BACKFILL_NOW", NOW);
        output(&mut c)
    }
}

#[test]
fn the_cron_recipe_works_as_pasted() {
    let p = Project::new().dag("daily_orders", DAILY_ORDERS);
    let project = p.path("");
    let cron = cron_job(&p);
    let history = || -> Vec<serde_json::Value> {
        p.read(".backfill/history/daily_orders.jsonl")
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };

    // A night with a failure: cron mails what is printed, and it says what failed and how to rerun.
    p.write("fail-2026-11-27", "");
    let night = cron();
    night.code(3);
    assert_eq!(night.stdout, "", "stdout goes to the history");
    night
        .stderr_has("failed 2026-11-27: task `load` failed: exit code 1")
        .stderr_has("  log: ")
        .stderr_has("rerun the failures with `backfill create --dag daily_orders --from 2026-11-27 --to 2026-11-27 --reprocess-behavior failed`");
    let nights = history();
    assert_eq!(nights.len(), 1);
    assert_eq!(nights[0]["state"], "failed");
    assert_eq!(
        nights[0]["intervals"]["total"], 30,
        "today-30d to yesterday"
    );
    assert_eq!(nights[0]["intervals"]["succeeded"], 29);

    // The rerun command in the mail works as pasted in the project folder.
    std::fs::remove_file(p.path("fail-2026-11-27")).unwrap();
    let rerun = nights[0]["rerun"].as_str().unwrap().to_string();
    let words = shlex::split(&rerun).unwrap();
    assert_eq!(words[0], "backfill");
    output(
        Command::new(env!("CARGO_BIN_EXE_backfill"))
            .envs(p.manifest_env())
            .args(&words[1..])
            .current_dir(&project)
            .env("BACKFILL_NOW", NOW),
    )
    .code(0)
    .stderr_has("completed — 1 succeeded");

    // The next night has nothing to do, and says nothing: no mail.
    let night = cron();
    night.code(0);
    assert_eq!((night.stdout.as_str(), night.stderr.as_str()), ("", ""));
    // Late data for one day: the night after reruns that day alone, silently.
    p.write("source/2026-11-20", "late rows\n");
    let night = cron();
    night.code(0);
    assert_eq!((night.stdout.as_str(), night.stderr.as_str()), ("", ""));
    let nights = history();
    assert_eq!(nights.len(), 3);
    for (n, ran) in [(1, 0), (2, 1)] {
        assert_eq!(nights[n]["state"], "completed");
        assert_eq!(nights[n]["intervals"]["succeeded"], ran, "night {n}");
        assert_eq!(nights[n]["intervals"]["skipped"], 30 - ran, "night {n}");
    }
    assert_eq!(
        p.rows("SELECT r.interval_start FROM runs r WHERE r.backfill_id = 4"),
        [
            [chrono::DateTime::parse_from_rfc3339("2026-11-20T00:00:00Z")
                .unwrap()
                .timestamp()
                .to_string()]
        ]
    );
}

/// The cron recipe on the shop's own `daily_orders`: one late order reaches the published
/// table the night after it arrived, and the night says nothing.
#[test]
fn the_cron_recipe_publishes_a_late_order_of_the_shop() {
    let p = crate::gate::shop();
    let cron = cron_job(&p);
    let night = cron();
    night.code(0);
    assert_eq!((night.stdout.as_str(), night.stderr.as_str()), ("", ""));
    let day = "2026-11-10";
    let published = || {
        crate::gate::wh_count(
            &p,
            &format!("SELECT SUM(orders) FROM daily_orders WHERE day = '{day}'"),
        )
    };
    let raw = || {
        crate::gate::wh_count(
            &p,
            &format!("SELECT COUNT(*) FROM raw_orders WHERE date(order_ts) = '{day}'"),
        )
    };
    assert_eq!(published(), raw());
    crate::gate::wh(&p)
        .execute_batch(
            "INSERT INTO raw_orders (order_ts, region, amount_cents) VALUES ('2026-11-10 17:45:00', 'eu', 4200)",
        )
        .unwrap();
    let night = cron();
    night.code(0);
    assert_eq!((night.stdout.as_str(), night.stderr.as_str()), ("", ""));
    assert_eq!(published(), raw(), "the late order is published");
    let history: Vec<serde_json::Value> = p
        .read(".backfill/history/daily_orders.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(history[1]["intervals"]["succeeded"], 1);
    assert_eq!(history[1]["skipped"]["source unchanged"], 29);
}

#[test]
fn the_ci_recipe_passes_on_the_example() {
    let block = readme_block("## CI smoke tests", "yaml");
    assert!(block.contains("run: cargo install --locked --path ."));
    let steps: Vec<Vec<String>> = block
        .lines()
        .filter_map(|l| l.trim().strip_prefix("run: backfill "))
        .map(|rest| shlex::split(rest).unwrap())
        .collect();
    let kinds: Vec<&str> = steps
        .iter()
        .map(|s| {
            let c = s.iter().position(|w| w == "-C").unwrap();
            if s.iter().any(|w| w == "--dry-run") {
                "dry run"
            } else {
                s[c + 2].as_str()
            }
        })
        .collect();
    assert_eq!(kinds, ["dags", "dry run", "create", "verify"]);

    let p = Project::new();
    let shop = p.path("shop");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/shop"),
        &shop,
    );
    for step in &steps {
        let args: Vec<String> = step
            .iter()
            .map(|w| {
                if w == "examples/shop" {
                    shop.display().to_string()
                } else {
                    w.clone()
                }
            })
            .collect();
        output(
            Command::new(env!("CARGO_BIN_EXE_backfill"))
                .args(&args)
                .current_dir(p.path(""))
                .env("BACKFILL_NOW", NOW),
        )
        .code(0);
    }
    let warehouse = rusqlite::Connection::open(shop.join("warehouse.db")).unwrap();
    let days: Vec<String> = warehouse
        .prepare("SELECT DISTINCT day FROM daily_orders ORDER BY day")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let week: Vec<String> = (1..=7).map(|d| format!("2026-09-{d:02}")).collect();
    assert_eq!(
        days, week,
        "the smoke backfill published the week, nothing else"
    );
}

const FLAKY: &str = r#"
schedule = "@daily"

[[tasks]]
id = "load"
command = "test {{ ds }} != 2026-01-02"
"#;

#[test]
fn the_notification_example_posts_to_the_chat_webhook() {
    let block = readme_block("# Notifications", "toml");
    let p = Project::new().dag("flaky", FLAKY);
    p.write("backfill.toml", &block);
    // A `curl` that records its arguments, one per line, instead of posting them.
    let fake = p.path("bin");
    p.write(
        "bin/curl",
        "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > curl.args\n",
    );
    std::fs::set_permissions(
        fake.join("curl"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = format!("{}:{}", fake.display(), std::env::var("PATH").unwrap());
    p.run_with(
        &[
            "create",
            "--dag",
            "flaky",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-03",
        ],
        &[
            ("PATH", &path),
            ("CHAT_WEBHOOK_URL", "https://chat.example.com/hooks/T0"),
        ],
    )
    .code(3);
    let args: Vec<String> = p.read("curl.args").lines().map(String::from).collect();
    let data = args.iter().position(|a| a == "--data").expect("--data");
    let body: serde_json::Value = serde_json::from_str(&args[data + 1]).unwrap();
    assert_eq!(
        body["text"],
        "backfill 1 of flaky: failed (exit 3); see backfill show 1"
    );
    assert_eq!(
        args.last().map(String::as_str),
        Some("https://chat.example.com/hooks/T0")
    );
    assert!(
        args.contains(&"-fsS".to_string()),
        "curl fails on an HTTP error"
    );
}

/// Runs one line of a README `sh` block as pasted in the repository's folder `root` (where
/// `examples/shop` is a copy of the shop): `cargo run --` and `backfill` through the binary,
/// `sqlite3 DB "SQL"` through rusqlite (the README lets any SQLite client do). Comments are
/// dropped; any other command fails the test.
fn paste(root: &Path, line: &str) -> Out {
    let words: Vec<String> = shlex::split(line)
        .unwrap_or_else(|| panic!("cannot split `{line}`"))
        .into_iter()
        .take_while(|w| !w.starts_with('#'))
        .collect();
    let args = match words.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["cargo", "run", "--", ..] => &words[3..],
        ["backfill", ..] => &words[1..],
        ["sqlite3", db, sql] => {
            let conn = rusqlite::Connection::open(root.join(db)).unwrap();
            let mut stmt = conn.prepare(sql).unwrap();
            let n = stmt.column_count();
            let mut rows = stmt.query([]).unwrap();
            let mut stdout = String::new();
            while let Some(r) = rows.next().unwrap() {
                let cells: Vec<String> = (0..n)
                    .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                    .collect();
                stdout.push_str(&cells.join("|"));
                stdout.push('\n');
            }
            return Out {
                code: 0,
                stdout,
                stderr: String::new(),
            };
        }
        _ => panic!("the README asks to paste `{line}`, which this test cannot run"),
    };
    output(
        Command::new(env!("CARGO_BIN_EXE_backfill"))
            .args(args)
            .current_dir(root)
            .env("BACKFILL_NOW", NOW),
    )
}

/// The exit code a pasted line is said to end with (`# exits 3`), else 0.
fn expected_code(line: &str) -> i32 {
    line.split("# exits ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The README's first command, run three times as its next paragraph says: as pasted, again
/// (everything skipped), and with `--reprocess-behavior completed`.
fn first_commands(root: &Path) {
    let first = crate::support::readme()
        .lines()
        .find(|l| l.starts_with("cargo run -- -C examples/shop create"))
        .expect("the first command")
        .to_string();
    paste(root, &first).code(0);
    paste(root, &first).code(0);
    paste(root, &format!("{first} --reprocess-behavior completed")).code(0);
}

/// The worked example of staging, review, promotion and rollback, run line by line as
/// pasted after the README's first commands made backfills 1 to 3: `backfill` lines through
/// the binary, `sqlite3` lines against the shop's warehouse. The published table changes only
/// where and when the example says.
#[test]
fn the_review_example_works_as_pasted_after_other_backfills() {
    let block = readme_block("# Review, promote, roll back", "sh");
    let p = Project::new();
    let root = p.path("");
    let shop = crate::gate::whole_shop(&p, "examples/shop");
    first_commands(&root);
    let day = |d: &str| -> Vec<String> {
        let conn = rusqlite::Connection::open(shop.join("warehouse.db")).unwrap();
        let mut stmt = conn
            .prepare("SELECT * FROM orders_fact WHERE order_day = ?1 ORDER BY order_id")
            .unwrap();
        stmt.query_map([d], |r| {
            Ok((0..5)
                .map(|i| format!("{:?}", r.get::<_, rusqlite::types::Value>(i).unwrap()))
                .collect::<Vec<_>>()
                .join("|"))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    };
    let mut first = None;
    for line in block.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let before = (day("2026-09-03"), day("2026-09-04"), day("2026-09-05"));
        let out = paste(&root, line);
        out.code(0);
        let after = (day("2026-09-03"), day("2026-09-04"), day("2026-09-05"));
        let words = shlex::split(line).unwrap();
        if words[0] == "sqlite3" {
            continue;
        }
        assert_eq!(&words[1..3], ["-C", "examples/shop"], "{line}");
        match words[3].as_str() {
            "create" if first.is_none() => first = Some(after.clone()),
            "create" => {
                assert_eq!(after, before, "{line} publishes nothing");
                assert_eq!(out.stdout, "5\n", "{line} prints the staged backfill's id");
            }
            "diff" | "discard" => assert_eq!(after, before, "{line} publishes nothing"),
            "promote" => {
                assert_ne!(after.0, before.0, "{line}: 09-03 promoted");
                assert_ne!(after.1, before.1, "{line}: 09-04 promoted");
                assert_eq!(after.2, before.2, "{line}: 09-05 untouched");
            }
            "rollback" => {
                let first = first.clone().unwrap();
                assert_eq!(after.1, first.1, "{line}: 09-04 is back as first published");
                assert_eq!(after.0, before.0, "{line}: 09-03 untouched");
            }
            other => panic!("unexpected command {other}"),
        }
        if words[3] == "diff" {
            // The output the README shows is the output this gives.
            let readme = crate::support::readme();
            for l in out.stdout.lines() {
                assert!(readme.contains(l), "the README shows `{l}`");
            }
            assert_eq!(out.stdout.lines().count(), 9, "{}", out.stdout);
        }
    }
}

/// Whether a line of a command block is one of the shop's, which
/// [`the_shop_sections_paste_in_order`] runs.
fn is_shop_line(line: &str) -> bool {
    let runs = ["cargo run -- ", "backfill ", "sqlite3 "]
        .iter()
        .any(|p| line.starts_with(p));
    runs && line.contains("examples/shop")
}

/// Every line of the README's `sh` blocks that works on `examples/shop`, in the README's
/// order, pasted in the repository's folder: the sections follow each other without a `cd`,
/// the review example finds its staged backfill after the first commands made others, and the
/// cascade computes September's month over the days the first command had published.
#[test]
fn the_shop_sections_paste_in_order() {
    let readme = crate::support::readme();
    let mut lines = Vec::new();
    for block in readme.split("```sh\n").skip(1) {
        let block = &block[..block.find("```").expect("a closed block")];
        for line in block.lines().map(str::trim) {
            assert!(
                !line.starts_with("cd "),
                "`{line}`: the README's commands run from the repository's folder"
            );
            if is_shop_line(line) {
                lines.push(line.to_string());
            }
        }
    }
    assert!(lines.len() >= 12, "{lines:#?}");
    let p = Project::new();
    let root = p.path("");
    let shop = crate::gate::whole_shop(&p, "examples/shop");
    for line in &lines {
        let out = paste(&root, line);
        out.code(expected_code(line));
        // The output a `text` block shows right after the line's block is this output.
        if line.contains("2026-11-10 --reprocess-behavior completed") {
            for shown in [
                "rejected   2026-11-10 (",
                "): task `aggregate` rejected: zero rows and an empty source; set allow_empty = true in [tasks.gate] to publish an empty partition",
                "succeeded  2026-11-09 (",
            ] {
                assert!(out.stderr.contains(shown), "{}", out.stderr);
                assert!(readme.contains(shown), "the README shows `{shown}`");
            }
        }
    }
    // The tour's rejected day kept its published rows.
    let day: i64 = rusqlite::Connection::open(shop.join("warehouse.db"))
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM daily_orders WHERE day = '2026-11-10'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(day, 5, "2026-11-10 keeps its five published rows");
    let warehouse = rusqlite::Connection::open(shop.join("warehouse.db")).unwrap();
    let months: Vec<String> = warehouse
        .prepare("SELECT DISTINCT month FROM monthly_revenue ORDER BY month")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(months, ["2026-09-01", "2026-10-01"]);
}

/// The README's lines that install the completions and the manual pages, run by `sh` as pasted
/// in `p`'s `home`, where `cargo install` put `backfill` into `~/.cargo/bin`; and the `PATH`
/// they ran with.
fn completion_and_manual_lines_pasted(p: &Project) -> String {
    let block = block_with("backfill completions bash");
    let home = p.path("home");
    let bin = home.join(".cargo/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_backfill"), bin.join("backfill")).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        output(
            Command::new("/bin/sh")
                .arg("-c")
                .arg(line)
                .current_dir(&home)
                .env_clear()
                .env("HOME", &home)
                .env("PATH", &path),
        )
        .code(0);
    }
    path
}

/// The completion lines of the README, pasted: bash completes `--dag` with the project's DAG
/// ids (found through `-C` or from the current folder).
#[test]
fn the_completion_lines_work_as_pasted() {
    let p = Project::new();
    completion_and_manual_lines_pasted(&p);
    let home = p.path("home");
    let script = home.join(".local/share/bash-completion/completions/backfill");
    assert!(
        script.is_file(),
        "the completion script is where bash-completion looks"
    );

    // The shop, and a folder inside it to complete from.
    let shop = crate::gate::whole_shop(&p, "examples/shop");
    std::fs::create_dir_all(shop.join("dags/sub")).unwrap();
    let complete = |cwd: &Path, words: &[&str]| -> Vec<String> {
        let out = output(
            Command::new("bash")
                .args(["--norc", "--noprofile", "-c"])
                .arg(
                    r#"source "$1"; shift
                    complete -p backfill >/dev/null || exit 9
                    COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))
                    _backfill backfill "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
                    printf '%s\n' "${COMPREPLY[@]}""#,
                )
                .arg("bash")
                .arg(&script)
                .args(words)
                .current_dir(cwd)
                .env("HOME", &home),
        );
        out.code(0);
        out.stdout
            .lines()
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    };
    let all = ["daily_orders", "monthly_revenue", "orders_fact"];
    assert_eq!(
        complete(&shop.join("dags/sub"), &["backfill", "create", "--dag", ""]),
        all
    );
    assert_eq!(
        complete(
            &p.path(""),
            &["backfill", "-C", "examples/shop", "runs", "--dag", "o"]
        ),
        ["orders_fact"]
    );
    assert_eq!(
        complete(
            &p.path(""),
            &[
                "backfill",
                "stale",
                "--project",
                "examples/shop",
                "--dag",
                "m"
            ]
        ),
        ["monthly_revenue"]
    );
    assert_eq!(
        complete(
            &p.path(""),
            &["backfill", "create", "--reprocess-behavior", "c"]
        ),
        ["completed", "changed"]
    );
    // Outside any project, nothing to offer.
    assert!(complete(&home, &["backfill", "verify", "--dag", ""]).is_empty());
}

/// The manual page's lines of the README, pasted: man-db's `man` finds the page without
/// `MANPATH`.
#[test]
#[cfg_attr(
    missing = "man",
    ignore = "no man on PATH: sudo apt-get install man-db"
)]
fn the_manual_lines_work_as_pasted() {
    let p = Project::new();
    let path = completion_and_manual_lines_pasted(&p);
    let home = p.path("home");
    let found = output(
        Command::new(crate::parts::Part::Man.require())
            .args(["-w", "backfill"])
            .env_clear()
            .env("HOME", &home)
            .env("PATH", &path),
    );
    found.code(0);
    assert_eq!(
        found.stdout.trim(),
        home.join(".cargo/share/man/man1/backfill.1")
            .display()
            .to_string()
    );
}

/// The cascade example on the shop: the command as the README writes it, then late orders and
/// a `changed` cascade that reruns October and not September.
#[test]
fn the_cascade_example_works_as_written() {
    let section = {
        let text = crate::support::readme();
        let start = text.find("\n# Cascades, pools and guard rails\n").unwrap();
        text[start..].to_string()
    };
    let block = readme_block("# Cascades, pools and guard rails", "sh");
    let line = block.lines().find(|l| l.starts_with("backfill ")).unwrap();
    let words = shlex::split(line).unwrap();
    assert_eq!(&words[1..3], ["-C", "examples/shop"]);
    let p = crate::gate::shop();
    let shop = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/shop");
    p.write(
        "dags/monthly_revenue.toml",
        &std::fs::read_to_string(shop.join("dags/monthly_revenue.toml")).unwrap(),
    );
    let args: Vec<&str> = words[3..].iter().map(String::as_str).collect();
    let out = p.run(&args);
    out.code(0);
    let quoted = "backfill N of monthly_revenue: 2 intervals, 2 to run, 0 skipped";
    assert!(section.contains(quoted));
    out.stderr_has(&quoted.replace('N', "2"));
    assert_eq!(
        crate::gate::wh_count(&p, "SELECT COUNT(*) FROM monthly_revenue"),
        10,
        "two months of five regions"
    );
    crate::gate::wh(&p)
        .execute_batch(
            "INSERT INTO raw_orders (order_ts, region, amount_cents) VALUES ('2026-10-05 10:00:00', 'eu', 500)",
        )
        .unwrap();
    let mut again = args.clone();
    again.extend(["--reprocess-behavior", "completed"]);
    let i = again.iter().position(|a| *a == "all").unwrap();
    again[i] = "changed";
    p.run(&again).code(0);
    assert_eq!(
        p.rows(&format!(
            "SELECT {}, action, COALESCE(reason, '') FROM plan WHERE backfill_id = 4 ORDER BY ord",
            p.day_of("interval_start")
        )),
        [
            ["2026-09-01", "skip", "upstream unchanged"],
            ["2026-10-01", "run", ""]
        ]
    );
    assert_eq!(
        crate::gate::wh_count(
            &p,
            "SELECT SUM(orders) FROM monthly_revenue WHERE month = '2026-10-01'"
        ),
        crate::gate::wh_count(
            &p,
            "SELECT COUNT(*) FROM raw_orders WHERE order_ts >= '2026-10-01' AND order_ts < '2026-11-01'"
        ),
        "October counts the late order"
    );
}

/// The sample recipe, as pasted after the README's first commands: the dry run picks five
/// intervals and says why, the staged sample publishes nothing, `diff` compares those five, and
/// `promote` publishes them.
#[test]
fn the_sample_recipe_works_as_pasted() {
    let block = readme_block("## Rehearse on a sample of the range", "sh");
    let p = Project::new();
    let root = p.path("");
    let shop = crate::gate::whole_shop(&p, "examples/shop");
    first_commands(&root);
    let published = || -> Vec<String> {
        let conn = rusqlite::Connection::open(shop.join("warehouse.db")).unwrap();
        let mut stmt = conn
            .prepare("SELECT order_day, COUNT(*) FROM orders_fact GROUP BY order_day ORDER BY 1")
            .unwrap();
        stmt.query_map([], |r| {
            Ok(format!(
                "{}|{}",
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    };
    let lines: Vec<&str> = block
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines.len(), 4, "{block}");

    let plan = paste(&root, &format!("{} --output json", lines[0]));
    plan.code(0);
    let picked: Vec<String> = plan.json()["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{} {} {}",
                &i["start"].as_str().unwrap()[..10],
                i["action"],
                i["reason"]
            )
        })
        .collect();
    assert_eq!(
        picked,
        [
            r#"2026-09-01 "run" "sample: first""#,
            r#"2026-09-16 "run" "sample: spread""#,
            r#"2026-10-01 "run" "sample: spread""#,
            r#"2026-10-16 "run" "sample: spread""#,
            // A Saturday and a month end: the sample needs no other for either.
            r#"2026-10-31 "run" "sample: last""#,
        ]
    );

    let before = published();
    let staged = paste(&root, lines[1]);
    staged.code(0);
    let id = staged.stdout.trim().to_string();
    assert!(
        id.parse::<i64>().is_ok(),
        "the staged id on stdout: {}",
        staged.stdout
    );
    assert_eq!(published(), before, "a staged sample publishes nothing");

    let diff = paste(&root, &format!("{} --output json", lines[2]));
    diff.code(0);
    let days: Vec<String> = diff
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["interval"]["start"].as_str().unwrap()[..10].to_string())
        .collect();
    assert_eq!(
        days,
        [
            "2026-09-01",
            "2026-09-16",
            "2026-10-01",
            "2026-10-16",
            "2026-10-31"
        ]
    );

    paste(&root, lines[3]).code(0);
    let list = paste(&root, "backfill -C examples/shop list --output json");
    let list = list.json();
    let sampled: Vec<&serde_json::Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["id"].as_i64() == id.parse::<i64>().ok())
        .map(|b| &b["sample"])
        .collect();
    assert_eq!(sampled, [&serde_json::json!(5)]);
    // October was never published before the sample: its three sampled days now are, and
    // only they.
    let after = published();
    let october: Vec<&str> = after
        .iter()
        .filter(|d| d.starts_with("2026-10-"))
        .map(|d| &d[..10])
        .collect();
    assert_eq!(october, ["2026-10-01", "2026-10-16", "2026-10-31"]);
}

/// The fenced blocks of the README's section under `heading` (to the next heading of its level
/// or above), as `(language, body)`.
fn section_blocks(heading: &str) -> Vec<(String, String)> {
    let text = crate::support::readme();
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("the README has no heading {heading:?}"));
    let level = heading.split(' ').next().unwrap();
    let rest = &text[start + heading.len() + 2..];
    let mut blocks = Vec::new();
    let mut lines = rest.lines();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```") {
            let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            blocks.push((lang.to_string(), body.join("\n") + "\n"));
        } else if line.starts_with('#')
            && line
                .split(' ')
                .next()
                .is_some_and(|h| h.len() <= level.len() && h.chars().all(|c| c == '#'))
        {
            break;
        }
    }
    blocks
}

/// Writes each `toml` block into the file its first line names (`# my-pipelines/...`) under
/// `root`, hands each `sql` block to `sql`, and runs each line of the `sh` blocks with the
/// binary in `root` (an `export` line is the caller's: `env` holds its variables).
fn follow(
    root: &Path,
    blocks: &[(String, String)],
    env: &[(&str, &str)],
    mut sql: impl FnMut(&str),
) {
    let mut ran = 0;
    for (lang, body) in blocks {
        match lang.as_str() {
            "toml" => {
                let first = body.lines().next().unwrap();
                let rel = first
                    .strip_prefix("# ")
                    .expect("a toml block names its file");
                let path = root.join(rel.split_whitespace().next().unwrap());
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, body).unwrap();
            }
            "sql" => sql(body),
            "sh" => {
                for line in body.lines().map(str::trim).filter(|l| !l.is_empty()) {
                    if line.starts_with("export ") {
                        continue;
                    }
                    let words = shlex::split(line).unwrap();
                    assert_eq!(words[0], "backfill", "{line}");
                    output(
                        Command::new(env!("CARGO_BIN_EXE_backfill"))
                            .args(&words[1..])
                            .current_dir(root)
                            .env("BACKFILL_NOW", NOW)
                            .env_remove("BACKFILL_MANIFEST")
                            .envs(env.iter().copied()),
                    )
                    .code(0);
                    ran += 1;
                }
            }
            other => panic!("a `{other}` block in the first project"),
        }
    }
    assert_eq!(ran, 4, "dags validate, the dry run, the run and the rerun");
}

/// The user's own orders: 3 a day and region for the first week of September 2026, as rows
/// `(id, 'YYYY-MM-DD HH:MM:SS', region, cents)`.
fn own_orders() -> Vec<(i64, String, &'static str, i64)> {
    let mut rows = Vec::new();
    for day in 1..=7 {
        for (r, region) in ["eu", "us", "apac", "latam", "mea"].iter().enumerate() {
            for k in 0..3 {
                let id = i64::from(day) * 100 + r as i64 * 10 + k;
                rows.push((
                    id,
                    format!("2026-09-{day:02} {:02}:15:00", 3 + k * 7),
                    *region,
                    100 + id,
                ));
            }
        }
    }
    rows
}

#[test]
fn the_first_project_on_sqlite_works_as_written() {
    let p = Project::new();
    let root = p.path("");
    std::fs::create_dir_all(root.join("my-pipelines")).unwrap();
    let wh = rusqlite::Connection::open(root.join("my-pipelines/warehouse.db")).unwrap();
    wh.execute_batch(
        "CREATE TABLE orders (order_id INTEGER PRIMARY KEY, order_ts TEXT NOT NULL, region TEXT NOT NULL, amount_cents INTEGER NOT NULL)",
    )
    .unwrap();
    for (id, ts, region, cents) in own_orders() {
        wh.execute(
            "INSERT INTO orders VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![id, ts, region, cents],
        )
        .unwrap();
    }
    follow(&root, &section_blocks("### On SQLite"), &[], |sql| {
        wh.execute_batch(sql).unwrap()
    });
    let (rows, orders, cents): (i64, i64, i64) = wh
        .query_row(
            "SELECT COUNT(*), SUM(orders), SUM(revenue_cents) FROM orders_daily",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    let want: i64 = own_orders().iter().map(|o| o.3).sum();
    assert_eq!(
        (rows, orders, cents),
        (35, 105, want),
        "7 days of 5 regions, every order once"
    );

    // What the section says next. The files draw no warning.
    let run = |args: &[&str]| {
        output(
            Command::new(env!("CARGO_BIN_EXE_backfill"))
                .arg("-C")
                .arg(root.join("my-pipelines"))
                .args(args)
                .env("BACKFILL_NOW", NOW)
                .env_remove("BACKFILL_MANIFEST"),
        )
    };
    let validate = run(&["dags", "validate"]);
    validate.code(0);
    assert!(!validate.stderr.contains("warning"), "{}", validate.stderr);
    // A late order in a new region: `changed` reruns its day only, whose row count moved from
    // the published one, so it is rejected as drift and keeps what is published; the rerun
    // command it prints has --allow-drift, which publishes it.
    wh.execute(
        "INSERT INTO orders VALUES (9999, '2026-09-03 12:00:00', 'antarctica', 500)",
        [],
    )
    .unwrap();
    let week = ["--from", "2026-09-01", "--to", "2026-09-07"];
    let day_rows = || -> i64 {
        wh.query_row(
            "SELECT COUNT(*) FROM orders_daily WHERE day = '2026-09-03'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    let mut args = vec!["create", "--dag", "orders_daily"];
    args.extend(week);
    args.extend(["--reprocess-behavior", "changed"]);
    let changed = run(&args);
    changed
        .code(3)
        .stderr_has("drift: row count 6 differs from the published 5")
        .stderr_has("--allow-drift");
    assert!(changed.stderr.contains("6 skipped"), "{}", changed.stderr);
    assert_eq!(day_rows(), 5, "the published day stays");
    args.push("--allow-drift");
    run(&args).code(0);
    assert_eq!(day_rows(), 6, "published with --allow-drift");
    // Without its target table, `dags validate` says to create it in the database.
    wh.execute_batch("DROP TABLE orders_daily").unwrap();
    run(&["dags", "validate"]).code(2).stderr_has(
        "target table `orders_daily` does not exist in warehouse `dw`; create it in the warehouse (CREATE TABLE",
    );
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn the_first_project_on_postgresql_works_as_written() {
    let pg = crate::pg::shared();
    let db = pg.create_db();
    // The user's database: its schemas, its own orders, and the role `etl` (once per cluster).
    let mut load = String::from(
        "DO $$ BEGIN CREATE ROLE etl LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         CREATE SCHEMA raw; CREATE SCHEMA analytics;
         CREATE TABLE raw.orders (order_id bigint PRIMARY KEY, order_ts timestamptz NOT NULL, region text NOT NULL, amount_cents integer NOT NULL);\n",
    );
    for (id, ts, region, cents) in own_orders() {
        load.push_str(&format!(
            "INSERT INTO raw.orders VALUES ({id}, '{ts}+00', '{region}', {cents});\n"
        ));
    }
    pg.psql(&db, &load);
    let root = Project::new().path("");
    let url = pg.url(&db).replace("postgres@", "etl@");
    follow(
        &root,
        &section_blocks("### On PostgreSQL"),
        &[("ANALYTICS_PG_URL", &url)],
        |sql| {
            // As the database's owner, in the test's database.
            pg.psql(
                &db,
                &sql.replace("DATABASE analytics", &format!("DATABASE {db}")),
            );
        },
    );
    let got = pg.psql(
        &db,
        "SELECT count(*) || ' ' || sum(orders) || ' ' || sum(revenue_cents) FROM analytics.orders_daily",
    );
    let want: i64 = own_orders().iter().map(|o| o.3).sum();
    assert_eq!(got.trim(), format!("35 105 {want}"));
}

/// Every link between the documentation's files (the README, the guide, BENCHMARKS.md and
/// CONTRIBUTING.md) names a file that exists and, after `#`, a heading of that file.
#[test]
fn every_link_between_the_documents_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = crate::support::documents();
    for extra in [
        "BENCHMARKS.md",
        "CONTRIBUTING.md",
        "docs/README.md",
        "docs/SUMMARY.md",
    ] {
        files.push(root.join(extra));
    }
    let anchors = |text: &str| -> Vec<String> {
        let mut fence = false;
        let mut out = Vec::new();
        for line in text.lines() {
            if line.starts_with("```") {
                fence = !fence;
            }
            if !fence && line.starts_with('#') {
                let title = line.trim_start_matches('#').trim().to_lowercase();
                let slug: String = title
                    .chars()
                    .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect();
                out.push(slug);
            }
        }
        out
    };
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let target = &rest[..rest.find(')').unwrap()];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            assert!(
                dest.exists(),
                "{}: a link to {target}, which does not exist",
                file.display()
            );
            if !anchor.is_empty() {
                let dest_text = std::fs::read_to_string(&dest).unwrap();
                assert!(
                    anchors(&dest_text).iter().any(|a| a == anchor),
                    "{}: a link to {target}, whose heading does not exist",
                    file.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "{checked} links");
}

/// The tests' `cargo`, for blocks pasted by [`pasted`]: `cargo run [--quiet] -- ARGS` runs the
/// binary under test (what `cargo run` does once it has built it), `cargo install --locked
/// --path .` copies it into `~/.cargo/bin`; any other cargo command fails.
const CARGO: &str = r#"#!/bin/sh
case "$1" in
run)
  shift
  while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
    case "$1" in
    --quiet | -q | --locked) shift ;;
    *) echo "the tests' cargo: cargo run $1 is not used by the documentation" >&2; exit 97 ;;
    esac
  done
  [ "${1:-}" = -- ] && shift
  exec "$BACKFILL_BIN" "$@" ;;
install)
  if [ "$*" != "install --locked --path ." ]; then
    echo "the tests' cargo: cargo $* is not the README's install line" >&2; exit 97
  fi
  mkdir -p "$HOME/.cargo/bin" && cp "$BACKFILL_BIN" "$HOME/.cargo/bin/backfill" ;;
*) echo "the tests' cargo: cargo $* is not run by the tests" >&2; exit 97 ;;
esac
"#;

/// Runs a documentation block in bash from `root`, as pasted into a terminal, stopping at the
/// first line that fails. HOME is `root/home`; `~/.cargo/bin` is on the PATH (as rustup puts
/// it) and `cargo` is [`CARGO`].
fn pasted(root: &Path, block: &str, env: &[(&str, &str)]) -> Out {
    use std::os::unix::fs::PermissionsExt;
    let shim = root.join("tests-cargo");
    std::fs::create_dir_all(&shim).unwrap();
    std::fs::write(shim.join("cargo"), CARGO).unwrap();
    std::fs::set_permissions(shim.join("cargo"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = root.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let path = format!(
        "{}:{}:{}",
        shim.display(),
        home.join(".cargo/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = output(
        Command::new("bash")
            .arg("-c")
            .arg(format!("set -eo pipefail\n{block}"))
            .current_dir(root)
            .env("HOME", &home)
            .env("PATH", path)
            .env("BACKFILL_BIN", env!("CARGO_BIN_EXE_backfill"))
            .env_remove("BACKFILL_MANIFEST")
            .env_remove("BACKFILL_NOW")
            .env_remove("COLUMNS")
            .envs(env.iter().copied()),
    );
    assert_eq!(
        out.code, 0,
        "the block\n{block}\nfailed:\n--- stdout\n{}\n--- stderr\n{}",
        out.stdout, out.stderr
    );
    out
}

/// The README's install block as pasted: `cargo install` puts `backfill` on the PATH, `init`
/// makes a project, and its example DAG backfills yesterday.
#[test]
fn the_install_lines_work_as_pasted() {
    let p = Project::new();
    let root = p.path("");
    let block = readme_block("## Install", "sh");
    assert!(
        block.starts_with("cargo install --locked --path ."),
        "{block}"
    );
    pasted(&root, &block, &[]);
    assert!(root.join("home/.cargo/bin/backfill").is_file());
    let project = root.join("my-pipelines");
    assert!(project.join("backfill.toml").is_file());
    assert!(project.join("dags/example.toml").is_file());
    let show = output(
        Command::new(env!("CARGO_BIN_EXE_backfill"))
            .arg("-C")
            .arg(&project)
            .args(["--output", "json", "show", "1"])
            .env_remove("BACKFILL_MANIFEST"),
    );
    let doc = show.code(0).json();
    assert_eq!(doc["dag_id"], "example", "{doc}");
    assert_eq!(doc["state"], "completed", "{doc}");
    assert_eq!(doc["intervals"]["succeeded"], 1, "{doc}");
}

/// The `join` chapter's two lines, as two hosts would run them: the owner holds eight days in
/// flight, the worker joins `latest`, and together they run each of the 181 days once, the
/// worker some of them (once it is live, the owner keeps to its half of the places).
#[test]
fn the_join_lines_work_as_pasted() {
    let block = readme_block("## `join ID`", "sh");
    let lines: Vec<Vec<String>> = block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            shlex::split(l)
                .unwrap()
                .into_iter()
                .take_while(|w| !w.starts_with('#'))
                .collect()
        })
        .collect();
    assert_eq!(lines.len(), 2, "{block}");
    let args = |i: usize| -> Vec<&str> {
        assert_eq!(lines[i][0], "backfill", "{block}");
        lines[i][1..].iter().map(String::as_str).collect()
    };
    let p = Project::new().dag(
        "events",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"while [ ! -f go ]; do sleep 0.05; done\"\n",
    );
    let owner = p.spawn("hosta", &args(0));
    wait_until(
        "the owner to run eight days",
        Duration::from_secs(30),
        || p.has_manifest() && p.count("SELECT COUNT(*) FROM runs WHERE state = 'running'") == 8,
    );
    let worker = p.spawn("hostb", &args(1));
    wait_until("the worker to join", Duration::from_secs(30), || {
        p.count("SELECT COUNT(*) FROM workers WHERE state = 'running'") == 1
    });
    std::fs::write(p.path("go"), "").unwrap();
    wait_within(&p, "hosta", owner, Duration::from_secs(120)).code(0);
    wait_within(&p, "hostb", worker, Duration::from_secs(120)).code(0);
    assert_eq!(
        p.rows(
            "SELECT COUNT(DISTINCT interval_start), COUNT(*) FROM runs
             WHERE backfill_id = 1 AND state = 'succeeded'"
        ),
        [["181", "181"]]
    );
    assert!(
        p.count("SELECT COUNT(*) FROM runs WHERE worker IS NOT NULL AND state = 'succeeded'") > 0,
        "the worker ran some days"
    );
}

/// Stops the PostgreSQL example's server in its folder when the test ends, however it ends.
struct ExampleServer(PathBuf);

impl Drop for ExampleServer {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/postgres/server.sh");
        let _ = Command::new(script)
            .arg("stop")
            .arg(&self.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The PostgreSQL example's blocks, pasted in the guide's order in a copy of the repository's
/// examples: `run.sh` starts the throwaway server and publishes January, a staging and its
/// diff, the server stopped and started again for a manifest in PostgreSQL, and the manifest in
/// the warehouse's own database, whose try's log says it published and recorded in one
/// transaction.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn the_postgresql_example_works_as_pasted() {
    use std::os::unix::fs::PermissionsExt;
    let p = Project::new();
    let root = p.path("");
    for example in ["postgres", "quickstart"] {
        copy_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples")
                .join(example),
            &root.join("examples").join(example),
        );
    }
    // The server's folder: one its user can reach (under root, `nobody`).
    let parent = tempfile::Builder::new()
        .prefix("backfill-example-pg")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = parent.path().join("pg");
    let _server = ExampleServer(dir.clone());
    let pg_bin = crate::pg::bin_dir().unwrap();
    let env = [
        ("BACKFILL_EXAMPLE_PG_DIR", dir.to_str().unwrap()),
        ("PG_BIN", pg_bin.to_str().unwrap()),
    ];

    let out = pasted(&root, &readme_block("## PostgreSQL warehouses", "sh"), &env);
    assert!(out.stderr.contains("31 succeeded"), "{}", out.stderr);
    let mut stdout = out.stdout.lines();
    assert_eq!(
        stdout.next(),
        Some("2"),
        "the staged backfill's id\n{}",
        out.stdout
    );
    let diff: Vec<&str> = stdout.filter(|l| l.contains("2026-01-0")).collect();
    assert_eq!(diff.len(), 2, "{}", out.stdout);
    assert!(
        diff.iter().all(|l| l.contains(" yes ")),
        "same fingerprints\n{}",
        out.stdout
    );

    let out = pasted(
        &root,
        &readme_block("## Several hosts, one manifest (PostgreSQL)", "sh"),
        &env,
    );
    assert!(out.stderr.contains("7 succeeded"), "{}", out.stderr);
    assert_eq!(
        out.stdout
            .lines()
            .filter(|l| l.contains("2026-09-0") && l.contains(" succeeded "))
            .count(),
        7,
        "show latest: the seven days\n{}",
        out.stdout
    );

    let block = block_with("recorded in the manifest in the same transaction");
    let said = block
        .lines()
        .find_map(|l| l.strip_prefix("# published "))
        .expect("the block shows the log's line");
    let out = pasted(&root, &block, &env);
    assert!(
        out.stdout.contains(&format!("published {said}")),
        "the log's last line\n{}",
        out.stdout
    );
}

/// What the documentation asks to run that no test runs, and why.
const NOT_RUN: &[(&str, &str)] = &[
    ("cargo test", "the test suite itself; `.ci/run` runs it"),
    (
        "examples/chaos/run.sh 300 20261130",
        "the chaos suite at length (20 minutes); `cargo test` runs the same tests with fewer iterations",
    ),
];

/// The string literals a test passes to `call`, in every test file.
fn literals_passed_to(sources: &str, call: &str) -> Vec<String> {
    sources
        .match_indices(&format!("{call}(\""))
        .map(|(at, m)| {
            let rest = &sources[at + m.len()..];
            rest[..rest.find('"').unwrap()].to_string()
        })
        .collect()
}

/// Every line of every command block of the README and the guide is run by a test: the shop's
/// lines by [`the_shop_sections_paste_in_order`], the other blocks by the tests that take them
/// by heading (`readme_block`, `section_blocks`) or by what they contain (`block_with`); what
/// is left out is in [`NOT_RUN`] with the reason. A new block fails this test until a test
/// runs it.
#[test]
fn every_command_block_of_the_documents_is_run_by_a_test() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut sources = String::new();
    for dir in [tests.clone(), tests.join("cli")] {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            if entry.path().extension().is_some_and(|e| e == "rs") {
                sources.push_str(&std::fs::read_to_string(entry.path()).unwrap());
            }
        }
    }
    let blocks = command_blocks();
    assert!(blocks.len() >= 15, "{blocks:#?}");
    let mut claimed = vec![false; blocks.len()];
    for heading in literals_passed_to(&sources, "readme_block") {
        // The first `sh` block under the heading (only `sh` blocks are listed here).
        if let Some(i) = blocks.iter().position(|b| b.headings.contains(&heading)) {
            claimed[i] = true;
        }
    }
    for heading in literals_passed_to(&sources, "section_blocks") {
        for (i, b) in blocks.iter().enumerate() {
            claimed[i] |= b.headings.contains(&heading);
        }
    }
    for needle in literals_passed_to(&sources, "block_with") {
        for (i, b) in blocks.iter().enumerate() {
            claimed[i] |= b.body.contains(&needle);
        }
    }
    let mut excluded = vec![false; NOT_RUN.len()];
    let mut not_run = Vec::new();
    for (b, claimed) in blocks.iter().zip(claimed) {
        if claimed {
            continue;
        }
        for line in b.body.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || is_shop_line(line) {
                continue;
            }
            let command = line.split(" #").next().unwrap().trim();
            match NOT_RUN.iter().position(|(l, _)| *l == command) {
                Some(k) => excluded[k] = true,
                None => not_run.push(format!("{}:{}: {line}", b.file, b.line)),
            }
        }
    }
    assert!(
        not_run.is_empty(),
        "lines no test runs (run them in a test, or say why not in NOT_RUN):\n{}",
        not_run.join("\n")
    );
    for ((line, _), found) in NOT_RUN.iter().zip(excluded) {
        assert!(found, "NOT_RUN names `{line}`, which no block has any more");
    }
}

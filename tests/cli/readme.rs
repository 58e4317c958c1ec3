//! The README's recipes, run as a user would paste them: the cron line with cron's environment,
//! every `backfill` step of the CI job, and the notification example.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::{NOW, Out, Project, copy_dir, readme_block};

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
    let block = readme_block("## Notifications", "toml");
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
    let block = readme_block("## Review, promote, roll back", "sh");
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
            let runs = ["cargo run -- ", "backfill ", "sqlite3 "]
                .iter()
                .any(|p| line.starts_with(p));
            if runs && line.contains("examples/shop") {
                lines.push(line.to_string());
            }
        }
    }
    assert!(lines.len() >= 12, "{lines:#?}");
    let p = Project::new();
    let root = p.path("");
    let shop = crate::gate::whole_shop(&p, "examples/shop");
    for line in &lines {
        paste(&root, line).code(0);
    }
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
/// in a home where `cargo install` put `backfill` into `~/.cargo/bin`: bash completes `--dag`
/// with the project's DAG ids (found through `-C` or from the current folder), and man-db's
/// `man` finds the page without `MANPATH`.
#[test]
fn the_completion_and_manual_lines_work_as_pasted() {
    let readme = crate::support::readme();
    let block = readme
        .split("```sh\n")
        .skip(1)
        .map(|b| &b[..b.find("```").unwrap()])
        .find(|b| b.contains("backfill completions bash"))
        .expect("the completions block");
    let p = Project::new();
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

    let Ok(man) = Command::new("man").arg("--version").output() else {
        eprintln!("SKIPPED: no `man` on this machine; the manual page's place is not checked");
        return;
    };
    assert!(man.status.success());
    let found = output(
        Command::new("man")
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
        let start = text.find("\n## Cascades, pools and guard rails\n").unwrap();
        text[start..].to_string()
    };
    let block = readme_block("## Cascades, pools and guard rails", "sh");
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
        p.rows("SELECT date(interval_start, 'unixepoch'), action, COALESCE(reason, '') FROM plan WHERE backfill_id = 4 ORDER BY ord"),
        [["2026-09-01", "skip", "upstream unchanged"], ["2026-10-01", "run", ""]]
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
    let block = readme_block("### Rehearse on a sample of the range", "sh");
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

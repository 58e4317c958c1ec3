//! A manifest the user may read but not write (an operator looking at the cron user's
//! manifest): every read command works, a write command says why it cannot and changes
//! nothing. And command lines that are not UTF-8 are usage errors, never a panic.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;

use crate::gate::shop;
use crate::parts::{AS_NOBODY, Part};
use crate::support::{Out, Project};

/// The user the read-only commands run as: `nobody` when the tests run as root (who may write
/// any file), else the current user, for whom the permissions below already hold.
fn as_reader(p: &Project, args: &[&str]) -> Out {
    let mut c = p.command(args);
    // The tests' own files are owned by whoever runs them.
    if std::fs::metadata(p.path("backfill.toml")).unwrap().uid() == 0 {
        c.uid(65534).gid(65534);
    }
    Out::of(&c.output().expect("run backfill"))
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every file of the manifest's folder with its bytes: equal snapshots mean nothing was
/// written, nor created beside it.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

/// The shop with three published days, its project readable by everyone and its manifest
/// folder and files read-only.
fn read_only_shop() -> Project {
    let p = shop().sqlite();
    p.create("daily_orders", "2026-09-01", "2026-09-03", &["-q"])
        .code(0);
    // And a staged day, for `diff`.
    p.create(
        "daily_orders",
        "2026-09-04",
        "2026-09-04",
        &["-q", "--stage"],
    )
    .code(0);
    // The project's temporary folder is private to its owner: open it to the reader.
    let mut dir = p.path("");
    loop {
        if dir.starts_with(std::env::temp_dir()) && dir != std::env::temp_dir() {
            chmod(&dir, 0o755);
        }
        if !dir.pop() {
            break;
        }
    }
    for entry in walk(&p.path("")) {
        let mode = if entry.is_dir() { 0o755 } else { 0o644 };
        chmod(&entry, mode);
    }
    chmod(&p.manifest_path(), 0o444);
    chmod(&p.path(".backfill"), 0o555);
    p
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().filter_map(Result::ok) {
        let path = e.path();
        if path.is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

#[test]
fn read_commands_work_on_a_manifest_this_user_cannot_write() {
    let p = read_only_shop();
    let before = snapshot(&p.path(".backfill"));

    let out = as_reader(&p, &["list", "--output", "json"]);
    out.code(0);
    let list = out.json();
    let states: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|b| format!("{} {}", b["id"], b["state"]))
        .collect();
    assert_eq!(states, ["1 \"completed\"", "2 \"staged\""]);

    as_reader(&p, &["show", "1"])
        .code(0)
        .stdout_has("2026-09-03");
    let runs = as_reader(&p, &["runs", "--dag", "daily_orders", "--output", "json"]);
    runs.code(0);
    assert_eq!(
        runs.json().as_array().map(Vec::len),
        Some(4),
        "{}",
        runs.stdout
    );

    let diff = as_reader(&p, &["diff", "2", "--output", "json"]);
    diff.code(0);
    assert_eq!(
        diff.json().as_array().map(Vec::len),
        Some(1),
        "{}",
        diff.stdout
    );
    let stale = as_reader(
        &p,
        &[
            "stale",
            "--dag",
            "daily_orders",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-03",
            "--output",
            "json",
        ],
    );
    stale.code(0);
    assert_eq!(stale.json(), serde_json::json!([]), "{}", stale.stderr);

    // The dry run reads the manifest and prepares the SQL tasks against the warehouse, which
    // this user may not write either.
    let plan = as_reader(
        &p,
        &[
            "create",
            "--dag",
            "daily_orders",
            "--from",
            "2026-09-01",
            "--to",
            "2026-09-04",
            "--dry-run",
            "--output",
            "json",
        ],
    );
    plan.code(0);
    let actions: Vec<String> = plan.json()["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| format!("{} {}", i["action"], i["reason"]))
        .collect();
    assert_eq!(
        actions,
        [
            r#""skip" "already exists""#,
            r#""skip" "already exists""#,
            r#""skip" "already exists""#,
            r#""run" null"#
        ],
        "a staged day does not count as a run"
    );

    // A command that writes says why it cannot, exit 2, and writes nothing.
    for args in [
        &[
            "create",
            "--dag",
            "daily_orders",
            "--from",
            "2026-09-04",
            "--to",
            "2026-09-04",
        ][..],
        &["resume", "1"],
    ] {
        as_reader(&p, args)
            .code(2)
            .stderr_has("this user cannot write it")
            .stderr_has("must run as a user who may write the file and its folder");
    }
    assert_eq!(snapshot(&p.path(".backfill")), before, "nothing written");
}

#[test]
fn read_commands_work_while_the_owner_writes_a_wal_manifest() {
    let p = read_only_shop();
    // The owner's open connection keeps the `-wal` and `-shm` files, with a commit the main
    // file does not hold yet.
    chmod(&p.path(".backfill"), 0o755);
    chmod(&p.manifest_path(), 0o644);
    let owner = p.db();
    owner
        .execute_batch("PRAGMA wal_autocheckpoint = 0; UPDATE backfills SET max_active_runs = 7")
        .unwrap();
    for f in ["manifest.db", "manifest.db-wal", "manifest.db-shm"] {
        chmod(&p.path(&format!(".backfill/{f}")), 0o644);
    }
    chmod(&p.path(".backfill"), 0o555);
    let out = as_reader(&p, &["list", "--output", "json"]);
    out.code(0);
    assert_eq!(
        out.json()[0]["max_active_runs"],
        7,
        "the commit in the WAL is seen"
    );
    drop(owner);
}

/// `backfill ARGS` on project `p`, run as the user `nobody` through `setpriv` (the tests run as
/// root, who may write any file).
fn as_nobody(p: &Project, args: &[&str]) -> Out {
    let setpriv = Part::Nobody.require();
    let as_root = p.command(args);
    let mut c = std::process::Command::new(setpriv);
    c.args(AS_NOBODY)
        .arg(as_root.get_program())
        .args(as_root.get_args())
        .stdin(std::process::Stdio::null());
    for (name, value) in as_root.get_envs() {
        match value {
            Some(v) => c.env(name, v),
            None => c.env_remove(name),
        };
    }
    Out::of(&c.output().expect("run backfill through setpriv"))
}

#[test]
#[cfg_attr(
    missing = "nobody",
    ignore = "no second user: `setpriv` must run programs as nobody (root, and util-linux's setpriv: sudo apt-get install util-linux)"
)]
fn a_reader_is_told_what_to_do_when_the_wal_and_shm_files_are_left() {
    let p = shop().sqlite();
    p.create("daily_orders", "2026-09-01", "2026-09-02", &["-q"])
        .code(0);
    // Every run leaves them: a reader of this manifest reads through them.
    let dir = p.path(".backfill");
    for f in ["manifest.db-wal", "manifest.db-shm"] {
        assert!(dir.join(f).exists(), "{f} is left by the run");
    }
    // The project is root's, readable by everyone: files 0644, folders 0755.
    let mut up = p.path("");
    while up.starts_with(std::env::temp_dir()) && up != std::env::temp_dir() {
        chmod(&up, 0o755);
        up.pop();
    }
    for entry in walk(&p.path("")) {
        chmod(&entry, if entry.is_dir() { 0o755 } else { 0o644 });
    }
    let before = snapshot(&dir);

    let list = as_nobody(&p, &["list", "--output", "json"]);
    list.code(0);
    assert_eq!(list.json()[0]["state"], "completed", "{}", list.stdout);
    as_nobody(&p, &["show", "1"])
        .code(0)
        .stdout_has("2026-09-02");
    for args in [
        &[
            "create",
            "--dag",
            "daily_orders",
            "--from",
            "2026-09-03",
            "--to",
            "2026-09-03",
        ][..],
        &["resume", "1"],
    ] {
        as_nobody(&p, args)
            .code(2)
            .stderr_has(&format!(
                "error: manifest {}: this user cannot write it (Permission denied (os error 13)); commands that only read it (list, show, runs, diff, create --dry-run) work, the others must run as a user who may write the file and its folder",
                p.manifest_path().display()
            ));
    }
    assert_eq!(snapshot(&dir), before, "nothing written");
}

fn raw(args: &[&[u8]]) -> Out {
    let p = Project::new();
    let mut c = p.command(&[]);
    c.args(args.iter().map(|a| OsStr::from_bytes(a)));
    Out::of(&c.output().expect("run backfill"))
}

#[test]
fn a_command_line_that_is_not_utf8_is_a_usage_error() {
    let out = raw(&[
        b"create", b"--dag", b"\xff", b"--from", b"today", b"--to", b"today",
    ]);
    out.code(2).stderr_has("invalid UTF-8");
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    raw(&[b"list", b"--output", b"\xff"]).code(2);
    // With JSON asked for, the error is also a document on stdout.
    let out = raw(&[b"--output", b"json", b"create", b"--dag", b"\xfe\xff"]);
    out.code(2);
    assert_eq!(out.json()["error"]["kind"], "usage");
    assert_eq!(out.json()["exit_code"], 2);
}

//! A tiny builder for end-to-end tests: a project in a temporary folder, the real binary, and
//! direct reads of the manifest.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rusqlite::Connection;

/// The instant the binary believes it is (`BACKFILL_NOW`).
pub const NOW: &str = "2026-11-29T12:00:00Z";

/// `create` of DAG `c` over the first three days of 2026.
pub const THREE_DAYS: &[&str] = &[
    "create",
    "--dag",
    "c",
    "--from",
    "2026-01-01",
    "--to",
    "2026-01-03",
];

pub struct Project {
    dir: tempfile::TempDir,
    /// With `BACKFILL_TEST_MANIFEST=postgres`: the manifest's database (on the shared test
    /// cluster), given to every command as `BACKFILL_MANIFEST`.
    manifest_db: Option<String>,
    /// The database this project created for its manifest, dropped with the project.
    own_db: Option<String>,
}

/// Whether this run puts every project's manifest in PostgreSQL (`BACKFILL_TEST_MANIFEST=postgres`):
/// the same tests, against the other engine.
pub fn pg_manifest() -> bool {
    std::env::var("BACKFILL_TEST_MANIFEST").is_ok_and(|v| v == "postgres")
}

/// What a finished command printed and returned.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// What a finished process returned.
    pub fn of(out: &std::process::Output) -> Self {
        Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\n{}",
                self.stdout, self.stderr
            )
        })
    }

    #[track_caller]
    pub fn code(&self, expected: i32) -> &Self {
        assert_eq!(
            self.code, expected,
            "exit code\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        self
    }

    #[track_caller]
    pub fn stdout_has(&self, needle: &str) -> &Self {
        assert!(
            self.stdout.contains(needle),
            "stdout lacks {needle:?}:\n{}\n--- stderr\n{}",
            self.stdout,
            self.stderr
        );
        self
    }

    #[track_caller]
    pub fn stderr_has(&self, needle: &str) -> &Self {
        assert!(
            self.stderr.contains(needle),
            "stderr lacks {needle:?}:\n{}",
            self.stderr
        );
        self
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        if let Some(db) = self.own_db.take() {
            crate::pg::Cluster::drop_shared_db(db);
        }
    }
}

impl Project {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(
            dir.path().join("backfill.toml"),
            "lease_timeout = \"30s\"\n",
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("dags")).unwrap();
        let manifest_db = pg_manifest().then(|| crate::pg::shared().create_db());
        Self {
            dir,
            own_db: manifest_db.clone(),
            manifest_db,
        }
    }

    /// The manifest stays a SQLite file whatever `BACKFILL_TEST_MANIFEST` says: for the tests of
    /// the file itself (permissions, WAL, an old schema's upgrade).
    pub fn sqlite(mut self) -> Self {
        self.manifest_db = None;
        self
    }

    /// The manifest is in database `db` of the shared test cluster, whatever
    /// `BACKFILL_TEST_MANIFEST` says: for a manifest in a warehouse's own database.
    pub fn manifest_in(mut self, db: &str) -> Self {
        self.manifest_db = Some(db.to_string());
        self
    }

    /// Adds `dags/{id}.toml`.
    pub fn dag(self, id: &str, toml: &str) -> Self {
        self.write(&format!("dags/{id}.toml"), toml);
        self
    }

    pub fn write(&self, rel: &str, content: &str) {
        let path = self.path(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, content).unwrap();
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_default()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The complete command a hint of this project tells the user to run.
    pub fn hint(&self, rest: &str) -> String {
        format!("backfill -C {} {rest}", self.dir.path().display())
    }

    pub fn manifest_path(&self) -> PathBuf {
        self.path(".backfill/manifest.db")
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_backfill"));
        c.arg("-C")
            .arg(self.dir.path())
            .args(args)
            .env("BACKFILL_NOW", NOW)
            .env_remove("BACKFILL_MANIFEST")
            // Tables fit COLUMNS when it is set: the tests compare them whole.
            .env_remove("COLUMNS")
            .stdin(Stdio::null());
        if let Some(db) = &self.manifest_db {
            c.env("BACKFILL_MANIFEST", crate::pg::shared().url(db));
        }
        c
    }

    /// What a command run outside [`Project::command`] needs in its environment to find this
    /// project's manifest (the user's shell would hold it).
    pub fn manifest_env(&self) -> Vec<(&'static str, String)> {
        self.manifest_db
            .iter()
            .map(|db| ("BACKFILL_MANIFEST", crate::pg::shared().url(db)))
            .collect()
    }

    /// The manifest's database, when this run keeps manifests in PostgreSQL.
    pub fn manifest_db(&self) -> Option<&str> {
        self.manifest_db.as_deref()
    }

    /// Rows of `sql` in the PostgreSQL manifest, each as strings (`NULL` for null).
    fn pg_rows(&self, db: &str, sql: &str) -> Vec<Vec<String>> {
        let out = crate::pg::shared().psql(
            db,
            &format!(
                "\\pset null NULL\n\\pset fieldsep '\\037'\n\\pset recordsep_zero\nSET search_path = backfill_manifest, public;\nSET TimeZone = 'UTC';\n{sql}"
            ),
        );
        out.split('\0')
            .map(|r| r.trim_end_matches('\n'))
            .filter(|r| !r.is_empty())
            // psql prints booleans as t and f; SQLite's are 1 and 0.
            .map(|r| {
                r.split('\u{1f}')
                    .map(|v| match v {
                        "t" => "1".to_string(),
                        "f" => "0".to_string(),
                        v => v.to_string(),
                    })
                    .collect()
            })
            .collect()
    }

    pub fn run(&self, args: &[&str]) -> Out {
        let out = self.command(args).output().expect("run backfill");
        Out::of(&out)
    }

    /// `backfill create --dag DAG --from FROM --to TO EXTRA...`.
    pub fn create(&self, dag: &str, from: &str, to: &str, extra: &[&str]) -> Out {
        let mut args = vec!["create", "--dag", dag, "--from", from, "--to", to];
        args.extend_from_slice(extra);
        self.run(&args)
    }

    /// Starts the binary in the background; its output goes to `{name}.out` and `{name}.err`.
    pub fn spawn(&self, name: &str, args: &[&str]) -> Child {
        self.spawn_with(name, args, &[])
    }

    /// Like [`Project::spawn`], with extra environment variables (`BACKFILL_FAULT`).
    pub fn spawn_with(&self, name: &str, args: &[&str], env: &[(&str, &str)]) -> Child {
        let stdout = std::fs::File::create(self.path(&format!("{name}.out"))).unwrap();
        let stderr = std::fs::File::create(self.path(&format!("{name}.err"))).unwrap();
        self.command(args)
            .envs(env.iter().copied())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("spawn backfill")
    }

    /// Runs the binary to its end with extra environment variables.
    pub fn run_with(&self, args: &[&str], env: &[(&str, &str)]) -> Out {
        let out = self
            .command(args)
            .envs(env.iter().copied())
            .output()
            .expect("run backfill");
        Out::of(&out)
    }

    /// Waits for a background run and returns its exit code and output.
    pub fn wait(&self, name: &str, mut child: Child) -> Out {
        let status = child.wait().unwrap();
        Out {
            code: status.code().unwrap_or(-1),
            stdout: self.read(&format!("{name}.out")),
            stderr: self.read(&format!("{name}.err")),
        }
    }

    /// Whether the manifest exists and its schema is in place (for waiting on a background run).
    pub fn has_manifest(&self) -> bool {
        if let Some(db) = &self.manifest_db {
            return !self
                .pg_rows(
                    db,
                    "SELECT 1 FROM pg_tables WHERE schemaname = 'backfill_manifest' AND tablename = 'schema_version'",
                )
                .is_empty();
        }
        self.manifest_path().exists()
            && self
                .db()
                .pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))
                .is_ok_and(|v| v > 0)
    }

    pub fn db(&self) -> Connection {
        assert!(
            self.manifest_db.is_none(),
            "this test reads the manifest's SQLite file"
        );
        let c = Connection::open(self.manifest_path()).expect("open manifest");
        c.busy_timeout(Duration::from_secs(10)).unwrap();
        c
    }

    /// One string per row of every manifest table: equal dumps mean an unchanged manifest.
    pub fn dump(&self) -> String {
        if let Some(db) = &self.manifest_db {
            if !self.has_manifest() {
                return "no manifest".into();
            }
            let mut out = String::new();
            for (table, order) in [
                ("backfills", "id"),
                ("plan", "backfill_id, ord"),
                ("runs", "id"),
                ("task_tries", "id"),
                ("leases", "dag_id, interval_start"),
            ] {
                // A live backfill's heartbeat is not something the command under test wrote.
                let columns = self.pg_rows(
                    db,
                    &format!(
                        "SELECT string_agg(CASE WHEN column_name = 'heartbeat_at' THEN '''-''' ELSE quote_ident(column_name) END, ', ' ORDER BY ordinal_position)
                         FROM information_schema.columns
                         WHERE table_schema = 'backfill_manifest' AND table_name = '{table}'"
                    ),
                )[0][0]
                    .clone();
                for r in self.pg_rows(
                    db,
                    &format!("SELECT {columns} FROM {table} ORDER BY {order}"),
                ) {
                    out.push_str(&format!("{table}: {}\n", r.join(" | ")));
                }
            }
            return out
                .lines()
                .map(|l| l.to_string())
                .collect::<Vec<_>>()
                .join("\n");
        }
        if !self.manifest_path().exists() {
            return "no manifest".into();
        }
        let db = self.db();
        let mut out = String::new();
        for table in ["backfills", "plan", "runs", "task_tries", "leases"] {
            let mut stmt = db.prepare(&format!("SELECT * FROM {table}")).unwrap();
            let n = stmt.column_count();
            // A live backfill of another process beats every 250 ms: its heartbeat is not
            // something the command under test wrote.
            let beat = stmt.column_index("heartbeat_at").ok();
            let mut rows = stmt.query([]).unwrap();
            while let Some(r) = rows.next().unwrap() {
                let cells: Vec<String> = (0..n)
                    .map(|i| {
                        if Some(i) == beat {
                            "-".to_string()
                        } else {
                            format!("{:?}", r.get_ref(i).unwrap())
                        }
                    })
                    .collect();
                out.push_str(&format!("{table}: {}\n", cells.join(" | ")));
            }
        }
        out
    }

    /// Runs statements on the manifest (either engine): SQL both take.
    pub fn exec(&self, sql: &str) {
        match &self.manifest_db {
            Some(db) => {
                crate::pg::shared().psql(
                    db,
                    &format!("SET search_path = backfill_manifest, public;\n{sql}"),
                );
            }
            None => self
                .db()
                .execute_batch(sql)
                .expect("run SQL on the manifest"),
        }
    }

    /// Rows of a query, each as strings.
    pub fn rows(&self, sql: &str) -> Vec<Vec<String>> {
        if let Some(db) = &self.manifest_db {
            return self.pg_rows(db, sql);
        }
        let db = self.db();
        let mut stmt = db.prepare(sql).unwrap();
        let n = stmt.column_count();
        let mut rows = stmt.query([]).unwrap();
        let mut out = Vec::new();
        while let Some(r) = rows.next().unwrap() {
            out.push(
                (0..n)
                    .map(|i| match r.get_ref(i).unwrap() {
                        rusqlite::types::ValueRef::Null => "NULL".to_string(),
                        rusqlite::types::ValueRef::Integer(v) => v.to_string(),
                        rusqlite::types::ValueRef::Real(v) => v.to_string(),
                        rusqlite::types::ValueRef::Text(t) => {
                            String::from_utf8_lossy(t).into_owned()
                        }
                        rusqlite::types::ValueRef::Blob(_) => "<blob>".to_string(),
                    })
                    .collect(),
            );
        }
        out
    }

    /// SQL for the UTC day (`2026-09-01`) of `instant`, an expression in unix seconds, in the
    /// manifest's engine.
    pub fn day_of(&self, instant: &str) -> String {
        match self.manifest_db {
            Some(_) => format!("to_char(to_timestamp({instant}) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"),
            None => format!("date({instant}, 'unixepoch')"),
        }
    }

    /// SQL for the part of the text `column` before its first `sep`, all of it without one, in
    /// the manifest's engine.
    pub fn before(&self, column: &str, sep: char) -> String {
        match self.manifest_db {
            Some(_) => format!("split_part({column}, '{sep}', 1)"),
            None => format!(
                "CASE WHEN instr({column}, '{sep}') > 0 THEN substr({column}, 1, instr({column}, '{sep}') - 1) ELSE {column} END"
            ),
        }
    }

    pub fn count(&self, sql: &str) -> i64 {
        if self.manifest_db.is_some() {
            let rows = self.rows(sql);
            return rows
                .first()
                .and_then(|r| r.first())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{sql} gave no number: {rows:?}"));
        }
        self.db().query_row(sql, [], |r| r.get(0)).unwrap()
    }
}

/// Polls `condition` every 20 ms; panics with `what` after `timeout`.
#[track_caller]
pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Like [`wait_until`], for a condition that a background run must bring about: fails at once,
/// with the run's exit code and stderr, if the run ends first, and shows its stderr and what
/// `seen` says of the state on timeout.
#[track_caller]
pub fn wait_while_running(
    p: &Project,
    name: &str,
    child: &mut Child,
    what: &str,
    timeout: Duration,
    seen: &dyn Fn() -> String,
    mut condition: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "backfill ended ({status}) before {what}\n--- stderr\n{}",
                p.read(&format!("{name}.err"))
            );
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n--- stderr\n{}\n--- seen\n{}",
            p.read(&format!("{name}.err")),
            seen()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// This machine's wall clock, in unix milliseconds (as heartbeats are written).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Waits until the owner's heartbeat is older than `ms` (it is frozen).
pub fn wait_stale(p: &Project, backfill: i64, ms: i64) {
    wait_until(
        "the owner's lease to go stale",
        Duration::from_secs(20),
        || {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            let beat = p.count(&format!(
                "SELECT heartbeat_at FROM backfills WHERE id = {backfill}"
            ));
            now - beat > ms
        },
    );
}

/// Whether a process exists (and is not a zombie).
pub fn alive(pid: i32) -> bool {
    if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err() {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next())
                != Some("Z")
        })
        .unwrap_or(false)
}

/// Whether a process is stopped (SIGSTOP), as `/proc` says.
pub fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next())
                == Some("T")
        })
        .unwrap_or(false)
}

pub fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

/// `2026-01-0N` as the RFC 3339 start of that UTC day.
pub fn day(d: u32) -> String {
    format!("2026-01-{d:02}T00:00:00Z")
}

/// Unix seconds of the start of `2026-01-dd` UTC.
pub fn day_unix(d: u32) -> i64 {
    chrono::DateTime::parse_from_rfc3339(&day(d))
        .unwrap()
        .timestamp()
}

/// Copies an example project, leaving out what running it creates (manifest, output, warehouse).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == ".backfill"
            || name == "out"
            || name.to_string_lossy().starts_with("warehouse.db")
        {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The documentation's files in reading order: `README.md`, then the guide's chapters in the
/// order of `docs/SUMMARY.md`.
pub fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let summary = std::fs::read_to_string(root.join("docs/SUMMARY.md")).unwrap();
    let mut files = vec![root.join("README.md")];
    for line in summary.lines().filter(|l| l.starts_with("- [")) {
        let target = &line[line.find("](").unwrap() + 2..line.rfind(')').unwrap()];
        files.push(root.join("docs").join(target));
    }
    files
}

/// The documentation as one text: the README, then the guide's chapters in order.
pub fn readme() -> String {
    documents()
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display())))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first fenced block of language `lang` after the heading `heading` of the
/// documentation (the README or a chapter of the guide).
pub fn readme_block(heading: &str, lang: &str) -> String {
    let text = format!("\n{}", readme());
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("the documentation has no heading {heading:?}"));
    let rest = &text[start..];
    let open = format!("```{lang}\n");
    let body = &rest[rest.find(&open).expect("a fenced block") + open.len()..];
    body[..body.find("```").expect("a closed block")].to_string()
}

/// The one command block (`sh`) of the documentation that contains `needle`.
pub fn block_with(needle: &str) -> String {
    let found: Vec<String> = command_blocks()
        .into_iter()
        .map(|b| b.body)
        .filter(|b| b.contains(needle))
        .collect();
    assert_eq!(found.len(), 1, "command blocks with {needle:?}: {found:#?}");
    found.into_iter().next().unwrap()
}

/// A fenced block of the documentation that a reader runs (`sh`).
#[derive(Debug)]
pub struct DocBlock {
    /// `README.md`, `docs/gate.md`...
    pub file: String,
    /// The line of its opening fence.
    pub line: usize,
    /// The headings it is under, outermost first.
    pub headings: Vec<String>,
    /// Its lines, without the fences and their indentation.
    pub body: String,
}

/// Every command block of the documentation, in reading order. A fence may be indented (a
/// block inside a list item); its lines lose that indentation.
pub fn command_blocks() -> Vec<DocBlock> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut blocks = Vec::new();
    for path in documents() {
        let text = std::fs::read_to_string(&path).unwrap();
        let file = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let mut headings: Vec<String> = Vec::new();
        let mut open: Option<(usize, String, usize, Vec<String>)> = None;
        for (i, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            let indent = line.len() - trimmed.len();
            if let Some(lang) = trimmed.strip_prefix("```") {
                match open.take() {
                    None => open = Some((i + 1, lang.to_string(), indent, Vec::new())),
                    Some((at, lang, _, body)) => {
                        if lang == "sh" {
                            blocks.push(DocBlock {
                                file: file.clone(),
                                line: at,
                                headings: headings.clone(),
                                body: body.join("\n") + "\n",
                            });
                        }
                    }
                }
                continue;
            }
            match &mut open {
                Some((_, _, indent, body)) => {
                    body.push(line.get(*indent..).unwrap_or("").to_string())
                }
                None if line.starts_with('#') => {
                    let level = line.chars().take_while(|c| *c == '#').count();
                    let outer = |h: &String| h.chars().take_while(|c| *c == '#').count() < level;
                    while headings.last().is_some_and(|h| !outer(h)) {
                        headings.pop();
                    }
                    headings.push(line.to_string());
                }
                None => {}
            }
        }
        assert!(open.is_none(), "{file}: a block is not closed");
    }
    blocks
}

/// Waits for a background run like [`Project::wait`], but kills it and fails the test when it
/// has not ended after `limit`: a hang detector, never a measure of speed.
#[track_caller]
pub fn wait_within(p: &Project, name: &str, mut child: Child, limit: Duration) -> Out {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "backfill still running after {limit:?}\n--- stderr\n{}",
                p.read(&format!("{name}.err"))
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    p.wait(name, child)
}

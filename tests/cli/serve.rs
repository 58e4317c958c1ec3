//! `backfill serve`: the real binary serving a real manifest over HTTP, read by a raw HTTP/1.1
//! client, by `promtool` for `/metrics`, and by a real browser (headless Chromium through
//! chromedriver's WebDriver) that clicks a cell. And `show --grid` in the terminal.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::parts::Part;
use crate::support::{Project, wait_until};

/// A DAG of one command task whose gate compares the rows with `source-DAY`: day 2 is rejected
/// (10 rows against 20), day 3 fails (its source count is not a number, but markup).
const DAG: &str = r#"
description = "Exports <script>alert('dag')</script> & more"
schedule = "@daily"
[[tasks]]
id = "export"
command = '''printf '{"rows": 10}' > "$BACKFILL_RESULT"'''
[tasks.gate]
source_count = "cat source-{{ ds }}"
tolerance = 0.0
"#;

/// A project whose backfill 1 published day 1, rejected day 2 and failed day 3.
fn finished() -> Project {
    let p = Project::new().dag("exports", DAG);
    p.write("source-2026-01-01", "10\n");
    p.write("source-2026-01-02", "20\n");
    p.write("source-2026-01-03", "<script>alert(1)</script>\n");
    p.create(
        "exports",
        "2026-01-01",
        "2026-01-03",
        &["--max-active-runs", "1"],
    )
    .code(3);
    p
}

/// A running `backfill serve`, stopped (SIGTERM) when dropped.
pub(crate) struct Server {
    child: Option<Child>,
    addr: String,
}

impl Server {
    pub(crate) fn start(p: &Project, name: &str, extra: &[&str]) -> Self {
        let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let child = p.spawn(name, &args);
        Self::listening(p, name, child)
    }

    /// Like [`Server::start`], with extra environment variables and, when given, a limit on
    /// the files it may open (soft and hard, as `prlimit --nofile=N` sets them).
    fn start_with(
        p: &Project,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
        open_files: Option<u64>,
    ) -> Self {
        use std::os::unix::process::CommandExt;
        let mut c = p.command(args);
        c.envs(env.iter().copied())
            .stdout(std::fs::File::create(p.path(&format!("{name}.out"))).unwrap())
            .stderr(std::fs::File::create(p.path(&format!("{name}.err"))).unwrap());
        if let Some(n) = open_files {
            // SAFETY: setrlimit is async-signal-safe, and nothing else runs between fork and
            // exec.
            unsafe {
                c.pre_exec(move || {
                    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, n, n)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let child = c.spawn().expect("spawn backfill serve");
        Self::listening(p, name, child)
    }

    /// The server `child` started as `name`, once it says where it listens.
    fn listening(p: &Project, name: &str, child: Child) -> Self {
        let err = format!("{name}.err");
        let mut addr = String::new();
        wait_until("the server to listen", Duration::from_secs(20), || {
            let text = p.read(&err);
            if let Some(at) = text.find("at http://") {
                let rest = &text[at + "at http://".len()..];
                addr = rest.split('/').next().unwrap_or_default().to_string();
                return true;
            }
            false
        });
        Self {
            child: Some(child),
            addr,
        }
    }

    pub(crate) fn get(&self, path: &str) -> Answer {
        http(&self.addr, "GET", path, &[], None)
    }

    fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        http(&self.addr, "GET", path, headers, None)
    }

    /// Stops the server as Ctrl-C does; its exit code.
    fn stop(mut self) -> i32 {
        let mut child = self.child.take().unwrap();
        crate::support::signal(&child, nix::sys::signal::Signal::SIGINT);
        child.wait().unwrap().code().unwrap_or(-1)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An HTTP answer.
pub(crate) struct Answer {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
    pub(crate) body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One HTTP/1.1 request on its own connection.
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Answer {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    if let Some(b) = body {
        req.push_str(b);
    }
    s.write_all(req.as_bytes()).unwrap();
    // Read to the end of the answer, which a server may send without closing (chromedriver
    // keeps its connections open): to Content-Length, to the last chunk, or to the close.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    let complete = |raw: &[u8]| -> bool {
        let text = String::from_utf8_lossy(raw);
        let Some((head, rest)) = text.split_once("\r\n\r\n") else {
            return false;
        };
        let head = head.to_ascii_lowercase();
        if let Some(n) = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|n| n.trim().parse::<usize>().ok())
        {
            return rest.len() >= n;
        }
        head.contains("transfer-encoding: chunked") && rest.ends_with("0\r\n\r\n")
    };
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if complete(&raw) {
            break;
        }
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Answer {
        status,
        headers,
        body,
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    out
}

/// How many times `needle` occurs.
fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

#[test]
fn pages_json_and_metrics_of_a_finished_backfill_and_the_manifest_is_untouched() {
    let p = finished();
    let manifest = (!crate::support::pg_manifest()).then(|| p.manifest_path());
    let before = manifest.as_ref().map(|m| std::fs::read(m).unwrap());
    let s = Server::start(&p, "serve", &[]);

    // The list.
    let list = s.get("/");
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(
        list.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(
        list.body
            .contains(r#"<tr data-backfill="1" data-state="failed">"#),
        "{}",
        list.body
    );
    assert!(list.body.contains("1 rejected"), "{}", list.body);
    let filtered = s.get("/?dag=exports&state=completed");
    assert_eq!(filtered.status, 200);
    assert!(!filtered.body.contains("data-backfill=\"1\""));
    assert!(filtered.body.contains("No backfills match"));

    // One cell per interval, with its state; the rejected one names its reason.
    let page = s.get("/backfills/1");
    assert_eq!(page.status, 200);
    assert_eq!(count(&page.body, "data-interval="), 3, "{}", page.body);
    for (day, state) in [(1, "succeeded"), (2, "rejected"), (3, "failed")] {
        let cell = format!(
            r#"href="/backfills/1/intervals/2026-01-0{day}T00:00:00Z" data-interval="2026-01-0{day}T00:00:00Z" data-state="{state}""#
        );
        assert!(page.body.contains(&cell), "no {cell} in {}", page.body);
    }
    let rejected = s.get("/backfills/1/intervals/2026-01-02T00:00:00Z");
    assert_eq!(rejected.status, 200);
    assert!(
        rejected
            .body
            .contains("row count 10 differs from the source count 20 by 50.0%"),
        "{}",
        rejected.body
    );
    assert!(
        rejected
            .body
            .contains(r#"<section class="try" data-try="1" data-state="rejected">"#)
    );
    // The runs' table shows the rows the rejected try computed, marked as not published.
    assert!(
        rejected
            .body
            .contains(r#"<td class="rows">10 rejected</td>"#),
        "{}",
        rejected.body
    );

    // Every value is text: the markup a source count printed, and the DAG's description.
    let failed = s.get("/backfills/1/intervals/2026-01-03T00:00:00Z");
    assert!(
        failed.body.contains("&lt;script&gt;alert(1)&lt;"),
        "{}",
        failed.body
    );
    assert!(!failed.body.contains("<script>alert"), "{}", failed.body);
    let dag = s.get("/dags/exports");
    assert_eq!(dag.status, 200, "{}", dag.body);
    assert!(
        dag.body.contains("Exports &lt;script&gt;alert("),
        "{}",
        dag.body
    );
    assert!(!dag.body.contains("<script>alert"));
    assert_eq!(count(&dag.body, "data-interval="), 3);

    // The JSON documents are the commands' own.
    let shown = p.run(&["--output", "json", "show", "1"]);
    assert_eq!(s.get("/api/backfills/1").json(), shown.json());
    let listed = p.run(&["--output", "json", "list"]);
    assert_eq!(s.get("/api/backfills").json(), listed.json());

    // Bad requests are 4xx, never a crash.
    assert_eq!(s.get("/backfills/abc").status, 400);
    assert_eq!(s.get("/backfills/99").status, 404);
    assert_eq!(s.get("/backfills/1/intervals/yesterday").status, 400);
    assert_eq!(s.get("/api/backfills/99").status, 404);
    assert_eq!(
        s.get("/api/backfills/99").json(),
        json!({"error": "the manifest has no backfill 99"})
    );
    assert_eq!(s.get("/nowhere").status, 404);
    assert_eq!(s.get("/dags/unknown").status, 404);
    assert_eq!(s.get("/pools").status, 200);

    // Metrics.
    let m = s.get("/metrics");
    assert_eq!(m.status, 200);
    for line in [
        "backfill_manifest_up 1",
        "backfill_backfills{state=\"failed\"} 1",
        "backfill_intervals{dag=\"exports\",state=\"rejected\"} 1",
        "backfill_intervals{dag=\"exports\",state=\"failed\"} 1",
        "backfill_intervals{dag=\"exports\",state=\"succeeded\"} 1",
        "backfill_tries_running 0",
        "backfill_rejections_total{dag=\"exports\",rule=\"source_count\"} 1",
        "backfill_last_published_interval_end_seconds{dag=\"exports\"} 1767312000",
    ] {
        assert!(
            m.body.lines().any(|l| l == line),
            "no `{line}` in\n{}",
            m.body
        );
    }

    assert_eq!(s.stop(), 0, "Ctrl-C ends the server with 0");
    if let (Some(m), Some(before)) = (manifest, before) {
        assert_eq!(
            std::fs::read(m).unwrap(),
            before,
            "the manifest file is unchanged byte for byte"
        );
    }
}

#[test]
fn metrics_give_the_last_published_interval_of_a_dag_of_tasks_without_a_gate() {
    let p = Project::new().dag("daily", DAILY_TRUE);
    p.create("daily", "2026-01-01", "2026-01-03", &[]).code(0);
    // Such a task writes where readers find it: nothing of it can be staged.
    p.create("daily", "2026-01-04", "2026-01-05", &["--stage"])
        .code(2)
        .stderr_has("--stage cannot hold back task `noop` of DAG `daily`");
    let s = Server::start(&p, "metrics", &[]);
    let m = s.get("/metrics");
    assert_eq!(m.status, 200);
    // The end of 2026-01-03.
    let line = "backfill_last_published_interval_end_seconds{dag=\"daily\"} 1767484800";
    assert!(
        m.body.lines().any(|l| l == line),
        "no `{line}` in\n{}",
        m.body
    );
    assert_eq!(s.stop(), 0);
}

#[test]
fn a_rejected_rerun_says_on_the_page_that_the_partition_published_before_stays() {
    let p = Project::new().dag("exports", DAG);
    for day in [
        "2026-01-01",
        "2026-01-02",
        "2026-01-03",
        "2026-01-04",
        "2026-01-05",
    ] {
        p.write(&format!("source-{day}"), "10\n");
    }
    p.create("exports", "2026-01-01", "2026-01-05", &[]).code(0);
    // The source of 01-03 doubles: its rerun is rejected and its 10 rows stay published.
    p.write("source-2026-01-03", "20\n");
    p.create(
        "exports",
        "2026-01-01",
        "2026-01-05",
        &["--reprocess-behavior", "completed"],
    )
    .code(3);
    let s = Server::start(&p, "serve", &[]);
    let page = s.get("/backfills/2");
    assert_eq!(page.status, 200);
    // A week of days a row, headed by its first day.
    assert!(
        page.body.contains("<tr><th>2026-01-01</th><td>"),
        "{}",
        page.body
    );
    assert_eq!(
        page.body.matches("<tr><th>2026-").count(),
        1,
        "{}",
        page.body
    );
    assert!(
        page.body.contains(
            r#"class="cell s-rejected kept" href="/backfills/2/intervals/2026-01-03T00:00:00Z""#
        ),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("10 rows stay published"),
        "{}",
        page.body
    );
    // No pager for one page.
    assert!(!page.body.contains("page 1 of"), "{}", page.body);
    let dag = s.get("/dags/exports");
    assert!(!dag.body.contains("class=\"pager\""), "{}", dag.body);
    // The DAG's calendar marks the same day: its latest run was rejected, its rows stay.
    assert!(
        dag.body.contains(
            r#"class="cell s-rejected kept" href="/backfills/2/intervals/2026-01-03T00:00:00Z""#
        ),
        "{}",
        dag.body
    );
    assert_eq!(dag.body.matches(" kept\"").count(), 1, "{}", dag.body);
    assert!(
        dag.body
            .contains("still has rows published by an earlier run"),
        "{}",
        dag.body
    );
    assert_eq!(s.stop(), 0);
}

/// `/metrics` in the text format Prometheus reads, as its own checker says.
#[test]
#[cfg_attr(
    missing = "promtool",
    ignore = "no promtool on PATH: sudo apt-get install prometheus"
)]
fn metrics_pass_promtool_check() {
    let p = finished();
    let s = Server::start(&p, "serve", &[]);
    let m = s.get("/metrics");
    assert_eq!(m.status, 200);
    promtool(&m.body);
    assert_eq!(s.stop(), 0);
}

/// `promtool check metrics` on `text`: a panic when it finds a problem, or when there is no
/// promtool (its test is ignored then: `tests/parts`).
fn promtool(text: &str) {
    let mut child = Command::new(Part::Promtool.require())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn another_address_needs_a_token_and_every_request_then_carries_it() {
    let p = finished();
    let out = p.run(&["serve", "--listen", "0.0.0.0:0"]);
    out.code(2).stderr_has(
        "--listen 0.0.0.0:0: another address than loopback lets every host that reaches it read the manifest; give --token (or BACKFILL_SERVE_TOKEN) as well",
    );
    p.run(&["serve", "--listen", "8460"])
        .code(2)
        .stderr_has("--listen 8460: not an address to listen on; give HOST:PORT");
    for bad in ["short", "abc;def=ghi", "ééééé", "with space"] {
        p.run(&["serve", "--token", bad])
            .code(2)
            .stderr_has("give at least 8 characters, each a letter, a digit or one of . _ ~ -");
    }
    // The token's value never shows in --help.
    let help = p.run_with(
        &["serve", "--help"],
        &[("BACKFILL_SERVE_TOKEN", "s3cret-token")],
    );
    help.code(0);
    assert!(!help.stdout.contains("s3cret-token"), "{}", help.stdout);

    let s = Server::start(&p, "serve", &["--token", "s3cret-token"]);
    for path in [
        "/",
        "/backfills/1",
        "/api/backfills",
        "/metrics",
        "/nowhere",
    ] {
        let a = s.get(path);
        assert_eq!(a.status, 401, "{path} without the token");
        assert!(!a.body.contains("data-interval"));
    }
    assert_eq!(
        s.get_with("/", &[("Authorization", "Bearer wrong-token")])
            .status,
        401
    );
    assert_eq!(
        s.get_with("/metrics", &[("Authorization", "Bearer s3cret-token")])
            .status,
        200
    );
    // Once in a browser: the cookie (named after the port, as a browser sends a host's cookies
    // to all its ports) is set, and the browser goes to the address without the token.
    let first = s.get("/backfills/1?page=1&token=s3cret-token");
    assert_eq!(first.status, 303, "{}", first.body);
    assert_eq!(first.header("location"), Some("/backfills/1?page=1"));
    let port = s.addr.rsplit(':').next().unwrap();
    let cookie = first.header("set-cookie").expect("a cookie").to_string();
    assert!(
        cookie.starts_with(&format!("backfill_token_{port}=s3cret-token;")),
        "{cookie}"
    );
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax"));
    assert_eq!(s.get("/?token=wrong-token").status, 401);
    let name = format!("backfill_token_{port}=s3cret-token");
    let with_cookie = s.get_with("/backfills/1", &[("Cookie", &name)]);
    assert_eq!(with_cookie.status, 200);
    assert_eq!(count(&with_cookie.body, "data-interval="), 3);
    // With a token, any name of the host will do.
    assert_eq!(
        s.get_with(
            "/metrics",
            &[
                ("Authorization", "Bearer s3cret-token"),
                ("Host", "backfills.internal")
            ]
        )
        .status,
        200
    );
}

/// The start of a request that never ends its headers: a header's value is left open.
const HALF_SENT: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\nX-a: ";

/// An authorized request's status, body and time, or `None` when no answer came within `limit`.
fn answered_within(
    addr: &str,
    path: &str,
    token: &str,
    limit: Duration,
) -> Option<(u16, String, Duration)> {
    let start = std::time::Instant::now();
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, limit).ok()?;
    s.set_read_timeout(Some(limit)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body, start.elapsed()))
}

/// Whether the server has closed `c` (an end of stream, or a reset), without waiting.
fn closed_now(c: &mut TcpStream) -> bool {
    c.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 256];
    match c.read(&mut buf) {
        Ok(0) => true,
        Ok(n) => panic!(
            "a half-sent request was answered: {}",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// Waits until the server has closed every connection of `open` (each with when its bytes
/// were sent), at most `limit`; how long after its bytes each was closed.
fn all_closed(open: &mut [(TcpStream, std::time::Instant)], limit: Duration) -> Vec<Duration> {
    let start = std::time::Instant::now();
    let mut after: Vec<Option<Duration>> = vec![None; open.len()];
    while after.iter().any(Option::is_none) {
        let left = after.iter().filter(|a| a.is_none()).count();
        assert!(
            start.elapsed() < limit,
            "{left} of {} half-sent requests still open after {limit:?}",
            open.len()
        );
        for ((c, sent), a) in open.iter_mut().zip(after.iter_mut()) {
            if a.is_none() && closed_now(c) {
                *a = Some(sent.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    after.into_iter().flatten().collect()
}

/// Clients that open a connection, send part of a request's headers and stop (a slow-loris):
/// a few hundred of them must neither lock an authorized request out (with the open-files
/// limit of the system, and with 128 files, where each of them would take one of the few
/// left), nor keep their sockets past the header-read timeout (6 s here, `serve-timeouts`).
#[test]
fn requests_that_never_end_their_headers_lock_nobody_out_and_are_closed_after_the_timeout() {
    const HALF: usize = 300;
    let p = finished();
    let token = "s3cret-token";
    let (soft, _) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    for open_files in [None, Some(128u64)] {
        let what = open_files.map_or_else(
            || format!("the system's limit of {soft} open files"),
            |n| format!("a limit of {n} open files"),
        );
        let s = Server::start_with(
            &p,
            "serve",
            &["serve", "--listen", "127.0.0.1:0", "--token", token],
            &[("BACKFILL_FAULT", "serve-timeouts:6s")],
            open_files,
        );
        let mut half: Vec<(TcpStream, std::time::Instant)> = (0..HALF)
            .map(|_| {
                let mut c =
                    TcpStream::connect_timeout(&s.addr.parse().unwrap(), Duration::from_secs(10))
                        .unwrap_or_else(|e| {
                            panic!(
                                "cannot connect with {what}: {e}: the server accepts nothing more"
                            )
                        });
                // The server may have shed it already, when it has no room for all.
                let _ = c.write_all(HALF_SENT);
                (c, std::time::Instant::now())
            })
            .collect();
        let Some((status, body, took)) =
            answered_within(&s.addr, "/metrics", token, Duration::from_secs(10))
        else {
            panic!(
                "/metrics did not answer within 10 s behind {HALF} half-sent requests, with {what}"
            );
        };
        assert_eq!(status, 200, "{body}");
        assert!(
            body.lines().any(|l| l == "backfill_manifest_up 1"),
            "{body}"
        );
        assert!(
            took < Duration::from_secs(3),
            "/metrics took {took:?} behind {HALF} half-sent requests, with {what}"
        );
        let open = half
            .iter_mut()
            .filter_map(|(c, _)| (!closed_now(c)).then_some(()))
            .count();
        match open_files {
            // Room for every one: none is shed before its timeout.
            None if soft >= 1024 => assert_eq!(open, HALF, "with {what}"),
            None => {}
            // The silent ones are shed to make room.
            Some(n) => {
                assert!(open < n as usize, "{open} open with {what}");
                assert!(
                    p.read("serve.err").contains(&format!(
                        "connections at once: the limit on open files ({n}) leaves room for no more"
                    )),
                    "{}",
                    p.read("serve.err")
                );
            }
        }
        let after = all_closed(&mut half, Duration::from_secs(30));
        let (first, last) = (
            after.iter().min().copied().unwrap_or_default(),
            after.iter().max().copied().unwrap_or_default(),
        );
        eprintln!(
            "with {what}: /metrics answered in {took:?} behind {HALF} half-sent requests, {open} of them open then; each closed {first:?} to {last:?} after its bytes were sent"
        );
        if open == HALF {
            assert!(first >= Duration::from_secs(5), "closed after {first:?}");
        }
        let again = answered_within(&s.addr, "/pools", token, Duration::from_secs(10));
        assert_eq!(again.map(|a| a.0), Some(200));
        assert_eq!(s.stop(), 0);
    }
}

/// What a hostile request or a hostile manifest could do: read a file the manifest names
/// outside the project's logs, block the server on a FIFO, overflow a page number, pass a NUL to
/// the manifest, reach a loopback server through another host name (DNS rebinding), write.
#[test]
fn hostile_requests_get_4xx_and_a_page_reads_only_the_projects_logs() {
    let p = Project::new().dag(
        "echo",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"say\"\ncommand = \"echo said on {{ ds }}\"\n",
    );
    p.create("echo", "2026-01-01", "2026-01-03", &[]).code(0);
    // Another host that writes the manifest names, as day 2's log, a file outside the log
    // folder, and as day 3's a FIFO inside it.
    p.write("secret.txt", "TOPSECRET\n");
    let fifo = p.path(".backfill/logs/fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    for (day, path) in [(2, p.path("secret.txt")), (3, fifo)] {
        p.exec(&format!(
            "UPDATE task_tries SET log_path = '{}' WHERE run_id IN (SELECT id FROM runs WHERE interval_start = {})",
            path.display(),
            crate::support::day_unix(day)
        ));
    }
    let s = Server::start(&p, "serve", &[]);
    let tries = |day: u32| {
        s.get(&format!(
            "/backfills/1/intervals/{}",
            crate::support::day(day)
        ))
    };
    let first = tries(1);
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(
        first.body.contains("<pre class=\"log\">said on 2026-01-01"),
        "{}",
        first.body
    );
    let second = tries(2);
    assert_eq!(second.status, 200);
    assert!(!second.body.contains("TOPSECRET"), "{}", second.body);
    assert!(!second.body.contains("<pre class=\"log\">"));
    // A read of the FIFO would never return: the page answers (the client waits 60 s at most).
    let third = tries(3);
    assert_eq!(third.status, 200);
    assert!(!third.body.contains("<pre class=\"log\">"));
    assert_eq!(s.get("/metrics").status, 200, "the server still answers");

    // Page numbers: too large for a page, or not a number, get a page that says so.
    let html = Some("text/html; charset=utf-8");
    for path in [
        "/dags/echo?page=18446744073709551615",
        "/dags/echo?page=-1",
        "/backfills/1?page=abc",
        "/?page=1&page=2",
    ] {
        let a = s.get(path);
        assert_eq!(a.status, 400, "{path}: {}", a.body);
        assert_eq!(a.header("content-type"), html, "{path}");
    }
    let far = s.get("/dags/echo?page=4294967295");
    assert_eq!(far.status, 404, "{}", far.body);
    assert!(far.body.contains("on this page"));
    // A NUL names nothing (it never reaches the manifest, where PostgreSQL would refuse it).
    for path in ["/dags/%00", "/dags/a%00b", "/api/backfills?dag=%00"] {
        assert_eq!(s.get(path).status, 400, "{path}");
    }
    // Without a token, only loopback names are answered.
    let rebound = s.get_with("/api/backfills", &[("Host", "attacker.example")]);
    assert_eq!(rebound.status, 421, "{}", rebound.body);
    assert!(!rebound.body.contains("echo"));
    assert_eq!(
        s.get_with("/api/backfills", &[("Host", "attacker.example:8460")])
            .status,
        421
    );
    for host in ["localhost", "LOCALHOST:8460", "127.0.0.1"] {
        assert_eq!(
            s.get_with("/api/backfills", &[("Host", host)]).status,
            200,
            "{host}"
        );
    }
    // It only reads.
    for method in ["POST", "PUT", "DELETE"] {
        let a = http(&s.addr, method, "/backfills/1", &[], Some("{}"));
        assert_eq!(a.status, 405, "{method}");
        assert_eq!(a.header("allow"), Some("GET, HEAD"));
    }
    assert_eq!(s.stop(), 0);
}

/// A backfill of more intervals than a page holds (2,000), run backwards, with one failed hour
/// on its second page: each page holds its own intervals in time order with their own states,
/// and the counts are the whole backfill's.
#[test]
fn a_large_backfill_is_shown_a_page_at_a_time_in_time_order() {
    let first = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap();
    let hour = |n: i64| first + chrono::Duration::hours(n);
    let at = |n: i64| hour(n).format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let failing = hour(2005).format("%Y-%m-%dT%H").to_string();
    let p = Project::new().dag(
        "hourly",
        &format!(
            "schedule = \"@hourly\"\n[[tasks]]\nid = \"t\"\ncommand = 'case \"{{{{ data_interval_start }}}}\" in {failing}*) exit 1;; esac'\n"
        ),
    );
    p.create(
        "hourly",
        "2026-01-01T00:00",
        &hour(2009).format("%Y-%m-%dT%H:%M").to_string(),
        &["--run-backwards", "--max-active-runs", "8"],
    )
    .code(3);
    let s = Server::start(&p, "serve", &[]);
    let intervals = |body: &str| -> Vec<(String, String)> {
        body.split("data-interval=\"")
            .skip(1)
            .map(|rest| {
                let start = rest[..rest.find('"').unwrap()].to_string();
                let state = rest.split("data-state=\"").nth(1).unwrap();
                (start, state[..state.find('"').unwrap()].to_string())
            })
            .collect()
    };
    let one = s.get("/backfills/1");
    assert_eq!(one.status, 200);
    let cells = intervals(&one.body);
    assert_eq!(cells.len(), 2000);
    let want: Vec<(String, String)> = (0..2000).map(|n| (at(n), "succeeded".into())).collect();
    assert_eq!(cells, want, "page 1: the first 2,000 hours in time order");
    assert!(one.body.contains("page 1 of 2"), "{}", &one.body[..2000]);
    assert!(
        one.body
            .contains("2010 of 2010 intervals done: 2009 succeeded · 0 rejected · 1 failed"),
        "the whole backfill's counts"
    );
    let two = s.get("/backfills/1?page=2");
    let want: Vec<(String, String)> = (2000..2010)
        .map(|n| {
            let state = if n == 2005 { "failed" } else { "succeeded" };
            (at(n), state.to_string())
        })
        .collect();
    assert_eq!(intervals(&two.body), want, "page 2: the last ten hours");
    assert!(two.body.contains("On this page (10 intervals)"));
    // A page past the end is the last one.
    assert_eq!(intervals(&s.get("/backfills/1?page=99").body), want);
}

/// The list: 50 backfills to a page, newest first, filtered before it is paged, each with its
/// own counts.
#[test]
fn the_list_pages_the_backfills_newest_first_after_its_filters() {
    let p = Project::new()
        .dag(
            "ok",
            "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
        )
        .dag(
            "no",
            "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"false\"\n",
        );
    for n in 1..=52 {
        let day = crate::support::day(1 + n % 28);
        let day = &day[..10];
        if n % 13 == 0 {
            p.create("no", day, day, &[]).code(3);
        } else {
            p.create("ok", day, day, &["--reprocess-behavior", "completed"])
                .code(0);
        }
    }
    let s = Server::start(&p, "serve", &[]);
    let ids = |path: &str| -> Vec<i64> {
        let a = s.get(path);
        assert_eq!(a.status, 200, "{path}: {}", a.body);
        a.body
            .split("<tr data-backfill=\"")
            .skip(1)
            .map(|rest| rest[..rest.find('"').unwrap()].parse().unwrap())
            .collect()
    };
    assert_eq!(ids("/"), (3..=52).rev().collect::<Vec<i64>>());
    assert_eq!(ids("/?page=2"), [2, 1]);
    assert_eq!(ids("/?state=failed"), [52, 39, 26, 13]);
    let ok = ids("/?dag=ok");
    assert_eq!(ok.len(), 48, "one page: {ok:?}");
    assert!(ok.iter().all(|id| id % 13 != 0));
    let failed = s.get("/?dag=no");
    assert!(failed.body.contains("1 failed"), "each row its own counts");
}

#[test]
fn a_project_without_a_manifest_yet_serves_an_empty_list_and_creates_nothing() {
    let p = Project::new().dag("exports", DAG).sqlite();
    let s = Server::start(&p, "serve", &[]);
    let list = s.get("/");
    assert_eq!(list.status, 200);
    assert!(list.body.contains("No backfills yet"), "{}", list.body);
    assert_eq!(s.get("/api/backfills").json(), json!([]));
    let m = s.get("/metrics");
    assert!(
        m.body.lines().any(|l| l == "backfill_manifest_up 1"),
        "{}",
        m.body
    );
    assert!(!p.path(".backfill").exists(), "nothing written");

    // A manifest made while it serves is read, and one put in its place is followed: the
    // connections to the file it replaced are not used again.
    p.create("exports", "2026-01-01", "2026-01-01", &[]);
    let ids = |s: &Server| -> Vec<i64> {
        s.get("/api/backfills")
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(ids(&s), [1]);
    let other = Project::new().dag("exports", DAG).sqlite();
    for day in ["2026-01-02", "2026-01-03"] {
        other.create("exports", day, day, &[]);
    }
    let moved = p.path("manifest.moved");
    std::fs::rename(p.manifest_path(), &moved).unwrap();
    assert_eq!(ids(&s), Vec::<i64>::new(), "no manifest there now");
    std::fs::copy(other.manifest_path(), p.manifest_path()).unwrap();
    assert_eq!(ids(&s), [1, 2], "the manifest put in its place");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_manifest_server_that_goes_away_gives_a_page_that_says_so_and_it_recovers() {
    let own = crate::pg::Cluster::start();
    let db = own.create_db();
    // A password in the URL (the test server trusts its users, so any will do) must never
    // reach a page, nor the line that says where the server listens.
    let url = own
        .url(&db)
        .replace("postgres@", "postgres:hunter2-secret@");
    assert!(url.contains("hunter2-secret"));
    let p = Project::new().dag("exports", DAG);
    p.write("source-2026-01-01", "10\n");
    p.run_with(
        &[
            "create",
            "--dag",
            "exports",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ],
        &[("BACKFILL_MANIFEST", &url)],
    )
    .code(0);
    let child = p.spawn_with(
        "serve",
        &["serve", "--listen", "127.0.0.1:0"],
        &[("BACKFILL_MANIFEST", &url)],
    );
    let mut addr = String::new();
    wait_until("the server to listen", Duration::from_secs(20), || {
        let text = p.read("serve.err");
        text.split("at http://")
            .nth(1)
            .map(|rest| addr = rest.split('/').next().unwrap_or_default().to_string())
            .is_some()
    });
    let s = Server {
        child: Some(child),
        addr,
    };
    let page = s.get("/backfills/1");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("postgres@127.0.0.1:"), "{}", page.body);
    for path in [
        "/",
        "/backfills/1",
        "/pools",
        "/dags/exports",
        "/api/backfills/1",
        "/metrics",
    ] {
        assert!(
            !s.get(path).body.contains("hunter2"),
            "{path} shows the password"
        );
    }
    assert!(!p.read("serve.err").contains("hunter2"));
    own.stop();
    let down = s.get("/backfills/1");
    assert_eq!(down.status, 503, "{}", down.body);
    assert!(!down.body.contains("hunter2"), "{}", down.body);
    assert!(
        down.body.contains("Cannot read the manifest"),
        "{}",
        down.body
    );
    assert!(
        down.body.contains(r#"data-live="true""#),
        "the page tries again"
    );
    let m = s.get("/metrics");
    assert!(
        m.body.lines().any(|l| l == "backfill_manifest_up 0"),
        "{}",
        m.body
    );
    own.start_again();
    let back = std::time::Instant::now();
    wait_until("the page to recover", Duration::from_secs(30), || {
        s.get("/backfills/1").status == 200
    });
    eprintln!(
        "recovered {:?} after the server started again",
        back.elapsed()
    );
    assert_eq!(count(&s.get("/backfills/1").body, "data-interval="), 1);
}

/// Tries running now in the manifest of database `db` (0 before its schema exists).
fn running_tries(cluster: &crate::pg::Cluster, db: &str) -> String {
    if cluster.psql(
        db,
        "SELECT to_regclass('backfill_manifest.task_tries') IS NULL",
    ) == "t"
    {
        return "0".into();
    }
    cluster.psql(
        db,
        "SELECT COUNT(*) FROM backfill_manifest.task_tries WHERE state = 'running'",
    )
}

/// The row of backfill `id` in a page's table (`data-backfill` of the list, a link in the
/// leases' table).
fn row_of<'a>(page: &'a str, marker: &str) -> &'a str {
    let at = page
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker} in {page}"));
    let start = page[..at].rfind("<tr").unwrap_or(at);
    let end = page[at..].find("</tr>").map_or(page.len(), |e| at + e);
    &page[start..end]
}

/// The time a page's footer says it was read at.
fn read_at(page: &str) -> chrono::DateTime<chrono::Utc> {
    let (_, rest) = page
        .split_once("read at <time>")
        .unwrap_or_else(|| panic!("no time read at in {page}"));
    let (at, _) = rest.split_once("</time>").unwrap_or_default();
    chrono::DateTime::parse_from_rfc3339(at)
        .unwrap_or_else(|e| panic!("read at `{at}`: {e}"))
        .with_timezone(&chrono::Utc)
}

/// On PostgreSQL, heartbeats are written with the database's clock: the status page must judge
/// them with it, as `resume` and `list` do, and not with the clock of the host serving the page.
/// Backfill 1 runs, its heartbeat fresh; backfill 2's owner, on another host, last sent one 60 s
/// ago (the lease timeout is 30 s). Pages served from a host whose clock is two minutes ahead,
/// then two minutes behind, say the same, and say they were read at the database's time.
#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn the_status_page_judges_leases_by_the_databases_clock_not_the_serving_hosts() {
    let cluster = crate::pg::shared();
    let db = cluster.create_db();
    let url = cluster.url(&db);
    let p = Project::new()
        .dag("c", crate::pg_manifest::DAG)
        .dag("d", crate::pg_manifest::DAG);
    let owner = p.spawn(
        "owner",
        &crate::pg_manifest::create_args(&url, "2026-01-01", "2026-01-02"),
    );
    wait_until("backfill 1's two tries", Duration::from_secs(30), || {
        running_tries(cluster, &db) == "2"
    });
    let mut gone = p.spawn(
        "gone",
        &[
            "--manifest",
            &url,
            "create",
            "--dag",
            "d",
            // Another day than backfill 1's: the task locks its day.
            "--from",
            "2026-01-03",
            "--to",
            "2026-01-03",
        ],
    );
    wait_until("backfill 2's try", Duration::from_secs(30), || {
        running_tries(cluster, &db) == "3"
    });
    gone.kill().unwrap();
    gone.wait().unwrap();
    cluster.psql(
        &db,
        "UPDATE backfill_manifest.backfills SET owner_host = 'another-host',
           heartbeat_at = CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS bigint) - 60000
         WHERE id = 2",
    );
    for skew in ["+120s", "-120s"] {
        let fault = format!("clock-skew:{skew}");
        let s = Server::start_with(
            &p,
            "serve",
            &["--manifest", &url, "serve", "--listen", "127.0.0.1:0"],
            &[("BACKFILL_FAULT", &fault)],
            None,
        );
        let pools = s.get("/pools");
        assert_eq!(pools.status, 200, "{}", pools.body);
        let live = row_of(&pools.body, r#"<a href="/backfills/1">"#);
        assert!(
            live.contains(r#"data-health="fresh""#),
            "with the clock {skew}: {live}"
        );
        let expired = row_of(&pools.body, r#"<a href="/backfills/2">"#);
        assert!(
            expired.contains(r#"data-health="expired""#),
            "with the clock {skew}: {expired}"
        );
        // The heartbeats' ages, on the list, a backfill's page and /metrics.
        let list = s.get("/");
        let first = row_of(&list.body, r#"data-backfill="1""#);
        assert!(!first.contains(" min "), "with the clock {skew}: {first}");
        assert!(
            !first.contains("owner gone"),
            "with the clock {skew}: {first}"
        );
        let second = row_of(&list.body, r#"data-backfill="2""#);
        assert!(
            second.contains("owner gone"),
            "with the clock {skew}: {second}"
        );
        let page = s.get("/backfills/1");
        assert!(
            page.body.contains("heartbeat ") && !page.body.contains(" min 0 s ago"),
            "with the clock {skew}: {}",
            page.body
        );
        // The time each of them says it was read at, which their ages count from.
        for (name, answer) in [("/pools", &pools), ("/", &list), ("/backfills/1", &page)] {
            let at = read_at(&answer.body);
            let off = (at - chrono::Utc::now()).num_seconds().abs();
            assert!(off < 60, "with the clock {skew}: {name} was read at {at}");
        }
        let metrics = s.get("/metrics");
        let age: f64 = metrics
            .body
            .lines()
            .find_map(|l| l.strip_prefix("backfill_oldest_heartbeat_age_seconds "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no heartbeat age in {}", metrics.body));
        assert!(
            (59.0..90.0).contains(&age),
            "with the clock {skew}: the oldest heartbeat is {age} s old, backfill 2's of 60 s"
        );
        assert_eq!(s.stop(), 0);
    }
    std::fs::write(p.path("go"), "").unwrap();
    p.wait("owner", owner).code(0);
}

#[test]
fn show_grid_draws_one_cell_per_interval_wrapped_to_the_width() {
    let p = finished();
    let out = p.run_with(&["show", "1", "--grid"], &[("COLUMNS", "50")]);
    out.code(0);
    assert_eq!(
        out.stdout,
        "backfill 1 of exports: failed · 3 intervals\n2026-01-01  #RF\n# published 1  R rejected 1  F failed 1\n"
    );
    // Forty days in groups of a week, the groups of a daily schedule, as many as fit: 44
    // columns hold four weeks beside the date.
    let p = Project::new().dag(
        "d",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    p.create("d", "2026-01-01", "2026-02-09", &[]).code(0);
    let out = p.run_with(&["show", "1", "--grid"], &[("COLUMNS", "44")]);
    out.code(0);
    assert_eq!(
        out.stdout,
        "backfill 1 of d: completed · 40 intervals\n2026-01-01  ####### ####### ####### #######\n2026-01-29  ####### #####\n# published 40\n"
    );
    p.run(&["--output", "json", "show", "1", "--grid"])
        .code(2)
        .stderr_has("show --grid draws cells for people");
}

#[test]
#[cfg_attr(
    missing = "script",
    ignore = "no script on PATH (util-linux's, for a pseudo-terminal): sudo apt-get install bsdutils"
)]
fn show_grid_on_a_terminal_is_in_colour_and_as_wide_as_the_terminal() {
    let p = finished();
    let (code, text) = crate::tables::on_terminal(&p, &["show", "1", "--grid"], 50);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("2026-01-01  \x1b[32m#\x1b[0m\x1b[1;35mR\x1b[0m\x1b[1;31mF\x1b[0m\n"),
        "{text:?}"
    );
    assert!(text.contains("\x1b[1;35mR\x1b[0m rejected 1"), "{text:?}");
}

const DAILY_TRUE: &str = r#"
schedule = "@daily"
max_active_runs = 8
[[tasks]]
id = "noop"
command = "true"
"#;

/// What a terminal shows of `show ID --grid`, its colour codes taken out, and checks that no
/// line is wider than `cols`: the grid's lines (a date, then the cells).
fn grid_lines(p: &Project, id: &str, cols: u16) -> Vec<String> {
    let (code, text) = crate::tables::on_terminal(p, &["show", id, "--grid"], cols);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("\x1b[32m#\x1b[0m"), "in colour: {text:?}");
    let plain = crate::tables::strip_codes(&text);
    for line in plain.lines() {
        assert!(
            line.chars().count() <= usize::from(cols),
            "wider than {cols}: {line:?} in\n{plain}"
        );
    }
    plain
        .lines()
        .filter(|l| l.starts_with("2025-") || l.starts_with("2026-"))
        .map(String::from)
        .collect()
}

#[test]
#[cfg_attr(
    missing = "script",
    ignore = "no script on PATH (util-linux's, for a pseudo-terminal): sudo apt-get install bsdutils"
)]
fn show_grid_in_colour_keeps_a_month_and_a_year_of_days_on_full_lines_at_any_width() {
    let p = Project::new().dag("daily", DAILY_TRUE);
    p.create("daily", "2026-01-01", "2026-01-30", &[]).code(0);
    p.create("daily", "2025-01-01", "2025-12-31", &[]).code(0);
    let week = "#######";
    // A month at 80 columns: one line, the weeks a space apart.
    assert_eq!(
        grid_lines(&p, "1", 80),
        [format!("2026-01-01  {} ##", [week; 4].join(" "))]
    );
    // A year: as many whole weeks a line as fit after the date (10 columns and 2 spaces).
    for (cols, weeks) in [(60u16, 6usize), (80, 8), (200, 23)] {
        let lines = grid_lines(&p, "2", cols);
        let per_line = weeks * 7;
        assert_eq!(
            lines.len(),
            365usize.div_ceil(per_line),
            "{cols} columns: {lines:#?}"
        );
        for (n, line) in lines.iter().enumerate() {
            let first = chrono::NaiveDate::from_ymd_opt(2025, 1, 1).unwrap()
                + chrono::Days::new(u64::try_from(n * per_line).unwrap());
            let cells = (365 - n * per_line).min(per_line);
            let mut want = format!("{first}  ");
            let groups: Vec<String> = (0..cells.div_ceil(7))
                .map(|g| "#".repeat((cells - g * 7).min(7)))
                .collect();
            want.push_str(&groups.join(" "));
            assert_eq!(line, &want, "{cols} columns, line {n}");
        }
    }
}

/// chromedriver's WebDriver: a session of headless Chromium.
struct Browser {
    driver: Child,
    addr: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// A panic that names what is missing without Chromium or chromedriver (the test is
    /// ignored then: `tests/parts`).
    fn start() -> Self {
        let found = [Part::Chromium, Part::Chromedriver].map(Part::find);
        let missing: Vec<&str> = found
            .iter()
            .filter_map(|part| part.as_ref().err().map(String::as_str))
            .collect();
        assert!(missing.is_empty(), "{}", missing.join("; "));
        let [chromium, chromedriver] = found.map(Result::unwrap);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}");
        wait_until("chromedriver to listen", Duration::from_secs(20), || {
            TcpStream::connect(&addr).is_ok()
        });
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                     "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync",
                     format!("--user-data-dir={}", profile.path().display())],
        }}}});
        let answer = http(&addr, "POST", "/session", &[], Some(&caps.to_string())).json();
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {answer}"))
            .to_string();
        Self {
            driver,
            addr,
            session,
            _profile: profile,
        }
    }

    fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let body = (method == "POST").then(|| body.to_string());
        let answer = http(&self.addr, method, &path, &[], body.as_deref()).json();
        assert!(
            answer["value"].get("error").is_none(),
            "WebDriver {method} {path}: {answer}"
        );
        answer["value"].clone()
    }

    fn go(&self, url: &str) {
        self.call("POST", "/url", json!({ "url": url }));
    }

    /// The element ids of a CSS selector.
    fn all(&self, css: &str) -> Vec<String> {
        self.call(
            "POST",
            "/elements",
            json!({"using": "css selector", "value": css}),
        )
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            e.as_object()
                .unwrap()
                .values()
                .next()
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
    }

    fn attribute(&self, element: &str, name: &str) -> String {
        self.call(
            "GET",
            &format!("/element/{element}/attribute/{name}"),
            Value::Null,
        )
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    fn text(&self, element: &str) -> String {
        self.call("GET", &format!("/element/{element}/text"), Value::Null)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = http(
            &self.addr,
            "DELETE",
            &format!("/session/{}", self.session),
            &[],
            None,
        );
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

#[test]
#[cfg_attr(
    all(missing = "chromium", missing = "chromedriver"),
    ignore = "no chromium nor chromedriver on PATH: sudo apt-get install chromium chromium-driver"
)]
#[cfg_attr(
    all(missing = "chromium", not(missing = "chromedriver")),
    ignore = "no chromium on PATH: sudo apt-get install chromium"
)]
#[cfg_attr(
    all(missing = "chromedriver", not(missing = "chromium")),
    ignore = "no chromedriver on PATH: sudo apt-get install chromium-driver"
)]
fn a_browser_clicks_the_rejected_cell_and_reads_its_reason() {
    let browser = Browser::start();
    let p = finished();
    let s = Server::start(&p, "serve", &[]);
    browser.go(&format!("http://{}/", s.addr));
    let links = browser.all("tr[data-backfill='1'] a[href='/backfills/1']");
    assert_eq!(links.len(), 1);
    browser.call("POST", &format!("/element/{}/click", links[0]), json!({}));
    let cells = browser.all("#grid .cell");
    assert_eq!(cells.len(), 3, "one cell per interval");
    let states: Vec<String> = cells
        .iter()
        .map(|c| browser.attribute(c, "data-state"))
        .collect();
    assert_eq!(states, ["succeeded", "rejected", "failed"]);
    // The grid's rows are dated, and what went wrong is listed under it with its reasons.
    let dates: Vec<String> = browser
        .all("#grid th")
        .iter()
        .map(|e| browser.text(e))
        .collect();
    assert_eq!(dates, ["2026-01-01"]);
    let wrong: Vec<String> = browser
        .all(".went-wrong tbody tr")
        .iter()
        .map(|e| browser.text(e))
        .collect();
    assert_eq!(wrong.len(), 2, "{wrong:?}");
    assert!(
        wrong[0].starts_with("2026-01-02 rejected row count 10 differs from the source count 20"),
        "{wrong:?}"
    );
    assert!(wrong[1].starts_with("2026-01-03 failed"), "{wrong:?}");
    // The cell is drawn: it has a size on the page.
    let rect = browser.call("GET", &format!("/element/{}/rect", cells[1]), Value::Null);
    assert!(rect["width"].as_f64().unwrap() >= 10.0, "{rect}");
    browser.call("POST", &format!("/element/{}/click", cells[1]), json!({}));
    let url = browser.call("GET", "/url", Value::Null);
    assert_eq!(
        url.as_str().unwrap(),
        format!(
            "http://{}/backfills/1/intervals/2026-01-02T00:00:00Z",
            s.addr
        )
    );
    let reasons = browser.all(".try .reasons");
    assert_eq!(reasons.len(), 1);
    // The runs table's durations never wrap (`8` / `ms`).
    let took = browser.all("td.took");
    assert_eq!(
        browser.call(
            "GET",
            &format!("/element/{}/css/white-space", took[0]),
            Value::Null
        ),
        "nowrap"
    );
    assert_eq!(
        browser.text(&reasons[0]),
        "row count 10 differs from the source count 20 by 50.0% (tolerance 0.0%)"
    );
    // The failed interval's markup is shown as text, and no script of it ran.
    browser.go(&format!(
        "http://{}/backfills/1/intervals/2026-01-03T00:00:00Z",
        s.addr
    ));
    let errors = browser.all(".try .error");
    assert!(
        browser
            .text(&errors[0])
            .contains("<script>alert(1)</script>")
    );
    let alert = http(
        &browser.addr,
        "GET",
        &format!("/session/{}/alert/text", browser.session),
        &[],
        None,
    )
    .json();
    assert_eq!(alert["value"]["error"], "no such alert", "{alert}");
}

#[test]
fn the_pools_page_gives_each_pools_size_and_rate() {
    let p = Project::new().dag("a", &crate::guard_rails::pooled("a"));
    p.write(
        "backfill.toml",
        "[pools]\napi = { slots = 10, rate = \"3/1s\" }\nweb = 2\n",
    );
    p.create("a", "2026-01-01", "2026-01-01", &["-q"]).code(0);
    let s = Server::start(&p, "serve", &[]);
    let pools = s.get("/pools");
    assert_eq!(pools.status, 200, "{}", pools.body);
    assert!(
        pools
            .body
            .contains("api: 0 of 10 slots in use · rate at most 3 starts per 1s</h3>"),
        "{}",
        pools.body
    );
    assert!(
        pools.body.contains("web: 0 of 2 slots in use</h3>"),
        "{}",
        pools.body
    );
}

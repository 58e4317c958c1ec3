//! What a real network brings: a server that accepts a connection and never answers, and a
//! network cut that resets nothing (a proxy that stops relaying, its sockets open). Every wait
//! is bounded: a command fails within its `connect_timeout`, an owner cut off from its manifest
//! exits within about its lease timeout, and the backfill resumes.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::pg;
use crate::pg_manifest::{DAG, create_args};
use crate::support::{Project, day_unix, signal, stopped, wait_until, wait_within};

/// A TCP listener on 127.0.0.1 that accepts every connection and never sends a byte: a server
/// that hangs, not one that refuses.
fn silent_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
        }
    });
    port
}

/// A relay from a port on 127.0.0.1 to `upstream`, that the test can cut: from then on it
/// relays nothing and closes nothing, on the connections it has and on new ones (as a network
/// that drops every packet, seen from the client: nothing answers, nothing is reset).
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
}

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let c = cut.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for client in listener.incoming().flatten() {
                if c.load(Ordering::SeqCst) {
                    held.push(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let c = c.clone();
                    std::thread::spawn(move || relay(from, to, &c));
                }
            }
        });
        Proxy { port, cut }
    }

    fn url(&self, db: &str) -> String {
        format!(
            "postgresql://postgres@127.0.0.1:{}/{db}?sslmode=disable&connect_timeout=2",
            self.port
        )
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either closes; once cut, reads and writes nothing more, holding
/// both open.
fn relay(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool) {
    from.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = [0u8; 16384];
    loop {
        if cut.load(Ordering::SeqCst) {
            // Hold the sockets: the peers see a connection that no longer answers.
            std::thread::sleep(Duration::from_secs(3600));
            return;
        }
        match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if cut.load(Ordering::SeqCst) {
                    continue;
                }
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

#[test]
fn a_manifest_server_that_accepts_and_never_answers_fails_within_connect_timeout() {
    let port = silent_server();
    let p = Project::new().dag(
        "c",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\ncommand = \"true\"\n",
    );
    let url = format!("postgresql://etl:hunter2@127.0.0.1:{port}/m?connect_timeout=1");
    let child = p.spawn("list", &["--manifest", &url, "list"]);
    let out = wait_within(&p, "list", child, Duration::from_secs(30));
    out.code(1)
        .stderr_has(&format!(
            "manifest postgresql://etl@127.0.0.1:{port}/m?connect_timeout=1"
        ))
        .stderr_has("the server did not answer within 1s (connect_timeout)");
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
    let child = p.spawn("create", &create_args(&url, "2026-01-01", "2026-01-02"));
    wait_within(&p, "create", child, Duration::from_secs(30))
        .code(1)
        .stderr_has("the server did not answer within 1s (connect_timeout)");
    assert!(!p.has_manifest(), "nothing was recorded elsewhere");
}

#[test]
fn a_warehouse_that_accepts_and_never_answers_fails_within_connect_timeout() {
    let port = silent_server();
    let p = Project::new().dag(
        "c",
        "schedule = \"@daily\"\n[[tasks]]\nid = \"t\"\nwarehouse = \"dw\"\ntarget = \"t\"\npartition_column = \"d\"\nsql = \"SELECT 1 AS d\"\n",
    );
    p.write(
        "backfill.toml",
        &format!("[warehouse.dw]\nkind = \"postgres\"\nurl = \"postgresql://etl:hunter2@127.0.0.1:{port}/x?sslmode=disable&connect_timeout=1\"\n"),
    );
    let child = p.spawn(
        "create",
        &[
            "create",
            "--dag",
            "c",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
        ],
    );
    let out = wait_within(&p, "create", child, Duration::from_secs(30));
    out.code(2)
        .stderr_has("warehouse `dw`")
        .stderr_has("the server did not answer within 1s (connect_timeout)");
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
    assert!(!p.has_manifest(), "a refused backfill recorded nothing");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn an_owner_whose_network_to_the_manifest_hangs_exits_within_about_its_lease_and_resumes() {
    let cluster = pg::shared();
    let db = cluster.create_db();
    let proxy = Proxy::start(cluster.port());
    let through = proxy.url(&db);
    let p = Project::new().dag("c", DAG);
    p.write("backfill.toml", "lease_timeout = \"4s\"\n");
    let owner = p.spawn("owner", &create_args(&through, "2026-01-01", "2026-01-02"));
    wait_until("two running tries", Duration::from_secs(30), || {
        cluster.psql(
            &db,
            "SELECT to_regclass('backfill_manifest.task_tries') IS NOT NULL",
        ) == "t"
            && cluster.psql(
                &db,
                "SELECT COUNT(*) FROM backfill_manifest.task_tries WHERE state = 'running'",
            ) == "2"
    });
    proxy.cut();
    // No thaw, no reset: the owner must give up on its own. Its lease is 4 s; it stops its tries
    // at half of it and exits once the manifest has been silent for 10 s (the least it waits:
    // see `set_patience`) and one more connection attempt failed (a bound of 60 s here detects
    // a hang, it does not measure speed).
    let out = wait_within(&p, "owner", owner, Duration::from_secs(60));
    out.code(1)
        .stderr_has("cannot write the heartbeat")
        .stderr_has("resume");
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    // Straight to the server, the backfill resumes, and every interval ran once to success.
    std::fs::write(p.path("go"), "").unwrap();
    p.run(&["--manifest", &cluster.url(&db), "resume", "1"])
        .code(0);
    let runs = cluster.psql(
        &db,
        "SELECT interval_start, COUNT(*) FILTER (WHERE state = 'succeeded')
         FROM backfill_manifest.runs GROUP BY 1 ORDER BY 1",
    );
    assert_eq!(runs, format!("{}|1\n{}|1", day_unix(1), day_unix(2)));
    assert_eq!(p.read("overlaps.txt"), "");
}

/// A fresh database of the shared cluster with a target `t (d date, x int)`, a proxy to the
/// cluster, and a project whose warehouse `dw` is reached through the proxy, with one SQL task
/// (`task`: its query and any other keys) of DAG `s` writing `t`.
fn warehouse_behind_a_proxy(task: &str) -> (&'static pg::Cluster, String, Proxy, Project) {
    let cluster = pg::shared();
    let db = cluster.create_db();
    cluster.psql(&db, "CREATE TABLE t (d date NOT NULL, x int NOT NULL)");
    let proxy = Proxy::start(cluster.port());
    let p = Project::new().dag(
        "s",
        &format!(
            "schedule = \"@daily\"\n[[tasks]]\nid = \"q\"\nwarehouse = \"dw\"\ntarget = \"t\"\npartition_column = \"d\"\n{task}\n"
        ),
    );
    p.write(
        "backfill.toml",
        &format!(
            "[warehouse.dw]\nkind = \"postgres\"\nurl = \"{}\"\n",
            proxy.url(&db)
        ),
    );
    (cluster, db, proxy, p)
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn a_sql_try_whose_warehouse_network_hangs_is_stopped_and_the_backfill_ends() {
    let (cluster, db, proxy, p) = warehouse_behind_a_proxy(
        "sql = \"SELECT CAST(:ds AS date) AS d, 1 AS x FROM pg_sleep(60)\"",
    );
    let owner = p.spawn(
        "owner",
        &[
            "create",
            "--dag",
            "s",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ],
    );
    // The try has started (the checks before it are done) and its statement runs.
    wait_until(
        "the try's statement to run",
        Duration::from_secs(30),
        || {
            p.has_manifest()
            && p.count("SELECT COUNT(*) FROM task_tries WHERE state = 'running'") == 1
            && cluster.psql(
                &db,
                &format!(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = '{db}' AND query LIKE '%pg_sleep(60)%' AND state = 'active' AND pid <> pg_backend_pid()"
                ),
            ) == "1"
        },
    );
    proxy.cut();
    // Ctrl-C (a try's timeout takes the same way): the cancel request cannot get through, nor
    // the statement's answer; the connection is given up after the cancel, and the try ends
    // cancelled (a bound of 60 s detects a hang; it does not measure speed).
    signal(&owner, Signal::SIGINT);
    let out = wait_within(&p, "owner", owner, Duration::from_secs(60));
    out.code(130).stderr_has("cancelled");
    assert_eq!(cluster.psql(&db, "SELECT COUNT(*) FROM t"), "0");
}

#[test]
#[cfg_attr(
    missing = "postgres",
    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
)]
fn the_checks_before_a_backfill_end_when_the_warehouses_network_hangs() {
    let (_, _, proxy, p) =
        warehouse_behind_a_proxy("sql = \"SELECT CAST(:ds AS date) AS d, 1 AS x\"");
    // Connected, the checks about to start: then the network hangs.
    let owner = p.spawn_with(
        "owner",
        &[
            "create",
            "--dag",
            "s",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ],
        &[("BACKFILL_FAULT", "warehouse-check:stop")],
    );
    wait_until(
        "the checks to be about to start",
        Duration::from_secs(30),
        || stopped(owner.id()),
    );
    proxy.cut();
    signal(&owner, Signal::SIGCONT);
    let out = wait_within(&p, "owner", owner, Duration::from_secs(60));
    out.code(2)
        .stderr_has("warehouse `dw`")
        .stderr_has("did not answer the checks within 6s");
    assert!(!p.has_manifest(), "nothing was recorded");
}

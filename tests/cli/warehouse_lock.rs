//! A process that holds the SQLite warehouse's write lock and gets nowhere (an owner frozen
//! inside its publish): every command that needs the lock says who holds it, waits a bounded
//! time, and gives up naming it; once the holder goes on, `resume` finishes everything once.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::gate::{shop, wh_rows};
use crate::support::{signal, stopped, wait_stale, wait_until, wait_within};

/// How long a write waits for a lock whose holder gets nowhere (`warehouse::busy::PATIENCE`).
const PATIENCE: Duration = Duration::from_secs(30);

const OWNER: &[&str] = &[
    "create",
    "--dag",
    "orders_fact",
    "--from",
    "2026-09-01",
    "--to",
    "2026-09-03",
];

#[test]
fn a_frozen_owner_holding_the_warehouse_lock_is_named_and_resume_cancel_and_create_give_up_on_it() {
    // Each taker against an owner of its own, at once: each waits out the bound.
    std::thread::scope(|s| {
        let takers: Vec<_> = ["resume", "cancel", "create"]
            .into_iter()
            .map(|taker| s.spawn(move || frozen_owner_and(taker)))
            .collect();
        for t in takers {
            if let Err(panic) = t.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

/// The orders_fact backfill of three days frozen inside its first publish's transaction (the
/// warehouse's write lock held), its lease expired; `taker` (`resume 1`, `cancel 1`, or a
/// `create` of the same days) must recover it and so finish its publish.
fn frozen_owner_and(taker: &str) {
    let p = shop();
    p.write(
        "backfill.toml",
        &format!("lease_timeout = \"1s\"\n{}", p.read("backfill.toml")),
    );
    let frozen = p.spawn_with(
        "frozen",
        OWNER,
        &[("BACKFILL_FAULT", "before-commit@1:stop")],
    );
    wait_until(
        "the owner to freeze inside its publish",
        Duration::from_secs(30),
        || stopped(frozen.id()),
    );
    wait_stale(&p, 1, 1500);
    let pid = frozen.id();
    let args: Vec<&str> = match taker {
        "create" => OWNER.to_vec(),
        _ => vec![taker, "1"],
    };
    let began = Instant::now();
    let child = p.spawn(taker, &args);
    let err = format!("{taker}.err");
    let named = format!(
        "its write lock is held by process {pid}, which is stopped: `kill -CONT {pid}` lets it go on (or end it)"
    );
    let deadline = began + Duration::from_secs(15);
    while !p.read(&err).contains(&named) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {taker} to say who holds the lock; it said:\n{}",
            p.read(&err)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let said = began.elapsed();
    let out = wait_within(&p, taker, child, PATIENCE + Duration::from_secs(30));
    let ended = began.elapsed();
    out.code(1);
    // Said once while waiting, then as the error.
    assert_eq!(
        out.stderr.matches(&named).count(),
        2,
        "{taker}: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!(
            "warning: warehouse `shop` ({}) is locked: {named}; waiting up to 30s",
            p.path("warehouse.db").display()
        )),
        "{taker}: {}",
        out.stderr
    );
    out.stderr_has(&format!(
        "error: warehouse `shop` ({}) is locked: {named}; gave up after waiting",
        p.path("warehouse.db").display()
    ));
    assert!(
        said < Duration::from_secs(10),
        "{taker} said it after {said:?}"
    );
    assert!(
        ended >= PATIENCE && ended < PATIENCE + Duration::from_secs(15),
        "{taker} gave up after {ended:?}:\n{}",
        out.stderr
    );
    // The publishes are left as they were: decided, not failed.
    assert_eq!(
        p.rows("SELECT DISTINCT state, publishing FROM task_tries WHERE publishing = TRUE OR state = 'failed'"),
        [["running", "1"]],
        "{taker}"
    );
    // Let go, the frozen owner commits its publish and finds itself taken over.
    signal(&frozen, Signal::SIGCONT);
    let thawed = p.wait("frozen", frozen);
    assert_eq!(thawed.code, 130, "{taker}: {}", thawed.stderr);
    p.run(&["resume", "1"]).code(0);
    // Each day succeeded once, and the warehouse holds exactly the source's orders.
    assert_eq!(
        p.rows(
            "SELECT date(interval_start), COUNT(*) FROM report_runs WHERE state = 'succeeded'
             GROUP BY 1 ORDER BY 1"
        ),
        [
            ["2026-09-01", "1"],
            ["2026-09-02", "1"],
            ["2026-09-03", "1"]
        ],
        "{taker}"
    );
    assert_eq!(
        p.count("SELECT COUNT(*) FROM task_tries WHERE state = 'failed' OR publishing = TRUE"),
        0,
        "{taker}"
    );
    assert_eq!(
        wh_rows(
            &p,
            "SELECT order_id, order_day, order_ts, region, amount_cents FROM orders_fact
             ORDER BY order_id"
        ),
        wh_rows(
            &p,
            "SELECT order_id, date(order_ts), order_ts, region, amount_cents FROM raw_orders
             WHERE order_ts >= '2026-09-01' AND order_ts < '2026-09-04' ORDER BY order_id"
        ),
        "{taker}"
    );
}

/// The same with a holder that is not stopped but does nothing with its lock (a transaction
/// left open by another program): given up on after the bound, naming it without `kill -CONT`.
#[test]
#[cfg_attr(
    missing = "python3",
    ignore = "no python3 on PATH: sudo apt-get install python3"
)]
fn a_lock_held_by_an_idle_process_is_given_up_on_naming_it() {
    use std::io::BufRead;
    let p = shop();
    crate::parts::Part::Python3.require();
    let mut holder = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys, time\n\
             c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
             c.execute('PRAGMA journal_mode = WAL')\n\
             c.execute('BEGIN IMMEDIATE')\n\
             print('held', flush=True)\n\
             time.sleep(600)",
        ])
        .arg(p.path("warehouse.db"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "held\n");
    let pid = holder.id();
    let began = Instant::now();
    let child = p.spawn("create", OWNER);
    let out = wait_within(&p, "create", child, PATIENCE + Duration::from_secs(30));
    let ended = began.elapsed();
    let _ = holder.kill();
    let _ = holder.wait();
    // The wait given up is an environment fault: the run stops, its intervals interrupted for
    // `resume`, and nothing is published over the holder.
    out.code(1);
    assert_eq!(
        p.rows("SELECT state, COUNT(*) FROM runs GROUP BY state"),
        [["cancelled", "3"]]
    );
    assert_eq!(
        wh_rows(&p, "SELECT COUNT(*) FROM orders_fact"),
        ["Integer(0)"]
    );
    assert!(
        out.stderr.contains(&format!(
            "its write lock is held by process {pid}; waiting while it works"
        )),
        "{}",
        out.stderr
    );
    out.stderr_has(&format!(
        "its write lock is held by process {pid}, which did nothing with it for 30s; gave up after waiting"
    ));
    assert!(!out.stderr.contains("kill -CONT"), "{}", out.stderr);
    assert!(ended < PATIENCE + Duration::from_secs(20), "{ended:?}");
}

#!/usr/bin/env python3
"""SQL tasks against the bare write: backfill's gated write-audit-publish per partition, side by
side with a plain loop of `BEGIN; DELETE partition; INSERT ... SELECT; COMMIT` per day, on a
generated warehouse (700,000 raw events over 2025, raw indexed on its timestamp, the target
indexed on its partition column, one gated SQL task per day with a unique key and an exact
source count). Each measurement alternates the two, on fresh copies, and reports medians.

    examples/bench/sql.py [--rounds N]        (default 3 rounds)
    examples/bench/sql.py --batch-size N [--enriched] [--rounds N]
    examples/bench/sql.py --small [--batch-size N] [--rounds N]

Targets (exit status 1 when one is missed):
  1. 365 daily partitions into an empty target: backfill <= 1.5x the bare loop
  2. the same again into the full target (--reprocess-behavior completed): <= 1.5x
  3. the last 10% of partitions take at most 1.2x the time of the first 10%
  4. --max-active-runs 4 at least 1.4x faster than --max-active-runs 1
The bare loop keeps no copy of what it replaces, so these run with keep_versions = 0. Also
measured, without a target: what keeping versions for rollback costs (keep_versions = 1, the
default) and what staging costs (`create --stage` then `promote`), against a plain create into
the full target, in time and in bytes.
With --batch-size N it measures instead what batches change: the same 365 partitions at
--max-active-runs 1 with --batch-size N against --batch-size 1, alternated, into the empty and
into the full target, each result checked (every raw event published once); no target. With
--enriched each day's query also joins its events to each customer's current row in a customer
history (the latest of two versions of 100,000 customers, found by a window over the whole
history, which has no index): a fixed cost per query, as a warehouse's per-query overhead.
With --small it measures small partitions instead, as daily aggregates are: 328,500 orders over
2025 (900 a day, indexed on their timestamp) aggregated into 15 rows a day (five regions by three
bands of amount) of a target with PRIMARY KEY (day, region, band), the gate as in the README
(unique_key, a source_count of the distinct groups, a source_fingerprint): backfill against the
bare loop into the empty and the full target at --max-active-runs 1, and the full target at 4;
with --batch-size N, --batch-size N against 1 at --max-active-runs 1. No target: figures.
Wall and CPU seconds come from GNU time (/usr/bin/time). Needs Python 3 and a Rust toolchain.
"""

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NOW = "2026-11-29T12:00:00Z"
DAYS = 365

SCHEMA = """
CREATE TABLE raw_events (
    event_id INTEGER PRIMARY KEY,
    event_ts TEXT    NOT NULL,
    region   TEXT    NOT NULL,
    amount   INTEGER NOT NULL
);
CREATE TABLE events_fact (
    event_id  INTEGER NOT NULL,
    event_day TEXT    NOT NULL,
    event_ts  TEXT    NOT NULL,
    region    TEXT    NOT NULL,
    amount    INTEGER NOT NULL
);
CREATE INDEX events_fact_by_day ON events_fact (event_day);
"""

# 700,000 events spread evenly over 2025, with deterministic pseudo-random fields.
SEED = """
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 699999)
INSERT INTO raw_events (event_id, event_ts, region, amount)
SELECT i,
       datetime(2460676.5 + (i * 365.0 / 700000)),
       CASE (i * 2654435761 % 4294967296) / 858993460
         WHEN 0 THEN 'eu' WHEN 1 THEN 'us' WHEN 2 THEN 'apac' WHEN 3 THEN 'latam' ELSE 'mea' END,
       (i * 40503) % 25000
FROM n;
CREATE INDEX raw_events_by_ts ON raw_events (event_ts);
"""

QUERY = """SELECT event_id, date(event_ts) AS event_day, event_ts, region, amount
FROM raw_events
WHERE event_ts >= :data_interval_start AND event_ts < :data_interval_end"""

DAG = f'''schedule = "@daily"
timezone = "UTC"

[[tasks]]
id = "load"
warehouse = "bench"
target = "events_fact"
partition_column = "event_day"
sql = """
{QUERY}
"""

[tasks.gate]
unique_key = ["event_id"]
source_count = """
SELECT COUNT(*) FROM raw_events
WHERE event_ts >= :data_interval_start AND event_ts < :data_interval_end
"""
'''


CUSTOMERS = 100_000
HISTORY = f"""
CREATE TABLE customer_history (customer_id INTEGER NOT NULL, valid_from TEXT NOT NULL, status TEXT NOT NULL);
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {CUSTOMERS - 1})
INSERT INTO customer_history SELECT i, '2020-01-01', 'trial' FROM n
UNION ALL SELECT i, '2021-01-01', 'active' FROM n;
"""
ENRICHED = f"""SELECT e.event_id, date(e.event_ts) AS event_day, e.event_ts, e.region, e.amount
FROM raw_events e
JOIN (SELECT customer_id, status
      FROM (SELECT customer_id, status,
                   row_number() OVER (PARTITION BY customer_id ORDER BY valid_from DESC) AS n
            FROM customer_history)
      WHERE n = 1) c ON c.customer_id = e.event_id % {CUSTOMERS}
WHERE e.event_ts >= :data_interval_start AND e.event_ts < :data_interval_end AND c.status = 'active'"""
ENRICHED_DAG = DAG.replace(QUERY, ENRICHED)
assert ENRICHED_DAG != DAG


SMALL_SCHEMA = """
CREATE TABLE raw_orders (
    order_id INTEGER PRIMARY KEY,
    order_ts TEXT    NOT NULL,
    region   TEXT    NOT NULL,
    amount   INTEGER NOT NULL
);
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 328499)
INSERT INTO raw_orders (order_id, order_ts, region, amount)
SELECT i,
       datetime(2460676.5 + (i * 96.0 / 86400)),
       CASE (i * 2654435761 % 4294967296) / 858993460
         WHEN 0 THEN 'eu' WHEN 1 THEN 'us' WHEN 2 THEN 'apac' WHEN 3 THEN 'latam' ELSE 'mea' END,
       (i * 40503) % 25000
FROM n;
CREATE INDEX raw_orders_by_ts ON raw_orders (order_ts);
CREATE TABLE orders_daily (
    day    TEXT    NOT NULL,
    region TEXT    NOT NULL,
    band   INTEGER NOT NULL,
    orders INTEGER NOT NULL,
    amount INTEGER NOT NULL,
    PRIMARY KEY (day, region, band)
);
"""

SMALL_QUERY = """SELECT date(order_ts) AS day, region, amount / 10000 AS band, COUNT(*) AS orders,
       SUM(amount) AS amount
FROM raw_orders
WHERE order_ts >= {start} AND order_ts < {end}
GROUP BY 1, 2, 3"""

SMALL_DAG = f'''schedule = "@daily"
timezone = "UTC"

[[tasks]]
id = "daily"
warehouse = "bench"
target = "orders_daily"
partition_column = "day"
sql = """
{SMALL_QUERY.format(start=":data_interval_start", end=":data_interval_end")}
"""

[tasks.gate]
unique_key = ["day", "region", "band"]
source_count = """
SELECT COUNT(*) FROM (
    SELECT DISTINCT region, amount / 10000 FROM raw_orders
    WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end
)
"""
source_fingerprint = """
SELECT COUNT(*) || '/' || SUM(amount) FROM raw_orders
WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end
"""
'''

SMALL_BARE = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
query = sys.argv[2]
for d in range(365):
    conn.execute("BEGIN")
    day = conn.execute("SELECT date('2025-01-01', ?)", (f"+{d} days",)).fetchone()[0]
    nxt = conn.execute("SELECT date('2025-01-01', ?)", (f"+{d + 1} days",)).fetchone()[0]
    conn.execute("DELETE FROM orders_daily WHERE day = ?", (day,))
    conn.execute("INSERT INTO orders_daily " + query, (day + " 00:00:00", nxt + " 00:00:00"))
    conn.execute("COMMIT")
"""


def small(binary, rounds, size):
    """Small partitions: backfill against the bare loop, or --batch-size `size` against 1."""
    work = tempfile.mkdtemp(prefix="backfill-small-bench.")
    try:
        print("generating the warehouse (328,500 orders)...", file=sys.stderr)
        path = os.path.join(work, "template.db")
        conn = sqlite3.connect(path)
        conn.executescript(SMALL_SCHEMA)
        conn.commit()
        conn.execute("PRAGMA journal_mode = WAL")
        conn.close()
        query = SMALL_QUERY.format(start="?", end="?")
        bare_loop = lambda p: timed([sys.executable, "-c", SMALL_BARE, os.path.join(p, "warehouse.db"), query])
        want = (5475, 328500)
        check = lambda p: (count(p, "SELECT COUNT(*) FROM orders_daily"), count(p, "SELECT SUM(orders) FROM orders_daily"))
        wall, cpu = {}, {}

        def record(key, measured):
            wall.setdefault(key, []).append(measured[0])
            cpu.setdefault(key, []).append(measured[1])

        for r in range(rounds):
            print(f"round {r + 1} of {rounds}...", file=sys.stderr)
            if size:
                order = [("one", "1"), ("batch", str(size))]
                if r % 2:
                    order.reverse()
                for label, n in order:
                    p = fresh_project(work, label, path, dag=SMALL_DAG)
                    for target, extra in (("empty", []), ("full", ["--reprocess-behavior", "completed"])):
                        record(f"{label}_{target}", backfill(binary, p, "--max-active-runs", "1", "--batch-size", n, *extra))
                        assert check(p) == want, check(p)
                continue
            b = fresh_project(work, "bare", path, dag=SMALL_DAG)
            record("bare_empty", bare_loop(b))
            p = fresh_project(work, "bf", path, dag=SMALL_DAG)
            record("bf_empty", backfill(binary, p, "--max-active-runs", "1"))
            assert check(p) == want, check(p)
            record("bare_full", bare_loop(b))
            record("bf_full", backfill(binary, p, "--max-active-runs", "1", "--reprocess-behavior", "completed"))
            record("bare_full_4", bare_loop(b))
            record("bf_full_4", backfill(binary, p, "--max-active-runs", "4", "--reprocess-behavior", "completed"))
            assert check(p) == want and check(b) == want, (check(p), check(b))
        med = {k: statistics.median(v) for k, v in wall.items()}
        cmed = {k: statistics.median(v) for k, v in cpu.items()}
        print(f"small partitions (15 rows a day from 900 orders); medians of {rounds} rounds, wall seconds (cpu):")
        pairs = ([(f"into the {t} target, --max-active-runs 1", f"batch_{t}", f"one_{t}") for t in ("empty", "full")]
                 if size else
                 [("into the empty target, --max-active-runs 1", "bf_empty", "bare_empty"),
                  ("into the full target, --max-active-runs 1", "bf_full", "bare_full"),
                  ("into the full target, --max-active-runs 4", "bf_full_4", "bare_full_4")])
        against = f"--batch-size {size} against 1" if size else "backfill against the bare loop"
        print(f"  ({against})")
        for name, a, b in pairs:
            print(f"  {name:<45} {med[a]:6.2f} ({cmed[a]:5.2f})  {med[b]:6.2f} ({cmed[b]:5.2f})  {med[a] / med[b]:5.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build():
    print("building the release binary...", file=sys.stderr)
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--manifest-path", os.path.join(ROOT, "Cargo.toml")],
        check=True,
    )
    return os.path.join(ROOT, "target", "release", "backfill")


def template(work):
    """The generated warehouse, created once."""
    path = os.path.join(work, "template.db")
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    conn.executescript(SEED)
    conn.commit()
    conn.execute("PRAGMA journal_mode = WAL")
    conn.close()
    return path


def fresh_project(work, name, warehouse, keep_versions=0, dag=DAG):
    """A project folder holding a copy of `warehouse` and the DAG, with no manifest."""
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "dags"))
    shutil.copy(warehouse, os.path.join(d, "warehouse.db"))
    with open(os.path.join(d, "backfill.toml"), "w") as f:
        f.write(f'[warehouse.bench]\npath = "warehouse.db"\nkeep_versions = {keep_versions}\n')
    with open(os.path.join(d, "dags", "events.toml"), "w") as f:
        f.write(dag)
    return d


def timed(argv, env=None):
    """Runs a command under GNU time: (wall, cpu) seconds."""
    out = os.path.join(tempfile.gettempdir(), f"bench-time-{os.getpid()}")
    subprocess.run(
        ["/usr/bin/time", "-f", "%e %U %S", "-o", out] + argv,
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall, user, system = open(out).read().split()[-3:]
    return float(wall), float(user) + float(system)


BARE = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
for d in range(365):
    conn.execute("BEGIN")
    day = conn.execute("SELECT date('2025-01-01', ?)", (f"+{d} days",)).fetchone()[0]
    nxt = conn.execute("SELECT date('2025-01-01', ?)", (f"+{d + 1} days",)).fetchone()[0]
    conn.execute("DELETE FROM events_fact WHERE event_day = ?", (day,))
    conn.execute(
        "INSERT INTO events_fact SELECT event_id, date(event_ts), event_ts, region, amount "
        "FROM raw_events WHERE event_ts >= ? AND event_ts < ?",
        (day + " 00:00:00", nxt + " 00:00:00"),
    )
    conn.execute("COMMIT")
"""


def bare(project):
    return timed([sys.executable, "-c", BARE, os.path.join(project, "warehouse.db")])


def backfill(binary, project, *extra):
    env = dict(os.environ, BACKFILL_NOW=NOW)
    argv = [binary, "-C", project, "-q", "create", "--dag", "events", "--from", "2025-01-01",
            "--to", "2025-12-31"] + list(extra)
    return timed(argv, env)


def promote(binary, project, backfill_id):
    return timed([binary, "-C", project, "-q", "promote", str(backfill_id)], dict(os.environ, BACKFILL_NOW=NOW))


def size(path):
    """Bytes of a SQLite file once its write-ahead log is checkpointed into it."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return os.path.getsize(path)


def folder_size(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def partition_times(project):
    """Each try's duration (ms), in interval order."""
    conn = sqlite3.connect(os.path.join(project, ".backfill", "manifest.db"))
    rows = conn.execute(
        "SELECT t.ended_at - t.started_at FROM task_tries t JOIN runs r ON r.id = t.run_id "
        "WHERE r.backfill_id = (SELECT MAX(id) FROM backfills) ORDER BY r.interval_start"
    ).fetchall()
    conn.close()
    return [r[0] for r in rows]


def count(project, sql):
    conn = sqlite3.connect(os.path.join(project, "warehouse.db"))
    n = conn.execute(sql).fetchone()[0]
    conn.close()
    return n


def batches(binary, rounds, size, enriched):
    """--batch-size `size` against --batch-size 1, one at a time, alternated."""
    work = tempfile.mkdtemp(prefix="backfill-batch-bench.")
    try:
        print("generating the warehouse (700,000 raw events)...", file=sys.stderr)
        empty = template(work)
        if enriched:
            conn = sqlite3.connect(empty)
            conn.executescript(HISTORY)
            conn.commit()
            conn.close()
        keys = ("one_empty", "batch_empty", "one_full", "batch_full")
        wall = {k: [] for k in keys}
        cpu = {k: [] for k in keys}
        for r in range(rounds):
            print(f"round {r + 1} of {rounds}...", file=sys.stderr)
            order = [("one", "1"), ("batch", str(size))]
            if r % 2:
                order.reverse()
            for label, n in order:
                p = fresh_project(work, label, empty, dag=ENRICHED_DAG if enriched else DAG)
                for target, extra in (("empty", []), ("full", ["--reprocess-behavior", "completed"])):
                    w, c = backfill(binary, p, "--max-active-runs", "1", "--batch-size", n, *extra)
                    wall[f"{label}_{target}"].append(w)
                    cpu[f"{label}_{target}"].append(c)
                    assert count(p, "SELECT COUNT(*) FROM events_fact") == 700000
                    assert count(p, "SELECT COUNT(DISTINCT event_id) FROM events_fact") == 700000
        med = {k: statistics.median(v) for k, v in wall.items()}
        cmed = {k: statistics.median(v) for k, v in cpu.items()}
        joined = ", each query joined to a customer history read whole" if enriched else ""
        print(f"medians of {rounds} rounds, 365 daily partitions of about 1,918 rows{joined}, --max-active-runs 1:")
        for target in ("empty", "full"):
            one, batch = med[f"one_{target}"], med[f"batch_{target}"]
            print(f"  into the {target} target: --batch-size {size} {batch:.2f} s (cpu {cmed[f'batch_{target}']:.2f} s), "
                  f"--batch-size 1 {one:.2f} s (cpu {cmed[f'one_{target}']:.2f} s): {batch / one:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--enriched", action="store_true",
                        help="with --batch-size: join each query's events to a customer history read whole")
    parser.add_argument("--small", action="store_true",
                        help="small partitions: 900 orders a day aggregated into 15 keyed rows a day")
    args = parser.parse_args()
    binary = build()
    if args.small:
        small(binary, args.rounds, args.batch_size)
        return
    if args.batch_size:
        batches(binary, args.rounds, args.batch_size, args.enriched)
        return
    work = tempfile.mkdtemp(prefix="backfill-sql-bench.")
    try:
        print("generating the warehouse (700,000 raw events)...", file=sys.stderr)
        empty = template(work)
        # A full target: the bare loop's result, also what backfill publishes.
        full = os.path.join(work, "full.db")
        shutil.copy(empty, full)
        bare(fresh_project(work, "fill", empty))
        shutil.copy(os.path.join(work, "fill", "warehouse.db"), full)
        results = {k: [] for k in ("bare_empty", "bf_empty", "bare_full", "bf_full", "bf_empty_1",
                                   "bf_full_keep1", "stage", "promote")}
        sizes = {k: [] for k in ("keep1", "keep0", "staged")}
        cpu = {k: [] for k in results}
        growth = []
        for r in range(args.rounds):
            print(f"round {r + 1} of {args.rounds}...", file=sys.stderr)
            # 1. Into an empty target, alternated.
            w, c = bare(fresh_project(work, "a", empty))
            results["bare_empty"].append(w)
            cpu["bare_empty"].append(c)
            p = fresh_project(work, "b", empty)
            w, c = backfill(binary, p, "--max-active-runs", "4")
            results["bf_empty"].append(w)
            cpu["bf_empty"].append(c)
            assert count(p, "SELECT COUNT(*) FROM events_fact") == 700000
            # 2. Into the full target, everything reprocessed.
            w, c = bare(fresh_project(work, "c", full))
            results["bare_full"].append(w)
            cpu["bare_full"].append(c)
            w, c = backfill(binary, p, "--max-active-runs", "4", "--reprocess-behavior", "completed")
            results["bf_full"].append(w)
            cpu["bf_full"].append(c)
            assert count(p, "SELECT COUNT(*) FROM events_fact") == 700000
            # 3 and 4. One at a time, into an empty target.
            p1 = fresh_project(work, "d", empty)
            w, c = backfill(binary, p1, "--max-active-runs", "1")
            results["bf_empty_1"].append(w)
            cpu["bf_empty_1"].append(c)
            times = partition_times(p1)
            tenth = len(times) // 10
            growth.append(statistics.median(times[-tenth:]) / max(statistics.median(times[:tenth]), 1))
            # What rollback costs: the same full reprocess, keeping one version.
            pk = fresh_project(work, "e", empty, keep_versions=1)
            backfill(binary, pk, "--max-active-runs", "4")
            w, c = backfill(binary, pk, "--max-active-runs", "4", "--reprocess-behavior", "completed")
            results["bf_full_keep1"].append(w)
            cpu["bf_full_keep1"].append(c)
            sizes["keep1"].append(size(os.path.join(pk, "warehouse.db")))
            sizes["keep0"].append(size(os.path.join(p, "warehouse.db")))
            # What review costs: stage the full reprocess, then promote it.
            ps = fresh_project(work, "f", empty)
            backfill(binary, ps, "--max-active-runs", "4")
            w, c = backfill(binary, ps, "--max-active-runs", "4", "--reprocess-behavior", "completed", "--stage")
            results["stage"].append(w)
            cpu["stage"].append(c)
            sizes["staged"].append(folder_size(os.path.join(ps, ".backfill", "audit")))
            w, c = promote(binary, ps, 2)
            results["promote"].append(w)
            cpu["promote"].append(c)
            assert count(ps, "SELECT COUNT(*) FROM events_fact") == 700000
        med = {k: statistics.median(v) for k, v in results.items()}
        cmed = {k: statistics.median(v) for k, v in cpu.items()}
        checks = [
            ("365 partitions into an empty target, --max-active-runs 4",
             med["bf_empty"] / med["bare_empty"], "<=", 1.5,
             f'{med["bf_empty"]:.2f} s (cpu {cmed["bf_empty"]:.2f} s) vs bare {med["bare_empty"]:.2f} s (cpu {cmed["bare_empty"]:.2f} s)'),
            ("the same into the full target, reprocess completed",
             med["bf_full"] / med["bare_full"], "<=", 1.5,
             f'{med["bf_full"]:.2f} s (cpu {cmed["bf_full"]:.2f} s) vs bare {med["bare_full"]:.2f} s (cpu {cmed["bare_full"]:.2f} s)'),
            ("last 10% of partitions / first 10% (median try time)",
             statistics.median(growth), "<=", 1.2, "one at a time, into an empty target"),
            ("--max-active-runs 1 / --max-active-runs 4",
             med["bf_empty_1"] / med["bf_empty"], ">=", 1.4,
             f'{med["bf_empty_1"]:.2f} s (cpu {cmed["bf_empty_1"]:.2f} s) vs {med["bf_empty"]:.2f} s'),
        ]
        print(f"medians of {args.rounds} rounds:")
        missed = 0
        for name, value, op, limit, detail in checks:
            ok = value <= limit if op == "<=" else value >= limit
            missed += not ok
            print(f"  {name:<55} {value:5.2f}x  (target {op} {limit}x: {'ok' if ok else 'MISSED'})  {detail}")
        mib = lambda n: statistics.median(n) / 2**20
        print("what rollback and review cost (full target, reprocess completed, --max-active-runs 4):")
        print(f'  keep_versions = 0                                       {med["bf_full"]:.2f} s, warehouse {mib(sizes["keep0"]):.1f} MiB')
        print(f'  keep_versions = 1 (the default)                         {med["bf_full_keep1"]:.2f} s '
              f'({med["bf_full_keep1"] / med["bf_full"]:.2f}x), warehouse {mib(sizes["keep1"]):.1f} MiB '
              f'(+{mib(sizes["keep1"]) - mib(sizes["keep0"]):.1f} MiB of kept versions)')
        print(f'  --stage, then promote                                   {med["stage"]:.2f} s + {med["promote"]:.2f} s '
              f'({(med["stage"] + med["promote"]) / med["bf_full"]:.2f}x), {mib(sizes["staged"]):.1f} MiB staged while awaiting promotion')
        sys.exit(1 if missed else 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""SQL tasks on a PostgreSQL warehouse against the bare write: backfill's gated write-audit-publish
per partition, side by side with one psql session running `BEGIN; DELETE partition; INSERT ...
SELECT; COMMIT` per day, on a generated warehouse in a throwaway server (730,000 raw events over
2025, 2,000 a day, raw.events indexed on its timestamp, analytics.events_fact indexed on its
partition column and its key; one gated SQL task per day with a unique key and an exact source
count). Each measurement alternates the two and reports medians.

    examples/bench/postgres.py [--rounds N] [--keyed] [--rules] [--setting NAME=VALUE] [--target-dir DIR]
    examples/bench/postgres.py --small [--batch-size N] [--rounds N]
    examples/bench/postgres.py --batch-size N [--unindexed-source | --enriched] [--rounds N] [--keyed]
    examples/bench/postgres.py --merge [--rounds N] [--keyed]
    examples/bench/postgres.py --atomic [--rounds N] [--keyed]
                                                                       (default 3 rounds)

With --keyed the target has PRIMARY KEY (event_id) in place of its plain index on event_id, as
most production tables do: each partition's delete must then be done before its insert starts.
With --small the workload is small partitions instead, as daily aggregates are: 328,500 orders
over 2025 (900 a day, raw.orders indexed on its timestamp) aggregated into 15 rows a day (five
regions by three bands of amount) of analytics.orders_daily, PRIMARY KEY (day, region, band); the
gate as in the README (unique_key, a source_count of the distinct groups, a source_fingerprint).
It runs the three measurements below, or with --batch-size N the batches' measurements.

Targets (exit status 1 when one is missed):
  1. 365 daily partitions into an empty target, --max-active-runs 1: backfill <= 1.5x the bare loop
  2. the same again into the full target (--reprocess-behavior completed): <= 1.5x
  3. the same into the full target with --max-active-runs 4: faster than the bare loop (< 1.0x)
With --rules it measures instead what the gate's rules on values cost: the same backfill with
three rules (not_null on two columns, accepted_values, range) against it without them, alternated,
into the empty and into the full target at --max-active-runs 1; target: <= 1.15x both times.
With --batch-size N it measures instead what batches change: the same backfill with
--batch-size N against --batch-size 1, alternated, into the empty and the full target, at
--max-active-runs 1 and 4; target: N at --max-active-runs 1 takes at most half the time of 1.
It also times the floor under any batch size, alternated with them: one psql transaction that
deletes the year from the target and inserts the year's rows with one statement (no gate, no
measure, no record), into the empty and into the full target.
With --unindexed-source the source has no index on its timestamp, so that each query reads all
of it, as a query on a warehouse without partition pruning does. With --enriched each day's query
also joins its events to each customer's current row in a customer history (the latest of two
versions of 100,000 customers, found by a DISTINCT ON over the whole history, which has no
index): a fixed cost per query that does not grow with the rows it returns, as the per-query
overhead of a warehouse does, while the gate's source count still reads the events by their index.
With --merge it measures instead a rerun of the full target after 1% of the source's rows
changed (every hundredth event, a different hundredth before each run, spread over every day):
the task with write = "merge" against the same task replacing its partitions, alternated, at
--max-active-runs 1, with the WAL each writes (pg_current_wal_lsn before and after) and the
target's rows written (n_tup_ins + n_tup_upd + n_tup_del); and the same with nothing changed.
Target: the merge takes at most half the replace's time with 1% changed.
With --atomic it measures instead what publishing a range at once costs: a rerun of the year staged
(--stage, --max-active-runs 4), then promoted with `promote ID --atomic` (one transaction) against
`promote ID` (one transaction per day, four at a time), alternated, each from a staging of its own;
no target: a figure for the guide.
With --setting NAME=VALUE (repeatable) the throwaway server runs with that setting (ALTER SYSTEM,
then a restart), for both sides: e.g. --setting wal_buffers=16MB.
The bare loop keeps no copy of what it replaces, so backfill runs with keep_versions = 0. Every
backfill run gets a project folder of its own (a fresh manifest, so nothing is skipped), and its
result is checked: as many rows as 2025's raw events, no duplicate event_id (exit 1 otherwise).
Wall seconds and the client's CPU seconds (backfill's, or psql's) come from GNU time
(/usr/bin/time), else from Python's clock and getrusage; the server's CPU seconds are those of its
sessions' processes, as the postmaster counts its ended children (/proc/PID/stat).

Needs Python 3, a Rust toolchain (the release binary is built into CARGO_TARGET_DIR or
--target-dir, default target/), and PostgreSQL's server binaries and psql: PG_BIN, or Debian's
postgresql package (examples/postgres/server.sh starts the server in a folder under /tmp).
"""

import argparse
import datetime
import glob
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SERVER = os.path.join(ROOT, "examples", "postgres", "server.sh")
NOW = "2026-11-29T12:00:00Z"
DAYS = 365
EVENTS = 730_000  # 2,000 a day: one every 43.2 seconds


def source_table(name, key, ts, rows, every):
    """A source table of `rows` rows from 2025-01-01 on, one every `every` seconds, with
    deterministic pseudo-random regions and amounts, indexed on its timestamp."""
    return f"""CREATE TABLE raw.{name} (
    {key} bigint PRIMARY KEY,
    {ts} timestamptz NOT NULL,
    region   text NOT NULL,
    amount   int NOT NULL
);
INSERT INTO raw.{name}
SELECT i,
       timestamptz '2025-01-01 00:00:00+00' + i * interval '{every} seconds',
       (ARRAY['eu', 'us', 'apac', 'latam', 'mea'])[1 + (i * 2654435761 % 4294967296) * 5 / 4294967296],
       (i * 40503) % 25000
FROM generate_series(0::bigint, {rows - 1}) AS i;
CREATE INDEX {name}_by_ts ON raw.{name} ({ts});"""


SCHEMA = f"""
CREATE SCHEMA raw;
CREATE SCHEMA analytics;
{source_table("events", "event_id", "event_ts", EVENTS, 43.2)}
CREATE TABLE analytics.events_fact (
    event_id bigint NOT NULL,
    day      date NOT NULL,
    region   text NOT NULL,
    amount   int NOT NULL
);
CREATE INDEX events_fact_by_day ON analytics.events_fact (day);
{{key}}
VACUUM ANALYZE;
"""
KEYS = {
    False: "CREATE INDEX events_fact_by_id ON analytics.events_fact (event_id);",
    True: "ALTER TABLE analytics.events_fact ADD PRIMARY KEY (event_id);",
}

SELECT = """SELECT event_id, (event_ts AT TIME ZONE 'UTC')::date AS day, region, amount
FROM raw.events
WHERE event_ts >= {start} AND event_ts < {end}"""

CUSTOMERS = 100_000
HISTORY = f"""
CREATE TABLE raw.customer_history (
    customer_id bigint NOT NULL,
    valid_from  date NOT NULL,
    status      text NOT NULL
);
INSERT INTO raw.customer_history
SELECT c, date '2020-01-01' + v * 365, CASE v WHEN 0 THEN 'trial' ELSE 'active' END
FROM generate_series(0::bigint, {CUSTOMERS - 1}) AS c, generate_series(0, 1) AS v;
VACUUM ANALYZE raw.customer_history;
"""

ENRICHED = f"""SELECT e.event_id, (e.event_ts AT TIME ZONE 'UTC')::date AS day, e.region, e.amount
FROM raw.events e
JOIN (SELECT DISTINCT ON (customer_id) customer_id, status
      FROM raw.customer_history
      ORDER BY customer_id, valid_from DESC) c ON c.customer_id = e.event_id % {CUSTOMERS}
WHERE e.event_ts >= {{start}} AND e.event_ts < {{end}} AND c.status = 'active'"""

DAG = f'''schedule = "@daily"
timezone = "UTC"

[[tasks]]
id = "fact"
warehouse = "dw"
target = "analytics.events_fact"
partition_column = "day"
sql = """
{SELECT.format(start=":data_interval_start", end=":data_interval_end")}
"""

[tasks.gate]
unique_key = ["event_id"]
source_count = """
SELECT count(*) FROM raw.events
WHERE event_ts >= :data_interval_start AND event_ts < :data_interval_end
"""
'''

ENRICHED_DAG = DAG.replace(
    SELECT.format(start=":data_interval_start", end=":data_interval_end"),
    ENRICHED.format(start=":data_interval_start", end=":data_interval_end"),
)
assert ENRICHED_DAG != DAG

TARGET = "analytics.events_fact"
COLUMNS = "event_id, day, region, amount"
SMALL = False  # --small: the small-partition workload below instead

# --small: a daily aggregate of 900 orders a day (328,500 over 2025, read through an index on
# their timestamp) into 15 rows a day (five regions by three bands of amount), a keyed target.
ORDERS = 328_500  # one every 96 seconds
SMALL_SCHEMA = f"""
{source_table("orders", "order_id", "order_ts", ORDERS, 96)}
CREATE TABLE analytics.orders_daily (
    day     date NOT NULL,
    region  text NOT NULL,
    band    int NOT NULL,
    orders  bigint NOT NULL,
    amount  bigint NOT NULL,
    PRIMARY KEY (day, region, band)
);
VACUUM ANALYZE;
"""

SMALL_SELECT = """SELECT (order_ts AT TIME ZONE 'UTC')::date AS day, region, amount / 10000 AS band,
       count(*) AS orders, sum(amount) AS amount
FROM raw.orders
WHERE order_ts >= {start} AND order_ts < {end}
GROUP BY 1, 2, 3"""

SMALL_DAG = f'''schedule = "@daily"
timezone = "UTC"

[[tasks]]
id = "daily"
warehouse = "dw"
target = "analytics.orders_daily"
partition_column = "day"
sql = """
{SMALL_SELECT.format(start=":data_interval_start", end=":data_interval_end")}
"""

[tasks.gate]
unique_key = ["day", "region", "band"]
source_count = """
SELECT count(*) FROM (
    SELECT DISTINCT region, amount / 10000 FROM raw.orders
    WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end
) AS bands
"""
source_fingerprint = """
SELECT count(*) || '/' || sum(amount) FROM raw.orders
WHERE order_ts >= :data_interval_start AND order_ts < :data_interval_end
"""
'''


def use_small():
    """Makes the small-partition workload the one measured."""
    global TARGET, COLUMNS, SMALL, SELECT, DAG
    TARGET, COLUMNS, SMALL = "analytics.orders_daily", "day, region, band, orders, amount", True
    SELECT, DAG = SMALL_SELECT, SMALL_DAG


RULES = """not_null = ["event_id", "region"]
accepted_values = { region = ["eu", "us", "apac", "latam", "mea"] }
range = { amount = { min = 0, max = 25000 } }
"""


def build(target_dir):
    print(f"building the release binary into {target_dir}...", file=sys.stderr)
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--manifest-path", os.path.join(ROOT, "Cargo.toml")],
        check=True,
        env=dict(os.environ, CARGO_TARGET_DIR=target_dir),
    )
    return os.path.join(target_dir, "release", "backfill")


def pg_bin():
    """PG_BIN, else the newest of Debian's /usr/lib/postgresql/VERSION/bin (as server.sh picks it)."""
    version = lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version)
    return os.environ.get("PG_BIN") or (found[-1] if found else "")


def start_server(folder):
    """Starts the throwaway server; its URL."""
    out = subprocess.run([SERVER, folder], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"examples/postgres/server.sh failed:\n{out.stderr}")
    for line in out.stdout.splitlines():
        if line.startswith("export BACKFILL_EXAMPLE_PG_URL="):
            return line.split("=", 1)[1].strip()
    sys.exit(f"examples/postgres/server.sh printed no URL:\n{out.stdout}{out.stderr}")


class Warehouse:
    def __init__(self, url, folder):
        self.url = url
        self.postmaster = int(open(os.path.join(folder, "data", "postmaster.pid")).readline())
        psql = os.path.join(pg_bin(), "psql")
        self.psql = [psql if os.access(psql, os.X_OK) else "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url]

    def run(self, sql):
        """Runs statements (each on its own, so VACUUM may be one of them)."""
        if subprocess.run(self.psql + ["-f", "-"], input=sql, text=True, stdout=subprocess.DEVNULL).returncode:
            sys.exit(f"psql failed (its error is above) on:\n{sql.strip()[:300]}")

    def value(self, sql):
        return subprocess.run(self.psql + ["-A", "-t", "-c", sql], text=True, check=True, capture_output=True).stdout.strip()

    def server_cpu(self):
        """CPU seconds of the server's processes that have ended (the postmaster's reaped
        children: a session's backend once it disconnects), once the count is stable."""
        def reaped():
            with open(f"/proc/{self.postmaster}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime
        last = reaped()
        for _ in range(100):
            time.sleep(0.05)
            now = reaped()
            if now == last:
                return now
            last = now
        return last

    def check_small(self, who):
        got = self.value(f"SELECT count(*) || ' ' || sum(orders) FROM {TARGET}")
        want = self.value("SELECT count(DISTINCT ((order_ts AT TIME ZONE 'UTC')::date, region, amount / 10000))"
                          " || ' ' || count(*) FROM raw.orders"
                          " WHERE order_ts >= '2025-01-01 00:00:00+00' AND order_ts < '2026-01-01 00:00:00+00'")
        if got != want:
            sys.exit(f"{who} left a wrong target: {got} (rows, orders), expected {want}")

    def settle_source(self):
        """The raw events as autovacuum leaves a table some time after it was loaded: every page
        marked all-visible, so that counting the source by its index reads no table page. A
        VACUUM right after the load may mark no page, so it is repeated until every page is."""
        for _ in range(100):
            self.run("VACUUM raw.events;" + ("\nVACUUM raw.orders;" if SMALL else ""))
            if self.value("SELECT bool_and(relallvisible >= relpages) FROM pg_class"
                          " WHERE oid IN ('raw.events'::regclass, to_regclass('raw.orders'))") == "t":
                return
            time.sleep(0.1)
        sys.exit("raw.events: VACUUM did not mark its pages all-visible")

    def settle(self):
        """Before a timed run: no dead rows left for autovacuum to pick up mid-run, nothing dirty."""
        self.run(f"VACUUM ANALYZE {TARGET};\nCHECKPOINT;\n")

    def check(self, who):
        if SMALL:
            return self.check_small(who)
        got = self.value("SELECT count(*) || ' ' || count(DISTINCT event_id) FROM analytics.events_fact")
        want = self.value("SELECT count(*) FROM raw.events WHERE event_ts >= '2025-01-01 00:00:00+00' AND event_ts < '2026-01-01 00:00:00+00'")
        rows, distinct = got.split()
        if rows != want or distinct != want:
            sys.exit(f"{who} left a wrong target: {rows} rows ({distinct} distinct event_id), expected {want}")


def timed(argv, env=None, stdin=None):
    """Runs a command: (wall, cpu) seconds, from GNU time when there is one."""
    err = tempfile.TemporaryFile()
    if os.access("/usr/bin/time", os.X_OK):
        with tempfile.NamedTemporaryFile("r") as out:
            proc = subprocess.run(["/usr/bin/time", "-f", "%e %U %S", "-o", out.name] + argv, env=env,
                                  input=stdin, stdout=subprocess.DEVNULL, stderr=err)
            measured = out.read().split()[-3:]
        wall, cpu = (float(measured[0]), float(measured[1]) + float(measured[2])) if len(measured) == 3 else (0, 0)
    else:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=env, input=stdin, stdout=subprocess.DEVNULL, stderr=err)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if proc.returncode != 0:
        err.seek(0)
        sys.exit(f"`{' '.join(argv[:12])} ...` exited with {proc.returncode}:\n{err.read().decode(errors='replace')}")
    return wall, cpu


def bare_script():
    """The bare loop: one transaction per day replacing the day's rows."""
    first = datetime.date(2025, 1, 1)
    parts = []
    for d in range(DAYS):
        day, nxt = first + datetime.timedelta(days=d), first + datetime.timedelta(days=d + 1)
        select = SELECT.format(start=f"'{day} 00:00:00+00'", end=f"'{nxt} 00:00:00+00'")
        parts.append(
            f"BEGIN;\nDELETE FROM {TARGET} WHERE day >= '{day}' AND day < '{nxt}';\n"
            f"INSERT INTO {TARGET} ({COLUMNS})\n{select};\nCOMMIT;\n"
        )
    return "".join(parts).encode()


class Bench:
    def __init__(self, binary, wh, work):
        self.binary, self.wh, self.work, self.runs = binary, wh, work, 0
        self.script = bare_script()

    def project(self, dag=None):
        """A new project folder: a fresh manifest, so no interval is skipped as done. (A new folder
        rather than deleting .backfill: a manifest recreated at the same path numbers its tries from
        1 again, and those try ids are already booked in backfill.publishes, whose primary key is
        (manifest path, try id), so every publish would fail on publishes_pkey.)"""
        self.runs += 1
        d = os.path.join(self.work, f"project-{self.runs}")
        os.makedirs(os.path.join(d, "dags"))
        with open(os.path.join(d, "backfill.toml"), "w") as f:
            f.write(f'[warehouse.dw]\nkind = "postgres"\nurl = "{self.wh.url}?sslmode=disable"\nkeep_versions = 0\n')
        with open(os.path.join(d, "dags", "events.toml"), "w") as f:
            f.write(dag or DAG)
        return d

    def backfill(self, *extra, dag=None):
        self.wh.settle()
        argv = [self.binary, "-C", self.project(dag), "-q", "create", "--dag", "events",
                "--from", "2025-01-01", "--to", "2025-12-31"] + list(extra)
        before = self.wh.server_cpu()
        wall, cpu = timed(argv, dict(os.environ, BACKFILL_NOW=NOW))
        server = self.wh.server_cpu() - before
        self.wh.check(f"backfill {' '.join(extra)}")
        return wall, cpu, server

    def bare(self, script=None):
        self.wh.settle()
        before = self.wh.server_cpu()
        wall, cpu = timed(self.wh.psql + ["-f", "-"], stdin=script or self.script)
        server = self.wh.server_cpu() - before
        self.wh.check("the bare loop")
        return wall, cpu, server


def floor_script(query):
    """The least any batch size can take: the whole year's rows replaced by one statement in one
    transaction, with no gate, no measure and no record."""
    select = query.format(start="'2025-01-01 00:00:00+00'", end="'2026-01-01 00:00:00+00'")
    return (
        f"BEGIN;\nDELETE FROM {TARGET} WHERE day >= '2025-01-01' AND day < '2026-01-01';\n"
        f"INSERT INTO {TARGET} ({COLUMNS})\n{select};\nCOMMIT;\n"
    ).encode()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keyed", action="store_true", help="give the target a primary key (event_id)")
    parser.add_argument("--small", action="store_true",
                        help="the small-partition workload: 900 orders a day aggregated into 15 keyed rows a day")
    parser.add_argument("--rules", action="store_true", help="measure the cost of three rules on values instead")
    parser.add_argument("--batch-size", type=int, help="measure --batch-size N against --batch-size 1 instead")
    parser.add_argument("--unindexed-source", action="store_true",
                        help="drop the source's index on its timestamp: each query then reads all of it, "
                             "as a warehouse without partition pruning does")
    parser.add_argument("--enriched", action="store_true",
                        help="with --batch-size: join each query's events to a customer history read whole, "
                             "a fixed cost per query")
    parser.add_argument("--merge", action="store_true",
                        help="measure a rerun with 1%% of the source changed under write = \"merge\" against replace instead")
    parser.add_argument("--atomic", action="store_true",
                        help="measure promote --atomic of a staged year against promote instead")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="run the server with this setting (ALTER SYSTEM, then a restart); repeatable")
    parser.add_argument("--target-dir", default=os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"),
                        help="cargo's target folder (default: $CARGO_TARGET_DIR, else target/)")
    args = parser.parse_args()
    binary = build(os.path.abspath(args.target_dir))
    if not os.path.isdir(pg_bin()):
        sys.exit("no PostgreSQL server binaries (set PG_BIN or install Debian's postgresql)")
    work = tempfile.mkdtemp(prefix="backfill-pg-bench.")
    server = tempfile.mkdtemp(prefix="backfill-pg-bench-server.", dir="/tmp")  # reachable by `nobody`
    try:
        print("starting a PostgreSQL server...", file=sys.stderr)
        wh = Warehouse(start_server(server), server)
        if args.setting:
            for setting in args.setting:
                name, sep, value = setting.partition("=")
                if not sep or not name.replace("_", "").replace(".", "").isalnum():
                    sys.exit(f"--setting {setting!r}: give NAME=VALUE, e.g. wal_buffers=16MB")
                wh.run(f"ALTER SYSTEM SET {name} = '{value.replace(chr(39), chr(39) * 2)}';")
            subprocess.run([SERVER, "stop", server], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wh = Warehouse(start_server(server), server)
            for setting in args.setting:
                name = setting.partition("=")[0]
                print(f"server setting {name} = {wh.value(f'SHOW {name}')}", file=sys.stderr)
        print(f"generating the warehouse ({EVENTS:,} raw events)...", file=sys.stderr)
        wh.run(SCHEMA.replace("{key}", KEYS[args.keyed]))
        if args.small:
            if args.merge or args.atomic or args.rules or args.enriched or args.unindexed_source:
                sys.exit("--small measures the default runs and --batch-size N only")
            use_small()
            wh.run(SMALL_SCHEMA)
        if args.unindexed_source:
            wh.run("DROP INDEX raw.events_by_ts; ANALYZE raw.events;")
        if args.enriched:
            if not args.batch_size:
                sys.exit("--enriched measures batches: give --batch-size N")
            wh.run(HISTORY)
        wh.settle_source()
        bench = Bench(binary, wh, work)
        if args.rules:
            sys.exit(rules_cost(bench, wh, args))
        if args.batch_size:
            sys.exit(batch_cost(bench, wh, args))
        if args.merge:
            sys.exit(merge_cost(bench, wh, args))
        if args.atomic:
            sys.exit(atomic_cost(bench, wh, binary, args))
        names = ("bf_empty", "bare_empty", "bf_full", "bare_full", "bf_full_4", "bare_full_4")
        wall, cpu, server_cpu = ({k: [] for k in names} for _ in range(3))

        def record(key, measured):
            wall[key].append(measured[0])
            cpu[key].append(measured[1])
            server_cpu[key].append(measured[2])

        for r in range(args.rounds):
            print(f"round {r + 1} of {args.rounds}...", file=sys.stderr)
            # 1. Into an empty target, one interval at a time.
            wh.run(f"TRUNCATE {TARGET};")
            record("bare_empty", bench.bare())
            wh.run(f"TRUNCATE {TARGET};")
            record("bf_empty", bench.backfill("--max-active-runs", "1"))
            # 2. Into the full target, every partition replaced, one at a time.
            record("bare_full", bench.bare())
            record("bf_full", bench.backfill("--reprocess-behavior", "completed", "--max-active-runs", "1"))
            # 3. The same, four at a time.
            record("bare_full_4", bench.bare())
            record("bf_full_4", bench.backfill("--reprocess-behavior", "completed", "--max-active-runs", "4"))
        med = {k: statistics.median(v) for k, v in wall.items()}
        cmed = {k: statistics.median(v) for k, v in cpu.items()}
        smed = {k: statistics.median(v) for k, v in server_cpu.items()}
        rows = [
            ("1. empty target, --max-active-runs 1", "bf_empty", "bare_empty", "<=", 1.5),
            ("2. full target, reprocess completed, -m 1", "bf_full", "bare_full", "<=", 1.5),
            ("3. full target, reprocess completed, -m 4", "bf_full_4", "bare_full_4", "<", 1.0),
        ]
        target = "a target with PRIMARY KEY (event_id)" if args.keyed else "a target without a key"
        if SMALL:
            target = "small partitions (15 rows a day from 900 orders, PRIMARY KEY (day, region, band))"
        print(f"{target}; medians of {args.rounds} round(s), wall seconds (client CPU seconds, server CPU seconds):")
        print(f"  {'measurement':<43} {'backfill':>22} {'bare loop':>22} {'ratio':>7}  target")
        missed = 0
        for name, bf, base, op, limit in rows:
            ratio = med[bf] / med[base]
            ok = ratio <= limit if op == "<=" else ratio < limit
            missed += not ok
            print(f"  {name:<43} {med[bf]:6.2f} ({cmed[bf]:5.2f}, {smed[bf]:5.2f}) "
                  f"{med[base]:6.2f} ({cmed[base]:5.2f}, {smed[base]:5.2f}) "
                  f"{ratio:6.2f}x  {op} {limit}x {'met' if ok else 'MISSED'}")
        sys.exit(1 if missed else 0)
    finally:
        subprocess.run([SERVER, "stop", server], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(server, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def batch_cost(bench, wh, args):
    """The backfill with --batch-size N against --batch-size 1, alternated, at --max-active-runs 1
    and 4; the exit status (target: N at -m 1 takes at most half the time of 1)."""
    size = str(args.batch_size)
    names = [f"{b}_{t}_{m}" for b in ("one", "batch") for t in ("empty", "full") for m in ("1", "4")]
    names += ["floor_empty_1", "floor_full_1"]
    floor = floor_script(ENRICHED if args.enriched else SELECT)
    wall, cpu, server_cpu = ({k: [] for k in names} for _ in range(3))
    for r in range(args.rounds):
        print(f"round {r + 1} of {args.rounds}...", file=sys.stderr)
        order = [("one", "1"), ("batch", size)]
        if r % 2:
            order.reverse()
        for m in ("1", "4"):
            for name, n in order:
                wh.run(f"TRUNCATE {TARGET};")
                for target, extra in (("empty", []), ("full", ["--reprocess-behavior", "completed"])):
                    w, c, sc = bench.backfill("--max-active-runs", m, "--batch-size", n, *extra,
                                              dag=ENRICHED_DAG if args.enriched else DAG)
                    key = f"{name}_{target}_{m}"
                    wall[key].append(w)
                    cpu[key].append(c)
                    server_cpu[key].append(sc)
        # The floor, after the runs at -m 1 it bounds: into the empty target, then the full one.
        wh.run(f"TRUNCATE {TARGET};")
        for target in ("empty", "full"):
            w, c, sc = bench.bare(floor)
            wall[f"floor_{target}_1"].append(w)
            cpu[f"floor_{target}_1"].append(c)
            server_cpu[f"floor_{target}_1"].append(sc)
    med = {k: statistics.median(v) for k, v in wall.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    smed = {k: statistics.median(v) for k, v in server_cpu.items()}
    target = "a target with PRIMARY KEY (event_id)" if args.keyed else "a target without a key"
    if SMALL:
        target = "small partitions (15 rows a day from 900 orders, PRIMARY KEY (day, region, band))"
    if args.unindexed_source:
        target += ", a source without an index on its timestamp"
    if args.enriched:
        target += ", each query joined to a customer history read whole"
    print(f"{target}; medians of {args.rounds} round(s), wall seconds (client CPU seconds, server CPU seconds):")
    print(f"  {'measurement':<34} {'--batch-size ' + size:>24} {'--batch-size 1':>24} {'ratio':>7}  target")
    missed = 0
    for t in ("empty", "full"):
        for m in ("1", "4"):
            b, o = f"batch_{t}_{m}", f"one_{t}_{m}"
            ratio = med[b] / med[o]
            goal = m == "1"
            ok = ratio <= 0.5
            missed += goal and not ok
            verdict = ("met" if ok else "MISSED") if goal else "-"
            print(f"  {t + ' target, --max-active-runs ' + m:<34} {med[b]:7.2f} ({cmed[b]:5.2f}, {smed[b]:5.2f})      "
                  f"{med[o]:7.2f} ({cmed[o]:5.2f}, {smed[o]:5.2f})      {ratio:6.2f}x  {'<= 0.5x ' + verdict if goal else ''}")
    # What no batch size can go under: the year's rows written by one statement, nothing else.
    for t in ("empty", "full"):
        f, o = f"floor_{t}_1", f"one_{t}_1"
        print(f"  {'the floor, ' + t + ' target':<34} {med[f]:7.2f} ({cmed[f]:5.2f}, {smed[f]:5.2f})      "
              f"{med[o]:7.2f} ({cmed[o]:5.2f}, {smed[o]:5.2f})      {med[f] / med[o]:6.2f}x")
    print("  (the floor: one psql transaction that deletes the year and inserts its rows with one statement,"
          " no gate, no record; against --batch-size 1 at --max-active-runs 1)")
    return 1 if missed else 0


MERGE_DAG = DAG.replace('partition_column = "day"\n', 'partition_column = "day"\nwrite = "merge"\n')
assert MERGE_DAG != DAG


def merge_cost(bench, wh, args):
    """A rerun with 1% of the source changed, write = "merge" against replace, alternated; and
    with nothing changed. The exit status (target: merge <= 0.5x replace with 1% changed)."""
    names = [f"{w}_{c}" for w in ("merge", "replace") for c in ("changed", "same")]
    wall, cpu, server_cpu, wal, written = ({k: [] for k in names} for _ in range(5))
    # The full target, as a first backfill leaves it.
    wh.run(f"TRUNCATE {TARGET};")
    bench.backfill("--max-active-runs", "1")
    step = 0

    def change():
        """Every hundredth event changed: a different hundredth each time."""
        nonlocal step
        wh.run(f"UPDATE raw.events SET amount = amount + 1 WHERE event_id % 100 = {step % 100};\n"
               "VACUUM ANALYZE raw.events;")
        step += 1
        wh.settle_source()

    def run(key, dag):
        wh.settle()
        lsn = wh.value("SELECT pg_current_wal_lsn()")
        tuples = wh.value("SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables "
                          "WHERE relid = 'analytics.events_fact'::regclass")
        w, c, sc = bench.backfill("--reprocess-behavior", "completed", "--max-active-runs", "1", dag=dag)
        wal[key].append(int(wh.value(f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{lsn}')::bigint")))
        after = wh.value("SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables "
                         "WHERE relid = 'analytics.events_fact'::regclass")
        written[key].append(int(after) - int(tuples))
        wall[key].append(w)
        cpu[key].append(c)
        server_cpu[key].append(sc)
        mismatch = wh.value(
            "SELECT count(*) FROM (SELECT event_id, region, amount FROM analytics.events_fact "
            "EXCEPT SELECT event_id, region, amount FROM raw.events) d")
        if mismatch != "0":
            sys.exit(f"{key}: {mismatch} rows of the target differ from the source")

    for r in range(args.rounds):
        print(f"round {r + 1} of {args.rounds}...", file=sys.stderr)
        order = [("merge", MERGE_DAG), ("replace", DAG)]
        if r % 2:
            order.reverse()
        for name, dag in order:
            change()
            run(f"{name}_changed", dag)
        for name, dag in order:
            run(f"{name}_same", dag)
    med = lambda d, k: statistics.median(d[k])
    target = "a target with PRIMARY KEY (event_id)" if args.keyed else "a target indexed on event_id"
    print(f"{target}; a rerun of 365 partitions of 2,000 rows at --max-active-runs 1; medians of "
          f"{args.rounds} round(s): wall seconds (client CPU, server CPU), WAL, target rows written")
    print(f"  {'measurement':<28} {'merge':>34} {'replace':>34} {'ratio':>7}  target")
    missed = 0
    for c, label in (("changed", "1% of the rows changed"), ("same", "nothing changed")):
        m, p = f"merge_{c}", f"replace_{c}"
        ratio = med(wall, m) / med(wall, p)
        goal = c == "changed"
        ok = ratio <= 0.5
        missed += goal and not ok
        cell = lambda k: (f"{med(wall, k):6.2f} ({med(cpu, k):4.2f}, {med(server_cpu, k):5.2f}) "
                          f"{med(wal, k) / 1e6:5.1f} MB {int(med(written, k)):>7,}")
        print(f"  {label:<28} {cell(m):>34} {cell(p):>34} {ratio:6.2f}x  "
              f"{('<= 0.5x ' + ('met' if ok else 'MISSED')) if goal else ''}")
    return 1 if missed else 0


def atomic_cost(bench, wh, binary, args):
    """A staged rerun of the year promoted at once (--atomic) against promoted a day at a time,
    alternated, each from a staging of its own. No target: the exit status is 0."""
    wall, cpu, server_cpu = ({k: [] for k in ("atomic", "each")} for _ in range(3))
    wh.run(f"TRUNCATE {TARGET};")
    bench.backfill("--max-active-runs", "1")
    env = dict(os.environ, BACKFILL_NOW=NOW)
    for r in range(args.rounds):
        print(f"round {r + 1} of {args.rounds}...", file=sys.stderr)
        order = ["atomic", "each"] if r % 2 == 0 else ["each", "atomic"]
        for name in order:
            project = bench.project()
            staged = subprocess.run(
                [binary, "-C", project, "-q", "create", "--dag", "events", "--from", "2025-01-01",
                 "--to", "2025-12-31", "--reprocess-behavior", "completed", "--max-active-runs", "4",
                 "--stage"], env=env, capture_output=True, text=True)
            if staged.returncode != 0:
                sys.exit(f"staging exited with {staged.returncode}:\n{staged.stderr}")
            wh.settle()
            before = wh.server_cpu()
            argv = [binary, "-C", project, "-q", "promote", staged.stdout.strip()]
            w, c = timed(argv + (["--atomic"] if name == "atomic" else []), env)
            server_cpu[name].append(wh.server_cpu() - before)
            wall[name].append(w)
            cpu[name].append(c)
            wh.check(f"promote ({name})")
    med = lambda d, k: statistics.median(d[k])
    target = "a target with PRIMARY KEY (event_id)" if args.keyed else "a target indexed on event_id"
    print(f"{target}; a staged rerun of 365 partitions of 2,000 rows, promoted; medians of "
          f"{args.rounds} round(s): wall seconds (client CPU, server CPU)")
    cell = lambda k: f"{med(wall, k):6.2f} ({med(cpu, k):4.2f}, {med(server_cpu, k):5.2f})"
    print(f"  promote --atomic (one transaction)   {cell('atomic')}")
    print(f"  promote (a transaction per day, -m 4) {cell('each')}")
    print(f"  ratio {med(wall, 'atomic') / med(wall, 'each'):.2f}x")
    return 0


def rules_cost(bench, wh, args):
    """The backfill with three rules on values against it without them; the exit status."""
    with_rules = DAG + RULES
    names = ("plain_empty", "rules_empty", "plain_full", "rules_full")
    wall = {k: [] for k in names}
    for r in range(args.rounds):
        print(f"round {r + 1} of {args.rounds}...", file=sys.stderr)
        # Alternated, and the first of each pair swapped every round.
        order = [("plain", DAG), ("rules", with_rules)]
        if r % 2:
            order.reverse()
        for name, dag in order:
            wh.run(f"TRUNCATE {TARGET};")
            wall[f"{name}_empty"].append(bench.backfill("--max-active-runs", "1", dag=dag)[0])
        for name, dag in order:
            wall[f"{name}_full"].append(
                bench.backfill("--reprocess-behavior", "completed", "--max-active-runs", "1", dag=dag)[0]
            )
    med = {k: statistics.median(v) for k, v in wall.items()}
    target = "a target with PRIMARY KEY (event_id)" if args.keyed else "a target without a key"
    print(f"{target}; three rules on values; medians of {args.rounds} round(s), wall seconds:")
    print(f"  {'measurement':<43} {'rules':>7} {'none':>7} {'ratio':>7}  target")
    missed = 0
    for name, key in (("1. empty target, --max-active-runs 1", "empty"), ("2. full target, reprocess completed, -m 1", "full")):
        ratio = med[f"rules_{key}"] / med[f"plain_{key}"]
        ok = ratio <= 1.15
        missed += not ok
        print(f"  {name:<43} {med[f'rules_{key}']:7.2f} {med[f'plain_{key}']:7.2f} {ratio:6.2f}x  <= 1.15x {'met' if ok else 'MISSED'}")
    return 1 if missed else 0


if __name__ == "__main__":
    main()

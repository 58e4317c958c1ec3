#!/usr/bin/env python3
"""How fast `backfill serve` answers on a large manifest: one backfill of 100,000 hourly no-op
intervals (a SQLite manifest made by a real run at --max-active-runs 8), then each page, JSON
document and /metrics requested in turn, alternated, with the median time per request as the
client sees it (connection, request, the whole answer). Then N requests for the backfill's page
at once: how long they take together, how long /metrics takes meanwhile, and the server's peak
memory (VmHWM).

    examples/bench/serve.py [--intervals N] [--rounds N] [--at-once N]   (default 100,000, 5, 40)

Needs Python 3 and a Rust toolchain (the release binary is built into CARGO_TARGET_DIR, default
target/).
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime, timedelta, timezone

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DAG = """schedule = "@hourly"
timezone = "UTC"
[[tasks]]
id = "noop"
command = "true"
"""


def build():
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    print("building the release binary...", file=sys.stderr)
    subprocess.run(["cargo", "build", "--release", "--quiet", "--manifest-path", os.path.join(ROOT, "Cargo.toml")],
                   check=True)
    return os.path.join(target, "release", "backfill")


def at_once(base, pid, n):
    """N requests for /backfills/1 at once, /metrics among them, and the server's peak memory."""
    def page():
        with urllib.request.urlopen(base + "/backfills/1", timeout=600) as r:
            r.read()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=page) for _ in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    m0 = time.perf_counter()
    with urllib.request.urlopen(base + "/metrics", timeout=600) as r:
        r.read()
    metrics = time.perf_counter() - m0
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    with open(f"/proc/{pid}/status") as f:
        peak = int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) // 1024
    print(f"{n} requests for /backfills/1 at once: {wall:.2f} s in all; /metrics meanwhile "
          f"{metrics * 1000:.0f} ms; the server's peak memory {peak} MB")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intervals", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--at-once", type=int, default=40)
    args = parser.parse_args()
    binary = build()
    work = tempfile.mkdtemp(prefix="backfill-serve-bench.")
    server = None
    try:
        os.makedirs(os.path.join(work, "dags"))
        with open(os.path.join(work, "backfill.toml"), "w") as f:
            f.write("")
        with open(os.path.join(work, "dags", "noop.toml"), "w") as f:
            f.write(DAG)
        first = datetime(2010, 1, 1, tzinfo=timezone.utc)
        last = first + timedelta(hours=args.intervals - 1)
        print(f"running {args.intervals:,} hourly no-op intervals...", file=sys.stderr)
        t0 = time.perf_counter()
        subprocess.run([binary, "-C", work, "-q", "create", "--dag", "noop",
                        "--from", first.strftime("%Y-%m-%dT%H:%M"), "--to", last.strftime("%Y-%m-%dT%H:%M"),
                        "--max-active-runs", "8"], check=True)
        print(f"  took {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        server = subprocess.Popen([binary, "-C", work, "serve", "--listen", "127.0.0.1:0"],
                                  stderr=subprocess.PIPE, text=True)
        line = server.stderr.readline()
        base = "http://" + line.split("at http://", 1)[1].split("/", 1)[0]
        middle = first + timedelta(hours=args.intervals // 2)
        paths = [
            "/", "/backfills/1", f"/backfills/1?page={args.intervals // 2000}",
            f"/backfills/1/intervals/{middle.strftime('%Y-%m-%dT%H:%M:%SZ')}",
            "/dags/noop", "/pools", "/api/backfills", "/api/backfills/1", "/metrics",
        ]
        times = {p: [] for p in paths}
        sizes = {}
        for _ in range(args.rounds):
            for p in paths:
                t0 = time.perf_counter()
                with urllib.request.urlopen(base + p) as r:
                    body = r.read()
                    assert r.status == 200, (p, r.status)
                times[p].append(time.perf_counter() - t0)
                sizes[p] = len(body)
        print(f"one backfill of {args.intervals:,} intervals; median of {args.rounds} requests each:")
        for p in paths:
            print(f"  {p:<48} {statistics.median(times[p]) * 1000:8.1f} ms  {sizes[p]:>10,} bytes")
        at_once(base, server.pid, args.at_once)
    finally:
        if server:
            server.terminate()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

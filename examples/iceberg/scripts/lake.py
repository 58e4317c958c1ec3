"""The example's lake: a pyiceberg SQL catalog named `local` in catalog.db, data under lake/.

Shared by the task scripts: opening the catalog, creating `raw.events` (deterministic, several
thousand events a day for 2026) and `analytics.events_clean` on first use, the audit branch of
a run, reading one day of a snapshot, the order-independent fingerprint, and retrying commits
that the catalog refuses because another commit landed first.
"""

import datetime as dt
import fcntl
import hashlib
import json
import os
import random
import sys
import time
import warnings
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DateType, LongType, NestedField, StringType, TimestamptzType

ROOT = Path(__file__).resolve().parent.parent
RAW = "raw.events"
CLEAN = "analytics.events_clean"
UTC = dt.timezone.utc

# An overwrite of a day that has no rows yet says so; that is expected here.
warnings.filterwarnings("ignore", message="Delete operation did not match any records")

RAW_SCHEMA = Schema(
    NestedField(1, "event_id", LongType(), required=False),
    NestedField(2, "event_ts", TimestamptzType(), required=False),
    NestedField(3, "user_id", LongType(), required=False),
    NestedField(4, "event_type", StringType(), required=False),
    NestedField(5, "country", StringType(), required=False),
)
CLEAN_SCHEMA = Schema(
    NestedField(1, "event_id", LongType(), required=False),
    NestedField(2, "day", DateType(), required=False),
    NestedField(3, "event_ts", TimestamptzType(), required=False),
    NestedField(4, "user_id", LongType(), required=False),
    NestedField(5, "event_type", StringType(), required=False),
    NestedField(6, "country", StringType(), required=False),
)
CLEAN_ARROW = pa.schema(
    [
        ("event_id", pa.int64()),
        ("day", pa.date32()),
        ("event_ts", pa.timestamp("us", tz="UTC")),
        ("user_id", pa.int64()),
        ("event_type", pa.string()),
        ("country", pa.string()),
    ]
)
RAW_ARROW = pa.schema([f for f in CLEAN_ARROW if f.name != "day"])

TYPES = [" Click", "view", "VIEW ", "purchase", "Signup", "click "]
COUNTRIES = ["de", "FR", "us", None, "jp", "BR", "in"]


def log(message):
    """A line for the try's log, on stderr: stdout is for what a script reports."""
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def catalog():
    (ROOT / "lake").mkdir(exist_ok=True)
    return SqlCatalog(
        "local",
        uri=f"sqlite:///{ROOT / 'catalog.db'}",
        warehouse=f"file://{ROOT / 'lake'}",
    )


def events_per_day(day):
    """How many raw events a day of 2026 has: between 2,000 and 3,999, the same on every run."""
    return 2000 + (day.toordinal() * 7919) % 2000


def raw_day(day, first_id):
    """The raw events of one day: deterministic ids, times, users, messy types and countries."""
    n = events_per_day(day)
    start = int(dt.datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()) * 1_000_000
    ids = list(range(first_id, first_id + n))
    return pa.table(
        {
            "event_id": pa.array(ids, pa.int64()),
            "event_ts": pa.array(
                [start + (i * 48271 % 86_400) * 1_000_000 + i % 1000 for i in ids],
                pa.timestamp("us", tz="UTC"),
            ),
            "user_id": pa.array([i * 31 % 5003 for i in ids], pa.int64()),
            "event_type": pa.array([TYPES[i % len(TYPES)] for i in ids], pa.string()),
            "country": pa.array([COUNTRIES[i * 3 % len(COUNTRIES)] for i in ids], pa.string()),
        },
        schema=RAW_ARROW,
    )


def ensure_tables(cat):
    """Creates raw.events (with every event of 2026) and analytics.events_clean on first use.
    Several tries may start at once on a new lake: they take turns on a lock file."""
    try:
        return cat.load_table(RAW), cat.load_table(CLEAN)
    except NoSuchTableError:
        pass
    with open(ROOT / "lake" / ".create.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for ns in ("raw", "analytics"):
            cat.create_namespace_if_not_exists(ns)
        try:
            raw = cat.load_table(RAW)
        except NoSuchTableError:
            started = time.monotonic()
            # One data file per month: a day's scan reads only its month's file.
            tx = cat.create_table_transaction(RAW, RAW_SCHEMA)
            first_id, day = 1, dt.date(2026, 1, 1)
            while day.year == 2026:
                month = []
                for_month = day.month
                while day.year == 2026 and day.month == for_month:
                    month.append(raw_day(day, first_id))
                    first_id += events_per_day(day)
                    day += dt.timedelta(days=1)
                tx.append(pa.concat_tables(month))
            tx.commit_transaction()
            raw = cat.load_table(RAW)
            log(f"created {RAW}: {first_id - 1} events of 2026 in {time.monotonic() - started:.1f}s")
        try:
            clean = cat.load_table(CLEAN)
        except NoSuchTableError:
            tx = cat.create_table_transaction(
                CLEAN,
                CLEAN_SCHEMA,
                partition_spec=PartitionSpec(
                    PartitionField(2, 1000, IdentityTransform(), "day")
                ),
                # Conflicts reach the scripts, which reload and retry them with backoff.
                properties={"commit.retry.num-retries": "0"},
            )
            # An empty first snapshot on main: branches start from a snapshot.
            tx.append(CLEAN_ARROW.empty_table())
            tx.commit_transaction()
            clean = cat.load_table(CLEAN)
            log(f"created {CLEAN}, partitioned by day")
        return raw, clean


def interval():
    """The try's data interval [start, end) and its day, from backfill's environment."""
    start = dt.datetime.fromisoformat(os.environ["BACKFILL_DATA_INTERVAL_START"].replace("Z", "+00:00"))
    end = dt.datetime.fromisoformat(os.environ["BACKFILL_DATA_INTERVAL_END"].replace("Z", "+00:00"))
    return start, end, dt.date.fromisoformat(os.environ["BACKFILL_DS"])


def in_interval(start, end):
    return And(
        GreaterThanOrEqual("event_ts", start.isoformat()),
        LessThan("event_ts", end.isoformat()),
    )


def branch_names():
    """The audit branch of this run, named after it: `audit-DAY-runN`, or `staged-DAY-runN` for
    an output that waits for `backfill promote`. A retry of the run reuses its branch."""
    day = os.environ["BACKFILL_DS_NODASH"]
    run = os.environ["BACKFILL_RUN_ID"]
    return f"audit-{day}-run{run}", f"staged-{day}-run{run}"


def day_rows(table, snapshot_id, day):
    """The rows of one day of `table` as of a snapshot (none without one)."""
    if snapshot_id is None:
        return CLEAN_ARROW.empty_table()
    return table.scan(row_filter=EqualTo("day", day.isoformat()), snapshot_id=snapshot_id).to_arrow()


def fingerprint(rows):
    """Order-independent: the wrapping sum of a 64-bit hash of each row's values."""
    total = 0
    columns = [rows.column(name).to_pylist() for name in CLEAN_ARROW.names]
    for values in zip(*columns):
        digest = hashlib.blake2b(repr(values).encode(), digest_size=8).digest()
        total = (total + int.from_bytes(digest, "big")) % (1 << 64)
    return f"{total:016x}"


def retrying(what, attempt, deadline_s=60):
    """Runs `attempt` until it commits. A commit the catalog refuses because another commit
    landed first is retried after reloading (inside `attempt`), with exponential backoff and
    jitter; it is never taken for a success."""
    delay, started, conflicts = 0.05, time.monotonic(), 0
    while True:
        try:
            return attempt()
        except (CommitFailedException, ValueError) as e:
            # The SQL catalog applies a commit to the table as it is at commit time: a snapshot
            # built on metadata that another commit has since advanced is refused with a
            # ValueError about its sequence number. That is a conflict too.
            if isinstance(e, ValueError) and "sequence number" not in str(e):
                raise
            conflicts += 1
            if time.monotonic() - started > deadline_s:
                raise
            wait = delay * (1 + random.random())
            log(f"commit conflict #{conflicts} on {what}: {str(e).splitlines()[0]}; reloading, retrying in {wait * 1000:.0f} ms")
            time.sleep(wait)
            delay = min(delay * 2, 2.0)


def refs(table):
    return dict(table.metadata.refs)


def write_result(data):
    path = os.environ.get("BACKFILL_RESULT")
    if path:
        Path(path).write_text(json.dumps(data))


def main_guard(fn):
    try:
        fn()
    except KeyboardInterrupt:
        sys.exit(130)

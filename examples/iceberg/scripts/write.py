"""The task `clean`: writes one day of analytics.events_clean to the run's audit branch.

Reads the raw events of the data interval from raw.events, cleans them (one row per raw event,
with its day, the event type trimmed and lower-cased, the country upper-cased or `??`), and
replaces the day on the branch with an overwrite filtered to that day: a day whose source is
empty becomes empty (a dynamic overwrite would keep the stale rows). Then it reads the day
back from the branch and reports rows, partitions, inputs and a fingerprint in
$BACKFILL_RESULT for the gate. `main` is not touched: `publish.py` moves it.

Under `backfill verify` ($BACKFILL_VERIFY) it only computes and reports, writing nothing.
"""

import os
import sys

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import EqualTo

import lake


def clean(raw, day):
    n = raw.num_rows
    return pa.table(
        {
            "event_id": raw["event_id"],
            "day": pa.array([day] * n, pa.date32()),
            "event_ts": raw["event_ts"],
            "user_id": raw["user_id"],
            "event_type": pc.utf8_lower(pc.utf8_trim_whitespace(raw["event_type"])),
            "country": pc.fill_null(pc.utf8_upper(raw["country"]), "??"),
        },
        schema=lake.CLEAN_ARROW,
    )


def sweep(cat, day_nodash, mine):
    """Removes audit branches of this day left by earlier runs whose backfill was killed (a
    try that ends in its backfill removes its own branch). Only one run of a day runs at a
    time, so any other `audit-DAY-run*` branch is such a leftover; staged outputs are
    `staged-*` branches and wait for promote or discard."""
    def attempt():
        t = cat.load_table(lake.CLEAN)
        stale = [r for r in lake.refs(t) if r.startswith(f"audit-{day_nodash}-run") and r != mine]
        if stale:
            ms = t.manage_snapshots()
            for name in stale:
                ms = ms.remove_branch(name)
            ms.commit()
            lake.log(f"removed branches left by killed runs: {', '.join(stale)}")
    lake.retrying("removing leftover branches", attempt)


def main():
    start, end, day = lake.interval()
    cat = lake.catalog()
    raw_table, _ = lake.ensure_tables(cat)
    raw_snapshot = raw_table.current_snapshot()
    raw = raw_table.scan(row_filter=lake.in_interval(start, end)).to_arrow()
    rows = clean(raw, day)
    inputs = [{"table": lake.RAW, "snapshot_id": raw_snapshot.snapshot_id if raw_snapshot else None}]
    result = {"partitions": [day.isoformat()], "inputs": inputs}
    if os.environ.get("BACKFILL_VERIFY"):
        result.update(rows=rows.num_rows, fingerprint=lake.fingerprint(rows))
        lake.write_result(result)
        lake.log(f"{day}: {rows.num_rows} rows computed (verify: nothing written)")
        return
    audit, staged = lake.branch_names()
    branch = staged if os.environ.get("BACKFILL_STAGE") else audit
    sweep(cat, os.environ["BACKFILL_DS_NODASH"], audit)

    def attempt():
        # Reload on every attempt: the branch starts at main as it is now.
        t = cat.load_table(lake.CLEAN)
        main_snapshot = t.metadata.snapshot_by_name("main")
        ms = t.manage_snapshots()
        if branch in t.metadata.refs:
            ms = ms.remove_branch(branch)  # an earlier try of this run
        if main_snapshot is not None:
            ms = ms.create_branch(main_snapshot.snapshot_id, branch)
        ms.commit()
        return main_snapshot

    base = lake.retrying(f"creating branch {branch}", attempt)

    def overwrite():
        t = cat.load_table(lake.CLEAN)
        t.overwrite(rows, overwrite_filter=EqualTo("day", day.isoformat()), branch=branch)
        return t

    table = lake.retrying(f"writing {day} to branch {branch}", overwrite)
    table = cat.load_table(lake.CLEAN)
    head = table.metadata.snapshot_by_name(branch)
    written = lake.day_rows(table, head.snapshot_id if head else None, day)
    ids = written["event_id"]
    if pc.count_distinct(ids).as_py() != written.num_rows:
        sys.exit(f"{day}: the branch holds duplicate event ids")
    result.update(rows=written.num_rows, fingerprint=lake.fingerprint(written))
    result["inputs"].append({"table": lake.CLEAN, "branch": branch, "base": base.snapshot_id if base else None,
                             "snapshot_id": head.snapshot_id if head else None})
    lake.write_result(result)
    lake.log(f"{day}: wrote {written.num_rows} rows to branch {branch} (snapshot {head.snapshot_id if head else None})")


if __name__ == "__main__":
    lake.main_guard(main)

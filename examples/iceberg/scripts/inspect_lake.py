"""Prints what the lake holds, as JSON: the refs of analytics.events_clean, and per day of
--from..--to (inclusive) the raw events, the rows on `main`, and its distinct event ids.

    python3 scripts/inspect_lake.py --from 2026-01-01 --to 2026-01-07
"""

import argparse
import datetime as dt
import json

import pyarrow.compute as pc
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThanOrEqual

import lake


def main():
    args = argparse.ArgumentParser()
    args.add_argument("--from", dest="first", required=True)
    args.add_argument("--to", dest="last", required=True)
    a = args.parse_args()
    first, last = dt.date.fromisoformat(a.first), dt.date.fromisoformat(a.last)
    raw, clean = lake.ensure_tables(lake.catalog())
    start = dt.datetime(first.year, first.month, first.day, tzinfo=lake.UTC)
    end = dt.datetime(last.year, last.month, last.day, tzinfo=lake.UTC) + dt.timedelta(days=1)
    raw_rows = raw.scan(row_filter=lake.in_interval(start, end), selected_fields=("event_id", "event_ts")).to_arrow()
    main_snapshot = clean.metadata.snapshot_by_name("main")
    clean_rows = clean.scan(
        row_filter=And(GreaterThanOrEqual("day", first.isoformat()), LessThanOrEqual("day", last.isoformat())),
        snapshot_id=main_snapshot.snapshot_id,
    ).to_arrow()
    raw_days = pc.strftime(raw_rows["event_ts"], format="%Y-%m-%d").to_pylist()
    raw_ids = raw_rows["event_id"].to_pylist()
    days = {}
    day = first
    while day <= last:
        days[day.isoformat()] = {"raw": 0, "main": 0, "main_distinct_ids": 0, "same_ids": False}
        day += dt.timedelta(days=1)
    raw_by_day = {}
    for d, i in zip(raw_days, raw_ids):
        raw_by_day.setdefault(d, set()).add(i)
        days[d]["raw"] += 1
    clean_by_day = {}
    for d, i in zip(clean_rows["day"].to_pylist(), clean_rows["event_id"].to_pylist()):
        clean_by_day.setdefault(d.isoformat(), []).append(i)
    for d, ids in clean_by_day.items():
        days[d]["main"] = len(ids)
        days[d]["main_distinct_ids"] = len(set(ids))
    for d in days:
        days[d]["same_ids"] = raw_by_day.get(d, set()) == set(clean_by_day.get(d, []))
    print(json.dumps({
        "refs": {name: ref.snapshot_id for name, ref in clean.metadata.refs.items()},
        "main": main_snapshot.snapshot_id,
        "days": days,
    }, indent=1))


if __name__ == "__main__":
    lake.main_guard(main)

"""Deletes the raw events of one day from raw.events, as a source that lost a day would:

    python3 scripts/vanish.py 2026-01-02
"""

import datetime as dt
import sys

import lake


def main():
    day = dt.date.fromisoformat(sys.argv[1])
    start = dt.datetime(day.year, day.month, day.day, tzinfo=lake.UTC)
    cat = lake.catalog()
    lake.ensure_tables(cat)
    lake.retrying(f"deleting the raw events of {day}",
                  lambda: cat.load_table(lake.RAW).delete(lake.in_interval(start, start + dt.timedelta(days=1))))
    lake.log(f"deleted the raw events of {day}")


if __name__ == "__main__":
    lake.main_guard(main)

"""The gate's `source_count` of the task `clean`: how many raw events of the data interval
raw.events holds now."""

import lake


def main():
    start, end, _ = lake.interval()
    raw, _ = lake.ensure_tables(lake.catalog())
    rows = raw.scan(row_filter=lake.in_interval(start, end), selected_fields=("event_id",)).to_arrow()
    print(rows.num_rows)


if __name__ == "__main__":
    lake.main_guard(main)

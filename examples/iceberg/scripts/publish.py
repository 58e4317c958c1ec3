"""`publish` of the task `clean`: moves `main` of analytics.events_clean to the audited snapshot.

Runs only after backfill's gate passed (and, for a staged output, from `backfill promote`, with
the staged try's run id and result file). Each attempt reloads the table and:

- if `main`'s current snapshot is an ancestor of the branch head (main has not moved since the
  branch was written, or only along it), moves `main` to the branch head and removes the branch
  in one catalog commit, which asserts that `main` is still where it was read;
- otherwise (another day was published meanwhile) rebases: in one commit, restarts the branch
  at the new `main` and writes the audited day there again, then tries again. Before `main`
  moves, the branch head must hold the audited day: its rows and fingerprint are those the
  gate judged (from $BACKFILL_RESULT).

A commit the catalog refuses because another one landed first is reloaded and retried with
backoff, never taken for a success. If the branch is gone and `main` already holds the audited
day, an earlier attempt committed: nothing is left to do.
"""

import json
import os
import sys
import time
from pathlib import Path

from pyiceberg.expressions import EqualTo
from pyiceberg.table.update.snapshot import ManageSnapshots

import lake


def ancestors(table, snapshot):
    seen = set()
    while snapshot is not None:
        seen.add(snapshot.snapshot_id)
        parent = snapshot.parent_snapshot_id
        snapshot = table.metadata.snapshot_by_id(parent) if parent is not None else None
    return seen


def barrier():
    """A test hook: LAKE_TEST_PUBLISH_BARRIER=DIR:N holds the first N publishes until all N
    have read `main`, so that their commits race deterministically."""
    spec = os.environ.get("LAKE_TEST_PUBLISH_BARRIER")
    if not spec:
        return
    folder, n = spec.rsplit(":", 1)
    Path(folder).mkdir(parents=True, exist_ok=True)
    Path(folder, os.environ["BACKFILL_RUN_ID"]).touch()
    deadline = time.monotonic() + 30
    while len(list(Path(folder).iterdir())) < int(n) and time.monotonic() < deadline:
        time.sleep(0.02)


def pause(at):
    """A test hook: LAKE_TEST_PAUSE=DAY:POINT:FILE stops the publish of DAY at POINT
    (`before-commit` or `after-commit`) and writes FILE, so that a test can kill -9 the
    backfill there."""
    spec = os.environ.get("LAKE_TEST_PAUSE")
    if not spec:
        return
    day, point, marker = spec.split(":", 2)
    if day == os.environ["BACKFILL_DS"] and point == at:
        Path(marker).write_text(str(os.getpid()))
        lake.log(f"paused {at}")
        while True:
            time.sleep(1)


def main():
    start, end, day = lake.interval()
    audited = json.loads(Path(os.environ["BACKFILL_RESULT"]).read_text())
    audit, staged = lake.branch_names()
    cat = lake.catalog()
    t = cat.load_table(lake.CLEAN)
    branch = staged if staged in t.metadata.refs else audit

    def matches(rows):
        return rows.num_rows == audited["rows"] and lake.fingerprint(rows) == audited["fingerprint"]

    # The audited day, read once: a rebase writes it again on top of the new main.
    head = t.metadata.snapshot_by_name(branch)
    if head is None:
        main_snapshot = t.metadata.snapshot_by_name("main")
        if matches(lake.day_rows(t, main_snapshot.snapshot_id, day)):
            lake.log(f"{day}: branch {branch} is gone and main holds the audited day: already published")
            return
        sys.exit(f"{day}: branch {branch} is gone and main does not hold the audited day; run the interval again")
    audited_rows = lake.day_rows(t, head.snapshot_id, day)
    if not matches(audited_rows):
        sys.exit(f"{day}: branch {branch} does not hold the audited day ({audited_rows.num_rows} rows, audited {audited['rows']}); run the interval again")
    checked = {head.snapshot_id}
    first = [True]

    def attempt():
        t = cat.load_table(lake.CLEAN)
        head = t.metadata.snapshot_by_name(branch)
        main_snapshot = t.metadata.snapshot_by_name("main")
        if first[0]:
            first[0] = False
            barrier()
        if head.snapshot_id not in checked and matches(lake.day_rows(t, head.snapshot_id, day)):
            checked.add(head.snapshot_id)
        if head.snapshot_id in checked and main_snapshot.snapshot_id in ancestors(t, head):
            pause("before-commit")
            # One commit: main moves to the branch head (asserting that main is still where it
            # was read) and the branch goes.
            t.manage_snapshots().set_current_snapshot(snapshot_id=head.snapshot_id).remove_branch(branch).commit()
            lake.log(f"{day}: main moved to snapshot {head.snapshot_id}; branch {branch} removed")
            pause("after-commit")
            return "done"
        # main moved past the branch's base: in one commit, the branch restarts at main and the
        # audited day is written on it again.
        lake.log(f"{day}: main is at {main_snapshot.snapshot_id}, not an ancestor of {head.snapshot_id}; rebasing")
        tx = t.transaction()
        ManageSnapshots(tx).remove_branch(branch).create_branch(main_snapshot.snapshot_id, branch).commit()
        tx.overwrite(audited_rows, overwrite_filter=EqualTo("day", day.isoformat()), branch=branch)
        tx.commit_transaction()
        return "rebased"

    while lake.retrying(f"publishing {day}", attempt) != "done":
        pass


if __name__ == "__main__":
    lake.main_guard(main)

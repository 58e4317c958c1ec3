"""`cleanup` of the task `clean`: removes the run's branch when its output will not be
published (backfill's gate rejected it, the try failed or was cancelled, or `backfill discard`
dropped the staged output). Removing a branch that is gone already is not an error."""

import os

import lake


def main():
    audit, staged = lake.branch_names()
    cat = lake.catalog()

    def attempt():
        t = cat.load_table(lake.CLEAN)
        gone = [b for b in (audit, staged) if b in t.metadata.refs]
        if gone:
            ms = t.manage_snapshots()
            for b in gone:
                ms = ms.remove_branch(b)
            ms.commit()
        return gone

    gone = lake.retrying("removing the branch", attempt)
    why = os.environ.get("BACKFILL_CLEANUP", "?")
    lake.log(f"{why}: removed {', '.join(gone) if gone else 'nothing (no branch left)'}")


if __name__ == "__main__":
    lake.main_guard(main)

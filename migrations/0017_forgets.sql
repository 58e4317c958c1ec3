-- `backfill forget` (docs/forget.md): each removal of a DAG's history, recorded. The rows it
-- removed are gone; this row says what went, when and by whom, and holds the largest ids the
-- manifest had given by then: SQLite gives a new row the largest id of its table plus one, so
-- without them the ids of removed rows would be given again, and a log file, a kept version or
-- a warehouse's booking would name two tries, and a worker's fence two workers.
CREATE TABLE forgets (
    id             INTEGER PRIMARY KEY,
    dag_id         TEXT    NOT NULL,
    from_arg       TEXT,
    to_arg         TEXT,
    range_start    INTEGER,
    range_end      INTEGER,
    state          TEXT    NOT NULL CHECK (state IN ('cleaning', 'done')),
    backfills      INTEGER NOT NULL,
    runs           INTEGER NOT NULL,
    tries          INTEGER NOT NULL,
    published      INTEGER NOT NULL,
    versions       INTEGER,
    last_backfill  INTEGER NOT NULL,
    last_run       INTEGER NOT NULL,
    last_try       INTEGER NOT NULL,
    last_worker    INTEGER NOT NULL DEFAULT 0,
    host           TEXT    NOT NULL,
    pid            INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    finished_at    INTEGER
);
CREATE INDEX forgets_unfinished ON forgets (id) WHERE state = 'cleaning';

-- The removals, for people (docs/manifest.md, "Querying the manifest").
CREATE VIEW report_forgets AS
SELECT f.id AS forget_id,
       f.dag_id,
       f.from_arg,
       f.to_arg,
       strftime('%Y-%m-%dT%H:%M:%SZ', f.range_start, 'unixepoch') AS range_start,
       strftime('%Y-%m-%dT%H:%M:%SZ', f.range_end, 'unixepoch') AS range_end,
       f.state,
       f.backfills,
       f.runs,
       f.tries,
       f.published,
       f.versions AS kept_versions,
       f.host,
       f.pid,
       strftime('%Y-%m-%dT%H:%M:%fZ', f.created_at / 1000.0, 'unixepoch') AS created_at,
       strftime('%Y-%m-%dT%H:%M:%fZ', f.finished_at / 1000.0, 'unixepoch') AS finished_at
FROM forgets f;

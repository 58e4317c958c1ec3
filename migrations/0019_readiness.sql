-- `[tasks.ready]` (docs/guide.md, "Sources that land late"): what a backfill's readiness
-- checks answered for each interval and task, asked before the interval's run starts. A row
-- is `waiting` while the interval waits for its sources, then `ready` (its run started) or
-- `not ready` (the wait ran out: the interval's plan row is skipped as `not ready`). Times are
-- at the manifest's clock, in unix milliseconds.
CREATE TABLE readiness (
    backfill_id    INTEGER NOT NULL REFERENCES backfills(id),
    dag_id         TEXT    NOT NULL,
    interval_start INTEGER NOT NULL,
    interval_end   INTEGER NOT NULL,
    task_id        TEXT    NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('waiting', 'ready', 'not ready')),
    asks           INTEGER NOT NULL,
    answer         TEXT,
    first_asked_at INTEGER NOT NULL,
    last_asked_at  INTEGER NOT NULL,
    deadline       INTEGER NOT NULL,
    PRIMARY KEY (backfill_id, interval_start, task_id)
);
CREATE INDEX readiness_by_interval ON readiness (dag_id, interval_start);

-- `create --wait-ready DURATION` (milliseconds; NULL: each task's own `wait`) and
-- `--require-ready` (1), which `resume` and `join` keep.
ALTER TABLE backfills ADD COLUMN wait_ready INTEGER;
ALTER TABLE backfills ADD COLUMN require_ready INTEGER NOT NULL DEFAULT 0;

-- What readiness checks answered, for people (docs/manifest.md, "Querying the manifest").
CREATE VIEW report_readiness AS
SELECT r.backfill_id,
       r.dag_id,
       r.task_id,
       strftime('%Y-%m-%dT%H:%M:%SZ', r.interval_start, 'unixepoch') AS interval_start,
       strftime('%Y-%m-%dT%H:%M:%SZ', r.interval_end, 'unixepoch') AS interval_end,
       r.state,
       r.asks,
       r.answer,
       strftime('%Y-%m-%dT%H:%M:%fZ', r.first_asked_at / 1000.0, 'unixepoch') AS first_asked_at,
       strftime('%Y-%m-%dT%H:%M:%fZ', r.last_asked_at / 1000.0, 'unixepoch') AS last_asked_at,
       strftime('%Y-%m-%dT%H:%M:%fZ', r.deadline / 1000.0, 'unixepoch') AS deadline,
       (r.last_asked_at - r.first_asked_at) / 1000.0 AS waited_s
FROM readiness r;

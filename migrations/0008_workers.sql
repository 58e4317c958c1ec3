-- `backfill join ID`: processes that help run a live backfill's intervals, each with a lease of
-- its own (pid, host, heartbeat) and an epoch that fences it once it was recovered. A run
-- records the worker that ran it (NULL: the backfill's owner).
CREATE TABLE workers (
    id               INTEGER PRIMARY KEY,
    backfill_id      INTEGER NOT NULL REFERENCES backfills (id),
    pid              INTEGER,
    host             TEXT,
    heartbeat_at     INTEGER,
    epoch            INTEGER NOT NULL DEFAULT 0,
    state            TEXT    NOT NULL CHECK (state IN ('running', 'completed', 'failed', 'cancelled')),
    max_active_runs  INTEGER NOT NULL CHECK (max_active_runs > 0),
    started_at       INTEGER NOT NULL,
    finished_at      INTEGER
);
CREATE INDEX workers_by_backfill ON workers (backfill_id);
ALTER TABLE runs ADD COLUMN worker INTEGER REFERENCES workers (id);
CREATE INDEX runs_by_worker ON runs (worker) WHERE worker IS NOT NULL;
-- The runs in flight of a backfill, counted against its max_active_runs across its processes.
CREATE INDEX runs_in_flight ON runs (backfill_id) WHERE state IN ('queued', 'running');
-- `--max-failures` counts the failed and rejected runs of a backfill across its processes, since
-- its owner took it (`runs_before`: the largest run id then).
ALTER TABLE backfills ADD COLUMN runs_before INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_failed ON runs (backfill_id, id) WHERE state IN ('failed', 'rejected');

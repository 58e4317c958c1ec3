-- The run manifest: backfills, their plans, runs (one per attempt at an interval), task tries
-- and leases. Instants of intervals are unix seconds (UTC); event timestamps are unix
-- milliseconds. Rows of runs and task_tries are never overwritten by a later attempt.

CREATE TABLE backfills (
    id                 INTEGER PRIMARY KEY,
    dag_id             TEXT    NOT NULL,
    from_arg           TEXT    NOT NULL,
    to_arg             TEXT    NOT NULL,
    range_start        INTEGER NOT NULL,
    range_end          INTEGER NOT NULL,
    reprocess_behavior TEXT    NOT NULL CHECK (reprocess_behavior IN ('none', 'failed', 'completed')),
    max_active_runs    INTEGER NOT NULL CHECK (max_active_runs > 0),
    run_backwards      INTEGER NOT NULL,
    allow_drift        INTEGER NOT NULL DEFAULT 0,
    conf               TEXT    NOT NULL DEFAULT '{}',
    state              TEXT    NOT NULL CHECK (state IN ('running', 'completed', 'failed', 'cancelled')),
    owner_pid          INTEGER,
    owner_host         TEXT,
    heartbeat_at       INTEGER,
    cancel_requested   INTEGER NOT NULL DEFAULT 0,
    created_at         INTEGER NOT NULL,
    finished_at        INTEGER
);
CREATE INDEX backfills_by_dag ON backfills (dag_id, id);

-- One row per interval of a backfill, in execution order.
CREATE TABLE plan (
    backfill_id    INTEGER NOT NULL REFERENCES backfills (id),
    ord            INTEGER NOT NULL,
    interval_start INTEGER NOT NULL,
    interval_end   INTEGER NOT NULL,
    action         TEXT    NOT NULL CHECK (action IN ('run', 'skip')),
    reason         TEXT,
    PRIMARY KEY (backfill_id, ord)
) WITHOUT ROWID;

-- One row per attempt to process one interval of one DAG.
CREATE TABLE runs (
    id             INTEGER PRIMARY KEY,
    backfill_id    INTEGER NOT NULL REFERENCES backfills (id),
    dag_id         TEXT    NOT NULL,
    interval_start INTEGER NOT NULL,
    interval_end   INTEGER NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'rejected', 'cancelled')),
    started_at     INTEGER NOT NULL,
    ended_at       INTEGER,
    error          TEXT
);
CREATE INDEX runs_by_interval ON runs (dag_id, interval_start, id);
CREATE INDEX runs_by_backfill ON runs (backfill_id, interval_start, id);

-- One row per execution of one task inside a run.
CREATE TABLE task_tries (
    id            INTEGER PRIMARY KEY,
    run_id        INTEGER NOT NULL REFERENCES runs (id),
    task_id       TEXT    NOT NULL,
    try_number    INTEGER NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('running', 'succeeded', 'failed', 'rejected', 'cancelled')),
    started_at    INTEGER NOT NULL,
    ended_at      INTEGER,
    pgid          INTEGER,
    host          TEXT,
    exit_code     INTEGER,
    error         TEXT,
    log_path      TEXT,
    rows          INTEGER,
    partitions    TEXT,
    inputs        TEXT,
    fingerprint   TEXT,
    source_rows   INTEGER,
    previous_rows INTEGER,
    verdict       TEXT,
    reasons       TEXT,
    UNIQUE (run_id, task_id, try_number)
);

-- A queued or running interval is leased by one backfill. Liveness comes from the owner
-- backfill's pid, host and heartbeat, so a heartbeat costs one row whatever the lease count.
CREATE TABLE leases (
    dag_id         TEXT    NOT NULL,
    interval_start INTEGER NOT NULL,
    backfill_id    INTEGER NOT NULL REFERENCES backfills (id),
    run_id         INTEGER,
    pid            INTEGER NOT NULL,
    host           TEXT    NOT NULL,
    heartbeat_at   INTEGER NOT NULL,
    PRIMARY KEY (dag_id, interval_start)
) WITHOUT ROWID;
CREATE INDEX leases_by_backfill ON leases (backfill_id);

-- `[tasks.ready]` (docs/guide.md, "Sources that land late"): what a backfill's readiness
-- checks answered for each interval and task, asked before the interval's run starts. A row
-- is `waiting` while the interval waits for its sources, then `ready` (its run started) or
-- `not ready` (the wait ran out: the interval's plan row is skipped as `not ready`). Times are
-- at the manifest's clock (the database's), in unix milliseconds.
CREATE TABLE readiness (
    backfill_id    bigint  NOT NULL REFERENCES backfills(id),
    dag_id         text    NOT NULL,
    interval_start bigint  NOT NULL,
    interval_end   bigint  NOT NULL,
    task_id        text    NOT NULL,
    state          text    NOT NULL CHECK (state IN ('waiting', 'ready', 'not ready')),
    asks           bigint  NOT NULL,
    answer         text,
    first_asked_at bigint  NOT NULL,
    last_asked_at  bigint  NOT NULL,
    deadline       bigint  NOT NULL,
    PRIMARY KEY (backfill_id, interval_start, task_id)
);
CREATE INDEX readiness_by_interval ON readiness (dag_id, interval_start);

-- `create --wait-ready DURATION` (milliseconds; NULL: each task's own `wait`) and
-- `--require-ready` (1), which `resume` and `join` keep.
ALTER TABLE backfills ADD COLUMN wait_ready bigint;
ALTER TABLE backfills ADD COLUMN require_ready bigint NOT NULL DEFAULT 0;

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
ALTER TABLE backfills ADD COLUMN require_ready boolean NOT NULL DEFAULT false;

-- What readiness checks answered, for people (docs/manifest.md, "Querying the manifest").
CREATE VIEW report_readiness AS
SELECT r.backfill_id,
       r.dag_id,
       r.task_id,
       to_timestamp(r.interval_start) AS interval_start,
       to_timestamp(r.interval_end) AS interval_end,
       r.state,
       r.asks,
       r.answer,
       to_timestamp(r.first_asked_at / 1000.0) AS first_asked_at,
       to_timestamp(r.last_asked_at / 1000.0) AS last_asked_at,
       to_timestamp(r.deadline / 1000.0) AS deadline,
       ((r.last_asked_at - r.first_asked_at) / 1000.0)::double precision AS waited_s
FROM readiness r;

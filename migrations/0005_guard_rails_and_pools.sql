-- Guard rails for large backfills, pools shared by every backfill of the manifest, and
-- cascades across DAGs.
--
-- A cascade is the backfill of a DAG (`cascade` = 'all' or 'changed') and one backfill per
-- downstream DAG (`cascade_of` names the first), run one DAG after the other.
--
-- `max_failures`: a backfill stops dispatching once this many intervals failed or were rejected
-- (NULL: no limit); `resume` continues it with the same limit, counted afresh.
--
-- A pool slot is held by a running try of a task in a pool (`[pools]` in backfill.toml): at most
-- the pool's size are held at once, across processes. A slot of a backfill that is no longer
-- running, or whose owner's heartbeat is older than the lease timeout, is free, as its leases
-- are. `task_tries.waiting_for` names the pool a started try waits for, while it waits.

ALTER TABLE backfills ADD COLUMN max_failures INTEGER CHECK (max_failures > 0);
ALTER TABLE backfills ADD COLUMN cascade TEXT CHECK (cascade IN ('all', 'changed'));
ALTER TABLE backfills ADD COLUMN cascade_of INTEGER REFERENCES backfills (id);
CREATE INDEX backfills_by_cascade ON backfills (cascade_of) WHERE cascade_of IS NOT NULL;
ALTER TABLE task_tries ADD COLUMN waiting_for TEXT;
-- A rollback try: the kept version it puts back (`replaced_by` in the warehouse's
-- _backfill_versions). The version goes in the same transaction as the partition is restored,
-- so recovery knows the rollback committed when it is gone.
ALTER TABLE task_tries ADD COLUMN restore_key INTEGER;
-- Promote tries by the staged try they publish: a staged output with a running promote is not
-- discarded.
CREATE INDEX task_tries_promoted_from ON task_tries (promoted_from) WHERE promoted_from IS NOT NULL;
CREATE TABLE pool_slots (
    try_id      INTEGER PRIMARY KEY REFERENCES task_tries (id),
    pool        TEXT    NOT NULL,
    backfill_id INTEGER NOT NULL REFERENCES backfills (id),
    taken_at    INTEGER NOT NULL
);
CREATE INDEX pool_slots_by_pool ON pool_slots (pool, backfill_id);

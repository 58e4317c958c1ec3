-- Guard rails for large backfills, and pools shared by every backfill of the manifest.
--
-- `max_failures`: a backfill stops dispatching once this many intervals failed or were rejected
-- (NULL: no limit); `resume` continues it with the same limit, counted afresh.
--
-- A pool slot is held by a running try of a task in a pool (`[pools]` in backfill.toml): at most
-- the pool's size are held at once, across processes. A slot of a backfill that is no longer
-- running, or whose owner's heartbeat is older than the lease timeout, is free, as its leases
-- are. `task_tries.waiting_for` names the pool a started try waits for, while it waits.

ALTER TABLE backfills ADD COLUMN max_failures INTEGER CHECK (max_failures > 0);
ALTER TABLE task_tries ADD COLUMN waiting_for TEXT;
CREATE TABLE pool_slots (
    try_id      INTEGER PRIMARY KEY REFERENCES task_tries (id),
    pool        TEXT    NOT NULL,
    backfill_id INTEGER NOT NULL REFERENCES backfills (id),
    taken_at    INTEGER NOT NULL
);
CREATE INDEX pool_slots_by_pool ON pool_slots (pool, backfill_id);

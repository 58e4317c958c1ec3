-- A pool's `rate` (`[pools] api = { slots = 4, rate = "100/min" }`): each start of a try of
-- such a pool, at the manifest's clock, so that every process and host sharing the manifest
-- counts the same starts. A start is kept
-- an hour (its period, if longer), then removed by a later start.
CREATE TABLE pool_starts (
    pool   TEXT    NOT NULL,
    at     INTEGER NOT NULL,
    try_id INTEGER NOT NULL
);
CREATE INDEX pool_starts_by_pool ON pool_starts (pool, at);

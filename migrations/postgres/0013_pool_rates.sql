-- A pool's `rate` (`[pools] api = { slots = 4, rate = "100/min" }`): each start of a try of
-- such a pool, at the manifest's clock (the database's), so that every process and host
-- counts the same starts. A start is kept
-- an hour (its period, if longer), then removed by a later start.
CREATE TABLE pool_starts (
    pool   text   NOT NULL,
    at     bigint NOT NULL,
    try_id bigint NOT NULL
);
CREATE INDEX pool_starts_by_pool ON pool_starts (pool, at);

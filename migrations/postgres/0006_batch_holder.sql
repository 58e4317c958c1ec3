-- The process of the backfill whose batch holds an interval (`batch_size` > 1): 0 its owner, else
-- the id of its worker (`backfill join`); NULL: no batch holds it. Another process of the backfill
-- leaves the interval to that batch while its holder runs, so that no two of its processes compute
-- the same interval's rows.
ALTER TABLE leases ADD COLUMN batch_holder bigint;

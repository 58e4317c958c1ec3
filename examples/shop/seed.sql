-- Deterministic raw orders for every day of 2026: 1,500 to 3,193 orders a day, 2,259 on average (more at
-- weekends), spread evenly over the day, in five regions, with amounts from 5.00 to 254.99.
-- Pseudo-random values come from integer hashing, so every run produces the same rows.

WITH RECURSIVE
  seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i < 3199),
  days(d, n) AS (
    SELECT i,
           1500 + (i * 7919) % 1200
                + CASE WHEN (i + 4) % 7 IN (0, 6) THEN 500 ELSE 0 END
    FROM seq WHERE i < 365
  )
INSERT INTO raw_orders (order_id, order_ts, region, amount_cents)
SELECT d * 10000 + i,
       datetime(2461041.5 + d + (i * 86399 / n) / 86400.0),
       CASE ((d * 10000 + i) * 2654435761 % 4294967296) / 858993460
         WHEN 0 THEN 'eu' WHEN 1 THEN 'us' WHEN 2 THEN 'apac' WHEN 3 THEN 'latam' ELSE 'mea' END,
       500 + ((d * 10000 + i) * 40503) % 25000
FROM days JOIN seq ON seq.i < days.n;

CREATE INDEX raw_orders_by_ts ON raw_orders (order_ts);

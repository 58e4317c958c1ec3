-- The same deterministic orders as examples/shop/seed.sql: every day of 2026, 1,500 to 3,193
-- orders a day (more at weekends), in five regions. Loaded once.
INSERT INTO raw.orders (order_id, order_ts, region, amount_cents)
SELECT d * 10000 + i,
       timestamptz '2026-01-01 00:00:00+00' + d * interval '1 day'
         + ((i * 86399) / n) * interval '1 second',
       CASE ((d * 10000 + i) * 2654435761 % 4294967296) / 858993460
         WHEN 0 THEN 'eu' WHEN 1 THEN 'us' WHEN 2 THEN 'apac' WHEN 3 THEN 'latam' ELSE 'mea' END,
       500 + ((d * 10000 + i) * 40503) % 25000
FROM (SELECT d, 1500 + (d * 7919) % 1200 + CASE WHEN (d + 4) % 7 IN (0, 6) THEN 500 ELSE 0 END AS n
      FROM generate_series(0::bigint, 364) AS d) AS days
CROSS JOIN LATERAL generate_series(0::bigint, n - 1) AS i
WHERE NOT EXISTS (SELECT 1 FROM raw.orders);
ANALYZE raw.orders;

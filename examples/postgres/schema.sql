-- The shop's tables on PostgreSQL: raw orders (the source) and the published fact table.
CREATE SCHEMA IF NOT EXISTS raw;
CREATE SCHEMA IF NOT EXISTS analytics;

CREATE TABLE IF NOT EXISTS raw.orders (
    order_id     bigint      PRIMARY KEY,
    order_ts     timestamptz NOT NULL,
    region       text        NOT NULL,
    amount_cents integer     NOT NULL
);
CREATE INDEX IF NOT EXISTS orders_by_ts ON raw.orders (order_ts);

-- One row per order: one partition per day. The index on `day` serves each interval's delete;
-- the primary key's index the table-wide key check (unique_key_scope = "table").
CREATE TABLE IF NOT EXISTS analytics.orders_fact (
    order_id     bigint      PRIMARY KEY,
    day          date        NOT NULL,
    order_ts     timestamptz NOT NULL,
    region       text        NOT NULL,
    amount_cents integer     NOT NULL
);
CREATE INDEX IF NOT EXISTS orders_fact_by_day ON analytics.orders_fact (day);

-- The shop's fixture warehouse: raw orders (the source) and two published tables.
-- Timestamps are UTC in SQLite's own format, 'YYYY-MM-DD HH:MM:SS'.

CREATE TABLE raw_orders (
    order_id     INTEGER PRIMARY KEY,
    order_ts     TEXT    NOT NULL,
    region       TEXT    NOT NULL,
    amount_cents INTEGER NOT NULL
);

-- Orders and revenue per day and region: one partition per day.
CREATE TABLE daily_orders (
    day           TEXT    NOT NULL,
    region        TEXT    NOT NULL,
    orders        INTEGER NOT NULL,
    revenue_cents INTEGER NOT NULL
);
CREATE INDEX daily_orders_by_day ON daily_orders (day);

-- One row per order: one partition per day.
CREATE TABLE orders_fact (
    order_id     INTEGER NOT NULL,
    order_day    TEXT    NOT NULL,
    order_ts     TEXT    NOT NULL,
    region       TEXT    NOT NULL,
    amount_cents INTEGER NOT NULL
);
CREATE INDEX orders_fact_by_day ON orders_fact (order_day);

-- Orders and revenue per month and region, from daily_orders: one partition per month.
CREATE TABLE monthly_revenue (
    month         TEXT    NOT NULL,
    region        TEXT    NOT NULL,
    orders        INTEGER NOT NULL,
    revenue_cents INTEGER NOT NULL
);
CREATE INDEX monthly_revenue_by_month ON monthly_revenue (month);

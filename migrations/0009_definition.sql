-- What each backfill's DAG computes, as it was when the backfill was created or last resumed
-- (JSON: key -> value, see Dag::definition): `join` refuses a process whose DAG differs, and
-- `resume` says what changed. NULL for backfills recorded before this column.
ALTER TABLE backfills ADD COLUMN definition TEXT;

-- The `--batch-size` a backfill was created with, which `resume` and `join` keep; NULL: the
-- DAG file's `batch_size`.
ALTER TABLE backfills ADD COLUMN batch_size integer;

-- The `--batch-size` a backfill was created with, which `resume` and `join` keep; NULL: the
-- DAG file's `batch_size`.
ALTER TABLE backfills ADD COLUMN batch_size integer;
-- The batch whose one query or command computed a try's output, as `START/END` (RFC 3339, UTC);
-- NULL for a try that computed its own.
ALTER TABLE task_tries ADD COLUMN batch text;

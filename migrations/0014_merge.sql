-- What a try of a `write = "merge"` task did to its partition, row by row: keys inserted, rows
-- updated (moved in from another partition included), keys deleted, and output rows equal to
-- the target's, which were not written. NULL for a try that replaces its partition, and for a
-- try that did not publish.
ALTER TABLE task_tries ADD COLUMN rows_inserted INTEGER;
ALTER TABLE task_tries ADD COLUMN rows_updated INTEGER;
ALTER TABLE task_tries ADD COLUMN rows_deleted INTEGER;
ALTER TABLE task_tries ADD COLUMN rows_unchanged INTEGER;

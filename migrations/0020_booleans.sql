-- The manifest's statements compare flags with TRUE and FALSE (which SQLite reads as 1 and
-- 0), so that a PostgreSQL manifest can keep them as `boolean`. SQLite uses a partial index
-- only for a query whose terms are the index's own, and TRUE is not the same term as 1: the
-- index of the tries not yet finished is made again with TRUE. Nothing stored changes.
DROP INDEX task_tries_unfinished;
CREATE INDEX task_tries_unfinished ON task_tries (run_id) WHERE state = 'running' OR publishing = TRUE;

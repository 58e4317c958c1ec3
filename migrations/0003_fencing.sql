-- Fencing and crash safety.
--
-- `epoch` is bumped by every change of ownership (resume, a takeover of a silent owner, cancel of
-- a dead owner); an owner acts only while the epoch it was given is current. `planning` is 1
-- while a plan is still being written in chunks: `resume` finishes it. `pgid_start` is the
-- start time of a try's process group leader (clock ticks since boot), so that a recorded group
-- is never confused with a later process that reused the number. `audit_path` is the file that
-- holds a SQL try's audited rows; leases name the run that holds them.

ALTER TABLE backfills ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE backfills ADD COLUMN planning INTEGER NOT NULL DEFAULT 0;
ALTER TABLE task_tries ADD COLUMN pgid_start INTEGER;
ALTER TABLE task_tries ADD COLUMN audit_path TEXT;
CREATE INDEX task_tries_unfinished ON task_tries (run_id) WHERE state = 'running' OR publishing = 1;

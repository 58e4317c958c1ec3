-- When the process of a backfill's owner and of each worker started: clock ticks since its
-- host's boot (`/proc/PID/stat`, field 22). A live process of this host with the recorded pid and
-- start, and not stopped, is that owner, whatever its heartbeat's age says: a wall clock that
-- jumped does not make a running owner look gone. NULL: recorded by an earlier version, judged
-- by its heartbeat alone.
ALTER TABLE backfills ADD COLUMN owner_start bigint;
ALTER TABLE workers ADD COLUMN start bigint;

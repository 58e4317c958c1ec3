-- Staging, promotion, rollback and change detection.
--
-- A backfill has a `kind`: `run` computes and publishes; `stage` computes and keeps the audited
-- outputs without publishing them; `promote` publishes the staged outputs of the backfill named
-- by `source_backfill`; `rollback` puts back the partitions that earlier publishes replaced.
-- (Widening the CHECKs of `reprocess_behavior`, for `changed`, and of `state`, for `staged`, is
-- done by the migration code: SQLite cannot alter a CHECK constraint.)
--
-- A try records `source_fingerprint`, what the gate's `source_fingerprint` printed, beside
-- `source_rows`: a later `--reprocess-behavior changed` compares both with the source again.
-- A staged try keeps its output at `staged_path` while `staged` is 'staged'; promoting or
-- discarding it sets 'promoted' or 'discarded'. A promoting try names the staged try it
-- publishes (`promoted_from`); a rollback try names the try whose rows it put back
-- (`restored_from`, NULL when they predate the manifest).

ALTER TABLE backfills ADD COLUMN kind TEXT NOT NULL DEFAULT 'run'
    CHECK (kind IN ('run', 'stage', 'promote', 'rollback'));
ALTER TABLE backfills ADD COLUMN source_backfill INTEGER REFERENCES backfills (id);
-- The tasks a backfill runs, as a JSON array of ids; NULL for every task.
ALTER TABLE backfills ADD COLUMN tasks TEXT;
ALTER TABLE task_tries ADD COLUMN source_fingerprint TEXT;
ALTER TABLE task_tries ADD COLUMN staged TEXT CHECK (staged IN ('staged', 'promoted', 'discarded'));
ALTER TABLE task_tries ADD COLUMN staged_path TEXT;
ALTER TABLE task_tries ADD COLUMN promoted_from INTEGER REFERENCES task_tries (id);
ALTER TABLE task_tries ADD COLUMN restored_from INTEGER;
CREATE INDEX task_tries_staged ON task_tries (run_id) WHERE staged IS NOT NULL;

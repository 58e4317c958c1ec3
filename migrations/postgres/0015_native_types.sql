-- Native types for what the program keeps as integers and text, as a team querying the
-- manifest expects (docs/manifest.md, "Querying the manifest"):
-- - flags are `boolean` (`WHERE NOT run_backwards`): the program's own statements compare them
--   with TRUE and FALSE, which SQLite reads as 1 and 0, so both engines run the same statements;
-- - documents are `json` (`conf ->> 'region'`): `json` rather than `jsonb` because it keeps a
--   document as it was written, byte for byte (what `manifest copy` and the program read back),
--   and takes every value JSON can spell, where `jsonb` refuses the escape `\u0000`, which a
--   task's reported partition may hold; cast to `jsonb` to index or compare by containment;
-- - a try's verdict is checked against the verdicts the program records, as states already are.
-- It runs in the migrations' one transaction: a process killed during it leaves the manifest at
-- its earlier version, which the next command converts. The view for people keeps its columns'
-- types (`tasks` stays text there). The view that reads these columns and
-- the partial index on `publishing` are made again around it (PostgreSQL changes no column's
-- type under a view, nor a predicate's): `backfills` first, then `task_tries`.
-- PostgreSQL drops what was granted on a view with it: kept here, granted again once the view
-- is made again below, so that a team's read-only role still reads it.
CREATE TABLE report_backfills_grants AS
SELECT a.grantee, a.privilege_type
FROM pg_class c, aclexplode(c.relacl) a
WHERE c.oid = 'report_backfills'::regclass AND a.grantee <> c.relowner;

DROP VIEW report_backfills;

-- A document that is not JSON (no release wrote one; a hand-edited manifest might hold one) is
-- kept as a JSON string rather than failing the upgrade: each table is converted with the plain
-- cast first (`json_strict`), and only when a value is not JSON, again with `json_or_string`,
-- value by value. `convert_columns` runs an ALTER TABLE whose documents are cast by `%1$s`.
CREATE FUNCTION json_strict(text) RETURNS json LANGUAGE sql IMMUTABLE AS $f$ SELECT $1::json $f$;

CREATE FUNCTION json_or_string(t text) RETURNS json LANGUAGE plpgsql IMMUTABLE AS $f$
BEGIN
    RETURN t::json;
EXCEPTION WHEN invalid_text_representation THEN
    RETURN to_json(t);
END
$f$;

CREATE FUNCTION convert_columns(alter_table text) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE format(alter_table, 'json_strict');
EXCEPTION WHEN invalid_text_representation THEN
    EXECUTE format(alter_table, 'json_or_string');
END
$f$;

SELECT convert_columns($a$
    ALTER TABLE backfills
        ALTER COLUMN run_backwards TYPE boolean USING run_backwards <> 0,
        ALTER COLUMN allow_drift DROP DEFAULT,
        ALTER COLUMN allow_drift TYPE boolean USING allow_drift <> 0,
        ALTER COLUMN allow_drift SET DEFAULT false,
        ALTER COLUMN cancel_requested DROP DEFAULT,
        ALTER COLUMN cancel_requested TYPE boolean USING cancel_requested <> 0,
        ALTER COLUMN cancel_requested SET DEFAULT false,
        ALTER COLUMN planning DROP DEFAULT,
        ALTER COLUMN planning TYPE boolean USING planning <> 0,
        ALTER COLUMN planning SET DEFAULT false,
        ALTER COLUMN atomic DROP DEFAULT,
        ALTER COLUMN atomic TYPE boolean USING atomic <> 0,
        ALTER COLUMN atomic SET DEFAULT false,
        ALTER COLUMN conf DROP DEFAULT,
        ALTER COLUMN conf TYPE json USING %1$s(conf),
        ALTER COLUMN conf SET DEFAULT '{}',
        ALTER COLUMN tasks TYPE json USING %1$s(tasks),
        ALTER COLUMN definition TYPE json USING %1$s(definition),
        ALTER COLUMN warehouses TYPE json USING %1$s(warehouses)
$a$);

CREATE VIEW report_backfills AS
SELECT b.id AS backfill_id,
       b.project,
       b.dag_id,
       b.kind,
       b.state,
       b.reprocess_behavior,
       b.from_arg,
       b.to_arg,
       to_timestamp(b.range_start) AS range_start,
       to_timestamp(b.range_end) AS range_end,
       b.max_active_runs,
       b.run_backwards,
       b.atomic,
       CAST(b.tasks AS text) AS tasks,
       b.source_backfill,
       b.cascade_of,
       b.owner_host AS host,
       to_timestamp(b.created_at / 1000.0) AS created_at,
       to_timestamp(b.finished_at / 1000.0) AS finished_at,
       CAST((b.finished_at - b.created_at) / 1000.0 AS double precision) AS duration_s,
       (SELECT COUNT(*) FROM plan p WHERE p.backfill_id = b.id AND p.action = 'run') AS intervals_to_run,
       (SELECT COUNT(*) FROM plan p WHERE p.backfill_id = b.id AND p.action = 'skip') AS intervals_skipped,
       (SELECT COUNT(*) FROM runs r WHERE r.backfill_id = b.id AND r.state = 'succeeded') AS runs_succeeded,
       (SELECT COUNT(*) FROM runs r WHERE r.backfill_id = b.id AND r.state = 'failed') AS runs_failed,
       (SELECT COUNT(*) FROM runs r WHERE r.backfill_id = b.id AND r.state = 'rejected') AS runs_rejected,
       (SELECT COUNT(*) FROM runs r WHERE r.backfill_id = b.id AND r.state = 'cancelled') AS runs_cancelled,
       (SELECT COUNT(*) FROM runs r WHERE r.backfill_id = b.id AND r.state IN ('queued', 'running')) AS runs_in_flight
FROM backfills b;

DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT grantee, privilege_type FROM report_backfills_grants LOOP
        EXECUTE format('GRANT %s ON report_backfills TO %s', g.privilege_type,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
    END LOOP;
END
$$;
DROP TABLE report_backfills_grants;

DROP INDEX task_tries_unfinished;

SELECT convert_columns($a$
    ALTER TABLE task_tries
        ALTER COLUMN publishing DROP DEFAULT,
        ALTER COLUMN publishing TYPE boolean USING publishing <> 0,
        ALTER COLUMN publishing SET DEFAULT false,
        ALTER COLUMN partitions TYPE json USING %1$s(partitions),
        ALTER COLUMN inputs TYPE json USING %1$s(inputs),
        ADD CONSTRAINT task_tries_verdict_check
            CHECK (verdict IN ('published', 'published empty', 'rejected', 'staged', 'rolled back'))
$a$);

CREATE INDEX task_tries_unfinished ON task_tries (run_id) WHERE state = 'running' OR publishing = TRUE;

DROP FUNCTION convert_columns(text);
DROP FUNCTION json_or_string(text);
DROP FUNCTION json_strict(text);

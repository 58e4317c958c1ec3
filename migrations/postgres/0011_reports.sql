-- The manifest's views for people (docs/manifest.md, "Querying the manifest"): the history a
-- team reads for dashboards and audits, with the same columns as the SQLite manifest's. Times
-- are `timestamptz`, durations seconds (`double precision`), flags `boolean`. The tables under
-- them are the program's and may change from one version to the next; these columns do not.

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
       b.run_backwards <> 0 AS run_backwards,
       b.atomic <> 0 AS atomic,
       b.tasks,
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

CREATE VIEW report_runs AS
SELECT r.id AS run_id,
       r.backfill_id,
       r.dag_id,
       to_timestamp(r.interval_start) AS interval_start,
       to_timestamp(r.interval_end) AS interval_end,
       r.state,
       to_timestamp(r.started_at / 1000.0) AS started_at,
       to_timestamp(r.ended_at / 1000.0) AS ended_at,
       CAST((r.ended_at - r.started_at) / 1000.0 AS double precision) AS duration_s,
       r.error,
       (SELECT COUNT(*) FROM task_tries t WHERE t.run_id = r.id) AS tries,
       (SELECT CAST(SUM(t.rows) AS bigint) FROM task_tries t WHERE t.run_id = r.id AND t.state = 'succeeded') AS rows,
       (SELECT t.host FROM task_tries t WHERE t.run_id = r.id ORDER BY t.id DESC LIMIT 1) AS host
FROM runs r;

CREATE VIEW report_tries AS
SELECT t.id AS try_id,
       t.run_id,
       r.backfill_id,
       r.dag_id,
       t.task_id,
       t.try_number,
       to_timestamp(r.interval_start) AS interval_start,
       to_timestamp(r.interval_end) AS interval_end,
       t.state,
       to_timestamp(t.started_at / 1000.0) AS started_at,
       to_timestamp(t.ended_at / 1000.0) AS ended_at,
       CAST((t.ended_at - t.started_at) / 1000.0 AS double precision) AS duration_s,
       t.host,
       t.exit_code,
       t.error,
       t.rows,
       t.source_rows,
       t.previous_rows,
       t.rows_inserted,
       t.rows_updated,
       t.rows_deleted,
       t.rows_unchanged,
       t.verdict,
       t.reasons,
       t.staged,
       t.promoted_from,
       t.log_path
FROM task_tries t
JOIN runs r ON r.id = t.run_id;

CREATE VIEW report_published AS
SELECT p.dag_id,
       p.task_id,
       to_timestamp(p.interval_start) AS interval_start,
       to_timestamp(p.interval_end) AS interval_end,
       p.rows,
       p.try_id,
       t.run_id,
       r.backfill_id,
       to_timestamp(p.published_at / 1000.0) AS published_at
FROM published p
JOIN task_tries t ON t.id = p.try_id
JOIN runs r ON r.id = t.run_id;

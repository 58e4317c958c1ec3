-- The manifest's views for people (docs/manifest.md, "Querying the manifest"): the history a
-- team reads for dashboards and audits, with the same columns as the PostgreSQL manifest's.
-- Times are ISO 8601 text in UTC (`2026-09-01T00:00:00Z`; an event's with milliseconds), which
-- sorts and compares as time; durations are seconds; flags are 0 or 1. The tables under them
-- are the program's and may change from one version to the next; these columns do not.

CREATE VIEW report_backfills AS
SELECT b.id AS backfill_id,
       b.project,
       b.dag_id,
       b.kind,
       b.state,
       b.reprocess_behavior,
       b.from_arg,
       b.to_arg,
       strftime('%Y-%m-%dT%H:%M:%SZ', b.range_start, 'unixepoch') AS range_start,
       strftime('%Y-%m-%dT%H:%M:%SZ', b.range_end, 'unixepoch') AS range_end,
       b.max_active_runs,
       b.run_backwards,
       b.atomic,
       b.tasks,
       b.source_backfill,
       b.cascade_of,
       b.owner_host AS host,
       strftime('%Y-%m-%dT%H:%M:%fZ', b.created_at / 1000.0, 'unixepoch') AS created_at,
       strftime('%Y-%m-%dT%H:%M:%fZ', b.finished_at / 1000.0, 'unixepoch') AS finished_at,
       (b.finished_at - b.created_at) / 1000.0 AS duration_s,
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
       strftime('%Y-%m-%dT%H:%M:%SZ', r.interval_start, 'unixepoch') AS interval_start,
       strftime('%Y-%m-%dT%H:%M:%SZ', r.interval_end, 'unixepoch') AS interval_end,
       r.state,
       strftime('%Y-%m-%dT%H:%M:%fZ', r.started_at / 1000.0, 'unixepoch') AS started_at,
       strftime('%Y-%m-%dT%H:%M:%fZ', r.ended_at / 1000.0, 'unixepoch') AS ended_at,
       (r.ended_at - r.started_at) / 1000.0 AS duration_s,
       r.error,
       (SELECT COUNT(*) FROM task_tries t WHERE t.run_id = r.id) AS tries,
       (SELECT SUM(t.rows) FROM task_tries t WHERE t.run_id = r.id AND t.state = 'succeeded') AS rows,
       (SELECT t.host FROM task_tries t WHERE t.run_id = r.id ORDER BY t.id DESC LIMIT 1) AS host
FROM runs r;

CREATE VIEW report_tries AS
SELECT t.id AS try_id,
       t.run_id,
       r.backfill_id,
       r.dag_id,
       t.task_id,
       t.try_number,
       strftime('%Y-%m-%dT%H:%M:%SZ', r.interval_start, 'unixepoch') AS interval_start,
       strftime('%Y-%m-%dT%H:%M:%SZ', r.interval_end, 'unixepoch') AS interval_end,
       t.state,
       strftime('%Y-%m-%dT%H:%M:%fZ', t.started_at / 1000.0, 'unixepoch') AS started_at,
       strftime('%Y-%m-%dT%H:%M:%fZ', t.ended_at / 1000.0, 'unixepoch') AS ended_at,
       (t.ended_at - t.started_at) / 1000.0 AS duration_s,
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
       strftime('%Y-%m-%dT%H:%M:%SZ', p.interval_start, 'unixepoch') AS interval_start,
       strftime('%Y-%m-%dT%H:%M:%SZ', p.interval_end, 'unixepoch') AS interval_end,
       p.rows,
       p.try_id,
       t.run_id,
       r.backfill_id,
       strftime('%Y-%m-%dT%H:%M:%fZ', p.published_at / 1000.0, 'unixepoch') AS published_at
FROM published p
JOIN task_tries t ON t.id = p.try_id
JOIN runs r ON r.id = t.run_id;

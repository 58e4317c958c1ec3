-- The publication gate. A try of a task with an audit table records its gate verdict; between
-- the decision to publish and the publish itself the try carries `publishing = 1` and the name
-- of its audit table, so that a crash in that window is repaired by redoing the publish.

ALTER TABLE task_tries ADD COLUMN audit_table TEXT;
ALTER TABLE task_tries ADD COLUMN publishing INTEGER NOT NULL DEFAULT 0;

-- Which try is published for each task and interval: the system of record for the warehouse.
CREATE TABLE published (
    dag_id         TEXT    NOT NULL,
    task_id        TEXT    NOT NULL,
    interval_start INTEGER NOT NULL,
    interval_end   INTEGER NOT NULL,
    try_id         INTEGER NOT NULL REFERENCES task_tries (id),
    rows           INTEGER NOT NULL,
    fingerprint    TEXT,
    published_at   INTEGER NOT NULL,
    PRIMARY KEY (dag_id, task_id, interval_start)
) WITHOUT ROWID;

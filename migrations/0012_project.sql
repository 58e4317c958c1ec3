-- Which project a backfill belongs to, and the warehouses its DAG wrote, as the project that made
-- it named them: a manifest shared by two projects with a DAG of the same id would otherwise let
-- one skip the other's intervals as `already exists`, or finish the other's publishes into its
-- own warehouse. NULL for a backfill recorded before: anyone's.
ALTER TABLE backfills ADD COLUMN project TEXT;
ALTER TABLE backfills ADD COLUMN warehouses TEXT;

-- `create --sample N`: a backfill that rehearses its range on N representative intervals
-- records N; its plan holds only the intervals it picked. NULL for every other backfill.
ALTER TABLE backfills ADD COLUMN sample INTEGER CHECK (sample > 0);

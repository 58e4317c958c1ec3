-- A promote that publishes every staged output of its range in one warehouse transaction
-- (`promote --atomic`): 1. Its publish intents are recorded in one manifest transaction, and
-- recovery finishes them together, in one warehouse transaction; `resume` promotes what is
-- left of it all at once again.
ALTER TABLE backfills ADD COLUMN atomic INTEGER NOT NULL DEFAULT 0;

-- What names this manifest where others keep records about it (a PostgreSQL warehouse's
-- bookkeeping of publishes, staged outputs and kept versions): random, made once, so that a
-- manifest created again at the same path is never taken for the one before.
CREATE TABLE identity (id TEXT NOT NULL);
INSERT INTO identity (id) VALUES (lower(hex(randomblob(16))));

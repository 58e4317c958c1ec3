-- A PostgreSQL warehouse in the manifest's own database records a publish in the manifest in the
-- publish's own transaction: the try ends `succeeded` and becomes the partition's publication
-- only if it is still running. When it is not (its owner was recovered meanwhile), this raises,
-- and the whole transaction, the warehouse's rows with it, rolls back.
CREATE FUNCTION publish_refused(try_id bigint) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'try % may not publish: the manifest no longer records it as running', try_id
        USING ERRCODE = 'BF001',
              HINT = 'its backfill was taken over or cancelled; the new owner runs the interval';
END
$$;

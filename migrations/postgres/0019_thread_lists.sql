-- Lists of threads by update time, and filtered by metadata (GET /v1/threads).
CREATE INDEX threads_by_tenant_updated ON threads (tenant_id, updated_at, thread_key);

-- The metadata read as jsonb, or NULL where jsonb cannot hold it: the column keeps any JSON
-- text (a "\u0000" escape, which jsonb refuses, included), and a plain cast in the index would
-- refuse such a thread's creation. Such a thread matches no metadata filter.
CREATE FUNCTION loupe_metadata_jsonb(metadata TEXT) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN metadata::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;

-- Containment (`loupe_metadata_jsonb(metadata) @> '{"user": "ana"}'`) through a GIN index.
CREATE INDEX threads_by_metadata ON threads USING GIN (loupe_metadata_jsonb(metadata) jsonb_path_ops);

-- Lists of threads by update time, and filtered by metadata (GET /v1/threads).
CREATE INDEX threads_by_tenant_updated ON threads (tenant_id, updated_at, thread_key);
-- Containment (`metadata::jsonb @> '{"user": "ana"}'`) through a GIN index of the metadata as
-- JSON: the column stays TEXT, byte for byte as sent, and the index reads it as jsonb.
CREATE INDEX threads_by_metadata ON threads USING GIN ((metadata::jsonb) jsonb_path_ops);

-- Lists of threads by update time (GET /v1/threads). SQLite has no index over JSON documents: a
-- metadata filter reads the tenant's threads in list order through this index or the one by
-- creation time, testing each row's metadata with json_extract.
CREATE INDEX threads_by_tenant_updated ON threads (tenant_id, updated_at, thread_key);

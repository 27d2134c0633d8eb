-- Ready to shard (issue 37): every table's role under Citus is declared in
-- `tests/api/shard_ready.rs`. Per-thread tables are distributed by `thread_key`, co-located
-- with `messages`, so each of their primary keys and unique indexes must hold `thread_key`.
-- `tenants`, `api_keys` and `model_overheads` are small tenant-level reference tables. `jobs`
-- stays a plain table on the coordinator: a work queue, not thread data, claimed oldest first
-- across every thread (`FOR UPDATE SKIP LOCKED`, which Citus runs on one shard only), its
-- active `dedup_key` unique across the cluster, and a job may name no thread.
--
-- A thread's name, `(tenant_id, thread_id)`, stays unique, but in a table of its own keyed by
-- it (distributed by `tenant_id`): a unique constraint of `threads` without `thread_key` is
-- one no distributed table may have. A thread is created and deleted with its name in one
-- transaction; `threads` keeps its copy of the name, looked up by a plain index.
CREATE TABLE thread_names (
    tenant_id  TEXT NOT NULL,
    thread_id  TEXT NOT NULL,
    thread_key TEXT NOT NULL,
    PRIMARY KEY (tenant_id, thread_id)
);
INSERT INTO thread_names (tenant_id, thread_id, thread_key)
    SELECT tenant_id, thread_id, thread_key FROM threads;
ALTER TABLE threads DROP CONSTRAINT threads_tenant_id_thread_id_key;
CREATE INDEX threads_by_name ON threads (tenant_id, thread_id);

-- An erasure's receipt is its thread's: keyed by the thread, then the erasure (a UUIDv7, as
-- unique alone as before; its thread's receipts are listed in that order).
ALTER TABLE erasures DROP CONSTRAINT erasures_pkey, ADD PRIMARY KEY (thread_key, erasure_id);

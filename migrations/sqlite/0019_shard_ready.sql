-- Ready to shard (issue 37), as `migrations/postgres/0018_shard_ready.sql`: the same schema on
-- both backends, though SQLite is never sharded. A thread's name, `(tenant_id, thread_id)`,
-- stays unique in a table of its own keyed by it; `threads` keeps its copy of the name, looked
-- up by a plain index. A thread is created and deleted with its name in one transaction.
CREATE TABLE thread_names (
    tenant_id  TEXT NOT NULL,
    thread_id  TEXT NOT NULL,
    thread_key TEXT NOT NULL,
    PRIMARY KEY (tenant_id, thread_id)
);
INSERT INTO thread_names (tenant_id, thread_id, thread_key)
    SELECT tenant_id, thread_id, thread_key FROM threads;

-- SQLite drops a table constraint only by building the table again. The trigger that names
-- `threads` goes first (renaming a table checks every trigger) and comes back unchanged.
DROP TRIGGER messages_rewritten;
CREATE TABLE threads_rebuilt (
    thread_key            TEXT PRIMARY KEY,
    tenant_id             TEXT NOT NULL,
    thread_id             TEXT NOT NULL,
    metadata              TEXT NOT NULL,
    next_seq              BIGINT NOT NULL DEFAULT 0,
    visible_count         BIGINT NOT NULL DEFAULT 0,
    created_at            BIGINT NOT NULL,
    updated_at            BIGINT NOT NULL,
    context_tokens        BIGINT NOT NULL DEFAULT 0,
    stored_bytes          BIGINT NOT NULL DEFAULT 0,
    redaction_epoch       BIGINT NOT NULL DEFAULT 0,
    search_seq            BIGINT NOT NULL DEFAULT 0,
    context_anchored      BIGINT NOT NULL DEFAULT 0,
    window_content_tokens BIGINT NOT NULL DEFAULT 0
);
INSERT INTO threads_rebuilt (thread_key, tenant_id, thread_id, metadata, next_seq,
        visible_count, created_at, updated_at, context_tokens, stored_bytes, redaction_epoch,
        search_seq, context_anchored, window_content_tokens)
    SELECT thread_key, tenant_id, thread_id, metadata, next_seq, visible_count, created_at,
        updated_at, context_tokens, stored_bytes, redaction_epoch, search_seq, context_anchored,
        window_content_tokens
    FROM threads;
DROP TABLE threads;
ALTER TABLE threads_rebuilt RENAME TO threads;
CREATE INDEX threads_by_tenant_created ON threads (tenant_id, created_at, thread_key);
CREATE INDEX threads_behind_search ON threads (updated_at) WHERE search_seq < next_seq;
CREATE INDEX threads_by_name ON threads (tenant_id, thread_id);
CREATE TRIGGER messages_rewritten AFTER UPDATE OF body ON messages BEGIN
    DELETE FROM search_rows WHERE thread_key = old.thread_key AND seq = old.seq;
    UPDATE threads SET search_seq = min(search_seq, old.seq) WHERE thread_key = old.thread_key;
END;

-- An erasure's receipt is its thread's: keyed by the thread, then the erasure (a UUIDv7, as
-- unique alone as before; its thread's receipts are listed in that order).
CREATE TABLE erasures_rebuilt (
    erasure_id  TEXT NOT NULL,
    thread_key  TEXT NOT NULL,
    -- JSON array of the erased seqs.
    seqs        TEXT NOT NULL,
    -- The caller's reason, as sent (optional).
    reason      TEXT,
    -- JSON object: how many copies of each kind the erasure took text out of.
    artifacts   TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    -- When the database files stopped holding the erased text; NULL until then.
    scrubbed_at BIGINT,
    PRIMARY KEY (thread_key, erasure_id)
);
INSERT INTO erasures_rebuilt (erasure_id, thread_key, seqs, reason, artifacts, created_at,
        scrubbed_at)
    SELECT erasure_id, thread_key, seqs, reason, artifacts, created_at, scrubbed_at
    FROM erasures;
DROP TABLE erasures;
ALTER TABLE erasures_rebuilt RENAME TO erasures;
CREATE INDEX erasures_by_thread ON erasures (thread_key, created_at);

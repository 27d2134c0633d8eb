-- Threads and their append-only messages.
-- Every row of thread data carries `thread_key`, the internal id of its thread, so the tables can be
-- distributed by thread (e.g. Citus `create_distributed_table('messages', 'thread_key')`).
-- JSON is kept as TEXT: byte for byte what was stored, the same type on both backends.
CREATE TABLE threads (
    thread_key    TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL,
    thread_id     TEXT NOT NULL,
    metadata      TEXT NOT NULL,
    next_seq      BIGINT NOT NULL DEFAULT 0,
    visible_count BIGINT NOT NULL DEFAULT 0,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    UNIQUE (tenant_id, thread_id)
);
CREATE INDEX threads_by_tenant_created ON threads (tenant_id, created_at, thread_key);

CREATE TABLE messages (
    thread_key    TEXT NOT NULL,
    seq           BIGINT NOT NULL,
    uuid          TEXT NOT NULL,
    kind          TEXT NOT NULL,
    subtype       TEXT,
    visible_rank  BIGINT NOT NULL,
    body          TEXT NOT NULL,
    content_hash  TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    PRIMARY KEY (thread_key, seq),
    UNIQUE (thread_key, uuid)
);
CREATE INDEX messages_by_subtype ON messages (thread_key, subtype, seq) WHERE subtype IS NOT NULL;

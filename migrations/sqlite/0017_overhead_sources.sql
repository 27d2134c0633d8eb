-- Which threads taught each learned overhead (issue 36): derived data answers to its source, so
-- an erasure in a thread or its deletion forgets the overheads it taught (the tenant's model
-- digest, the prompt sizes and when), which the next first call learns again.
CREATE TABLE overhead_sources (
    thread_key TEXT NOT NULL,
    tenant_id  TEXT NOT NULL,
    model      TEXT NOT NULL,
    PRIMARY KEY (thread_key, tenant_id, model)
);

-- Appends update a thread's row with every batch. With the metadata's GIN index on that row
-- (0019), each of those updates read the metadata again as jsonb (a PL/pgSQL call with an
-- exception block, so a subtransaction) and wrote GIN entries for it. The index moves to a
-- table written only when the metadata is: when the thread is created, patched or forked.
DROP INDEX threads_by_metadata;

CREATE TABLE thread_metadata (
    thread_key TEXT PRIMARY KEY REFERENCES threads (thread_key) ON DELETE CASCADE,
    -- `{"<tenant_id>": <the metadata as jsonb>}`: jsonb_path_ops hashes each value with its
    -- whole path, so a filter's lookup (`@> '{"<tenant_id>": {"user": "ana"}}'`) reads the
    -- tenant's matches only, never another tenant's. A thread whose metadata jsonb refuses (a
    -- "\u0000" escape) or that has none has no row, and so matches no filter.
    members    JSONB NOT NULL
);

INSERT INTO thread_metadata (thread_key, members)
SELECT thread_key, jsonb_build_object(tenant_id, members)
FROM (SELECT thread_key, tenant_id, loupe_metadata_jsonb(metadata) AS members FROM threads WHERE metadata <> '{}') m
WHERE members IS NOT NULL;

-- Containment through a GIN index. Written only on a thread's create, PATCH or fork, so without
-- GIN's pending list (`fastupdate`), which every read scans whole until a vacuum merges it: up
-- to 4 MB, 5 ms a filtered list when measured, against 0.7 ms.
CREATE INDEX thread_metadata_by_members ON thread_metadata USING GIN (members jsonb_path_ops)
    WITH (fastupdate = off);

-- Erasures (issue 33): each one's receipt. The erased entries themselves stay in `messages` as
-- tombstones (seq, uuid, type and role kept, content gone); a receipt holds no content.
CREATE TABLE erasures (
    erasure_id  TEXT PRIMARY KEY,
    thread_key  TEXT NOT NULL,
    -- JSON array of the erased seqs.
    seqs        TEXT NOT NULL,
    -- The caller's reason, as sent (optional).
    reason      TEXT,
    -- JSON object: how many copies of each kind the erasure took text out of.
    artifacts   TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    -- When the database files stopped holding the erased text; NULL until then.
    scrubbed_at BIGINT
);
CREATE INDEX erasures_by_thread ON erasures (thread_key, created_at);

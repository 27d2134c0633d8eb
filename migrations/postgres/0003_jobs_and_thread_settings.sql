-- Durable background jobs (compaction now, summary-tree nodes next), per-thread settings, and the
-- running context-token estimate that drives automatic compaction.

-- Rough token estimate of the thread's current context (after its last compact boundary), kept up
-- to date on every append so the auto-compaction check never scans the history.
ALTER TABLE threads ADD COLUMN context_tokens BIGINT NOT NULL DEFAULT 0;

CREATE TABLE jobs (
    job_id           TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL,
    -- The thread the job works on (NULL for jobs that touch no thread).
    thread_key       TEXT,
    kind             TEXT NOT NULL,
    -- pending | running | succeeded | failed
    state            TEXT NOT NULL,
    payload          TEXT NOT NULL,
    result           TEXT,
    -- At most one pending or running job per key (e.g. one compaction per thread).
    dedup_key        TEXT,
    attempts         BIGINT NOT NULL DEFAULT 0,
    max_attempts     BIGINT NOT NULL,
    -- A pending job is claimable from this time on (retry backoff).
    run_after        BIGINT NOT NULL,
    -- The token of the claim holding the job; completion is fenced by it.
    lease_owner      TEXT,
    lease_expires_at BIGINT,
    last_error       TEXT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    finished_at      BIGINT
);
CREATE UNIQUE INDEX jobs_active_dedup ON jobs (dedup_key)
    WHERE dedup_key IS NOT NULL AND state IN ('pending', 'running');
CREATE INDEX jobs_pending ON jobs (run_after) WHERE state = 'pending';
CREATE INDEX jobs_running ON jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_by_thread ON jobs (thread_key);

-- Per-thread settings; a NULL column means "the server default".
CREATE TABLE thread_settings (
    thread_key          TEXT PRIMARY KEY,
    auto_compact_tokens BIGINT,
    -- JSON: {"enabled": bool, "tools": [..], "keep_recent": n, "min_bytes": n}
    microcompact        TEXT,
    updated_at          BIGINT NOT NULL
);

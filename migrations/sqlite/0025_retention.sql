-- Retention (GET/PUT /v1/retention, /v1/threads/{id}/retention): a tenant's policy, and a
-- thread's own, which replaces the tenant's whole when `retention_own` is 1. A thread expires
-- when idle (`updated_at`) or old (`created_at`) past its policy; lists leave expired
-- threads out at once, and the retention job deletes them (and trims what comes before the last
-- compact boundary, for policies that say so) in batches.
CREATE TABLE tenant_retention (
    tenant_id  TEXT PRIMARY KEY,
    idle_ms    BIGINT,
    age_ms     BIGINT,
    trim_before_boundary BIGINT NOT NULL DEFAULT 0,
    updated_at BIGINT NOT NULL
);

ALTER TABLE threads ADD COLUMN retention_own INTEGER NOT NULL DEFAULT 0;
ALTER TABLE threads ADD COLUMN retention_idle_ms BIGINT;
ALTER TABLE threads ADD COLUMN retention_age_ms BIGINT;
ALTER TABLE threads ADD COLUMN retention_trim INTEGER NOT NULL DEFAULT 0;
-- Entries below this seq were trimmed; the thread was last checked for a trim at this
-- `updated_at`, so the sweep passes over threads that have not changed since.
ALTER TABLE threads ADD COLUMN retention_trimmed_below BIGINT NOT NULL DEFAULT 0;
ALTER TABLE threads ADD COLUMN retention_checked_at BIGINT NOT NULL DEFAULT 0;
-- Partial: threads with a policy of their own are few, and appends pay nothing for it.
CREATE INDEX threads_with_own_retention ON threads (thread_key) WHERE retention_own = 1;

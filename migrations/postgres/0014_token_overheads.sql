-- Token estimates (issue 36). Whether a thread's context window holds a response that reported
-- `usage`: the first that does is the window's first call, whose prompt less the content before
-- it is what the model's requests carry that no entry holds (system prompt, tools). Threads
-- stored before this column count as having one, so nothing is learned from a state not known.
ALTER TABLE threads ADD COLUMN context_anchored BIGINT NOT NULL DEFAULT 0;
UPDATE threads SET context_anchored = 1;
-- That overhead per tenant and model, so a thread with no usage yet is estimated with it. A
-- running mean and mean deviation of the first calls' residuals; a few rows per tenant (the
-- models it uses), evicted least recently learned first. `model` is the SHA-256 of the model's
-- name: the table outlives the threads it learned from, and keeps none of their text.
CREATE TABLE model_overheads (
    tenant_id   TEXT NOT NULL,
    model       TEXT NOT NULL,
    tokens      BIGINT NOT NULL,
    spread      BIGINT NOT NULL,
    samples     BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, model)
);
CREATE INDEX model_overheads_recent ON model_overheads (tenant_id, updated_at);

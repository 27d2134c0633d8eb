-- The sender claims an endpoint, then sends its oldest undelivered delivery: one in flight per
-- endpoint (`busy_until`, a lease a dead sender's claim runs out of), in order, and after a
-- failed attempt the endpoint waits (`retry_at`) before its next, whichever delivery that is.
-- Endpoints are claimed least recently claimed first (`last_claimed_at`), so every tenant's
-- turn comes. The deliveries still to send are found through a partial index, whatever the
-- number of ended ones.
ALTER TABLE webhook_endpoints ADD COLUMN busy_until BIGINT;
ALTER TABLE webhook_endpoints ADD COLUMN retry_at BIGINT;
ALTER TABLE webhook_endpoints ADD COLUMN last_claimed_at BIGINT NOT NULL DEFAULT 0;
DROP INDEX webhook_deliveries_due;
CREATE INDEX webhook_deliveries_unsent ON webhook_deliveries (tenant_id, endpoint_id, delivery_id)
    WHERE state IN ('pending', 'sending');
CREATE INDEX webhook_deliveries_ended ON webhook_deliveries (created_at)
    WHERE state IN ('delivered', 'failed');

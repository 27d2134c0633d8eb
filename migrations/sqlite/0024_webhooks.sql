-- Webhooks (POST /v1/webhooks): a tenant's endpoints, and the outbox of their deliveries.
-- Deliveries are written by triggers, so every change that moves a thread (an append of any
-- path, a fork, a delete, an event of `thread_events`) queues its deliveries in its own
-- transaction: what commits is delivered, what rolls back never is. A delivery names its thread
-- and seqs, never entry content, so an erasure leaves nothing to chase here.
CREATE TABLE webhook_endpoints (
    tenant_id   TEXT NOT NULL,
    endpoint_id TEXT NOT NULL,
    url         TEXT NOT NULL,
    secret      TEXT NOT NULL,
    -- The event kinds, each between commas (`,entries.appended,thread.deleted,`).
    kinds       TEXT NOT NULL,
    description TEXT,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, endpoint_id)
);

CREATE TABLE webhook_deliveries (
    delivery_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id       TEXT NOT NULL,
    endpoint_id     TEXT NOT NULL,
    kind            TEXT NOT NULL,
    thread_id       TEXT NOT NULL,
    data            TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    -- pending → sending (claimed until `lease_until`) → delivered, or pending again after a
    -- failed attempt, or failed after the last one.
    state           TEXT NOT NULL DEFAULT 'pending',
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    lease_until     BIGINT,
    last_status     BIGINT,
    last_error      TEXT,
    delivered_at    BIGINT
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt_at);
CREATE INDEX webhook_deliveries_of_endpoint
    ON webhook_deliveries (tenant_id, endpoint_id, delivery_id);

-- Now, in Unix milliseconds, as the triggers stamp their rows.
CREATE TRIGGER webhook_entries_appended AFTER UPDATE OF next_seq ON threads
WHEN NEW.next_seq > OLD.next_seq
BEGIN
    INSERT INTO webhook_deliveries
        (tenant_id, endpoint_id, kind, thread_id, data, created_at, next_attempt_at)
    SELECT e.tenant_id, e.endpoint_id, 'entries.appended', NEW.thread_id,
        json_object('thread_id', NEW.thread_id, 'first_seq', OLD.next_seq,
                    'next_seq', NEW.next_seq),
        CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
        CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
    FROM webhook_endpoints e
    WHERE e.tenant_id = NEW.tenant_id AND e.kinds LIKE '%,entries.appended,%';
END;

CREATE TRIGGER webhook_thread_created AFTER INSERT ON threads
BEGIN
    INSERT INTO webhook_deliveries
        (tenant_id, endpoint_id, kind, thread_id, data, created_at, next_attempt_at)
    SELECT e.tenant_id, e.endpoint_id, 'thread.created', NEW.thread_id,
        json_object('thread_id', NEW.thread_id, 'forked_from', NEW.forked_from_id,
                    'forked_at_seq', NEW.forked_at_seq),
        CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
        CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
    FROM webhook_endpoints e
    WHERE e.tenant_id = NEW.tenant_id AND e.kinds LIKE '%,thread.created,%';
END;

CREATE TRIGGER webhook_thread_deleted AFTER DELETE ON threads
BEGIN
    INSERT INTO webhook_deliveries
        (tenant_id, endpoint_id, kind, thread_id, data, created_at, next_attempt_at)
    SELECT e.tenant_id, e.endpoint_id, 'thread.deleted', OLD.thread_id,
        json_object('thread_id', OLD.thread_id),
        CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
        CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
    FROM webhook_endpoints e
    WHERE e.tenant_id = OLD.tenant_id AND e.kinds LIKE '%,thread.deleted,%';
END;

-- `thread_events` kinds (`erasure`, `expired`, `trimmed`) become `thread.<kind>`.
CREATE TRIGGER webhook_thread_event AFTER INSERT ON thread_events
BEGIN
    INSERT INTO webhook_deliveries
        (tenant_id, endpoint_id, kind, thread_id, data, created_at, next_attempt_at)
    SELECT e.tenant_id, e.endpoint_id, 'thread.' || NEW.kind, t.thread_id,
        json_set(NEW.data, '$.thread_id', t.thread_id),
        CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
        CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
    FROM threads t JOIN webhook_endpoints e ON e.tenant_id = t.tenant_id
    WHERE t.thread_key = NEW.thread_key AND e.kinds LIKE '%,thread.' || NEW.kind || ',%';
END;

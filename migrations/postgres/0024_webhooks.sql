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
    delivery_id     BIGINT GENERATED ALWAYS AS IDENTITY,
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
    delivered_at    BIGINT,
    PRIMARY KEY (delivery_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt_at);
CREATE INDEX webhook_deliveries_of_endpoint
    ON webhook_deliveries (tenant_id, endpoint_id, delivery_id);

-- Queues `kind` for every endpoint of `tenant` that takes it.
CREATE FUNCTION loupe_webhook_queue(p_tenant TEXT, p_kind TEXT, p_thread TEXT, p_data jsonb)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO webhook_deliveries
        (tenant_id, endpoint_id, kind, thread_id, data, created_at, next_attempt_at)
    SELECT e.tenant_id, e.endpoint_id, p_kind, p_thread, p_data::text,
        (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
        (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    FROM webhook_endpoints e
    WHERE e.tenant_id = p_tenant AND e.kinds LIKE '%,' || p_kind || ',%';
$$;

CREATE FUNCTION loupe_webhook_thread_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM loupe_webhook_queue(NEW.tenant_id, 'thread.created', NEW.thread_id,
            jsonb_build_object('thread_id', NEW.thread_id, 'forked_from', NEW.forked_from_id,
                               'forked_at_seq', NEW.forked_at_seq));
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM loupe_webhook_queue(OLD.tenant_id, 'thread.deleted', OLD.thread_id,
            jsonb_build_object('thread_id', OLD.thread_id));
        RETURN OLD;
    ELSE
        PERFORM loupe_webhook_queue(NEW.tenant_id, 'entries.appended', NEW.thread_id,
            jsonb_build_object('thread_id', NEW.thread_id, 'first_seq', OLD.next_seq,
                               'next_seq', NEW.next_seq));
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER webhook_entries_appended AFTER UPDATE OF next_seq ON threads
    FOR EACH ROW WHEN (NEW.next_seq > OLD.next_seq)
    EXECUTE FUNCTION loupe_webhook_thread_moved();
CREATE TRIGGER webhook_thread_created AFTER INSERT ON threads
    FOR EACH ROW EXECUTE FUNCTION loupe_webhook_thread_moved();
CREATE TRIGGER webhook_thread_deleted AFTER DELETE ON threads
    FOR EACH ROW EXECUTE FUNCTION loupe_webhook_thread_moved();

-- `thread_events` kinds (`erasure`, `expired`, `trimmed`) become `thread.<kind>`.
CREATE FUNCTION loupe_webhook_thread_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    owner RECORD;
BEGIN
    SELECT tenant_id, thread_id INTO owner FROM threads WHERE thread_key = NEW.thread_key;
    IF FOUND THEN
        PERFORM loupe_webhook_queue(owner.tenant_id, 'thread.' || NEW.kind, owner.thread_id,
            NEW.data::jsonb || jsonb_build_object('thread_id', owner.thread_id));
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER webhook_thread_event AFTER INSERT ON thread_events
    FOR EACH ROW EXECUTE FUNCTION loupe_webhook_thread_event();

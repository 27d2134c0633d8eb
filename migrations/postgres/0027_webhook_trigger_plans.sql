-- The outbox triggers of 0024 called a SQL function per append, which PostgreSQL plans again at
-- every call: appends lost 38% of their rate with no endpoint at all. The triggers now write
-- their rows themselves, from PL/pgSQL, whose statements keep their plans, and look for an
-- endpoint of the tenant first (an index probe), so a tenant without one pays only that.
CREATE OR REPLACE FUNCTION loupe_webhook_thread_moved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    row_of threads;
    kind TEXT;
    data jsonb;
    now_ms BIGINT;
BEGIN
    IF TG_OP = 'DELETE' THEN
        row_of := OLD;
    ELSE
        row_of := NEW;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.tenant_id = row_of.tenant_id) THEN
        RETURN row_of;
    END IF;
    IF TG_OP = 'INSERT' THEN
        kind := 'thread.created';
        data := jsonb_build_object('thread_id', NEW.thread_id, 'forked_from', NEW.forked_from_id,
                                   'forked_at_seq', NEW.forked_at_seq);
    ELSIF TG_OP = 'DELETE' THEN
        kind := 'thread.deleted';
        data := jsonb_build_object('thread_id', OLD.thread_id);
    ELSE
        kind := 'entries.appended';
        data := jsonb_build_object('thread_id', NEW.thread_id, 'first_seq', OLD.next_seq,
                                   'next_seq', NEW.next_seq);
    END IF;
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    INSERT INTO webhook_deliveries
        (tenant_id, endpoint_id, kind, thread_id, data, created_at, next_attempt_at)
    SELECT e.tenant_id, e.endpoint_id, kind, row_of.thread_id, data::text, now_ms, now_ms
    FROM webhook_endpoints e
    WHERE e.tenant_id = row_of.tenant_id AND e.kinds LIKE '%,' || kind || ',%';
    RETURN row_of;
END $$;

CREATE OR REPLACE FUNCTION loupe_webhook_thread_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    owner RECORD;
    kind TEXT := 'thread.' || NEW.kind;
    now_ms BIGINT;
BEGIN
    SELECT t.tenant_id, t.thread_id INTO owner FROM threads t WHERE t.thread_key = NEW.thread_key;
    IF NOT FOUND OR NOT EXISTS
        (SELECT 1 FROM webhook_endpoints e WHERE e.tenant_id = owner.tenant_id) THEN
        RETURN NEW;
    END IF;
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    INSERT INTO webhook_deliveries
        (tenant_id, endpoint_id, kind, thread_id, data, created_at, next_attempt_at)
    SELECT e.tenant_id, e.endpoint_id, kind, owner.thread_id,
        (NEW.data::jsonb || jsonb_build_object('thread_id', owner.thread_id))::text, now_ms, now_ms
    FROM webhook_endpoints e
    WHERE e.tenant_id = owner.tenant_id AND e.kinds LIKE '%,' || kind || ',%';
    RETURN NEW;
END $$;

DROP FUNCTION loupe_webhook_queue(TEXT, TEXT, TEXT, jsonb);

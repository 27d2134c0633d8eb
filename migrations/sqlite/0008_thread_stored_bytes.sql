-- The bytes of a thread's stored bodies, moved by every write that adds rows, so an append past
-- `--max-thread-bytes` is refused without reading the thread, and a context read knows when its
-- window is large enough to count against the in-flight window budget (issue 31).
ALTER TABLE threads ADD COLUMN stored_bytes BIGINT NOT NULL DEFAULT 0;
UPDATE threads SET stored_bytes = COALESCE(
    (SELECT SUM(octet_length(m.body)) FROM messages m WHERE m.thread_key = threads.thread_key), 0);

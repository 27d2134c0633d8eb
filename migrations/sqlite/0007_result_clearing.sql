-- Reversible clearing of old tool results in the context view (issue 27): JSON
-- {"enabled": bool, "keep_tokens": n, "batch_tokens": n, "min_bytes": n}; NULL = off.
ALTER TABLE thread_settings ADD COLUMN clearing TEXT;

-- One append's transaction as Loupe's PostgreSQL group of one makes it, straight from pgbench:
-- lock and read the thread, insert 2 rows of about 300 B and move the counters, commit.
\set t random(0, 99)
BEGIN;
SELECT thread_key, next_seq, visible_count FROM threads
  WHERE tenant_id = :tenant AND thread_id = concat(:prefix::text, :t::text) FOR UPDATE;
WITH thread AS (
  SELECT thread_key, next_seq, visible_count FROM threads
  WHERE tenant_id = :tenant AND thread_id = concat(:prefix::text, :t::text)
), inserted AS (
  INSERT INTO messages (thread_key, seq, uuid, kind, subtype, visible_rank, body, content_hash, created_at)
  SELECT thread_key, next_seq + i, md5(random()::text), 'user', NULL, visible_count + i + 1,
         :body, md5(random()::text), 0
  FROM thread, generate_series(0, 1) AS i
  RETURNING 1
)
UPDATE threads SET next_seq = next_seq + 2, visible_count = visible_count + 2, updated_at = 0
  WHERE tenant_id = :tenant AND thread_id = concat(:prefix::text, :t::text);
END;

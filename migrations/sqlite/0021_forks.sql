-- A fork's lineage (POST /v1/threads/{id}/fork): the thread it was copied from and how many of
-- its entries it took. No foreign key: the parent may be deleted, and the fork stays whole (its
-- rows are its own). `forked_from_key` finds a thread's forks, which an erasure reaches.
ALTER TABLE threads ADD COLUMN forked_from_key TEXT;
ALTER TABLE threads ADD COLUMN forked_from_id TEXT;
ALTER TABLE threads ADD COLUMN forked_at_seq BIGINT;
-- Partial: a thread that is no fork (nearly all) has no entry, so appends pay nothing for it.
CREATE INDEX threads_by_parent ON threads (forked_from_key) WHERE forked_from_key IS NOT NULL;

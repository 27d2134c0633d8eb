-- Bumped by every change that takes text out of a thread's derived data (a snip hiding messages
-- from the summary tree). Background writers (tree jobs) read it before their model calls and
-- check it in their writing transaction, so a line built from text read before the change is
-- never written after it (issue 33).
ALTER TABLE threads ADD COLUMN redaction_epoch BIGINT NOT NULL DEFAULT 0;

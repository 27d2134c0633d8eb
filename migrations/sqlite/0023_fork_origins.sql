-- Where a fork's copied entries came from, for erasures to reach them: `forked_from_key` and
-- `copied_below_seq` (entries with a smaller seq were copied from that thread). They start as
-- the lineage (`forked_from_id`, `forked_at_seq`, which the API shows and nothing changes) and
-- move when a fork in between is deleted: its forks then point to its parent, below the lower
-- of the two seqs, so an erasure there still reaches them.
ALTER TABLE threads ADD COLUMN copied_below_seq BIGINT;
UPDATE threads SET copied_below_seq = forked_at_seq WHERE forked_from_key IS NOT NULL;

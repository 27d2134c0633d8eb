-- A window's content at the default rates while no response of it reported `usage` (issue 36):
-- its first call's prompt less this is the model's overhead, counted as the content-only read
-- that adds it counts content (`context_tokens` is an upper bound, a quarter higher). -1 when
-- unknown: a window opened at a boundary bringing back a preserved segment, or one stored
-- before this column (those are all marked anchored already, so nothing is asked of them).
ALTER TABLE threads ADD COLUMN window_content_tokens BIGINT NOT NULL DEFAULT 0;
UPDATE threads SET window_content_tokens = -1;

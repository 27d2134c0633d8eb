-- The loss ledger (issue 35): what each summary left out. The anchors of an entry (paths,
-- commands, URLs, identifiers and error codes, numbers with units; `history::anchors`) are
-- stored beside its searchable text, so they go wherever the entry's search row goes (a snip,
-- an erasure, a rewrite, the thread's deletion). A summary's ledger is read from the anchors of
-- the entries it covers, each marked kept or dropped against the summary's text.
ALTER TABLE search_rows ADD COLUMN anchors TEXT NOT NULL DEFAULT '';
-- Rows indexed before anchors existed are indexed again.
TRUNCATE search_rows;
UPDATE threads SET search_seq = 0;
-- How many anchors of each kind a summarized outline line dropped, with those its children
-- dropped (`kind:count,…`); summed over the lines shown into the outline's footer.
ALTER TABLE tree_nodes ADD COLUMN dropped TEXT NOT NULL DEFAULT '';

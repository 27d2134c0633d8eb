-- Search finds summary lines too (issue 35): the lines a summarizer wrote, which may say what no
-- single entry says. Verbatim lines repeat their entries, which are searched already; a hidden
-- line has no text. A trigram index (`pg_trgm`) over those lines serves substrings; a line
-- rewritten or deleted is found by its new text only, since the index is the table's own.
CREATE INDEX tree_nodes_trigrams ON tree_nodes USING gin (text gin_trgm_ops)
    WHERE summarizer NOT IN ('verbatim', 'hidden');
-- The full-text index of entries is read by no query: ranking computes `ts_rank_cd` on the rows
-- the trigram index found. Keeping it cost every indexed entry a third GIN insert.
DROP INDEX IF EXISTS search_rows_words;

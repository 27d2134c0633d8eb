-- Search (issue 35): what a model could read of each stored entry, indexed by PostgreSQL's own
-- engines. `search_rows` holds the text (one row per entry that has any); a trigram index (`pg_trgm`) serves substrings (paths, error codes) and a
-- full-text index serves ranked words (`ts_rank_cd`). Rows go when their entry is snipped,
-- erased, rewritten or deleted: derived data answers to its source.
CREATE EXTENSION IF NOT EXISTS pg_trgm;
-- The index follows the appends: each thread's entries before `search_seq` are indexed. An
-- indexer (the search itself for its thread, a worker for the rest) takes the ones after it;
-- the partial index finds the threads it has left behind.
ALTER TABLE threads ADD COLUMN search_seq BIGINT NOT NULL DEFAULT 0;
CREATE INDEX threads_behind_search ON threads (updated_at) WHERE search_seq < next_seq;
CREATE TABLE search_rows (
    thread_key TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    -- Everything but thinking: text, tool calls and results, documents, summaries.
    text       TEXT NOT NULL,
    -- Thinking, searched only when the caller's thinking mode would send it.
    thinking   TEXT NOT NULL,
    PRIMARY KEY (thread_key, seq)
);
CREATE INDEX search_rows_trigrams ON search_rows USING gin (text gin_trgm_ops);
CREATE INDEX search_rows_thinking_trigrams ON search_rows USING gin (thinking gin_trgm_ops);
CREATE INDEX search_rows_words ON search_rows USING gin (to_tsvector('simple', text));
-- An entry rewritten (an erasure's tombstone, a summary derived again) stops being found by
-- what it said: whoever rewrote it indexes the new text.
CREATE FUNCTION loupe_messages_rewritten() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM search_rows WHERE thread_key = OLD.thread_key AND seq = OLD.seq;
    UPDATE threads SET search_seq = least(search_seq, OLD.seq) WHERE thread_key = OLD.thread_key;
    RETURN NULL;
END;
$$;
CREATE TRIGGER messages_rewritten AFTER UPDATE OF body ON messages
    FOR EACH ROW EXECUTE FUNCTION loupe_messages_rewritten();

-- Search (issue 35): what a model could read of each stored entry, indexed by SQLite's own
-- full-text engine. `search_rows` holds the text (one row per entry that has any); `search_index` is an FTS5 index over it with the trigram tokenizer,
-- which serves both substrings (paths, error codes) and ranked words (bm25). Rows go when their
-- entry is snipped, erased, rewritten or deleted: derived data answers to its source.
-- The index follows the appends: each thread's entries before `search_seq` are indexed. An
-- indexer (the search itself for its thread, a worker for the rest) takes the ones after it;
-- the partial index finds the threads it has left behind.
ALTER TABLE threads ADD COLUMN search_seq BIGINT NOT NULL DEFAULT 0;
CREATE INDEX threads_behind_search ON threads (updated_at) WHERE search_seq < next_seq;
CREATE TABLE search_rows (
    id         INTEGER PRIMARY KEY,
    thread_key TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    -- Everything but thinking: text, tool calls and results, documents, summaries.
    text       TEXT NOT NULL,
    -- Thinking, searched only when the caller's thinking mode would send it.
    thinking   TEXT NOT NULL,
    UNIQUE (thread_key, seq)
);
CREATE VIRTUAL TABLE search_index USING fts5(
    text, thinking, content = 'search_rows', content_rowid = 'id', tokenize = 'trigram'
);
CREATE TRIGGER search_rows_added AFTER INSERT ON search_rows BEGIN
    INSERT INTO search_index (rowid, text, thinking) VALUES (new.id, new.text, new.thinking);
END;
CREATE TRIGGER search_rows_removed AFTER DELETE ON search_rows BEGIN
    INSERT INTO search_index (search_index, rowid, text, thinking)
        VALUES ('delete', old.id, old.text, old.thinking);
END;
-- An entry rewritten (an erasure's tombstone, a summary derived again) stops being found by
-- what it said: whoever rewrote it indexes the new text.
CREATE TRIGGER messages_rewritten AFTER UPDATE OF body ON messages BEGIN
    DELETE FROM search_rows WHERE thread_key = old.thread_key AND seq = old.seq;
    UPDATE threads SET search_seq = min(search_seq, old.seq) WHERE thread_key = old.thread_key;
END;

-- Search finds summary lines too (issue 35): the lines a summarizer wrote, which may say what no
-- single entry says. Verbatim lines repeat their entries, which are searched already; a hidden
-- line has no text. An FTS5 index with the trigram tokenizer over `tree_nodes`, kept in step
-- by triggers, so a line rewritten (a snip's stand-in, a line summarized again) or deleted
-- with its thread is found by its new text only.
CREATE VIRTUAL TABLE line_index USING fts5(
    text, content = 'tree_nodes', content_rowid = 'rowid', tokenize = 'trigram'
);
INSERT INTO line_index (rowid, text)
    SELECT rowid, text FROM tree_nodes
    WHERE summarizer NOT IN ('verbatim', 'hidden') AND text <> '';
CREATE TRIGGER tree_nodes_searched AFTER INSERT ON tree_nodes
    WHEN new.summarizer NOT IN ('verbatim', 'hidden') AND new.text <> '' BEGIN
    INSERT INTO line_index (rowid, text) VALUES (new.rowid, new.text);
END;
CREATE TRIGGER tree_nodes_unsearched AFTER DELETE ON tree_nodes
    WHEN old.summarizer NOT IN ('verbatim', 'hidden') AND old.text <> '' BEGIN
    INSERT INTO line_index (line_index, rowid, text) VALUES ('delete', old.rowid, old.text);
END;
-- One trigger, two steps in order: the old text leaves the index before the new one enters.
CREATE TRIGGER tree_nodes_researched AFTER UPDATE ON tree_nodes BEGIN
    INSERT INTO line_index (line_index, rowid, text)
        SELECT 'delete', old.rowid, old.text
        WHERE old.summarizer NOT IN ('verbatim', 'hidden') AND old.text <> '';
    INSERT INTO line_index (rowid, text)
        SELECT new.rowid, new.text
        WHERE new.summarizer NOT IN ('verbatim', 'hidden') AND new.text <> '';
END;

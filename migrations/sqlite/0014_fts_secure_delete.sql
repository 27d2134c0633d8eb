-- Deleting from the search indexes removes the entry's tokens from the index's pages at once
-- (FTS5 `secure-delete`), instead of leaving them in old segments until a merge: a deleted
-- thread's text, or a snipped entry's, is gone from the file without an `optimize` of the whole
-- index (its freed pages are zeroed by `secure_delete`, set on every connection).
INSERT INTO search_index (search_index, rank) VALUES ('secure-delete', 1);
INSERT INTO line_index (line_index, rank) VALUES ('secure-delete', 1);

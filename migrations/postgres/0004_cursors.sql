-- Named bookmarks of a thread's consumers (memory extraction, indexing, …), with an optional lease
-- for competing workers of one consumer.
-- A row exists once a consumer has claimed or advanced; a cursor without a row has no bookmark yet.
-- `bookmark_rank` copies the bookmarked message's `visible_rank` (messages are immutable), so the
-- number of model-visible messages after the bookmark is `threads.visible_count - bookmark_rank`:
-- one primary-key read, however long the thread.
-- `lease_token` is the last token handed out; `lease_expires_at` is NULL once an advance released
-- it, so the holder's retry of that advance is still recognised while a stranger's token is not.
CREATE TABLE cursors (
    thread_key       TEXT NOT NULL,
    name             TEXT NOT NULL,
    bookmark_seq     BIGINT,
    bookmark_uuid    TEXT,
    bookmark_rank    BIGINT NOT NULL DEFAULT 0,
    advanced_at      BIGINT,
    lease_token      TEXT,
    lease_expires_at BIGINT,
    created_at       BIGINT NOT NULL,
    PRIMARY KEY (thread_key, name)
);

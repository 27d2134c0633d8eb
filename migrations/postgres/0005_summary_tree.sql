-- The summary tree and the outline (issue 5). Node (level, idx) covers the messages with seq in
-- [idx * 2^level, (idx + 1) * 2^level); it is written once, by a tree job, when its sources exist.
CREATE TABLE tree_nodes (
    thread_key TEXT NOT NULL,
    level      BIGINT NOT NULL,
    idx        BIGINT NOT NULL,
    -- The line's text, without its `id+n|` address.
    text       TEXT NOT NULL,
    -- Who wrote it: `verbatim` (a free node), `extractive`, `anthropic:<model>`, …
    summarizer TEXT NOT NULL,
    -- Model calls it cost (0 for free and extractive nodes).
    calls      BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (thread_key, level, idx)
);

-- The outline's stored state: the tiles (nodes, in order) covering [0, boundary). Stored so
-- consecutive context reads, and a restart, render the same bytes until the next change.
CREATE TABLE outlines (
    thread_key TEXT PRIMARY KEY,
    -- JSON array of [level, idx] pairs.
    tiles      TEXT NOT NULL,
    boundary   BIGINT NOT NULL,
    -- Bumped on every change (compare-and-set by writers).
    version    BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- JSON: {"enabled": bool, "line_bytes": n, "budget_bytes": n, "tail_tokens": n}
ALTER TABLE thread_settings ADD COLUMN outline TEXT;

-- A thread's events other than its entries (GET /v1/threads/{id}/events), each written in the
-- transaction of the change it reports. Entries are their own record (`messages`, by seq);
-- these are numbered per thread (`event_seq`, from 1) and placed among the entries by
-- `next_seq`, the thread's next seq when the event committed, read under the thread's row
-- lock: the event comes after entry `next_seq - 1` and before entry `next_seq`. `data` is
-- JSON, and never holds entry content (an erasure's event names seqs only).
CREATE TABLE thread_events (
    thread_key TEXT NOT NULL,
    event_seq  BIGINT NOT NULL,
    next_seq   BIGINT NOT NULL,
    kind       TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (thread_key, event_seq)
);

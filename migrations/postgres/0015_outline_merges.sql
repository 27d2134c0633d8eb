-- Each move of a thread's outline boundary (issue 36): the economics chart marks every merge
-- where it happened, not only the outline's current boundary. `at_seq` is the thread's
-- `next_seq` when the outline moved (the first request sent with it follows the entry before
-- it); `boundary` is where its lines end from then on. Deleted with the thread.
CREATE TABLE outline_merges (
    thread_key TEXT NOT NULL,
    at_seq     BIGINT NOT NULL,
    boundary   BIGINT NOT NULL,
    PRIMARY KEY (thread_key, at_seq, boundary)
);

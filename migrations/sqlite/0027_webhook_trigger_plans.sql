-- PostgreSQL's outbox triggers were rewritten to keep their plans (its migration 0027). SQLite
-- compiles a trigger's statements with the statement that fires it: nothing to change here.
SELECT 1;

-- A group of appends written in one statement (src/store/pg_group.rs) asserts, in that
-- statement, that every thread it moved was still as the group read it: a false assertion
-- raises SQLSTATE LP001 and aborts the statement, so nothing of the group is kept. PostgreSQL
-- only (SQLite writes its groups under its write lock); plain SQL cannot raise an error.
CREATE OR REPLACE FUNCTION loupe_assert(ok boolean, what text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  IF ok IS NOT TRUE THEN
    RAISE EXCEPTION 'loupe_assert: %', what USING ERRCODE = 'LP001';
  END IF;
  RETURN ok;
END
$$;

-- Point the transaction's search_path at tidegate's schema, for tidegate's statements run
-- in a transaction of the application's own connection (enqueue with connection=), and
-- return the search_path it had, which restore_search_path.sql puts back. Only for the
-- transaction (set_config's is_local): a rollback or the commit ends it either way. The
-- caller's value is read first: a MATERIALIZED CTE is scanned before the outer target
-- list is computed.
WITH caller AS MATERIALIZED (
    SELECT current_setting('search_path') AS search_path
)
SELECT caller.search_path, set_config('search_path', %(schema)s, true)
FROM caller

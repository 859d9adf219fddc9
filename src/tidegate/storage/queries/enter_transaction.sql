-- Behind a pooler in transaction mode (database_pooler = pgbouncer), the first statement
-- of every transaction: tidegate's schema and UTC for this transaction only (set_config's
-- is_local), sent in one query with the statement it precedes (PooledCursor in
-- storage/database.py), so it costs no round trip. A session-level SET would stay on the
-- server connection after the transaction and meet whichever client the pooler hands
-- that connection next.
SELECT set_config('search_path', %(schema)s, true), set_config('timezone', 'UTC', true)

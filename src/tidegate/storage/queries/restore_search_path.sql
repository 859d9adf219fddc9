-- Give the application's transaction back the search_path enter_schema.sql returned, so
-- its own statements after tidegate's see their own tables.
SELECT set_config('search_path', %(search_path)s, true)

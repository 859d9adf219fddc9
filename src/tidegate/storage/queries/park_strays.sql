-- The worker's parker: runs at the head of the lanes this worker takes whose task no
-- live worker has, set 'pending' (functions/park_strays.sql).
SELECT * FROM park_strays(
    %(lanes)s::text[], %(wildcard)s::boolean, %(tasks)s::text[], %(scan_limit)s::integer,
    %(live_seconds)s::float8
)

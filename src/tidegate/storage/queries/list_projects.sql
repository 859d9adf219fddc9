-- Projects in id order (one, by %(id)s), a page at a time: after the keyset
-- %(after)s (the last id of the page before), at most %(limit)s (NULL: all), along
-- projects_pkey.
SELECT id, fast_lane_cap, concurrency, ingest_rate, ingest_burst, backlog_cap,
       created_at, updated_at
FROM projects
WHERE (%(id)s::text IS NULL OR id = %(id)s)
  AND (%(after)s::text IS NULL OR id > %(after)s)
ORDER BY id
LIMIT %(limit)s::integer

SELECT id, fast_lane_cap, concurrency, ingest_rate, ingest_burst, backlog_cap,
       created_at, updated_at
FROM projects
WHERE %(id)s::text IS NULL OR id = %(id)s
ORDER BY id

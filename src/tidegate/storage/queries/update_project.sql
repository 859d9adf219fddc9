-- Change the limits named in the patch (a JSON object); a JSON null clears a limit.
-- Admission reads the row on every request, so a change holds for the next one.
UPDATE projects SET
    fast_lane_cap = CASE WHEN %(patch)s::jsonb ? 'fast_lane_cap'
                         THEN (%(patch)s::jsonb ->> 'fast_lane_cap')::integer ELSE fast_lane_cap END,
    concurrency   = CASE WHEN %(patch)s::jsonb ? 'concurrency'
                         THEN (%(patch)s::jsonb ->> 'concurrency')::integer ELSE concurrency END,
    ingest_rate   = CASE WHEN %(patch)s::jsonb ? 'ingest_rate'
                         THEN (%(patch)s::jsonb ->> 'ingest_rate')::float8 ELSE ingest_rate END,
    ingest_burst  = CASE WHEN %(patch)s::jsonb ? 'ingest_burst'
                         THEN coalesce((%(patch)s::jsonb ->> 'ingest_burst')::integer, 1)
                         ELSE ingest_burst END,
    backlog_cap   = CASE WHEN %(patch)s::jsonb ? 'backlog_cap'
                         THEN (%(patch)s::jsonb ->> 'backlog_cap')::integer ELSE backlog_cap END,
    updated_at = now()
WHERE id = %(id)s
RETURNING id, fast_lane_cap, concurrency, ingest_rate, ingest_burst, backlog_cap,
          created_at, updated_at

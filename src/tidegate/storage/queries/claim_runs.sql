-- Claim up to %(demand)s runs for one workloop, following its lane chain, taking only
-- runs of the tasks this worker has (functions/claim_runs.sql: a chain gives NULL
-- demands and others_demand; shares give each share's).
SELECT * FROM claim_runs(
    %(lanes)s::text[], %(wildcard)s::boolean, %(demand)s::integer, %(demands)s::integer[],
    %(others_demand)s::integer, %(worker_id)s::text, %(workloop)s::smallint,
    %(lease_seconds)s::float8, %(scan_limit)s::integer, %(head_scan)s::integer,
    %(tasks)s::text[], %(live_seconds)s::float8
)

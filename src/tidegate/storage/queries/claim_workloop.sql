-- A remote worker's claim for one workloop, with the outcomes it carries, in one
-- statement (functions/claim_workloop.sql).
SELECT * FROM claim_workloop(
    %(token_hash)s::text, %(worker_id)s::text, %(workloop)s::smallint, %(slots)s::integer,
    %(demand)s::integer, %(outcomes)s::jsonb, %(completed_channel)s::text, %(channel)s::text,
    %(lanes)s::text[], %(wildcard)s::boolean, %(demands)s::integer[],
    %(others_demand)s::integer, %(lease_seconds)s::float8, %(scan_limit)s::integer,
    %(head_scan)s::integer, %(tasks)s::text[], %(live_seconds)s::float8
)

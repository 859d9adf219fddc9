-- Claim up to %(demand)s runs for one workloop: see the function claim_runs
-- (migration 0003) for the order, the per-key limits and why they are exact.
SELECT * FROM claim_runs(
    %(lanes)s::text[], %(wildcard)s::boolean, %(demand)s::integer, %(worker_id)s::text,
    %(workloop)s::smallint, %(lease_seconds)s::float8, %(scan_limit)s::integer,
    %(head_scan)s::integer
)

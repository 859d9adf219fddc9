-- Claim up to %(demand)s runs for one workloop, following its lane chain.
--
-- limits: whether any key policy or project concurrency is set. Where none is, the
--   claim is this one set-based statement:
--   named: the lanes the chain names, in chain order, one ordered probe of
--     runs_claim_lane per lane. The nested loop over the chain (WITH ORDINALITY keeps its
--     order) asks the next lane only when the lanes before it ran short, and the LIMIT
--     stops probing, and locking, at demand.
--   rest: only with `*` (last in the chain): every lane the chain does not name, in the
--     same order, through runs_claim_any, for whatever demand the named lanes left.
--   FOR UPDATE SKIP LOCKED lets concurrent claimers pass each other's rows; the update
--   probes runs_pkey with the array of picked ids.
-- Where limits are set, the function claim_runs (migration 0003) claims instead, key by
-- key under advisory locks; the one-time filter on `limits` means only one of the two
-- runs.
WITH limits AS MATERIALIZED (
    SELECT EXISTS (SELECT 1 FROM key_policies)
        OR EXISTS (SELECT 1 FROM projects WHERE concurrency IS NOT NULL) AS apply
),
named AS (
    SELECT probe.id
    FROM unnest(%(lanes)s::text[]) WITH ORDINALITY AS chain(lane, position)
    CROSS JOIN LATERAL (
        SELECT runs.id FROM runs
        WHERE runs.lane = chain.lane AND runs.state = 'available'
        ORDER BY runs.rank, runs.id
        LIMIT %(demand)s
        FOR UPDATE SKIP LOCKED
    ) AS probe
    WHERE NOT (SELECT apply FROM limits)
    LIMIT %(demand)s
),
rest AS (
    SELECT id FROM runs
    WHERE %(wildcard)s::boolean
      AND NOT (SELECT apply FROM limits)
      AND state = 'available'
      AND lane <> ALL(%(lanes)s::text[])
    ORDER BY rank, id
    LIMIT %(demand)s - (SELECT count(*) FROM named)
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE runs
    SET state = 'running',
        attempt = attempt + 1,
        attempted_at = now(),
        worker_id = %(worker_id)s,
        workloop = %(workloop)s,
        lease_expires_at = now() + make_interval(secs => %(lease_seconds)s::float8)
    WHERE id = ANY(ARRAY(SELECT id FROM named UNION ALL SELECT id FROM rest))
    RETURNING *
)
SELECT * FROM claimed
UNION ALL
SELECT * FROM claim_runs(
    %(lanes)s::text[], %(wildcard)s::boolean, %(demand)s::integer, %(worker_id)s::text,
    %(workloop)s::smallint, %(lease_seconds)s::float8, %(scan_limit)s::integer,
    %(head_scan)s::integer
)
WHERE (SELECT apply FROM limits)

-- Claim up to %(demand)s runs for one workloop, following its lane chain.
--
-- named: the lanes the chain names, in chain order, one ordered probe of
--   runs_claim_lane per lane. The nested loop over the chain (WITH ORDINALITY keeps its
--   order) asks the next lane only when the lanes before it ran short, and the LIMIT
--   stops probing, and locking, at demand.
-- rest: only with `*` (last in the chain): every lane the chain does not name, in the
--   same order, through runs_claim_any, for whatever demand the named lanes left.
-- FOR UPDATE SKIP LOCKED lets concurrent claimers pass each other's rows; locking in
-- the CTEs keeps the UPDATE from touching more rows than were picked.
WITH named AS (
    SELECT picked.id
    FROM unnest(%(lanes)s::text[]) WITH ORDINALITY AS chain(lane, position)
    CROSS JOIN LATERAL (
        SELECT runs.id FROM runs
        WHERE runs.lane = chain.lane AND runs.state = 'available'
        ORDER BY runs.priority, runs.scheduled_at, runs.id
        LIMIT %(demand)s
        FOR UPDATE SKIP LOCKED
    ) AS picked
    LIMIT %(demand)s
),
rest AS (
    SELECT id FROM runs
    WHERE %(wildcard)s::boolean
      AND state = 'available'
      AND lane <> ALL(%(lanes)s::text[])
    ORDER BY priority, scheduled_at, id
    LIMIT %(demand)s - (SELECT count(*) FROM named)
    FOR UPDATE SKIP LOCKED
)
UPDATE runs
SET state = 'running',
    attempt = attempt + 1,
    attempted_at = now(),
    worker_id = %(worker_id)s,
    workloop = %(workloop)s,
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s::float8)
-- An array of the picked ids: the update probes runs_pkey for each, whatever the
-- planner guesses about the CTEs' sizes (a join could turn into a scan of runs).
WHERE id = ANY(ARRAY(SELECT id FROM named UNION ALL SELECT id FROM rest))
RETURNING *

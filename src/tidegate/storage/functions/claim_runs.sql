-- Claim up to p_demand runs for one workloop, following its lane chain, taking only
-- runs of the tasks this worker has (p_tasks).
--
-- shares: a workloop with shares (tidegate/lanes.py, "a=3,b=1/2,*:12") gives each named
-- lane its own demand (p_demands, in the order of p_lanes) and the lanes of `*`
-- one demand together (p_others_demand); a chain gives NULL for both, and each lane
-- of it may take the whole p_demand.
--
-- limits: whether any key policy or project concurrency is set, or a breaker is forced
--   open. Where none is, the claim is this one set-based statement (PL/pgSQL keeps its
--   plan: planned once per connection, after a few executions):
--   chain: the lanes the chain names, in chain order, then, only with `*` (last in the
--     chain), every other lane with a ready run, lowest head first (ready_lanes: a skip
--     scan, one index descent per lane); a paused lane is left out of either (paused_lanes
--     read once per claim, an InitPlan: a filter of a few lanes, never a join that
--     could reorder the chain, nothing per run). A claim whose statement began
--     before a pause committed may still take runs of its lane; one that begins after
--     never does.
--   probe: one ordered probe of runs_claim_lane per lane of the chain. The nested loop
--     over the chain asks the next lane only when the lanes before it ran short, and the
--     LIMIT stops probing, and locking, at demand: runs across the lanes of `*`
--     interleave by rank a claim at a time, as their heads move.
--   Each probe reads its lane's head lazily: where every run is this worker's, it reads
--     exactly the runs it takes. Runs of other tasks are passed over, at most
--     p_scan_limit rows per probe (the inner LIMIT), so a backlog of a task this worker
--     lacks costs a bounded scan, not the backlog; the parker (queries/park_strays.sql)
--     sets those no live worker has 'pending', out of the way.
--   FOR UPDATE SKIP LOCKED lets concurrent claimers pass each other's rows; the update
--   probes runs_pkey with the array of picked ids.
-- Where limits are set, claim_runs_keyed claims instead,
-- key by key under advisory locks; the one-time filter on `limits` means only one of
-- the two runs. It also returns as 'pending' the runs it passed over of tasks no live
-- worker has.
-- A function, so that a remote worker's claim (claim_workloop) runs the same claim in
-- the one statement that counts its workloop's slots.
CREATE OR REPLACE FUNCTION claim_runs(
    p_lanes text[],
    p_wildcard boolean,
    p_demand integer,
    p_demands integer[],
    p_others_demand integer,
    p_worker_id text,
    p_workloop smallint,
    p_lease_seconds float8,
    p_scan_limit integer,
    p_head_scan integer,
    p_tasks text[],
    p_live_seconds float8
)
RETURNS SETOF runs
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY
    WITH limits AS MATERIALIZED (
        SELECT EXISTS (SELECT 1 FROM key_policies)
            OR EXISTS (SELECT 1 FROM projects WHERE concurrency IS NOT NULL)
            OR EXISTS (SELECT 1 FROM key_breakers WHERE forced = 'open') AS apply
    ),
    named AS (  -- in chain order, each lane with its demand
        SELECT named.lane, coalesce(named.demand, p_demand) AS demand
        FROM unnest(p_lanes, p_demands) AS named(lane, demand)
        WHERE named.lane <> ALL(ARRAY(SELECT lane FROM paused_lanes))
    ),
    others AS (
        SELECT other.lane FROM ready_lanes(p_lanes) AS other
        WHERE p_wildcard AND NOT (SELECT apply FROM limits)
          AND other.lane <> ALL(ARRAY(SELECT lane FROM paused_lanes))
    ),
    picked AS (  -- in order: an Append reads its parts in turn, each in its order
        (SELECT probe.id
         FROM named
         CROSS JOIN LATERAL (
             SELECT head.id FROM (
                 SELECT runs.id, runs.task FROM runs
                 WHERE runs.lane = named.lane AND runs.state = 'available'
                 ORDER BY runs.rank, runs.id
                 LIMIT p_scan_limit
                 FOR UPDATE SKIP LOCKED
             ) AS head
             WHERE head.task = ANY(p_tasks)
             LIMIT named.demand
         ) AS probe
         WHERE NOT (SELECT apply FROM limits))
        UNION ALL
        -- The same probe for each lane of `*`, limited together: the lanes of a share's `*`
        -- take no more than its demand between them.
        (SELECT probe.id
         FROM others
         CROSS JOIN LATERAL (
             SELECT head.id FROM (
                 SELECT runs.id, runs.task FROM runs
                 WHERE runs.lane = others.lane AND runs.state = 'available'
                 ORDER BY runs.rank, runs.id
                 LIMIT p_scan_limit
                 FOR UPDATE SKIP LOCKED
             ) AS head
             WHERE head.task = ANY(p_tasks)
             LIMIT coalesce(p_others_demand, p_demand)
         ) AS probe
         LIMIT coalesce(p_others_demand, p_demand))
        LIMIT p_demand
    ),
    claimed AS (
        UPDATE runs
        SET state = 'running',
            attempt = attempt + 1,
            attempted_at = now(),
            worker_id = p_worker_id,
            workloop = p_workloop,
            -- The time of the write: a claim that waited for a lock still gets a whole lease.
            lease_expires_at = clock_timestamp() + make_interval(secs => p_lease_seconds),
            probe = false
        WHERE id = ANY(ARRAY(SELECT id FROM picked))
        RETURNING *
    )
    SELECT * FROM claimed
    UNION ALL
    SELECT * FROM claim_runs_keyed(
        p_lanes, p_wildcard, p_demand, p_worker_id,
        p_workloop, p_lease_seconds, p_scan_limit,
        p_head_scan, p_tasks, p_live_seconds
    )
    WHERE (SELECT apply FROM limits) AND p_demands IS NULL
    UNION ALL
    -- Shares where limits are set: one keyed claim per share with its own demand, `*`'s
    -- taking the other lanes with a ready run as a chain of them, lowest head first. Each
    -- call's counts see the runs the calls before it took (each of its statements reads
    -- the transaction's own writes).
    SELECT keyed.* FROM (
        SELECT ARRAY[named.lane] AS lanes, named.demand
        FROM unnest(p_lanes, p_demands) AS named(lane, demand)
        UNION ALL
        SELECT ARRAY(SELECT lane FROM ready_lanes(p_lanes)), p_others_demand
        WHERE p_wildcard
    ) AS share
    CROSS JOIN LATERAL claim_runs_keyed(
        share.lanes, false, share.demand, p_worker_id,
        p_workloop, p_lease_seconds, p_scan_limit,
        p_head_scan, p_tasks, p_live_seconds
    ) AS keyed
    WHERE (SELECT apply FROM limits) AND p_demands IS NOT NULL AND share.demand > 0;
END
$$;

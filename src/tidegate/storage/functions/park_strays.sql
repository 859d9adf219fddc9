-- The strays at the head of the lanes a worker takes (the parker, park_strays.sql): of
-- the first p_scan_limit available runs of each lane its chain takes, those of tasks it
-- lacks and no live worker has (task_has_worker), set 'pending' and returned. A run of a
-- task nobody has then spends no attempt and leaves the claim's indexes, so a backlog of
-- them costs a claim a bounded scan once, not at every claim; a worker that has the task
-- makes them available again (stage_runs.sql, through runs_pending).
--
-- The heads are read without locks, through runs_claim_lane per lane: each named lane
-- and, for `*`, every other lane with a ready run (ready_lanes); only the strays are
-- locked, and SKIP LOCKED passes a row a claim (or another worker's parker) holds: a
-- claim never waits on a parker, nor a parker on another. A function, so that its plans are kept for the connection's life.
CREATE OR REPLACE FUNCTION park_strays(
    p_lanes text[],
    p_wildcard boolean,
    p_tasks text[],
    p_scan_limit integer,
    p_live_seconds float8
) RETURNS SETOF runs
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    WITH head AS (
        SELECT probe.id, probe.lane, probe.task
        FROM (
            SELECT named.lane FROM unnest(p_lanes) AS named(lane)
            UNION ALL
            SELECT other.lane FROM ready_lanes(p_lanes) AS other WHERE p_wildcard
        ) AS chain
        CROSS JOIN LATERAL (
            SELECT runs.id, runs.lane, runs.task FROM runs
            WHERE runs.lane = chain.lane AND runs.state = 'available'
            ORDER BY runs.rank, runs.id
            LIMIT p_scan_limit
        ) AS probe
    ),
    strays AS (
        SELECT runs.id FROM runs
        WHERE runs.id = ANY(ARRAY(
                SELECT head.id FROM head
                WHERE NOT head.task = ANY(p_tasks)
                  AND NOT task_has_worker(head.lane, head.task, p_live_seconds)))
          AND runs.state = 'available'
        FOR UPDATE SKIP LOCKED
    )
    UPDATE runs SET state = 'pending'
    FROM strays
    WHERE runs.id = strays.id
    RETURNING runs.*;
END
$$;

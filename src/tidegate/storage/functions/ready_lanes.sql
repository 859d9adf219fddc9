-- The lanes with a ready run that p_named does not hold, each with the rank at its head,
-- lowest head first: the lanes a `*` takes, in the order it takes them (claim_runs.sql,
-- claim_runs_keyed, park_strays, read_keys.sql). A skip scan of runs_claim_lane
-- (lane, rank, id): one index descent per lane, never a read of a lane's runs, and no
-- index across lanes for enqueue to write (docs/architecture.md, "Storage").
--
-- Sorting is ruled out so that runs_claim_lane is the only plan: with statistics taken
-- while no run was ready, runs_key_ready (lane, key, vtime) looks as cheap, and an
-- incremental sort over it would read a whole lane's ready runs per probe. The cost a
-- ruled-out sort adds (the lanes are sorted all the same) crosses jit_above_cost: the
-- compilation took 80 ms of a claim's 90.
CREATE OR REPLACE FUNCTION ready_lanes(p_named text[])
RETURNS TABLE (lane text, head float8)
LANGUAGE plpgsql STABLE
SET enable_sort = off
SET enable_incremental_sort = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH RECURSIVE found (lane, head) AS (
        (SELECT runs.lane, runs.rank FROM runs
         WHERE runs.state = 'available'
         ORDER BY runs.lane, runs.rank, runs.id
         LIMIT 1)
        UNION ALL
        SELECT next.lane, next.rank FROM found
        CROSS JOIN LATERAL (
            SELECT runs.lane, runs.rank FROM runs
            WHERE runs.state = 'available' AND runs.lane > found.lane
            ORDER BY runs.lane, runs.rank, runs.id
            LIMIT 1
        ) AS next
    )
    SELECT found.lane, found.head FROM found
    WHERE found.lane <> ALL(p_named)
    ORDER BY found.head, found.lane;
END
$$;

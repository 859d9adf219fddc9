-- The planner's estimate of a lane's runs in a state: the (lane, state) frequencies of
-- the last ANALYZE (the extended statistics runs_lane_state), scaled to the table's
-- current size. What lane_figures reports for a depth past its count's cap, so that a
-- scrape of GET /metrics never counts a large backlog.
CREATE OR REPLACE FUNCTION estimate_runs(p_lane text, p_state run_state) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    plan json;
BEGIN
    EXECUTE format(
        'EXPLAIN (FORMAT JSON) SELECT FROM runs WHERE lane = %L AND state = %L',
        p_lane, p_state
    ) INTO plan;
    RETURN (plan -> 0 -> 'Plan' ->> 'Plan Rows')::bigint;
END
$$;
